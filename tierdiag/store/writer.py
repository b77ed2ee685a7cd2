"""The only code that writes a run store.

A replay holds the database only while it flushes (open, bulk-append, close), so readers can
open the file between flushes and a killed replay never leaves earlier runs unreadable.
Rows arrive as columns (dict of equal-length lists/arrays) and are appended through Arrow in
one statement per table: never a row-at-a-time INSERT.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, Sequence

import duckdb
import pyarrow as pa

from tierdiag import __version__
from tierdiag.errors import StoreError
from tierdiag.store.reader import check_store, connect_with_retry
from tierdiag.store.schema import SCHEMA_VERSION, TABLES, create_statements

_ARROW_TYPES = {
    "VARCHAR": pa.string(),
    "BIGINT": pa.int64(),
    "INTEGER": pa.int32(),
    "DOUBLE": pa.float64(),
    "BOOLEAN": pa.bool_(),
    "TIMESTAMP": pa.timestamp("us"),
}


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def init_store(con: duckdb.DuckDBPyConnection) -> None:
    """Create the tables in an empty database, or check an existing one is ours and current."""
    names = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    if names:
        check_store(con, path_for_errors="the database")
        return
    for stmt in create_statements():
        con.execute(stmt)
    con.execute(
        "INSERT INTO meta VALUES ('schema_version', ?), ('created_by', ?)",
        [str(SCHEMA_VERSION), f"tierdiag {__version__}"],
    )


class RunWriter:
    """Writes one run: the `runs` row first (status running), events in bulk, status at the end."""

    def __init__(self, db_path: str | os.PathLike, *, name: str | None, trace_path: str,
                 trace_sha256: str, config: Mapping[str, Any], hardware: Mapping[str, Any],
                 data_plane: Mapping[str, Any], timing: str, command_line: Sequence[str] | None = None):
        self.db_path = Path(db_path)
        self.run_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        self.name = name or Path(trace_path).stem
        self._t0 = time.perf_counter()
        parent = self.db_path.parent
        if not parent.exists():
            raise StoreError(f"cannot create {self.db_path}: folder {parent} does not exist")
        with self._connect() as con:
            init_store(con)
            row = {
                "run_id": self.run_id, "name": self.name, "created_at": _now(), "finished_at": None,
                "status": "running", "schema_version": SCHEMA_VERSION,
                "tierdiag_version": __version__,
                "command_line": " ".join(command_line if command_line is not None else sys.argv),
                "pid": os.getpid(), "hostname": socket.gethostname(),
                "trace_path": str(trace_path), "trace_sha256": trace_sha256,
                "config_json": json.dumps(dict(config), sort_keys=True, default=str),
                "hardware_json": json.dumps(dict(hardware), sort_keys=True, default=str),
                "data_plane_json": json.dumps(dict(data_plane), sort_keys=True, default=str),
                "timing": timing, "num_requests": 0, "wall_s": None, "error": None,
            }
            self._append(con, "runs", {k: [v] for k, v in row.items()})

    def _connect(self) -> duckdb.DuckDBPyConnection:
        try:
            return connect_with_retry(self.db_path, read_only=False)
        except duckdb.IOException as exc:
            raise StoreError(f"cannot write {self.db_path}: {exc}".splitlines()[0]) from exc

    @staticmethod
    def _append(con: duckdb.DuckDBPyConnection, table: str, columns: Mapping[str, Any]) -> None:
        schema = TABLES[table]
        unknown = set(columns) - set(schema)
        if unknown:
            raise ValueError(f"{table}: columns not in the schema: {sorted(unknown)}")
        n = None
        arrays = []
        for col, typ in schema.items():
            values = columns.get(col)
            if values is None:
                arrays.append(None)
                continue
            if n is None:
                n = len(values)
            elif len(values) != n:
                raise ValueError(f"{table}.{col}: {len(values)} values, expected {n}")
            arrays.append(pa.array(values, type=_ARROW_TYPES[typ]))
        if not n:
            return
        arrays = [a if a is not None else pa.nulls(n, type=_ARROW_TYPES[t])
                  for a, t in zip(arrays, schema.values())]
        batch = pa.Table.from_arrays(arrays, names=list(schema))
        con.register("_tierdiag_batch", batch)
        try:
            con.execute(f"INSERT INTO {table} SELECT * FROM _tierdiag_batch")
        finally:
            con.unregister("_tierdiag_batch")

    def append(self, tables: Mapping[str, Mapping[str, Any]]) -> None:
        """Append several tables' columns in one short transaction (run_id is filled in here)."""
        with self._connect() as con:
            con.execute("BEGIN")
            for table, columns in tables.items():
                cols = dict(columns)
                n = len(next(iter(cols.values()))) if cols else 0
                if n == 0:
                    continue
                cols["run_id"] = [self.run_id] * n
                self._append(con, table, cols)
            con.execute("COMMIT")

    def finish(self, status: str, *, num_requests: int, error: str | None = None) -> None:
        with self._connect() as con:
            con.execute(
                "UPDATE runs SET status = ?, finished_at = ?, num_requests = ?, wall_s = ?, error = ? "
                "WHERE run_id = ?",
                [status, _now(), num_requests, time.perf_counter() - self._t0, error, self.run_id],
            )
