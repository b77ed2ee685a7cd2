"""`tierdiag runs`: the runs in a store, newest last."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from tierdiag.cli.common import DEFAULT_DB_PATH, DbOpt, JsonOpt, out, print_json
from tierdiag.store.reader import default_run, list_runs, open_store


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
    if delete is not None:
        return _delete(db, delete, keep_storage=keep_storage, json_=json_)
    if keep_storage:
        raise typer.BadParameter("only means something with --delete RUN", param_hint="--keep-storage")
    from tierdiag.diagnose.compare import changed_from_defaults
    from tierdiag.report.terminal import pool_sizes, run_kv_memory

    with open_store(db) as con:
        infos = list_runs(con)
    changes = {r.run_id: changed_from_defaults(r.config) for r in infos}
    default = default_run(infos).run_id if infos else None
    if json_:
        from tierdiag.engine.rules import recorded_rules

        print_json([{**r.to_json(), "changed_from_defaults": changes[r.run_id],
                     "sglang_rules": recorded_rules(r.config) if r.kind != "observed" else None,
                     "pools": pool_sizes(r.config, r.data_plane), "kv_memory": _memory_json(run_kv_memory(r)),
                     "default": r.run_id == default} for r in infos])
        return
    from tierdiag.report.runs_view import render_runs

    render_runs(infos, out, db_label=str(db), options=changes, default_run_id=default)
    for r in infos:
        if r.status == "failed" and r.error:
            out.print(f"run {r.run_id} failed: {r.error}", markup=False, highlight=False)
        elif r.status == "interrupted":
            out.print(f"run {r.run_id} was interrupted: {r.num_requests:,} requests recorded before it stopped",
                      markup=False, highlight=False)


def _delete(db, run: str, *, keep_storage: bool, json_: bool) -> None:
    from tierdiag.units import fmt_bytes
    from tierdiag.store.delete import delete_run

    d = delete_run(db, run, keep_storage=keep_storage)
    if json_:
        print_json(d.to_json())
        return
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
    out.print(f"deleted run {d.run_id} ({d.name}): {d.num_rows:,} rows from {tables} tables; {db_part}{storage}",
              markup=False, highlight=False)


def _memory_json(memory) -> dict | None:
    """`kv_memory`: ranks, one rank's device + host bytes, the shared storage's, and the total."""
    return None if memory is None else memory.to_json()
