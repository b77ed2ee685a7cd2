"""`tierdiag summary`: token-weighted tier split, TTFT by class, load-backs, evictions, causes."""

from __future__ import annotations

from tierdiag.app.views import SummaryView, summary_view
from tierdiag.cli.common import DEFAULT_DB_PATH, DbOpt, JsonOpt, RunOpt
from tierdiag.cli.sink import Sink, renders


def summary(db: DbOpt = DEFAULT_DB_PATH, run: RunOpt = None, json_: JsonOpt = False) -> None:
    """One run at a glance: tokens by tier (not request counts), TTFT percentiles, load-backs, evictions."""
    Sink(json=json_).emit(summary_view(db, run))


@renders(SummaryView)
def _text(view: SummaryView, console) -> None:
    from tierdiag.report.views import render

    render(view.summary, console, run=view.run)
    if view.clock:  # replayed with a calibrate profile
        console.print(view.clock, markup=False, highlight=False)
