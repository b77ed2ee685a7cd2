"""A data-parallel run's ranks side by side (`replay --dp N`, docs/contract.md "Deployments"):
`summary`'s per-rank section and `slow --by rank`.

A run of one rank (dp 1, any run before schema v4, an import) has no per-rank view: every
reader here answers None for it, so those runs read exactly as before. The deployment is the
run's config (`dp`, `router`); the numbers are the rows' (dp_rank on requests and batches).

Per rank, over its finished requests (the run's own populations, diagnose/sql.py):
  load    prefill busy: the summed duration of the rank's batches, and its share of the run's
          span (first arrival to last finish of the run's finished requests: one span for every
          rank, so the shares compare); tokens computed (computed_tokens, recompute included)
  reuse   device / host / storage hit tokens as shares of its input tokens (token-weighted, as
          the run's tier split)
  TTFT    p50, p90 (nearest rank, diagnose/quantile.py)
and the imbalance: the busiest rank's prefill busy time over the mean of all dp ranks' (1.0:
even; dp: one rank did everything). Routing, over every request the router placed: how many
went to the rank that held the most of their prefix at arrival (best_rank, device + host), and
the tokens of prefix that were on another rank but not on the one that served them.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from tierdiag.diagnose.causes import check_cause
from tierdiag.diagnose.query import dataclass_json
from tierdiag.diagnose.read.rows import fetch_dicts
from tierdiag.diagnose.quantile import quantile_sql
from tierdiag.diagnose.sql import FINISHED_SQL
from tierdiag.diagnose.read.queries import run_span_ns
from tierdiag.errors import ConfigError
from tierdiag.units import share
from tierdiag.diagnose.read.run import parse


@dataclass(frozen=True)
class Deployment:
    dp: int
    router: str


def deployment(run) -> Deployment | None:
    """The run's ranks and router; None for a run of one rank (or recorded before ranks)."""
    run = parse(run)
    if run.ranks <= 1:
        return None
    return Deployment(dp=run.ranks, router=str(run.config.get("router") or "round_robin"))


@dataclass(frozen=True)
class RankStats:
    dp_rank: int | None  # None: requests with no rank recorded (never in a replay)
    num_requests: int
    num_finished: int
    prefill_busy_ns: int  # summed duration of its batches
    prefill_busy_share: float | None  # of the run's span (the same span for every rank)
    computed_tokens: int  # of its finished requests, recompute included
    input_tokens: int
    device_hit_tokens: int
    host_hit_tokens: int
    storage_hit_tokens: int
    device_share: float | None  # of input_tokens
    host_share: float | None
    storage_share: float | None
    ttft_p50_ns: int | None
    ttft_p90_ns: int | None

    def to_json(self) -> dict:
        return dataclass_json(self)


@dataclass(frozen=True)
class RankSummary:
    dp: int
    router: str
    span_ns: int  # the run's span the busy shares are of
    ranks: tuple[RankStats, ...]  # rank 0..dp-1 (a rank that served nothing included), then any other
    busy_max_ns: int  # of ranks 0..dp-1
    busy_mean_ns: float
    busiest_rank: int | None
    imbalance: float | None  # busy_max / busy_mean (None: no batch ran)
    # Routing, over the requests with a routing record (every request of a --dp replay):
    num_routed: int
    to_best_rank: int  # served by the rank that held the most of its prefix at arrival (best_rank)
    to_best_rank_share: float | None  # of num_routed
    held_elsewhere_tokens: int  # summed: the best rank's device + host tokens beyond the serving rank's
    prefix_tokens_at_arrival: int  # summed: the best rank's device + host tokens (what routing could have had)

    def to_json(self) -> dict:
        d = dataclass_json(self)
        d["per_rank"] = d.pop("ranks")
        return d


