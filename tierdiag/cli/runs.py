"""`tierdiag runs`: the runs in a store, newest last."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table
from rich.text import Text

from tierdiag.cli.common import DEFAULT_DB_PATH, DbOpt, JsonOpt, out, print_json
from tierdiag.store.reader import list_runs, open_store


def runs(db: DbOpt = DEFAULT_DB_PATH, json_: JsonOpt = False) -> None:
    """List the runs recorded in the database: kind, sweep, and the options that differ from the
    defaults (a dead replay shows as interrupted)."""
    from tierdiag.diagnose.compare import changed_from_defaults
    from tierdiag.report.compare_terminal import fmt_option, wide_console

    with open_store(db) as con:
        infos = list_runs(con)
    changes = {r.run_id: changed_from_defaults(r.config) for r in infos}
    if json_:
        print_json([{**r.to_json(), "changed_from_defaults": changes[r.run_id]} for r in infos])
        return
    table = Table(title=f"runs in {db}")
    for col in ("run_id", "name", "kind", "sweep", "created", "status", "requests", "trace", "model/gpu",
                "options not at defaults", "wall"):
        table.add_column(col, no_wrap=col in ("run_id", "sweep", "created", "status"))
    for r in infos:
        # model and gpu have their own column
        options = ", ".join(f"{k}={fmt_option(v)}" for k, v in changes[r.run_id].items()
                            if k not in ("model", "gpu")) or "-"
        table.add_row(Text(r.run_id), Text(r.name), r.kind, Text(r.sweep_id or "-"), str(r.created_at)[:19],
                      r.status, f"{r.num_requests:,}", Text(Path(r.trace_path).name),
                      Text(f"{r.config.get('model', '?')}/{r.config.get('gpu', '?')}"), Text(options),
                      f"{r.wall_s:.1f}s" if r.wall_s is not None else "-")
    wide_console(out).print(table)
    for r in infos:
        if r.status == "failed" and r.error:
            out.print(f"run {r.run_id} failed: {r.error}", markup=False, highlight=False)
        elif r.status == "interrupted":
            out.print(f"run {r.run_id} was interrupted: {r.num_requests:,} requests recorded before it stopped",
                      markup=False, highlight=False)
