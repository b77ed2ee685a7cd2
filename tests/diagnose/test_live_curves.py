"""The size curves' pass fed while the run is recorded (diagnose/run/live_curves.py, issue 41):
the stack fed groups as they come (compiled, and its Python twin) against the sort-based pass;
the pass fed rows in any batches, walked up to any watermark, against the whole pass at once;
its check at the close (a walk that is not the rows' own start is never used); and a replay
whose writer process fed it stores the same evidence as one whose close walked it all."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from tierdiag.diagnose.read.curves import CurveColumns, req_hashes
from tierdiag.diagnose.run import live_curves as lc
from tierdiag.diagnose.run import size_curves as sc

# --------------------------------------------------------------------------- the stack


@st.composite
def id_streams(draw):
    """Groups of dense ids (some -1: keys touched once), queried at random, and a cut of them
    into feeds."""
    n_ids = draw(st.integers(0, 12))
    sizes = draw(st.lists(st.integers(0, 7), max_size=25))
    total = sum(sizes)
    ids = draw(st.lists(st.integers(-1, n_ids - 1), min_size=total, max_size=total))
    query = draw(st.lists(st.booleans(), min_size=total, max_size=total))
    cuts = sorted(draw(st.lists(st.integers(0, len(sizes)), max_size=4)))
    return n_ids, np.array(ids, dtype=np.int64), np.array(query, dtype=bool), np.array(sizes, dtype=np.int64), cuts


def _fed(stack, ids, query, sizes, cuts):
    out, at, g0 = [], 0, 0
    for g in cuts + [len(sizes)]:
        n = int(sizes[g0:g].sum())
        out += lc.feed(stack, ids[at:at + n], query[at:at + n], sizes[g0:g]).tolist()
        at, g0 = at + n, g
    return out


@settings(max_examples=300, deadline=None)
@given(id_streams())
def test_the_stack_fed_in_any_cuts_answers_the_sort_based_pass(stream):
    """Each -1 is a key of its own (an output page): the sort-based pass gets it a distinct key."""
    n_ids, ids, query, sizes, cuts = stream
    keys = np.where(ids >= 0, ids, -1 - np.arange(len(ids)))
    want = sc._flat_depths(keys, query, sizes).tolist()
    assert _fed(lc.StackPython(n_ids), ids, query, sizes, cuts) == want
    compiled = pytest.importorskip("tierdiag.native._stackdist")
    assert _fed(compiled.Stack(n_ids), ids, query, sizes, cuts) == want


def test_the_stack_grows_past_its_first_tree_and_keeps_its_answers():
    rng = np.random.default_rng(3)
    ids = rng.integers(-1, 5000, 60_000)
    query = rng.integers(0, 2, 60_000).astype(bool)
    sizes = np.full(6_000, 10, dtype=np.int64)
    keys = np.where(ids >= 0, ids, -1 - np.arange(len(ids)))
    want = sc._flat_depths(keys, query, sizes).tolist()
    assert _fed(lc.new_stack(5000), ids, query, sizes, list(range(1, 6_000, 777))) == want
    assert _fed(lc.StackPython(5000), ids[:6000], query[:6000], sizes[:600], [7, 300]) == want[:int(query[:6000].sum())]


@settings(max_examples=8, deadline=None)
@given(st.sampled_from([(1 << 19) - 1, 1 << 19, (1 << 19) + 1, 3 << 19, 780_000]), st.integers(0, 2**32 - 1))
def test_a_stack_of_a_huge_page_or_more_of_ids_answers_as_a_small_one(n_ids, seed):
    """A stack whose ids fill 2 MiB or more keeps them in whole huge pages (session 37: one a rank
    at --dp 8, each the whole trace's ids; their fills were ~7 k minor faults of the writer's):
    every id, the last one included, starts never touched (-1), and the answers are the sort-based
    pass's, ids drawn from both ends of the range."""
    import resource

    compiled = pytest.importorskip("tierdiag.native._stackdist")
    rng = np.random.default_rng(seed)
    ids = np.concatenate([rng.integers(-1, 40, 3000), rng.integers(n_ids - 40, n_ids, 3000)])
    rng.shuffle(ids)
    query = rng.integers(0, 2, ids.size).astype(bool)
    sizes = np.full(600, 10, dtype=np.int64)
    keys = np.where(ids >= 0, ids, -1 - np.arange(len(ids)))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    stack = compiled.Stack(n_ids)
    made = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert _fed(stack, ids, query, sizes, [100, 599]) == sc._flat_depths(keys, query, sizes).tolist()
    assert made < n_ids * 4 // 4096 + 64  # at most one fault a plain page (fewer where huge)


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 3000), st.integers(0, 60), st.integers(1, 6_000),
       st.integers(1, 12))
