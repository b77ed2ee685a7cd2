"""A run's stored evidence as rows, to compare a reader's write with a close's byte for byte
(tests/diagnose/test_evidence_backfill.py, tests/reliability/test_evidence_backfill_processes.py)."""

from __future__ import annotations

from pathlib import Path

import duckdb


def evidence_rows(db: Path, run_id: str) -> tuple[list, list]:
    """(run_evidence's (version, JSON text) rows, request_lookup's (bucket, req_id, seq) rows,
    sorted) of run `run_id` in the store `db`, read-only."""
    with duckdb.connect(str(db), read_only=True) as con:
        ev = con.execute("SELECT evidence_version, evidence_json FROM run_evidence WHERE run_id = ?", [run_id]).fetchall()
        lk = con.execute("SELECT bucket, req_id, seq FROM request_lookup WHERE run_id = ? ORDER BY ALL",
                         [run_id]).fetchall()
    return ev, lk
