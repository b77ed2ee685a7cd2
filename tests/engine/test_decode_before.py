"""records.decode_before (a request's record: of its queue, the time the GPU ran decode steps):
the decode steps kept as runs on the clock, as DecodeSteps._note_decode keeps them, give at any
time the sum of the steps' time before it, on the compiled core and its Python twin alike."""

from __future__ import annotations

import importlib.util

from hypothesis import given, settings
from hypothesis import strategies as st

from tierdiag.engine import compiled, records


def _twin():
    spec = importlib.util.spec_from_file_location("_records_twin", compiled.source_path("records"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_TWIN_DECODE_BEFORE = _twin().decode_before


def _runs(steps):
    """_note_decode's bookkeeping: contiguous steps join the last run."""
    starts, ends, cum = [], [], []
    for start, end in steps:
        if starts and ends[-1] == start:
            ends[-1] = end
        else:
            cum.append(cum[-1] + ends[-1] - starts[-1] if starts else 0)
            starts.append(start)
            ends.append(end)
    return starts, ends, cum


@settings(max_examples=200, deadline=None)
@given(gaps=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 4)), max_size=12),
       times=st.lists(st.integers(-5, 80), min_size=1, max_size=8), base=st.sampled_from([0, 2**40, 2**62]))
def test_decode_before_is_the_decode_time_before_t(gaps, times, base):
    steps, now = [], base
    for gap, length in gaps:
        steps.append((now + gap, now + gap + length))
        now += gap + length
    starts, ends, cum = _runs(steps)
    for t in (base + x for x in times):
        want = sum(max(0, min(t, e) - s) for s, e in steps)
        assert records.decode_before(starts, ends, cum, t) == want
        assert _TWIN_DECODE_BEFORE(starts, ends, cum, t) == want