def test_the_stack_renumbered_as_it_fills_answers_the_sort_based_pass(seed, n_ids, fresh_pct, group_max, feeds):
    """The compiled stack renumbers its marked positions when its tree is full (stackdist.c
    `sd_compact`: issue 41, the tree covers the keys still marked, not every touch fed): many more
    touches than keys, keys touched once (-1) among them, groups from 1 key to more than the tree,
    fed in several cuts. Its answers are the sort-based pass's and its Python twin's (which never
    renumbers), and its tree stays within a few times the keys marked."""
    compiled = pytest.importorskip("tierdiag.native._stackdist")
    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, group_max + 1, 40)
    total = int(sizes.sum())
    ids = rng.integers(0, n_ids, total)
    ids[rng.random(total) < fresh_pct / 100] = -1
    query = rng.integers(0, 2, total).astype(bool)
    cuts = sorted(rng.integers(0, len(sizes) + 1, feeds - 1).tolist())
    keys = np.where(ids >= 0, ids, -1 - np.arange(total))
    want = sc._flat_depths(keys, query, sizes).tolist()
    stack = compiled.Stack(n_ids)
    assert _fed(stack, ids, query, sizes, cuts) == want
    assert stack.touches == total
    assert _fed(lc.StackPython(n_ids), ids, query, sizes, cuts) == want
    live = len(np.unique(keys))
    bounds = [0] + cuts + [len(sizes)]
    widest = max(int(sizes[a:b].sum()) for a, b in zip(bounds, bounds[1:]))  # the largest feed
    assert stack.slots <= max(4096, 8 * (live + widest), 2 * n_ids)


@pytest.mark.parametrize("keys", [1, 63, 64, 65, 127, 129, 4095, 4097])
def test_the_stacks_words_of_positions_left_answer_across_their_bounds(keys):
    """The compiled stack keeps the positions left a bit each, counted by a tree over their 64-bit
    words (stackdist.c: the positions left below p are the words' prefix and a popcount of p's
    own): keys revisited in a cycle of `keys`, so that a key's previous touch lies at every place
    in a word and its depth counts whole words and parts of one, output pages (-1) among them,
    fed through growths and renumberings where the positions used end inside a word. Its answers
    are the sort-based pass's and StackPython's."""
    compiled = pytest.importorskip("tierdiag.native._stackdist")
    rng = np.random.default_rng(keys)
    total = 30_000
    ids = np.arange(total, dtype=np.int64) % keys
    ids[rng.random(total) < 0.03] = -1
    query = rng.random(total) < 0.7
    sizes = rng.integers(1, 70, total)
    sizes = sizes[:int(np.searchsorted(np.cumsum(sizes), total))]
    sizes = np.r_[sizes, total - int(sizes.sum())].astype(np.int64)
    cuts = sorted(set(rng.integers(1, len(sizes), 9).tolist()))
    want = sc._flat_depths(np.where(ids >= 0, ids, -1 - np.arange(total)), query, sizes).tolist()
    stack = compiled.Stack(keys)
    assert _fed(stack, ids, query, sizes, cuts) == want
    assert stack.touches == total and stack.slots <= max(4096, 8 * (keys + total))
    assert _fed(lc.StackPython(keys), ids, query, sizes, cuts) == want


def test_the_stack_renumbers_instead_of_growing_over_few_keys():
    """100 feeds of 2,048 touches over 1,000 keys: the tree grows once, to 8,192 slots (room for
    the keys and a feed, half of it free), and stays there; without the renumbering it grew to
    2**18, 4 bytes a touch fed."""
    compiled = pytest.importorskip("tierdiag.native._stackdist")
    rng = np.random.default_rng(5)
    stack, twin = compiled.Stack(1000), lc.StackPython(1000)
    for _ in range(100):
        ids = rng.integers(-1, 1000, 2048)
        query = rng.random(2048) < 0.05
        sizes = np.full(32, 64, dtype=np.int64)
        assert lc.feed(stack, ids, query, sizes).tolist() == lc.feed(twin, ids, query, sizes).tolist()
    assert stack.touches == 100 * 2048 and stack.slots == 8192


hostile_feeds = st.sampled_from([
    ([5], [1], [1]),            # an id past the stack's
    ([-2], [1], [1]),           # below -1
    ([0, 1], [1], [2]),         # query shorter than the ids
    ([0, 1], [1, 0], [3]),      # sizes past the ids
    ([0, 1], [1, 0], [-1, 3]),  # a negative size
    ([0, 1], [1, 0], [1]),      # sizes short of the ids
])


