"""`tierdiag compare`: runs side by side, or one request in two runs."""

from __future__ import annotations

from typing import Annotated, List, Optional

import typer

from tierdiag.app.views import CompareView, compare_view
from tierdiag.cli.common import DEFAULT_DB_PATH, DbOpt, JsonOpt
from tierdiag.cli.sink import Sink, renders

SweepOpt = Annotated[Optional[str], typer.Option("--sweep", metavar="SWEEP", help="Compare every run of this sweep (id or unique prefix).")]
ByOpt = Annotated[Optional[str], typer.Option(
    "--by", metavar="METRIC", help="Sort by: ttft_p50, ttft_p90, ttft_p99, reuse, recompute, loadback_bytes, loadback_exposed, "
                 "evictions, gpu_busy, memory, name (default: the order given; sweeps: oldest first).")]


def compare(
    runs: Annotated[Optional[List[str]], typer.Argument(help="Runs (id, unique id prefix or name).", show_default=False)] = None,
    sweep: SweepOpt = None,
    by: ByOpt = None,
    requests: Annotated[bool, typer.Option("--requests", help="Per request (same req_id) in exactly two runs: "
                                                              "largest TTFT changes and changed verdicts.")] = False,
    top: Annotated[int, typer.Option("--top", help="Requests per list with --requests.")] = 10,
    db: DbOpt = DEFAULT_DB_PATH,
    json_: JsonOpt = False,
) -> None:
    """Compare runs: the options that differ, reuse by tier, recompute share, TTFT p50/p90/p99 (all and
    per class), load-back volume and exposed time, evictions, GPU busy share. Without RUNS or --sweep:
    the newest sweep. An observed run (import sglang) with one or more replays of its trace: each
    twin's tier-split agreement, its TTFT error (all and per class) and the clock it ran on."""
    Sink(json=json_).emit(compare_view(db, list(runs or []), sweep=sweep, by=by, requests=requests, top=top))


@renders(CompareView)
def _text(view: CompareView, console) -> None:
    from tierdiag.report.views import render

    render(view.result, console)
