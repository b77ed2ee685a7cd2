"""`tierdiag export OUT_DIR`: runs as Parquet, hive-partitioned by run id."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tierdiag.cli.common import DEFAULT_DB_PATH, DbOpt, JsonOpt, RunOpt
from tierdiag.cli.sink import Sink, renders
from tierdiag.store.reader import list_runs, no_runs_error, open_store, resolve_run


def export(
    out_dir: Annotated[Path, typer.Argument(help="Folder for the Parquet files (one sub-folder a table).")],
    db: DbOpt = DEFAULT_DB_PATH,
    run: RunOpt = None,
    all_runs: Annotated[bool, typer.Option("--all", help="Every run in the database, not just one.")] = False,
    json_: JsonOpt = False,
) -> None:
    """Export runs to Parquet partitioned by run_id, for Spark, Trino or DuckDB over many runs."""
    from tierdiag.store.export import export_parquet

    with open_store(db) as con:
        runs = list_runs(con) if all_runs else [resolve_run(con, run, db_label=str(db))]
        if not runs:  # --all of a store with none: refused like every reader, DIR untouched
            raise no_runs_error(db)
        result = export_parquet(con, runs, out_dir, replace_all=all_runs, inputs=[("--db", db)])
    Sink(json=json_).emit(result)


@renders("tierdiag.store.export.ExportResult")
def _text(result, console) -> None:
    total = sum(result.rows.values())
    console.print(f"exported {len(result.run_ids)} run(s), {total:,} rows, to {result.out_dir}/<table>/run_id=<id>/",
                  markup=False, highlight=False)
