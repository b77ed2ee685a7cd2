"""Size curves (diagnose/run/size_curves.py): the one-pass LRU stack depths against a brute-force LRU
simulation at several sizes, on Hypothesis-generated page streams (prefix-chained, as page keys
are, and arbitrary); the compiled depths against the Python reference; and the knee of a planted
workload whose working set is known."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tests.support.sql_rows import insert_rows
from tierdiag.diagnose.run import size_curves as sc


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


def _touches_a_group_at_a_time(rows, keys, looked, page, keep):
    """The reference of sc._replay_touches + sc._pass_depths: the pass as it was first written,
    one group of arrays a request event in Python (kept here as the reference the array version
    must equal, issue 41)."""
    by_seq = {r.seq: r for r in rows}
    events = sorted([(r.sched_ns, 1, r.seq) for r in rows] + [(r.fin_ns, 0, r.seq) for r in rows])
    ranks = sorted({r.rank for r in rows})
    fresh = -1
    per_rank = {k: [] for k in ranks}
    every, rank_of_lookup = [], []
    for _t, kind, seq in events:
        r, k = by_seq[seq], keys[seq]
        if kind == 1:
            if looked is None:
                look = min(max((r.input_tokens - 1) // page, 0), len(k))
                mask = np.zeros(len(k), dtype=bool)
                mask[:look] = True
            else:
                mask = looked[seq]
                look = int(mask.sum())
            group = (k[::-1], mask[::-1])
            rank_of_lookup.append(np.full(look, r.rank, dtype=np.int64))
        else:
            out_pages = max((r.input_tokens + r.output_tokens) // page - r.input_tokens // page, 0)
            outs = np.arange(fresh, fresh - out_pages, -1, dtype=np.int64)
            fresh -= out_pages
            if keep is not None:
                outs = outs[keep(outs)]
            both = np.concatenate([outs[::-1], k[::-1]])
            group = (both, np.zeros(len(both), dtype=bool))
        per_rank[r.rank].append(group)
        every.append(group)
    lookup_rank = np.concatenate(rank_of_lookup) if rank_of_lookup else np.zeros(0, dtype=np.int64)
    d_rank = np.zeros(len(lookup_rank), dtype=np.int64)
    for rank in ranks:
        d_rank[lookup_rank == rank] = sc.stack_depths(per_rank[rank])
    d_all = d_rank if len(ranks) == 1 else sc.stack_depths(every)
    return lookup_rank, d_rank, d_all


@st.composite
def replayed_requests(draw):
    """Finished requests as curve_requests reads them: times with ties (a finish and a schedule
    at the same instant), ranks, zero-length prompts and outputs, repeated prefixes; with a
    sampled pass's kept keys and looked-up marks, or without."""
    from tierdiag.diagnose.read.curves import CurveRequest

    page = draw(st.sampled_from([1, 2, 16]))
    n = draw(st.integers(0, 14))
    ranks = draw(st.integers(1, 3))
    rows, keys, looked = [], {}, {}
    seqs = draw(st.lists(st.integers(0, 10 ** 6), min_size=n, max_size=n, unique=True))
    for seq in sorted(seqs):
        path = [draw(st.integers(0, 3)) for _ in range(draw(st.integers(0, 6)))]
        k = np.array([hash(tuple(path[:i + 1])) & (2 ** 40 - 1) for i in range(len(path))], dtype=np.int64)
        inp = len(k) * page + draw(st.integers(0, page - 1))
        sched = draw(st.integers(0, 20))
        fin = sched + draw(st.integers(0, 6))
        rows.append(CurveRequest(seq, f"r{seq}", draw(st.integers(0, ranks - 1)), sched, fin, inp,
                                 draw(st.integers(0, 4 * page)), 0, 0, 0))
        keys[seq] = sc._first_distinct(k)
        looked[seq] = np.array([draw(st.booleans()) for _ in range(len(keys[seq]))], dtype=bool)
    sampled = draw(st.booleans())
    keep = sc._sampler(draw(st.sampled_from([0.3, 0.7]))) if sampled else None
    return rows, keys, looked if sampled else None, page, keep


@settings(max_examples=60, deadline=None)
@given(replayed_requests())
def test_the_pass_built_with_arrays_equals_a_group_at_a_time(case):
    rows, keys, looked, page, keep = case
    got = sc._pass_depths(*sc._replay_touches(rows, keys, looked, page, keep))
    want = _touches_a_group_at_a_time(rows, keys, looked, page, keep)
    for g, w in zip(got, want):
        assert g.tolist() == w.tolist()


@settings(max_examples=30, deadline=None)
@given(replayed_requests())
def test_the_pass_built_with_arrays_in_small_chunks_equals_it_in_one(case):
    rows, keys, looked, page, keep = case
    whole = sc._replay_touches(rows, keys, looked, page, keep)
    old = sc._CHUNK_TOUCHES
    sc._CHUNK_TOUCHES = 3  # several chunks, an event larger than one among them
    try:
        chunked = sc._replay_touches(rows, keys, looked, page, keep)
    finally:
        sc._CHUNK_TOUCHES = old
    assert len(whole) == len(chunked) == 4
    for a, b in zip(whole, chunked):
        assert a.tolist() == b.tolist()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-2 ** 63, 2 ** 63 - 1), max_size=12), st.lists(st.integers(0, 5), max_size=12))
def test_first_distinct_keeps_each_key_at_its_first_place(values, repeats):
    keys = np.array(values + [values[i % len(values)] for i in repeats] if values else [], dtype=np.int64)
    assert sc._first_distinct(keys).tolist() == list(dict.fromkeys(keys.tolist()))


def _both_depths(prev, starts, query):
    """(count, prev after) of the compiled pass and of its Python twin, each on its own copy."""
    got = []
    for fn in (sc._depths_c, sc._depths_python):
        p = np.array(prev, dtype=np.int64)
        k = fn(p, np.array(starts, dtype=np.int64), np.array(query, dtype=np.uint8))
        got.append((k, p.tolist()))
    return got


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
    (kc, pc), (kp, pp) = _both_depths(prev, starts, query)
    assert kc == kp == int(query.sum())
    assert pc == pp
    # a real pass's answers: -1 (never touched), 0 (earlier in its group) or a depth <= the keys
    assert all(-1 <= d <= len(set(keys.tolist())) for d in pc[:kc])


@st.composite
def hostile_pass(draw):
    """Any well-formed arguments, not only a real pass's: prev[t] anywhere in [-1, t) (two touches
    may claim the same previous one), empty groups (repeated starts, a last one at n), every or
    no touch asked, one huge group or n of one."""
    n = draw(st.integers(0, 40))
    prev = [draw(st.integers(-1, t - 1)) for t in range(n)]
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=12)))
    starts = [0] + cuts if n or cuts else draw(st.sampled_from([[], [0]]))
    query = draw(st.one_of(st.just([1] * n), st.just([0] * n),
                           st.lists(st.integers(0, 255), min_size=n, max_size=n)))
    return prev, starts, query


@settings(max_examples=200, deadline=None)
@given(hostile_pass())
def test_compiled_depths_in_place_equal_the_python_twin_on_hostile_arguments(args):
    """The compiled pass writes the k looked-up answers over prev[:k] (a group's answers held in a
    scratch until its touches have read their prev) and leaves prev[k:] as it was: so does the
    twin, on any well-formed arguments; k is the number of asked touches."""
    pytest.importorskip("tierdiag.native._stackdist")
    prev, starts, query = args
    (kc, pc), (kp, pp) = _both_depths(prev, starts, query)
    asked = sum(1 for t, x in enumerate(query) if x and any(s <= t for s in starts[:1]))
    assert kc == kp == asked
    assert pc == pp
    assert pc[kc:] == prev[kc:]


@settings(max_examples=100, deadline=None)
@given(st.one_of(st.lists(st.integers(-2 ** 63, 2 ** 63 - 1), max_size=60),
                 st.lists(st.sampled_from([0, -1, 1, 2 ** 63 - 1, -2 ** 63, 0x9E3779B97F4A7C15 - 2 ** 64]), max_size=60),
                 st.tuples(st.integers(0, 2 ** 32 - 1), st.integers(800, 5000)).map(  # past a growth, colliding
                     lambda a: (np.random.default_rng(a[0]).integers(-2048, 2048, a[1]) << 52).tolist())))
