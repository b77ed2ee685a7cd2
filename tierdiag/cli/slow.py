"""`tierdiag slow`: requests ranked by excess TTFT over their ideal, with class, tier split and cause."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from tierdiag.cli.choices import choices
from tierdiag.cli.common import DEFAULT_DB_PATH, DbOpt, JsonOpt, RunOpt, out, print_json
from tierdiag.diagnose.causes import CAUSES
from tierdiag.diagnose.slow import HIT_CLASSES
from tierdiag.store.reader import open_store, resolve_run


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
) -> None:
    """Requests ranked by excess TTFT over their ideal (reused tokens device-resident, no queueing)."""
    with open_store(db) as con:
        info = resolve_run(con, run, db_label=str(db))
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
