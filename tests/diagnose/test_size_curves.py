"""Size curves (diagnose/size_curves.py): the one-pass LRU stack depths against a brute-force LRU
simulation at several sizes, on Hypothesis-generated page streams (prefix-chained, as page keys
are, and arbitrary); the compiled depths against the Python reference; and the knee of a planted
workload whose working set is known."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tierdiag.diagnose import size_curves as sc


def _lru_hits(groups, capacity: int) -> list[bool]:
    """Brute force: an LRU pool of `capacity` keys; each group's looked-up keys are checked
    before the group touches its keys, in the order given (evicting the least recent)."""
    pool: OrderedDict = OrderedDict()
    hits = []
    for keys, looked in groups:
        hits += [int(k) in pool for k, m in zip(keys, looked) if m]
        for k in keys:
            pool.pop(int(k), None)
            pool[int(k)] = True
            while len(pool) > capacity:
                pool.popitem(last=False)
    return hits


def _groups_from(raw) -> list:
    out = []
    for keys, looks in raw:
        keys = list(dict.fromkeys(keys))  # distinct within a group, first place kept
        out.append((np.array(keys, dtype=np.int64), np.array(looks[:len(keys)] + [False] * (len(keys) - len(looks)),
                                                             dtype=bool)))
    return out


arbitrary = st.lists(st.tuples(st.lists(st.integers(-5, 30), max_size=8), st.lists(st.booleans(), max_size=8)),
                     max_size=30)


@st.composite
def chained(draw):
    """Requests as paths of a small tree of prefixes (chained keys), touched deepest first, with
    a finish touch adding fresh output keys, as compute_size_curves builds them."""
    n = draw(st.integers(0, 25))
    fresh = -1
    groups = []
    for _ in range(n):
        path = [draw(st.integers(0, 3)) for _ in range(draw(st.integers(0, 6)))]
        keys = [hash(tuple(path[:i + 1])) & (2 ** 40 - 1) for i in range(len(path))]
        look = draw(st.integers(0, len(keys)))
        mask = [i < look for i in range(len(keys))]
        groups.append((np.array(keys[::-1], dtype=np.int64), np.array(mask[::-1], dtype=bool)))
        outs = list(range(fresh, fresh - draw(st.integers(0, 3)), -1))
        fresh -= len(outs)
        both = outs[::-1] + keys[::-1]
        groups.append((np.array(both, dtype=np.int64), np.zeros(len(both), dtype=bool)))
    return groups


def _check(groups):
    depths = sc.stack_depths(groups)
    for capacity in (1, 2, 3, 5, 8, 13, 40):
        expect = _lru_hits(groups, capacity)
        assert [0 < d <= capacity for d in depths.tolist()] == expect, capacity


@settings(max_examples=60, deadline=None)
@given(arbitrary)
def test_one_pass_equals_lru_simulation_on_arbitrary_streams(raw):
    _check(_groups_from(raw))


@settings(max_examples=60, deadline=None)
@given(chained())
def test_one_pass_equals_lru_simulation_on_prefix_chained_streams(groups):
    _check(groups)
    # Prefix-closed: where a page is found, every page above it in its request is found too
    # (the tree's leaf-first eviction), at every size.
    depths = sc.stack_depths(groups).tolist()
    i = 0
    for keys, looked in groups:
        m = int(np.sum(looked))
        d = depths[i:i + m][::-1]  # page order: 0 .. m-1
        i += m
        found = [x for x in d if x > 0]
        assert d[:len(found)] == found and found == sorted(found)


@settings(max_examples=40, deadline=None)
@given(arbitrary)
def test_compiled_depths_equal_the_python_reference(raw):
    pytest.importorskip("tierdiag.native._stackdist")
    groups = _groups_from(raw)
    if not groups or not sum(len(k) for k, _ in groups):
        return
    keys = np.concatenate([k for k, _ in groups])
    query = np.concatenate([m for _, m in groups]).astype(np.uint8)
    starts = np.concatenate([[0], np.cumsum([len(k) for k, _ in groups])[:-1]]).astype(np.int64)
    order = np.argsort(keys, kind="stable")
    prev = np.full(len(keys), -1, dtype=np.int64)
    same = np.flatnonzero(keys[order][1:] == keys[order][:-1]) + 1
    prev[order[same]] = order[same - 1]
    assert sc._depths_c(prev, starts, query).tolist() == sc._depths_python(prev, starts, query).tolist()


@pytest.mark.parametrize("bad", [([0, 5], [0], [1, 1]), ([-3], [0], [1]), ([-1], [1], [1]), ([-1, -1], [0], [1])])
def test_compiled_depths_refuse_malformed_arrays(bad):
    mod = pytest.importorskip("tierdiag.native._stackdist")
    prev, starts, query = bad
    with pytest.raises(ValueError):
        mod.depths(np.array(prev, dtype=np.int64).tobytes(), np.array(starts, dtype=np.int64).tobytes(),
                   np.array(query, dtype=np.uint8).tobytes())


def test_planted_cycle_has_its_knee_at_the_working_set():
    """K prefixes of P pages each, requested round robin R times: page j of a prefix is
    re-referenced at depth (K - 1) x P + j + 1 (the other prefixes, then its own pages from the
    top down: a prefix is touched deepest first), so the curve climbs one page per request from
    (K - 1) x P + 1 pages and reaches every re-reference at the whole working set, K x P pages:
    the knee (90 % of the plateau needs the deepest page here)."""
    K, P, R, page = 7, 5, 6, 64
    groups = []
    for _ in range(R):
        for k in range(K):
            keys = np.array([1000 * k + j for j in range(P)], dtype=np.int64)
            groups.append((keys[::-1], np.ones(P, dtype=bool)))
    d = sc.stack_depths(groups)
    assert set(d.tolist()) == {-1} | {(K - 1) * P + j + 1 for j in range(P)}
    need = np.where(d > 0, d * page, np.iinfo(np.int64).max)
    c = sc._curve("device", 0, "device alone", need, page, 0)
    assert c.knee_tokens == K * P * page
    assert c.reused_at(((K - 1) * P + 1) * page - 1) == 0
    assert c.reused_at(((K - 1) * P + 1) * page) == (R - 1) * K * page  # page 0 of every prefix
    assert c.reused_at(K * P * page - 1) == (R - 1) * K * (P - 1) * page
    assert c.reused_at(K * P * page) == c.unbounded_reused_tokens == (R - 1) * K * P * page


def test_the_knee_counts_what_the_tier_adds_not_what_the_tiers_above_find():
    """A host curve whose size 0 already finds 80 pages (device alone): its knee is where host adds
    90 % of the 20 pages it can add, not where the total first reaches 90 % of 100 pages."""
    page = 64
    need = np.array([0] * 80 + [page * (i + 1) for i in range(20)] + [np.iinfo(np.int64).max] * 5, dtype=np.int64)
    c = sc._curve("host", 0, "device at the run's size", need, page, 0)
    assert c.unbounded_reused_tokens == 100 * page
    assert c.reused_at(0) == 80 * page
    assert c.knee_tokens == 18 * page  # ceil(0.9 x 20) = 18th added page
    assert c.reused_at(c.knee_tokens) - c.reused_at(0) >= 0.9 * (c.unbounded_reused_tokens - c.reused_at(0))
    assert c.reused_at(c.knee_tokens - 1) - c.reused_at(0) < 0.9 * (c.unbounded_reused_tokens - c.reused_at(0))
    nothing = sc._curve("host", 0, "", np.array([0, 0], dtype=np.int64), page, 0)
    assert nothing.knee_tokens is None and nothing.unbounded_reused_tokens == 2 * page