def test_compiled_previous_equals_the_python_twin_and_a_sort(values):
    """`previous` writes each touch's previous position of the same key over the keys (one pass
    over a table of the distinct keys, growing past 768 of them): the same as its Python twin and
    as the stable sort it replaced, on any int64 keys (extremes, keys that collide in the table's
    hash: equal low bits, many past one growth)."""
    pytest.importorskip("tierdiag.native._stackdist")
    keys = np.array(values, dtype=np.int64)
    want = np.full(len(keys), -1, dtype=np.int64)
    order = np.argsort(keys, kind="stable")
    same = np.flatnonzero(keys[order][1:] == keys[order][:-1]) + 1
    want[order[same]] = order[same - 1]
    got = []
    for fn in (sc._previous_c, sc._previous_python):
        k = keys.copy()
        assert fn(k) is None
        got.append(k.tolist())
    assert got[0] == got[1] == want.tolist()


def test_compiled_previous_refuses_what_it_cannot_write():
    mod = pytest.importorskip("tierdiag.native._stackdist")
    with pytest.raises(TypeError):
        mod.previous(np.array([1, 2], dtype=np.int64).tobytes())
    with pytest.raises(ValueError, match="int64"):
        mod.previous(bytearray(b"\x00" * 12))
    with pytest.raises(ValueError, match="writable"):
        sc._previous_c(np.array([1, 2], dtype=np.int32))


@settings(max_examples=60, deadline=None)
@given(arbitrary, st.booleans())
def test_flat_depths_leave_the_keys_unless_handed_over(raw, consume):
    """Without `consume` the caller's keys stay as they were (a copy is written over); with it
    they may be written over; the answers are the same either way."""
    groups = _groups_from(raw)
    keys = np.concatenate([k for k, _ in groups]) if groups else np.zeros(0, dtype=np.int64)
    query = np.concatenate([m for _, m in groups]) if groups else np.zeros(0, dtype=bool)
    sizes = np.array([len(k) for k, _ in groups], dtype=np.int64)
    before = keys.copy()
    got = sc._flat_depths(keys, query, sizes, consume=consume)
    if not consume:
        assert keys.tolist() == before.tolist()
    assert got.tolist() == sc.stack_depths(groups).tolist() if groups else got.tolist() == []


@pytest.mark.parametrize("bad", [([0, 5], [0], [1, 1]), ([-3], [0], [1]), ([-1], [1], [1]), ([-1, -1], [0], [1]),
                                 ([-1, 0], [0, 3], [1, 1]), ([-1, 0], [0, 1, 0], [1, 1]), ([-1, 0], [0], [1]),
                                 ([-1, 0, 2 ** 62], [0], [1, 1, 1])])
def test_compiled_depths_refuse_malformed_arrays(bad):
    mod = pytest.importorskip("tierdiag.native._stackdist")
    prev, starts, query = bad
    with pytest.raises(ValueError):
        mod.depths(bytearray(np.array(prev, dtype=np.int64).tobytes()), np.array(starts, dtype=np.int64).tobytes(),
                   np.array(query, dtype=np.uint8).tobytes())


def test_compiled_depths_refuse_a_read_only_prev():
    """prev is the pass's output: a read-only buffer is refused, not written."""
    mod = pytest.importorskip("tierdiag.native._stackdist")
    with pytest.raises(TypeError):
        mod.depths(np.array([-1], dtype=np.int64).tobytes(), np.array([0], dtype=np.int64).tobytes(), b"\x01")
    frozen = np.array([-1, 0], dtype=np.int64)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        sc._depths_c(frozen, np.array([0], dtype=np.int64), np.array([1, 1], dtype=np.uint8))
    assert frozen.tolist() == [-1, 0]


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


# --------------------------------------------------------------------------- from a replayed run

from pathlib import Path  # noqa: E402

from hypothesis import HealthCheck  # noqa: E402

from tierdiag.store.reader import open_store, resolve_run  # noqa: E402
from tests.support.cli import invoke as _invoke, invoke_json as _json  # noqa: E402

PAGE = 64


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> tuple[Path, Path]:
    """A small system-prompt workload on two ranks under write_back, pools small enough to evict."""
    return _system_prompt_run(tmp_path_factory.mktemp("size_curves"), 4096)


def _system_prompt_run(folder: Path, pool_tokens: int) -> tuple[Path, Path]:
    trace, db = folder / "sp.jsonl", folder / "run.duckdb"
    _invoke("synth", str(trace), "--kind", "system-prompt", "--requests", "80", "--rate", "2")
    _invoke("replay", str(trace), "--db", str(db), "--model", "llama3-8b", "--gpu", "h100", "--device-tokens",
            pool_tokens, "--host-tokens", pool_tokens, "--write-policy", "write_back", "--dp", "2")
    return trace, db


