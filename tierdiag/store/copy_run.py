"""Move a finished run from a worker's own store into the sweep's store, unchanged.

Each sweep worker replays into a private DuckDB file through the ordinary RunWriter, so its rows
are exactly what `tierdiag replay` writes; the driver is the only writer of `--db` and copies
each run in with one transaction (a run is in the file whole or not at all). Rows travel as Arrow
tables: from a local file for the process back end, from the object store for Ray.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

import duckdb
import pyarrow as pa

from tierdiag.store.reader import connect_with_retry
from tierdiag.store.schema import EVENT_TABLES, OPTIONAL_TABLES, TABLES, create_table_sql
from tierdiag.store.writer import FINAL_WAIT_S, init_store, write_error

RUN_TABLES = ("runs",) + EVENT_TABLES  # every table that holds rows of one run


def read_run_tables(path: str | os.PathLike) -> dict[str, pa.Table]:
    """Every row of the (single) run in a worker's store, table by table."""
    con = connect_with_retry(path, read_only=True)
    try:
        tables = {t: con.sql(f"SELECT {', '.join(TABLES[t])} FROM {t}").to_arrow_table() for t in RUN_TABLES}
        for t, cols in OPTIONAL_TABLES.items():  # the run's stored evidence, where the worker wrote it
            if con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = ?", [t]).fetchall()[0][0]:
                tables[t] = con.sql(f"SELECT {', '.join(cols)} FROM {t}").to_arrow_table()
        return tables
    finally:
        con.close()


def open_destination(db: str | os.PathLike) -> duckdb.DuckDBPyConnection:
    """The sweep's store, created (or checked to be ours and current) as RunWriter does."""
    path = Path(db)
    if path.is_dir():
        from tierdiag.errors import OutputError

        raise OutputError(f"cannot write {path}: it is a folder", hint="pass a file name to --db")
    if not path.parent.is_dir():
        from tierdiag.errors import OutputError

        raise OutputError(f"cannot create {path}: folder {path.parent} does not exist",
                          hint="create it first, or pass another --db")
    try:
        con = connect_with_retry(path, read_only=False, wait_s=FINAL_WAIT_S)
    except duckdb.Error as exc:
        raise write_error(path, exc) from None
    try:
        init_store(con, path_for_errors=str(path))
    except BaseException:
        con.close()
        raise
    return con


def write_run_tables(db: str | os.PathLike, tables: Mapping[str, pa.Table],
                     run_overrides: Mapping[str, Any]) -> str:
    """Append one run's tables to `db` in one transaction; returns its run_id.

    `run_overrides` replaces columns of the runs row (sweep_id; the trace path the driver knows,
    where a Ray worker replayed a copy of it)."""
    runs = tables["runs"]
    if runs.num_rows != 1:
        raise ValueError(f"a worker store holds {runs.num_rows} runs, expected 1")
    for col, value in run_overrides.items():
        i = runs.schema.get_field_index(col)
        runs = runs.set_column(i, col, pa.array([value], type=runs.schema.field(i).type))
    run_id = runs.column("run_id")[0].as_py()
    path = Path(db)
    con = open_destination(path)
    try:
        con.execute("BEGIN")
        for table in RUN_TABLES + tuple(t for t in OPTIONAL_TABLES if t in tables):
            batch = runs if table == "runs" else tables[table]
            if batch.num_rows == 0:
                continue
            if table in OPTIONAL_TABLES:  # a store made before the table lacks it
                con.execute(create_table_sql(table, OPTIONAL_TABLES[table]))
            cols = ", ".join(TABLES.get(table) or OPTIONAL_TABLES[table])
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