def rank_summary(con: duckdb.DuckDBPyConnection, run) -> RankSummary | None:
    """`summary`'s per-rank section; None for a run of one rank."""
    dep = deployment(run)
    if dep is None:
        return None
    rid = run.run_id
    reqs = {r["dp_rank"]: r for r in fetch_dicts(con, f"""
        SELECT dp_rank, count(*) AS n, count(*) FILTER (WHERE {FINISHED_SQL}) AS finished,
               sum(computed_tokens) FILTER (WHERE {FINISHED_SQL}) AS computed,
               sum(input_tokens) FILTER (WHERE {FINISHED_SQL}) AS input,
               sum(device_hit_tokens) FILTER (WHERE {FINISHED_SQL}) AS device,
               sum(host_hit_tokens) FILTER (WHERE {FINISHED_SQL}) AS host,
               sum(storage_hit_tokens) FILTER (WHERE {FINISHED_SQL}) AS storage,
               {quantile_sql('ttft_ns', 0.5)} FILTER (WHERE {FINISHED_SQL}) AS p50,
               {quantile_sql('ttft_ns', 0.9)} FILTER (WHERE {FINISHED_SQL}) AS p90
        FROM requests WHERE run_id = ? GROUP BY dp_rank""", [rid])}
    busy = {r["dp_rank"]: int(r["busy"] or 0) for r in fetch_dicts(con, """
        SELECT dp_rank, sum(t_end_ns - t_start_ns) AS busy FROM batches WHERE run_id = ? GROUP BY dp_rank""", [rid])}
    routing = fetch_dicts(con, """
        SELECT count(*) AS n, count(*) FILTER (WHERE best_rank = dp_rank) AS best,
               sum(CASE WHEN best_rank <> dp_rank THEN greatest(coalesce(best_rank_device_tokens, 0)
                   + coalesce(best_rank_host_tokens, 0) - coalesce(arrival_device_tokens, 0)
                   - coalesce(arrival_host_tokens, 0), 0) ELSE 0 END) AS elsewhere,
               sum(coalesce(best_rank_device_tokens, 0) + coalesce(best_rank_host_tokens, 0)) AS prefix
        FROM requests WHERE run_id = ? AND best_rank IS NOT NULL""", [rid])[0]
    start, end = run_span_ns(con, rid, "finished")
    span = end - start
    extra = sorted((k for k in set(reqs) | set(busy) if k is None or not 0 <= k < dep.dp),
                   key=lambda k: (k is None, k or 0))
    ranks = []
    for k in [*range(dep.dp), *extra]:
        r = reqs.get(k, {})

        def n(key: str) -> int:
            return int(r.get(key) or 0)

        inp = n("input")
        ranks.append(RankStats(
            dp_rank=k, num_requests=n("n"), num_finished=n("finished"), prefill_busy_ns=busy.get(k, 0),
            prefill_busy_share=share(busy.get(k, 0), span), computed_tokens=n("computed"), input_tokens=inp,
            device_hit_tokens=n("device"), host_hit_tokens=n("host"), storage_hit_tokens=n("storage"),
            device_share=share(n("device"), inp), host_share=share(n("host"), inp),
            storage_share=share(n("storage"), inp),
            ttft_p50_ns=None if r.get("p50") is None else int(r["p50"]),
            ttft_p90_ns=None if r.get("p90") is None else int(r["p90"])))
    own = [busy.get(k, 0) for k in range(dep.dp)]
    mean = sum(own) / dep.dp
    top = max(own)
    return RankSummary(dp=dep.dp, router=dep.router, span_ns=span, ranks=tuple(ranks), busy_max_ns=top,
                       busy_mean_ns=mean, busiest_rank=own.index(top) if top else None,
                       imbalance=top / mean if mean else None, num_routed=int(routing["n"] or 0),
                       to_best_rank=int(routing["best"] or 0),
                       to_best_rank_share=share(int(routing["best"] or 0), int(routing["n"] or 0)),
                       held_elsewhere_tokens=int(routing["elsewhere"] or 0),
                       prefix_tokens_at_arrival=int(routing["prefix"] or 0))


# --- slow --by rank ------------------------------------------------------------------------------

@dataclass(frozen=True)
class RankSlow:
    """One rank's slow requests (excess TTFT over ideal > 0): how many, their summed excess,
    and its slowest (`slow`'s own rows, ranked within the rank)."""

    dp_rank: int | None
    num_requests: int  # finished requests of the rank
    num_slow: int  # of them with excess > 0 (after the class / cause filters)
    excess_total_ns: int
    requests: tuple  # slow.SlowRequest, slowest first, at most `top`

    def to_json(self) -> dict:
        d = dataclass_json(self)
        d["requests"] = [r.to_json() for r in self.requests]
        return d


def slow_by_rank(con: duckdb.DuckDBPyConnection, run, *, top: int = 20, hit_class: str | None = None,
                 cause: str | None = None) -> tuple[RankSlow, ...]:
    """`slow --by rank`: the slow listing cut by dp_rank, one group a rank (0..dp-1; a run of
    one rank is one group, rank 0), each with its `top` slowest. Groups in rank order."""
    from tierdiag.diagnose.causes import cause_sql, excess_sql
    from tierdiag.diagnose.slow import check_hit_class, slow_requests

    if top < 1:
        raise ConfigError(f"--top must be at least 1, got {top}")
    check_hit_class(hit_class)
    check_cause(cause)
    dep = deployment(run)
    # One rank: every request is rank 0's (the contract's dp_rank of a one-rank replay, NULL before v4).
    rank_sql = "dp_rank" if dep is not None else "0"
    counts = {r["k"]: r for r in fetch_dicts(con, f"""
        SELECT k, count(*) AS n, count(*) FILTER (WHERE excess_ns > 0
                 AND (CAST(? AS VARCHAR) IS NULL OR hit_class = ?)
                 AND (CAST(? AS VARCHAR) IS NULL OR primary_cause = ?)) AS slow,
               sum(excess_ns) FILTER (WHERE excess_ns > 0
                 AND (CAST(? AS VARCHAR) IS NULL OR hit_class = ?)
                 AND (CAST(? AS VARCHAR) IS NULL OR primary_cause = ?)) AS excess
        FROM (SELECT {rank_sql} AS k, hit_class, {excess_sql()} AS excess_ns, {cause_sql()} AS primary_cause
              FROM requests WHERE run_id = ? AND {FINISHED_SQL})
        GROUP BY k""", [hit_class, hit_class, cause, cause] * 2 + [run.run_id])}
    keys = list(range(dep.dp)) if dep is not None else [0]
    keys += sorted((k for k in counts if k not in keys), key=lambda k: (k is None, k or 0))
    out = []
    for k in keys:
        c = counts.get(k, {})
        rows = slow_requests(con, run, top=top, hit_class=hit_class, cause=cause,
                             by_rank=dep is not None, dp_rank=k) if c.get("slow") else []
        out.append(RankSlow(dp_rank=k, num_requests=int(c.get("n") or 0), num_slow=int(c.get("slow") or 0),
                            excess_total_ns=int(c.get("excess") or 0), requests=tuple(rows)))
    return tuple(out)