def _brute_force(trace: Path, db: Path, device: int, host: int, storage: int) -> tuple[int, int, int]:
    """The model of size_curves.py's doc, simulated: per rank an LRU of `device` pages and one of
    device + host pages (write_back: they add up), and one LRU over every rank of `storage` pages;
    a request looks up its full pages before its last token at scheduling, touches its input then
    (deepest first) and its input and output at finish. Found: (device, host or above, storage or above)."""
    from collections import OrderedDict

    from tierdiag.trace.pages import page_keys_array
    from tierdiag.trace.reader import read_trace

    with open_store(db) as con:
        run = resolve_run(con, None)
        rows = con.execute("SELECT seq, coalesce(dp_rank, 0), arrival_ns + coalesce(queue_ns, 0), finish_ns, "
                           "input_tokens, output_tokens FROM requests WHERE run_id = ? AND status = 'finished' "
                           "AND ttft_ns IS NOT NULL", [run.run_id]).fetchall()
    keys = {r.seq: list(dict.fromkeys(page_keys_array(r, page_size=PAGE, block_size=512).tolist()))
            for r in read_trace(trace)}
    events = sorted([(r[2], 1, r[0], r) for r in rows] + [(r[3], 0, r[0], r) for r in rows])
    pools: dict = {}

    def touch(pool: OrderedDict, cap: int, ks: list) -> None:
        for k in ks:
            pool.pop(k, None)
            pool[k] = True
            while len(pool) > cap:
                pool.popitem(last=False)

    found = [0, 0, 0]
    fresh = [0]
    for _, kind, seq, r in events:
        rank, ks = r[1], keys[seq]
        dev = pools.setdefault(("d", rank), OrderedDict())
        both = pools.setdefault(("h", rank), OrderedDict())
        sto = pools.setdefault("s", OrderedDict())
        if kind == 1:
            look = ks[:max((r[4] - 1) // PAGE, 0)]
            d = sum(k in dev for k in look)
            h = sum(k in both for k in look)
            found[0] += d * PAGE
            found[1] += h * PAGE
            found[2] += sum(k in both or k in sto for k in look) * PAGE
            order = ks[::-1]
        else:
            n_out = (r[4] + r[5]) // PAGE - r[4] // PAGE
            outs = [("out", fresh[0] + i) for i in range(n_out)]
            fresh[0] += n_out
            order = outs[::-1] + ks[::-1]
        touch(dev, device // PAGE, order)
        touch(both, (device + host) // PAGE, order)
        touch(sto, storage // PAGE, order)
    return tuple(found)


def test_the_curves_are_the_model_simulated_on_a_replayed_run(two_ranks):
    trace, db = two_ranks
    with open_store(db) as con:
        run = resolve_run(con, None)
        c = sc.compute_size_curves(con, run)
        found = con.execute("SELECT sum(device_hit_tokens), sum(device_hit_tokens + host_hit_tokens) FROM requests "
                            "WHERE run_id = ? AND status = 'finished' AND ttft_ns IS NOT NULL", [run.run_id]).fetchone()
    assert (c.write_policy, c.num_ranks, c.page_size) == ("write_back", 2, PAGE)
    dev, host, sto = (c.curve(t) for t in sc.TIERS)
    assert (dev.run_size_tokens, host.run_size_tokens, sto.run_size_tokens) == (4096, 4096, 0)
    assert (dev.found_tokens, host.found_tokens) == found
    for size in (PAGE, 1024, 4096, 8192, 65536):
        d, _, _ = _brute_force(trace, db, size, 0, PAGE)
        _, h, _ = _brute_force(trace, db, 4096, size, PAGE)
        _, _, s = _brute_force(trace, db, 4096, 4096, size)
        assert (dev.reused_at(size), host.reused_at(size), sto.reused_at(size)) == (d, h, s), size


def test_summary_shows_the_curves_and_json_has_every_tier(two_ranks):
    _, db = two_ranks
    j = _json("summary", "--db", str(db))["size_curves"]
    assert set(j["tiers"]) == set(sc.TIERS) and j["write_policy"] == "write_back" and j["knee_share"] == sc.KNEE_SHARE
    for tier, t in j["tiers"].items():
        sizes = [p["size_tokens"] for p in t["points"]]
        assert sizes == sorted(set(sizes)) and t["run_size_tokens"] in sizes
        shares = [p["reused_share"] for p in t["points"]]
        assert shares == sorted(shares)  # a larger pool never finds less under LRU (the inclusion property)
        assert all(p["reused_share"] == pytest.approx(p["reused_tokens"] / j["input_tokens"]) for p in t["points"])
        assert t["points"][-1]["reused_tokens"] == t["unbounded_reused_tokens"]
    text = " ".join(_invoke("summary", "--db", str(db)).split())
    assert "reuse by pool size, predicted in one pass" in text and "write_back" in text


def test_a_trace_gone_or_changed_means_no_curves_and_nothing_else_lost(two_ranks, tmp_path):
    trace, db = two_ranks
    import shutil

    from tierdiag.store.copy_run import read_run_tables, write_run_tables

    for what, content in (("gone", None), ("changed", trace.read_text().replace('"', ' "', 1))):
        moved = tmp_path / f"{what}.jsonl"
        if content is not None:
            moved.write_text(content)
        copy = tmp_path / f"{what}.duckdb"
        write_run_tables(copy, read_run_tables(db), {"trace_path": str(moved)})
        with open_store(copy) as con:
            run = resolve_run(con, None)
            assert sc.size_curves(con, run) is None
            with pytest.raises(sc.CurvesUnavailable, match=what):
                sc.compute_size_curves(con, run)
        j = _json("summary", "--db", str(copy))
        assert j["num_finished"] > 0  # stored evidence of the copy: the curves stored at close are still there
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_the_trace_read_ahead_gives_the_curves_the_close_reads_itself(two_ranks, tmp_path):
    """The writer process reads the trace's pages while the run is recorded (read_ahead, issue
    41): the curves are the same as the close's own read, and the read-ahead is used once."""
    trace, db = two_ranks
    with open_store(db) as con:
        run = resolve_run(con, None)
        own = sc.compute_size_curves(con, run)
        sc.read_ahead(run.trace_path, run.trace_sha256, run.config)
        assert len(sc._READ_AHEAD) == 1
        ahead = sc.compute_size_curves(con, run)
        assert not sc._READ_AHEAD  # taken: its memory goes with the close
        assert ahead == own
        # Another page size than the run's (a config edited since): not used, read again.
        sc.read_ahead(run.trace_path, run.trace_sha256, {**run.config, "page_size": 2 * int(run.config["page_size"])})
        assert sc.compute_size_curves(con, run) == own


def test_the_end_of_the_rows_lets_the_pass_finish_before_the_close_asks(two_ranks):
    """The writer process hands the read-ahead None when the run is being closed (store/writer_serve.py
    `finish`, issue 41): the pass fed while recording walks the rest then, beside the last rows'
    write, not once the close asks for the curves; the curves are the ones the close walks itself."""
    import duckdb

    trace, db = two_ranks
    with open_store(db) as con:
        run = resolve_run(con, None)
        own = sc.compute_size_curves(con, run)
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.sql("SELECT * EXCLUDE (run_id) FROM requests ORDER BY finish_ns NULLS LAST, seq").to_arrow_table()
    hand = sc.read_ahead(run.trace_path, run.trace_sha256, run.config)
    ahead = sc._READ_AHEAD[0]
    half = rows.num_rows // 2
    for part in (rows.slice(0, half), rows.slice(half)):
        hand({"requests": {c: part.column(c).combine_chunks() for c in part.column_names}, "batches": {}})
    hand(None)
    ahead._thread.join(timeout=60)
    assert ahead._live_thread is not None
    ahead._live_thread.join(timeout=60)  # ended without the close asking: every event walked
    assert not ahead._live_thread.is_alive() and ahead.live is not None and not ahead.live._pending
    hand(None)  # twice (a close asked again): nothing more
    with open_store(db) as con:
        assert sc.compute_size_curves(con, run) == own
    assert not sc._READ_AHEAD


def test_what_the_writer_hands_the_rows_to_lets_the_read_ahead_go_with_the_close(two_ranks):
    """read_ahead returns what the writer process hands each batch of rows and keeps to its exit
    (store/writer_serve.py `on_rows`): it must not hold the read-ahead, whose index and pass
    results the close took (issue 41, session 24: ~100 MB held through a 1M-request close's
    sections). Once the close's curves are made the read-ahead is gone, the hand still callable
    (it hands nothing), and the curves are the ones the close reads itself."""
    import gc
    import weakref

    trace, db = two_ranks
    with open_store(db) as con:
        run = resolve_run(con, None)
        own = sc.compute_size_curves(con, run)
        hand = sc.read_ahead(run.trace_path, run.trace_sha256, run.config)
        gone = weakref.ref(sc._READ_AHEAD[0])
        assert sc.compute_size_curves(con, run) == own
    gc.collect()
    assert gone() is None and not sc._READ_AHEAD
    hand({"requests": {}})
    hand(None)
    assert not sc._READ_AHEAD


@pytest.mark.parametrize("how", ["rewritten", "appended", "other digest"])
def test_a_trace_changed_after_its_read_ahead_is_read_again_and_said_changed(two_ranks, tmp_path, how):
    """What was read ahead is used only where the file is as it was then (size, mtime, inode)
    and its digest the run's: else the close reads it again and says what it says without one."""
    import os

    from tierdiag.store.copy_run import read_run_tables, write_run_tables

    trace, db = two_ranks
    moved = tmp_path / "t.jsonl"
    moved.write_text(trace.read_text())
    copy = tmp_path / "copy.duckdb"
    write_run_tables(copy, read_run_tables(db), {"trace_path": str(moved)})
    with open_store(copy) as con:
        run = resolve_run(con, None)
        own = sc.compute_size_curves(con, run)
        sha = run.trace_sha256 if how != "other digest" else "0" * 64
        sc.read_ahead(run.trace_path, sha, run.config)
        sc._READ_AHEAD[0]._thread.join()
        if how == "rewritten":  # same size, other bytes, a later mtime
            text = moved.read_text()
            moved.write_text(text.replace('"', "'", 1))
            st = os.stat(moved)
            os.utime(moved, ns=(st.st_atime_ns, st.st_mtime_ns + 10 ** 9))
        elif how == "appended":
            with open(moved, "a") as fh:
                fh.write("\n")
        if how == "other digest":  # the read-ahead saw another digest: not used, the close reads it
            assert sc.compute_size_curves(con, run) == own
        else:
            with pytest.raises(sc.CurvesUnavailable, match="changed"):
                sc.compute_size_curves(con, run)
        assert not sc._READ_AHEAD


@pytest.fixture(scope="module")
def all_finish(tmp_path_factory) -> tuple[Path, Path]:
    """two_ranks' workload with pools that take every request: each finishes, so the trace's
    touches are the run's (a sampled read-ahead's rate is the close's)."""
    return _system_prompt_run(tmp_path_factory.mktemp("size_curves_all"), 16384)


def _fed_ahead(con, run, *, parts: int = 2):
    """A read-ahead of the run's trace fed its committed rows in `parts` batches (finish order),
    then the end, as the writer process does while recording; returns it, its pass walked."""
    import pyarrow as pa

    cur = con.execute("SELECT * EXCLUDE (run_id) FROM requests WHERE run_id = ? ORDER BY finish_ns NULLS LAST, seq",
                      [run.run_id])
    names = [d[0] for d in cur.description]
    got = cur.fetchall()
    rows = pa.table({c: pa.array([r[i] for r in got]) for i, c in enumerate(names)})
    hand = sc.read_ahead(run.trace_path, run.trace_sha256, run.config)
    ahead = sc._READ_AHEAD[0]
    step = -(-rows.num_rows // parts)
    for at in range(0, rows.num_rows, step):
        part = rows.slice(at, step)
        hand({"requests": {c: part.column(c).combine_chunks() for c in part.column_names}, "batches": {}})
    hand(None)
    ahead._thread.join(timeout=60)
    if ahead._live_thread is not None:
        ahead._live_thread.join(timeout=60)
    return ahead


def test_a_read_ahead_over_the_budget_feeds_the_sampled_pass_while_recording(all_finish, monkeypatch):
    """Over the pass's budget the close samples the pages (SHARDS, module doc). The read-ahead
    keeps only the sample of the trace's keys (its rate falling as the touches grow, filtered to
    the trace's own rate at the end) and its pass is fed the rows while the run is recorded, its
    output pages numbered and sampled as the close numbers them: the close then finishes the
    curves only, and they are the ones it samples itself (issue 41: at 200k requests the close
    walked the whole sampled pass, 11.9 s)."""
    trace, db = all_finish
    monkeypatch.setattr(sc, "MAX_TOUCHES", 200)
    monkeypatch.setattr(sc._Pages, "_CHUNK", 7)  # chunks filtered again as the rate falls
    with open_store(db) as con:
        run = resolve_run(con, None)
        assert con.execute("SELECT count(*) FILTER (status != 'finished') FROM requests").fetchone()[0] == 0
        alone = sc.compute_size_curves(con, run)
        assert alone.sample_rate < 1
        ahead = _fed_ahead(con, run)
        index = ahead.index
        assert index is not None and index.keep is not None and ahead.live is not None and not ahead.live._pending
        assert index.rate == alone.sample_rate
        from tierdiag.diagnose.run import live_curves

        walked = []
        whole = live_curves.whole_pass
        monkeypatch.setattr(live_curves, "whole_pass", lambda *a, **k: walked.append(1) or whole(*a, **k))
        assert sc.compute_size_curves(con, run) == alone
        assert not walked  # the pass fed while recording was used, not walked again at the close


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(budget=st.one_of(st.integers(-3, 2), st.integers(3, 6_000), st.just(2 ** 62)),
       parts=st.integers(1, 5), chunk=st.sampled_from([1, 3, 4096]))
def test_any_budget_gives_the_same_curves_read_ahead_or_not(all_finish, monkeypatch, budget, parts, chunk):
    """Whatever the budget (hostile ones included: zero, negative, under one request, more than
    the run), however the rows come and however the read-ahead chunks the keys, the curves of a
    close that finds the pass fed while recording are the ones it makes alone."""
    trace, db = all_finish
    monkeypatch.setattr(sc, "MAX_TOUCHES", budget)
    monkeypatch.setattr(sc._Pages, "_CHUNK", chunk)
    with open_store(db) as con:
        run = resolve_run(con, None)
        alone = sc.compute_size_curves(con, run)
        _fed_ahead(con, run, parts=parts)
        assert sc.compute_size_curves(con, run) == alone
    assert not sc._READ_AHEAD


@pytest.mark.parametrize("budget", [200, 2 ** 62])
def test_the_read_ahead_hands_the_freed_heap_back_while_reading_and_before_its_index(all_finish, monkeypatch,
                                                                                     budget):
    """The read-ahead hands glibc's freed heap back (live_curves.release_freed_heap) as it reads
    the trace, at most every TRIM_EVERY_S looked at every _TRIM_LOOK requests, and once more
    between the read (its parse state freed: ~130 MB at 1M synth requests) and the index's build
    (issue 41's 1M row: the writer's early peak); sampled or not, the curves are the ones the
    close makes alone."""
    from tierdiag.diagnose.run import live_curves

    trace, db = all_finish
    monkeypatch.setattr(sc, "MAX_TOUCHES", budget)
    monkeypatch.setattr(sc, "_TRIM_LOOK", 3)
    monkeypatch.setattr(sc, "TRIM_EVERY_S", 0.0)  # due at every look
    calls: list[str] = []
    monkeypatch.setattr(live_curves, "release_freed_heap", lambda: calls.append("trim") or True)
    index = sc._Pages.index
    monkeypatch.setattr(sc._Pages, "index", lambda self: calls.append("index") or index(self))
    with open_store(db) as con:
        run = resolve_run(con, None)
        alone = sc.compute_size_curves(con, run)
        n = con.execute("SELECT count(*) FROM requests").fetchone()[0]
        calls.clear()
        _fed_ahead(con, run)
        assert calls.index("index") == n // 3 + 1  # a trim every 3 requests read, then one before the build
        assert set(calls[:calls.index("index")]) == {"trim"}
        assert sc.compute_size_curves(con, run) == alone
    assert not sc._READ_AHEAD


@settings(max_examples=200, deadline=None)
@given(read=st.one_of(st.integers(-2 ** 70, 2 ** 70), st.integers(0, 3 * 4096)),
       ago=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(-10, 10)))
def test_a_trim_is_due_only_at_a_look_and_once_the_interval_is_past(read, ago):
    """`_trim_due`: never between looks (`read` not a multiple of _TRIM_LOOK), never before
    TRIM_EVERY_S since the last (a last time in the future, or NaN: not due); at a look, due once
    it is past."""
    import math
    import time

    trimmed = time.monotonic() - ago
    due = sc._trim_due(read, trimmed)
    assert isinstance(due, bool)
    if read % sc._TRIM_LOOK:
        assert not due
    elif math.isnan(ago) or ago < sc.TRIM_EVERY_S:
        assert not due
    elif ago >= sc.TRIM_EVERY_S + 1:
        assert due


def test_the_read_ahead_keeps_of_a_batch_only_what_its_pass_reads_and_that_in_its_own_memory(two_ranks):
    """What the read-ahead queues for its pass (`_pass_columns`: the batches taken while the trace
    is read wait until the read is done) is the columns live_curves.rows_of reads, each copied out
    of the hand-over it was a view into (issue 41: one column kept held the whole frame); rows_of
    reads no other column, and gives the same arguments from them as from the whole batch."""
    import pyarrow as pa

    from tierdiag.diagnose.run import live_curves

    trace, db = two_ranks
    with open_store(db) as con:
        run = resolve_run(con, None)
        table = con.sql("SELECT * EXCLUDE (run_id) FROM requests WHERE run_id = ? ORDER BY finish_ns NULLS LAST, seq",
                        params=[run.run_id]).to_arrow_table()
        ahead = _fed_ahead(con, run)
    sc._READ_AHEAD.clear()
    batch = {c: table.column(c).combine_chunks() for c in table.column_names}

    class Seen(dict):
        def __init__(self, *a):
            super().__init__(*a)
            self.read = set()

        def get(self, key, default=None):
            self.read.add(key)
            return super().get(key, default)

        def __getitem__(self, key):
            self.read.add(key)
            return super().__getitem__(key)

    seen = Seen(batch)
    whole = live_curves.rows_of(ahead.index, seen)
    assert seen.read <= set(live_curves.ROWS_OF_COLUMNS)
    kept = sc._pass_columns(batch)
    assert list(kept) == [c for c in live_curves.ROWS_OF_COLUMNS if c in batch]
    for name, values in kept.items():
        assert values.equals(batch[name])
        assert all(a is None or b is None or a.address != b.address
                   for a, b in zip(values.buffers(), batch[name].buffers()))
    for got, want in zip(live_curves.rows_of(ahead.index, kept), whole, strict=True):
        assert np.array_equal(got, want)
    # A batch with none of them: its first column, for the count of its rows.
    odd = {"hit_tokens": pa.array([1, 2, 3]), "model": pa.array(["a", "b", None])}
    assert list(sc._pass_columns(odd)) == ["hit_tokens"]


@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.one_of(st.none(), st.integers(-2 ** 63, 2 ** 63 - 1)), max_size=40),
       cut=st.integers(0, 40), chunks=st.integers(1, 3), text=st.booleans())
def test_a_column_the_read_ahead_keeps_is_a_copy_with_the_same_values(values, cut, chunks, text):
    """`_own`: an Arrow array (a slice, chunked, with NULLs, text), a numpy view: the same values
    in buffers of its own, none inside the frame it was a view of (store/frames.py `loads` makes
    a hand-over's columns over slices of one frame); Python values as they are."""
    import pyarrow as pa

    typ = pa.string() if text else pa.int64()
    made = pa.array([None if v is None else (str(v) if text else v) for v in values], type=typ)
    frame = bytearray(b"\xff" * 64)  # the hand-over's frame: the column's buffers are slices of it
    frame += b"".join(bytes(b) if b is not None else b"" for b in made.buffers())
    view = memoryview(frame)
    at = 64
    bufs = []
    for b in made.buffers():
        if b is None:
            bufs.append(None)
            continue
        bufs.append(pa.py_buffer(view[at:at + b.size]))
        at += b.size
    column = pa.Array.from_buffers(typ, len(made), bufs, null_count=made.null_count).slice(min(cut, len(made)))
    lo = pa.py_buffer(view).address
    hi = lo + len(frame)
    for given_ in (column, pa.chunked_array([column] * chunks, type=typ)):
        own = sc._own(given_)
        assert type(own) is type(given_) and own.type == typ and own.to_pylist() == given_.to_pylist()
        for part in (own.chunks if isinstance(own, pa.ChunkedArray) else [own]):
            assert all(b is None or b.size == 0 or not lo <= b.address < hi for b in part.buffers())
    ints = np.arange(2 * 10, dtype=np.int64).reshape(2, 10)
    row = sc._own(ints[1])
    assert row.base is None and np.array_equal(row, ints[1])
    listed = [v for v in values]
    assert sc._own(listed) is listed


def test_a_sample_at_another_rate_is_not_used(two_ranks, monkeypatch):
    """The sampled read-ahead's rate is of the trace's touches as if every request finished; a
    run whose finished rows make fewer (here 31 of 80 requests rejected: longer than the device
    pool) samples at another rate: the read-ahead is not used, the close reads the trace itself
    and its curves are its own."""
    trace, db = two_ranks
    monkeypatch.setattr(sc, "MAX_TOUCHES", 200)
    with open_store(db) as con:
        run = resolve_run(con, None)
        alone = sc.compute_size_curves(con, run)
        ahead = _fed_ahead(con, run)
        index = ahead.index
        assert index is not None and index.keep is not None and index.rate < alone.sample_rate < 1
        assert ahead.usable_index(index.touches) is index and ahead.usable_index(index.touches - 1) is None
        assert ahead.usable_index(100) is None  # within the budget: an unsampled pass, not this one
        assert sc.compute_size_curves(con, run) == alone
        assert not sc._READ_AHEAD


def test_a_read_ahead_that_cannot_start_leaves_the_close_as_it_was(two_ranks):
    trace, db = two_ranks
    for config in ({"page_size": "x"}, {"page_size": 0}, {"block_size": []}):
        sc.read_ahead(str(trace), None, config)
        assert not sc._READ_AHEAD
    sc.read_ahead(str(trace) + ".gone", None, {})
    assert not sc._READ_AHEAD


hostile = st.one_of(st.none(), st.integers(), st.text(max_size=20), st.lists(st.integers(), max_size=3),
                    st.dictionaries(st.text(max_size=8), st.integers(), max_size=3),
                    st.just({"__dataclass__": "SizeCurves", "write_policy": 1}),
                    st.just({"__dataclass__": "SizeCurves"}), st.just({"__dataclass__": "RunTotals"}))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=hostile)
def test_a_hand_edited_stored_section_is_never_misread(two_ranks, value):
    """A stored `size_curves` section that does not decode to SizeCurves is computed again from the
    trace (or read as the null it is), never raised."""
    import json

    from tierdiag.diagnose.run.facts import StoredEvidence

    _, db = two_ranks
    with open_store(db) as con:
        run = resolve_run(con, None)
        raw = json.loads(con.execute("SELECT evidence_json FROM run_evidence WHERE run_id = ?",
                                     [run.run_id]).fetchone()[0])
        expect = sc.compute_size_curves(con, run)
    stored = StoredEvidence({**raw, "size_curves": value})
    ok, got = stored.size_curves()
    assert (ok, got) == ((True, None) if value is None else (False, None))
    assert StoredEvidence(raw).size_curves() == (True, expect)


config_values = st.one_of(st.none(), st.integers(-2 ** 70, 2 ** 70), st.text(max_size=12), st.floats(allow_nan=True),
                          st.booleans(), st.lists(st.integers(), max_size=2))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(["page_size", "block_size", "device_tokens", "host_tokens", "storage_tokens",
                            "write_policy", "dp"]), value=config_values)
def test_a_hand_edited_config_gives_curves_or_none_never_an_error(two_ranks, key, value):
    """The recorded config the curves read (page and block sizes, pools, write policy): a hostile
    value gives no curves (a one-line reason) or curves, never an exception out of size_curves."""
    import dataclasses

    _, db = two_ranks
    with open_store(db) as con:
        run = resolve_run(con, None)
        edited = dataclasses.replace(run, config={**run.config, key: value})
        _curves_or_one_line(con, edited)
        sc.size_curves(con, edited)


def test_under_the_touch_budget_nothing_is_sampled(two_ranks):
    _, db = two_ranks
    with open_store(db) as con:
        curves = sc.compute_size_curves(con, resolve_run(con, None))
    assert curves.sample_rate == 1.0 and curves.model == sc.MODEL and curves.to_json()["sample_rate"] == 1.0


def test_over_the_touch_budget_the_pass_samples_and_says_so(two_ranks, monkeypatch):
    """A run with more page touches than MAX_TOUCHES (the pass's memory budget) is sampled down
    to it instead of losing its curves: the curves say SAMPLED and the rate, and stay close to
    the exact ones (the sample's depths and counts scaled back by the rate)."""
    _, db = two_ranks
    with open_store(db) as con:
        run = resolve_run(con, None)
        exact = sc.compute_size_curves(con, run)
        monkeypatch.setattr(sc, "MAX_TOUCHES", 2_000)
        sampled = sc.compute_size_curves(con, run)
    assert 0 < sampled.sample_rate < 1
    assert "SAMPLED" in sampled.model and sampled.to_json()["sample_rate"] == sampled.sample_rate
    assert 0.5 * exact.looked_up_tokens <= sampled.looked_up_tokens <= 2 * exact.looked_up_tokens
    for c in sampled.curves:
        assert [s for s, _ in c.steps] == sorted(s for s, _ in c.steps)
        assert [r for _, r in c.steps] == sorted(r for _, r in c.steps)
        assert all(r % sampled.page_size == 0 for _, r in c.steps)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(budget=st.one_of(st.integers(-5, 3), st.integers(4, 50_000), st.just(2**62)))
def test_any_touch_budget_gives_curves_never_an_exception(two_ranks, monkeypatch, budget):
    """Hostile budgets (zero, negative, one touch, more than the run has): curves, sampled or
    not, with a rate in (0, 1]; never an exception, never a curve that shrinks as it grows."""
    _, db = two_ranks
    monkeypatch.setattr(sc, "MAX_TOUCHES", budget)
    with open_store(db) as con:
        curves = sc.compute_size_curves(con, resolve_run(con, None))
    assert 0 < curves.sample_rate <= 1
    assert (curves.sample_rate == 1) == ("SAMPLED" not in curves.model)
    for c in curves.curves:
        assert [r for _, r in c.steps] == sorted(r for _, r in c.steps)
        assert c.reused_at(10**12) == c.unbounded_reused_tokens


@st.composite
def rewritten(draw, lines: list[str]):
    """The run's trace rewritten after the run (its recorded sha256 cleared, as in a store from
    before it was recorded): a line dropped, a field changed, junk appended, or the file emptied."""
    import json

    out = list(lines)
    how = draw(st.sampled_from(["drop", "length", "id", "junk", "empty", "hash", "same"]))
    i = draw(st.integers(0, len(out) - 1))
    if how == "drop":
        del out[i]
    elif how in ("length", "id", "hash"):
        obj = json.loads(out[i])
        if how == "length":
            obj["input_length"] = draw(st.integers(-5, 10 ** 7))
        elif how == "id":
            obj["id"] = draw(st.text(max_size=10))
        else:
            obj["hash_ids"] = draw(st.lists(st.integers(-3, 2 ** 40), max_size=6))
        out[i] = json.dumps(obj)
    elif how == "junk":
        out.insert(i, draw(st.text(max_size=30)))
    elif how == "empty":
        out = []
    return "\n".join(out) + ("\n" if out else "")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_trace_rewritten_after_the_run_gives_curves_of_its_lines_or_none(two_ranks, tmp_path_factory, data):
    """Read again at close or at a later summary, the trace may not be what was replayed: a line
    that no longer matches its row (seq, req_id, input length) or a file that no longer parses
    gives no curves with a one-line reason, never another exception."""
    import dataclasses

    trace, db = two_ranks
    text = data.draw(rewritten(trace.read_text().splitlines()))
    path = tmp_path_factory.mktemp("rewritten") / "trace.jsonl"
    path.write_text(text)
    with open_store(db) as con:
        run = resolve_run(con, None)
        edited = dataclasses.replace(run, trace_path=str(path), trace_sha256=None)
        _curves_or_one_line(con, edited)


def test_sizing_says_where_the_prediction_and_the_replay_disagree():
    from tierdiag.diagnose.advice.types import SIZING_TOLERANCE, Sizing

    base = dict(option="host_tokens", tier="host", value=7424, knee_tokens=6400, predicted_share=0.66,
                run_size_tokens=4096, run_predicted_share=0.0, run_found_share=0.0, slack_tokens=1024,
                curve_size_tokens=7424)
    far = Sizing(**base, replayed_share=0.0, replay_run_id="r1")
    assert far.disagrees is True
    assert "the knee 6400 + the median request's prefix 1024" in far.words()
    assert "the replay found 0 %: they disagree by 66.0 points (more than 5)" in far.words()
    near = Sizing(**base, replayed_share=0.66 - SIZING_TOLERANCE / 2, replay_run_id="r2")
    assert near.disagrees is False and "they agree within 5 points" in near.words()
    proposed = Sizing(**base)
    assert proposed.disagrees is None and "replay" not in proposed.words()
    unknown = Sizing(**{**base, "predicted_share": None}, replayed_share=0.5, replay_run_id="r3")
    assert unknown.disagrees is None and "disagree" not in unknown.words() and "agree within" not in unknown.words()
    assert far.to_json()["disagrees"] is True and far.to_json()["tolerance"] == SIZING_TOLERANCE


def test_the_report_figure_draws_each_tiers_curve_and_its_marks(two_ranks):
    from tierdiag.report.size_curves_figure import size_curves_figure

    assert size_curves_figure(None) is None
    _, db = two_ranks
    with open_store(db) as con:
        curves = sc.compute_size_curves(con, resolve_run(con, None))
    fig = size_curves_figure(curves)
    lines = {d["name"]: d for d in fig.figure["data"] if d["mode"] == "lines"}
    assert set(lines) == set(sc.TIERS)
    for c in curves.curves:
        line = lines[c.tier]
        assert line["x"] == sorted(line["x"]) and line["x"][0] == curves.page_size
        assert line["y"] == [100 * c.reused_at(x) / curves.input_tokens for x in line["x"]]
        marks = [d for d in fig.figure["data"] if d.get("legendgroup") == c.tier and d["mode"] == "markers"]
        run_mark = next(d for d in marks if "the run's size" in d["name"])
        assert run_mark["y"] == [100 * c.reused_at(c.run_size_tokens) / curves.input_tokens,
                                 100 * c.found_tokens / curves.input_tokens]
        if c.knee_tokens:
            assert any(d["x"] == [c.knee_tokens] for d in marks)
    assert fig.figure["layout"]["xaxis"]["type"] == "log"


def test_a_run_with_no_finished_request_stores_its_evidence(tmp_path):
    """A run closed with nothing finished (every request over the context, or an interrupt before
    the first finish): the curves' totals are sums over no rows (NULL), never a failed evidence
    (CI caught it as a warning line after a signal landed before the first request)."""
    import json

    from tests.support.cli import invoke
    from tierdiag.diagnose.run.evidence import compute_evidence
    from tierdiag.store.reader import open_store, resolve_run

    trace = tmp_path / "long.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": i, "input_length": 200_000, "output_length": 4,
                                         "hash_ids": list(range(i * 400, i * 400 + 391))}) + "\n" for i in range(3)))
    db = tmp_path / "r.duckdb"
    invoke("replay", str(trace), "--db", str(db))
    with open_store(db) as con:
        run = resolve_run(con, None)
        assert con.execute("SELECT count(*) FROM requests WHERE run_id = ? AND status = 'finished'",
                           [run.run_id]).fetchone()[0] == 0
        sections = compute_evidence(con, run)
    assert "size_curves" in sections


