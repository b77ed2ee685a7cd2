"""`tierdiag summary`: token-weighted tier split, TTFT by class, load-backs, evictions, causes."""

from __future__ import annotations

from tierdiag.app.views import SummaryView, summary_view
from tierdiag.cli import common
from tierdiag.cli.common import DEFAULT_DB_PATH
from tierdiag.cli.sink import Sink, renders


# The annotations are read by Typer alone (`common.DbOpt`: made with Typer when it does); cli/main.py
# calls this directly, without Typer, for the plain forms of the command line.
def summary(db: common.DbOpt = DEFAULT_DB_PATH, run: common.RunOpt = None, json_: common.JsonOpt = False) -> None:
    """One run at a glance: tokens by tier (not request counts), TTFT percentiles, load-backs, evictions."""
    _leave_without_teardown()
    Sink(json=json_).emit_answer(summary_view, db, run)


def _leave_without_teardown() -> None:
    """The read commands close the store before they print (app/views.py), so the process may end
    without the interpreter's teardown (cli/exits.py): freeing ~400 modules' objects one by one
    was ~40 ms of CPU after a ~0.3 s command's last line."""
    from tierdiag.cli.exits import leave_without_teardown

    leave_without_teardown()


@renders(SummaryView)
def _text(view: SummaryView, console) -> None:
    from tierdiag.report.views import render

    render(view.summary, console, run=view.run)
    if view.clock:  # replayed with a calibrate profile
        console.print(view.clock, markup=False, highlight=False)
