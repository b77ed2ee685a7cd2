"""The run story's memory wait in arrays (diagnose/run/story.py `_merge_arrays`, `_held_arrays`,
`_measure_arrays`) against the tuple version it replaced (`_merge`, `_minus`, `_measure`, kept as
the reference): the same measure at every instant, for hostile intervals (empty, reversed,
touching, nested, repeated, int64-sized). Issue 41: the tuples held ~1 GB of a 1M-request close."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from tierdiag.diagnose.run import story

BIG = 2 ** 52  # ns timestamps; near 2**63 a difference of two wraps, in the old code as in the new
coord = st.one_of(st.integers(-5, 40), st.integers(-BIG, BIG))
intervals = st.lists(st.tuples(coord, coord), max_size=25)


@settings(max_examples=60, deadline=None)
@given(intervals, intervals, st.lists(coord, max_size=20))
def test_the_held_time_in_arrays_is_the_tuples_measure(xs, ys, ts):
    want = story._measure(story._minus(story._merge(xs), story._merge(ys)))
    xa, xb = (np.array([p[i] for p in xs], dtype=np.int64) for i in (0, 1))
    ya, yb = (np.array([p[i] for p in ys], dtype=np.int64) for i in (0, 1))
    got = story._measure_arrays(*story._held_arrays(*story._merge_arrays(xa, xb), *story._merge_arrays(ya, yb)))
    probe = np.array(sorted(set(ts) | {a for p in xs + ys for a in p}), dtype=np.int64)
    assert got(probe).tolist() == want(probe).tolist()


@settings(max_examples=40, deadline=None)
@given(intervals)
def test_merging_in_arrays_is_merging_tuples(xs):
    a, b = story._merge_arrays([p[0] for p in xs], [p[1] for p in xs])
    assert list(zip(a.tolist(), b.tolist())) == [tuple(m) for m in story._merge(xs)]


def test_a_gap_in_the_batches_while_a_request_decodes_is_held():
    """Decoding over [0, 100), batches at [10, 20) and [20, 30) (touching: one merged), [50, 60):
    held is [0, 10) + [30, 50) + [60, 100) = 70 ns; before 40 it is 10 + 10."""
    at = story._measure_arrays(*story._held_arrays(*story._merge_arrays([0], [100]),
                                                   *story._merge_arrays([10, 20, 50], [20, 30, 60])))
    assert at(np.array([40, 100, 1000])).tolist() == [20.0, 70.0, 70.0]


# issue 41 (the 1M row): numpy 2.x's plain np.unique hashes (~80x slower than a sort on a million
# distinct int64); story.sorted_unique is a sort and a neighbour compare. Same values, same order.
@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(min_value=-2**63, max_value=2**63 - 1), max_size=60))
def test_sorted_unique_is_numpys_unique(values):
    import numpy as np

    from tierdiag.diagnose.run.story import sorted_unique

    a = np.asarray(values, dtype=np.int64)
    got, want = sorted_unique(a), np.unique(a)
    assert got.dtype == want.dtype and got.tolist() == want.tolist()


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**12), st.integers(0, 10**9), st.integers(0, 10**9)), min_size=1, max_size=30),
       st.lists(st.integers(-10**12, 3 * 10**12), max_size=40))
def test_the_run_attributions_window_sums_are_the_matrix_row_sums_to_the_last_digit(batches, ts):
    """runcontext.window_sums (a row at a time, issue 41) gives the very floats the (4, instants)
    matrix did, summed along its rows as numpy reduces that fancy-indexed (F-ordered) matrix:
    the stored evidence stays byte for byte what it was. Huge values make the order show."""
    from tierdiag.diagnose.run.runcontext import window_sums

    starts = sorted(a for a, _, _ in batches)
    s = np.array(starts, dtype=np.int64)
    e = s + np.array([b for _, b, _ in batches], dtype=np.int64)
    d = np.maximum(e - s, 1).astype(np.float64)
    c = np.array([x for _, _, x in batches], dtype=np.float64) * 1e6
    values = np.stack([c, c / 3, d, np.maximum(d - c, 0.0)])
    cum = np.concatenate([np.zeros((4, 1)), np.cumsum(values * ((e - s) / d), axis=1)], axis=1)
    t = np.array(ts, dtype=np.int64)
    k = np.searchsorted(s, t, side="right") - 1
    kk = np.maximum(k, 0)
    part = np.clip(np.minimum(t, e[kk]) - s[kk], 0, None) / d[kk]
    out = cum[:, kk] + values[:, kk] * part
    out[:, k < 0] = 0.0
    want = out.sum(axis=1)
    assert [x.hex() for x in window_sums(s, e, d, values, cum, t).tolist()] == [x.hex() for x in want.tolist()]
