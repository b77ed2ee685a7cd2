"""`summary`'s size curves in the terminal: for each tier, the reuse the one-pass LRU model
predicts at a few sizes, the run's own size (predicted beside what the run found) and the knee,
from diagnose/run/size_curves.py's `SizeCurves` (terminal.py calls it; the report's figure is
size_curves_figure.py). No numpy or Plotly here: `summary` must not pay for them."""

from __future__ import annotations

from typing import Callable

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tierdiag.diagnose.run.size_curves import KNEE_SHARE
from tierdiag.units import fmt_pct, fmt_tokens, share

SHOWN = 6  # sizes shown a tier beside its own and its knee: every other power of two pages, up to the plateau


def shown_points(curve, page: int) -> list[tuple[int, int]]:
    """A few of the curve's points: the run's size, the knee, and powers of four pages up to the
    plateau (at most SHOWN of them, the largest kept)."""
    pts = curve.points(page)
    fixed = {curve.run_size_tokens, curve.knee_tokens}
    grid = [p for p in pts if p[0] not in fixed and p[0] and (p[0] // page).bit_length() % 2 == 1]
    grid = grid[-SHOWN:]
    keep = {p[0] for p in grid} | {s for s in fixed if s is not None}
    return [p for p in pts if p[0] in keep]


def render_size_curves(curves, console: Console, *, table: Callable[..., Table], plain: Callable[..., Text]) -> None:
    """`table` / `plain`: terminal.py's compact table and its data-as-text (never markup)."""
    if curves is None:
        return
    tab = table(f"reuse by pool size, predicted in one pass (LRU stack distances; write policy "
                f"{curves.write_policy}" + (f"; per rank, {curves.num_ranks} ranks" if curves.num_ranks > 1 else "")
                + "): reused share of input at each size")
    for col in ("tier", "run's size: predicted / found", "knee", "at size"):
        tab.add_column(col, justify="left", overflow="fold")
    for c in curves.curves:
        own = c.reused_at(c.run_size_tokens)
        knee = ("-" if c.knee_tokens is None else
                f"{fmt_tokens(c.knee_tokens)}: {fmt_pct(share(c.reused_at(c.knee_tokens), curves.input_tokens))}")
        sizes = " · ".join(f"{fmt_tokens(s)}: {fmt_pct(share(r, curves.input_tokens))}"
                           for s, r in shown_points(c, curves.page_size))
        tab.add_row(plain(c.tier), plain(f"{fmt_tokens(c.run_size_tokens)}: {fmt_pct(share(own, curves.input_tokens))}"
                                         f" / {fmt_pct(share(c.found_tokens, curves.input_tokens))}"),
                    plain(knee), plain(sizes))
    tab.caption = (f"the knee: the smallest size adding {fmt_pct(KNEE_SHARE)} of what an unbounded pool of that tier "
                   "adds to what the tiers above it find (held at the run's sizes); found: what the run's rows "
                   "found in the tier or above. "
                   f"Model: {curves.model}")
    console.print(tab)
