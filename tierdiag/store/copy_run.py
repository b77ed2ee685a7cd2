"""Move whole runs between stores, unchanged, one run per transaction.

Each sweep worker replays into a private DuckDB file through the ordinary RunWriter, so its rows
are exactly what `tierdiag replay` writes; the driver is the only writer of `--db` and copies
each run in with one transaction (a run is in the file whole or not at all). Rows travel as Arrow
tables: from a local file for the process back end, from the object store for Ray.

When `--db` cannot take a finished run (another program holds it past the wait, a full disk),
the sweep keeps it in a store of its own beside `--db` (app/sweep_kept.py `kept_store_path`), an ordinary run store that
every command reads with `--db`, and `merge_store` copies its runs in later
(`tierdiag sweep --resume KEPT --db DB`): a finished run is never thrown away.

An import writes its run the same way (`write_run_tables`): the runs row and every request in one
transaction, so an import interrupted or killed while it writes leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import duckdb
import pyarrow as pa

from tierdiag.paths import duckdb_name, prepare_output_path
from tierdiag.store.reader import connect_with_retry
from tierdiag.store.schema import EVENT_TABLES, OPTIONAL_TABLES, TABLES, create_table_sql
from tierdiag.store.writer import FINAL_WAIT_S, _remove_empty, check_before_writing, init_store, write_error

RUN_TABLES = ("runs",) + EVENT_TABLES  # every table that holds rows of one run


def read_run_tables(path: str | os.PathLike, run_id: str | None = None) -> dict[str, pa.Table]:
    """Every row of one run, table by table: the store's single run (a worker's), or `run_id`'s."""
    con = connect_with_retry(path, read_only=True)
    try:
        where, params = ("", []) if run_id is None else (" WHERE run_id = ?", [run_id])
        tables = {t: con.sql(f"SELECT {', '.join(TABLES[t])} FROM {t}{where}", params=params).to_arrow_table()
                  for t in RUN_TABLES}
        for t, cols in OPTIONAL_TABLES.items():  # the run's stored evidence, where the worker wrote it
            if con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = ?", [t]).fetchall()[0][0]:
                tables[t] = con.sql(f"SELECT {', '.join(cols)} FROM {t}{where}", params=params).to_arrow_table()
        return tables
    finally:
        con.close()


def open_destination(db: str | os.PathLike, *, inputs: Iterable[tuple[str, str | os.PathLike]] = (),
                     check: bool = False, wait_s: float = FINAL_WAIT_S) -> duckdb.DuckDBPyConnection:
    """A store to write runs into, created (or checked to be ours and current) as RunWriter does.

    `inputs`: files the command reads, which the store must not be (tierdiag/paths.py). `check`:
    first read every block of an existing file back, read-only (RunWriter's check before its
    first write): a damaged or foreign file is refused before anything is written to it."""
    path = Path(db)
    prepare_output_path(path, what="--db", inputs=inputs, store=True)
    if check:
        if path.is_file() and path.stat().st_size == 0:
            _remove_empty(path)  # `touch`ed, or a creation killed before DuckDB wrote its header
        if path.exists():
            check_before_writing(path)
    try:
        con = connect_with_retry(path, read_only=False, wait_s=wait_s)
    except duckdb.Error as exc:
        raise write_error(path, exc) from None
    try:
        init_store(con, path_for_errors=str(path))
    except duckdb.Error as exc:
        con.close()
        raise write_error(path, exc) from None
    except BaseException:
        con.close()
        raise
    return con


