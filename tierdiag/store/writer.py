"""The only code that writes a run store.

A replay holds the database only while it flushes (attach, bulk-append, detach), so readers can
open the file between flushes and a killed replay never leaves earlier runs unreadable: each
flush is one transaction, and a committed flush survives kill -9: a mid-run write's commit
checkpoints it into the file (`_checkpoint_at_commit`), the close's goes to DuckDB's WAL.
Rows arrive as columns (dict of equal-length lists/arrays) and are appended through Arrow in
one statement per table: never a row-at-a-time INSERT.

Readers share the file but keep a writer out while they hold it (DuckDB's file lock). A flush
in the middle of a run that finds the file busy keeps its rows and tries again at the next
flush; only the end of the run waits (up to `FINAL_WAIT_S`) for readers to let go.
Write failures (disk full, permissions) become one-line OutputErrors naming the file.

All or nothing, once: a new store's schema is created in one transaction (a half-made file from
an older tierdiag, or an empty one, is finished rather than refused), every flush is one
transaction during which SIGINT/SIGTERM wait (`signals.deferred`), and rows handed to `append`
belong to the writer from then on: committed exactly once, or given up when the run is closed
as failed. `recorded` counts the request rows committed, the number the run reports.
A file that is damaged (a block that fails its checksum, truncated, a table or column missing)
is refused before anything is written to it.

Flushes are written on the caller's thread. A writer thread beside the engine was measured and
dropped: on two quiet cores the engine lost more to sharing the GIL with it (the Arrow
conversion, and DuckDB taking the GIL back through the insert) than the flushes cost it.
A replay on a machine with a core to spare runs this writer in a process of its own instead
(writer_process.py): the same RunWriter, fed the same columns through a pipe, so the engine
pays only for handing them over.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence

import duckdb
import pyarrow as pa

from tierdiag import __version__, signals
from tierdiag.config.names import RunKind
from tierdiag.errors import OutputError, StoreError, TierdiagError
from tierdiag.paths import prepare_output_path
from tierdiag.store import creating
from tierdiag.store.reader import (CUT_SHORT_HINT, attach_with_retry, check_store, connect_with_retry, damage_error, detach,
                                   first_line, is_lock_error, lock_holder, unfinished_store, verify_blocks)
from tierdiag.store.duckdb_core import (hold_memory, lift_memory, release_cached_blocks, release_freed_heap,
                                       remove_spill)
from tierdiag.store.columns import _ARROW_TYPES, arrow_column as _arrow, table_columns  # noqa: F401 - table_columns: the writer process decodes with it
from tierdiag.store.schema import SCHEMA_VERSION, TABLES, columns_missing_in, create_statements, new_run_id



FLUSH_WAIT_S = 0.5  # mid-run: a reader holds the file; keep the rows, try at the next flush
FINAL_WAIT_S = 120.0  # end of the run (and its start): wait this long for readers to let go


def write_error(path: Path, exc: BaseException) -> TierdiagError:
    """The one-line error for a failure to open or write the store at `path`."""
    text = str(exc).lower()
    if isinstance(exc, duckdb.Error) and is_lock_error(exc):
        return StoreError(f"{path} is busy: another process holds it{lock_holder(exc)}",
                          hint="wait for it, or pass another --db")
    # Before damage: a checkpoint that fails on a full disk also says it "invalidated" the
    # database (its in-memory state); the file holds every committed flush.
    if "no space left" in text or "disk full" in text or "disk quota" in text:
        return OutputError(f"cannot write {path}: no space left on the disk",
                           hint="free some space, or pass a --db on another disk")
    if "permission denied" in text or "read-only file system" in text:
        return OutputError(f"cannot write {path}: permission denied",
                           hint="pass a --db in a folder you can write to")
    damaged = damage_error(path, exc) if isinstance(exc, duckdb.Error) else None
    if damaged is not None:
        if damaged.hint != CUT_SHORT_HINT:
            damaged.hint = "not writing into it; pass another --db"
        return damaged
    if "not a valid duckdb database" in text:
        return StoreError(f"{path} exists but is not a DuckDB database; not writing into it",
                          hint="pass another --db")
    return OutputError(f"cannot write {path}: {first_line(exc)}")


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def _open(path: Path, *, read_only: bool, wait_s: float) -> duckdb.DuckDBPyConnection:
    """Open the store for the writer; a failure is its one-line error (`write_error`). For
    writing, call inside `signals.deferred()` (the open may replay a WAL)."""
    try:
        return connect_with_retry(path, read_only=read_only, wait_s=wait_s)
    except duckdb.Error as exc:
        raise write_error(path, exc) from None


def check_before_writing(path: Path, *, host: duckdb.DuckDBPyConnection | None = None) -> None:
    """Refuse a file that is not ours, of another version, or damaged, before it is opened for
    writing at all (a read-write open may already change it): read-only, every block read back.
    `host`: the writer's own in-memory connection (RunWriter's), to which the file is attached
    read-only for the check and let go of after it; else a connection of its own is opened, a
    DuckDB instance started for it (~15 ms of CPU, ~95 M instructions: issue 41, session 36)."""
    if host is None:
        with _open(path, read_only=True, wait_s=FINAL_WAIT_S) as con:
            _check_existing(con, path)
        return
    try:
        attach_with_retry(host, path, wait_s=FINAL_WAIT_S, read_only=True)
    except duckdb.Error as exc:
        raise write_error(path, exc) from None
    try:
        _check_existing(host, path)
    finally:
        try:
            detach(host, checkpoint=False)
        except duckdb.Error as exc:
            raise write_error(path, exc) from None


def _check_existing(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    try:
        if not unfinished_store(con):
            check_store(con, path_for_errors=str(path))
            verify_blocks(con, path_for_errors=str(path))
    except duckdb.Error as exc:
        raise write_error(path, exc) from None


def init_store(con: duckdb.DuckDBPyConnection, *, path_for_errors: str = "the database") -> None:
    """Create the tables in an empty database (one transaction), finish one whose creation was
    cut short, or check an existing one is ours and current (`check_before_writing` has read
    every block of it already)."""
    if not unfinished_store(con):
        version = check_store(con, path_for_errors=path_for_errors)
        if version < SCHEMA_VERSION:  # an older store: the columns added since, NULL in its runs
            con.execute("BEGIN")
            for table, cols in columns_missing_in(version).items():
                for col in cols:
                    con.execute(f"ALTER TABLE {table} ADD COLUMN {col} {TABLES[table][col]}")
            con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION)])
            con.execute("COMMIT")
        return
    con.execute("BEGIN")
    for stmt in create_statements():
        con.execute(stmt)
    con.execute("DELETE FROM meta")  # an unfinished store holds no run: nothing of value here
    con.execute(
        "INSERT INTO meta VALUES ('schema_version', ?), ('created_by', ?)",
        [str(SCHEMA_VERSION), f"tierdiag {__version__}"],
    )
    con.execute("COMMIT")


# What a run's close runs after its status is committed: (connection, db path, run id, status)
# -> the closing numbers or None. See RunWriter.finish.
AfterCommit = Callable[[duckdb.DuckDBPyConnection, Path, str, str], Optional[dict]]


class RunWriter:
    """Writes one run: the `runs` row first (status running), events in bulk, status at the end."""

    def __init__(self, db_path: str | os.PathLike, *, name: str | None, trace_path: str,
                 trace_sha256: str, config: Mapping[str, Any], hardware: Mapping[str, Any],
                 data_plane: Mapping[str, Any], timing: str, command_line: Sequence[str] | None = None,
                 kind: str = RunKind.REPLAY, sweep_id: str | None = None, run_id: str | None = None,
                 pid: int | None = None, let_rows_go: bool = False):
        self.db_path = Path(db_path)
        # run_id: chosen by the caller when the config must name it (the run's storage folder).
        self.run_id = run_id or new_run_id()
        self.name = name or Path(trace_path).stem
        self._t0 = time.perf_counter()
        self._pending: list[Mapping[str, Mapping[str, Any]]] = []  # handed over, not committed yet
        # A write lets each piece of its rows go once inserted (`_write_pending`): the writer
        # process's (a failed write gives up its rows and every row after it either way: `_give_up`).
        self.let_rows_go = let_rows_go
        self.recorded = 0  # request rows of this run committed to the file
        # A write (or a take) failed: the rows handed over after it are given up (`append`), as
        # the writer process gives them up (writer_serve.py `fail`); the run closes as failed.
        self.given_up = False
        self.closed_as: str | None = None  # the final status, once written
        # The replay's closing numbers (`closing_numbers`), read back by a complete
        # close; or why they could not be.
        self.numbers: dict | None = None
        self.numbers_error: Exception | None = None
        self.has_run = True  # the runs row is written once this returns (the process client may not know yet)
        self._host: duckdb.DuckDBPyConnection | None = None  # `_connect`: the file is attached to it
        self._kept = False  # `finish(let_go_later=True)` left the file attached: `let_go` detaches it
        self._spill: str | None = None  # `hold_memory`'s spill folder while its limit holds (or until removed)
        self._held = False  # `hold_memory`'s limit set and not lifted
        prepare_output_path(self.db_path, what="--db", store=True)
        if self.db_path.is_file() and self.db_path.stat().st_size == 0:
            # An empty file (`touch`, or a creation killed before DuckDB wrote its header) holds
            # nothing; DuckDB refuses to open one, so it is removed and created afresh.
            _remove_empty(self.db_path)
        else:
            # A store a replay began here and that was cut inside DuckDB's header (its marker
            # beside it, nothing in it: store/creating.py) is made afresh too.
            creating.remove_cut_creation(self.db_path)
        made = not self.db_path.exists()  # this writer makes the file: one it puts no run in is removed
        if made:
            creating.begin(self.db_path)  # removed once the run's row is in (below)
        if not made:
            check_before_writing(self.db_path, host=self._host_connection())
        appended = False  # the runs row committed: a failure after it (letting go of the file) closes it
        try:
            with signals.deferred(), self._connect(FINAL_WAIT_S) as con:
                try:
                    init_store(con, path_for_errors=str(self.db_path))
                except duckdb.Error as exc:
                    raise write_error(self.db_path, exc) from None
                row = {
                    "run_id": self.run_id, "name": self.name, "created_at": _now(), "finished_at": None,
                    "status": "running", "schema_version": SCHEMA_VERSION,
                    "tierdiag_version": __version__,
                    "command_line": " ".join(command_line if command_line is not None else sys.argv),
                    # The replay's process (a writer process records its engine's): readers show a
                    # `running` run whose pid is gone as interrupted.
                    "pid": pid or os.getpid(), "hostname": socket.gethostname(),
                    "trace_path": str(trace_path), "trace_sha256": trace_sha256,
                    "config_json": json.dumps(dict(config), sort_keys=True, default=str),
                    "hardware_json": json.dumps(dict(hardware), sort_keys=True, default=str),
                    "data_plane_json": json.dumps(dict(data_plane), sort_keys=True, default=str),
                    "timing": timing, "num_requests": 0, "wall_s": None, "error": None,
                    "kind": kind, "sweep_id": sweep_id,
                }
                try:
                    self._append(con, "runs", {k: [v] for k, v in row.items()})
                    appended = True
                except duckdb.Error as exc:
                    raise write_error(self.db_path, exc) from None
        except TierdiagError as exc:
            if appended:
                self._close_unopened(exc)
            elif made:
                # Made here and no run in it (its schema or the runs row failed: a full disk): not
                # left behind (a file another process made meanwhile, and holds, is left to it).
                remove_runless_store(self.db_path)
            raise
        # The store holds a run: no longer a creation (a marker a killed replay left beside a
        # store that was then made whole goes too).
        creating.end(self.db_path)

    def _close_unopened(self, exc: TierdiagError) -> None:
        """The runs row was committed, then letting go of the file failed (its checkpoint on a
        full disk): the constructor raises, so no caller will close the run. It is closed as
        failed here, from a fresh open of the file (`_let_go` closed the connection), before
        the error goes up: a replay run in a process that lives on (a library caller, a sweep
        worker) must not leave it `running` (readers only show a running run whose process is
        gone as interrupted). If even that cannot be written, the error says so."""
        try:
            close_run_row(self.db_path, self.run_id, "failed", exc.one_line())
        except TierdiagError:
            exc.hint = (exc.hint + "; " if exc.hint else "") + "the run could not be marked failed"
            return
        self.closed_as = "failed"

    @contextlib.contextmanager
    def _connect(self, wait_s: float, *, keep: bool = False):
        """The file open for writing, for one `with` block; call inside `signals.deferred()`
        (the open may replay a WAL). A failure to open it is its one-line error. `keep`: a block
        that ends well leaves the file attached (`let_go` detaches it); one that raises does not."""
        try:
            self._attach(wait_s)
        except duckdb.Error as exc:
            raise write_error(self.db_path, exc) from None
        try:
            yield self._host
        except BaseException:
            self._let_go(failing=True)
            raise
        if keep:
            self._kept = True
        else:
            self._let_go()

    def _host_connection(self) -> duckdb.DuckDBPyConnection:
        """The in-memory connection this writer keeps for its life, opened at its first use
        (~25 ms: a DuckDB instance); a failure is the store's one-line error."""
        if self._host is None:
            try:
                self._host = connect_with_retry(":memory:", read_only=False)
            except duckdb.Error as exc:
                raise write_error(self.db_path, exc) from None
        return self._host

    def _attach(self, wait_s: float) -> None:
        """Attach the file to the in-memory connection this writer keeps for its life (opened
        once: ~25 ms, against ~1 ms an attach); `_let_go` detaches it (checkpointed, let go of),
        so readers can open the file between flushes."""
        if self._host is None:
            self._host = connect_with_retry(":memory:", read_only=False)
        attach_with_retry(self._host, self.db_path, wait_s=wait_s)

    @property
    def host(self) -> duckdb.DuckDBPyConnection | None:
        """The in-memory connection this writer keeps for its life (`_attach`): no file attached to
        it between writes; None before its first open, or once a failed let-go closed it."""
        return self._host

    def _let_go(self, *, failing: bool = False) -> None:
        """Detach the file. If even that fails (its checkpoint on a full disk), close the whole
        connection, which lets go of the file too, and raise the failure as a close's would
        (unless the block already `failing` raises its own, the one to report)."""
        try:
            detach(self._host)
        except duckdb.Error as exc:
            host, self._host = self._host, None
            self._held = False  # a new connection (the next write's) starts without the limit
            with contextlib.suppress(duckdb.Error):  # the file is let go of either way
                host.close()
            if not failing:
                raise write_error(self.db_path, exc) from None

    def let_go(self) -> None:
        """Checkpoint and detach the file `finish(let_go_later=True)` left attached (nothing if it
        did not); a failure is the store's one-line error (the run's rows and status stay
        committed: DuckDB's log replays them at the next open)."""
        if self._kept:
            self._kept = False
            self._let_go()

    def hold_memory(self, limit_bytes: int) -> bool:
        """Bound DuckDB's buffer-managed memory through this writer's writes at `limit_bytes`
        (store/duckdb_core.py `hold_memory`: what passes it spills into a folder of its own in the
        system's temporary directory), until `finish` lifts it once the last rows are committed,
        before the close's hook; whether it was set.
        The writer process's (writer_serve.py): a large run's vacuuming checkpoints held the
        merged row groups of its widest table in memory, on top of everything else the process
        holds (issue 41's 1M row). `remove_spill` removes the folder."""
        if self._host is None or self._held:
            return self._held
        folder = hold_memory(self._host, limit_bytes)
        if folder is None:
            return False
        remove_spill(self._spill)
        self._spill, self._held = folder, True
        return True

    def _lift_memory(self) -> None:
        """`hold_memory`'s limit lifted (the close's queries run as without it)."""
        if self._held:
            self._held = False
            if self._host is not None:
                try:
                    lift_memory(self._host)
                except duckdb.Error as exc:
                    raise write_error(self.db_path, exc) from None

    def remove_spill(self) -> None:
        """Remove `hold_memory`'s spill folder (the process is done with DuckDB: it leaves by os._exit,
        which never closes the instance that would remove what it spilled)."""
        remove_spill(self._spill)
        self._spill = None

    def close(self) -> None:
        """Let go of the in-memory connection (the file was let go of after every write)."""
        self.let_go()
        if self._host is not None:
            host, self._host = self._host, None
            self._held = False
            host.close()
        self.remove_spill()  # the instance closed: what it spilled is gone with it

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
            arrays.append(values if isinstance(values, (pa.Array, pa.ChunkedArray))
                          else pa.array(values, type=_ARROW_TYPES[typ]))
        if not n:
            return
        arrays = [a if a is not None else pa.nulls(n, type=_ARROW_TYPES[t])
                  for a, t in zip(arrays, schema.values())]
        batch = pa.Table.from_arrays(arrays, names=list(schema))
        # A relation over the Arrow table, inserted by position (the columns are in table order):
        # DuckDB reads it through Arrow's C stream, faster than a registered view (33 against 21
        # inserts of 50k rows in the same 2 s).
        con.from_arrow(batch).insert_into(table)

    def append(self, tables: Mapping[str, Mapping[str, Any]]) -> None:
        """Take several tables' columns (run_id is filled in here) and write everything taken so
        far in one short transaction: `take`, then `write`.

        From this call on the rows are the writer's: the caller may clear its buffers whether
        this returns or raises. If a reader holds the file they wait for the next append or
        `finish`. If the write fails (disk full), or the rows cannot be taken, they and every row
        handed over after them are given up (`write`), as the writer process gives them up: the
        run closes as failed with the rows committed before, either way (docs/contract.md,
        TIERDIAG_WRITER). Rows taken before a failed take stay pending for `finish`, as there.
        """
        if self.given_up:
            return
        try:
            self.take(tables)
        except Exception:
            self.given_up = True
            raise
        self.write()

    def append_rows(self, tables: Mapping[str, tuple[tuple[str, ...], Any]]) -> None:
        """`append` for a recorder's rows sink: {table: (field names, rows)}, rows as the recorder
        buffered them (recorder.columns_of), encoded ones turned into Arrow arrays straight."""
        self.append({table: table_columns(table, fields, rows) for table, (fields, rows) in tables.items()})

    def take(self, tables: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
        """Make the columns Arrow arrays and keep them pending, unwritten; returns them (table ->
        column -> Arrow array: the writer process hands them to its close's preparation). Values
        that cannot be stored at all (an integer past int64: a bug upstream, input bounds are
        checked where input enters) fail here, before any of them is taken, and never block the
        rows after them; the caller may reuse its own buffers."""
        taken = {table: {col: _arrow(table, col, values) for col, values in cols.items()}
                 for table, cols in tables.items()}
        for table, cols in taken.items():  # ragged columns are refused before they are taken too
            lengths = {col: len(values) for col, values in cols.items()}
            if len(set(lengths.values())) > 1:
                col, n = max(lengths.items(), key=lambda kv: kv[1])
                raise ValueError(f"{table}.{col}: {n} values, expected {min(lengths.values())}")
        self._pending.append(taken)
        return taken

    @property
    def pending(self) -> bool:
        """Rows taken and not committed yet."""
        return bool(self._pending)

    def write(self, wait_s: float = FLUSH_WAIT_S, *, vacuum: bool = True) -> None:
        """Commit everything pending in one transaction. A file a reader holds for longer than
        `wait_s` keeps the rows pending (for the next write, or `finish`). `vacuum=False`: its
        checkpoint leaves the row groups as they are (`_vacuum`; the writer process vacuums
        every VACUUM_EVERY-th write only)."""
        if not self._pending:
            return
        with signals.deferred():
            try:
                self._attach(wait_s)
            except duckdb.Error as exc:
                if is_lock_error(exc):
                    return
                self._give_up()
                raise write_error(self.db_path, exc) from None
            try:
                _vacuum(self._host, vacuum)
                _checkpoint_at_commit(self._host, True)
                self._write_pending(self._host)
            except BaseException:
                self._give_up()
                self._let_go(failing=True)
                raise
            self._let_go()

    def _give_up(self) -> None:
        """After a failed write: its rows (nothing of its transaction is in the file) and every row
        handed over after it are given up, whether or not the write let some go (`let_rows_go`),
        so the run holds whole writes only, the same with a writer process or inline."""
        self._pending.clear()
        self.given_up = True

    def _write_pending(self, con: duckdb.DuckDBPyConnection) -> None:
        """Everything in `_pending`, in order, as one transaction; cleared once committed.

        With `let_rows_go` the rows are the transaction's from its start: each piece's Arrow
        columns are let go once inserted (DuckDB's transaction holds its own copy of them from
        then on), so the write holds the rows once, not twice (issue 41: a 1M-request replay's
        write held ~5 s of rows as Arrow beside DuckDB's copy of them); a write that fails then
        gives its rows up, as every failed write does (`_give_up`)."""
        let_go = self.let_rows_go
        try:
            con.execute("BEGIN")
            rows = let_go_bytes = 0
            for table, columns in _by_table(self._pending, let_go=let_go):
                if let_go_bytes >= TRIM_AFTER_BYTES:  # the pieces before this one are freed by now
                    release_freed_heap()
                    let_go_bytes = 0
                cols = dict(columns)
                del columns
                n = len(next(iter(cols.values()))) if cols else 0
                if n == 0:
                    continue
                if let_go:
                    let_go_bytes += sum(getattr(values, "nbytes", 0) for values in cols.values())
                cols["run_id"] = pa.repeat(pa.scalar(self.run_id, type=pa.string()), n)
                self._append(con, table, cols)
                del cols
                rows += n if table == "requests" else 0
            if let_go_bytes >= TRIM_AFTER_BYTES:
                release_freed_heap()
            con.execute("COMMIT")
        except duckdb.Error as exc:
            # The transaction rolled back: nothing of it is in the file, earlier flushes are.
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")
            raise write_error(self.db_path, exc) from None
        self._pending.clear()
        self.recorded += rows

    def finish(self, status: str, *, error: str | None = None, write_pending: bool = True,
               trace_sha256: str | None = None, num_requests: int | None = None,
               release: bool = True, after_commit: AfterCommit | None = None,
               let_go_later: bool = False) -> None:
        """Write what is still pending (unless told to give it up, after a write failed), then
        the run's final status, with `recorded` as its number of requests. A trace read through
        a pipe has its digest only now (`trace_sha256`). The file is let go of either way;
        `release=False` keeps the in-memory connection (the writer process, which exits right
        after answering, skips its 8-10 ms teardown in the close the replay waits for).
        `let_go_later` (with `release=False`): a close that went well leaves the file attached,
        everything committed, its checkpoint and detach to `let_go` (the writer process calls
        it after answering: the checkpoint, ~20 ms of the conversation trace's close, is not
        waited for by the replay's result; issue 41); a close that fails lets go as before.

        `after_commit(con, db_path, run_id, status)` runs once the status is committed, on the
        same connection (one open and one checkpoint for the whole close): the replay passes
        diagnose.run.close.after_commit (the run evidence, and the closing numbers it returns, kept
        as `numbers`; what it raises is kept as `numbers_error`, for the replay to raise). The
        store computes nothing of the diagnosis itself.

        `num_requests` is accepted for existing callers and not used: a run's count is the
        request rows committed to the file, never what a caller believes it handed over (a full
        disk made the two differ)."""
        del num_requests
        with signals.deferred():
            if not write_pending:
                self._pending.clear()
            with self._connect(FINAL_WAIT_S, keep=let_go_later and not release) as con:
                _no_vacuum(con)
                _checkpoint_at_commit(con, False)
                if self._pending:
                    large = pending_bytes(self._pending) >= LET_GO_AFTER_BYTES
                    self._write_pending(con)
                    if large:
                        self._let_memory_go(con)
                # The last rows were written under the writes' limit (`hold_memory`); the hook's
                # queries run without it.
                self._lift_memory()
                try:
                    con.execute(
                        "UPDATE runs SET status = ?, finished_at = ?, num_requests = ?, wall_s = ?, error = ?, "
                        "trace_sha256 = coalesce(?, trace_sha256) WHERE run_id = ?",
                        [status, _now(), self.recorded, time.perf_counter() - self._t0, error, trace_sha256,
                         self.run_id],
                    )
                except duckdb.Error as exc:
                    raise write_error(self.db_path, exc) from None
                self.closed_as = status
                # Committed. The caller's hook on the same connection, so the close pays one
                # open and one checkpoint.
                if after_commit is not None:
                    try:
                        self.numbers = after_commit(con, self.db_path, self.run_id, status)
                    except Exception as exc:  # noqa: BLE001 - raised by the replay, where it reads them
                        self.numbers_error = exc
        if release:
            self.close()


    def _let_memory_go(self, con: duckdb.DuckDBPyConnection) -> None:
        """After the close's last rows are committed, before its hook computes on this connection:
        the rows checkpointed (the commit did already where its WAL passed DuckDB's threshold:
        then nothing is left to do), the blocks DuckDB keeps cached after the insert let go
        (store/duckdb_core.py `release_cached_blocks`: nothing else queries this instance now)
        and what Arrow's pool kept of the rows' columns handed back (`release_arrow_memory`), so
        that the hook does not compute on top of them (issue 41: a 1M-request replay's close
        began ~165 MB over the writes' level, and its size curves and sections came on top)."""
        try:
            con.execute("CHECKPOINT")
        except duckdb.Error as exc:
            raise write_error(self.db_path, exc) from None
        release_cached_blocks(con)
        release_arrow_memory()


def release_arrow_memory() -> None:
    """Hand back to the system what Arrow's memory pool keeps of the arrays freed on this thread
    (pyarrow's default pool, mimalloc, keeps a freed segment until later allocations there purge
    it: after the close's last write there are none, and the rows' columns, a few seconds of a
    1M-request replay, stayed resident under the close; measured: a freed 1 GB concatenation
    resident until `release_unused`, 12 ms, then gone). A pyarrow without it: nothing."""
    release = getattr(pa.default_memory_pool(), "release_unused", None)
    if release is not None:
        release()


# A write that lets its rows go hands the heap back (`release_freed_heap`, ~1-20 ms) each time this
# many bytes of Arrow columns were let go since it last did (checked before each piece and after
# the last): a 1M-request replay's write lets ~100 MB go (3 calls); a conversation replay's writes,
# a few MB each, none (what they free, the next hand-overs' columns reuse).
TRIM_AFTER_BYTES = 32 << 20


# The close's last write lets DuckDB's cached blocks go after it (`RunWriter._let_memory_go`)
# from this many bytes of pending Arrow columns on: about DuckDB's WAL checkpoint threshold
# (16 MB), where its commit has checkpointed them already. A conversation replay's close
# writes ~4 MB (nothing changes there); a 1M-request replay's, a few seconds of its rows.
LET_GO_AFTER_BYTES = 16 << 20


def pending_bytes(pending: Sequence[Mapping[str, Mapping[str, Any]]]) -> int:
    """The bytes of the Arrow columns pending (what `take` made of them)."""
    return sum(getattr(values, "nbytes", 0) for batch in pending for cols in batch.values() for values in cols.values())


# The most rows of one insert a table's batches are put together into (`_by_table`): DuckDB's row group.
INSERT_ROWS = 122_880


def _by_table(pending: list[Mapping[str, Mapping[str, Any]]], most_rows: int = INSERT_ROWS, *,
              let_go: bool = False):
    """(table, columns) to insert for the batches taken, in order: a table's batches with the
    same columns as one (an insert costs ~1.5 ms whatever its size: the writer process's close
    inserts a second's hand-overs, 4-5 batches a table), a batch with other columns on its own,
    after those before it. Put together `most_rows` rows at a time (a batch larger than that
    alone, as it is), as Arrow chunked arrays of the batches' own arrays: no copy of the rows
    (issue 41: a 1M-request replay's writes carry ~1M rows each; joined by concatenation, each
    piece was a second copy of its rows). `let_go`: `pending` is emptied at once and each piece
    is let go of here once the caller is done with it (the caller drops its own references), so
    the batches inserted are freed while the write goes on."""
    runs: list[tuple[str, list]] = []
    last: dict[str, tuple[frozenset, list]] = {}
    for batch in pending:
        for table, columns in batch.items():
            keys = frozenset(columns)
            held = last.get(table)
            if held is not None and held[0] == keys:
                held[1].append(columns)
                continue
            parts = [columns]
            last[table] = (keys, parts)
            runs.append((table, parts))
    last.clear()
    batch = columns = held = None  # the loop's names: no reference to the rows left behind
    if let_go:
        pending.clear()
    runs.reverse()  # taken from the end: what was yielded is referenced from nowhere here
    while runs:
        table, parts = runs.pop()
        parts.reverse()
        piece: list = []
        rows = 0
        while parts:
            columns = parts.pop()
            n = len(next(iter(columns.values()))) if columns else 0
            if piece and rows + n > most_rows:
                yield table, _joined(piece)
                piece, rows = [], 0
            piece.append(columns)
            rows += n
        columns = None
        if piece:
            yield table, _joined(piece)
            piece = []


def _joined(parts: list) -> Mapping[str, Any]:
    """Batches of one table with the same columns as one: each column the batches' arrays as one
    Arrow chunked array (no copy; DuckDB scans it as one table)."""
    if len(parts) == 1:
        return parts[0]
    return {col: pa.chunked_array([p[col] for p in parts]) for col in parts[0]}


def _vacuum(con: duckdb.DuckDBPyConnection, on: bool) -> None:
    """The next checkpoint on `con` merges small row groups (DuckDB's default) or not (`_no_vacuum`).
    Each write's checkpoint leaves a row group a table, and DuckDB's vacuum merges them as a
    binary counter carries, rewriting the rows it merges: on a table short of a full row group
    (122,880 rows: every table of the conversation trace) that is most of its rows every other
    write. The writer process vacuums every VACUUM_EVERY-th write only (writer_process.py: ~22 %
    less of its writes' CPU on the conversation trace, the file ~11 % larger at the run's end;
    benchmarks/README.md, session 21 h41close3)."""
    if not on:
        _no_vacuum(con)
        return
    _setting(con, "max_vacuum_tasks", None)  # a DuckDB without the setting always vacuums


def _checkpoint_at_commit(con: duckdb.DuckDBPyConnection, on: bool) -> None:
    """A write's commit checkpoints (`on`: DuckDB's checkpoint_threshold 0, the writes', mid-run):
    DuckDB then writes the rows into the file once, at the commit, where by default the commit
    wrote them to its WAL and the detach's checkpoint wrote them again into the file and
    removed the WAL (issue 41: the conversation trace's writes, 0.41 -> 0.31 s of CPU; a write past
    the threshold, 16 MB of WAL, a 1M-request replay's, checkpointed at its commit already).
    The close (`finish`) keeps DuckDB's default: its commit goes to the WAL and the checkpoint
    comes after the replay's answer (`let_go`). The setting is the writer's own in-memory
    instance's; a DuckDB without it: the default, as before."""
    _setting(con, "checkpoint_threshold", "'0b'" if on else None)


def _no_vacuum(con: duckdb.DuckDBPyConnection) -> None:
    """Let the close's checkpoint (the one the replay waits for) skip vacuuming: DuckDB's
    checkpoint merges a table's small row groups (one a flush) by rewriting them, and at a
    run's close that is every row of a table still short of a full row group (122,880 rows):
    measured on the conversation trace's 135k rows, 50-60 ms of the close against ~10 ms
    without. The few row groups it leaves unmerged (as many as flushes since the last merge,
    the file's size the same to a block or two) are merged by a later checkpoint: the next run's
    flushes, off any close. The setting is the writer's own in-memory instance's, and it
    ends with it; a DuckDB without the setting vacuums, as before."""
    _setting(con, "max_vacuum_tasks", "0")


def _setting(con: duckdb.DuckDBPyConnection, name: str, value: str | None) -> None:
    """SET DuckDB's setting `name` to `value` (SQL text), or RESET it to its default (None). A
    DuckDB without the setting is left as it is (it behaves as its default did before the
    setting existed: it vacuums, it checkpoints after its WAL)."""
    try:
        con.execute(f"RESET {name}" if value is None else f"SET {name} = {value}")
    except duckdb.CatalogException:
        return


def close_run_row(db_path: str | os.PathLike, run_id: str, status: str, error: str | None) -> int | None:
    """Close run `run_id` as `status` from outside the writer that opened it (that writer's
    process died): its count is the request rows committed to the file. Returns that count, or
    None when the file holds no such run (it died before writing the runs row)."""
    held = _close_from_outside(Path(db_path), run_id, status, error, keep_closed=False)
    return None if held is None else held.requests


class HeldRun(NamedTuple):
    """A run as a dead writer left it (`close_unclosed_run_row`)."""

    requests: int  # request rows committed
    status: str  # what it is closed as now
    evidence: bool  # its run_evidence row is committed


def close_unclosed_run_row(db_path: str | os.PathLike, run_id: str, status: str, error: str | None) -> HeldRun | None:
    """As `close_run_row`, for a writer process that died before it answered the close: a run it
    had closed already (its status committed, then it died computing the evidence or before it
    answered) is kept as it closed it, complete or interrupted with every row; only a run still
    `running` is closed as `status`. None when the file holds no such run."""
    return _close_from_outside(Path(db_path), run_id, status, error, keep_closed=True)


def _close_from_outside(path: Path, run_id: str, status: str, error: str | None, *,
                        keep_closed: bool) -> HeldRun | None:
    if not path.is_file() or path.stat().st_size == 0:
        return None  # never created: the process died before it made the file
    with signals.deferred(), _open(path, read_only=False, wait_s=FINAL_WAIT_S) as con:
        try:
            if unfinished_store(con):
                return None
            found = con.execute("SELECT status FROM runs WHERE run_id = ?", [run_id]).fetchall()
            if not found:
                return None
            n = con.execute("SELECT count(*) FROM requests WHERE run_id = ?", [run_id]).fetchall()[0][0]
            held = found[0][0]
            if not keep_closed or held == "running":
                con.execute("UPDATE runs SET status = ?, finished_at = ?, num_requests = ?, error = ? WHERE run_id = ?",
                            [status, _now(), n, error, run_id])
                held = status
            evidence = 0
            if con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'run_evidence'").fetchall()[0][0]:
                evidence = con.execute("SELECT count(*) FROM run_evidence WHERE run_id = ?", [run_id]).fetchall()[0][0]
        except duckdb.Error as exc:
            raise write_error(path, exc) from None
    return HeldRun(int(n), held, bool(evidence))


def remove_runless_store(db_path: str | os.PathLike) -> bool | None:
    """Remove the store file at `db_path` (and DuckDB's log beside it) where it holds no run: a
    file a replay made whose writer died before the run's row was committed (only DuckDB's header,
    or the schema). True: removed, or not there; None: it holds a run (another replay's, made
    meanwhile), left; False: it could not be looked at (another process holds it, it is not a
    store), left. The file is checked and removed while this process holds DuckDB's lock on it,
    so no other replay is writing its run into it meanwhile."""
    path = Path(db_path)
    if not path.is_file():
        creating.end(path)
        return True
    if path.stat().st_size == 0:
        _remove_empty(path)
        if path.exists():
            return False
        creating.end(path)
        return True
    try:
        con = connect_with_retry(path, read_only=False, wait_s=FLUSH_WAIT_S)
    except duckdb.Error:
        # Cut inside DuckDB's header as it was made (store/creating.py): nothing in it.
        return creating.remove_cut_creation(path)
    try:
        with signals.deferred():
            if not unfinished_store(con) and con.execute("SELECT count(*) FROM runs").fetchall()[0][0]:
                return None
            # Unlinked while held (DuckDB's lock is on the open file): its close writes nothing back.
            for stale in (path, path.with_name(path.name + ".wal")):
                with contextlib.suppress(FileNotFoundError):
                    stale.unlink()
    except (duckdb.Error, OSError):
        return False
    finally:
        con.close()
    creating.end(path)
    return True


def _remove_empty(path: Path) -> None:
    """Remove an empty store file, unless another process holds it (DuckDB locks with fcntl):
    then it is being created right now, and opening it will say the file is busy."""
    import fcntl

    try:
        with open(path, "rb+") as fh:
            try:
                fcntl.lockf(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return
            if os.fstat(fh.fileno()).st_size == 0:
                path.unlink()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
