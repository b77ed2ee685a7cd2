"""Plotly figures of the comparison report, as plain figure dicts (like figures.py).

    ttft_cdf_figure       overlaid TTFT CDFs, one line per run (all requests, then each class)
    reuse_bars_figure     token-weighted reuse by tier, one stacked bar per run
    pareto_figure         memory (every rank's device + host, plus storage) against TTFT p50 / p99, with
                          the runs no other run beats on both axes joined as the frontier

A run keeps its colour in every figure (RUN_COLOURS, in the order the runs are listed).
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from tierdiag.diagnose.comparison.compare import RunRow
from tierdiag.report.plotting import CLASS_LABELS, TIER_COLOURS, TIER_LABELS, FigureSpec, TimeUnit, base_axis, base_layout

# Plotly's D3 palette without its amber/purple/red (those mean host, storage, recompute here).
RUN_COLOURS = ("#1f77b4", "#2ca02c", "#8c564b", "#17becf", "#e377c2", "#7f7f7f", "#bcbd22", "#393b79",
               "#637939", "#843c39", "#5254a3", "#6b6ecf")
CDF_POINTS = 400  # per run and class: enough for a smooth curve at any trace size
BAR_PARTS = ("device", "host", "storage", "new", "recomputed")


def run_colour(i: int) -> str:
    return RUN_COLOURS[i % len(RUN_COLOURS)]


@dataclass(frozen=True)
class RunTtfts:
    """One run's finished requests' TTFTs (ns), sorted, overall and per class."""

    run_id: str
    label: str
    by_class: dict  # "all" | device_hit | tiered_hit | miss -> sorted np.ndarray of ns


def cdf_points(sorted_ns: np.ndarray, points: int = CDF_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of the empirical CDF at most `points` long: y = share of requests with TTFT <= x.

    Picks evenly spaced ranks, always keeping the first and the last, so the tail is drawn."""
    n = len(sorted_ns)
    if n == 0:
        return np.empty(0), np.empty(0)
    ranks = np.unique(np.linspace(0, n - 1, min(points, n)).round().astype(np.int64))
    return sorted_ns[ranks].astype(float), (ranks + 1) / n


def ttft_unit_of(runs: Sequence[RunTtfts]) -> TimeUnit:
    """µs, ms or s by the median of the runs' medians (as the run report picks its unit)."""
    medians = [float(np.median(r.by_class["all"])) for r in runs if len(r.by_class.get("all", ()))]
    p50 = float(np.median(medians)) if medians else 0.0
    if p50 >= 10e9:
        return TimeUnit("s", 1e9)
    if 0 < p50 < 10e3:
        return TimeUnit("µs", 1e3)
    return TimeUnit("ms", 1e6)


def ttft_cdf_figure(runs: Sequence[RunTtfts], hit_class: str = "all") -> FigureSpec:
    unit = ttft_unit_of(runs)
    traces = []
    for i, r in enumerate(runs):
        values = r.by_class.get(hit_class, np.empty(0))
        x, y = cdf_points(values)
        if not len(x):
            continue
        traces.append({"type": "scatter", "mode": "lines", "name": _text(r.label), "x": unit.of(x), "y": y,
                       "line": {"color": run_colour(i), "width": 2, "shape": "hv"},
                       "hovertemplate": "%{fullData.name}<br>%{y:.1%} of requests within "
                                        f"%{{x:,.2f}} {unit.label}<extra></extra>"})
    wide = hit_class == "all"
    layout = base_layout(xaxis=base_axis(f"TTFT ({unit.label}, log)", type="log"),
                     yaxis=base_axis("share of requests", tickformat=".0%", range=[0, 1.02]), hovermode="closest")
    if not wide:
        layout["showlegend"] = False
    what = CLASS_LABELS[hit_class]
    return FigureSpec(
        key=f"cdf-{hit_class}", section="ttft", title=f"TTFT CDF · {what}",
        how_to_read=("a curve further left is faster; where two curves cross, one run wins the median and the "
                     "other the tail. Read p50 at 50 %, p99 near the top.") if wide else
                    f"the same curves for {what} requests only (colours as above).",
        figure={"data": traces, "layout": layout}, wide=wide, height_px=400 if wide else 300,
        empty=not traces, empty_text=f"no {what} requests in these runs")


