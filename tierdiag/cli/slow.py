"""`tierdiag slow`: requests ranked by excess TTFT over their ideal, with class, tier split and cause."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from tierdiag.app.views import SLOW_BY, SlowView, slow_view
from tierdiag.cli.choices import choices
from tierdiag.cli.common import DEFAULT_DB_PATH, DbOpt, JsonOpt, RunOpt
from tierdiag.cli.sink import Sink, renders
from tierdiag.diagnose.request.causes import CAUSES
from tierdiag.diagnose.request.slow import HIT_CLASSES


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
    view = slow_view(db, run, top=top, hit_class=hit_class, cause=cause, by=by)
    # --ids is a text view of its own (one id a line), and wins over --json.
    Sink(json=json_ and not ids).emit(view, ids_only=ids)


@renders(SlowView)
def _text(view: SlowView, console, *, ids_only: bool = False) -> None:
    if ids_only:
        for req_id in view.req_ids:
            console.print(req_id, markup=False, highlight=False)
        return
    if view.by == "rank":
        from tierdiag.report.slow_ranks_view import render_slow_by_rank

        render_slow_by_rank(list(view.groups), console, run_label=f"{view.run.name} ({view.run.run_id})",
                            hit_class=view.hit_class, cause=view.cause)
        return
    from tierdiag.report.views import render

    render(list(view.rows), console, of=view.row_type, run=view.run, hit_class=view.hit_class, cause=view.cause)
