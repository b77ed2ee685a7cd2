"""The session's one small replayed run for the CLI tests (see cli_helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.cli_helpers import REPLAY_ARGS, cli_here, write_late_trace


@pytest.fixture(scope="session")
def late_run(tmp_path_factory) -> Path:
    """The database of one complete replay of the late-starting trace (run name `late`)."""
    d = tmp_path_factory.mktemp("late")
    trace = write_late_trace(d / "late.jsonl")
    db = d / "run.duckdb"
    res = cli_here("replay", trace, "--db", db, "--run-name", "late", *REPLAY_ARGS, "--json")
    assert res.returncode == 0, res.stderr
    return db
