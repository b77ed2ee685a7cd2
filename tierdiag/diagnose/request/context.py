"""The system around one request: what the GPU was doing while it waited (DESIGN §5).

A request's own TTFT parts name the proximate cause; the run around it often holds the root
cause. Prefill saturated by recomputing prefixes the cache lost shows up as *queueing* for
everyone, so `explain` needs to see the batches that ran ahead of the request.

Two results, both from the `batches` table (one row per prefill batch) and `requests`:

* `RequestContext` over [arrival - CONTEXT_LOOKBACK, first token]: queue depth at arrival,
  the share of that window the prefill GPU was busy, and the share of its prefill compute that
  recomputed once-cached tokens.
* `QueueAttribution`: the request's `queue_ns` split by what occupied the GPU meanwhile::

      arrival      held for storage      waiting                 its own batch(es)      first token
         |------ storage_wait ------|====== wait ======|====== shared batches ======|
                 (its own part)      batches ahead      the other requests' share
                                     + GPU idle gaps    of the batches it ran in

  Batch time splits by kind: `recompute` (compute of once-cached tokens), `new_compute`,
  `load_back` (exposed), `write_back` (blocking device->host copies at eviction). Idle gaps
  while it waited split into `decode` (the GPU ran decode steps: the engine records how much of
  each request's queue that was, `decode_wait_ns`), `memory_wait` (the rest of the time no
  prefill batch ran while some request was decoding: its KV held the device memory the queue
  needed; the name says what the waiting request waited for, as the verdict does),
  `storage_wait` (else some request was held for a storage prefetch) and `idle`. From the shared batches its own parts (recompute, compute, exposed load-back) are
  subtracted. The parts are rounded to whole ns by largest remainder so they sum to
  `queue_ns` exactly; `rounding_ns` says how far the float sum was from it (a few ns from
  the engine's per-batch integer truncation).

Read-only and a few small queries filtered on run_id and a time range. The whole run's context
(the same attribution summed over every request, the loss and transfer evidence) is
runcontext.py's.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Callable

import duckdb

from tierdiag.config.names import values
from tierdiag.diagnose.read.query import dataclass_json
from tierdiag.diagnose.read import request_context as read_req
from tierdiag.diagnose.read.run_context import batch_recompute_sql, running_cap, running_cap_of
from tierdiag.diagnose.request.running import at_cap_ns
from tierdiag.units import NS_PER_S, ns_to_ms, share
from tierdiag.diagnose.read.requests import RequestRow, RowLike

# Context is measured over [arrival - CONTEXT_LOOKBACK_NS, first token].
CONTEXT_LOOKBACK_NS = 1 * NS_PER_S



class WaitPart(StrEnum):
    """What the GPU did while a request queued: the parts its queue_ns splits into (`explain`'s
    queue attribution, the run story's wait), in the order they are listed."""

    RECOMPUTE = "recompute"  # other requests' once-cached tokens
    NEW_COMPUTE = "new_compute"  # other requests' new tokens
    LOAD_BACK = "load_back"  # other requests' exposed load-backs
    WRITE_BACK = "write_back"  # a batch's time beyond its compute and load-back: write-backs at eviction
    DECODE = "decode"  # decode steps (between batches)
    STORAGE_WAIT = "storage_wait"  # idle while held for a storage prefetch
    MEMORY_WAIT = "memory_wait"  # idle while decoding requests held the device memory
    IDLE = "idle"  # nothing to run


ATTRIBUTION_KEYS: tuple[str, ...] = values(WaitPart)


@dataclass(frozen=True)
class RequestContext:
    queue_depth_at_arrival: int  # requests that had arrived before it (replayed clock) and were not yet scheduled
    window_start_ns: int
    window_ns: int
    prefill_busy_ns: int  # batch time inside the window
    prefill_busy_share: float | None
    prefill_compute_ns: int
    recompute_ns: int  # of prefill_compute_ns: recomputing once-cached tokens
    recompute_share_of_prefill: float | None  # recompute_ns / prefill_compute_ns
    num_batches: int
    # Of its wait ([arrival + storage wait, first token], at most queue_ns), the time its rank ran
    # max_running_requests requests (running.py: the cap, not the GPU, held it), the cap and
    # whether it was given. In the JSON only where that time is not 0 (runs where the cap never
    # held it read as before).
    at_cap_ns: int = 0
    max_running: int | None = None
    max_running_given: bool = False

    def to_json(self) -> dict:
        d = dataclass_json(self)
        if not self.at_cap_ns:
            for k in ("at_cap_ms", "max_running", "max_running_given"):
                d.pop(k, None)
        return d


@dataclass(frozen=True)
class QueueAttribution:
    queue_ns: int
    parts_ns: dict  # ATTRIBUTION_KEYS -> ns, summing to queue_ns
    rounding_ns: float  # queue_ns - float sum before rounding
    batches_ahead: int  # batches that ran (in part) while it waited

    def share_of(self, key: str) -> float | None:
        return share(self.parts_ns.get(key, 0), self.queue_ns)

    def largest(self) -> str:
        return max(ATTRIBUTION_KEYS, key=lambda k: self.parts_ns[k])

    def to_json(self) -> dict:
        return {k: ns_to_ms(self.parts_ns[k]) for k in ATTRIBUTION_KEYS}


def scheduled_ns(row: RowLike) -> int | None:
    row = RequestRow.of(row)
    if row.first_token_ns is None or row.prefill_ns is None:
        return None
    return int(row.first_token_ns) - int(row.prefill_ns)


def _rank(row: RequestRow) -> int:
    return int(row.dp_rank or 0)


def request_context(con: duckdb.DuckDBPyConnection, run_id: str, row: RowLike, run_start_ns: int,
                    read: Callable[[str], Any] | None = None, config: dict | None = None) -> RequestContext:
    """`read`: the request's reads (read/request_reads.py `RequestReads.get`) where the caller has
    started them (explain): the queue at its arrival is taken from them; None: read here.
    `config`: the run's config as RunInfo parsed it, where the caller has it; None: read here."""
    row = RequestRow.of(row)
    arrival = int(row.arrival_ns or 0)
    end = int(row.first_token_ns) if row.first_token_ns is not None else arrival
    start = max(arrival - CONTEXT_LOOKBACK_NS, run_start_ns)
    end = max(end, start)
    rec = batch_recompute_sql(con) or "0"
    # Each batch counted by the part of it inside [start, end].
    b = read_req.window_load(con, run_id, start, end, _rank(row), rec)
    n, busy = int(b.num_batches), int(b.busy_ns or 0)
    compute, recompute = int(b.compute_ns or 0), int(b.recompute_ns or 0)
    depth, deferred = 0, read is not None and row.seq is not None  # deferred: taken last, read meanwhile
    if row.seq is not None and not deferred:
        # The replay's own queue at its replayed arrival: requests of its rank that had arrived
        # (arrival_ns, the replay's clock; at the same instant, the earlier trace line first) and
        # were scheduled after it arrived. Not the trace's order: in a closed loop a later trace
        # line can arrive first, an earlier one (a session's next turn) later (issue 40).
        depth = read_req.queue_depth_at_arrival(con, run_id, row.req_id, arrival, int(row.seq), _rank(row))
    span = end - start
    cap, given = running_cap(con, run_id) if config is None else running_cap_of(config)
    at_cap = 0
    queue = int(row.queue_ns or 0)
    if cap is not None and queue > 0 and row.first_token_ns is not None:
        w0, w1 = arrival + int(row.storage_wait_ns or 0), int(row.first_token_ns)
        at_cap = min(at_cap_ns(read_req.running_spans(con, run_id, _rank(row), w0, w1), cap, w0, w1), queue)
    if deferred and read is not None:
        depth = int(read("queue_depth"))
    return RequestContext(
        queue_depth_at_arrival=depth, window_start_ns=start, window_ns=span, prefill_busy_ns=busy,
        prefill_busy_share=share(busy, span), prefill_compute_ns=compute, recompute_ns=recompute,
        recompute_share_of_prefill=share(recompute, compute), num_batches=n,
        at_cap_ns=at_cap, max_running=cap, max_running_given=given)


def _union_measure(lo: int, hi: int, intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of [lo, hi) covered by the union of `intervals` (sorted, merged)."""
    out: list[tuple[int, int]] = []
    for a, b in sorted((max(a, lo), min(b, hi)) for a, b in intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _clip(lo: int, hi: int, merged: list[tuple[int, int]], ends: list[int]) -> list[tuple[int, int]]:
    """_union_measure(lo, hi, intervals) from `merged` = _union_measure over a span holding [lo, hi)
    (`ends`: its ends): disjoint, non-touching parts stay so when cut to [lo, hi). One merge per
    request instead of one per gap (a long wait has thousands of gaps and of others' intervals)."""
    out: list[tuple[int, int]] = []
    if hi <= lo:  # an empty gap covers nothing (queue_attribution passes none; _union_measure agrees)
        return out
    for a, b in merged[bisect_right(ends, lo):]:
        if a >= hi:
            break
        out.append((max(a, lo), min(b, hi)))
    return out


def _subtract(gap: tuple[int, int], covered: list[tuple[int, int]]) -> list[tuple[int, int]]:
    lo, hi = gap
    rest, cursor = [], lo
    for a, b in covered:
        if a > cursor:
            rest.append((cursor, a))
        cursor = max(cursor, b)
    if cursor < hi:
        rest.append((cursor, hi))
    return rest


def round_exact(raw: dict[str, float], total: int) -> dict[str, int]:
    """Whole ns summing to `total`: floor each, hand the remainder out by largest fraction
    (or take it back from the largest parts when the floats overshoot)."""
    clean = {k: max(v, 0.0) for k, v in raw.items()}
    floors = {k: int(v) for k, v in clean.items()}
    rest = total - sum(floors.values())
    order = sorted(clean, key=lambda k: (clean[k] - floors[k], clean[k]), reverse=True)
    i = 0
    while rest > 0:
        floors[order[i % len(order)]] += 1
        rest -= 1
        i += 1
    by_size = sorted(floors, key=lambda k: floors[k], reverse=True)
    while rest < 0:
        k = by_size[0]
        take = min(-rest, floors[k])
        if take == 0:
            break
        floors[k] -= take
        rest += take
        by_size = sorted(floors, key=lambda k: floors[k], reverse=True)
    return floors


def queue_attribution(con: duckdb.DuckDBPyConnection, run_id: str, row: RowLike) -> QueueAttribution | None:
    """None when the request has no TTFT or the store has no per-batch recompute time."""
    row = RequestRow.of(row)
    sched = scheduled_ns(row)
    if sched is None or row.queue_ns is None or row.ttft_ns is None:
        return None
    rec = batch_recompute_sql(con)
    if rec is None:
        return None
    arrival = int(row.arrival_ns)
    first_token = int(row.first_token_ns)
    wait_start = arrival + int(row.storage_wait_ns or 0)
    queue = int(row.queue_ns)
    batches = read_req.window_batches(con, run_id, min(wait_start, sched), first_token, _rank(row), rec)
    if not batches and queue:
        return None  # a store without batch rows (hand-built, or probes off)
    raw = dict.fromkeys(ATTRIBUTION_KEYS, 0.0)
    gaps: list[tuple[int, int]] = []
    ahead = 0

    def add(b: read_req.WindowBatch, lo: int, hi: int) -> None:
        duration = max(int(b.t_end_ns) - int(b.t_start_ns), 1)
        f = (hi - lo) / duration
        compute = int(b.compute_ns or 0)
        recompute = min(int(b.recompute_ns or 0), compute)
        exposed = int(b.loadback_exposed_ns or 0)
        raw[WaitPart.RECOMPUTE] += f * recompute
        raw[WaitPart.NEW_COMPUTE] += f * (compute - recompute)
        raw[WaitPart.LOAD_BACK] += f * exposed
        raw[WaitPart.WRITE_BACK] += f * max(duration - compute - exposed, 0)

    def walk(lo: int, hi: int, rows: list[read_req.WindowBatch]) -> None:
        cursor = lo
        for b in rows:
            s, e = max(int(b.t_start_ns), lo), min(int(b.t_end_ns), hi)
            if e <= s:
                continue
            if s > cursor:
                gaps.append((cursor, s))
            add(b, s, e)
            cursor = max(cursor, e)
        if hi > cursor:
            gaps.append((cursor, hi))

    # Held for storage until wait_start; a hold that outlasted its scheduling is none (wait_start >= sched).
    waiting = [b for b in batches if int(b.t_start_ns) < sched]
    if sched > wait_start:
        walk(wait_start, sched, waiting)
        ahead = sum(1 for b in waiting if int(b.t_end_ns) > wait_start)
    walk(sched, first_token, [b for b in batches if int(b.t_start_ns) >= sched])
    # Its own parts of the batches it ran in belong to its TTFT, not to its queue.
    raw[WaitPart.RECOMPUTE] -= int(row.recompute_ns or 0)
    raw[WaitPart.NEW_COMPUTE] -= int(row.compute_ns or 0)
    raw[WaitPart.LOAD_BACK] -= int(row.loadback_exposed_ns or 0)
    gaps = [g for g in gaps if g[1] > g[0]]
    if gaps:
        lo, hi = gaps[0][0], gaps[-1][1]
        decoding = read_req.others_decoding(con, run_id, row.req_id, lo, hi, _rank(row))
        held = read_req.others_held(con, run_id, row.req_id, lo, hi, _rank(row))
        decoding, held = _union_measure(lo, hi, decoding), _union_measure(lo, hi, held)
        decoding_ends, held_ends = [b for _, b in decoding], [b for _, b in held]
        for gap in gaps:
            dec = _clip(*gap, decoding, decoding_ends)
            raw[WaitPart.MEMORY_WAIT] += sum(b - a for a, b in dec)
            for rest in _subtract(gap, dec):
                hold = _clip(*rest, held, held_ends)
                held_ns = sum(b - a for a, b in hold)
                raw[WaitPart.STORAGE_WAIT] += held_ns
                raw[WaitPart.IDLE] += rest[1] - rest[0] - held_ns
    # The GPU running decode steps meanwhile (the engine's record, decode_wait_ns): always while
    # some request decoded, so taken out of memory_wait (NULL in runs recorded before it: 0).
    decode = min(float(row.decode_wait_ns or 0), raw[WaitPart.MEMORY_WAIT])
    raw[WaitPart.DECODE] += decode
    raw[WaitPart.MEMORY_WAIT] -= decode
    rounding = queue - sum(max(v, 0.0) for v in raw.values())
    return QueueAttribution(queue_ns=queue, parts_ns=round_exact(raw, queue), rounding_ns=rounding,
                            batches_ahead=ahead)
