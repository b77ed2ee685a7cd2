"""`tierdiag slow`: requests ranked by excess TTFT over their ideal, with class, tier split and cause."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from tierdiag.cli.choices import choices
from tierdiag.cli.common import DEFAULT_DB_PATH, DbOpt, JsonOpt, RunOpt, out, print_json
from tierdiag.diagnose.causes import CAUSES
from tierdiag.diagnose.slow import HIT_CLASSES
from tierdiag.errors import ConfigError, unknown_name
from tierdiag.store.reader import open_store, resolve_run

SLOW_BY = ("rank",)


def slow(
    top: Annotated[int, typer.Option("--top", help="How many requests to show.")] = 20,
    hit_class: Annotated[Optional[str], typer.Option(
        "--class", **choices(HIT_CLASSES), help="Only this class.")] = None,
    cause: Annotated[Optional[str], typer.Option(
        "--cause", **choices(CAUSES), help="Only this primary cause.")] = None,
    db: DbOpt = DEFAULT_DB_PATH,
    run: RunOpt = None,
    json_: JsonOpt = False,
    ids: Annotated[bool, typer.Option("--ids", help="Print only the request ids, one a line (for scripts).")] = False,
    by: Annotated[Optional[str], typer.Option(
        "--by", **choices(SLOW_BY), help="Group the listing: rank = one group per data-parallel rank "
                                         "(replay --dp), each with its --top slowest.")] = None,
) -> None:
    """Requests ranked by excess TTFT over their ideal (reused tokens device-resident, no queueing)."""
    if by is not None and by not in SLOW_BY:
        raise unknown_name("--by grouping", by, SLOW_BY)
    with open_store(db) as con:
        info = resolve_run(con, run, db_label=str(db))
        if by == "rank":
            return _by_rank(con, info, top=top, hit_class=hit_class, cause=cause, json_=json_, ids=ids)
        # An imported run has no ideal TTFT: diagnose ranks it by TTFT (diagnose/views.py).
        from tierdiag.diagnose.views import slow as rank

        Row, rows = rank(con, info, top=top, hit_class=hit_class, cause=cause)
        if json_:
            from tierdiag.diagnose.explain import run_bounds

            t0_ns = run_bounds(con, info)[0]
    if ids:
        for r in rows:
            out.print(r.req_id, markup=False, highlight=False)
        return
    if json_:
        # Arrivals since the run's first arrival, as in `explain --json` (run_start_ms adds back).
        print_json({"run_id": info.run_id, "run_name": info.name, "top": top, "class": hit_class,
                    "cause": cause, "run_start_ms": t0_ns / 1e6,
                    "requests": [{**r.to_json(), "arrival_ms": None if r.arrival_ns is None else (r.arrival_ns - t0_ns) / 1e6}
                                 for r in rows]})
        return
    from tierdiag.report.views import render

    render(rows, out, of=Row, run=info, hit_class=hit_class, cause=cause)


def _by_rank(con, info, *, top: int, hit_class, cause, json_: bool, ids: bool) -> None:
    """`slow --by rank`: the listing cut by dp_rank (diagnose/ranks.py), a replayed run only."""
    from tierdiag.diagnose.kinds import has_engine_parts

    if not has_engine_parts(info):
        raise ConfigError(f"--by rank ranks requests by excess over their ideal; run {info.run_id} ({info.name}) "
                          f"is imported and has no ideal: use `tierdiag slow` without --by")
    from tierdiag.diagnose.explain import run_bounds
    from tierdiag.diagnose.ranks import slow_by_rank

    groups = slow_by_rank(con, info, top=top, hit_class=hit_class, cause=cause)
    if ids:
        for g in groups:
            for r in g.requests:
                out.print(r.req_id, markup=False, highlight=False)
        return
    if json_:
        t0_ns = run_bounds(con, info)[0]
        print_json({"run_id": info.run_id, "run_name": info.name, "top": top, "class": hit_class, "cause": cause,
                    "by": "rank", "run_start_ms": t0_ns / 1e6,
                    "groups": [{**g.to_json(), "requests": [
                        {**r.to_json(), "arrival_ms": None if r.arrival_ns is None else (r.arrival_ns - t0_ns) / 1e6}
                        for r in g.requests]} for g in groups]})
        return
    from tierdiag.report.slow_ranks_view import render_slow_by_rank

    render_slow_by_rank(groups, out, run_label=f"{info.name} ({info.run_id})", hit_class=hit_class, cause=cause)
