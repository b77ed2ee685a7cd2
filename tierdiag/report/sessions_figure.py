"""The report's session figure: survival by pause length (diagnose/session/sessions.py's `SessionSummary`),
one stacked bar a pause bucket, TTFT p50 / p99 on a second axis. html.py calls it."""

from __future__ import annotations

from tierdiag.report.figures import FigureSpec
from tierdiag.report.plotting import TimeUnit, log_time_axis
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
    # TTFT on a log axis of its own, with round ticks in one unit (plotting.log_time_axis): p50 and
    # p99 are often two orders of magnitude apart, and on a linear axis from zero the p50 line lay
    # flat on the floor, under ticks such as "0, 0.5k, 1k".
    times = [getattr(b, attr) for b in sessions.survival for attr in ("ttft_p50_ns", "ttft_p99_ns")]
    times = [t for t in times if t is not None and t > 0]
    p50s = sorted(b.ttft_p50_ns for b in sessions.survival if b.ttft_p50_ns)
    unit = _unit(p50s[len(p50s) // 2] if p50s else 0)
    for q, attr, dash in (("p50", "ttft_p50_ns", "solid"), ("p99", "ttft_p99_ns", "dot")):
        data.append({"type": "scatter", "mode": "lines+markers", "name": f"TTFT {q}", "x": labels, "yaxis": "y2",
                     "y": [None if not getattr(b, attr) else getattr(b, attr) / unit.ns for b in sessions.survival],
                     "line": {"color": "#264653", "dash": dash},
                     "hovertemplate": "%{x}: TTFT " + q + " %{y:,.3g} " + unit.label + "<extra></extra>"})
    y2 = log_time_axis(f"TTFT ({unit.label}, log scale)", times, unit)
    y2.update(overlaying="y", side="right", showgrid=False, zeroline=False)
    layout = {"barmode": "stack", "xaxis": {"title": {"text": "pause before the turn (think_ms)"}},
              "yaxis": {"title": {"text": "share of the reused prefix"}, "range": [0, 100], "ticksuffix": " %",
                        "dtick": 25},
              "yaxis2": y2,
              # Above the plot: below it, a horizontal legend sits on the x-axis title.
              "legend": {"orientation": "h", "x": 0, "y": 1.02, "xanchor": "left", "yanchor": "bottom",
                         "traceorder": "normal"}}
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


def _unit(p50_ns: float) -> TimeUnit:
    """ms, or s where the turns' median p50 is 10 s or more (µs where it is under 10 µs)."""
    if p50_ns >= 10e9:
        return TimeUnit("s", 1e9)
    if 0 < p50_ns < 10e3:
        return TimeUnit("µs", 1e3)
    return TimeUnit("ms", 1e6)
