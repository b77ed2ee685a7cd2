"""Sessions: did a turn's prefix survive its pause? (`explain`'s session step, `summary`'s
survival by pause length and the sessions that ended early.)

A turn with a predecessor re-sends its session's context. When the predecessor finished, that
context had just been inserted into the tree on device (cache_finished_req); during the pause
(think_ms: the user reading, a tool running) other requests' allocations may demote it to host,
drop it, or delete its host copy. At this turn's arrival the match finds what is left:

    pause start   |================ device ================|  (the predecessor's input + output)
    arrival       |== device ==|==== host ====|-- gone --|    (evictions in between moved it)

The reused prefix of a turn is every input token that had been cached: device + host + storage
hits (used) + recomputed tokens. match_prefix finds it at the turn's schedule, which in a queue
comes after its arrival: the evictions of its prefix between the two are told apart (issue 40),
its split at arrival being the schedule's with those evictions undone, and what left every tier
while it queued is "lost while queued" (read/waiting.py), not the pause's. The survival table sums
the schedule's split per pause bucket, token-weighted like every share, its recomputed part split
into lost during the pause and lost while queued.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import duckdb

from tierdiag.diagnose.read.query import dataclass_json
from tierdiag.diagnose.request.context import scheduled_ns
from tierdiag.diagnose.read.waiting import row_lost_while_waiting, wait_moves
from tierdiag.units import fmt_ms, fmt_pct, fmt_tokens, share
from tierdiag.diagnose.read.requests import RequestRow, RowLike
from tierdiag.diagnose.read import queries
from tierdiag.diagnose.read import sessions as read

if TYPE_CHECKING:
    from tierdiag.diagnose.read.request_steps import EvictionRecord
    from tierdiag.diagnose.request.explain_result import Step

# (label, lower bound ms inclusive, upper bound ms exclusive or None)
PAUSE_BUCKETS: tuple[tuple[str, float, float | None], ...] = (
    ("< 5 s", 0.0, 5_000.0),
    ("5-30 s", 5_000.0, 30_000.0),
    ("30 s-2 min", 30_000.0, 120_000.0),
    ("2-10 min", 120_000.0, 600_000.0),
    ("> 10 min", 600_000.0, None),
)
ENDED_LISTED = 20  # sessions named in `summary` (all are counted)
SESSION_ENDED = "session_ended"  # the reject_reason prefix of a turn not served (engine/arrivals.py)

@dataclass(frozen=True)
class PauseBucket:
    """Turns whose pause (think_ms) falls in [min_think_ms, max_think_ms)."""

    label: str
    min_think_ms: float
    max_think_ms: float | None
    num_turns: int
    reused_tokens: int
    device_share: float | None  # of reused_tokens; the four add up to 1 (None: nothing reused)
    host_share: float | None
    storage_share: float | None
    recomputed_share: float | None
    ttft_p50_ns: int | None
    ttft_p99_ns: int | None
    # recomputed_share split (issue 40): lost while the turn queued (after its arrival, before its
    # schedule: read/waiting.py) and the rest, lost before it arrived (during the pause).
    paused_lost_share: float | None = None
    queued_lost_share: float | None = None

    def to_json(self) -> dict:
        return dataclass_json(self)


@dataclass(frozen=True)
class EndedSession:
    session_id: str
    rejected_req_id: str | None  # the turn whose rejection ended it
    reject_reason: str | None
    turns_not_served: int

    def to_json(self) -> dict:
        return dataclass_json(self)


@dataclass(frozen=True)
class SessionSummary:
    arrivals: str  # trace | closed: how the run's turns arrived
    num_sessions: int
    num_turns_with_predecessor: int  # finished ones (the survival table's rows)
    survival: tuple[PauseBucket, ...]
    num_ended_sessions: int
    num_turns_not_served: int
    ended: tuple[EndedSession, ...]  # the first ENDED_LISTED, by when they ended

    def to_json(self) -> dict:
        d = dataclass_json(self)
        d.pop("survival")
        return d


def arrivals_of(run) -> str:
    """The run's arrival mode as it replayed (config `arrivals`; unset: closed, the same as
    trace for a trace without sessions)."""
    return run.config.get("arrivals") or "closed"


def session_summary(con: duckdb.DuckDBPyConnection, run) -> SessionSummary | None:
    """The run's sessions; None for a run without any (a Mooncake trace, an older store)."""
    rid = run.run_id
    sessions = read.session_count(con, rid)
    if not sessions:
        return None
    by_bucket = read.pause_totals(con, rid, tuple(hi for _, _, hi in PAUSE_BUCKETS))
    buckets = []
    for i, (label, lo, hi) in enumerate(PAUSE_BUCKETS):
        r = by_bucket.get(i)
        if r is None:
            buckets.append(PauseBucket(label, lo, hi, 0, 0, None, None, None, None, None, None))
            continue
        parts = [int(v or 0) for v in (r.device_tokens, r.host_tokens, r.storage_tokens, r.recomputed_tokens)]
        reused = sum(parts)
        shares = [share(p, reused) if reused else None for p in parts]
        queued = min(int(r.queued_lost_tokens or 0), parts[3])
        buckets.append(PauseBucket(label, lo, hi, int(r.turns), reused, *shares,
                                   None if r.ttft_p50_ns is None else int(r.ttft_p50_ns),
                                   None if r.ttft_p99_ns is None else int(r.ttft_p99_ns),
                                   share(parts[3] - queued, reused) if reused else None,
                                   share(queued, reused) if reused else None))
    ended = read.ended_sessions(con, rid, SESSION_ENDED)
    return SessionSummary(
        arrivals=arrivals_of(run), num_sessions=sessions,
        num_turns_with_predecessor=sum(b.num_turns for b in buckets), survival=tuple(buckets),
        num_ended_sessions=len(ended), num_turns_not_served=sum(int(e.turns_not_served) for e in ended),
        ended=tuple(EndedSession(e.session_id, e.req_id, e.reason, int(e.turns_not_served))
                    for e in ended[:ENDED_LISTED]))


