"""queue_attribution merges the others' decode and hold intervals once per request and cuts the
merged list to each gap of the wait (diagnose/request/context.py `_clip`); before, it merged the
whole list again for every gap, quadratic on a long wait (1.3 s per explain on the synthetic
Mooncake trace). The cut must be exactly the per-gap merge it replaced, for any intervals,
overlapping, touching, empty or reversed, and any gap inside the span."""

from __future__ import annotations

from hypothesis import example, given, settings, strategies as st

from tierdiag.diagnose.request.context import _clip, _subtract, _union_measure

COORD = st.integers(min_value=-50, max_value=250)


@settings(max_examples=60, deadline=None)
@given(intervals=st.lists(st.tuples(COORD, COORD), max_size=40),
       span=st.tuples(st.integers(min_value=-20, max_value=100), st.integers(min_value=0, max_value=200)),
       cuts=st.lists(st.tuples(st.integers(min_value=0, max_value=200), st.integers(min_value=0, max_value=200)),
                     max_size=12))
@example(intervals=[(0, 2)], span=(0, 1), cuts=[(1, 0)])  # an empty gap inside an interval: nothing
def test_cutting_the_merged_intervals_is_merging_them_per_gap(intervals, span, cuts):
    lo, hi = span[0], span[0] + span[1] + 1
    merged = _union_measure(lo, hi, intervals)
    ends = [b for _, b in merged]
    for x, y in cuts:  # gaps inside [lo, hi), as queue_attribution's are, empty ones too
        a, b = sorted((lo + x % (hi - lo), lo + y % (hi - lo) + 1))
        got = _clip(a, b, merged, ends)
        assert got == _union_measure(a, b, intervals)
        # and what is left of the gap, which the held intervals are cut to next
        for ra, rb in _subtract((a, b), got):
            assert ra < rb and _clip(ra, rb, merged, ends) == _union_measure(ra, rb, intervals) == []
