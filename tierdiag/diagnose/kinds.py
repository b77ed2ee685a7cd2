"""Whether a run's rows carry the engine's parts, for callers outside diagnose (cli/slow.py):
read/kind.py's views answer it, chosen once from the run's kind."""

from __future__ import annotations

from tierdiag.diagnose.read.kind import view_of


def has_engine_parts(run) -> bool:
    """Whether `run` was recorded by the engine (an unknown kind: no, read it as a server's)."""
    return view_of(run).engine_parts


def is_observed(run) -> bool:
    return not has_engine_parts(run)
