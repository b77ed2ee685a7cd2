"""The only code that writes a run store.

A replay holds the database only while it flushes (open, bulk-append, close), so readers can
open the file between flushes and a killed replay never leaves earlier runs unreadable: each
flush is one transaction, and DuckDB's WAL makes a committed flush survive kill -9.
Rows arrive as columns (dict of equal-length lists/arrays) and are appended through Arrow in
one statement per table: never a row-at-a-time INSERT.

Readers share the file but keep a writer out while they hold it (DuckDB's file lock). A flush
in the middle of a run that finds the file busy keeps its rows and tries again at the next
flush; only the end of the run waits (up to `FINAL_WAIT_S`) for readers to let go.
Write failures (disk full, permissions) become one-line OutputErrors naming the file.
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
from tierdiag.errors import OutputError, StoreError, TierdiagError
from tierdiag.store.reader import is_lock_error, check_store, connect_with_retry, first_line, lock_holder
from tierdiag.store.schema import SCHEMA_VERSION, TABLES, create_statements

_ARROW_TYPES = {
    "VARCHAR": pa.string(),
    "BIGINT": pa.int64(),
    "INTEGER": pa.int32(),
    "DOUBLE": pa.float64(),
    "BOOLEAN": pa.bool_(),
    "TIMESTAMP": pa.timestamp("us"),
}


FLUSH_WAIT_S = 0.5  # mid-run: a reader holds the file; keep the rows, try at the next flush
FINAL_WAIT_S = 120.0  # end of the run (and its start): wait this long for readers to let go


def write_error(path: Path, exc: BaseException) -> TierdiagError:
    """The one-line error for a failure to open or write the store at `path`."""
    text = str(exc).lower()
    if isinstance(exc, duckdb.Error) and is_lock_error(exc):
        return StoreError(f"{path} is busy: another process holds it{lock_holder(exc)}",
                          hint="wait for it, or pass another --db")
    if "no space left" in text or "disk full" in text or "disk quota" in text:
        return OutputError(f"cannot write {path}: no space left on the disk",
                           hint="free some space, or pass a --db on another disk")
    if "permission denied" in text or "read-only file system" in text:
        return OutputError(f"cannot write {path}: permission denied",
                           hint="pass a --db in a folder you can write to")
    if "not a valid duckdb database" in text:
        return StoreError(f"{path} exists but is not a DuckDB database; not writing into it",
                          hint="pass another --db")
    return OutputError(f"cannot write {path}: {first_line(exc)}")


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def init_store(con: duckdb.DuckDBPyConnection, *, path_for_errors: str = "the database") -> None:
    """Create the tables in an empty database, or check an existing one is ours and current."""
    names = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    if names:
        check_store(con, path_for_errors=path_for_errors)
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
                 data_plane: Mapping[str, Any], timing: str, command_line: Sequence[str] | None = None,
                 kind: str = "replay", sweep_id: str | None = None):
        self.db_path = Path(db_path)
        self.run_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        self.name = name or Path(trace_path).stem
        self._t0 = time.perf_counter()
        self._pending: list[dict[str, dict[str, list]]] = []  # flushes a busy file put off
        parent = self.db_path.parent
        if self.db_path.is_dir():
            raise OutputError(f"cannot write {self.db_path}: it is a folder", hint="pass a file name to --db")
        if not parent.is_dir():
            raise OutputError(f"cannot create {self.db_path}: folder {parent} does not exist",
                              hint="create it first, or pass another --db")
        if not self.db_path.exists() and not os.access(parent, os.W_OK | os.X_OK):
            raise OutputError(f"cannot create {self.db_path}: folder {parent} is not writable",
                              hint="pass a --db in a folder you can write to")
        with self._connect(FINAL_WAIT_S) as con:
            init_store(con, path_for_errors=str(self.db_path))
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
                "kind": kind, "sweep_id": sweep_id,
            }
            try:
                self._append(con, "runs", {k: [v] for k, v in row.items()})
            except duckdb.Error as exc:
                raise write_error(self.db_path, exc) from None

    def _connect(self, wait_s: float) -> duckdb.DuckDBPyConnection:
        try:
            return connect_with_retry(self.db_path, read_only=False, wait_s=wait_s)
        except duckdb.Error as exc:
            raise write_error(self.db_path, exc) from None

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
            arrays.append(values if isinstance(values, pa.Array) else pa.array(values, type=_ARROW_TYPES[typ]))
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
        """Append several tables' columns in one short transaction (run_id is filled in here).

        If a reader holds the file, the rows are kept (copied: the caller reuses its buffers)
        and written with the next append or at `finish`.
        """
        try:
            con = connect_with_retry(self.db_path, read_only=False, wait_s=FLUSH_WAIT_S)
        except duckdb.Error as exc:
            if not is_lock_error(exc):
                raise write_error(self.db_path, exc) from None
            self._pending.append({t: {c: list(v) for c, v in cols.items()} for t, cols in tables.items()})
            return
        with con:
            self._pending.append(tables)
            try:
                self._write_pending(con)
            finally:
                # On failure the caller still holds these rows (its buffers are not cleared).
                if self._pending and self._pending[-1] is tables:
                    self._pending.pop()

    def _write_pending(self, con: duckdb.DuckDBPyConnection) -> None:
        """Everything in `_pending`, in order, as one transaction; cleared once committed."""
        try:
            con.execute("BEGIN")
            for batch in self._pending:
                for table, columns in batch.items():
                    cols = dict(columns)
                    n = len(next(iter(cols.values()))) if cols else 0
                    if n == 0:
                        continue
                    cols["run_id"] = pa.repeat(pa.scalar(self.run_id, type=pa.string()), n)
                    self._append(con, table, cols)
            con.execute("COMMIT")
        except duckdb.Error as exc:
            # The transaction rolled back: nothing of it is in the file, earlier flushes are.
            raise write_error(self.db_path, exc) from None
        self._pending.clear()

    def finish(self, status: str, *, num_requests: int, error: str | None = None,
               write_pending: bool = True) -> None:
        """Write what is still pending (unless told to give it up, after a write failed), then
        the run's final status."""
        if not write_pending:
            self._pending.clear()
        with self._connect(FINAL_WAIT_S) as con:
            if self._pending:
                self._write_pending(con)
            try:
                con.execute(
                    "UPDATE runs SET status = ?, finished_at = ?, num_requests = ?, wall_s = ?, error = ? "
                    "WHERE run_id = ?",
                    [status, _now(), num_requests, time.perf_counter() - self._t0, error, self.run_id],
                )
            except duckdb.Error as exc:
                raise write_error(self.db_path, exc) from None
