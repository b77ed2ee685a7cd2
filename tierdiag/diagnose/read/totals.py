"""A run's totals, as `summary` counts them (diagnose/run/numbers.py turns them into RunSummary):
tokens, times and counts over its requests, per hit class, per reject and skip reason, its
transfers, evictions and primary causes. Each is one aggregate in DuckDB over the run's rows;
counts and sums come back as stored (None: no row to sum), the caller reads None as 0.
"""

from __future__ import annotations

from typing import NamedTuple

import duckdb

from tierdiag.diagnose.request.causes import cause_sql, excess_sql, routing_ns_sql
from tierdiag.diagnose.read.quantile import quantile_sql
from tierdiag.diagnose.read.sql import FINISHED_SQL as _FINISHED
from tierdiag.diagnose.read.sql import span_columns_sql

_SPAN = span_columns_sql("all")  # the run's clock: every request


class RequestTotals(NamedTuple):
    """Sums over the run's finished requests (`requests`, `t0_ns`, `t1_ns`: over all of them)."""

    requests: int
    finished: int
    input_tokens: int | None
    device_tokens: int | None
    host_tokens: int | None
    storage_tokens: int | None
    computed_tokens: int | None
    recomputed_tokens: int | None
    loadback_skipped_tokens: int | None
    hit_requests: int  # with any reused token
    median_hit_tokens: int | None  # reused tokens of the median hit request (nearest rank)
    t0_ns: int | None  # the run's span (diagnose/read/sql.py)
    t1_ns: int | None
    loadback_requests: int  # with any host or storage hit
    loaded_tokens: int | None
    exposed_ns: int | None
    queued_ns: int | None
    storage_wait_ns: int | None
    queue_ns: int | None
    recompute_ns: int | None
    routing_ns: int | None
    recompute_rest_ns: int | None  # recompute less its routing part
    compute_ns: int | None
    compute_excess_ns: int | None  # compute beyond the ideal TTFT
    ttft_ns: int | None
    excess_ns: int | None


def request_totals(con: duckdb.DuckDBPyConnection, run_id: str) -> RequestTotals:
    row = con.execute(f"""
        SELECT count(*) AS n,
               count(*) FILTER (WHERE {_FINISHED}) AS finished,
               sum(input_tokens) FILTER (WHERE {_FINISHED}) AS input_tokens,
               sum(device_hit_tokens) FILTER (WHERE {_FINISHED}) AS device_tokens,
               sum(host_hit_tokens) FILTER (WHERE {_FINISHED}) AS host_tokens,
               sum(storage_hit_tokens) FILTER (WHERE {_FINISHED}) AS storage_tokens,
               sum(computed_tokens) FILTER (WHERE {_FINISHED}) AS computed_tokens,
               sum(recomputed_tokens) FILTER (WHERE {_FINISHED}) AS recomputed_tokens,
               sum(loadback_skipped_tokens) FILTER (WHERE {_FINISHED}) AS loadback_skipped_tokens,
               count(*) FILTER (WHERE {_FINISHED}
                   AND device_hit_tokens + host_hit_tokens + storage_hit_tokens > 0) AS hit_requests,
               {quantile_sql('device_hit_tokens + host_hit_tokens + storage_hit_tokens', 0.5)} FILTER (WHERE {_FINISHED}
                   AND device_hit_tokens + host_hit_tokens + storage_hit_tokens > 0) AS median_hit,
               {_SPAN[0]} AS t0, {_SPAN[1]} AS t1,
               count(*) FILTER (WHERE {_FINISHED} AND host_hit_tokens + storage_hit_tokens > 0) AS lb_requests,
               sum(host_hit_tokens + storage_hit_tokens) FILTER (WHERE {_FINISHED}) AS loaded_tokens,
               sum(loadback_exposed_ns) FILTER (WHERE {_FINISHED}) AS exposed_ns,
               sum(loadback_queued_ns) FILTER (WHERE {_FINISHED}) AS queued_ns,
               sum(storage_wait_ns) FILTER (WHERE {_FINISHED}) AS storage_wait_ns,
               sum(queue_ns) FILTER (WHERE {_FINISHED}) AS queue_ns,
               sum(recompute_ns) FILTER (WHERE {_FINISHED}) AS recompute_ns,
               sum({routing_ns_sql()}) FILTER (WHERE {_FINISHED}) AS routing_ns,
               sum(recompute_ns - {routing_ns_sql()}) FILTER (WHERE {_FINISHED}) AS recompute_rest_ns,
               sum(compute_ns) FILTER (WHERE {_FINISHED}) AS compute_ns,
               sum(greatest(coalesce(compute_ns, 0) - coalesce(ideal_ttft_ns, 0), 0))
                   FILTER (WHERE {_FINISHED}) AS compute_excess_ns,
               sum(ttft_ns) FILTER (WHERE {_FINISHED}) AS ttft_ns,
               sum({excess_sql()}) FILTER (WHERE {_FINISHED}) AS excess_ns
        FROM requests WHERE run_id = ?""", [run_id]).fetchall()[0]
    return RequestTotals(*row)


class ClassTotals(NamedTuple):
    hit_class: str  # "all" on the run's row
    is_total: int  # 1 on the run's row (all classes), 0 on a class's
    requests: int
    input_tokens: int | None
    reused_tokens: int | None
    ttft_p50_ns: int | None  # quantile_disc: a request's own TTFT
    ttft_p90_ns: int | None
    ttft_p99_ns: int | None
    ttft_mean_ns: float | None
    ttft_max_ns: int | None


