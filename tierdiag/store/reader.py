"""Read-only access to a run store, with the checks every reader needs.

Every error here names the file and says what to do: missing file, not DuckDB, DuckDB but not
a tierdiag store, another schema version, damaged (a table or column missing, a block that fails
its checksum or is cut off, a runs row that is not JSON), held by a writer, unknown run.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
import weakref
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import duckdb

from tierdiag import signals
from tierdiag.config.names import RunKind
from tierdiag.errors import ConfigError, NoRunsError, StoreError
from tierdiag.paths import DEFAULT_DB, IN_MEMORY, check_duckdb_name, duckdb_name, file_kind  # DEFAULT_DB re-exported too: the store's default name
from tierdiag.store.schema import (EVENT_TABLES, OLDEST_READABLE_VERSION, OPTIONAL_TABLES, SCHEMA_VERSION, TABLES,
                                   columns_missing_in)
from tierdiag.threads import OnThread

_BUSY_RETRY_S = 3.0


def is_lock_error(exc: Exception) -> bool:
    # DuckDB: 'Could not set lock on file "...": Conflicting lock is held in ... (PID 123)'.
    text = str(exc).lower()
    return "could not set lock" in text or "conflicting lock" in text or "being used by another" in text


def lock_holder(exc: Exception) -> str:
    """' (process 123)' when DuckDB names the process holding the file, else ''."""
    m = re.search(r"\(PID (\d+)\)", str(exc))
    return f" (process {m.group(1)})" if m else ""


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _retry_while_locked(open_once, wait_s: float):
    """`open_once()`, again while another process (a replay flushing) holds the file, for up to
    `wait_s`; a waiting step is a safe place to stop, even inside a deferred block."""
    deadline = time.monotonic() + wait_s
    delay = 0.02
    while True:
        try:
            return open_once()
        except duckdb.IOException as exc:
            if not is_lock_error(exc) or time.monotonic() > deadline:
                raise
            signals.checkpoint()
            time.sleep(delay)
            signals.checkpoint()
            delay = min(delay * 2, 0.25)


def connect_with_retry(path: str | os.PathLike, *, read_only: bool,
                       wait_s: float = _BUSY_RETRY_S) -> duckdb.DuckDBPyConnection:
    """Open the file, waiting briefly while another process (a replay flushing) holds it; the
    text IN_MEMORY alone opens an in-memory database (any other name, a Path ':memory:' too, is
    the file it names: paths.duckdb_name)."""
    name = path if isinstance(path, str) and path == IN_MEMORY else duckdb_name(path)
    # One DuckDB thread: our queries and appends are small, and a replay writing beside the
    # engine on a few cores should not compete with it.
    con = _retry_while_locked(
        lambda: duckdb.connect(name, read_only=read_only, config={"threads": 1}), wait_s)
    # DuckDB draws its own progress bar for a query past 2 s (a session setting): raw
    # terminal escapes among our output (inside `--json` at the end of a big replay, or a
    # million-request report), and from every worker of a sweep at once.
    con.execute("SET enable_progress_bar = false")
    return con


ATTACHED = "store"  # the catalog name of a file attached by `attach_with_retry`


def attach_with_retry(host: duckdb.DuckDBPyConnection, path: str | os.PathLike, *,
                      wait_s: float = _BUSY_RETRY_S, read_only: bool = False) -> None:
    """Attach the file for writing (or, `read_only`, for reading: `detach(checkpoint=False)`) to
    `host` (an in-memory connection, made by `connect_with_retry(":memory:", ...)`) as the
    default catalog, waiting while another process holds it; `detach` lets go of it. A writer
    that opens the file every flush pays ~1 ms for this where a connection costs ~25 ms to open
    (DuckDB starts a database instance: measured on 2.0.1, even for :memory:), and DETACH
    checkpoints as a close does."""
    quoted = duckdb_name(path).replace("'", "''")  # a literal: ATTACH takes no parameters
    mode = " (READ_ONLY)" if read_only else ""
    _retry_while_locked(lambda: host.execute(f"ATTACH '{quoted}' AS {ATTACHED}{mode}"), wait_s)
    host.execute(f"USE {ATTACHED}")


def detach(host: duckdb.DuckDBPyConnection, *, checkpoint: bool = True) -> None:
    """Checkpoint and let go of the file `attach_with_retry` attached (readers may open it then).
    The checkpoint is asked for first: one that fails inside DETACH says only that it failed,
    where CHECKPOINT says why (no space left on the disk). `checkpoint` False: a file attached
    read-only, let go of as it is."""
    if checkpoint:
        host.execute("CHECKPOINT")
    host.execute("USE memory")
    host.execute(f"DETACH {ATTACHED}")


_DAMAGE = ("corrupt database file", "could not read enough bytes", "checksum", "database has been invalidated",
           "failed to read", "invalid block", "metadata pointer", "serialization error", "deserializ")


def damage_error(path: str | os.PathLike, exc: BaseException) -> StoreError | None:
    """The StoreError for a DuckDB error that says the file is damaged, else None."""
    if not isinstance(exc, duckdb.Error):
        return None
    text = str(exc).lower()
    if not any(marker in text for marker in _DAMAGE):
        return None
    from tierdiag.store.creating import header_only

    if header_only(path):  # 4 or 8 KiB of a new database's header: a creation cut short, no marker
        return StoreError(f"{path} is damaged ({first_line(exc)[:160]})", hint=CUT_SHORT_HINT)
    return StoreError(f"{path} is damaged ({first_line(exc)[:160]})",
                      hint="restore it from a copy; runs in it cannot be read")


# A file cut between DuckDB's first writes of a new store that no tierdiag replay marked as its
# own (store/creating.py): nothing is in it, but it is not removed for the user.
CUT_SHORT_HINT = ("only the start of a new DuckDB header is in it, as in a store cut short while it was made: "
                  "nothing recorded can be read from it; remove it to record into this path, or restore it from a copy")


_last_opened: list[str] = []


def last_opened() -> str | None:
    """The store this process opened last (to name it when a query on it finds damage)."""
    return _last_opened[-1] if _last_opened else None


def _tables(con: duckdb.DuckDBPyConnection) -> dict[str, list[str]]:
    """Table -> its columns in order, of the file's main schema. duckdb_columns() answers in
    ~2 ms where information_schema takes 10-15 ms (every reader pays this at start-up)."""
    rows = con.execute("SELECT table_name, column_name FROM duckdb_columns() WHERE NOT internal "
                       "AND database_name = current_database() AND schema_name = 'main' "
                       "ORDER BY table_name, column_index").fetchall()
    found: dict[str, list[str]] = {}
    for table, column in rows:
        found.setdefault(table, []).append(column)
    return found


def unfinished_store(con: duckdb.DuckDBPyConnection, found: dict[str, list[str]] | None = None) -> bool:
    """True for a file with no complete schema and no run: no tables at all, or only some of
    ours, exactly as we create them, all empty (meta aside). A creation that was cut short
    (by a kill, or an older tierdiag that created tables one by one) leaves such a file; it is
    finished, not refused as foreign."""
    found = _tables(con) if found is None else found
    if not found:
        return True
    ours = {**TABLES, **OPTIONAL_TABLES}
    if any(list(ours.get(t, ())) != cols for t, cols in found.items()):
        return False  # someone else's table, or one of ours changed: not ours to finish
    if set(found) - set(OPTIONAL_TABLES) == set(TABLES):
        meta = con.execute("SELECT count(*) FROM meta WHERE key = 'schema_version'").fetchall()[0][0]
        if meta:
            return False  # complete
    return all(con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0] == 0 for t in found if t != "meta")


def check_schema(con: duckdb.DuckDBPyConnection, *, path_for_errors: str,
                 found: dict[str, list[str]] | None = None, version: int = SCHEMA_VERSION) -> None:
    """Every table and column of the schema `version` has is there (a store that lacks one was
    damaged by hand or by a tool)."""
    found = _tables(con) if found is None else found
    later = columns_missing_in(version)
    for table, cols in TABLES.items():
        if table not in found:
            raise StoreError(f"{path_for_errors} is damaged: table {table} is missing",
                             hint="restore it from a copy, or pass another --db")
        missing = [c for c in cols if c not in found[table] and c not in later.get(table, ())]
        if missing:
            raise StoreError(f"{path_for_errors} is damaged: column {table}.{missing[0]} is missing",
                             hint="restore it from a copy, or pass another --db")


def verify_blocks(con: duckdb.DuckDBPyConnection, *, path_for_errors: str) -> None:
    """Read every stored value once, so DuckDB checks every block's checksum and length: a
    writer refuses a damaged file before it adds to it (appending only touches the last block,
    so damage elsewhere would go unnoticed until a reader trips on it)."""
    for table in ("meta", "runs") + EVENT_TABLES:
        try:
            con.execute(f"SELECT sum(hash(COLUMNS(*))) FROM {table}").fetchall()
        except duckdb.Error as exc:
            damaged = damage_error(path_for_errors, exc)
            if damaged is None:
                raise
            raise damaged from None


def check_store(con: duckdb.DuckDBPyConnection, *, path_for_errors: str,
                found: dict[str, list[str]] | None = None) -> int:
    not_ours = StoreError(f"{path_for_errors} is a DuckDB file but not a tierdiag run store",
                          hint="pass the --db written by `tierdiag replay`")
    try:
        # fetchall, not fetchone: DuckDB 2 treats a result that was not read to its end as
        # pending, and the writer's next register() on this connection would then fail.
        rows = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchall()
    except (duckdb.CatalogException, duckdb.BinderException):  # no meta table / not our columns
        rows = []
    if len(rows) != 1:
        raise not_ours
    try:
        version = int(rows[0][0])
    except (TypeError, ValueError):
        raise not_ours from None
    if not OLDEST_READABLE_VERSION <= version <= SCHEMA_VERSION:
        newer = version > SCHEMA_VERSION
        raise StoreError(
            f"{path_for_errors} uses run-store schema v{version}; this tierdiag reads "
            f"v{OLDEST_READABLE_VERSION} to v{SCHEMA_VERSION}",
            hint="upgrade tierdiag" if newer else "re-run `tierdiag replay` with this version into a new --db",
        )
    check_schema(con, path_for_errors=path_for_errors, found=found, version=version)
    return version


# open_store's connections -> whether show_added_columns shadowed tables of theirs with views
# (explain's second cursor would not see them: read/request_reads.py asks `views_shown`).
_VIEWS_SHOWN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def views_shown(con: duckdb.DuckDBPyConnection) -> bool | None:
    """Whether `open_store` read `con`'s store through temporary views (an older schema's), None
    for a connection it did not open (the caller asks DuckDB)."""
    return _VIEWS_SHOWN.get(con)


def show_added_columns(con: duckdb.DuckDBPyConnection, version: int) -> bool:
    """A store of an older schema read as the current one: each table that lacks columns added
    since is shadowed by a temporary view (this connection only, nothing written) with them NULL.
    Whether it made any."""
    missing = columns_missing_in(version)
    if not missing:
        return False
    db = con.execute("SELECT current_database()").fetchall()[0][0].replace('"', '""')
    for table, cols in missing.items():
        extra = ", ".join(f"NULL::{TABLES[table][c]} AS {c}" for c in cols)
        con.execute(f'CREATE TEMP VIEW {table} AS SELECT *, {extra} FROM "{db}".main.{table}')
    return True


def no_runs_error(db: str | os.PathLike) -> NoRunsError:
    """The one answer to a store with no run in it, whatever kind (errors.NoRunsError): `runs`
    prints it as its listing, every other reader exits 4 with it."""
    import shlex

    where = "" if Path(db) == Path(DEFAULT_DB) else f" --db {shlex.quote(str(db))}"
    return NoRunsError(f"{db} has no runs yet", hint=f"record one with `tierdiag replay TRACE{where}`")


def _check_path(p: Path) -> None:
    """What is at `p` before DuckDB opens it: nothing (a dangling link too), a folder, a special
    file (never opened: a FIFO would block the open until a writer came), a 0-byte file (no runs).
    First, a name DuckDB would read as another file (paths.check_duckdb_name)."""
    check_duckdb_name(p)
    try:
        st = os.stat(p)
    except (FileNotFoundError, NotADirectoryError):
        try:
            there = f": it links to {os.readlink(p)}, which is not there" if p.is_symlink() else ""
        except OSError:  # gone, or replaced by a file, since the stat
            there = ""
        raise StoreError(f"no database at {p}{there}", hint="run `tierdiag replay TRACE` first, or pass --db") from None
    except OSError as exc:  # a link loop, a name too long, a folder we may not look into
        raise StoreError(f"cannot read {p}: {exc.strerror or exc}") from None
    except ValueError:  # a NUL in the name: nothing can be there
        raise StoreError(f"no database at {p}", hint="run `tierdiag replay TRACE` first, or pass --db") from None
    if stat.S_ISDIR(st.st_mode):
        raise StoreError(f"{p} is a folder, not a database file")
    if not stat.S_ISREG(st.st_mode):  # docs/contract.md §3: a FIFO or device as --db is refused (exit 2)
        raise ConfigError(f"{p} is {file_kind(st.st_mode)}, not a database file",
                          hint="pass the --db written by `tierdiag replay`")
    if st.st_size == 0:
        raise no_runs_error(p)


def open_store(path: str | os.PathLike) -> duckdb.DuckDBPyConnection:
    """Open a run store read-only after checking it is one, of our schema version. A store with
    no run in it (the file's kinds: errors.NoRunsError) is NoRunsError, except one whose schema is
    complete: its `runs` table is empty (the callers that need a run say so: `no_runs_error`)."""
    p = Path(path)
    _check_path(p)
    _last_opened.append(str(p))
    try:
        con = connect_with_retry(p, read_only=True)
    except duckdb.Error as exc:
        text = str(exc).lower()
        if is_lock_error(exc):
            # A replay holds the file only while it flushes; still held after the retries
            # means a long flush or a writer that is not ours.
            raise StoreError(f"{p} is busy: another process is writing to it{lock_holder(exc)}",
                             hint="try again in a moment, or wait for the replay to finish") from None
        if "permission denied" in text:
            raise StoreError(f"cannot read {p}: permission denied") from None
        from tierdiag.store.creating import cut_creation

        if cut_creation(p):  # a replay's creation cut inside DuckDB's header: nothing in it
            raise no_runs_error(p) from None
        damaged = damage_error(p, exc)
        if damaged is not None:
            raise damaged from None
        # DuckDB's own line names the file again: 'The file "P" exists, but it is not a valid
        # DuckDB database file!'. Any other failure keeps its line.
        why = "" if "not a valid duckdb database" in text else f" ({first_line(exc)})"
        raise StoreError(f"{p} is not a DuckDB database{why}",
                         hint="pass the --db written by `tierdiag replay`") from None
    try:
        found = _tables(con)  # once: both checks read it
        if unfinished_store(con, found):
            raise no_runs_error(p)
        version = check_store(con, path_for_errors=str(p), found=found)
        _VIEWS_SHOWN[con] = show_added_columns(con, version)
    except duckdb.Error as exc:
        con.close()
        damaged = damage_error(p, exc)
        if damaged is None:
            raise
        raise damaged from None
    except BaseException:
        con.close()
        raise
    return con


def _open_and_resolve(path: str | os.PathLike, run: str | None, db_label: str) -> tuple[duckdb.DuckDBPyConnection, RunInfo]:
    con = open_store(path)
    try:
        return con, resolve_run(con, run, db_label=db_label)
    except BaseException:
        con.close()
        raise


class PendingStore(OnThread):
    """`open_store(path)` and `resolve_run(con, run)` on a thread of their own, started at once
    (`summary` and `explain`, issue 41): DuckDB starts its database instance and opens the file,
    ~20-25 ms of C++ that holds no GIL for most of it, while the caller imports the modules that
    will answer, where one ran after the other. `result()` waits for it and returns (the
    connection, the RunInfo), or raises what opening or resolving raised (StoreError, a lock
    still held, an interrupt in the lock's wait), on the caller's thread. A daemon thread: a
    caller that stops before `result()` does not wait for it to end."""

    def __init__(self, path: str | os.PathLike, run: str | None, db_label: str):
        # DuckDB imports `datetime` (its C++, at the runs row's first TIMESTAMP) where it is not
        # yet: here, on the caller's thread, never on this one (tests/reliability/test_thread_imports.py)
        import datetime  # noqa: F401

        super().__init__(_open_and_resolve, path, run, db_label, name="tierdiag-open-store")


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# `advise` records its candidates under sweep id ADVISE_SWEEP_PREFIX + the baseline's run id
# (diagnose/advice/verify.py takes the prefix from here: the store knows what a candidate run is).
ADVISE_SWEEP_PREFIX = "advise-"


def run_kind(stored: str | None) -> RunKind | str:
    """The stored kind as a RunKind (NULL: a replay, recorded before kinds); a kind this
    tierdiag does not know (a newer store) stays its string, read as a server's run."""
    try:
        return RunKind(stored or RunKind.REPLAY)
    except ValueError:
        return str(stored)


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    name: str
    created_at: Any
    status: str  # effective: a 'running' run whose process is gone reads 'interrupted'
    tierdiag_version: str
    trace_path: str
    trace_sha256: str
    config: dict
    hardware: dict
    data_plane: dict
    timing: str
    num_requests: int
    wall_s: float | None
    command_line: str
    error: str | None = None  # why a failed run failed (one line)
    kind: RunKind | str = RunKind.REPLAY  # a str only for a kind a newer tierdiag wrote
    sweep_id: str | None = None

    def to_json(self) -> dict:
        """The runs row's own fields (a subclass's parsed extras are not part of it)."""
        d = {f.name: getattr(self, f.name) for f in fields(RunInfo)}
        d["created_at"] = str(self.created_at)
        d["kind"] = str(self.kind)
        return d


_RUN_COLS = ("r.run_id, r.name, r.created_at, r.status, r.tierdiag_version, r.trace_path, r.trace_sha256, "
             "r.config_json, r.hardware_json, r.data_plane_json, r.timing, r.num_requests, r.wall_s, "
             "r.command_line, r.pid, r.hostname, r.error, r.kind, r.sweep_id")


def _run_info(row, recorded: int) -> RunInfo:
    (run_id, name, created_at, status, version, trace_path, sha, config_json, hw_json, dp_json,
     timing, num_requests, wall_s, command_line, pid, hostname, error, kind, sweep_id) = row
    if status == "running":
        import socket  # here, for a run marked running: every reader imports this module (start-up)

        if hostname == socket.gethostname() and not _pid_alive(pid):
            # Killed (kill -9, power loss): the replay never got to write its final status.
            status = "interrupted"
    if status != "complete":
        # The runs row is updated only at the end; what a live or dead replay has flushed so
        # far is in the requests table.
        num_requests = recorded
    try:
        config, hardware, data_plane = (json.loads(text or "{}") for text in (config_json, hw_json, dp_json))
    except (ValueError, RecursionError):
        raise StoreError(f"{last_opened() or 'the database'} is damaged: run {run_id} holds a config that is "
                         "not JSON", hint="restore it from a copy") from None
    return RunInfo(run_id=run_id, name=name, created_at=created_at, status=status,
                   tierdiag_version=version, trace_path=trace_path, trace_sha256=sha,
                   config=config, hardware=hardware, data_plane=data_plane, timing=timing,
                   num_requests=int(num_requests or 0), wall_s=wall_s, command_line=command_line or "",
                   error=error, kind=run_kind(kind), sweep_id=sweep_id)


def run_info(con: duckdb.DuckDBPyConnection, run_id: str) -> RunInfo | None:
    """One run by its exact id (None if there is none), without counting every run's requests."""
    row = con.execute(f"SELECT {_RUN_COLS} FROM runs r WHERE r.run_id = ?", [run_id]).fetchall()
    if not row:
        return None
    recorded = 0
    if row[0][3] != "complete":
        recorded = con.execute("SELECT count(*) FROM requests WHERE run_id = ?", [run_id]).fetchall()[0][0]
    return _run_info(row[0], recorded)


def list_runs(con: duckdb.DuckDBPyConnection) -> list[RunInfo]:
    rows = con.execute(f"SELECT {_RUN_COLS} FROM runs r ORDER BY r.created_at, r.run_id").fetchall()
    # Requests are counted only for the runs whose runs row is not final (run_info's rule): a
    # count over every run's requests was a pass over a big store's whole table at every reader's
    # start (issue 41); one run's count reads only its own row groups.
    return [_run_info(r, 0 if r[3] == "complete" else
                      con.execute("SELECT count(*) FROM requests WHERE run_id = ?", [r[0]]).fetchall()[0][0])
            for r in rows]


def default_run(runs: list[RunInfo]) -> RunInfo:
    """The run a command without `--run` answers about: the newest run the user made (`replay`,
    `import`: no sweep id), never a candidate that `sweep` or `advise` recorded beside it. A
    store holding only sweep runs answers with the newest of them that is not an advise
    candidate, and with the newest run only where every run is one. `runs` is list_runs' (oldest
    first)."""
    for keep in (lambda r: r.sweep_id is None, lambda r: not r.sweep_id.startswith(ADVISE_SWEEP_PREFIX),
                 lambda r: True):
        chosen = [r for r in runs if keep(r)]
        if chosen:
            return chosen[-1]
    raise ValueError("default_run of no runs")


def resolve_run(con: duckdb.DuckDBPyConnection, run: str | None, *, db_label: str = "the database") -> RunInfo:
    """`run` may be a run id, a run name (the newest run of that name), or a unique prefix of
    either; None means the default run (`default_run`)."""
    runs = list_runs(con)
    if not runs:
        raise no_runs_error(db_label)
    if run is None:
        return default_run(runs)
    if run == "":  # the prefix of every id: it picked the only run (`runs --delete "$UNSET"` deleted it)
        raise StoreError(f"an empty run names no run in {db_label}",
                         hint="give a run id, a prefix of one, or a name; `tierdiag runs` lists them")
    exact = [r for r in runs if r.run_id == run]
    if exact:
        return exact[0]
    named = [r for r in runs if r.name == run]
    if named:
        return named[-1]
    prefixed = [r for r in runs if r.run_id.startswith(run)]
    if len(prefixed) == 1:
        return prefixed[0]
    names = list(dict.fromkeys(r.name for r in runs if r.name.startswith(run)))
    if not prefixed and len(names) == 1:
        return [r for r in runs if r.name == names[0]][-1]
    if len(prefixed) + len(names) > 1:
        several = [r.run_id for r in prefixed] + names
        raise StoreError(f"run {run!r} is ambiguous in {db_label}: it starts {len(several)} run ids/names "
                         f"({', '.join(several[:4])}{', ...' if len(several) > 4 else ''})",
                         hint="give more of the id, or the whole name")
    ids = [r.run_id for r in runs] + [r.name for r in runs]
    import difflib  # an error path

    close = difflib.get_close_matches(run, ids, n=3, cutoff=0.3)
    hint = f"did you mean {', '.join(close)}?" if close else "list them with `tierdiag runs`"
    raise StoreError(f"no run {run!r} in {db_label}", hint=hint)