def _curves_or_one_line(con, run) -> None:
    """Curves for every tier, or CurvesUnavailable with a one-line reason; nothing else."""
    try:
        got = sc.compute_size_curves(con, run)
    except sc.CurvesUnavailable as exc:
        assert str(exc) and "\n" not in str(exc)
    else:
        assert {c.tier for c in got.curves} == set(sc.TIERS)


@settings(max_examples=60, deadline=None)
@given(depths=st.lists(st.integers(-3, 2**40), max_size=300), rate=st.one_of(st.none(), st.floats(1e-9, 1.0)),
       step=st.sampled_from([1, 7, 1 << 20]))
def test_the_depths_made_pages_in_place_are_the_two_wheres(depths, rate, step):
    """`_depth_pages` (in place, a chunk at a time: issue 41's writer memory at 200k requests) is
    the close's former two array expressions, value for value, on hostile depths (zero, -1,
    huge) and rates (tiny, 1, none), whatever the chunk; an int32 array is copied, not written."""
    never = np.iinfo(np.int64).max
    d = np.array(depths, dtype=np.int64)
    want = d if rate is None else np.where(d > 0, np.maximum(np.rint(d / rate), 1), d).astype(np.int64)
    want = np.where(want > 0, want, never)
    old, sc._DEPTH_CHUNK = sc._DEPTH_CHUNK, step
    try:
        got = sc._depth_pages(d.copy(), rate, never)
        small = d[(d >= -3) & (d < 2**31)].astype(np.int32)
        kept = small.copy()
        got32 = sc._depth_pages(small, rate, never)
    finally:
        sc._DEPTH_CHUNK = old
    assert got.dtype == np.int64 and got.tolist() == want.tolist()
    assert small.tolist() == kept.tolist()
    want32 = small.astype(np.int64) if rate is None else \
        np.where(small > 0, np.maximum(np.rint(small / rate), 1), small).astype(np.int64)
    assert got32.tolist() == np.where(want32 > 0, want32, never).tolist()