@settings(deadline=None)  # a C call a feed: under load an example can pass 200 ms (once, h41curves1)
@given(hostile_feeds)
def test_a_malformed_feed_is_refused_by_both_and_leaves_the_stack_as_it_was(bad):
    ids, query, sizes = (np.array(x, dtype=np.int64) for x in bad)
    stacks = [lc.StackPython(3)]
    compiled = pytest.importorskip("tierdiag.native._stackdist")
    stacks.append(compiled.Stack(3))
    for stack in stacks:
        with pytest.raises(ValueError):
            lc.feed(stack, ids, query.astype(np.uint8), sizes)
        assert stack.touches == 0
        assert lc.feed(stack, np.array([0, 0]), np.array([1, 1], dtype=bool), np.array([1, 1])).tolist() == [-1, 1]


@given(st.one_of(st.integers(max_value=-1), st.floats(allow_nan=True), st.text(max_size=3), st.none()))
def test_a_stack_of_no_sensible_size_is_refused(ids):
    compiled = pytest.importorskip("tierdiag.native._stackdist")
    with pytest.raises((ValueError, TypeError)):
        lc.StackPython(ids)
    with pytest.raises((ValueError, TypeError, OverflowError)):  # past int64: the argument's own refusal
        compiled.Stack(ids)


# --------------------------------------------------------------------------- the pass fed as rows come


@st.composite
def runs(draw):
    """A trace of requests (prefix-chained page keys) and their rows: rank, schedule and finish
    times, tokens; a few rows not finished; the order the rows reach the writer (finish order,
    a few swapped), cut into batches, and watermarks to walk to after each."""
    n = draw(st.integers(1, 30))
    page = draw(st.sampled_from([1, 2, 4]))
    keys, rows = [], []
    for i in range(n):
        path = [draw(st.integers(0, 3)) for _ in range(draw(st.integers(0, 6)))]
        keys.append(np.array([hash(tuple(path[:j + 1])) & (2 ** 40 - 1) for j in range(len(path))], dtype=np.int64))
        arrival = draw(st.integers(0, 50))
        sched = arrival + draw(st.integers(0, 20))
        fin = sched + draw(st.integers(0, 20))
        inp = len(path) * page + draw(st.integers(0, page))
        rows.append((draw(st.integers(0, 2)), sched, fin, inp, draw(st.integers(0, 3 * page)),
                     draw(st.booleans()) or draw(st.booleans()), arrival))
    order = sorted(range(n), key=lambda i: rows[i][2])
    for _ in range(draw(st.integers(0, 3))):
        a, b = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
        order[a], order[b] = order[b], order[a]
    cuts = sorted(set(draw(st.lists(st.integers(1, n), max_size=5))))
    marks = draw(st.lists(st.integers(-1, 80), min_size=len(cuts) + 1, max_size=len(cuts) + 1))
    return page, keys, rows, order, cuts, marks


def _cols(rows, finished_only=True):
    keep = [i for i, r in enumerate(rows) if r[5] or not finished_only]
    a = np.array([[i] + list(rows[i][:5]) for i in keep], dtype=np.int64).reshape(-1, 6)
    return CurveColumns(a[:, 0], np.array([str(i) for i in keep], dtype=object), a[:, 1], a[:, 2], a[:, 3],
                        a[:, 4], a[:, 5]), np.array(keep, dtype=np.int64)


def _fed_pass(page, keys, rows, order, cuts, marks, several):
    index = lc.TraceIndex.of_keys(np.arange(len(keys)), keys)
    live = lc.LivePass(index, page, all_ranks=several)
    at = 0
    for cut, mark in zip(cuts + [len(order)], marks):
        pos = np.array(order[at:cut], dtype=np.int64)
        r = np.array([rows[i] for i in order[at:cut]], dtype=np.int64).reshape(-1, 7)
        live.add_rows(pos, r[:, 0], r[:, 1], r[:, 2], r[:, 3], r[:, 4], r[:, 5].astype(bool))
        live.advance(None if mark < 0 else mark)
        at = cut
    return index, live


@settings(max_examples=200, deadline=None)
@given(runs(), st.booleans())
def test_a_pass_fed_in_batches_is_used_only_where_it_is_the_whole_pass(case, several):
    """Walked to any watermark after any batch (a wrong one included: events of rows that come
    later fall before it), the pass is used at the close only where `verify` finds its walk the
    start of the rows' own event order, and then gives the whole pass's depths exactly."""
    page, keys, rows, order, cuts, marks = case
    index, live = _fed_pass(page, keys, rows, order, cuts, marks, several)
    cols, pos = _cols(rows)
    whole = lc.whole_pass(index, pos, cols, page, all_ranks=several)
    if live.verify(pos, cols):
        got = live.results()
        assert [x.tolist() for x in got[:2]] == [x.tolist() for x in whole[:2]]
        if several:
            assert got[2].tolist() == whole[2].tolist()
    # Walked after every row is in, at once, the pass is always the whole one.
    index, live = _fed_pass(page, keys, rows, order, [], [-1], several)
    assert live.verify(pos, cols)
    assert [x.tolist() for x in live.results()[:2]] == [x.tolist() for x in whole[:2]]


