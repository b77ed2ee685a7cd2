"""What every figure of both reports shares: the figure's spec, one colour and label per meaning
(amber is always host / load-back, purple storage, red recompute), the base layout and axes, the
unit of a time axis and round log ticks. figures.py (one run) and compare_figures.py (runs side
by side) draw on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif"
GRID = "#e9edf1"
INK = "#263238"
MUTED = "#607d8b"

TIER_COLOURS = {"device": "#2e7d32", "host": "#f9a825", "storage": "#8e24aa",
                "new": "#90a4ae", "recomputed": "#e53935"}
TIER_LABELS = {"device": "device (resident)", "host": "host (loaded back)",
               "storage": "storage (fetched, loaded back)", "new": "computed: new tokens",
               "recomputed": "computed: recomputed (was cached)"}
CLASS_COLOURS = {"device_hit": "#2e7d32", "tiered_hit": "#ef6c00", "miss": "#78909c", "all": "#37474f"}
CLASS_LABELS = {"device_hit": "device hit", "tiered_hit": "tiered hit", "miss": "miss", "all": "all requests"}
COMPONENT_COLOURS = {"queue_ns": "#5c6bc0", "storage_wait_ns": "#8e24aa", "loadback_exposed_ns": "#f9a825",
                     "recompute_ns": "#e53935", "compute_ns": "#90a4ae"}
COMPONENT_LABELS = {"queue_ns": "queueing", "storage_wait_ns": "storage fetch",
                    "loadback_exposed_ns": "exposed load-back", "recompute_ns": "recompute",
                    "compute_ns": "compute (new tokens)"}
POOL_COLOURS = {"device": "#2e7d32", "host": "#f9a825", "storage": "#8e24aa"}



@dataclass(frozen=True)
class FigureSpec:
    """One figure of the report: a Plotly figure dict plus the words around it."""

    key: str  # stable id, used for the div id
    section: str  # which report section it belongs to
    title: str
    how_to_read: str  # the one line under the title
    figure: dict[str, Any]
    note: str = ""  # e.g. "sampled: 20,000 of 120,000 requests"
    wide: bool = True  # full width, or half a row
    height_px: int = 380
    empty: bool = False  # nothing to draw (e.g. no load-backs): the page says so instead
    empty_text: str = "nothing to draw in this run"
    extra: dict[str, Any] = field(default_factory=dict)


def base_layout(**kw) -> dict[str, Any]:
    base: dict[str, Any] = {
        "font": {"family": FONT, "size": 12, "color": INK},
        "paper_bgcolor": "rgba(0,0,0,0)", "plot_bgcolor": "#ffffff",
        "margin": {"l": 64, "r": 24, "t": 16, "b": 48},
        # "normal": stacked bars otherwise list their legend bottom-up, the reverse of the colours' story.
        "legend": {"orientation": "h", "yanchor": "bottom", "y": 1.02, "xanchor": "left", "x": 0,
                   "traceorder": "normal", "itemsizing": "constant"},
        "hoverlabel": {"font": {"family": FONT}},
    }
    base.update(kw)
    return base


def base_axis(title: str = "", **kw) -> dict[str, Any]:
    a: dict[str, Any] = {"title": {"text": title}, "gridcolor": GRID, "zeroline": False,
                         "linecolor": "#cfd8dc", "ticks": "outside", "tickcolor": "#cfd8dc"}
    a.update(kw)
    return a


@dataclass(frozen=True)
class TimeUnit:
    """The unit TTFT axes use: virtual times span µs (tiny test models) to many minutes
    (an overloaded replay), and "2M ms" reads worse than "2,000 s"."""

    label: str
    ns: float

    def of(self, ns) -> np.ndarray:
        return np.asarray(ns, dtype=float) / self.ns


def fmt_tick_ns(ns: float) -> str:
    """A time as an axis tick: short, in the unit that keeps it a round number (5 ms, 2 s, 1,000 s)."""
    for unit, size in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if ns >= size:
            x = ns / size
            break
    else:
        unit, x = "ns", ns
    text = f"{x:,.0f}" if abs(x - round(x)) < 1e-6 * max(x, 1) else f"{x:.3g}"
    return f"{text} {unit}"


def log_ticks(lo: float, hi: float, fmt=fmt_tick_ns, *, min_ticks: int = 3) -> tuple[list[float], list[str]]:
    """Ticks for a log axis between lo and hi (> 0, data units): decades (1, 10, 100 ...) where
    the range spans several, else 1-2-5 steps, else 1..9, so the axis has at least `min_ticks`
    labels. Plotly's own log ticks label 2 and 5 without their decade ("5, 2, 100, 5")."""
    if not (lo > 0 and hi > 0):
        return [], []
    if hi < lo:
        lo, hi = hi, lo
    e0, e1 = int(np.floor(np.log10(lo))), int(np.ceil(np.log10(hi)))
    vals: list[float] = []
    for mantissas in ((1,), (1, 2, 5), tuple(range(1, 10))):
        vals = [m * 10.0 ** e for e in range(e0, e1 + 1) for m in mantissas]
        vals = [v for v in vals if lo * (1 - 1e-9) <= v <= hi * (1 + 1e-9)]
        if len(vals) >= min_ticks:
            break
    if len(vals) < 2:  # less than one step of 1..9 wide: the two ends
        vals = sorted({lo, hi})
    if len(vals) > 12:  # many decades: every other one
        vals = vals[::2]
    return vals, [fmt(v) for v in vals]


def log_time_axis(title: str, ns_values, unit: TimeUnit, **kw) -> dict[str, Any]:
    """A log y (or x) axis for times in `unit`, with ticks at round values and units on them."""
    v = np.asarray(ns_values, dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    axis = base_axis(title, type="log", automargin=True, **kw)
    if len(v):
        vals, text = log_ticks(float(v.min()), float(v.max()))
        axis.update(tickvals=[x / unit.ns for x in vals], ticktext=text)
    return axis