@settings(max_examples=80, deadline=None)
@given(values=st.lists(st.one_of(st.integers(0, 50), st.integers(0, 2**62), st.just(np.iinfo(np.int64).max)),
                       max_size=200))
def test_the_tally_sorted_in_place_is_the_tally_of_the_found(values):
    """`_tally_sorted` (the one-rank close: the lookups sorted in place, issue 41) gives `_tally`'s
    distinct values and counts of the values found (not `never`), whatever mix of small, huge and
    never; empty and all-never included."""
    never = np.iinfo(np.int64).max
    v = np.array(values, dtype=np.int64)
    want = sc._tally(v[v != never])
    got = sc._tally_sorted(v.copy(), never)
    assert [x.tolist() for x in got] == [x.tolist() for x in want]
    assert all(x.dtype == np.int64 for x in got)


_REQ_COLUMNS = ("run_id VARCHAR, seq BIGINT, req_id VARCHAR, dp_rank INTEGER, arrival_ns BIGINT, queue_ns BIGINT, "
                "finish_ns BIGINT, first_token_ns BIGINT, ttft_ns BIGINT, status VARCHAR, input_tokens BIGINT, "
                "output_tokens BIGINT, device_hit_tokens BIGINT, host_hit_tokens BIGINT, storage_hit_tokens BIGINT")
