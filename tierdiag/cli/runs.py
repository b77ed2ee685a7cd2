"""`tierdiag runs`: the runs in a store, newest last."""

from __future__ import annotations

from tierdiag.cli.common import DEFAULT_DB_PATH, DbOpt, JsonOpt, out, print_json
from tierdiag.store.reader import list_runs, open_store


def runs(db: DbOpt = DEFAULT_DB_PATH, json_: JsonOpt = False) -> None:
    """List the runs recorded in the database: kind, sweep, and the options that differ from the
    defaults (a dead replay shows as interrupted)."""
    from tierdiag.diagnose.compare import changed_from_defaults
    from tierdiag.report.compare_terminal import fmt_option

    with open_store(db) as con:
        infos = list_runs(con)
    changes = {r.run_id: changed_from_defaults(r.config) for r in infos}
    if json_:
        print_json([{**r.to_json(), "changed_from_defaults": changes[r.run_id]} for r in infos])
        return
    from tierdiag.report.terminal import render_runs

    # model and gpu have their own column; the rest of what differs from the defaults is shown.
    options = {rid: ", ".join(f"{k}={fmt_option(v)}" for k, v in ch.items() if k not in ("model", "gpu"))
               for rid, ch in changes.items()}
    render_runs(infos, out, db_label=str(db), options=options)
    for r in infos:
        if r.status == "failed" and r.error:
            out.print(f"run {r.run_id} failed: {r.error}", markup=False, highlight=False)
        elif r.status == "interrupted":
            out.print(f"run {r.run_id} was interrupted: {r.num_requests:,} requests recorded before it stopped",
                      markup=False, highlight=False)
