"""Files a writer must refuse before writing into them (store/writer.py `check_before_writing`):
another's DuckDB file, a store of a newer schema, a truncated store. Each makes `path`; `store`
is a good run store to start from."""

from __future__ import annotations

import os
import shutil

import duckdb

from tierdiag.store.schema import SCHEMA_VERSION


def foreign(path, store=None) -> None:
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE measurements (t BIGINT)")


def newer(path, store) -> None:
    shutil.copy(store, path)
    with duckdb.connect(str(path)) as con:
        con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION + 1)])


def truncated(path, store) -> None:
    shutil.copy(store, path)
    os.truncate(path, os.path.getsize(path) // 2)
