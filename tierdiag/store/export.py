"""Export runs to Parquet, hive-partitioned by run (DESIGN.md §4), so a fleet's worth of runs
can be queried by any engine that reads Parquet:

    OUT/requests/run_id=20261129-.../data_0.parquet
    OUT/evictions/run_id=.../...

An export replaces what it owns in OUT and nothing else: `--all` (`replace_all`) replaces each
`OUT/<table>/` folder whole, so the partitions of runs deleted since an earlier export go (reading
OUT back never counts a run twice, nor one the store no longer has); one run replaces that run's
partition in every table, beside the other runs' partitions. The new files are written into a
folder inside OUT first and moved into place only once every table is written, so a failure
(a full disk) leaves the earlier export as it was. A table folder holding anything tierdiag did
not write (files beside its `run_id=` folders, other files inside them) is refused, untouched.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import duckdb

from tierdiag.errors import OutputError
from tierdiag.paths import check_output, duckdb_name
from tierdiag.store.reader import RunInfo
from tierdiag.store.schema import TABLES

EXPORTED = tuple(t for t in TABLES if t != "meta")
PARTITION_KEY = "run_id"
_STAGING_PREFIX = ".tierdiag-export-"


@dataclass(frozen=True)
class ExportResult:
    out_dir: str
    run_ids: tuple[str, ...]
    rows: dict[str, int]

    def to_json(self) -> dict:
        return {"out_dir": self.out_dir, "run_ids": list(self.run_ids), "rows": dict(self.rows)}


def export_parquet(con: duckdb.DuckDBPyConnection, runs: list[RunInfo], out_dir: Path, *,
                   replace_all: bool = False, inputs: Iterable[tuple[str, str | os.PathLike]] = ()) -> ExportResult:
    """Write `runs` under `out_dir` (see the module's docstring); `replace_all`: `runs` is every
    run of the store, and `out_dir` keeps no other run's partition. `inputs`: the store read
    (out_dir must not be it)."""
    out_dir = Path(out_dir)
    check_output(out_dir, what="DIR", inputs=inputs, duckdb=True)
    try:  # the rule for outputs (tierdiag/paths.py): missing folders are created
        out_dir.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # a file, a device, a link to one: not a folder to export into
        what = "a file" if out_dir.is_file() else "not a folder"
        raise OutputError(f"cannot export into {out_dir}: it is {what}", hint="pass a new or empty folder") from None
    except OSError as exc:
        raise OutputError(f"cannot create {out_dir}: {exc.strerror or exc}") from None
    for table in EXPORTED:
        _check_owned(out_dir / table)
    ids = [r.run_id for r in runs]
    placeholders = ", ".join("?" for _ in ids)
    rows: dict[str, int] = {}
    try:
        staging = Path(tempfile.mkdtemp(prefix=_STAGING_PREFIX, dir=out_dir))
    except OSError as exc:
        raise OutputError(f"cannot write {out_dir}: {exc.strerror or exc}") from None
    try:
        for table in EXPORTED:
            n = (con.execute(f"SELECT count(*) FROM {table} WHERE run_id IN ({placeholders})", ids).fetchall()[0][0]
                 if ids else 0)
            rows[table] = int(n)
            if not n:
                continue
            target = staging / table
            # Parameters are not allowed inside COPY; run ids come from the store itself, quoted.
            id_list = ", ".join("'" + i.replace("'", "''") + "'" for i in ids)
            try:
                con.execute(f"COPY (SELECT * FROM {table} WHERE run_id IN ({id_list})) TO '{_quote(duckdb_name(target, what='DIR'))}' "
                            f"(FORMAT PARQUET, PARTITION_BY ({PARTITION_KEY}))")
            except duckdb.IOException as exc:
                raise OutputError(f"cannot write {out_dir / table}: {str(exc).splitlines()[0]}") from None
        try:
            for table in EXPORTED:
                _install(staging / table, out_dir / table, ids, replace_all, staging)
        except OSError as exc:
            raise OutputError(f"cannot write {out_dir}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return ExportResult(str(out_dir), tuple(ids), rows)


def _partition(table_dir: Path, run_id: str) -> Path:
    return table_dir / f"{PARTITION_KEY}={run_id}"


def _check_owned(table_dir: Path) -> None:
    """A table folder of an earlier export: only `run_id=` folders of Parquet files."""
    if not table_dir.exists() and not table_dir.is_symlink():
        return
    if table_dir.is_symlink() or not table_dir.is_dir():
        raise OutputError(f"cannot export into {table_dir.parent}: {table_dir} is not a folder of an earlier export",
                          hint="pass an empty or new folder")
    for entry in table_dir.iterdir():
        ok = entry.name.startswith(f"{PARTITION_KEY}=") and entry.is_dir() and not entry.is_symlink() and all(
            f.suffix == ".parquet" and f.is_file() and not f.is_symlink() for f in entry.iterdir())
        if not ok:
            raise OutputError(f"cannot export into {table_dir.parent}: {entry} was not written by tierdiag export; "
                              f"not replacing it", hint="pass an empty or new folder")


def _replace(new: Path | None, old: Path, trash: Path) -> None:
    """`old` becomes `new` (or goes, for None): renamed away, renamed in, then removed."""
    gone = None
    if old.exists():
        gone = trash / f"old-{len(list(trash.iterdir()))}"
        old.rename(gone)
    if new is not None:
        new.rename(old)
    if gone is not None:
        shutil.rmtree(gone)


def _install(staged: Path, table_dir: Path, ids: list[str], replace_all: bool, trash: Path) -> None:
    have = staged if staged.is_dir() else None
    if replace_all:
        _replace(have, table_dir, trash)
        return
    table_dir.mkdir(exist_ok=True)
    for run_id in ids:
        new = _partition(staged, run_id)
        _replace(new if new.is_dir() else None, _partition(table_dir, run_id), trash)
    if not any(table_dir.iterdir()):
        table_dir.rmdir()


def _quote(path: str | Path) -> str:
    return str(path).replace("'", "''")
