"""`tierdiag compare`: runs side by side, or one request in two runs."""

from __future__ import annotations

from typing import Annotated, List, Optional

import typer

from tierdiag.cli.common import DEFAULT_DB_PATH, DbOpt, JsonOpt, out, print_json
from tierdiag.errors import ConfigError

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
    from tierdiag.diagnose.compare import (check_sort_key, compare_requests, compare_runs, compare_twins,
                                           observed_and_twins, sweep_runs)
    from tierdiag.store.reader import list_runs, open_store, resolve_run

    check_sort_key(by)
    runs = list(runs or [])
    if runs and sweep:
        raise ConfigError("give RUNS or --sweep, not both")
    if requests and (sweep or len(runs) != 2):
        raise ConfigError("--requests compares exactly two runs: compare RUN_A RUN_B --requests")
    if top < 1:
        raise ConfigError(f"--top {top} must be at least 1")
    with open_store(db) as con:
        twins = None  # an observed run beside its replays: per-request agreement and TTFT error
        if len(runs) >= 2 and not sweep:
            twins = observed_and_twins([resolve_run(con, r, db_label=str(db)) for r in runs])
        if twins is not None:
            result = compare_twins(con, *twins, top=top if requests else None)
        elif requests:
            a, b = (resolve_run(con, r, db_label=str(db)) for r in runs)
            result = compare_requests(con, a, b, top=top)
        else:
            sweep_id = None
            if runs:
                infos = [resolve_run(con, r, db_label=str(db)) for r in runs]
            else:
                if sweep is None:
                    newest = [r.sweep_id for r in list_runs(con) if r.sweep_id]
                    if not newest:
                        raise ConfigError(f"no sweep in {db}: give RUNS to compare, or run `tierdiag sweep` first")
                    sweep = newest[-1]
                sweep_id, infos = sweep_runs(con, sweep, db_label=str(db))
            result = compare_runs(con, infos, by=by, sweep_id=sweep_id)
    if json_:
        print_json(result.to_json())
        return
    from tierdiag.report.views import render

    render(result, out)
