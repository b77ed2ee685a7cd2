"""A run's stored evidence as rows, to compare a reader's write with a close's byte for byte
(tests/diagnose/test_evidence_backfill.py, tests/reliability/test_evidence_backfill_processes.py)."""

from __future__ import annotations

from pathlib import Path


def evidence_rows(db: Path, run_id: str) -> tuple[list, list]:
    """(run_evidence's (version, JSON text) rows, request_lookup's (bucket, req_id, seq) rows,
    sorted) of run `run_id` in the store `db`, read-only (waiting, as a reader does, while a
    replay's writer holds the file)."""
    from tierdiag.store.reader import connect_with_retry

    with connect_with_retry(db, read_only=True, wait_s=60) as con:
        ev = con.execute("SELECT evidence_version, evidence_json FROM run_evidence WHERE run_id = ?", [run_id]).fetchall()
        lk = con.execute("SELECT bucket, req_id, seq FROM request_lookup WHERE run_id = ? ORDER BY ALL",
                         [run_id]).fetchall()
    return ev, lk
