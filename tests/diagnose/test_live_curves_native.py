"""The live pass's two compiled steps (tierdiag/native/stackdist/stackdist.c, issue 41) against
their references: `dense_ids` (the index's keys numbered by a hash table in one pass) against its
numpy twin and a dict, and `Stack.walk` (a walk's groups laid out in C) against the numpy layout
fed to `StackPython` and to the compiled `feed`, on hostile key streams: repeats, the int64
extremes, keys sharing their low or high bits (the hash's slots), the sample's golden-ratio
multiples, empty requests, one page, and malformed arguments refused by both."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tierdiag.diagnose.run import live_curves as lc

_GOLDEN = 0x9E3779B97F4A7C15

# Keys meant to be hard on a hash table: the extremes, powers of two (equal low bits), multiples of
# 2**40 (equal low 40 bits), values differing only in the top bits, and the sampled pass's keys
# (small multiples of the golden-ratio constant's inverse land near 0 once multiplied).
_HOSTILE = st.one_of(
    st.integers(-2**63, 2**63 - 1),
    st.sampled_from([-2**63, 2**63 - 1, 0, -1, 1, 2**31, -2**31, 2**32]),
    st.integers(0, 62).map(lambda k: 1 << k),
    st.integers(-2**23, 2**23 - 1).map(lambda k: k << 40),
    st.integers(0, 255).map(lambda k: (k << 56) - 2**63),
    st.integers(0, 1000).map(lambda k: ((k * _GOLDEN) % 2**64) - 2**63),
    st.integers(0, 5),
)


@st.composite
def requests(draw):
    """Requests' keys end to end (`lens` of each: some empty, some one page), drawn from a few
    distinct hostile keys so that they repeat within and across requests."""
    pool = draw(st.lists(_HOSTILE, min_size=1, max_size=30, unique=True))
    lens = draw(st.lists(st.integers(0, 9), max_size=20))
    keys = draw(st.lists(st.sampled_from(pool), min_size=sum(lens), max_size=sum(lens)))
    return np.array(keys, dtype=np.int64), np.array(lens, dtype=np.int64)


def _dense_dict(keys: np.ndarray, lens: np.ndarray) -> tuple[list[int], int]:
    """The plain reference: a dict numbers the keys as they first come, then each request reversed."""
    number: dict[int, int] = {}
    ids = [number.setdefault(k, len(number)) for k in keys.tolist()]
    out, at = [], 0
    for ln in lens.tolist():
        out += ids[at:at + ln][::-1]
        at += ln
    return out, len(number)


def _compiled():
    return pytest.importorskip("tierdiag.native._stackdist")


@settings(max_examples=400, deadline=None)
@given(requests())
def test_dense_ids_compiled_and_numpy_give_the_dicts_numbers(drawn):
    keys, lens = drawn
    want, n = _dense_dict(keys, lens)
    twin = keys.copy()
    assert lc._dense_ids_numpy(twin, lens) == n and twin.tolist() == want
    compiled = _compiled()
    got = keys.copy()
    assert compiled.dense_ids(got, lens) == n and got.tolist() == want


@pytest.mark.parametrize("kind", ["golden", "shifted", "random"])
def test_dense_ids_past_the_tables_first_sizes(kind):
    """200k keys over ~60k distinct: the table grows many times; the same numbers as the dict."""
    rng = np.random.default_rng(7)
    base = rng.integers(0, 60_000, 200_000)
    if kind == "golden":  # key x the golden ratio, modulo 2**64: the sampled pass's kept keys' neighbours
        keys = (base.astype(np.uint64) * np.uint64(_GOLDEN)).view(np.int64)
    elif kind == "shifted":
        keys = (base << 40).astype(np.int64)
    else:
        keys = rng.integers(-2**63, 2**63 - 1, 60_000, dtype=np.int64)[base]
    lens = np.diff(np.r_[0, np.sort(rng.integers(0, len(keys), 5000)), len(keys)]).astype(np.int64)
    want, n = _dense_dict(keys, lens)
    got = keys.copy()
    assert _compiled().dense_ids(got, lens) == n and got.tolist() == want
    twin = keys.copy()
    assert lc._dense_ids_numpy(twin, lens) == n and twin.tolist() == want


@settings(deadline=None)  # a loaded machine's pauses are not the test's subject
@given(st.sampled_from([([1, 2], [3]), ([1, 2], [1]), ([1, 2], [-1, 3]), ([], [1]), ([5], [])]))
def test_dense_ids_refuse_lens_that_do_not_add_up(bad):
    keys, lens = (np.array(x, dtype=np.int64) for x in bad)
    with pytest.raises(ValueError):
        lc._dense_ids_numpy(keys.copy(), lens)
    with pytest.raises(ValueError):
        _compiled().dense_ids(keys.copy(), lens)


def test_an_index_numbers_its_keys_by_dense_ids():
    index = lc.TraceIndex.of_keys([0, 1, 2], [np.array([7, 2**62, -5]), np.array([], dtype=np.int64),
                                             np.array([-5, 9])])
    assert index.n_ids == 4 and index.rev_ids.tolist() == [2, 1, 0, 3, 2]
    assert index.rev_ids.dtype == np.int32


# --------------------------------------------------------------------------- walk


@st.composite
def walks(draw):
    """An index's ids (int32, some requests empty) and walks over it: events of any request (a
    request twice, or in both its schedule and its finish), lookups from none to every key, fresh
    output pages from none to many; cut into several walks."""
    n_ids = draw(st.integers(0, 10))
    lens = draw(st.lists(st.integers(0, 6), min_size=1, max_size=8))
    total = sum(lens)
    ids = draw(st.lists(st.integers(0, max(n_ids - 1, 0)) if n_ids else st.just(-1), min_size=total,
                        max_size=total))
    off = np.cumsum([0] + lens[:-1])
    events = draw(st.lists(st.tuples(st.integers(0, len(lens) - 1), st.integers(0, 6), st.integers(0, 9)),
                           max_size=25))
    req = [e[0] for e in events]
    ln = [lens[r] for r in req]
    looks = [min(e[1], n) for e, n in zip(events, ln)]
    outs = [e[2] for e in events]
    cuts = sorted(draw(st.lists(st.integers(0, len(events)), max_size=3)))
    return (n_ids, np.array(ids, dtype=np.int32), np.array([off[r] for r in req], dtype=np.int64),
            np.array(ln, dtype=np.int64), np.array(looks, dtype=np.int64), np.array(outs, dtype=np.int64), cuts)


def _walked(stack, ids, start, ln, looks, outs, cuts):
    out, e0 = [], 0
    for e in cuts + [len(start)]:
        out += lc.walk(stack, ids, start[e0:e], ln[e0:e], looks[e0:e], outs[e0:e]).tolist()
        e0 = e
    return out


def _fed_layout(stack, ids, start, ln, looks, outs):
    """The groups laid out a key at a time by hand, fed: what a walk is."""
    keys, query, sizes = [], [], []
    for s, n, k, o in zip(start.tolist(), ln.tolist(), looks.tolist(), outs.tolist()):
        keys += [-1] * o + ids[s:s + n].tolist()
        query += [False] * o + [j >= n - k for j in range(n)]
        sizes.append(o + n)
    return lc.feed(stack, np.array(keys, dtype=np.int64), np.array(query, dtype=bool),
                   np.array(sizes, dtype=np.int64)).tolist()


@settings(max_examples=400, deadline=None)
@given(walks())
def test_the_compiled_walk_answers_the_numpy_layout_and_the_feed(drawn):
    n_ids, ids, start, ln, looks, outs, cuts = drawn
    want = _fed_layout(lc.StackPython(n_ids), ids, start, ln, looks, outs)
    assert _walked(lc.StackPython(n_ids), ids, start, ln, looks, outs, cuts) == want
    compiled = _compiled()
    stack = compiled.Stack(n_ids)
    assert _walked(stack, ids, start, ln, looks, outs, cuts) == want
    assert stack.touches == int((ln + outs).sum())
    # int64 ids (an index past 2**31 keys) take the numpy layout into the compiled feed: the same
    assert _walked(compiled.Stack(n_ids), ids.astype(np.int64), start, ln, looks, outs, cuts) == want


def test_a_long_walk_grows_and_renumbers_the_tree_as_feed_does():
    rng = np.random.default_rng(11)
    ids = rng.integers(0, 3000, 40_000).astype(np.int32)
    start = rng.integers(0, 39_000, 4000)
    ln = rng.integers(0, 40, 4000)
    ln = np.minimum(ln, 40_000 - start)
    looks = np.minimum(rng.integers(0, 40, 4000), ln)
    outs = rng.integers(0, 5, 4000)
    compiled = _compiled()
    a, b = compiled.Stack(3000), compiled.Stack(3000)
    for lo in range(0, 4000, 250):
        s = slice(lo, lo + 250)
        got = lc.walk(a, ids, start[s], ln[s], looks[s], outs[s]).tolist()
        assert got == _fed_layout(b, ids, start[s], ln[s], looks[s], outs[s])
    assert a.slots == b.slots


hostile_walks = st.sampled_from([
    ([0, 1], [1], [2], [0], [0]),      # keys past the ids
    ([0, 1], [-1], [1], [0], [0]),     # a negative start
    ([0, 1], [0], [-1], [0], [0]),     # a negative length
    ([0, 1], [0], [2], [3], [0]),      # more lookups than keys
    ([0, 1], [0], [2], [-1], [0]),     # negative lookups
    ([0, 1], [0], [2], [0], [-1]),     # negative output pages
    ([0, 7], [0], [2], [1], [0]),      # an id past the stack's
    ([0, -2], [0], [2], [1], [0]),     # an id below -1
])


@settings(deadline=None)
@given(hostile_walks)
def test_a_malformed_walk_is_refused_by_both_and_leaves_the_stack_as_it_was(bad):
    ids = np.array(bad[0], dtype=np.int32)
    start, ln, looks, outs = (np.array(x, dtype=np.int64) for x in bad[1:])
    compiled = _compiled()
    for stack in (lc.StackPython(3), compiled.Stack(3)):
        with pytest.raises((ValueError, IndexError)):
            lc.walk(stack, ids, start, ln, looks, outs)
        assert stack.touches == 0
        assert lc.walk(stack, np.array([0, 0], dtype=np.int32), np.array([0, 0]), np.array([1, 1]),
                       np.array([1, 1]), np.array([0, 0])).tolist() == [-1, 1]


def test_walk_refuses_arrays_of_other_lengths():
    compiled = _compiled()
    stack = compiled.Stack(3)
    one = np.zeros(1, dtype=np.int64)
    with pytest.raises(ValueError):
        stack.walk(np.zeros(2, dtype=np.int32), one, one, one, np.zeros(2, dtype=np.int64))
    with pytest.raises(ValueError):
        stack.walk(np.zeros(3, dtype=np.int8), one, one, one, one)
    assert stack.touches == 0