# --- explain's session step ---------------------------------------------------------------

@dataclass(frozen=True)
class PauseEviction:
    eviction_id: int
    t_ns: int  # since the run's first arrival
    tier: str
    action: str
    prefix_tokens: int  # of this turn's prefix
    cause_req_id: str | None  # whose allocation forced it


@dataclass(frozen=True)
class SessionEvidence:
    session_id: str
    arrivals: str
    previous_req_id: str | None
    previous_status: str | None
    previous_finish_ns: int | None  # since the run's first arrival
    think_ms: float
    pause_ns: int | None  # the predecessor's finish -> this arrival, in this replay
    trace_arrival_ns: int | None  # the trace's own arrival, since the run's first arrival
    reused_tokens: int
    at_pause_start_device_tokens: int
    at_arrival_device_tokens: int
    at_arrival_host_tokens: int
    at_arrival_storage_tokens: int
    at_arrival_gone_tokens: int
    evictions: tuple[PauseEviction, ...]
    # Issue 40: the match is taken at its schedule; what moved between its arrival and its
    # schedule (while it queued) is told apart. at_arrival_* above are the split at arrival (the
    # schedule's split with the wait's evictions undone); at_schedule_* what the match found.
    at_schedule_device_tokens: int = 0
    at_schedule_host_tokens: int = 0
    at_schedule_storage_tokens: int = 0
    at_schedule_gone_tokens: int = 0
    lost_while_queued_tokens: int = 0  # left every tier while it queued, recomputed (read/waiting.py)
    demoted_while_queued_tokens: int = 0  # device -> host while it queued (loaded back, not lost)
    queued_evictions: tuple[PauseEviction, ...] = ()  # the evictions of its prefix while it queued


_MOVES = {("device", "demote"): "demoted from device to host", ("device", "drop"): "dropped from device",
          ("host", "delete"): "deleted from host"}


def _move(tier: str, action: str) -> str:
    return _MOVES.get((tier, action), f"{action} ({tier})")