@settings(max_examples=200, deadline=None)
@given(runs())
def test_the_depths_tallied_as_walked_are_the_closes_tally_of_them(case):
    """A pass of one rank tallies its positive depths as it walks (`depth_tally`): fed in any
    batches, walked to any watermarks (or all at once), what the close would make of its depths
    (size_curves' `_tally_sorted` of `_depth_pages`: distinct depths, their counts, dtypes) and
    its lookups' count."""
    page, keys, rows, order, cuts, marks = case
    rows = [(0, *r[1:]) for r in rows]  # one rank
    cols, pos = _cols(rows)
    for batched in (True, False):
        index, live = _fed_pass(page, keys, rows, order, cuts, marks, False) if batched else \
            _fed_pass(page, keys, rows, order, [], [-1], False)
        if not live.verify(pos, cols):
            assert batched  # all at once: always the whole pass
            continue
        tallied = live.depth_tally()
        got_rank, d_rank, _ = live.results()
        never = np.iinfo(np.int64).max
        want = sc._tally_sorted(sc._depth_pages(d_rank.copy(), None, never), never)
        assert tallied is not None
        n, values, counts = tallied
        assert n == len(got_rank) and values.tolist() == want[0].tolist() and counts.tolist() == want[1].tolist()
        assert values.dtype == want[0].dtype and counts.dtype == want[1].dtype
        if not batched:
            # Walked to its end and `done` (as the writer's read-ahead ends it): the arrays made
            # then, on the walking thread, are what the close's call would make.
            index, live = _fed_pass(page, keys, rows, order, [], [-1], False)
            live.done()
            assert live._tallied is not None and live._tallied[0] is live.tally
            early = live.depth_tally()
            live._tallied = None
            late = live.depth_tally()
            assert early[0] == late[0] == n
            for a, b in zip(early[1:], late[1:]):
                assert a.tolist() == b.tolist() and a.dtype == b.dtype


def test_a_tally_deeper_than_its_bound_or_of_several_ranks_is_left_to_the_close(monkeypatch):
    index = lc.TraceIndex.of_keys(np.arange(3), [np.arange(5, dtype=np.int64) for _ in range(3)])  # re-read
    rows = np.array([[0, 0, 10, 5, 0, 1], [0, 20, 30, 5, 0, 1], [0, 40, 50, 5, 0, 1]], dtype=np.int64)
    for bound, ranks, want in ((1 << 21, (0, 0, 0), True), (2, (0, 0, 0), False), (1 << 21, (0, 1, 0), False)):
        monkeypatch.setattr(lc, "_TALLY_MOST", bound)
        live = lc.LivePass(index, 1, all_ranks=False)
        for i in range(3):
            r = rows[i]
            live.add_rows(np.array([i]), [ranks[i]], [r[1]], [r[2]], [r[3]], [r[4]], [True])
            live.advance(None)
        tallied = live.depth_tally()
        assert (tallied is not None) is want, (bound, ranks)
        assert tallied is None or (tallied[0] == 12 and tallied[1].max() >= 2)
    assert lc.LivePass(index, 1, all_ranks=True).tally is None


@settings(max_examples=150, deadline=None)
@given(runs())
def test_the_whole_pass_over_an_index_is_the_sort_based_pass_of_the_close(case):
    """live_curves' walk (dense ids, output pages as -1) against size_curves' `_touches` and
    `_pass_depths` (the sampled close's, and the first written), on the same rows."""
    page, keys, rows, order, cuts, marks = case
    cols, pos = _cols(rows)
    index = lc.TraceIndex.of_keys(np.arange(len(keys)), keys)
    several = len(np.unique(cols.rank)) > 1
    got = lc.whole_pass(index, pos, cols, page, all_ranks=several)
    kept = [keys[i] for i in pos.tolist()]
    flat = np.concatenate(kept) if kept else np.zeros(0, dtype=np.int64)
    lens = np.array([len(k) for k in kept], dtype=np.int64)
    want = sc._pass_depths(*sc._touches(cols, flat, lens, None, page, None))
    assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()
    if several:
        assert got[2].tolist() == want[2].tolist()


def test_a_walk_past_a_row_that_came_late_is_refused():
    """A request scheduled at 5 whose row comes after a watermark of 10: the walk is not the
    rows' own start, so the close walks the pass whole."""
    keys = [np.array([1, 2], dtype=np.int64), np.array([1, 3], dtype=np.int64)]
    index = lc.TraceIndex.of_keys(np.arange(2), keys)
    live = lc.LivePass(index, 1, all_ranks=False)
    live.add_rows(np.array([1]), [0], [8], [9], [2], [1], [True])
    live.advance(10)
    live.add_rows(np.array([0]), [0], [5], [20], [2], [1], [True])
    live.advance(None)
    rows = [(0, 5, 20, 2, 1, True, 0), (0, 8, 9, 2, 1, True, 0)]
    cols, pos = _cols(rows)
    assert not live.verify(pos, cols)
    assert live.verify(pos, cols) is False


