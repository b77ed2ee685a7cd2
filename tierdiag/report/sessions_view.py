"""The session views: `summary`'s survival by pause length and the sessions that ended early
(terminal), and the report's survival figure (Plotly dict). Rendered from diagnose/sessions.py's
`SessionSummary`; terminal.py and html.py each call one function here."""

from __future__ import annotations

from typing import Callable

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tierdiag.report.figures import FigureSpec
from tierdiag.units import fmt_ms, fmt_pct, fmt_tokens

_TIERS = (("device", "device_share", "#2a9d8f"), ("host", "host_share", "#e9c46a"),
          ("storage", "storage_share", "#f4a261"), ("recomputed", "recomputed_share", "#e76f51"))


def render_sessions(sessions, console: Console, *, table: Callable[..., Table], plain: Callable[..., Text]) -> None:
    """`table` / `plain`: terminal.py's compact table and its data-as-text (never markup)."""
    if sessions is None:
        return
    tab = table(f"sessions: did the prefix survive the pause? ({sessions.num_sessions:,} sessions, "
                f"{sessions.num_turns_with_predecessor:,} later turns, arrivals {sessions.arrivals})")
    for col in ("pause (think_ms)", "turns", "reused tokens", "device", "host", "storage", "recomputed",
                "TTFT p50", "TTFT p99"):
        tab.add_column(col, justify="left" if col.startswith("pause") else "right", no_wrap=True)
    for b in sessions.survival:
        tab.add_row(plain(b.label), f"{b.num_turns:,}", fmt_tokens(b.reused_tokens),
                    *(fmt_pct(getattr(b, attr)) if b.reused_tokens else "-" for _, attr, _ in _TIERS),
                    fmt_ms(b.ttft_p50_ns) if b.num_turns else "-", fmt_ms(b.ttft_p99_ns) if b.num_turns else "-")
    tab.caption = "share of each bucket's reused prefix (tokens that had been cached), where the turn found it"
    console.print(tab)
    if sessions.num_ended_sessions:
        ended = table(f"sessions ended at a rejected turn: {sessions.num_ended_sessions:,}, "
                      f"{sessions.num_turns_not_served:,} later turns not served")
        ended.add_column("session", overflow="fold")
        ended.add_column("rejected turn", overflow="fold")
        ended.add_column("turns not served", justify="right", no_wrap=True)
        for e in sessions.ended:
            ended.add_row(plain(e.session_id), plain(f"{e.rejected_req_id or '?'}: {e.reject_reason or 'rejected'}"),
                          f"{e.turns_not_served:,}")
        if sessions.num_ended_sessions > len(sessions.ended):
            ended.caption = f"the first {len(sessions.ended)} listed (summary --json has them all counted)"
        console.print(ended)
        names = ", ".join(f"{e.session_id} ({e.rejected_req_id or '?'}" + ")" for e in sessions.ended[:5])
        console.print(plain(f"ended: {names}"))


def survival_figure(sessions) -> FigureSpec | None:
    """The report's figure: one stacked bar per pause bucket (shares of the reused prefix by where
    it was found), TTFT p50 / p99 on a second axis. None for a run without session turns."""
    if sessions is None or not sessions.num_turns_with_predecessor:
        return None
    labels = [b.label for b in sessions.survival]
    data = [{"type": "bar", "name": name, "x": labels, "marker": {"color": color},
             "y": [100 * (getattr(b, attr) or 0) if b.reused_tokens else None for b in sessions.survival],
             "hovertemplate": "%{x}: %{y:.1f} % " + name + "<extra></extra>"}
            for name, attr, color in _TIERS]
    for q, attr, dash in (("p50", "ttft_p50_ns", "solid"), ("p99", "ttft_p99_ns", "dot")):
        data.append({"type": "scatter", "mode": "lines+markers", "name": f"TTFT {q}", "x": labels, "yaxis": "y2",
                     "y": [None if getattr(b, attr) is None else getattr(b, attr) / 1e6 for b in sessions.survival],
                     "line": {"color": "#264653", "dash": dash}})
    layout = {"barmode": "stack", "xaxis": {"title": {"text": "pause before the turn (think_ms)"}},
              "yaxis": {"title": {"text": "share of the reused prefix"}, "range": [0, 100], "ticksuffix": " %"},
              "yaxis2": {"title": {"text": "TTFT (ms)"}, "overlaying": "y", "side": "right", "rangemode": "tozero"},
              "legend": {"orientation": "h"}}
    return FigureSpec(
        key="session-survival", section="distributions", title="Did the session's prefix survive the pause?",
        how_to_read="For every later turn of a session, by its pause (think_ms): where its reused prefix (tokens "
                    "that had been cached) was found at arrival, and the turns' TTFT p50/p99 (nearest rank). Red "
                    "growing with the pause is the cache dropping sessions while their users think.",
        figure={"data": data, "layout": layout}, wide=True, height_px=400,
        note=f"{sessions.num_turns_with_predecessor:,} turns of {sessions.num_sessions:,} sessions, arrivals "
             f"{sessions.arrivals}")