_maybe = st.none() | st.integers(0, 2 ** 40)


@st.composite
def stored_requests(draw):
    """Rows of two runs in any stored order: distinct seqs (some NULL), NULL times and counts, a
    NULL or unicode req_id, unfinished and aborted rows."""
    seqs = draw(st.lists(st.integers(0, 10 ** 6), unique=True, max_size=40))
    rows = []
    for seq in seqs:
        rows.append((draw(st.sampled_from(["R", "other"])), draw(st.none() | st.just(seq)),
                     draw(st.none() | st.text(max_size=6)), draw(st.none() | st.integers(0, 7)),
                     draw(st.none() | st.integers(0, 2 ** 40)), draw(_maybe), draw(_maybe), draw(_maybe),
                     draw(st.none() | st.integers(0, 10 ** 9)), draw(st.sampled_from([None, "finished", "aborted"])),
                     draw(_maybe), draw(_maybe), draw(_maybe), draw(_maybe), draw(_maybe)))
    return rows, draw(st.integers(1, 5))


@settings(max_examples=60, deadline=None)
@given(stored_requests())
def test_curve_columns_are_curve_requests_by_seq_with_the_ids_hashed(case):
    """read/curves.py `curve_columns` fetches without DuckDB's ORDER BY, a chunk of rows at a time
    with their req_ids hashed, and sorts by seq itself (issue 41: a 1M-request close's memory):
    the same rows in the same order as `curve_requests` (ORDER BY seq), whatever the stored order
    and the chunk size, the req_ids as `req_hashes` of them (None's hash for a NULL)."""
    import duckdb

    from tierdiag.diagnose.read.curves import curve_columns, curve_requests, req_hashes

    rows, chunk = case
    con = duckdb.connect(":memory:")
    con.execute(f"CREATE TABLE requests ({_REQ_COLUMNS})")
    if rows:
        insert_rows(con, "INSERT INTO requests", rows)  # executemany's rows in one statement
    want = curve_requests(con, "R")
    for got in (curve_columns(con, "R"), curve_columns(con, "R", chunk_rows=chunk)):
        assert all(c.dtype == np.int64 for c in got)
        assert got.seq.tolist() == [r.seq for r in want]
        assert got.req_id.tolist() == req_hashes([r.req_id for r in want]).tolist()
        for name in ("rank", "sched_ns", "fin_ns", "input_tokens", "output_tokens"):
            assert getattr(got, name).tolist() == [getattr(r, name) for r in want], name


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(st.integers(0, 6), min_size=1, max_size=6), max_size=12), st.sampled_from([64, 128, 512]),
       st.booleans())