def test_a_pass_done_lets_its_stacks_go_and_walks_no_more():
    """`done` (every event walked, the writer closing the run) lets the stacks go before the
    close computes beside what is kept (issue 41: a sampled pass's tree, ~128 MB); its results
    stay, and a walk after it is refused rather than answered from empty stacks."""
    keys = [np.array([1, 2], dtype=np.int64), np.array([1, 3], dtype=np.int64)]
    for several in (False, True):
        index = lc.TraceIndex.of_keys(np.arange(2), keys)
        live = lc.LivePass(index, 1, all_ranks=several)
        live.add_rows(np.array([0, 1]), [0, 1 if several else 0], [1, 5], [3, 9], [2, 2], [1, 1], [True, True])
        live.advance(4)
        with pytest.raises(ValueError, match="left to walk"):
            live.done()
        live.advance(None)
        before = [None if x is None else x.tolist() for x in live.results()]
        live.done()
        assert live.stacks == {} and live.every is None
        assert [None if x is None else x.tolist() for x in live.results()] == before
        assert (before[2] is not None) == several
        live.add_rows(np.array([], dtype=np.int64), [], [], [], [], [], [])  # nothing: nothing to walk
        live._pending.append(np.array([[20, 0, 0, 0]], dtype=np.int64))
        with pytest.raises(ValueError, match="done"):
            live.advance(None)


def test_the_watermark_bounds_what_is_not_recorded_yet():
    keys = [np.array([1], dtype=np.int64)] * 4
    index = lc.TraceIndex.of_keys(np.arange(4), keys, arrival_ns=[0, 10, 20, 30], pred=[-1, 0, -1, -1])
    open_loop = lc.LivePass(index, 1, all_ranks=False)
    assert open_loop.watermark() == 0
    open_loop.add_rows(np.array([0]), [0], [3], [7], [1], [0], [True])
    assert open_loop.watermark() == 10
    closed = lc.LivePass(index, 1, all_ranks=False, closed=True)
    closed.add_rows(np.array([0, 2]), [0, 0], [3, 21], [7, 25], [1, 1], [0, 0], [True, True])
    assert closed.watermark() == 7  # the turn after seq 0 arrives at its finish at the earliest
    closed.add_rows(np.array([3]), [0], [31], [40], [1], [0], [False])  # rejected: recorded, no event
    assert closed.watermark() == 7
    # From WARM finished rows on, a request still queued is taken to be scheduled no earlier
    # than the latest finish less SLACK x the longest service seen (a guess `verify` checks).
    n = lc.WARM + 1
    many = lc.TraceIndex.of_keys(np.arange(n), [np.array([1], dtype=np.int64)] * n, arrival_ns=[0] * n)
    warm = lc.LivePass(many, 1, all_ranks=False)
    k = lc.WARM
    warm.add_rows(np.arange(k), [0] * k, list(range(100, 100 + k)), list(range(110, 110 + k)), [1] * k, [0] * k,
                  [True] * k)
    assert warm.watermark() == 110 + k - 1 - lc.SLACK * 10
    done = lc.LivePass(index, 1, all_ranks=False)
    done.add_rows(np.arange(4), [0] * 4, [1, 11, 21, 31], [2, 12, 22, 32], [1] * 4, [0] * 4, [True] * 4)
    assert done.watermark() == np.iinfo(np.int64).max


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_the_watermark_kept_as_rows_come_is_the_scan_of_every_request(data):
    """`watermark` (issue 41: kept as the rows come, `_Bounds`) against `_watermark_scan`, the
    least bound over a scan of every request not recorded yet, after every batch of rows: open
    and closed loop, sessions whose turns chain (a later turn bounded by its predecessor's
    finish, never while that one is unfinished or not recorded), rows in any order, unfinished
    ones, the first call made after any number of batches, and hand-overs of no rows."""
    n = data.draw(st.integers(0, 40))
    sessions = data.draw(st.lists(st.one_of(st.none(), st.integers(0, 4)), min_size=n, max_size=n))
    pred, last = [], {}
    for i, s in enumerate(sessions):
        pred.append(-1 if s is None else last.get(s, -1))
        if s is not None:
            last[s] = i
    arrival = data.draw(st.lists(st.integers(0, 100), min_size=n, max_size=n))
    closed = data.draw(st.booleans())
    index = lc.TraceIndex.of_keys(np.arange(n), [np.array([1], dtype=np.int64)] * n, arrival_ns=arrival, pred=pred)
    live = lc.LivePass(index, 1, all_ranks=False, closed=closed)
    order = data.draw(st.permutations(list(range(n))))
    cuts = sorted(set(data.draw(st.lists(st.integers(0, n), max_size=6)))) + [n]
    first = data.draw(st.integers(0, len(cuts)))
    at = 0
    for k, cut in enumerate(cuts):
        if k >= first:
            assert live.watermark() == live._watermark_scan()
        pos = np.array(order[at:cut], dtype=np.int64)
        m = len(pos)
        sched = data.draw(st.lists(st.integers(0, 200), min_size=m, max_size=m))
        fin = [x + d for x, d in zip(sched, data.draw(st.lists(st.integers(0, 50), min_size=m, max_size=m)))]
        done = data.draw(st.lists(st.booleans(), min_size=m, max_size=m))
        live.add_rows(pos, [0] * m, sched, fin, [1] * m, [0] * m, done)
        at = cut
        if k >= first:
            assert live.watermark() == live._watermark_scan()
    assert live.watermark() == live._watermark_scan() == np.iinfo(np.int64).max


