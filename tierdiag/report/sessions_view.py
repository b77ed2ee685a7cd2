"""`summary`'s session view in the terminal: survival by pause length and the sessions that ended
at a rejected turn, from diagnose/session/sessions.py's `SessionSummary` (terminal.py calls it; the
report's figure is sessions_figure.py). No numpy or Plotly here: `summary` must not pay for them."""

from __future__ import annotations

from typing import Callable

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tierdiag.units import fmt_ms, fmt_pct, fmt_tokens

# (name, SessionSummary's share field, the report's colour)
# The recomputed part is split (issue 40): lost during the pause, and lost while the turn queued
# after its arrival (the queue's doing, not the pause's).
TIERS = (("device", "device_share", "#2a9d8f"), ("host", "host_share", "#e9c46a"),
         ("storage", "storage_share", "#f4a261"), ("lost in the pause", "paused_lost_share", "#e76f51"),
         ("lost while queued", "queued_lost_share", "#9d0208"))


def render_sessions(sessions, console: Console, *, table: Callable[..., Table], plain: Callable[..., Text]) -> None:
    """`table` / `plain`: terminal.py's compact table and its data-as-text (never markup)."""
    if sessions is None:
        return
    n, turns = sessions.num_sessions, sessions.num_turns_with_predecessor
    head = (f"sessions: {n:,} session{'' if n == 1 else 's'}, {turns:,} later turn{'' if turns == 1 else 's'} "
            f"served, arrivals {sessions.arrivals}")
    if not turns:
        console.print(plain(head))
    else:
        tab = table(f"{head}: did the prefix survive the pause (think_ms)?")
        for col in ("pause", "turns", "reused", "dev.", "host", "stor.", "paused", "queued", "p50 TTFT", "p99"):
            tab.add_column(col, justify="left" if col == "pause" else "right", no_wrap=True)
        for b in sessions.survival:
            tab.add_row(plain(b.label), f"{b.num_turns:,}", fmt_tokens(b.reused_tokens),
                        *(fmt_pct(getattr(b, attr)) if b.reused_tokens else "-" for _, attr, _ in TIERS),
                        fmt_ms(b.ttft_p50_ns) if b.num_turns else "-", fmt_ms(b.ttft_p99_ns) if b.num_turns else "-")
        tab.caption = ("where each bucket's reused prefix (tokens that had been cached) was found at the turn's "
                       "schedule (device, host, storage), token-weighted; recomputed: lost during the pause (paused) or while the turn "
                       "queued after arriving (queued)")
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
            ended.caption = f"the first {len(sessions.ended)} listed; all are counted above"
        console.print(ended)