def write_run_tables(db: str | os.PathLike, tables: Mapping[str, pa.Table],
                     run_overrides: Mapping[str, Any] | None = None, *,
                     wait_s: float = FINAL_WAIT_S) -> str:
    """Append one run's tables to `db` in one transaction; returns its run_id.

    A table may carry a subset of its columns (the rest are NULL). `run_overrides` replaces
    columns of the runs row (sweep_id; the trace path the driver knows, where a Ray worker
    replayed a copy of it)."""
    runs = tables["runs"]
    if runs.num_rows != 1:
        raise ValueError(f"a worker store holds {runs.num_rows} runs, expected 1")
    for col, value in (run_overrides or {}).items():
        i = runs.schema.get_field_index(col)
        runs = runs.set_column(i, col, pa.array([value], type=runs.schema.field(i).type))
    run_id = runs.column("run_id")[0].as_py()
    path = Path(db)
    con = open_destination(path, wait_s=wait_s)
    try:
        con.execute("BEGIN")
        for table in RUN_TABLES + tuple(t for t in OPTIONAL_TABLES if t in tables):
            batch = runs if table == "runs" else tables.get(table)
            if batch is None or batch.num_rows == 0:
                continue
            if table in OPTIONAL_TABLES:  # a store made before the table lacks it
                con.execute(create_table_sql(table, OPTIONAL_TABLES[table]))
            cols = ", ".join(c for c in (TABLES.get(table) or OPTIONAL_TABLES[table]) if c in batch.column_names)
            con.register("_tierdiag_merge", batch)
            try:
                con.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM _tierdiag_merge")
            finally:
                con.unregister("_tierdiag_merge")
        con.execute("COMMIT")
    except duckdb.Error as exc:
        raise write_error(path, exc) from None
    finally:
        con.close()
    return run_id


def store_run_ids(path: str | os.PathLike) -> list[str]:
    """The run ids of a store, oldest first."""
    con = connect_with_retry(path, read_only=True)
    try:
        return [r[0] for r in con.execute("SELECT run_id FROM runs ORDER BY created_at, run_id").fetchall()]
    finally:
        con.close()


def merge_store(kept: str | os.PathLike, db: str | os.PathLike, *, wait_s: float = FINAL_WAIT_S,
                progress: Callable[[str], None] | None = None) -> tuple[list[str], list[str]]:
    """Copy every run of the store `kept` into `db`, one transaction a run, then remove `kept`.

    A run already in `db` (a merge cut short, then resumed) is not copied twice. Returns (run ids
    copied, run ids that were there already). A failure (busy, full disk) leaves `kept` whole:
    the runs copied so far are in `db`, and a later merge takes the rest."""
    kept = Path(kept)
    ids = store_run_ids(kept)
    con = open_destination(db, inputs=[("the store to merge", kept)], wait_s=wait_s)
    try:
        present = {r[0] for r in con.execute("SELECT run_id FROM runs").fetchall()}
    finally:
        con.close()
    copied, there = [], []
    for run_id in ids:
        if run_id in present:
            there.append(run_id)
            continue
        write_run_tables(db, read_run_tables(kept, run_id), wait_s=wait_s)
        copied.append(run_id)
        if progress is not None:
            progress(run_id)
    remove_store(kept)
    return copied, there


def remove_store(path: Path) -> None:
    """A store file and its write-ahead log."""
    for p in (path, path.with_name(path.name + ".wal")):
        p.unlink(missing_ok=True)


_SOURCE = "tierdiag_src"  # the catalog name of the store a RunFileCopier copies from