def session_step(con: duckdb.DuckDBPyConnection, run, row: RowLike, run_start_ns: int, number: int,
                 records: list[EvictionRecord] | None = None, previous: tuple[RequestRow | None] | None = None
                 ) -> Step | None:
    """The session step for a turn with a predecessor (its row's think_ms set), else None.
    `previous`: (queries.previous_turn's answer,) where the caller has read it (explain: beside
    the rest, read/request_reads.py); None: read here.
    `records`: the request's evictions (read/request_steps.py `request_evictions`) where the
    caller has read them (explain's step 4 has): the pause's and the wait's are taken from them."""
    from tierdiag.diagnose.read import request_steps  # explain's reads: `summary` reads this module without them

    row = RequestRow.of(row)
    if row.think_ms is None or row.session_id is None:
        return None
    rid = run.run_id
    if records is None:
        records = request_steps.request_evictions(con, rid, str(row.req_id))
    prev = previous[0] if previous is not None else queries.previous_turn(con, run, row)
    arrival = row.arrival_ns
    finish = prev.finish_ns if prev else None
    device = int(row.device_hit_tokens or 0)
    reused = device + sum(int(getattr(row, k) or 0) for k in ("host_hit_tokens", "storage_hit_tokens", "recomputed_tokens"))
    host = min(int(row.host_match_tokens or 0), reused - device)
    storage = min(int(row.storage_match_tokens or 0), reused - device - host)
    gone = reused - device - host - storage
    arrived = _undo_wait(con, rid, row, (device, host, storage, gone), records)
    prev_context = int(prev.input_tokens or 0) + int(prev.output_tokens or 0) if prev else 0
    at_start = min(reused, prev_context) if prev and prev.status == "finished" else 0

    def evictions_between(start_ns: int, end_ns: int) -> tuple[PauseEviction, ...]:
        """The evictions that took this request's pages in [start_ns, end_ns]."""
        return tuple(
            PauseEviction(int(e.eviction_id), int(e.t_ns or 0) - run_start_ns, e.tier, e.action,  # timed: kept
                          int(e.prefix_tokens or 0), e.cause_req_id)
            for e in request_steps.evictions_between(records, int(start_ns), int(end_ns)))

    evictions: tuple[PauseEviction, ...] = ()
    if finish is not None and arrival is not None:
        evictions = evictions_between(finish, arrival)
    sched = scheduled_ns(row)
    queued_evictions: tuple[PauseEviction, ...] = ()
    if arrival is not None and sched is not None and sched >= int(arrival):
        queued_evictions = evictions_between(arrival, sched)
        # The pause ends at its arrival: an eviction at that very instant is the queue's, not the pause's.
        evictions = tuple(e for e in evictions if e.t_ns + run_start_ns < int(arrival))
    pause = int(arrival) - int(finish) if finish is not None and arrival is not None else None
    trace_arrival = row.trace_arrival_ns
    ev = SessionEvidence(
        session_id=row.session_id, arrivals=arrivals_of(run), previous_req_id=prev.req_id if prev else None,
        previous_status=prev.status if prev else None,
        previous_finish_ns=int(finish) - run_start_ns if finish is not None else None,
        think_ms=float(row.think_ms), pause_ns=pause,
        trace_arrival_ns=int(trace_arrival) - run_start_ns if trace_arrival is not None else None,
        reused_tokens=reused, at_pause_start_device_tokens=at_start, at_arrival_device_tokens=arrived[0],
        at_arrival_host_tokens=arrived[1], at_arrival_storage_tokens=arrived[2], at_arrival_gone_tokens=arrived[3],
        evictions=evictions, at_schedule_device_tokens=device, at_schedule_host_tokens=host,
        at_schedule_storage_tokens=storage, at_schedule_gone_tokens=gone,
        lost_while_queued_tokens=arrived[4], demoted_while_queued_tokens=arrived[5],
        queued_evictions=queued_evictions)
    from tierdiag.diagnose.request.explain_result import Step  # explain's types: `summary` reads this module without them

    return Step(step=number, name="session", finding=session_finding(ev), evidence=ev)


