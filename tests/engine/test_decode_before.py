"""records.DecodeRuns (a request's record: of its queue, the time the GPU ran decode steps):
the decode steps noted as DecodeSteps._note_decode notes them (`note`, runs of back-to-back
steps on the clock) give at any time the sum of the steps' time before it (`before`), on the
compiled core and its Python twin alike."""

from __future__ import annotations

import importlib.util

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierdiag.engine import compiled, records


def _twin():
    spec = importlib.util.spec_from_file_location("_records_twin", compiled.source_path("records"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_TWIN_RUNS = _twin().DecodeRuns


def _steps(gaps, base):
    steps, now = [], base
    for gap, length in gaps:
        steps.append((now + gap, now + gap + length))
        now += gap + length
    return steps


@settings(max_examples=200, deadline=None)
@given(gaps=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 4)), max_size=40),
       times=st.lists(st.integers(-5, 200), min_size=1, max_size=8),
       base=st.sampled_from([0, 2**40, 2**62, -(2**62)]))
def test_decode_runs_before_is_the_decode_time_before_t(gaps, times, base):
    steps = _steps(gaps, base)
    for cls in (records.DecodeRuns, _TWIN_RUNS):
        runs = cls()
        for start, end in steps:
            runs.note(start, end)
        # back-to-back steps joined: a run per step that did not start where the last one ended
        assert len(runs.starts) == len(runs.ends) == len(runs.cum) == sum(
            1 for k, (s, _) in enumerate(steps) if k == 0 or steps[k - 1][1] != s)
        for t in (base + x for x in times):
            assert runs.before(t) == sum(max(0, min(t, e) - s) for s, e in steps)


def test_decode_runs_before_any_step_and_after_the_last():
    for cls in (records.DecodeRuns, _TWIN_RUNS):
        runs = cls()
        assert runs.before(0) == 0 and runs.before(2**63 - 1) == 0 and runs.before(-(2**63)) == 0
        runs.note(10, 20)
        runs.note(20, 25)  # joins the run
        runs.note(30, 31)
        assert (list(runs.starts), list(runs.ends), list(runs.cum)) == ([10, 30], [25, 31], [0, 15])
        assert [runs.before(t) for t in (9, 10, 12, 25, 29, 30, 31, 2**63 - 1)] == [0, 0, 2, 15, 15, 15, 16, 16]


@pytest.mark.parametrize("bad", [2**63, -(2**63) - 1, 1.5, "1", None])
def test_decode_runs_refuse_what_is_no_int64(bad):
    """The clock's ns are int64 (the rows' columns are BIGINT): a step with anything else is
    refused (compiled where it is passed, the twin at its vec's append or item set), the runs
    as they were, on the compiled class and the twin alike."""
    for cls in (records.DecodeRuns, _TWIN_RUNS):
        runs = cls()
        runs.note(1, 2)
        with pytest.raises((OverflowError, TypeError, ValueError)):
            runs.note(bad, 3)
        with pytest.raises((OverflowError, TypeError, ValueError)):
            runs.note(2, bad)
        assert (list(runs.starts), list(runs.ends), list(runs.cum)) == ([1], [2], [0])
