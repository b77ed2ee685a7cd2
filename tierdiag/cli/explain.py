"""`tierdiag explain REQ_ID`: the troubleshooting order for one request."""

from __future__ import annotations

from typing import Annotated

from tierdiag.app.views import ExplainView, explain_view
from tierdiag.cli import common
from tierdiag.cli.common import DEFAULT_DB_PATH
from tierdiag.cli.common import typer_when_read as typer
from tierdiag.cli.sink import Sink, renders


# The annotations are read by Typer alone (`typer` and `common.DbOpt` import it when it does);
# cli/main.py calls this directly, without Typer, for the plain forms of the command line.
def explain(
    req_id: Annotated[str, typer.Argument(metavar="REQ_ID", help="Request id (the trace's \"id\", else its 1-based line number).")],
    db: common.DbOpt = DEFAULT_DB_PATH,
    run: common.RunOpt = None,
    json_: common.JsonOpt = False,
) -> None:
    """Why was this request slow? Walks host_hit_length, prefix_indices, load_back, eviction, then the verdict."""
    from tierdiag.cli.exits import leave_without_teardown

    leave_without_teardown()  # the store is closed before the view prints (as summary's: cli/summary.py)
    Sink(json=json_).emit_answer(explain_view, db, run, req_id)


@renders(ExplainView)
def _text(view: ExplainView, console) -> None:
    from tierdiag.report.views import render

    render(view.explanation, console, run=view.run)