def test_the_rows_the_writer_takes_read_as_the_committed_rows_are():
    """rows_of reads RunWriter.take's Arrow columns with curve_columns' rules: NULL queue is 0,
    the finish falls back to the first token then the schedule, rejected or TTFT-less rows are
    recorded unwalked, a column absent is NULL, a seq not in the trace is left out."""
    index = lc.TraceIndex.of_keys(np.array([0, 1, 2, 5]), [np.zeros(0, dtype=np.int64)] * 4)
    cols = {"seq": pa.array([0, 1, 2, 5, 9], pa.int64()),
            "arrival_ns": pa.array([10, 20, 30, 40, 50], pa.int64()),
            "queue_ns": pa.array([1, None, 3, 4, 5], pa.int64()),
            "finish_ns": pa.array([100, None, None, 400, 500], pa.int64()),
            "first_token_ns": pa.array([90, 95, None, 300, 450], pa.int64()),
            "ttft_ns": pa.array([5, 5, 5, None, 5], pa.int64()),
            "status": pa.array(["finished", None, "finished", "finished", "rejected"]),
            "input_tokens": pa.array([7, 8, None, 9, 1], pa.int64())}
    pos, rank, sched, fin, inp, out, finished = lc.rows_of(index, cols)
    assert pos.tolist() == [0, 1, 2, 3]
    assert rank.tolist() == [0, 0, 0, 0] and out.tolist() == [0, 0, 0, 0]
    assert sched.tolist() == [11, 20, 33, 44]
    assert fin.tolist() == [100, 95, 33, 400]
    assert inp.tolist() == [7, 8, 0, 9]
    assert finished.tolist() == [True, True, True, False]
    with pytest.raises(ValueError, match="not a line of the trace"):
        lc.rows_of(index, {**cols, "status": pa.array(["finished"] * 5)})


# --------------------------------------------------------------------------- a replay


def _evidence(db):
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        run_id, raw = con.execute("SELECT run_id, evidence_json FROM run_evidence").fetchone()
    finally:
        con.close()
    return json.loads(raw.replace(run_id, "RUN"))  # the run's id aside


@pytest.mark.parametrize("extra", [[], ["--dp", "2", "--router", "cache_aware"]])
def test_a_replay_whose_writer_fed_the_pass_stores_the_evidence_its_close_walks_itself(tmp_path, extra):
    """The same trace (sessions: closed loop) replayed with a writer process (the pass fed while
    recording) and inline (the close walks it all): the stored evidence is the same, every section."""
    from tests.support.cli import cli_env, completed_in_process as run  # the CLI in this process: ~0.45 s a start

    trace = tmp_path / "t.jsonl"
    assert run("synth", trace, "--requests", "300", "--kind", "agent", "--seed", "5").returncode == 0
    got = {}
    for mode in ("process", "inline"):
        db = tmp_path / f"{mode}.duckdb"
        done = run("replay", trace, "--db", db, *extra, env=cli_env(TIERDIAG_WRITER=mode))
        assert done.returncode == 0, done.stderr
        got[mode] = _evidence(db)
    assert got["process"]["size_curves"] is not None
    assert got["process"] == got["inline"]


# --------------------------------------------------------------------------- the curves from counted depths


def _curve_reference(need, page, weight):
    """The step function as first written: every lookup's size sorted, np.unique's first places."""
    never = np.iinfo(np.int64).max
    sizes = np.sort(need[need != never])
    total = int(round(len(sizes) * weight)) * page
    steps = []
    if len(sizes):
        uniq, idx = np.unique(sizes, return_index=True)
        cum = np.rint(np.r_[idx[1:], len(sizes)] * weight).astype(np.int64) * page
        if len(uniq) > sc.CURVE_POINTS:
            b = cum * sc.CURVE_POINTS // total
            keep = np.r_[True, b[1:] > b[:-1]]
            keep[-1] = True
            uniq, cum = uniq[keep], cum[keep]
        steps = list(zip(uniq.tolist(), cum.tolist()))
    grows = sizes[sizes > 0]
    knee = int(grows[max(int(np.ceil(sc.KNEE_SHARE * len(grows))) - 1, 0)]) if len(grows) else None
    return tuple(steps), total, knee


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.integers(0, 40), st.just(np.iinfo(np.int64).max)), max_size=60),
       st.sampled_from([1, 16]), st.sampled_from([1.0, 2.5]), st.booleans())
