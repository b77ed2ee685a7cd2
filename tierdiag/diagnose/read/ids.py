"""Ids a command hands on: the request a `next:` hint names, the sweep a kept store holds."""

from __future__ import annotations

import duckdb


def first_slow_request(con: duckdb.DuckDBPyConnection, run_id: str) -> str | None:
    """The id of the run's request `slow` lists first: the largest TTFT over its ideal (no ideal,
    as in an observed run: the largest TTFT; ties by id); None without a finished request."""
    row = next(iter(con.execute(
        "SELECT req_id FROM requests WHERE run_id = ? AND status = 'finished' AND ttft_ns IS NOT NULL "
        "ORDER BY ttft_ns - coalesce(ideal_ttft_ns, 0) DESC, req_id LIMIT 1", [run_id]).fetchall()), None)
    return None if row is None else str(row[0])


def sweep_ids(con: duckdb.DuckDBPyConnection) -> list[str | None]:
    """The distinct sweep ids of the store's runs (None: runs of no sweep)."""
    return [r[0] for r in con.execute("SELECT DISTINCT sweep_id FROM runs").fetchall()]


def runs_of_no_sweep(con: duckdb.DuckDBPyConnection) -> int:
    """How many of the store's runs no sweep made (a replay's, an import's): `sweep --resume`
    refuses a store that holds any (app/sweep_kept.py)."""
    return con.execute("SELECT count(*) FROM runs WHERE sweep_id IS NULL").fetchall()[0][0]
