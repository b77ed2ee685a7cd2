"""The write side of the evidence stored with a run at its close (diagnose/run/evidence.py computes
it, diagnose/run/stored.py is its format, diagnose/read/queries.py `stored_evidence` reads it back):
one row per run in `run_evidence`, replaced in one transaction."""

from __future__ import annotations

import sys
from datetime import datetime, timezone

import duckdb

from tierdiag.store.lookup import write_request_lookup  # at import: begin_run_evidence runs on a thread
from tierdiag.store.schema import OPTIONAL_TABLES, create_table_sql

TABLE = "run_evidence"


def begin_run_evidence(con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    """Open the transaction `replace_run_evidence(..., begun=True)` commits, and write the run's
    rows of `request_lookup` in it (store/lookup.py: a hash and a sort of every request id, the
    larger part of the evidence's write), and delete the run's `run_evidence` row there: the
    writer's close does this on a cursor of its own while the evidence's sections are computed,
    not after them (issue 41). Rolled back, and raised, where it fails."""
    con.execute("BEGIN")
    try:
        write_request_lookup(con, run_id)  # explain's index of the run's request ids (issue 41)
        _clear_row(con, run_id)  # here too, not in the close's serial tail: the row is all that is left
    except BaseException:
        rollback_run_evidence(con, run_id)
        raise


def replace_run_evidence(con: duckdb.DuckDBPyConnection, run_id: str, version: int, payload: str, *,
                         begun: bool = False) -> None:
    """Replace the run's row, and its rows of `request_lookup` (store/lookup.py), in one transaction
    (creating the tables in a store made before them). `begun`: the transaction is open on `con`
    with the lookup's rows written and the run's old row deleted (`begin_run_evidence`): the row
    joins them, and all commit."""

    if not begun:
        con.execute("BEGIN")
    try:
        if not begun:
            _clear_row(con, run_id)
        con.execute(f"INSERT INTO {TABLE} VALUES (?, ?, ?, ?)",
                    [run_id, version, datetime.now(timezone.utc).replace(tzinfo=None), payload])
        if not begun:
            write_request_lookup(con, run_id)  # explain's index of the run's request ids (issue 41)
        con.execute("COMMIT")
    except BaseException:
        rollback_run_evidence(con, run_id)
        raise


# The statuses whose rows are final: nothing writes the run's rows or status again. A reader
# stores a missing row only for these; a close stores it for the first two (diagnose/run/close.py).
# `failed` too (issue 41, session 39): its close stores none (the writer or its disk failed
# there), but its rows are as final as an interrupted run's and as consistent a prefix of what
# the engine emitted: whole writes only, committed in order, every row after a failed write given
# up (store/writer.py `_give_up`; a writer process's death: its committed writes, then the status
# from outside). What a reader computes from them is the same every time: storing it changes no
# answer, only its cost.
FINAL_STATUSES = ("complete", "interrupted", "failed")


def store_missing_evidence(con: duckdb.DuckDBPyConnection, run_id: str, version: int, payload: str) -> bool:
    """A reader's write of the evidence it computed for a run that had none stored (diagnose/run/
    backfill.py): in one transaction on `con` (read-write), the run's row replaced by `payload`
    and its rows of `request_lookup` written, as the close's `replace_run_evidence` does, where
    the run is still there with a status in FINAL_STATUSES and its row is not already this
    one (another reader stored it first). False where nothing was written. Rolled back, and
    raised, where it fails (an interrupt included): nothing of it is half-written."""
    con.execute("BEGIN")
    try:
        status = con.execute("SELECT status FROM runs WHERE run_id = ?", [run_id]).fetchall()
        have = []
        if con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() "
                       "AND schema_name = 'main' AND table_name = ?", [TABLE]).fetchall()[0][0]:
            have = con.execute(f"SELECT evidence_version, evidence_json FROM {TABLE} WHERE run_id = ?",
                               [run_id]).fetchall()
        if len(status) != 1 or status[0][0] not in FINAL_STATUSES or have == [(version, payload)]:
            con.execute("ROLLBACK")
            return False
        write_request_lookup(con, run_id)
        _clear_row(con, run_id)
    except BaseException:
        rollback_run_evidence(con, run_id)
        raise
    replace_run_evidence(con, run_id, version, payload, begun=True)
    return True


def _clear_row(con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    """The table made where the store lacks it, the run's row there deleted (in the caller's transaction)."""
    con.execute(create_table_sql(TABLE, OPTIONAL_TABLES[TABLE]))
    con.execute(f"DELETE FROM {TABLE} WHERE run_id = ?", [run_id])


def rollback_run_evidence(con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    """Roll back the evidence's transaction on `con` after a failure (the caller raises that
    failure: a rollback that fails too is one warning line, not the error reported)."""
    try:
        con.execute("ROLLBACK")
    except duckdb.Error as exc:  # the connection is unusable; the first error is the one to report
        sys.stderr.write(f"tierdiag: warning: rolling back the evidence of run {run_id} failed too: "
                         f"{str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}\n")
