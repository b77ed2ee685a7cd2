"""What explain's steps read beyond the request's own row (diagnose/request/explain_steps.py): its
transfers and evictions, and the run's load-backs, evictions and batches in a window around it.
Each query is filtered on the run's id first and bounded by the request or its window.
"""

from __future__ import annotations

from typing import NamedTuple

import duckdb

from tierdiag.diagnose.read.sql import FINISHED_SQL

# When a request was scheduled (its first prefill batch started; its arrival where it never was):
# match_prefix, load-back and the evictions its allocation forced happen then, not at arrival.
SCHEDULED_SQL = "coalesce(first_token_ns - prefill_ns, arrival_ns)"


class TransferRecord(NamedTuple):
    """One `transfers` row of a request (NULL as None)."""
    transfer_id: int | None
    kind: str
    t_start_ns: int | None
    t_end_ns: int | None
    pages: int | None
    runs: int | None
    bytes: int | None
    queued_ns: int | None
    wall_ns: int | None


def request_transfers(con: duckdb.DuckDBPyConnection, run_id: str, req_id: str, t_lo: int | None,
                      t_hi: int | None) -> list[TransferRecord]:
    """The request's load-backs and prefetches that started in [t_lo, t_hi] (None: unbounded), in clock order.
    The bound lets DuckDB skip the row groups of the rest of the run: each only where there is one,
    as a plain `t_start_ns >= ?` (`(? IS NULL OR ...)` compared every request id; issue 41)."""
    bounded = [(" AND t_start_ns >= ?", t_lo), (" AND t_start_ns <= ?", t_hi)]
    return [TransferRecord(*t) for t in con.execute(
        "SELECT transfer_id, kind, t_start_ns, t_end_ns, pages, runs, bytes, queued_ns, wall_ns "
        "FROM transfers WHERE run_id = ? AND req_id = ? AND kind IN ('load_back', 'prefetch')"
        + "".join(sql for sql, v in bounded if v is not None) + " ORDER BY t_start_ns, transfer_id",
        [run_id, req_id] + [int(v) for _, v in bounded if v is not None]).fetchall()]


def window_loadbacks(con: duckdb.DuckDBPyConnection, run_id: str, lo_ns: int, hi_ns: int) -> tuple[int, int]:
    """(load-backs, their bytes) of the run overlapping [lo, hi]."""
    stats = con.execute(
        "SELECT count(*), coalesce(sum(bytes), 0) FROM transfers "
        "WHERE run_id = ? AND kind = 'load_back' AND t_end_ns >= ? AND t_start_ns <= ?",
        [run_id, lo_ns, hi_ns]).fetchall()[0]
    return int(stats[0] or 0), int(stats[1] or 0)


class EvictionRecord(NamedTuple):
    """One eviction that took pages of a request's prefix (`evictions` joined with `request_evictions`)."""
    eviction_id: int
    t_ns: int | None
    tier: str
    action: str
    tokens: int | None  # the node's
    prefix_tokens: int | None  # of those, the request's prefix
    cause_req_id: str | None
    owner_req_id: str | None
    pool_used_tokens: int | None
    pool_capacity_tokens: int | None
    locked_tokens: int | None
    node_last_access_ns: int | None


def request_evictions(con: duckdb.DuckDBPyConnection, run_id: str, req_id: str) -> list[EvictionRecord]:
    """The evictions that took pages the request came back for, in clock order. Read once per
    `explain`: step 4 lists them, the session step takes its pause's and its wait's from them
    (`evictions_between`; each was a join of request_evictions with evictions of its own, ~5-12 ms
    of a 1M-request run's explain, issue 41)."""
    return [EvictionRecord(*e) for e in con.execute(
        "SELECT e.eviction_id, e.t_ns, e.tier, e.action, e.tokens, re.tokens AS prefix_tokens, "
        "       e.cause_req_id, e.owner_req_id, e.pool_used_tokens, e.pool_capacity_tokens, "
        "       e.locked_tokens, e.node_last_access_ns "
        "FROM request_evictions re JOIN evictions e "
        "  ON e.run_id = re.run_id AND e.eviction_id = re.eviction_id "
        "WHERE re.run_id = ? AND re.req_id = ? ORDER BY e.t_ns, e.eviction_id", [run_id, req_id]).fetchall()]


