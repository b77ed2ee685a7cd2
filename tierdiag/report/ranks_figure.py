"""The report's per-rank figure for a data-parallel run (diagnose/dp/ranks.py's `RankSummary`): per
rank, where its input tokens came from (stacked shares: device, host, storage, computed) and,
on a second axis, its load (prefill busy share of the run's span). html.py calls it; a run of
one rank has none."""

from __future__ import annotations

from tierdiag.report.figures import FigureSpec
from tierdiag.report.plotting import INK, TIER_COLOURS, base_axis, base_layout
from tierdiag.report.ranks_view import imbalance_line, routing_line
from tierdiag.units import fmt_ms, fmt_tokens

# (label, the RankStats token field; None: computed = input - the three)
_PARTS = (("device", "device_hit_tokens"), ("host", "host_hit_tokens"), ("storage", "storage_hit_tokens"),
          ("computed", None))
_COLOUR = {"device": TIER_COLOURS["device"], "host": TIER_COLOURS["host"], "storage": TIER_COLOURS["storage"],
           "computed": TIER_COLOURS["new"]}


def _pct(part: int, whole: int) -> float | None:
    return 100.0 * part / whole if whole else None


def ranks_figure(ranks) -> FigureSpec | None:
    if ranks is None:
        return None
    rows = list(ranks.ranks)
    labels = [f"rank {'?' if s.dp_rank is None else s.dp_rank}" for s in rows]
    data = []
    for name, field in _PARTS:
        tokens = [getattr(s, field) if field else
                  s.input_tokens - s.device_hit_tokens - s.host_hit_tokens - s.storage_hit_tokens for s in rows]
        data.append({"type": "bar", "name": f"{name} tokens", "x": labels,
                     "y": [_pct(t, s.input_tokens) for t, s in zip(tokens, rows)],
                     "customdata": tokens, "marker": {"color": _COLOUR[name]},
                     "hovertemplate": "%{x}: %{y:.1f} % of its input " + name + " (%{customdata:,} tokens)<extra></extra>"})
    data.append({"type": "scatter", "mode": "lines+markers", "name": "prefill busy (load)", "x": labels, "yaxis": "y2",
                 "y": [None if s.prefill_busy_share is None else 100.0 * s.prefill_busy_share for s in rows],
                 "customdata": [[fmt_ms(s.prefill_busy_ns), fmt_tokens(s.computed_tokens), f"{s.num_requests:,}",
                                 fmt_ms(s.ttft_p50_ns), fmt_ms(s.ttft_p90_ns)] for s in rows],
                 "line": {"color": INK}, "marker": {"size": 9},
                 "hovertemplate": ("%{x}: prefill busy %{customdata[0]} (%{y:.1f} % of the run), "
                                   "%{customdata[1]} tokens computed, %{customdata[2]} requests, "
                                   "TTFT p50 %{customdata[3]} / p90 %{customdata[4]}<extra></extra>")})
    layout = base_layout(
        barmode="stack", xaxis=base_axis(""),
        yaxis=base_axis("share of the rank's input tokens", range=[0, 100], ticksuffix=" %"),
        yaxis2={**base_axis("prefill busy, share of the run's span"), "overlaying": "y", "side": "right",
                "range": [0, 100], "ticksuffix": " %", "showgrid": False},
        margin={"l": 64, "r": 64, "t": 16, "b": 48})
    return FigureSpec(
        key="ranks", section="headline", title=f"Load and reuse per rank ({ranks.dp} ranks, router {ranks.router})",
        how_to_read="Bars: where each rank's input tokens came from (finished requests, token-weighted). Line: "
                    "how long each rank's GPU ran prefill batches, as a share of the run's span. A rank with "
                    "a high line and little green did the same prompts' work again that another rank had cached.",
        figure={"data": data, "layout": layout}, wide=True, height_px=380,
        note=f"{imbalance_line(ranks)} · {routing_line(ranks)}")
