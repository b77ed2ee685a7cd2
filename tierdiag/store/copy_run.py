"""Move whole runs between stores, unchanged, one run per transaction.

Each sweep worker replays into a private DuckDB file through the ordinary RunWriter, so its rows
are exactly what `tierdiag replay` writes; the driver is the only writer of `--db` and copies
each run in with one transaction (a run is in the file whole or not at all). Rows travel as Arrow
tables: from a local file for the process back end, from the object store for Ray.

When `--db` cannot take a finished run (another program holds it past the wait, a full disk),
the sweep keeps it in a store of its own beside `--db` (`keep_path`), an ordinary run store that
every command reads with `--db`, and `merge_store` copies its runs in later
(`tierdiag sweep --resume KEPT --db DB`): a finished run is never thrown away.

An import writes its run the same way (`write_run_tables`): the runs row and every request in one
transaction, so an import interrupted or killed while it writes leaves nothing behind.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import duckdb
import pyarrow as pa

from tierdiag.paths import prepare_output_path
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
