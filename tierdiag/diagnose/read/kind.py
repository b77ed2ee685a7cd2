"""One view per run kind: what a command asks of a run, answered by the kind's own object,
chosen once from the run's kind (`view_of`) instead of a branch at each question.

    replay     recorded by the reference engine: every TTFT part, the ideal TTFT, batches,
               transfers, evictions; run evidence stored at its close; the SGLang rules it followed
    observed   imported from a server's export (importers/): what the server reported, NULL for
               the rest; no engine parts, no stored evidence, no engine rules (diagnose/observed*.py)

A kind this tierdiag does not know (a newer store) is read as a server's: its rows are not
trusted to carry the engine's parts. The modules behind an answer are imported only when it is
asked for (start-up: `summary` never loads explain's modules).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tierdiag.store.reader import RunKind


@dataclass(frozen=True)
class ReplayView:
    """A replay: answered from the engine's parts."""

    kind: RunKind = RunKind.REPLAY
    engine_parts: bool = True  # rows carry the engine's TTFT parts (ideal, batches, evictions)

    def summarize(self, con, run):
        """`summary`: RunSummary."""
        from tierdiag.diagnose.summary import run_summary

        return run_summary(con, run)

    def explain(self, con, run, req_id: str):
        """`explain`: Explanation."""
        from tierdiag.diagnose.explain import explain_request

        return explain_request(con, run, req_id)

    def slow(self, con, run, *, top: int, hit_class: str | None = None, cause: str | None = None):
        """`slow`: (SlowRequest, rows ranked by excess TTFT over their ideal)."""
        from tierdiag.diagnose.slow import SlowRequest, slow_requests

        return SlowRequest, slow_requests(con, run, top=top, hit_class=hit_class, cause=cause)


@dataclass(frozen=True)
class ObservedView:
    """An imported run: answered from what its server reported (diagnose/observed.py)."""

    kind: RunKind = RunKind.OBSERVED
    engine_parts: bool = False

    def summarize(self, con, run):
        """`summary`: ObservedSummary."""
        from tierdiag.diagnose.observed import observed_summary

        return observed_summary(con, run)

    def explain(self, con, run, req_id: str):
        """`explain`: ObservedExplanation."""
        from tierdiag.diagnose.observed import explain_observed

        return explain_observed(con, run, req_id)

    def slow(self, con, run, *, top: int, hit_class: str | None = None, cause: str | None = None):
        """`slow`: (ObservedSlow, rows ranked by TTFT: no ideal there)."""
        from tierdiag.diagnose.observed import ObservedSlow, slow_observed

        return ObservedSlow, slow_observed(con, run, top=top, hit_class=hit_class, cause=cause)


RunView = ReplayView | ObservedView
VIEWS: dict[RunKind, RunView] = {RunKind.REPLAY: ReplayView(), RunKind.OBSERVED: ObservedView()}


def view_of(run: Any) -> RunView:
    """The view of `run`'s kind (a run without one: a replay, as stored before kinds; an unknown
    kind: a server's)."""
    view = getattr(run, "view", None)
    if isinstance(view, (ReplayView, ObservedView)):
        return view
    return VIEWS.get(getattr(run, "kind", None) or RunKind.REPLAY, VIEWS[RunKind.OBSERVED])