def class_totals(con: duckdb.DuckDBPyConnection, run_id: str) -> list[ClassTotals]:
    """The finished requests' totals and TTFT quantiles per hit class and for the run, unordered."""
    return [ClassTotals(*r) for r in con.execute(f"""
        SELECT coalesce(hit_class, 'all') AS hit_class, grouping(hit_class) AS is_total,
               count(*) AS n, sum(input_tokens) AS input_tokens,
               sum(device_hit_tokens + host_hit_tokens + storage_hit_tokens) AS reused_tokens,
               quantile_disc(ttft_ns, 0.5) AS p50, quantile_disc(ttft_ns, 0.9) AS p90,
               quantile_disc(ttft_ns, 0.99) AS p99, avg(ttft_ns) AS mean, max(ttft_ns) AS max
        FROM requests WHERE run_id = ? AND {_FINISHED}
        GROUP BY GROUPING SETS ((hit_class), ())""", [run_id]).fetchall()]


class ReasonTotals(NamedTuple):
    reason: str  # 'unknown' where none was recorded
    requests: int
    tokens: int | None


def rejected_by_reason(con: duckdb.DuckDBPyConnection, run_id: str) -> list[ReasonTotals]:
    """The requests not finished, per reason: most first."""
    return [ReasonTotals(*r) for r in con.execute(f"""
        SELECT coalesce(reject_reason, 'unknown') AS reason, count(*) AS n, sum(input_tokens) AS tokens
        FROM requests WHERE run_id = ? AND NOT ({_FINISHED}) GROUP BY 1 ORDER BY n DESC, reason""",
                                                 [run_id]).fetchall()]


class TransferTotals(NamedTuple):
    loadbacks: int
    loadback_bytes: int | None
    loadback_pages: int | None
    loadback_runs: int | None
    loadback_busy_ns: int | None  # summed link time
    prefetches: int
    prefetch_bytes: int | None


# `transfer_totals`' aggregates over the run's `transfers` rows (read/run_scan.py's too).
TRANSFER_TOTALS_SQL = """count(*) FILTER (WHERE kind = 'load_back') AS n,
               sum(bytes) FILTER (WHERE kind = 'load_back') AS bytes,
               sum(pages) FILTER (WHERE kind = 'load_back') AS pages,
               sum(runs) FILTER (WHERE kind = 'load_back') AS runs,
               sum(t_end_ns - t_start_ns) FILTER (WHERE kind = 'load_back') AS busy,
               count(*) FILTER (WHERE kind = 'prefetch') AS prefetches,
               sum(bytes) FILTER (WHERE kind = 'prefetch') AS prefetch_bytes"""


def transfer_totals(con: duckdb.DuckDBPyConnection, run_id: str) -> TransferTotals:
    return TransferTotals(*con.execute(f"SELECT {TRANSFER_TOTALS_SQL} FROM transfers WHERE run_id = ?",
                                       [run_id]).fetchall()[0])


class SkipTotals(NamedTuple):
    tier: str  # host (a load-back skipped) | storage (a prefetch skipped)
    reason: str
    requests: int
    tokens: int | None


def skipped_by_reason(con: duckdb.DuckDBPyConnection, run_id: str) -> list[SkipTotals]:
    """The finished requests that skipped a hit, per tier and reason (host first; most first)."""
    return [SkipTotals(*r) for r in con.execute(f"""
        SELECT 'host' AS tier, loadback_skipped_reason AS reason, count(*) AS n,
               sum(loadback_skipped_tokens) AS tokens
        FROM requests WHERE run_id = ? AND {_FINISHED} AND loadback_skipped_reason IS NOT NULL GROUP BY 2
        UNION ALL
        SELECT 'storage', storage_skipped_reason, count(*),
               sum(storage_match_tokens - storage_hit_tokens)
        FROM requests WHERE run_id = ? AND {_FINISHED} AND storage_skipped_reason IS NOT NULL GROUP BY 2
        ORDER BY 1, 3 DESC, 2""", [run_id, run_id]).fetchall()]


class EvictionTotals(NamedTuple):
    tier: str | None
    action: str | None
    events: int
    tokens: int | None


def evictions_by_tier(con: duckdb.DuckDBPyConnection, run_id: str) -> list[EvictionTotals]:
    """Evictions per tier and action, unordered."""
    return [EvictionTotals(*r) for r in con.execute("""
        SELECT tier, action, count(*) AS n, sum(tokens) AS tokens FROM evictions WHERE run_id = ?
        GROUP BY tier, action""", [run_id]).fetchall()]


class RequestEvictions(NamedTuple):
    req_id: str
    events: int
    tokens: int | None


EVICTION_REQUESTS = ("owner_req_id", "cause_req_id")  # whose pages were evicted | whose admission evicted


def evictions_by_request(con: duckdb.DuckDBPyConnection, run_id: str, column: str, top: int) -> list[RequestEvictions]:
    """The `top` requests with the most evictions by `column` (EVICTION_REQUESTS): most first."""
    if column not in EVICTION_REQUESTS:
        raise ValueError(f"evictions by {column!r}: one of {', '.join(EVICTION_REQUESTS)}")
    return [RequestEvictions(*r) for r in con.execute(f"""
            SELECT {column} AS req_id, count(*) AS n, sum(tokens) AS tokens FROM evictions
            WHERE run_id = ? AND {column} IS NOT NULL GROUP BY 1 ORDER BY n DESC, tokens DESC, req_id
            LIMIT {int(top)}""", [run_id]).fetchall()]


def requests_by_cause(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, int]:
    """Finished requests per primary cause (causes.py's rule)."""
    return {cause: int(n or 0) for cause, n in con.execute(f"""
        SELECT {cause_sql()} AS cause, count(*) AS n FROM requests WHERE run_id = ? AND {_FINISHED}
        GROUP BY 1""", [run_id]).fetchall()}
