"""The write side of the evidence stored with a run at its close (diagnose/run/evidence.py computes
it, diagnose/run/stored.py is its format, diagnose/read/queries.py `stored_evidence` reads it back):
one row per run in `run_evidence`, replaced in one transaction."""

from __future__ import annotations

import sys
from datetime import datetime, timezone

import duckdb

from tierdiag.store.schema import OPTIONAL_TABLES, create_table_sql

TABLE = "run_evidence"


def replace_run_evidence(con: duckdb.DuckDBPyConnection, run_id: str, version: int, payload: str) -> None:
    """Replace the run's row, and its rows of `request_lookup` (store/lookup.py), in one transaction
    (creating the tables in a store made before them)."""
    from tierdiag.store.lookup import write_request_lookup

    con.execute("BEGIN")
    try:
        con.execute(create_table_sql(TABLE, OPTIONAL_TABLES[TABLE]))
        con.execute(f"DELETE FROM {TABLE} WHERE run_id = ?", [run_id])
        con.execute(f"INSERT INTO {TABLE} VALUES (?, ?, ?, ?)",
                    [run_id, version, datetime.now(timezone.utc).replace(tzinfo=None), payload])
        write_request_lookup(con, run_id)  # explain's index of the run's request ids (issue 41)
        con.execute("COMMIT")
    except BaseException:
        try:
            con.execute("ROLLBACK")
        except duckdb.Error as exc:  # the connection is unusable; the first error is the one to report
            sys.stderr.write(f"tierdiag: warning: rolling back the evidence of run {run_id} failed too: "
                             f"{str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}\n")
        raise
