"""`slow --by rank` in the terminal: per data-parallel rank a head line (its finished requests,
how many were slower than their ideal, their summed excess), then its slowest in `slow`'s own
table (terminal.py's, which imports ranks_view.py: so this view lives apart)."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from tierdiag.report.ranks_view import rank_label, plain_line
from tierdiag.report.terminal import render_slow
from tierdiag.units import fmt_ms


def render_slow_by_rank(groups, console: Console, *, run_label: str, hit_class: str | None = None,
                        cause: str | None = None) -> None:
    """`slow --by rank`: per rank a head line (finished, slow, summed excess), then its slowest
    in `slow`'s own table."""
    filters = ", ".join(f for f in (hit_class and f"class {hit_class}", cause and f"cause {cause}") if f)
    for g in groups:
        console.print(plain_line(
            f"rank {rank_label(g.dp_rank)}: {g.num_requests:,} finished, {g.num_slow:,} slower than their ideal"
            + (f" ({filters})" if filters else "") + f", {fmt_ms(g.excess_total_ns)} excess in all"
            + (f"; the slowest {len(g.requests)}" if g.num_slow > len(g.requests) else ""), "bold"))
        if g.requests:
            render_slow(g.requests, console, run_label=f"{run_label} · rank {rank_label(g.dp_rank)}",
                        hit_class=hit_class, cause=cause, hint=False)
    console.print(Text("explain one with `tierdiag explain REQ_ID`", style="dim"))
