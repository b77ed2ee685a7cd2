"""The terminal view of a typed result, chosen by the result's type.

A command computes one result and hands it to `render`; which view draws it follows from what
the result is (an `ObservedExplanation` has its own view, an `Explanation` another), never from
how its run was made. A list (slow's rows) is drawn by the view of its elements' type. Views
load on first use: `explain` imports no slow, summary or compare view, and a command printing
--json imports none (no Rich).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Context:
    """What a view may need beside its result: the run it is about (RunInfo: its label, its
    pools) and the filters a list was cut by."""

    run: Any = None
    hit_class: str | None = None
    cause: str | None = None

    @property
    def run_label(self) -> str:
        return f"{self.run.name} ({self.run.run_id})" if self.run is not None else ""


def _explanation(r, console, ctx: Context) -> None:
    from tierdiag.report.terminal import render_explanation

    render_explanation(r, console)


def _observed_explanation(r, console, ctx: Context) -> None:
    from tierdiag.report.observed import render_observed_explanation

    render_observed_explanation(r, console)


def _summary(r, console, ctx: Context) -> None:
    from tierdiag.diagnose.run.kv_memory import run_kv_memory
    from tierdiag.report.run_lines import pool_sizes, rules_line
    from tierdiag.report.terminal import render_summary

    run = ctx.run
    pools = {tier: size["tokens"] for tier, size in pool_sizes(run.config, run.data_plane).items()} if run else None
    kv = run.data_plane.get("kv_bytes_per_token") if run else None
    render_summary(r, console, pools=pools, kv_bytes_per_token=kv if isinstance(kv, int) else None,
                   rules=rules_line(run) if run else None, memory=run_kv_memory(run) if run else None)


def _observed_summary(r, console, ctx: Context) -> None:
    from tierdiag.report.observed import render_observed_summary

    render_observed_summary(r, console)


def _slow(rows, console, ctx: Context) -> None:
    from tierdiag.report.terminal import render_slow

    render_slow(rows, console, run_label=ctx.run_label, hit_class=ctx.hit_class, cause=ctx.cause)


def _observed_slow(rows, console, ctx: Context) -> None:
    from tierdiag.report.observed import render_observed_slow

    render_observed_slow(rows, console, run_label=ctx.run_label)


def _comparison(r, console, ctx: Context) -> None:
    from tierdiag.report.compare_terminal import render_comparison

    render_comparison(r, console)


def _request_comparison(r, console, ctx: Context) -> None:
    from tierdiag.report.compare_terminal import render_request_comparison

    render_request_comparison(r, console)


def _twin_agreement(r, console, ctx: Context) -> None:
    from tierdiag.report.compare_terminal import render_twin_agreement

    render_twin_agreement(r, console)


def _twin_comparison(r, console, ctx: Context) -> None:
    from tierdiag.report.compare_terminal import render_twin_comparison

    render_twin_comparison(r, console)


def _advice(r, console, ctx: Context) -> None:
    from tierdiag.report.terminal import render_advise

    render_advise(r, console, run_label=ctx.run_label)


# the result's class name -> its view (by name, so that no result module loads to register).
VIEWS: dict[str, Callable[[Any, Any, Context], None]] = {
    "Explanation": _explanation,
    "ObservedExplanation": _observed_explanation,
    "RunSummary": _summary,
    "ObservedSummary": _observed_summary,
    "SlowRequest": _slow,
    "ObservedSlow": _observed_slow,
    "Comparison": _comparison,
    "RequestComparison": _request_comparison,
    "TwinAgreement": _twin_agreement,
    "TwinComparison": _twin_comparison,
    "AdviseResult": _advice,
}


def render(result: Any, console, *, of: type | None = None, run: Any = None, hit_class: str | None = None,
           cause: str | None = None) -> None:
    """Draw `result` on `console` with the view of its type. For a list, the view of its
    elements; an empty list has none to tell, so the caller names the element type (`of`)."""
    if isinstance(result, (list, tuple)):
        kind = type(result[0]) if result else of
        if kind is None:
            raise TypeError("render() of an empty list needs its element type (of=...)")
    else:
        kind = type(result)
    view = VIEWS.get(kind.__name__)
    if view is None:
        raise TypeError(f"no terminal view for a {kind.__name__}; known: {', '.join(VIEWS)}")
    view(result, console, Context(run=run, hit_class=hit_class, cause=cause))