def test_the_curve_of_counted_sizes_is_the_curve_of_every_lookup_sorted(values, page, weight, many):
    """`_curve_of` (distinct sizes and their counts: `_tally`, `_merged`) against the first
    written step function; `many` spreads the sizes past CURVE_POINTS steps (thinned)."""
    need = np.array(values, dtype=np.int64)
    if many:
        need = np.where(need == np.iinfo(np.int64).max, need, need * 1000 + np.arange(len(need)) * 3)
        need = np.concatenate([need, np.arange(sc.CURVE_POINTS + 5, dtype=np.int64) * 7])
    need = np.where(need == np.iinfo(np.int64).max, need, need * page)
    c = sc._curve("host", 0, "", need, page, 0, weight)
    assert (c.steps, c.unbounded_reused_tokens, c.knee_tokens) == _curve_reference(need, page, weight)
    found = need[need != np.iinfo(np.int64).max]
    sizes, counts = sc._tally(found)
    assert np.repeat(sizes, counts).tolist() == sorted(found.tolist())
    merged = sc._merged(np.minimum(sizes, 5 * page), counts)
    assert np.repeat(*merged).tolist() == sorted(np.minimum(found, 5 * page).tolist())


def test_the_rows_are_matched_to_the_index_with_the_loops_checks():
    """size_curves._matched (the close, where the pass was fed): the first line (in trace order)
    whose row has another req_id or input length is named, as the per-line loop names it; rows
    whose seq is no line are counted out."""
    keys = [np.array([1, 2], dtype=np.int64), np.array([3], dtype=np.int64), np.zeros(0, dtype=np.int64)]
    index = lc.TraceIndex.of_keys(np.array([0, 2, 4]), keys)
    index.lines_are([1, 3, 5], ["a", "b", "c"], [10, 20, 30])

    def cols(seq, ids, inp):
        z = np.zeros(len(seq), dtype=np.int64)
        return CurveColumns(np.array(seq, dtype=np.int64), req_hashes(ids), z, z, z,
                            np.array(inp, dtype=np.int64), z)

    matched, lengths = sc._matched(index, cols([0, 4], ["a", "c"], [10, 30]), "R")
    assert (matched, lengths.tolist()) == (2, [2, 0])
    matched, lengths = sc._matched(index, cols([0, 1, 2], ["a", "x", "b"], [10, 1, 20]), "R")
    assert (matched, lengths.tolist()) == (2, [2, 0, 1])
    with pytest.raises(sc.CurvesUnavailable, match="trace line 3 is not the request run R replayed as seq 2"):
        sc._matched(index, cols([0, 2, 4], ["a", "b", None], [10, 21, 30]), "R")
    with pytest.raises(sc.CurvesUnavailable, match="trace line 1 is not"):
        sc._matched(index, cols([0, 2], [None, "x"], [10, 20]), "R")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=-2**63, max_value=2**63 - 1) | st.integers(-2**31 - 2, 2**31 + 1),
                max_size=40), st.sampled_from([np.int64, np.int32, np.uint8, bool]))
def test_narrow_keeps_every_value_and_is_int32_only_where_all_fit(values, dtype):
    """live_curves.narrow (the index's per-request counts, issue 41): the same numbers, int32
    exactly where every one is within int32 (the bounds themselves included), else int64."""
    if dtype is not np.int64:
        info = np.iinfo(dtype) if dtype is not bool else None
        values = [v for v in values if (info is None and v in (0, 1)) or (info and info.min <= v <= info.max)]
    got = lc.narrow(np.array(values, dtype=dtype))
    fits = all(-2**31 <= v < 2**31 for v in values)
    assert got.dtype == (np.int32 if fits else np.int64)
    assert got.tolist() == [int(v) for v in values]