def test_a_hash_ids_line_read_has_distinct_page_keys(tmp_path, lines, page, salted):
    """`_trace_pages` checks only tokens' keys for repeats (issue 41: the read-ahead's
    `_first_distinct` was ~1 s of the writer's CPU at 200k synth requests): a hash_ids line that
    read_trace accepts never holds an id twice (an id's second place follows another id than its
    first: the chain check refuses it, or skips it with the bad lines), so its pages' keys, id x
    pages a block + page, XORed with one salt, are distinct. Lines drawn with repeats, broken
    chains and shared prefixes; what is read is what the check would have kept."""
    import json

    from tierdiag.trace.pages import page_keys_array
    from tierdiag.trace.reader import read_trace

    path = tmp_path / f"t{abs(hash((tuple(map(tuple, lines)), page, salted)))}.jsonl"
    with open(path, "w") as fh:
        for i, ids in enumerate([[100, 101]] + lines):  # a good line first: a trace of bad ones only is refused
            row = {"id": f"r{i}", "timestamp": i, "input_length": 512 * len(ids), "output_length": 1, "hash_ids": ids}
            if salted:
                row["extra_key"] = "lora-\u00e9"
            fh.write(json.dumps(row) + "\n")
    got = [(r.req_id, k.tolist()) for r, *_ in [(r,) for r in read_trace(path, block_size=512, skip_bad=True)]
           for k in [page_keys_array(r, page_size=page, block_size=512)]]
    for _, keys in got:
        assert keys == sc._first_distinct(np.array(keys, dtype=np.int64)).tolist()
    assert [(rid, k.tolist()) for _, _, rid, _, k, *_ in sc._trace_pages(str(path), page, 512)] == got


# --- the read-ahead's keys a chunk at a time (issue 41, session 23: the writer's CPU at 1M) -----

def _request(seq, hash_ids=None, tokens=None, input_len=1, extra_key=None):
    from tierdiag.trace.reader import TraceRequest

    return TraceRequest(f"r{seq}", seq, seq + 1, 1000 * seq, input_len, 3, hash_ids, tokens, 0, extra_key,
                        None, None)


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(st.tuples(st.lists(st.integers(0, 2**40), max_size=12), st.integers(1, 9_000)),
                      min_size=1, max_size=20),
       page=st.sampled_from([1, 16, 64, 100, 128, 512, 1024]), block=st.sampled_from([64, 256, 512, 1000]))
def test_a_chunks_keys_made_at_once_are_each_requests_own(lines, page, block):
    """`_chunk_keys` (a chunk of plain hash_ids lines, in numpy at once) gives each request the
    keys `page_keys_array` gives it alone (C, or numpy), in order, with each key's place in its
    request; hash ids up to 2**40, input lengths past and short of what the ids cover, page sizes
    that do not divide the block (then None: the request-at-a-time path says why), empty lines."""
    from tierdiag.errors import ConfigError
    from tierdiag.trace.pages import page_keys_array

    reqs = [_request(i, tuple(ids), input_len=n) for i, (ids, n) in enumerate(lines)]
    made = sc._chunk_keys(reqs, page, block)
    if block % page:
        assert made is None
        with pytest.raises(ConfigError):
            page_keys_array(reqs[0], page_size=page, block_size=block)
        return
    keys, lens, at = made
    want = [page_keys_array(r, page_size=page, block_size=block) for r in reqs]
    assert lens.tolist() == [len(k) for k in want]
    assert keys.dtype == np.int64 and keys.tolist() == [int(k) for w in want for k in w]
    assert at.tolist() == [i for w in want for i in range(len(w))]


def test_a_chunk_with_tokens_or_an_extra_key_takes_the_request_at_a_time_path():
    plain = [_request(0, (1, 2), input_len=1024)]
    assert sc._chunk_keys(plain, 64, 512) is not None
    assert sc._chunk_keys(plain + [_request(1, None, tokens=(5,) * 70, input_len=70)], 64, 512) is None
    assert sc._chunk_keys(plain + [_request(1, (1, 3), input_len=1024, extra_key="lora-\u00e9")], 64, 512) is None
    assert sc._chunk_keys(plain, 0, 512) is None and sc._chunk_keys(plain, -64, 512) is None


def pages_both_ways(reqs, page: int):
    """Two `_Pages` of the same requests (blocks of 512 tokens), finished: one fed each request's
    page keys (`add`, as `_trace_pages` reads lines), one the requests as read (`add_request`)."""
    by_keys, as_read = sc._Pages(page), sc._Pages(page)
    for r in reqs:
        by_keys.add(r.line, r.seq, r.req_id, r.input_len, sc._request_keys(r, page, 512), r.arrival_ns, r.session,
                    r.output_len)
        as_read.add_request(r, 512)
    by_keys.finish()
    as_read.finish()
    return by_keys, as_read


@pytest.mark.parametrize("budget", [-1, 0, 1])
def test_a_pass_of_no_page_touches_is_never_sampled_whatever_the_budget(monkeypatch, budget):
    """Requests shorter than a page make no page touch; with the budget patched under 1 (a
    hostile value Hypothesis drew: `max(MAX_TOUCHES, 1) / touches` divided by zero) the pass is
    kept whole: nothing to sample, the same index both ways, and the fed index is the close's."""
    monkeypatch.setattr(sc, "MAX_TOUCHES", budget)
    reqs = [_request(i, (7 * i, 7 * i + 1), input_len=16) for i in range(3)]
    by_keys, as_read = pages_both_ways(reqs, 512)
    assert by_keys.touches == as_read.touches == 0
    assert not by_keys.sampled and not as_read.sampled
    assert sc._over_budget(0) is False and sc._over_budget(1) is (budget < 1)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kinds=st.lists(st.sampled_from(["hash", "tokens", "salted", "repeat"]), min_size=1, max_size=30),
       chunk=st.sampled_from([1, 2, 5, 4096]), budget=st.one_of(st.just(2**62), st.integers(-1, 400)),
       page=st.sampled_from([16, 64]))
def test_requests_added_as_read_keep_what_their_lines_keep(monkeypatch, kinds, chunk, budget, page):
    """`_Pages.add_request` (the read-ahead: keys a chunk at a time) keeps the columns, chunks,
    sample and rate that `add` of `_trace_pages`' lines keeps, whatever the mix of lines (tokens
    with repeated pages, salted hash ids, plain ones), the chunk size and the budget (sampled or
    not, hostile budgets too)."""
    monkeypatch.setattr(sc, "MAX_TOUCHES", budget)
    monkeypatch.setattr(sc._Pages, "_CHUNK", chunk)
    reqs = []
    for i, kind in enumerate(kinds):
        if kind == "tokens":
            reqs.append(_request(i, None, tokens=tuple(range(i, i + 40)) * 2, input_len=80))
        elif kind == "repeat":
            reqs.append(_request(i, None, tokens=(7,) * 96, input_len=96))
        else:
            reqs.append(_request(i, tuple(range(3 * i, 3 * i + 3)), input_len=1500,
                                 extra_key="salt" if kind == "salted" else None))
    one, two = pages_both_ways(reqs, page)
    for name in ("line", "seq", "input_len", "arrival", "full", "pred", "req_hash"):
        assert getattr(one, name) == getattr(two, name), name
    assert (one.touches, one.rate, one.sampled, len(one.chunks)) == (two.touches, two.rate, two.sampled,
                                                                     len(two.chunks))
    for a, b in zip(one.chunks, two.key_chunks()):  # a plain chunk kept as hash ids: its keys made
        for x, y in zip(a, b):
            assert x.dtype == y.dtype and x.tolist() == y.tolist()


@settings(max_examples=200, deadline=None)
@given(lens=st.lists(st.integers(0, 9), max_size=30), data=st.data())
def test_segment_sums_count_each_runs_set_flags(lens, data):
    flags = np.array(data.draw(st.lists(st.booleans(), min_size=sum(lens), max_size=sum(lens))), dtype=bool)
    got = sc._segment_sums(flags, np.array(lens, dtype=np.int64))
    at, want = 0, []
    for n in lens:
        want.append(int(flags[at:at + n].sum()))
        at += n
    assert got.dtype == np.int64 and got.tolist() == want


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(st.integers(-2**63, 2**63 - 1), max_size=40),
       rate=st.one_of(st.floats(0, 1), st.just(1e-300), st.just(1.0)), narrow=st.booleans())
def test_the_sampler_reads_int64_keys_in_place_as_it_hashed_their_copy(keys, rate, narrow):
    """`_sampler`'s keep reads int64 keys as uint64 in place (no astype copy): the same keys kept
    as the hash of their uint64 copy keeps, negative keys and any rate included; other dtypes
    are still copied."""
    arr = np.array(keys, dtype=np.int64)
    if narrow:
        arr = arr.astype(np.int32)
    keep = sc._sampler(rate)
    bound = min(int(rate * 2.0**64), 2**64 - 1)
    want = [((int(k) % 2**64) * sc._MIX) % 2**64 < bound for k in arr.tolist()]
    assert keep(arr).tolist() == want
    assert keep(arr[::2]).tolist() == want[::2]