def _undo_wait(con: duckdb.DuckDBPyConnection, rid: str, row: RequestRow, at_schedule: tuple[int, int, int, int],
               records: list[EvictionRecord]) -> tuple[int, int, int, int, int, int]:
    """(device, host, storage, gone) at its arrival, lost while queued, demoted while queued: the
    split its match found at its schedule with the evictions of its prefix while it queued undone
    (a demotion put back on device, a drop on device, a deletion on host; what they took is taken
    from where it was at the schedule). The lost tokens are waiting_loss's: left every tier while
    it queued, and recomputed."""
    device, host, storage, gone = at_schedule
    if row.first_token_ns is None:
        return device, host, storage, gone, 0, 0
    moves = wait_moves(records, row)
    lost = row_lost_while_waiting(con, rid, row)
    demoted = min(moves.get(("device", "demote"), 0), host + storage + gone)
    # Deletions and drops first: what left every tier while it queued was on host / device at arrival.
    deleted = min(moves.get(("host", "delete"), 0), lost)
    dropped = min(moves.get(("device", "drop"), 0), lost - deleted)
    gone -= deleted + dropped
    host += deleted
    device += dropped
    # Demotions: on device at arrival, on host (or further) at the schedule.
    back = min(demoted, host)
    host -= back
    device += back
    return device, host, storage, gone, deleted + dropped, demoted


def session_finding(ev: SessionEvidence) -> str:
    if ev.previous_req_id is None:
        return f"a turn of session {ev.session_id} whose earlier turns are not in this run."
    head = (f"turn of session {ev.session_id} after request {ev.previous_req_id}"
            + (f", which finished at {fmt_ms(ev.previous_finish_ns)}" if ev.previous_finish_ns is not None else "")
            + f"; pause {fmt_ms(ev.think_ms * 1e6)} (think_ms)")
    if ev.pause_ns is not None and ev.arrivals == "trace":
        head += f", {fmt_ms(ev.pause_ns)} in this open-loop replay"
    if ev.reused_tokens == 0:
        return head + ". It reused no cached prefix."
    # At arrival (the schedule's match with the wait's evictions undone); gone at arrival stays gone.
    split = ", ".join(f"{fmt_tokens(n)} {where}" for n, where in (
        (ev.at_arrival_device_tokens, "on device"), (ev.at_arrival_host_tokens, "on host"),
        (ev.at_arrival_storage_tokens, "in storage"), (ev.at_arrival_gone_tokens, "gone (recomputed)")) if n)
    text = (f"{head}. Its reused prefix, {fmt_tokens(ev.reused_tokens)} tokens, was "
            f"{fmt_pct(share(ev.at_pause_start_device_tokens, ev.reused_tokens))} on device when the pause began "
            f"(the previous turn had just inserted it); at this arrival: {split}.")
    if not ev.evictions:
        moved = ev.reused_tokens - ev.at_arrival_device_tokens
        text += (" No eviction during the pause moved it." if moved == 0 else
                 " No eviction recorded during the pause moved it.")
    else:
        text += f" During the pause: {_listed(ev.evictions)}."
    if ev.queued_evictions:
        at_sched = ", ".join(f"{fmt_tokens(n)} {where}" for n, where in (
            (ev.at_schedule_device_tokens, "on device"), (ev.at_schedule_host_tokens, "on host"),
            (ev.at_schedule_storage_tokens, "in storage"), (ev.at_schedule_gone_tokens, "gone (recomputed)")) if n)
        text += (f" While it queued, after its arrival: {_listed(ev.queued_evictions)}; "
                 f"{fmt_tokens(ev.lost_while_queued_tokens)} tokens were lost while it queued (recomputed) and "
                 f"{fmt_tokens(ev.demoted_while_queued_tokens)} demoted to host; at its schedule: {at_sched}.")
    return text


def _listed(evictions: tuple[PauseEviction, ...]) -> str:
    listed = "; ".join(
        f"eviction {e.eviction_id} at {fmt_ms(e.t_ns)}: {fmt_tokens(e.prefix_tokens)} tokens {_move(e.tier, e.action)}"
        + (f" by request {e.cause_req_id}'s allocation" if e.cause_req_id else "")
        for e in evictions[:5])
    return listed + (f" (and {len(evictions) - 5} more)" if len(evictions) > 5 else "")