def test_the_lines_read_ahead_carry_hashes_and_the_close_matches_them():
    """size_curves._Pages keeps each line's req_id as its hash (issue 41: no million strings
    through the run): its index matches the rows by those hashes as by the strings, and its
    unsampled `lines` hand the close's loop the hash it compares (`hashed`)."""
    pages = sc._Pages(2)
    for seq, (rid, inp, keys) in enumerate([("a", 5, [1, 2]), ("b", 7, [1, 2, 3]), ("c", 2, [9])]):
        pages.add(seq + 1, seq, rid, inp, np.array(keys, dtype=np.int64), 100 * seq, None, 3)
    pages.finish()
    assert [(ln, s, h, i, k.tolist()) for ln, s, h, i, k in pages.lines()] == [
        (1, 0, hash("a"), 5, [1, 2]), (2, 1, hash("b"), 7, [1, 2, 3]), (3, 2, hash("c"), 2, [9])]
    index = pages.index()
    assert index.req_hash.tolist() == [hash("a"), hash("b"), hash("c")]
    assert index.lens.dtype == np.int32 and index.line.tolist() == [1, 2, 3]
    z = np.zeros(2, dtype=np.int64)
    cols = CurveColumns(np.array([0, 2]), req_hashes(["a", "c"]), z, z, z, np.array([5, 2]), z)
    assert sc._matched(index, cols, "R")[0] == 2
    bad = cols._replace(req_id=req_hashes(["a", "x"]))
    with pytest.raises(sc.CurvesUnavailable, match="trace line 3 is not"):
        sc._matched(index, bad, "R")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=-2**63, max_value=2**63 - 1) | st.integers(0, 10_000), max_size=50))
def test_exact_sum_is_pythons_sum_even_past_int64(values):
    """size_curves._exact_sum (the close's touch count, which decides the sampling rate): Python's
    exact sum of the int64 values, numpy's only where no partial sum can leave int64."""
    assert sc._exact_sum(np.array(values, dtype=np.int64)) == sum(values)


def test_release_freed_heap_answers_whether_glibc_trimmed_and_changes_no_array():
    """live_curves.release_freed_heap (issue 41: the writer's freed heap handed back): True where
    the C library has malloc_trim (glibc), False elsewhere; arrays alive before are untouched."""
    import ctypes
    import sys

    a = np.arange(1 << 20, dtype=np.int64)
    b = np.ones(1 << 18)
    del b
    try:
        has = hasattr(ctypes.CDLL(None), "malloc_trim")
    except OSError:
        has = False
    assert lc.release_freed_heap() is has
    assert lc.release_freed_heap() is has
    assert int(a.sum()) == (1 << 20) * ((1 << 20) - 1) // 2
    if sys.platform.startswith("linux") and has:
        assert lc._TRIM[0] is not None


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(-3, 3000), max_size=40), max_size=6))
def test_the_tally_counts_each_walks_depths_by_either_way(walks):
    """LivePass._tally: a walk's positive depths counted in place by numpy's `add.at` (numpy 1.25
    on), or, before, by a count array (many beside the tally) or by a sort (few): the same counts
    as a plain count of every depth, the same int32 tally grown the same way, whichever it took."""
    index = lc.TraceIndex.of_keys(np.arange(1), [np.arange(1, dtype=np.int64)])
    every = [d for w in walks for d in w if d > 0]
    want = np.bincount(np.array(every, dtype=np.int64)) if every else np.zeros(0, dtype=np.int64)
    tallies = []
    for fast in (True, False):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(lc, "_FAST_ADD_AT", fast)
            live = lc.LivePass(index, 1, all_ranks=False)
            for w in walks:
                live._tally(np.array(w, dtype=np.int64))
        got = live.tally
        assert got is not None and got.dtype == np.int32
        assert got[:len(want)].tolist() == want.tolist() and not got[len(want):].any()
        tallies.append(got)
    assert len(tallies[0]) == len(tallies[1])


_HOSTILE_SCALES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1.0, 0.5, 2.0, 1e-9, 3.7, 1e300, 5e-324, -0.0]),
    st.integers(-4, 2**20))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.integers(0, 2**62), st.sampled_from([0, 1, 2**53 - 1, 2**53, 2**53 + 1, 2**62 - 1,
                                                                  2**62, 1_700_000_000_000_000_123])),
                max_size=30), _HOSTILE_SCALES)
def test_the_scaled_arrivals_are_the_engines_expression(arrivals, scale):
    """`scaled_arrivals` (numpy's float64 product where every product is finite and under 2**62)
    gives `int(arrival_ns * time_scale)` a request at a time, as engine/arrivals.py times it: past
    2**53, at the bounds, for a scale of any float or an int; where the expression fails, it fails."""
    from array import array

    try:
        want = [int(a * scale) for a in arrivals]
    except (OverflowError, ValueError) as exc:
        with pytest.raises(type(exc)):
            lc.scaled_arrivals(arrivals, scale)
        return
    if any(not -2**63 <= w < 2**63 for w in want):
        with pytest.raises(OverflowError):
            lc.scaled_arrivals(arrivals, scale)
        return
    for given_as in (arrivals, array("q", arrivals), np.array(arrivals, dtype=np.int64)):
        got = lc.scaled_arrivals(given_as, scale)
        assert got.dtype == np.int64 and got.tolist() == want
