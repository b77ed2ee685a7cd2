"""`tierdiag explain REQ_ID`: the troubleshooting order for one request."""

from __future__ import annotations

from typing import Annotated

import typer

from tierdiag.cli.common import DEFAULT_DB_PATH, DbOpt, JsonOpt, RunOpt, out, print_json
from tierdiag.store.reader import open_store, resolve_run


def explain(
    req_id: Annotated[str, typer.Argument(metavar="REQ_ID", help="Request id (the trace's \"id\", else its 1-based line number).")],
    db: DbOpt = DEFAULT_DB_PATH,
    run: RunOpt = None,
    json_: JsonOpt = False,
) -> None:
    """Why was this request slow? Walks host_hit_length, prefix_indices, load_back, eviction, then the verdict."""
    with open_store(db) as con:
        info = resolve_run(con, run, db_label=str(db))
        # Which question a run of its kind can answer is diagnose's; how the answer is drawn
        # follows its type (report/views.py).
        from tierdiag.diagnose.views import explain as explain_run

        result = explain_run(con, info, req_id)
    if json_:  # no Rich for JSON
        print_json(result.to_json())
        return
    from tierdiag.report.views import render

    render(result, out, run=info)
