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
  while it waited split into `decode` (some request was decoding: its KV held the device
  memory the queue needed; decode runs beside prefill in this engine, so it takes memory,
  not prefill time), `storage_wait` (else some request was held for a storage prefetch) and
  `idle`. From the shared batches its own parts (recompute, compute, exposed load-back) are
  subtracted. The parts are rounded to whole ns by largest remainder so they sum to
  `queue_ns` exactly; `rounding_ns` says how far the float sum was from it (a few ns from
  the engine's per-batch integer truncation).

Read-only and a few small queries filtered on run_id and a time range.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from tierdiag.diagnose.causes import excess_sql
from tierdiag.diagnose.query import dataclass_json, fetch_dicts, link_peak_bytes_per_s
from tierdiag.diagnose.sql import FINISHED_SQL as _FINISHED
from tierdiag.diagnose.sql import span_columns_sql
from tierdiag.units import NS_PER_S, ns_to_ms, share

# Context is measured over [arrival - CONTEXT_LOOKBACK_NS, first token].
CONTEXT_LOOKBACK_NS = 1 * NS_PER_S

ATTRIBUTION_KEYS: tuple[str, ...] = ("recompute", "new_compute", "load_back", "write_back", "storage_wait",
                                     "decode", "idle")
_BATCH_KINDS = ("recompute", "new_compute", "load_back", "write_back")


@dataclass(frozen=True)
class RequestContext:
    queue_depth_at_arrival: int  # requests that had arrived before it and were not yet scheduled
    window_start_ns: int
    window_ns: int
    prefill_busy_ns: int  # batch time inside the window
    prefill_busy_share: float | None
    prefill_compute_ns: int
    recompute_ns: int  # of prefill_compute_ns: recomputing once-cached tokens
    recompute_share_of_prefill: float | None  # recompute_ns / prefill_compute_ns
    num_batches: int

    def to_json(self) -> dict:
        d = dataclass_json(self)
        return d


@dataclass(frozen=True)
class QueueAttribution:
    queue_ns: int
    parts_ns: dict  # ATTRIBUTION_KEYS -> ns, summing to queue_ns
    rounding_ns: float  # queue_ns - float sum before rounding
    batches_ahead: int  # batches that ran (in part) while it waited

    def share_of(self, key: str) -> float | None:
        return share(self.parts_ns.get(key, 0), self.queue_ns)

    def gpu_work_ns(self) -> int:
        return sum(self.parts_ns[k] for k in _BATCH_KINDS)

    def largest(self) -> str:
        return max(ATTRIBUTION_KEYS, key=lambda k: self.parts_ns[k])

    def to_json(self) -> dict:
        return {k: ns_to_ms(self.parts_ns[k]) for k in ATTRIBUTION_KEYS}


def _has_column(con: duckdb.DuckDBPyConnection, table: str, column: str) -> bool:
    # The columns of an empty result: ~0.3 ms, where information_schema takes 2-10 ms.
    return column in (d[0] for d in con.execute(f"SELECT * FROM {table} LIMIT 0").description)


def batch_recompute_sql(con: duckdb.DuckDBPyConnection) -> str | None:
    """`recompute_ns` of a batch, or None for stores written before batches recorded it."""
    return "recompute_ns" if _has_column(con, "batches", "recompute_ns") else None


def scheduled_ns(row: dict) -> int | None:
    if row.get("first_token_ns") is None or row.get("prefill_ns") is None:
        return None
    return int(row["first_token_ns"]) - int(row["prefill_ns"])


def request_context(con: duckdb.DuckDBPyConnection, run_id: str, row: dict, run_start_ns: int) -> RequestContext:
    arrival = int(row.get("arrival_ns") or 0)
    end = int(row["first_token_ns"]) if row.get("first_token_ns") is not None else arrival
    start = max(arrival - CONTEXT_LOOKBACK_NS, run_start_ns)
    end = max(end, start)
    rec = batch_recompute_sql(con) or "0"
    # Each batch counted by the part of it inside [start, end].
    b = con.execute(
        f"""SELECT count(*),
                   coalesce(sum(least(t_end_ns, $e) - greatest(t_start_ns, $s)), 0),
                   coalesce(sum(compute_ns::DOUBLE * (least(t_end_ns, $e) - greatest(t_start_ns, $s))
                                / greatest(t_end_ns - t_start_ns, 1)), 0),
                   coalesce(sum({rec}::DOUBLE * (least(t_end_ns, $e) - greatest(t_start_ns, $s))
                                / greatest(t_end_ns - t_start_ns, 1)), 0)
            FROM batches WHERE run_id = $r AND t_end_ns > $s AND t_start_ns < $e""",
        {"r": run_id, "s": start, "e": end}).fetchone()
    n, busy, compute, recompute = int(b[0]), int(b[1] or 0), int(b[2] or 0), int(b[3] or 0)
    depth = 0
    if row.get("seq") is not None:
        depth = int(con.execute(
            "SELECT count(*) FROM requests WHERE run_id = ? AND seq < ? AND arrival_ns <= ? "
            "AND status = 'finished' AND first_token_ns - prefill_ns > ?",
            [run_id, int(row["seq"]), arrival, arrival]).fetchone()[0])
    span = end - start
    return RequestContext(
        queue_depth_at_arrival=depth, window_start_ns=start, window_ns=span, prefill_busy_ns=busy,
        prefill_busy_share=share(busy, span), prefill_compute_ns=compute, recompute_ns=recompute,
        recompute_share_of_prefill=share(recompute, compute), num_batches=n)


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


def _round_exact(raw: dict[str, float], total: int) -> dict[str, int]:
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


def queue_attribution(con: duckdb.DuckDBPyConnection, run_id: str, row: dict) -> QueueAttribution | None:
    """None when the request has no TTFT or the store has no per-batch recompute time."""
    sched = scheduled_ns(row)
    if sched is None or row.get("queue_ns") is None or row.get("ttft_ns") is None:
        return None
    rec = batch_recompute_sql(con)
    if rec is None:
        return None
    arrival = int(row["arrival_ns"])
    first_token = int(row["first_token_ns"])
    wait_start = arrival + int(row.get("storage_wait_ns") or 0)
    queue = int(row["queue_ns"])
    batches = fetch_dicts(
        con,
        f"SELECT t_start_ns, t_end_ns, compute_ns, loadback_exposed_ns, {rec} AS recompute_ns FROM batches "
        "WHERE run_id = ? AND t_end_ns > ? AND t_start_ns < ? ORDER BY t_start_ns, batch_id",
        [run_id, min(wait_start, sched), first_token])
    if not batches and queue:
        return None  # a store without batch rows (hand-built, or probes off)
    raw = dict.fromkeys(ATTRIBUTION_KEYS, 0.0)
    gaps: list[tuple[int, int]] = []
    ahead = 0

    def add(b: dict, lo: int, hi: int) -> None:
        duration = max(int(b["t_end_ns"]) - int(b["t_start_ns"]), 1)
        f = (hi - lo) / duration
        compute = int(b["compute_ns"] or 0)
        recompute = min(int(b["recompute_ns"] or 0), compute)
        exposed = int(b["loadback_exposed_ns"] or 0)
        raw["recompute"] += f * recompute
        raw["new_compute"] += f * (compute - recompute)
        raw["load_back"] += f * exposed
        raw["write_back"] += f * max(duration - compute - exposed, 0)

    def walk(lo: int, hi: int, rows: list[dict]) -> None:
        cursor = lo
        for b in rows:
            s, e = max(int(b["t_start_ns"]), lo), min(int(b["t_end_ns"]), hi)
            if e <= s:
                continue
            if s > cursor:
                gaps.append((cursor, s))
            add(b, s, e)
            cursor = max(cursor, e)
        if hi > cursor:
            gaps.append((cursor, hi))

    # Held for storage until wait_start; a hold that outlasted its scheduling is none (wait_start >= sched).
    waiting = [b for b in batches if int(b["t_start_ns"]) < sched]
    if sched > wait_start:
        walk(wait_start, sched, waiting)
        ahead = sum(1 for b in waiting if int(b["t_end_ns"]) > wait_start)
    walk(sched, first_token, [b for b in batches if int(b["t_start_ns"]) >= sched])
    # Its own parts of the batches it ran in belong to its TTFT, not to its queue.
    raw["recompute"] -= int(row.get("recompute_ns") or 0)
    raw["new_compute"] -= int(row.get("compute_ns") or 0)
    raw["load_back"] -= int(row.get("loadback_exposed_ns") or 0)
    gaps = [g for g in gaps if g[1] > g[0]]
    if gaps:
        lo, hi = gaps[0][0], gaps[-1][1]
        decoding = [(int(a), int(b)) for a, b in con.execute(
            "SELECT first_token_ns, finish_ns FROM requests WHERE run_id = ? AND req_id <> ? "
            "AND first_token_ns < ? AND finish_ns > ?", [run_id, row["req_id"], hi, lo]).fetchall()]
        held = [(int(a), int(a) + int(w)) for a, w in con.execute(
            "SELECT arrival_ns, storage_wait_ns FROM requests WHERE run_id = ? AND req_id <> ? "
            "AND storage_wait_ns > 0 AND arrival_ns < ? AND arrival_ns + storage_wait_ns > ?",
            [run_id, row["req_id"], hi, lo]).fetchall()]
        for gap in gaps:
            dec = _union_measure(*gap, decoding)
            raw["decode"] += sum(b - a for a, b in dec)
            for rest in _subtract(gap, dec):
                hold = _union_measure(*rest, held)
                held_ns = sum(b - a for a, b in hold)
                raw["storage_wait"] += held_ns
                raw["idle"] += rest[1] - rest[0] - held_ns
    rounding = queue - sum(max(v, 0.0) for v in raw.values())
    return QueueAttribution(queue_ns=queue, parts_ns=_round_exact(raw, queue), rounding_ns=rounding,
                            batches_ahead=ahead)


# --------------------------------------------------------------------------- the whole run

# A removed node whose pages had been hit at least this often is "hot".
HOT_HIT_COUNT = 3


@dataclass(frozen=True)
class LossEvidence:
    """Why once-cached tokens were recomputed, over the whole run (tokens)."""

    input_tokens: int
    recomputed_tokens: int | None  # None: not known (no finished request; a server that does not report it)
    recomputed_share: float | None
    skipped_tokens: dict  # host load-back skipped: reason -> tokens
    storage_unused_tokens: dict  # storage match not used: reason -> tokens (prefetch_incomplete, ...)
    lost_tokens: int | None  # recomputed, neither skipped nor matched in storage: gone from every tier
    # Re-references of pages that a removal (host delete / device drop) had taken:
    deleted_from_host_tokens: int
    dropped_unbacked_tokens: int  # dropped from device with no host copy (never backed up)
    hot_removed_tokens: int  # of both, from nodes hit >= HOT_HIT_COUNT times
    removed_reuse_p50_tokens: int | None  # token-weighted reuse distance of those re-references
    removed_reuse_p90_tokens: int | None
    removed_reuse_deciles_tokens: tuple  # p0, p10, ..., p100 (token-weighted)
    device_capacity_tokens: int | None
    host_capacity_tokens: int | None
    storage_capacity_tokens: int | None


@dataclass(frozen=True)
class TransferEvidence:
    num_loadbacks: int
    loadback_bytes: int
    loadback_busy_ns: int
    link_peak_share: float | None
    pages_per_run: float | None
    bytes_per_run: float | None
    bytes_per_page: float | None
    loadback_ns: int  # summed over tiered hits
    recompute_instead_extra_ns: int  # what recomputing their loaded tokens would have added
    loadback_exposed_ns: int
    ttft_total_ns: int
    tiered_ttft_ns: int  # summed TTFT of the requests that loaded something back


@dataclass(frozen=True)
class RunContext:
    run_id: str
    span_ns: int
    num_finished: int
    prefill_busy_share: float | None
    prefill_compute_ns: int
    recompute_ns: int
    recompute_share_of_prefill: float | None
    ttft_total_ns: int
    queue_total_ns: int
    queue_share_of_ttft: float | None
    excess_total_ns: int
    queue_attribution: dict | None  # ATTRIBUTION_KEYS -> run total ns (gaps all as idle)
    losses: LossEvidence
    transfers: TransferEvidence
    config: dict
    kv_bytes_per_token: int | None
    ttft_p50_ns: int | None
    ttft_p99_ns: int | None

    def attribution_share(self, key: str) -> float | None:
        if not self.queue_attribution:
            return None
        return share(self.queue_attribution.get(key, 0), self.queue_total_ns)

    def to_json(self) -> dict:
        d = dataclass_json(self)
        d["queue_attribution_ms"] = ({k: ns_to_ms(v) for k, v in self.queue_attribution.items()}
                                     if self.queue_attribution else None)
        del d["queue_attribution"]
        return d


def _i(v) -> int:
    return int(v or 0)


def _run_attribution(con: duckdb.DuckDBPyConnection, rid: str, rec: str, queue_total: int) -> dict | None:
    """Σ over requests of their queue attribution; the remainder of the queue (GPU idle while
    they waited) as `idle`.

    Each request's share of a batch is the fraction of the batch inside its wait window
    [arrival + storage wait, first token]. Batches run one after another on the one GPU, so
    instead of joining every request with every batch it overlaps (tens of millions of pairs
    when the queue is deep) each batch kind's time is integrated once along the clock:
    F(t) = Σ_batches value × (part of the batch before t) / duration, and a window gets
    F(first token) − F(start): the same sums as the interval join, in O((R + B) log B)."""
    import numpy as np

    b = con.execute(
        f"""SELECT t_start_ns, t_end_ns, coalesce(compute_ns, 0),
                   least(coalesce({rec}, 0), coalesce(compute_ns, 0)), coalesce(loadback_exposed_ns, 0)
            FROM batches WHERE run_id = $r ORDER BY t_start_ns, t_end_ns""", {"r": rid}).fetchnumpy()
    r = con.execute(
        f"""SELECT arrival_ns + coalesce(storage_wait_ns, 0), first_token_ns FROM requests
            WHERE run_id = $r AND {_FINISHED} AND prefill_ns IS NOT NULL""", {"r": rid}).fetchnumpy()
    cols = list(b.values())
    if not len(cols[0]) or not len(next(iter(r.values()))):
        return None
    s, e = (np.asarray(c, dtype=np.int64) for c in cols[:2])
    c, rc, x = (np.asarray(v, dtype=np.float64) for v in cols[2:])
    d = np.maximum(e - s, 1).astype(np.float64)
    values = np.stack([rc, c - rc, x, np.maximum(d - c - x, 0.0)])  # recompute, new, load-back, other
    full = (e - s) / d  # 1, or 0 for a batch of no duration (its join overlap is 0 too)
    cum = np.concatenate([np.zeros((4, 1)), np.cumsum(values * full, axis=1)], axis=1)
    w0, ft = (np.asarray(v, dtype=np.int64) for v in r.values())

    def integral(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(s, t, side="right") - 1  # the last batch starting at or before t
        kk = np.maximum(k, 0)
        part = np.clip(np.minimum(t, e[kk]) - s[kk], 0, None) / d[kk]
        out = cum[:, kk] + values[:, kk] * part
        out[:, k < 0] = 0.0
        return out.sum(axis=1)

    keep = ft > w0  # an empty window overlaps no batch
    tot = integral(ft[keep]) - integral(w0[keep])
    own = con.execute(
        f"SELECT sum(recompute_ns), sum(compute_ns), sum(loadback_exposed_ns) FROM requests "
        f"WHERE run_id = ? AND {_FINISHED}", [rid]).fetchone()
    raw = dict.fromkeys(ATTRIBUTION_KEYS, 0.0)
    raw["recompute"] = float(tot[0]) - _i(own[0])
    raw["new_compute"] = float(tot[1]) - _i(own[1])
    raw["load_back"] = float(tot[2]) - _i(own[2])
    raw["write_back"] = float(tot[3])
    raw["idle"] = queue_total - sum(max(v, 0.0) for v in raw.values())
    return _round_exact(raw, queue_total)


def _losses(con: duckdb.DuckDBPyConnection, rid: str, config: dict) -> LossEvidence:
    t = con.execute(
        f"""SELECT sum(input_tokens), sum(recomputed_tokens) FROM requests WHERE run_id = ? AND {_FINISHED}""",
        [rid]).fetchone()
    skipped = {r: _i(n) for r, n in con.execute(
        f"SELECT loadback_skipped_reason, sum(loadback_skipped_tokens) FROM requests WHERE run_id = ? "
        f"AND {_FINISHED} AND loadback_skipped_reason IS NOT NULL GROUP BY 1 ORDER BY 1", [rid]).fetchall()}
    unused = {r: _i(n) for r, n in con.execute(
        f"SELECT storage_skipped_reason, sum(least(storage_match_tokens - storage_hit_tokens, recomputed_tokens)) "
        f"FROM requests WHERE run_id = ? AND {_FINISHED} AND storage_skipped_reason IS NOT NULL "
        f"GROUP BY 1 ORDER BY 1", [rid]).fetchall()}
    # Reuse distance of each re-reference of removed pages: tokens the device pool allocated
    # for requests scheduled between the pages' last use and the request that came back for
    # them (the LRU stack distance, roughly; explain's step 4 uses the same measure).
    # Only what the request then recomputed is lost: pages that came back from storage were not.
    # A request's removal tokens are scaled down to its recomputed tokens where they exceed them.
    # The lookups into the running allocation total and the token-weighted deciles run in
    # numpy over two fetched columns sets: a million-request run has a million allocations and
    # as many re-references (Python loops took seconds), and DuckDB's ASOF joins took ~0.3 s
    # each even on the conversation trace's 12k requests (one thread).
    import numpy as np

    alloc = con.execute(
        f"""SELECT sched, max(cum) FROM (
                SELECT first_token_ns - prefill_ns AS sched,
                       sum(input_tokens - coalesce(device_hit_tokens, 0) + output_tokens)
                           OVER (ORDER BY first_token_ns - prefill_ns, seq ROWS UNBOUNDED PRECEDING) AS cum
                FROM requests WHERE run_id = $r AND {_FINISHED} AND prefill_ns IS NOT NULL)
            GROUP BY sched ORDER BY sched""", {"r": rid}).fetchnumpy()
    raw = con.execute(
        """SELECT coalesce(re.tokens * least(1.0, greatest(q.recomputed_tokens
                      - CASE WHEN q.loadback_skipped_reason IS NULL THEN 0 ELSE q.loadback_skipped_tokens END
                      - CASE WHEN q.storage_skipped_reason IS NULL THEN 0
                             ELSE greatest(q.storage_match_tokens - q.storage_hit_tokens, 0) END, 0)
                      / sum(re.tokens) OVER (PARTITION BY re.req_id)), 0)::DOUBLE AS tokens,
                  e.action = 'delete' AS deleted, e.action = 'drop' AS dropped,
                  coalesce(e.node_hit_count, 0) AS hits, e.node_last_access_ns IS NULL AS no_t0,
                  coalesce(e.node_last_access_ns, 0) AS t0, q.first_token_ns - q.prefill_ns AS t1
           FROM request_evictions re
           JOIN evictions e ON e.run_id = re.run_id AND e.eviction_id = re.eviction_id
           JOIN requests q ON q.run_id = re.run_id AND q.req_id = re.req_id
           WHERE re.run_id = $r AND e.action IN ('delete', 'drop') AND q.prefill_ns IS NOT NULL
             AND q.recomputed_tokens > 0""", {"r": rid}).fetchnumpy()
    deciles: list[int] = []
    deleted = dropped = hot = 0
    if len(raw["tokens"]):
        sched = np.asarray(alloc["sched"], dtype=np.int64)
        cum = np.concatenate([[0], np.asarray(alloc[next(k for k in alloc if k != "sched")], dtype=np.int64)])
        t0, t1 = np.asarray(raw["t0"], dtype=np.int64), np.asarray(raw["t1"], dtype=np.int64)
        cum0 = cum[np.searchsorted(sched, t0, side="right")]  # allocated up to the pages' last use
        cum1 = cum[np.searchsorted(sched, t1, side="left")]  # ... and before the request came back
        dist = np.where(np.asarray(raw["no_t0"], dtype=bool), 0, np.maximum(cum1 - cum0, 0))
        tok = np.rint(np.asarray(raw["tokens"], dtype=np.float64)).astype(np.int64)  # half to even
        order = np.argsort(dist, kind="stable")
        dist_sorted, acc = dist[order], np.cumsum(tok[order])
        total = float(tok.sum())
        # Token-weighted quantiles: decile k is the distance where the running token total first
        # reaches k/10 of all (the first distance for k = 0; the largest where it never does).
        for k in range(11):
            reached = np.flatnonzero(acc.astype(np.float64) >= (k * 0.1) * total)
            deciles.append(int(dist_sorted[reached[0]] if reached.size else dist_sorted[-1]))
        deleted = int(tok[np.asarray(raw["deleted"], dtype=bool)].sum())
        dropped = int(tok[np.asarray(raw["dropped"], dtype=bool)].sum())
        hot = int(tok[np.asarray(raw["hits"], dtype=np.int64) >= HOT_HIT_COUNT].sum())
    p50 = deciles[5] if deciles else None
    p90 = deciles[9] if deciles else None
    recomputed = None if t[1] is None else int(t[1])  # NULL: no finished row says (unknown, not 0)
    lost = None if recomputed is None else max(recomputed - sum(skipped.values()) - sum(unused.values()), 0)

    def cap(key: str) -> int | None:
        v = config.get(key)
        return int(v) if v is not None else None

    return LossEvidence(
        input_tokens=_i(t[0]), recomputed_tokens=recomputed, recomputed_share=share(recomputed, _i(t[0])),
        skipped_tokens=skipped, storage_unused_tokens=unused, lost_tokens=lost,
        deleted_from_host_tokens=deleted, dropped_unbacked_tokens=dropped, hot_removed_tokens=hot,
        removed_reuse_p50_tokens=p50, removed_reuse_p90_tokens=p90, removed_reuse_deciles_tokens=tuple(deciles),
        device_capacity_tokens=cap("device_tokens"), host_capacity_tokens=cap("host_tokens"),
        storage_capacity_tokens=cap("storage_tokens"))


def _transfers(con: duckdb.DuckDBPyConnection, rid: str, peak: float | None) -> TransferEvidence:
    tr = con.execute(
        "SELECT count(*), coalesce(sum(bytes), 0), coalesce(sum(t_end_ns - t_start_ns), 0), coalesce(sum(pages), 0), "
        "coalesce(sum(runs), 0) FROM transfers WHERE run_id = ? AND kind = 'load_back'", [rid]).fetchone()
    rq = con.execute(
        f"""SELECT coalesce(sum(loadback_ns) FILTER (WHERE host_hit_tokens + storage_hit_tokens > 0), 0),
                   coalesce(sum(recompute_instead_ns - ttft_if_device_resident_ns)
                            FILTER (WHERE host_hit_tokens + storage_hit_tokens > 0), 0),
                   coalesce(sum(loadback_exposed_ns), 0), coalesce(sum(ttft_ns), 0),
                   coalesce(sum(ttft_ns) FILTER (WHERE host_hit_tokens + storage_hit_tokens > 0), 0)
            FROM requests WHERE run_id = ? AND {_FINISHED}""", [rid]).fetchone()
    n, nbytes, busy, pages, runs = (_i(x) for x in tr)
    achieved = nbytes * NS_PER_S / busy if nbytes and busy else None
    return TransferEvidence(
        num_loadbacks=n, loadback_bytes=nbytes, loadback_busy_ns=busy, link_peak_share=share(achieved, peak),
        pages_per_run=share(pages, runs), bytes_per_run=share(nbytes, runs), bytes_per_page=share(nbytes, pages),
        loadback_ns=_i(rq[0]), recompute_instead_extra_ns=_i(rq[1]), loadback_exposed_ns=_i(rq[2]),
        ttft_total_ns=_i(rq[3]), tiered_ttft_ns=_i(rq[4]))


def compute_run_context(con: duckdb.DuckDBPyConnection, run, *, attribution: bool = True) -> RunContext:
    """The run-level evidence `summary`'s diagnosis and `explain`'s "why" stand on, from the run's
    rows (what evidence.py stores at the run's close; readers take it through facts.py).

    `attribution=False`: the caller does not need the run's queue attribution (it costs a pass
    over every request and batch), so it is left out."""
    rid = run.run_id
    start, end = span_columns_sql("finished")  # the span of the work done: rejected requests did none
    t = con.execute(
        f"""SELECT count(*), {start}, {end},
                   sum(ttft_ns), sum(queue_ns), sum({excess_sql()}),
                   quantile_disc(ttft_ns, 0.5), quantile_disc(ttft_ns, 0.99)
            FROM requests WHERE run_id = ? AND {_FINISHED}""", [rid]).fetchone()
    span = max(_i(t[2]) - _i(t[1]), 0)
    rec = batch_recompute_sql(con)
    b = con.execute(
        f"SELECT coalesce(sum(t_end_ns - t_start_ns), 0), coalesce(sum(compute_ns), 0), "
        f"coalesce(sum({rec or '0'}), 0) FROM batches WHERE run_id = ?", [rid]).fetchone()
    busy, compute, recompute = _i(b[0]), _i(b[1]), _i(b[2])
    queue_total = _i(t[4])
    attribution = _run_attribution(con, rid, rec, queue_total) if attribution and rec and busy else None
    kv = run.data_plane.get("kv_bytes_per_token") if isinstance(run.data_plane, dict) else None
    return RunContext(
        run_id=rid, span_ns=span, num_finished=_i(t[0]),
        prefill_busy_share=share(busy, span) if busy else None, prefill_compute_ns=compute,
        recompute_ns=recompute if rec else 0,
        recompute_share_of_prefill=share(recompute, compute) if rec else None,
        ttft_total_ns=_i(t[3]), queue_total_ns=queue_total, queue_share_of_ttft=share(queue_total, _i(t[3])),
        excess_total_ns=_i(t[5]), queue_attribution=attribution,
        losses=_losses(con, rid, run.config), transfers=_transfers(con, rid, link_peak_bytes_per_s(run)),
        config=dict(run.config), kv_bytes_per_token=int(kv) if kv else None,
        ttft_p50_ns=t[6], ttft_p99_ns=t[7])