class RunFileCopier:
    """Copies the single run of a store file (a sweep worker's) into another store inside DuckDB:
    both files attached to one in-memory connection kept for the copier's life, the rows moved by
    `INSERT ... SELECT`, none through Python or Arrow. The same rows, in the same transaction
    shape, as `write_run_tables(db, read_run_tables(src), overrides)` (one run per transaction),
    at less than half the cost: a 1,000-request run 0.22-0.32 s -> 0.10-0.15 s, CPU the sweep's
    driver takes from its workers on a small machine (benchmarks/README.md, issue 41). A
    connection costs ~25 ms to open, an attach ~1 ms.

        copier = RunFileCopier()
        row = copier.source(worker_store)   # {"run_id", "status", "error"}, or None: no run in it
        run_id = copier.copy(db, {"sweep_id": ...})
        copier.close()
    """

    def __init__(self) -> None:
        self._host: duckdb.DuckDBPyConnection | None = None
        self._src: Path | None = None
        self._tables: tuple[str, ...] = ()

    def source(self, src: str | os.PathLike) -> dict[str, Any] | None:
        """Attach `src` read-only (letting go of the previous source) and read its run's row;
        None when it holds no run (no runs table, or no row). A store of several runs is refused,
        as write_run_tables refuses it."""
        self._let_go_of_source()
        host = self._attach_source(Path(src))
        present = {r[0] for r in host.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = ?", [_SOURCE]).fetchall()}
        self._tables = RUN_TABLES + tuple(t for t in OPTIONAL_TABLES if t in present)
        if "runs" not in present:
            return None
        rows = host.execute(f"SELECT run_id, status, error FROM {_SOURCE}.runs").fetchall()
        if len(rows) > 1:
            raise ValueError(f"a worker store holds {len(rows)} runs, expected 1")
        return dict(zip(("run_id", "status", "error"), rows[0])) if rows else None

    def _attach_source(self, src: Path) -> duckdb.DuckDBPyConnection:
        if self._host is None:
            self._host = connect_with_retry(":memory:", read_only=False)
        quoted = duckdb_name(src).replace("'", "''")  # a literal: ATTACH takes no parameters
        self._host.execute(f"ATTACH '{quoted}' AS {_SOURCE} (READ_ONLY)")
        self._src = src
        return self._host

    def copy(self, db: str | os.PathLike, run_overrides: Mapping[str, Any] | None = None, *,
             wait_s: float = FINAL_WAIT_S) -> str:
        """Append the source's run to `db` in one transaction (created or upgraded as RunWriter
        does); `run_overrides` replaces columns of its runs row. Returns its run_id. A failure is
        the store's one-line error (write_error), `db` left as it was."""
        if self._src is None:
            raise ValueError("RunFileCopier.copy before a source")
        if self._host is None:  # let go of after a failed copy: the same source again
            self._attach_source(self._src)
        from tierdiag.store.reader import attach_with_retry, detach

        path = Path(db)
        prepare_output_path(path, what="--db", inputs=[("the store to copy", self._src)], store=True)
        overrides = dict(run_overrides or {})
        unknown = set(overrides) - set(TABLES["runs"])
        if unknown:
            raise ValueError(f"runs: columns not in the schema: {sorted(unknown)}")
        host = self._host
        try:
            attach_with_retry(host, path, wait_s=wait_s)
        except duckdb.Error as exc:
            raise write_error(path, exc) from None
        try:
            init_store(host, path_for_errors=str(path))
            run_id = host.execute(f"SELECT run_id FROM {_SOURCE}.runs").fetchall()[0][0]
            host.execute("BEGIN")
            for table in self._tables:
                cols = list(TABLES.get(table) or OPTIONAL_TABLES[table])
                if table in OPTIONAL_TABLES:  # a store made before the table lacks it
                    host.execute(create_table_sql(table, OPTIONAL_TABLES[table]))
                select, params = [], []
                for col in cols:
                    if table == "runs" and col in overrides:
                        select.append(f"CAST(? AS {TABLES['runs'][col]}) AS {col}")
                        params.append(overrides[col])
                    else:
                        select.append(col)
                host.execute(f"INSERT INTO {table} ({', '.join(cols)}) "
                             f"SELECT {', '.join(select)} FROM {_SOURCE}.{table}", params)
            host.execute("COMMIT")
            detach(host)  # checkpointed: readers may open the file now
        except duckdb.Error as exc:
            self._abandon()
            raise write_error(path, exc) from None
        except BaseException:
            self._abandon()
            raise
        return run_id

    def _abandon(self) -> None:
        """After a failed copy: the transaction rolled back and both files let go of, by closing
        the connection (a DETACH would checkpoint, and may fail as the copy did); the next copy
        attaches the same source again."""
        host, self._host = self._host, None
        if host is not None:
            with contextlib.suppress(duckdb.Error):
                host.close()

    def release_source(self) -> None:
        """Let go of the source (before its file is removed)."""
        self._let_go_of_source()

    def _let_go_of_source(self) -> None:
        if self._src is not None and self._host is not None:
            self._host.execute(f"DETACH {_SOURCE}")
        self._src = None

    def close(self) -> None:
        """Let go of the source and the connection."""
        self._abandon()
        self._src = None
