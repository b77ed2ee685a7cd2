"""The slowest cached requests of a run, grouped by burst of arrivals and primary cause, each
group's slowest explained: the report's "slowest cached requests" table, as typed results.

The ranking is `slow`'s (one rule for "slow" everywhere) and each explanation `explain`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from tierdiag.config.names import Cause, HitClass
from tierdiag.diagnose.advice import propose
from tierdiag.diagnose.request.explain import Explanation, explain_request
from tierdiag.diagnose.run.facts import run_context
from tierdiag.diagnose.read.kind import view_of
from tierdiag.diagnose.request.slow import SlowRequest, slow_requests
from tierdiag.store.reader import RunInfo

# The table groups this many of the slowest cached requests into at most SLOW_GROUPS rows; a
# gap in arrivals wider than BURST_GAP_SHARE of the span starts a new burst.
SLOW_POOL = 200
SLOW_GROUPS = 12
BURST_GAP_SHARE = 0.02


@dataclass(frozen=True)
class SlowCached:
    """One of the slowest cached requests: its `slow` row and its `explain` verdict."""

    request: SlowRequest
    explanation: Explanation


@dataclass(frozen=True)
class SlowGroup:
    """Slow cached requests of one burst of arrivals that share a primary cause."""

    cause: str
    burst: int  # 1-based, in arrival order
    num_bursts: int
    first_arrival_s: float  # s since the run's first arrival
    last_arrival_s: float
    requests: tuple[SlowRequest, ...]  # slowest first
    excess_total_ns: int
    worst: SlowCached  # the group's slowest request, explained

    @property
    def classes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.requests:
            out[r.hit_class or "?"] = out.get(r.hit_class or "?", 0) + 1
        return out


def slow_groups(con: duckdb.DuckDBPyConnection, run: RunInfo, t0_ns: int, span_ns: int, *,
                     pool: int = SLOW_POOL, limit: int = SLOW_GROUPS,
                     ctx=None) -> tuple[tuple[SlowGroup, ...], int]:
    """The slowest cached requests (device or tiered hit), grouped by burst and verdict.

    The ranking is `slow`'s (one rule for "slow" everywhere), taken per cached class and merged;
    of the `pool` slowest, a burst is a run of arrivals with no gap wider than BURST_GAP_SHARE of
    the run's span, and a group is the requests of one burst sharing a primary cause. Groups are
    ordered by their summed excess; only each group's slowest request is explained, so the
    table costs `limit` explains, however long the run. Returns the groups and how many
    requests were grouped (the pool after "none" is left out).
    """
    if not view_of(run).engine_parts:  # no engine TTFT parts to rank or explain by (diagnose/twin/observed.py)
        return (), 0
    rows = [r for cls in (HitClass.DEVICE_HIT, HitClass.TIERED_HIT)
            for r in slow_requests(con, run, top=pool, hit_class=cls)]
    rows.sort(key=lambda r: (-r.excess_ns, r.seq if r.seq is not None else -1, r.req_id))
    # "none": within the tolerance of its ideal, so not slow for any reason worth a row.
    rows = [r for r in rows if r.primary_cause != Cause.NONE][:pool]
    by_arrival = sorted(rows, key=lambda r: (r.arrival_ns, r.seq if r.seq is not None else -1))
    gap = BURST_GAP_SHARE * span_ns
    burst_of: dict[str, int] = {}
    burst, last = 0, None
    for r in by_arrival:
        if last is not None and r.arrival_ns - last > gap:
            burst += 1
        burst_of[r.req_id] = burst
        last = r.arrival_ns
    groups: dict[tuple[int, str], list[SlowRequest]] = {}
    for r in rows:  # slowest first, so each group's list is too
        groups.setdefault((burst_of[r.req_id], r.primary_cause), []).append(r)
    ranked = sorted(groups.items(), key=lambda kv: (-sum(r.excess_ns for r in kv[1]), kv[0]))
    # The run's evidence once, not once per explained request.
    if ctx is None and ranked:
        ctx = run_context(con, run, attribution=False)
    if ctx is not None:  # as summary and explain propose: the session rule's distances, the size curves
        from tierdiag.diagnose.run.facts import RunFacts

        facts = RunFacts(con, run)
        advice = propose(ctx, sessions=facts.session_pauses(), curves=facts.size_curves())
    else:
        advice = None
    out = []
    for (b, cause), members in ranked[:limit]:
        arrivals = [r.arrival_ns for r in members]
        out.append(SlowGroup(
            cause=cause, burst=b + 1, num_bursts=burst + 1 if rows else 0,
            first_arrival_s=(min(arrivals) - t0_ns) / 1e9, last_arrival_s=(max(arrivals) - t0_ns) / 1e9,
            requests=tuple(members), excess_total_ns=sum(r.excess_ns for r in members),
            worst=SlowCached(members[0], explain_request(con, run, members[0].req_id, run_ctx=ctx,
                                                               advice=advice))))
    return tuple(out), len(rows)
