"""What each kind of run holds, the one place diagnose asks `run.kind`.

    replay     recorded by the reference engine: every TTFT part, the ideal TTFT, batches,
               transfers, evictions; run evidence stored at its close
    observed   imported from a server's export (importers/): what the server reported, NULL for
               the rest; no engine parts, no stored evidence (diagnose/observed*.py read it)
"""

from __future__ import annotations

from tierdiag.config.names import RunKind

# kind -> whether its rows carry the engine's TTFT parts (ideal, batches, evictions).
ENGINE_PARTS: dict[str, bool] = {RunKind.REPLAY: True, RunKind.OBSERVED: False}


def has_engine_parts(run) -> bool:
    """Whether `run` was recorded by the engine (an unknown kind: no, read it as a server's)."""
    return ENGINE_PARTS.get(getattr(run, "kind", "replay") or "replay", False)


def is_observed(run) -> bool:
    return not has_engine_parts(run)
