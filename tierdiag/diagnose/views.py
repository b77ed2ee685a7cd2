"""What each command asks of a run, answered for the run's kind: the one place the commands'
questions are routed by `kinds` (a replay is answered from the engine's parts, an imported run
from what its server reported, diagnose/observed.py). Each answer is a typed result, drawn by
report/views.py according to its type; the modules behind an answer are imported only when it
is asked for (start-up)."""

from __future__ import annotations

from tierdiag.diagnose.kinds import has_engine_parts


def summarize(con, run):
    """`summary`: RunSummary for a replay, ObservedSummary for an imported run."""
    if has_engine_parts(run):
        from tierdiag.diagnose.summary import run_summary

        return run_summary(con, run)
    from tierdiag.diagnose.observed import observed_summary

    return observed_summary(con, run)


def explain(con, run, req_id: str):
    """`explain`: Explanation for a replayed request, ObservedExplanation for an imported one."""
    if has_engine_parts(run):
        from tierdiag.diagnose.explain import explain_request

        return explain_request(con, run, req_id)
    from tierdiag.diagnose.observed import explain_observed

    return explain_observed(con, run, req_id)


def slow(con, run, *, top: int, hit_class: str | None = None, cause: str | None = None):
    """`slow`: (row type, rows): requests ranked by excess TTFT over their ideal in a replay, by
    TTFT in an imported run (no ideal there). The row type is returned for an empty list's view."""
    if has_engine_parts(run):
        from tierdiag.diagnose.slow import SlowRequest, slow_requests

        return SlowRequest, slow_requests(con, run, top=top, hit_class=hit_class, cause=cause)
    from tierdiag.diagnose.observed import ObservedSlow, slow_observed

    return ObservedSlow, slow_observed(con, run, top=top, hit_class=hit_class, cause=cause)
