"""`tierdiag runs`: the runs in a store, newest last."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from tierdiag.app.views import RunsView, runs_view
from tierdiag.cli.common import DEFAULT_DB_PATH, DbOpt, JsonOpt
from tierdiag.cli.sink import Sink, renders
from tierdiag.store.delete import DeletedRun


def runs(
    db: DbOpt = DEFAULT_DB_PATH,
    json_: JsonOpt = False,
    delete: Annotated[Optional[str], typer.Option(
        "--delete", metavar="RUN", show_default=False,
        help="Delete run RUN (an id, a unique prefix, or a name only one run has): its rows from every table, "
             "in one transaction, and its storage-tier folder.")] = None,
    keep_storage: Annotated[bool, typer.Option(
        "--keep-storage", help="With --delete: leave the run's storage folder on disk.")] = False,
) -> None:
    """List the runs recorded in the database: kind, sweep, status, pools in tokens and GiB, and
    the options that differ from the defaults (a dead replay shows as interrupted). The default
    run (what a command without --run reads: the newest replay or import, never a sweep or
    advise candidate) is marked."""
    if delete is None and keep_storage:
        raise typer.BadParameter("only means something with --delete RUN", param_hint="--keep-storage")
    if delete is not None:
        from tierdiag.store.delete import delete_run

        result = delete_run(db, delete, keep_storage=keep_storage)
    else:
        result = runs_view(db)
    Sink(json=json_).emit(result, db=db)


@renders(RunsView)
def _listing(view: RunsView, console, *, db) -> None:
    from tierdiag.report.runs_view import render_runs

    if not view.runs:  # the same line every other reader exits 4 with (store/reader.py no_runs_error)
        from tierdiag.store.reader import no_runs_error

        console.print(no_runs_error(db).one_line(), markup=False, highlight=False)
        return

    render_runs(list(view.runs), console, db_label=str(db), options=view.changes, default_run_id=view.default_run_id)
    for r in view.runs:
        if r.status == "failed" and r.error:
            console.print(f"run {r.run_id} failed: {r.error}", markup=False, highlight=False)
        elif r.status == "interrupted":
            console.print(f"run {r.run_id} was interrupted: {r.num_requests:,} requests recorded before it stopped",
                          markup=False, highlight=False)


@renders(DeletedRun)
def _deleted(d: DeletedRun, console, *, db) -> None:
    from tierdiag.units import fmt_bytes

    tables = sum(1 for n in d.rows.values() if n)
    freed = d.db_bytes_before - d.db_bytes_after
    db_part = (f"{db} {fmt_bytes(d.db_bytes_before)} -> {fmt_bytes(d.db_bytes_after)}" if freed > 0 else
               f"{db} keeps its size ({fmt_bytes(d.db_bytes_after)}; DuckDB reuses the space)")
    if d.storage_removed:
        storage = f"; removed {d.storage_dir} ({d.storage_files:,} files, {fmt_bytes(d.storage_bytes)} freed)"
    elif d.storage_dir is not None:
        storage = f"; kept {d.storage_dir} ({d.storage_kept_because})"
    else:
        storage = ""
    console.print(f"deleted run {d.run_id} ({d.name}): {d.num_rows:,} rows from {tables} tables; {db_part}{storage}",
                  markup=False, highlight=False)
