"""What each command asks of a run, answered by the run's kind's view (read/kind.py: a replay
from the engine's parts, an imported run from what its server reported, diagnose/observed.py).
Each answer is a typed result, drawn by report/views.py according to its type."""

from __future__ import annotations

from tierdiag.diagnose.read.kind import view_of


def summarize(con, run):
    """`summary`: RunSummary for a replay, ObservedSummary for an imported run."""
    return view_of(run).summarize(con, run)


def explain(con, run, req_id: str):
    """`explain`: Explanation for a replayed request, ObservedExplanation for an imported one."""
    return view_of(run).explain(con, run, req_id)


def slow(con, run, *, top: int, hit_class: str | None = None, cause: str | None = None):
    """`slow`: (row type, rows): requests ranked by excess TTFT over their ideal in a replay, by
    TTFT in an imported run (no ideal there). The row type is returned for an empty list's view."""
    return view_of(run).slow(con, run, top=top, hit_class=hit_class, cause=cause)