def _text(label: str) -> str:
    """Plotly renders names and hover text as (a subset of) HTML: a run name is data, not markup.
    Hover templates show it through %{fullData.name}, never by pasting it into the template."""
    return html.escape(label, quote=False)


def reuse_bars_figure(rows: Sequence[RunRow], labels: Sequence[str]) -> FigureSpec:
    traces = []
    for part in BAR_PARTS:
        values = []
        for r in rows:
            if part == "new":
                known = [r.reuse_share, r.recompute_share]
                values.append(None if None in known else max(1.0 - known[0] - known[1], 0.0))
            else:
                values.append({"device": r.device_share, "host": r.host_share, "storage": r.storage_share,
                               "recomputed": r.recompute_share}[part])
        traces.append({"type": "bar", "orientation": "h", "name": TIER_LABELS[part], "y": [_text(v) for v in labels],
                       "x": values, "marker": {"color": TIER_COLOURS[part]},
                       "hovertemplate": f"%{{y}}<br>{TIER_LABELS[part]}: %{{x:.1%}} of input tokens<extra></extra>"})
    layout = base_layout(barmode="stack", bargap=0.3, xaxis=base_axis("share of input tokens", tickformat=".0%", range=[0, 1]),
                     yaxis=base_axis("", automargin=True, autorange="reversed", gridcolor="rgba(0,0,0,0)"),
                     margin={"l": 24, "r": 24, "t": 8, "b": 48})
    return FigureSpec(
        key="reuse-bars", section="reuse", title="Reuse by tier, per run",
        how_to_read="token-weighted over finished requests: green was resident on the GPU, amber loaded back "
                    "from host, purple fetched from storage; grey was new, red computed although it had been cached.",
        figure={"data": traces, "layout": layout}, height_px=90 + 34 * len(rows), empty=not rows)


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both axes (lower is better), by x."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    front, best_y = [], float("inf")
    for i in order:
        if points[i][1] < best_y:
            front.append(i)
            best_y = points[i][1]
    return front


def pareto_figure(rows: Sequence[RunRow], labels: Sequence[str], quantile: str, unit: TimeUnit) -> FigureSpec:
    attr = {"p50": "ttft_p50_ns", "p99": "ttft_p99_ns"}[quantile]
    have = [(i, r) for i, r in enumerate(rows) if r.memory_bytes is not None and getattr(r, attr) is not None]
    points = [(r.memory_bytes / 2**30, getattr(r, attr) / unit.ns) for _, r in have]
    traces: list[dict[str, Any]] = []
    front = pareto_front(points)
    if len(front) > 1:
        traces.append({"type": "scatter", "mode": "lines", "name": "frontier", "showlegend": False,
                       "x": [points[k][0] for k in front], "y": [points[k][1] for k in front],
                       "line": {"color": "#b0bec5", "width": 2, "dash": "dot", "shape": "hv"}, "hoverinfo": "skip"})
    for k, (i, r) in enumerate(have):
        on_front = k in front
        traces.append({"type": "scatter", "mode": "markers", "name": _text(labels[i]), "showlegend": False,
                       "x": [points[k][0]], "y": [points[k][1]],
                       "marker": {"color": run_colour(i), "size": 13 if on_front else 10,
                                  "symbol": "circle" if on_front else "circle-open", "line": {"width": 2}},
                       "hovertemplate": f"%{{fullData.name}}<br>memory %{{x:,.2f}} GiB<br>TTFT {quantile} "
                                        f"%{{y:,.2f}} {unit.label}" + ("<br>on the frontier" if on_front else "")
                                        + "<extra></extra>"})
    layout = base_layout(xaxis=base_axis("KV memory in all: every rank's device + host, plus storage (GiB)", rangemode="tozero"),
                     yaxis=base_axis(f"TTFT {quantile} ({unit.label})", rangemode="tozero"), hovermode="closest")
    return FigureSpec(
        key=f"pareto-{quantile}", section="pareto", title=f"Memory vs TTFT {quantile}",
        how_to_read="down and to the left is better. Filled points are on the frontier (no run is both "
                    "smaller and faster); an open point pays for memory it does not turn into speed.",
        figure={"data": traces, "layout": layout}, wide=False, height_px=360, empty=not have,
        empty_text="no run records its memory (model preset and pool sizes)")
