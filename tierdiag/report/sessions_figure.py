"""The report's session figure: survival by pause length (diagnose/sessions.py's `SessionSummary`),
one stacked bar a pause bucket, TTFT p50 / p99 on a second axis. html.py calls it."""

from __future__ import annotations

from tierdiag.report.figures import FigureSpec
from tierdiag.report.sessions_view import TIERS


def survival_figure(sessions) -> FigureSpec | None:
    """The report's figure: one stacked bar per pause bucket (shares of the reused prefix by where
    it was found), TTFT p50 / p99 on a second axis. None for a run without session turns."""
    if sessions is None or not sessions.num_turns_with_predecessor:
        return None
    labels = [b.label for b in sessions.survival]
    data = [{"type": "bar", "name": name, "x": labels, "marker": {"color": color},
             "y": [100 * (getattr(b, attr) or 0) if b.reused_tokens else None for b in sessions.survival],
             "hovertemplate": "%{x}: %{y:.1f} % " + name + "<extra></extra>"}
            for name, attr, color in TIERS]
    for q, attr, dash in (("p50", "ttft_p50_ns", "solid"), ("p99", "ttft_p99_ns", "dot")):
        data.append({"type": "scatter", "mode": "lines+markers", "name": f"TTFT {q}", "x": labels, "yaxis": "y2",
                     "y": [None if getattr(b, attr) is None else getattr(b, attr) / 1e6 for b in sessions.survival],
                     "line": {"color": "#264653", "dash": dash}})
    layout = {"barmode": "stack", "xaxis": {"title": {"text": "pause before the turn (think_ms)"}},
              "yaxis": {"title": {"text": "share of the reused prefix"}, "range": [0, 100], "ticksuffix": " %"},
              "yaxis2": {"title": {"text": "TTFT (ms)"}, "overlaying": "y", "side": "right", "rangemode": "tozero"},
              # Above the plot: below it, a horizontal legend sits on the x-axis title.
              "legend": {"orientation": "h", "x": 0, "y": 1.02, "xanchor": "left", "yanchor": "bottom"}}
    return FigureSpec(
        key="session-survival", section="distributions", title="Did the session's prefix survive the pause?",
        how_to_read="For every later turn of a session, by its pause (think_ms): where its reused prefix (tokens "
                    "that had been cached) was found when the turn was scheduled, its recomputed part split into "
                    "lost during the pause and lost while the turn queued after arriving, and the turns' TTFT "
                    "p50/p99 (nearest rank). Red growing with the pause is the cache dropping sessions while their "
                    "users think; dark red is the queue's doing.",
        figure={"data": data, "layout": layout}, wide=True, height_px=400,
        note=f"{sessions.num_turns_with_predecessor:,} turns of {sessions.num_sessions:,} sessions, arrivals "
             f"{sessions.arrivals}")