def evictions_between(evictions: list[EvictionRecord], start_ns: int, end_ns: int) -> list[EvictionRecord]:
    """Those of a request's evictions (`request_evictions`, in clock order) at t in [start_ns,
    end_ns], in the same order; one without a time in none (as `e.t_ns BETWEEN ? AND ?` says)."""
    return [e for e in evictions if e.t_ns is not None and start_ns <= e.t_ns <= end_ns]


def allocated_between(con: duckdb.DuckDBPyConnection, run_id: str, after_ns: int, before_ns: int) -> int:
    """Tokens the device pool allocated for the finished requests scheduled in (after, before).
    `arrival_ns < before` adds nothing (a request is scheduled at or after its arrival) but lets
    the zone maps skip every later request of a big run (issue 41); `finish_ns > after` adds
    nothing either (it finishes after it was scheduled) and skips every request that finished
    before the window (rows are appended as requests finish)."""
    return int(con.execute(
        "SELECT coalesce(sum(input_tokens - coalesce(device_hit_tokens, 0) + output_tokens), 0) "
        f"FROM requests WHERE run_id = ? AND {FINISHED_SQL} AND {SCHEDULED_SQL} > ? "
        f"AND {SCHEDULED_SQL} < ? AND arrival_ns < ? AND (finish_ns > ? OR finish_ns IS NULL)",
        [run_id, after_ns, before_ns, before_ns, after_ns]).fetchall()[0][0])


class WindowEvictions(NamedTuple):
    evictions: int
    tokens: int
    first_id: int | None  # the window's eviction ids (None: none)
    last_id: int | None


def window_device_evictions(con: duckdb.DuckDBPyConnection, run_id: str, lo_ns: int, hi_ns: int) -> WindowEvictions:
    """The run's device evictions in [lo, hi]: how many, their tokens, their ids' range."""
    dev = con.execute(
        "SELECT count(*), coalesce(sum(tokens), 0), min(eviction_id), max(eviction_id) FROM evictions "
        "WHERE run_id = ? AND tier = 'device' AND t_ns BETWEEN ? AND ?", [run_id, lo_ns, hi_ns]).fetchall()[0]
    return WindowEvictions(int(dev[0] or 0), int(dev[1] or 0), dev[2], dev[3])


class EvictionLoad(NamedTuple):
    window_rereferenced_tokens: int | None  # device-evicted in the window and come back for
    window_busy_ns: int | None  # prefill-busy time inside the window
    run_busy_ns: int | None  # prefill-busy time over the run


def run_prefill_busy_ns(con: duckdb.DuckDBPyConnection, run_id: str) -> int:
    """The run's prefill-busy time: every batch's duration summed (0 for none). A scan of every
    batch of the run (991k on a 1M-request run: ~25 ms, the largest of explain's reads), the same
    for each of its requests: explain reads it beside the rest (read/request_reads.py)."""
    return int(con.execute("SELECT coalesce(sum(t_end_ns - t_start_ns), 0) FROM batches WHERE run_id = ?",
                           [run_id]).fetchall()[0][0])


def window_eviction_load(con: duckdb.DuckDBPyConnection, run_id: str, lo_ns: int, hi_ns: int,
                         ids_lo: int | None, ids_hi: int | None, run_busy_ns: int | None = None) -> EvictionLoad:
    """`ids_lo`..`ids_hi`: the window's device eviction ids (window_device_evictions): request_evictions
    is read only between them (issue 41). `run_busy_ns`: `run_prefill_busy_ns` where the caller
    has read it (explain: on another thread meanwhile); None: summed here, in the same query."""
    run_busy_sql = ("(SELECT coalesce(sum(t_end_ns - t_start_ns), 0) FROM batches WHERE run_id = $r)"
                    if run_busy_ns is None else "NULL")
    found = con.execute(
        "SELECT (SELECT coalesce(sum(tokens), 0) FROM evictions WHERE run_id = $r AND tier = 'device' "
        "        AND t_ns BETWEEN $lo AND $hi AND eviction_id IN "
        "        (SELECT eviction_id FROM request_evictions WHERE run_id = $r AND eviction_id BETWEEN $ilo AND $ihi)), "
        "       (SELECT coalesce(sum(least(t_end_ns, $hi) - greatest(t_start_ns, $lo)), 0) FROM batches "
        "        WHERE run_id = $r AND t_end_ns > $lo AND t_start_ns < $hi), "
        f"       {run_busy_sql}",
        {"r": run_id, "lo": lo_ns, "hi": hi_ns, "ilo": ids_lo, "ihi": ids_hi}).fetchall()[0]
    return EvictionLoad(found[0], found[1], found[2] if run_busy_ns is None else run_busy_ns)
