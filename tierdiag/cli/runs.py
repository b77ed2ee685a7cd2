"""`tierdiag runs`: the runs in a store, newest last."""

from __future__ import annotations

from tierdiag.cli.common import DEFAULT_DB_PATH, DbOpt, JsonOpt, out, print_json
from tierdiag.store.reader import list_runs, open_store


def runs(db: DbOpt = DEFAULT_DB_PATH, json_: JsonOpt = False) -> None:
    """List the runs recorded in the database (a dead replay shows as interrupted)."""
    with open_store(db) as con:
        infos = list_runs(con)
    if json_:
        print_json([r.to_json() for r in infos])
        return
    from tierdiag.report.terminal import render_runs

    render_runs(infos, out, db_label=str(db))
    for r in infos:
        if r.status == "failed" and r.error:
            out.print(f"run {r.run_id} failed: {r.error}", markup=False, highlight=False)
        elif r.status == "interrupted":
            out.print(f"run {r.run_id} was interrupted: {r.num_requests:,} requests recorded before it stopped",
                      markup=False, highlight=False)
