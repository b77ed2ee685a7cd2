"""One view per run kind, chosen once from the run's kind (`view_of`) instead of a branch at
each question: what the kind's rows hold. diagnose/views.py holds each kind's answers to the
commands (summary, explain, slow), chosen by the same view.

    replay     recorded by the reference engine: every TTFT part, the ideal TTFT, batches,
               transfers, evictions; run evidence stored at its close; the SGLang rules it followed
    observed   imported from a server's export (importers/): what the server reported, NULL for
               the rest; no engine parts, no stored evidence, no engine rules (diagnose/twin/observed*.py)

A kind this tierdiag does not know (a newer store) is read as a server's: its rows are not
trusted to carry the engine's parts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tierdiag.store.reader import RunKind


@dataclass(frozen=True)
class RunView:
    kind: RunKind
    engine_parts: bool  # rows carry the engine's TTFT parts (ideal, batches, evictions) and rules


REPLAY = RunView(RunKind.REPLAY, engine_parts=True)
OBSERVED = RunView(RunKind.OBSERVED, engine_parts=False)
VIEWS: dict[RunKind, RunView] = {v.kind: v for v in (REPLAY, OBSERVED)}


def view_of(run: Any) -> RunView:
    """The view of `run`'s kind (a run without one: a replay, as stored before kinds; an unknown
    kind: a server's)."""
    view = getattr(run, "view", None)
    if isinstance(view, RunView):
        return view
    return VIEWS.get(getattr(run, "kind", None) or RunKind.REPLAY, OBSERVED)
