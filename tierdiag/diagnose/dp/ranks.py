"""A data-parallel run's ranks side by side (`replay --dp N`, docs/contract.md "Deployments"):
`summary`'s per-rank section and `slow --by rank`.

A run of one rank (dp 1, any run before schema v4, an import) has no per-rank view: every
reader here answers None for it, so those runs read exactly as before. The deployment is the
run's config (`dp`, `router`); the numbers are the rows' (dp_rank on requests and batches).

Per rank, over its finished requests (the run's own populations, diagnose/read/sql.py):
  load    prefill busy: the summed duration of the rank's batches, and its share of the run's
          span (first arrival to last finish of the run's finished requests: one span for every
          rank, so the shares compare); tokens computed (computed_tokens, recompute included)
  reuse   device / host / storage hit tokens as shares of its input tokens (token-weighted, as
          the run's tier split)
  TTFT    p50, p90 (nearest rank, diagnose/read/quantile.py)
and the imbalance: the busiest rank's prefill busy time over the mean of all dp ranks' (1.0:
even; dp: one rank did everything). Routing, over every request the router placed: how many
went to the rank that held the most of their prefix at arrival (best_rank, device + host), and
the tokens of prefix that were on another rank but not on the one that served them.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from tierdiag.diagnose.request.causes import check_cause
from tierdiag.diagnose.read.query import dataclass_json
from tierdiag.diagnose.read import ranks as read
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
    reqs = read.rank_totals(con, rid)
    busy = read.rank_busy_ns(con, rid)
    routing = read.route_totals(con, rid)
    start, end = run_span_ns(con, rid, "finished")
    span = end - start
    extra = sorted((k for k in set(reqs) | set(busy) if k is None or not 0 <= k < dep.dp),
                   key=lambda k: (k is None, k or 0))
    ranks = []
    for k in [*range(dep.dp), *extra]:
        r = reqs.get(k) or read.RankTotals(k, 0, 0, None, None, None, None, None, None, None)

        def n(value) -> int:
            return int(value or 0)

        inp = n(r.input_tokens)
        ranks.append(RankStats(
            dp_rank=k, num_requests=n(r.requests), num_finished=n(r.finished), prefill_busy_ns=busy.get(k, 0),
            prefill_busy_share=share(busy.get(k, 0), span), computed_tokens=n(r.computed_tokens), input_tokens=inp,
            device_hit_tokens=n(r.device_tokens), host_hit_tokens=n(r.host_tokens),
            storage_hit_tokens=n(r.storage_tokens), device_share=share(n(r.device_tokens), inp),
            host_share=share(n(r.host_tokens), inp), storage_share=share(n(r.storage_tokens), inp),
            ttft_p50_ns=None if r.ttft_p50_ns is None else int(r.ttft_p50_ns),
            ttft_p90_ns=None if r.ttft_p90_ns is None else int(r.ttft_p90_ns)))
    own = [busy.get(k, 0) for k in range(dep.dp)]
    mean = sum(own) / dep.dp
    top = max(own)
    return RankSummary(dp=dep.dp, router=dep.router, span_ns=span, ranks=tuple(ranks), busy_max_ns=top,
                       busy_mean_ns=mean, busiest_rank=own.index(top) if top else None,
                       imbalance=top / mean if mean else None, num_routed=int(routing.routed or 0),
                       to_best_rank=int(routing.to_best or 0),
                       to_best_rank_share=share(int(routing.to_best or 0), int(routing.routed or 0)),
                       held_elsewhere_tokens=int(routing.held_elsewhere_tokens or 0),
                       prefix_tokens_at_arrival=int(routing.prefix_tokens or 0))


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
    from tierdiag.diagnose.request.slow import check_hit_class, slow_requests

    if top < 1:
        raise ConfigError(f"--top must be at least 1, got {top}")
    check_hit_class(hit_class)
    check_cause(cause)
    dep = deployment(run)
    counts = read.slow_counts_by_rank(con, run.run_id, ranked=dep is not None, hit_class=hit_class, cause=cause)
    keys = list(range(dep.dp)) if dep is not None else [0]
    keys += sorted((k for k in counts if k not in keys), key=lambda k: (k is None, k or 0))
    out = []
    for k in keys:
        c = counts.get(k)
        slow = int(c.slow or 0) if c is not None else 0
        rows = slow_requests(con, run, top=top, hit_class=hit_class, cause=cause,
                             by_rank=dep is not None, dp_rank=k) if slow else []
        out.append(RankSlow(dp_rank=k, num_requests=int(c.finished or 0) if c is not None else 0, num_slow=slow,
                            excess_total_ns=int(c.excess_ns or 0) if c is not None else 0, requests=tuple(rows)))
    return tuple(out)
