"""Readers of a big run: nothing but data on stdout, also when a query runs long."""

from __future__ import annotations

from pathlib import Path

from tests.report.fake_run import write_fake_run
from tierdiag.store.reader import open_store


def test_store_connections_draw_no_progress_bar(tmp_path: Path):
    # DuckDB draws a progress bar on stdout for any query past 2 s: on a million-request run that
    # landed inside `replay --json` (its closing summary) and `report`'s output.
    db = tmp_path / "run.duckdb"
    write_fake_run(db, 20, 1)
    with open_store(db) as con:
        assert con.execute("SELECT current_setting('enable_progress_bar')").fetchone() == (False,)
