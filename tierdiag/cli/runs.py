"""`tierdiag runs`: the runs in a store, newest last."""

from __future__ import annotations

from rich.table import Table

from tierdiag.cli.common import DEFAULT_DB_PATH, DbOpt, JsonOpt, out, print_json
from tierdiag.store.reader import list_runs, open_store


def runs(db: DbOpt = DEFAULT_DB_PATH, json_: JsonOpt = False) -> None:
    """List the runs recorded in the database (a dead replay shows as interrupted)."""
    with open_store(db) as con:
        infos = list_runs(con)
    if json_:
        print_json([r.to_json() for r in infos])
        return
    from tierdiag.report.terminal import plain

    table = Table(title=plain(f"runs in {db}"))
    for col in ("run_id", "name", "created", "status", "requests", "trace", "model/gpu", "wall"):
        table.add_column(col)
    for r in infos:
        # Every cell is data (a crafted store can hold anything): never markup, controls escaped.
        table.add_row(plain(r.run_id), plain(r.name), str(r.created_at)[:19], plain(r.status), f"{r.num_requests:,}",
                      plain(r.trace_path), plain(f"{r.config.get('model', '?')}/{r.config.get('gpu', '?')}"),
                      f"{r.wall_s:.1f}s" if r.wall_s is not None else "-")
    out.print(table)
    for r in infos:
        if r.status == "failed" and r.error:
            out.print(f"run {r.run_id} failed: {r.error}", markup=False, highlight=False)
        elif r.status == "interrupted":
            out.print(f"run {r.run_id} was interrupted: {r.num_requests:,} requests recorded before it stopped",
                      markup=False, highlight=False)