def test_the_close_hands_its_freed_heap_back_only_for_a_large_run(two_ranks, monkeypatch):
    """compute_size_curves trims the heap its pass freed (live_curves.release_freed_heap) from
    TRIM_FROM_ROWS finished rows on, where the sections after it compute on top; a smaller run's
    curves skip it (issue 41: ~2 ms of the close's longest thread). A close that reads the trace
    itself (none read ahead, as here) trims the read's parse state too, before its pass. The
    curves are the same."""
    from tierdiag.diagnose.run import live_curves as lc

    trace, db = two_ranks
    calls = []
    real = lc.release_freed_heap
    monkeypatch.setattr(lc, "release_freed_heap", lambda: calls.append(1) or real())
    with open_store(db) as con:
        run = resolve_run(con, None)
        small = sc.compute_size_curves(con, run)
        assert calls == []
        monkeypatch.setattr(sc, "TRIM_FROM_ROWS", 1)
        assert sc.compute_size_curves(con, run) == small
        assert calls == [1, 1]  # after the read, after the pass
        monkeypatch.setattr(sc, "TRIM_FROM_ROWS", 0)  # a run of no finished row: trimmed too, nothing else
        assert sc.compute_size_curves(con, run) == small and calls == [1, 1, 1, 1]


def _interrupted_copy(db: Path, folder: Path, kept: int, trace: Path | None = None) -> Path:
    """A copy of `db` whose run keeps the request rows of its first `kept` seqs only, as a run
    interrupted part-way through its trace (every request of `all_finish` finished, so they are
    the rows of seqs 0 .. kept - 1); `trace`: the trace its run names instead (digest unknown)."""
    import shutil

    import duckdb

    copy = folder / f"cut{kept}-{0 if trace is None else 1}.duckdb"
    shutil.copy(db, copy)
    with duckdb.connect(str(copy)) as con:
        con.execute("DELETE FROM requests WHERE seq >= ?", [kept])
        if trace is not None:
            con.execute("UPDATE runs SET trace_path = ?, trace_sha256 = ''", [str(trace)])
    return copy


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(part=st.floats(0.05, 1.0), budget=st.sampled_from([200, 2 ** 62]))
def test_the_close_reads_the_trace_up_to_its_runs_last_request_only(all_finish, tmp_path, monkeypatch, part, budget):
    """The close that reads the trace again (no read-ahead it can use: an interrupted run's, whose
    rows end part-way through the trace) stops at the line of the run's last request: the curves
    are the ones of the trace cut there, sampled or not, and no line after it is read (issue 41:
    a 1M-request run stopped half-way read the whole trace in its close)."""
    trace, db = all_finish
    lines = trace.read_text().splitlines(keepends=True)
    kept = max(1, min(len(lines), round(part * len(lines))))
    monkeypatch.setattr(sc, "MAX_TOUCHES", budget)
    cut_trace = tmp_path / f"cut{kept}.jsonl"
    cut_trace.write_text("".join(lines[:kept]))  # one request a line (synth): seq k is line k + 1
    read: list[int] = []
    pages = sc._trace_pages

    def counted(*args, **kwargs):
        for got in pages(*args, **kwargs):
            read.append(got[1])
            yield got

    monkeypatch.setattr(sc, "_trace_pages", counted)
    with open_store(_interrupted_copy(db, tmp_path, kept)) as con:
        curves = sc.compute_size_curves(con, resolve_run(con, None))
    assert read == list(range(kept))  # up to the run's last request, not one line more
    with open_store(_interrupted_copy(db, tmp_path, kept, trace=cut_trace)) as con:
        assert sc.compute_size_curves(con, resolve_run(con, None)) == curves


def test_a_read_ahead_the_close_cannot_use_is_let_go_and_the_reads_heap_handed_back_before_the_pass(all_finish,
                                                                                                 tmp_path, monkeypatch):
    """A sampled read-ahead's rate is the whole trace's: the close of a run with fewer requests
    (interrupted) samples at its own and reads the trace again, up to its last request. The
    read-ahead is let go, and glibc's freed heap (the read's parse state) handed back between the
    read and the pass (issue 41: an interrupted 1M-request run's close passed 1 GB); the curves
    are the ones the close makes with no read-ahead at all."""
    from tierdiag.diagnose.run import live_curves

    trace, db = all_finish
    monkeypatch.setattr(sc, "MAX_TOUCHES", 200)
    monkeypatch.setattr(sc, "TRIM_FROM_ROWS", 0)
    with open_store(db) as con:
        lines = con.execute("SELECT count(*) FROM requests").fetchone()[0]
    cut = _interrupted_copy(db, tmp_path, lines * 2 // 3)
    with open_store(cut) as con:
        run = resolve_run(con, None)
        alone = sc.compute_size_curves(con, run)
    with open_store(db) as con:
        ahead = _fed_ahead(con, resolve_run(con, None))  # fed every row: the whole trace's sample
    assert ahead.index is not None and ahead.index.keep is not None
    events: list[str] = []
    monkeypatch.setattr(live_curves, "release_freed_heap", lambda: events.append("trim") or True)
    pages = sc._trace_pages

    def reading(*args, **kwargs):
        events.append("read")
        yield from pages(*args, **kwargs)

    monkeypatch.setattr(sc, "_trace_pages", reading)
    import weakref

    gone = weakref.ref(ahead)
    del ahead
    with open_store(cut) as con:
        run = resolve_run(con, None)
        assert sc.compute_size_curves(con, run) == alone
    assert not sc._READ_AHEAD and gone() is None
    assert events == ["read", "trim", "trim"], events  # after the read, after the pass


def _sorted_close(monkeypatch) -> None:
    """compute_size_curves as its close made the pass over the keys it read itself before issue 41's
    session 37: an array of every touch (`_touches`, ~70 bytes a touch), sorted and walked at once
    (`_pass_depths`), not `whole_pass` over an index of the run's rows (`_rows_index`)."""
    made = sc._pass

    def rows_index(cols, kept, lens, marks, lengths, keep, rate, touches):
        return ("touches", cols, kept.array(), lens, None if marks is None else marks.array(), keep)

    def passing(cols, index, live, page, several):
        if isinstance(index, tuple):
            _, c, flat, lens, marks, keep = index
            return sc._pass_depths(*sc._touches(c, flat, lens, marks, page, keep))
        return made(cols, index, live, page, several)

    monkeypatch.setattr(sc, "_rows_index", rows_index)
    monkeypatch.setattr(sc, "_pass", passing)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(part=st.floats(0.0, 1.0), budget=st.one_of(st.sampled_from([-1, 0, 1, 200, 2 ** 62]), st.integers(2, 6_000)),
       one_rank=st.booleans(), walk=st.sampled_from([1, 7, 1 << 16]))
def test_an_interrupted_runs_curves_are_the_pass_over_every_touch(all_finish, tmp_path, monkeypatch, part, budget,
                                                                   one_rank, walk):
    """A close that reads the trace itself (an interrupted run's: its rows end part-way, so the
    read-ahead's sample is not its own) walks its pass over an index of its rows' keys (dense ids,
    as the read-ahead's, walked `_WALK_EVENTS` at a time), not over an array of every touch (issue
    41: the interrupted 1M-request close passed 1 GB). Wherever the run stops, whatever the budget
    (sampled or not, hostile ones included), of one rank or two, the curves are the ones the pass
    over every touch makes."""
    from tierdiag.diagnose.run import live_curves

    import duckdb

    trace, db = all_finish
    n = len(trace.read_text().splitlines())
    kept = max(1, min(n, round(part * n)))
    cut = _interrupted_copy(db, tmp_path, kept)
    if one_rank:
        with duckdb.connect(str(cut)) as con:
            con.execute("UPDATE requests SET dp_rank = 0")
    monkeypatch.setattr(sc, "MAX_TOUCHES", budget)
    monkeypatch.setattr(live_curves, "_WALK_EVENTS", walk)
    with open_store(cut) as con:
        run = resolve_run(con, None)
        walked = []
        whole = live_curves.whole_pass
        with monkeypatch.context() as m:
            m.setattr(live_curves, "whole_pass", lambda *a, **k: walked.append(1) or whole(*a, **k))
            got = sc.compute_size_curves(con, run)
        assert walked == [1]  # the index's pass, walked here
        with monkeypatch.context() as m:  # (each example's own: Hypothesis runs them in one test)
            _sorted_close(m)
            want = sc.compute_size_curves(con, run)
    assert got == want
    if budget == 2 ** 62:
        assert got.sample_rate == 1.0  # exact
    elif budget <= 1:
        assert got.sample_rate < 1  # sampled down to a budget the rate takes as 1 touch
