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
    # Imported here, not at the top: main.py imports every command module to register it.
    from tierdiag.diagnose.explain import explain_request

    with open_store(db) as con:
        info = resolve_run(con, run, db_label=str(db))
        if info.kind == "observed":  # imported from a server: its own path (diagnose/observed.py)
            from tierdiag.diagnose.observed import explain_observed

            result = explain_observed(con, info, req_id)
        else:
            result = explain_request(con, info, req_id)
    if json_:  # no Rich for JSON
        print_json(result.to_json())
        return
    if info.kind == "observed":
        from tierdiag.report.observed import render_observed_explanation as render_explanation
    else:
        from tierdiag.report.terminal import render_explanation
    render_explanation(result, out)
