"""What the data-parallel views read of a run: per-rank totals (`summary`'s ranks section),
`slow --by rank`'s counts, and the routing losses (diagnose/dp/ranks.py, diagnose/dp/routing_loss.py).
Each is one group-by in DuckDB over the run's rows; `routed_requests` alone fetches rows, the
requests that lost tokens to routing, which routing_loss prices one by one.
"""

from __future__ import annotations

from typing import NamedTuple

import duckdb

from tierdiag.diagnose.request.causes import cause_sql, excess_sql, routing_ns_sql, routing_tokens_sql
from tierdiag.diagnose.read.quantile import quantile_sql
from tierdiag.diagnose.read.requests import RequestRow
from tierdiag.diagnose.read.sql import FINISHED_SQL


class RankTotals(NamedTuple):
    dp_rank: int | None
    requests: int
    finished: int
    computed_tokens: int | None  # the rest over the finished requests
    input_tokens: int | None
    device_tokens: int | None
    host_tokens: int | None
    storage_tokens: int | None
    ttft_p50_ns: int | None
    ttft_p90_ns: int | None


def rank_totals(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[int | None, RankTotals]:
    """dp_rank -> its requests' totals (None: requests without a rank)."""
    return {r[0]: RankTotals(*r) for r in con.execute(f"""
        SELECT dp_rank, count(*) AS n, count(*) FILTER (WHERE {FINISHED_SQL}) AS finished,
               sum(computed_tokens) FILTER (WHERE {FINISHED_SQL}) AS computed,
               sum(input_tokens) FILTER (WHERE {FINISHED_SQL}) AS input,
               sum(device_hit_tokens) FILTER (WHERE {FINISHED_SQL}) AS device,
               sum(host_hit_tokens) FILTER (WHERE {FINISHED_SQL}) AS host,
               sum(storage_hit_tokens) FILTER (WHERE {FINISHED_SQL}) AS storage,
               {quantile_sql('ttft_ns', 0.5)} FILTER (WHERE {FINISHED_SQL}) AS p50,
               {quantile_sql('ttft_ns', 0.9)} FILTER (WHERE {FINISHED_SQL}) AS p90
        FROM requests WHERE run_id = ? GROUP BY dp_rank""", [run_id]).fetchall()}


def rank_busy_ns(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[int | None, int]:
    """dp_rank -> its prefill batches' summed time."""
    return {k: int(busy or 0) for k, busy in con.execute("""
        SELECT dp_rank, sum(t_end_ns - t_start_ns) AS busy FROM batches WHERE run_id = ? GROUP BY dp_rank""",
                                                          [run_id]).fetchall()}


class RouteTotals(NamedTuple):
    routed: int  # requests with a best rank recorded
    to_best: int  # of them sent to it
    held_elsewhere_tokens: int | None  # prefix tokens the best rank held beyond the chosen one's
    prefix_tokens: int | None  # the best ranks' prefix tokens at arrival


def route_totals(con: duckdb.DuckDBPyConnection, run_id: str) -> RouteTotals:
    return RouteTotals(*con.execute("""
        SELECT count(*) AS n, count(*) FILTER (WHERE best_rank = dp_rank) AS best,
               sum(CASE WHEN best_rank <> dp_rank THEN greatest(coalesce(best_rank_device_tokens, 0)
                   + coalesce(best_rank_host_tokens, 0) - coalesce(arrival_device_tokens, 0)
                   - coalesce(arrival_host_tokens, 0), 0) ELSE 0 END) AS elsewhere,
               sum(coalesce(best_rank_device_tokens, 0) + coalesce(best_rank_host_tokens, 0)) AS prefix
        FROM requests WHERE run_id = ? AND best_rank IS NOT NULL""", [run_id]).fetchall()[0])


class RankSlowCounts(NamedTuple):
    dp_rank: int | None
    finished: int
    slow: int  # of them with excess TTFT > 0, after the filters
    excess_ns: int | None  # their summed excess


def slow_counts_by_rank(con: duckdb.DuckDBPyConnection, run_id: str, *, ranked: bool, hit_class: str | None,
                        cause: str | None) -> dict[int | None, RankSlowCounts]:
    """dp_rank -> its finished requests, and the slow ones of `hit_class` and primary `cause`
    (None: any). `ranked` False: a run of one rank, every request rank 0's (the contract's
    dp_rank of a one-rank replay, NULL before v4)."""
    rank = "dp_rank" if ranked else "0"
    return {r[0]: RankSlowCounts(*r) for r in con.execute(f"""
        SELECT k, count(*) AS n, count(*) FILTER (WHERE excess_ns > 0
                 AND (CAST(? AS VARCHAR) IS NULL OR hit_class = ?)
                 AND (CAST(? AS VARCHAR) IS NULL OR primary_cause = ?)) AS slow,
               sum(excess_ns) FILTER (WHERE excess_ns > 0
                 AND (CAST(? AS VARCHAR) IS NULL OR hit_class = ?)
                 AND (CAST(? AS VARCHAR) IS NULL OR primary_cause = ?)) AS excess
        FROM (SELECT {rank} AS k, hit_class, {excess_sql()} AS excess_ns, {cause_sql()} AS primary_cause
              FROM requests WHERE run_id = ? AND {FINISHED_SQL})
        GROUP BY k""", [hit_class, hit_class, cause, cause] * 2 + [run_id]).fetchall()}


# --- routing losses (causes.py: `r`, the tokens routing lost) -------------------------------------

_R = routing_tokens_sql()


def ranks_named(con: duckdb.DuckDBPyConnection, run_id: str) -> int:
    """Distinct ranks the run's finished requests name (0: none names one)."""
    return con.execute(f"SELECT count(DISTINCT dp_rank) FROM requests WHERE run_id = ? AND {FINISHED_SQL} "
                       f"AND dp_rank IS NOT NULL", [run_id]).fetchall()[0][0] or 0


class RoutingTotals(NamedTuple):
    routed_requests: int  # finished requests that lost tokens to routing
    routing_tokens: int
    recomputed_tokens: int
    input_tokens: int
    routing_ns: int  # the part of TTFT routing owns
    session_routing_tokens: int  # of the routing tokens, those of session turns


def routing_totals(con: duckdb.DuckDBPyConnection, run_id: str) -> RoutingTotals:
    """Over the run's finished requests (0 where none)."""
    return RoutingTotals(*(int(v) for v in con.execute(
        f"""SELECT count(*) FILTER (WHERE {_R} > 0), coalesce(sum({_R}), 0), coalesce(sum(recomputed_tokens), 0),
                   coalesce(sum(input_tokens), 0), coalesce(sum({routing_ns_sql()}), 0),
                   coalesce(sum({_R}) FILTER (WHERE session_id IS NOT NULL), 0)
            FROM requests WHERE run_id = ? AND {FINISHED_SQL}""", [run_id]).fetchall()[0]))


def routing_tokens_by_branch(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, int]:
    """Router branch ('?': none recorded) -> routing tokens lost there, most first."""
    return {str(b): int(n) for b, n in con.execute(
        f"""SELECT coalesce(route_branch, '?'), sum({_R}) FROM requests WHERE run_id = ? AND {FINISHED_SQL}
            AND {_R} > 0 GROUP BY 1 ORDER BY 2 DESC, 1""", [run_id]).fetchall()}


def routing_tokens_by_best_share(con: duckdb.DuckDBPyConnection, run_id: str, *,
                                 cache_miss_only: bool = False) -> tuple[tuple[float, int], ...]:
    """(share of the input the best rank held, rounded to 0.01; routing tokens lost at it), by
    share; `cache_miss_only`: only requests the router sent by its cache_miss branch."""
    where = "AND route_branch = 'cache_miss'" if cache_miss_only else ""
    shares = "round((best_rank_device_tokens + best_rank_host_tokens) / nullif(input_tokens, 0), 2)"
    return tuple((float(s), int(n)) for s, n in con.execute(
        f"""SELECT {shares} AS s, sum({_R}) FROM requests WHERE run_id = ? AND {FINISHED_SQL} AND {_R} > 0
            {where} GROUP BY 1 ORDER BY 1""", [run_id]).fetchall() if s is not None)


_ROUTED_COLUMNS = ("dp_rank", "best_rank", "best_rank_device_tokens", "best_rank_host_tokens", "arrival_device_tokens",
                   "arrival_host_tokens", "storage_match_tokens", "recomputed_tokens", "device_hit_tokens",
                   "host_hit_tokens", "storage_hit_tokens", "recompute_ns", "compute_ns", "ideal_ttft_ns")


def routed_requests(con: duckdb.DuckDBPyConnection, run_id: str) -> list[RequestRow]:
    """The finished requests that lost tokens to routing, with the columns their routing cost
    reads (the rest None)."""
    return [RequestRow(**dict(zip(_ROUTED_COLUMNS, values))) for values in con.execute(
        f"SELECT {', '.join(_ROUTED_COLUMNS)} FROM requests WHERE run_id = ? AND {FINISHED_SQL} "
        f"AND {_R} > 0", [run_id]).fetchall()]
