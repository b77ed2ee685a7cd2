"""Export runs to Parquet, hive-partitioned by run (DESIGN.md §4), so a fleet's worth of runs
can be queried by any engine that reads Parquet:

    OUT/requests/run_id=20261129-.../data_0.parquet
    OUT/evictions/run_id=.../...
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import duckdb

from tierdiag.errors import OutputError
from tierdiag.store.reader import RunInfo
from tierdiag.store.schema import TABLES

EXPORTED = tuple(t for t in TABLES if t != "meta")


@dataclass(frozen=True)
class ExportResult:
    out_dir: str
    run_ids: tuple[str, ...]
    rows: dict[str, int]

    def to_json(self) -> dict:
        return {"out_dir": self.out_dir, "run_ids": list(self.run_ids), "rows": dict(self.rows)}


def export_parquet(con: duckdb.DuckDBPyConnection, runs: list[RunInfo], out_dir: Path) -> ExportResult:
    out_dir = Path(out_dir)
    try:  # the rule for outputs (tierdiag/paths.py): missing folders are created
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create {out_dir}: {exc.strerror or exc}") from None
    ids = [r.run_id for r in runs]
    placeholders = ", ".join("?" for _ in ids)
    rows: dict[str, int] = {}
    for table in EXPORTED:
        n = con.execute(f"SELECT count(*) FROM {table} WHERE run_id IN ({placeholders})", ids).fetchone()[0]
        rows[table] = int(n)
        if not n:
            continue
        target = out_dir / table
        # Parameters are not allowed inside COPY; run ids come from the store itself, quoted.
        id_list = ", ".join("'" + i.replace("'", "''") + "'" for i in ids)
        try:
            con.execute(f"COPY (SELECT * FROM {table} WHERE run_id IN ({id_list})) TO '{_quote(target)}' "
                        f"(FORMAT PARQUET, PARTITION_BY (run_id), OVERWRITE_OR_IGNORE)")
        except duckdb.IOException as exc:
            raise OutputError(f"cannot write {target}: {str(exc).splitlines()[0]}") from None
    return ExportResult(str(out_dir), tuple(ids), rows)


def _quote(path: Path) -> str:
    return str(path).replace("'", "''")
