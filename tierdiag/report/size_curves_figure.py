"""The report's size-curve figure: the reuse each tier would find at every size (diagnose/
size_curves.py's `SizeCurves`), one step line a tier, the run's own size and the knee marked.
html.py calls it."""

from __future__ import annotations

from tierdiag.config.names import Tier
from tierdiag.diagnose.run.size_curves import KNEE_SHARE
from tierdiag.report.figures import FigureSpec

COLORS = {"device": "#2a9d8f", "host": "#e9c46a", "storage": "#f4a261"}
DASH = {"device": "solid", "host": "solid", "storage": "dash"}  # storage often lies on host: dashed, host shows through


def size_curves_figure(curves) -> FigureSpec | None:
    """One step line per tier (reused share of input against its size, log axis from one page),
    markers at the run's size (predicted and what the run found) and at the knee. None without
    curves (the trace could not be read again)."""
    if curves is None:
        return None
    page, total = curves.page_size, curves.input_tokens or 1
    data = []
    for c in curves.curves:
        color = COLORS.get(c.tier, "#264653")
        top = max([s for s, _ in c.steps] + [c.run_size_tokens, page]) * 2
        xs = [page] + [s for s, _ in c.steps if s > page] + [top]
        data.append({"type": "scatter", "mode": "lines", "name": c.tier, "x": xs,
                     "y": [100 * c.reused_at(x) / total for x in xs], "legendgroup": c.tier,
                     "line": {"color": color, "shape": "hv", "dash": DASH.get(c.tier, "solid")},
                     "hovertemplate": f"{c.tier} %{{x:,}} tokens: %{{y:.1f}} % of input<extra></extra>"})
        own = max(c.run_size_tokens, page)
        data.append({"type": "scatter", "mode": "markers", "name": f"{c.tier}: the run's size, predicted / found",
                     "x": [own, own], "y": [100 * c.reused_at(c.run_size_tokens) / total, 100 * c.found_tokens / total],
                     "marker": {"color": color, "symbol": ["circle", "x"], "size": 10},
                     "legendgroup": c.tier, "showlegend": False,
                     "hovertemplate": f"{c.tier}, the run's size %{{x:,}}: %{{y:.1f}} %<extra></extra>"})
        if c.knee_tokens:
            data.append({"type": "scatter", "mode": "markers", "name": f"{c.tier}: knee", "x": [c.knee_tokens],
                         "y": [100 * c.reused_at(c.knee_tokens) / total],
                         "legendgroup": c.tier, "showlegend": False,
                         "marker": {"color": color, "symbol": "diamond", "size": 12, "line": {"color": "#264653",
                                                                                            "width": 1}},
                         "hovertemplate": f"{c.tier} knee %{{x:,}} tokens: %{{y:.1f}} %<extra></extra>"})
        proposed = curves.proposed_size(c.tier) if c.tier != Tier.DEVICE else None  # what advise would set
        if proposed and c.knee_tokens and proposed > c.run_size_tokens:
            data.append({"type": "scatter", "mode": "markers", "name": f"{c.tier}: proposed", "x": [proposed],
                         "y": [100 * c.reused_at(proposed) / total], "legendgroup": c.tier, "showlegend": False,
                         "marker": {"color": color, "symbol": "triangle-up", "size": 11,
                                    "line": {"color": "#264653", "width": 1}},
                         "hovertemplate": f"{c.tier}: advise proposes %{{x:,}} tokens (knee + slack): "
                                          "%{y:.1f} %<extra></extra>"})
    # One rank's pools are the run's pools: "per rank" only where there are several.
    unit = "tokens per rank; storage: the one tier" if curves.num_ranks > 1 else "tokens"
    layout = {"xaxis": {"title": {"text": f"size of the tier ({unit})"}, "type": "log"},
              "yaxis": {"title": {"text": "reused share of input"}, "range": [0, 100], "ticksuffix": " %"},
              "legend": {"orientation": "h", "x": 0, "y": 1.02, "xanchor": "left", "yanchor": "bottom"}}
    return FigureSpec(
        key="size-curves", section="distributions", title="How much would each tier find at another size?",
        how_to_read=(f"One pass over the run's page references (LRU stack distances, write policy "
                     f"{curves.write_policy}): the share of input each tier would find at each size, the tiers above "
                     "it held at the run's sizes. Circle: the model at the run's size; cross: what the run found "
                     f"there (a size of 0 drawn at one page); diamond: the knee, the smallest size adding {KNEE_SHARE * 100:.0f} % of what an "
                     "unbounded tier would add; triangle: what advise proposes for host and storage (the knee plus the median "
                     "request's prefix of slack). The model is LRU over pages, with no locks, eviction timing or "
                     "prefetch rules: where circle and cross part, so may its prediction and a replay."),
        figure={"data": data, "layout": layout}, wide=True, height_px=420,
        note=f"{curves.num_ranks} rank(s), page {page} tokens, {curves.input_tokens:,} input tokens")
