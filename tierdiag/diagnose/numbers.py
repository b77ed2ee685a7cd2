"""`summary`'s numbers: one run at a glance, weighted by tokens, not by requests, computed from
the run's rows (what evidence.py stores at the run's close; `summary.run_summary` reads them
through facts.py and adds the diagnosis).

Why tokens: in the Mooncake conversation trace every request shares block 0, so nearly every
request "hits" while the median hit is 512 tokens; a request-count hit rate says ~100 % and
means little. The split here is of tokens (device / host / storage / computed), with the
request-count view beside it only to show the gap.

A few aggregate queries over the run's rows; no per-request Python loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from tierdiag.diagnose.causes import CAUSES, cause_sql, excess_sql, routing_ns_sql
from tierdiag.diagnose.quantile import quantile_sql
from tierdiag.diagnose.query import dataclass_json, link_peak_bytes_per_s
from tierdiag.diagnose.read.rows import fetch_dicts, fetch_one
from tierdiag.diagnose.sql import FINISHED_SQL as _FINISHED
from tierdiag.diagnose.sql import span_columns_sql
from tierdiag.diagnose.tokens import TokenSplit
from tierdiag.units import NS_PER_S, share
from tierdiag.store.reader import RunInfo

TOP_EVICTED = 10


@dataclass(frozen=True)
class TierSplit(TokenSplit):
    """The run's `TokenSplit`, token-weighted over finished requests (device + host + storage +
    computed == input), with the tokens whose host load-back was skipped."""

    loadback_skipped_tokens: int

    def shares(self) -> dict[str, float | None]:
        return {k: share(getattr(self, f"{k}_tokens"), self.input_tokens)
                for k in ("device", "host", "storage", "computed", "recomputed")}

    def to_json(self) -> dict:
        d = dataclass_json(self)
        d["share_of_input"] = self.shares()
        return d


@dataclass(frozen=True)
class ClassStats:
    hit_class: str  # device_hit | tiered_hit | miss | all
    num_requests: int
    input_tokens: int
    reused_tokens: int
    ttft_p50_ns: int | None
    ttft_p90_ns: int | None
    ttft_p99_ns: int | None
    ttft_mean_ns: float | None
    ttft_max_ns: int | None


@dataclass(frozen=True)
class LoadBackTotals:
    num_requests: int  # requests that loaded something back
    num_transfers: int
    loaded_tokens: int
    bytes: int
    pages: int
    runs: int
    link_busy_ns: int  # sum of load-back transfer durations
    exposed_ns: int
    queued_ns: int
    achieved_bytes_per_s: float | None
    link_peak_bytes_per_s: float | None
    link_peak_share: float | None
    loadbacks_per_s: float | None  # over the run's span of virtual time
    loadback_bytes_per_s: float | None
    num_prefetches: int
    prefetch_bytes: int
    storage_wait_ns: int


@dataclass(frozen=True)
class SkipCount:
    tier: str  # host (load-back skipped) | storage (storage part not used)
    reason: str
    num_requests: int
    tokens: int


@dataclass(frozen=True)
class EvictionCount:
    tier: str
    action: str
    num_events: int
    tokens: int


@dataclass(frozen=True)
class RequestCount:
    req_id: str
    num_events: int
    tokens: int


@dataclass(frozen=True)
class ReasonCount:
    reason: str
    num_requests: int
    tokens: int


@dataclass(frozen=True)
class CauseShare:
    """How much of the run's TTFT, and of its excess, each cause accounts for."""

    cause: str
    num_requests: int  # requests whose primary cause this is
    ttft_part_ns: int | None  # run total of its TTFT component (None for "none")
    ttft_share: float | None
    excess_part_ns: int | None
    excess_share: float | None


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    run_name: str
    status: str
    trace_path: str
    model: str | None
    gpu: str | None
    num_requests: int
    num_finished: int
    num_rejected: int
    rejected_reasons: tuple[ReasonCount, ...]
    span_ns: int
    tokens: TierSplit
    hit_requests: int
    hit_request_share: float | None
    reused_token_share: float | None
    median_reused_tokens_per_hit: float | None
    classes: tuple[ClassStats, ...]
    load_back: LoadBackTotals
    skipped: tuple[SkipCount, ...]
    evictions: tuple[EvictionCount, ...]
    most_evicted_from: tuple[RequestCount, ...]  # owners of evicted pages
    top_evictors: tuple[RequestCount, ...]  # whose allocations forced evictions
    time_by_cause: tuple[CauseShare, ...]
    ttft_total_ns: int
    excess_total_ns: int
    diagnosis: object = None  # advice.RunDiagnosis: the run's root cause and what to change (summary.py)
    sessions: object = None  # sessions.SessionSummary (summary.py; None: no sessions)
    ranks: object = None  # ranks.RankSummary (summary.py; None: a run of one rank)
    miss_reasons: object = None  # {reason: tokens} (miss_reasons.py, read-time; None: no reasons recorded)
    size_curves: object = None  # size_curves.SizeCurves (summary.py, with the diagnosis; None: none)

    def to_json(self) -> dict:
        d = dataclass_json(self)
        d["diagnosis"] = self.diagnosis.to_json() if self.diagnosis is not None else None
        d["sessions"] = self.sessions.to_json() if self.sessions is not None else None
        # Only a run of more than one rank has the key: a one-rank run's JSON is as before.
        d.pop("ranks")
        if self.ranks is not None:
            d["ranks"] = self.ranks.to_json()
        d["session_survival"] = ([b.to_json() for b in self.sessions.survival] if self.sessions is not None
                                 else None)
        d["size_curves"] = self.size_curves.to_json() if self.size_curves is not None else None
        return d


def _i(v) -> int:
    return int(v or 0)


_SPAN = span_columns_sql("all")  # the run's clock: every request


def _tokens_and_counts(con: duckdb.DuckDBPyConnection, rid: str) -> dict:
    return fetch_one(con, f"""
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
        FROM requests WHERE run_id = ?""", [rid]) or {}


def _classes(con: duckdb.DuckDBPyConnection, rid: str) -> tuple[ClassStats, ...]:
    rows = fetch_dicts(con, f"""
        SELECT coalesce(hit_class, 'all') AS hit_class, grouping(hit_class) AS is_total,
               count(*) AS n, sum(input_tokens) AS input_tokens,
               sum(device_hit_tokens + host_hit_tokens + storage_hit_tokens) AS reused_tokens,
               quantile_disc(ttft_ns, 0.5) AS p50, quantile_disc(ttft_ns, 0.9) AS p90,
               quantile_disc(ttft_ns, 0.99) AS p99, avg(ttft_ns) AS mean, max(ttft_ns) AS max
        FROM requests WHERE run_id = ? AND {_FINISHED}
        GROUP BY GROUPING SETS ((hit_class), ())""", [rid])
    order = {"device_hit": 0, "tiered_hit": 1, "miss": 2}
    rows.sort(key=lambda r: (r["is_total"], order.get(r["hit_class"], 3), r["hit_class"]))
    return tuple(ClassStats(
        hit_class="all" if r["is_total"] else r["hit_class"], num_requests=_i(r["n"]),
        input_tokens=_i(r["input_tokens"]), reused_tokens=_i(r["reused_tokens"]), ttft_p50_ns=r["p50"],
        ttft_p90_ns=r["p90"], ttft_p99_ns=r["p99"], ttft_mean_ns=r["mean"], ttft_max_ns=r["max"])
        for r in rows)


def compute_run_summary(con: duckdb.DuckDBPyConnection, run: RunInfo) -> RunSummary:
    """`summary.run_summary`'s numbers from the run's rows, without the diagnosis (what evidence.py stores)."""
    rid = run.run_id
    t = _tokens_and_counts(con, rid)
    span_ns = max(_i(t.get("t1")) - _i(t.get("t0")), 0)
    split = TierSplit(
        input_tokens=_i(t.get("input_tokens")), device_tokens=_i(t.get("device_tokens")),
        host_tokens=_i(t.get("host_tokens")), storage_tokens=_i(t.get("storage_tokens")),
        computed_tokens=_i(t.get("computed_tokens")), recomputed_tokens=_i(t.get("recomputed_tokens")),
        loadback_skipped_tokens=_i(t.get("loadback_skipped_tokens")))
    finished = _i(t.get("finished"))

    rejected = tuple(ReasonCount(reason=r["reason"], num_requests=_i(r["n"]), tokens=_i(r["tokens"]))
                     for r in fetch_dicts(con, f"""
        SELECT coalesce(reject_reason, 'unknown') AS reason, count(*) AS n, sum(input_tokens) AS tokens
        FROM requests WHERE run_id = ? AND NOT ({_FINISHED}) GROUP BY 1 ORDER BY n DESC, reason""", [rid]))

    tr = fetch_one(con, """
        SELECT count(*) FILTER (WHERE kind = 'load_back') AS n,
               sum(bytes) FILTER (WHERE kind = 'load_back') AS bytes,
               sum(pages) FILTER (WHERE kind = 'load_back') AS pages,
               sum(runs) FILTER (WHERE kind = 'load_back') AS runs,
               sum(t_end_ns - t_start_ns) FILTER (WHERE kind = 'load_back') AS busy,
               count(*) FILTER (WHERE kind = 'prefetch') AS prefetches,
               sum(bytes) FILTER (WHERE kind = 'prefetch') AS prefetch_bytes
        FROM transfers WHERE run_id = ?""", [rid]) or {}
    lb_bytes, busy = _i(tr.get("bytes")), _i(tr.get("busy"))
    achieved = lb_bytes * NS_PER_S / busy if lb_bytes and busy else None
    peak = link_peak_bytes_per_s(run)
    load_back = LoadBackTotals(
        num_requests=_i(t.get("lb_requests")), num_transfers=_i(tr.get("n")),
        loaded_tokens=_i(t.get("loaded_tokens")), bytes=lb_bytes, pages=_i(tr.get("pages")),
        runs=_i(tr.get("runs")), link_busy_ns=busy, exposed_ns=_i(t.get("exposed_ns")),
        queued_ns=_i(t.get("queued_ns")), achieved_bytes_per_s=achieved, link_peak_bytes_per_s=peak,
        link_peak_share=share(achieved, peak),
        loadbacks_per_s=_i(tr.get("n")) * NS_PER_S / span_ns if span_ns else None,
        loadback_bytes_per_s=lb_bytes * NS_PER_S / span_ns if span_ns else None,
        num_prefetches=_i(tr.get("prefetches")), prefetch_bytes=_i(tr.get("prefetch_bytes")),
        storage_wait_ns=_i(t.get("storage_wait_ns")))

    skipped = tuple(SkipCount(tier=r["tier"], reason=r["reason"], num_requests=_i(r["n"]), tokens=_i(r["tokens"]))
                    for r in fetch_dicts(con, f"""
        SELECT 'host' AS tier, loadback_skipped_reason AS reason, count(*) AS n,
               sum(loadback_skipped_tokens) AS tokens
        FROM requests WHERE run_id = ? AND {_FINISHED} AND loadback_skipped_reason IS NOT NULL GROUP BY 2
        UNION ALL
        SELECT 'storage', storage_skipped_reason, count(*),
               sum(storage_match_tokens - storage_hit_tokens)
        FROM requests WHERE run_id = ? AND {_FINISHED} AND storage_skipped_reason IS NOT NULL GROUP BY 2
        ORDER BY 1, 3 DESC, 2""", [rid, rid]))

    tier_order = {"device": 0, "host": 1, "storage": 2}
    ev_rows = fetch_dicts(con, """
        SELECT tier, action, count(*) AS n, sum(tokens) AS tokens FROM evictions WHERE run_id = ?
        GROUP BY tier, action""", [rid])
    # A NULL tier or action (hand-made or foreign rows; the engine writes neither) sorts last.
    ev_rows.sort(key=lambda r: (tier_order.get(r["tier"], 3), r["tier"] is None, r["tier"] or "",
                                r["action"] is None, r["action"] or ""))
    evictions = tuple(EvictionCount(tier=r["tier"], action=r["action"], num_events=_i(r["n"]),
                                    tokens=_i(r["tokens"])) for r in ev_rows)

    def top_by(column: str) -> tuple[RequestCount, ...]:
        return tuple(RequestCount(req_id=r["req_id"], num_events=_i(r["n"]), tokens=_i(r["tokens"]))
                     for r in fetch_dicts(con, f"""
            SELECT {column} AS req_id, count(*) AS n, sum(tokens) AS tokens FROM evictions
            WHERE run_id = ? AND {column} IS NOT NULL GROUP BY 1 ORDER BY n DESC, tokens DESC, req_id
            LIMIT {TOP_EVICTED}""", [rid]))

    cause_counts = {r["cause"]: _i(r["n"]) for r in fetch_dicts(con, f"""
        SELECT {cause_sql()} AS cause, count(*) AS n FROM requests WHERE run_id = ? AND {_FINISHED}
        GROUP BY 1""", [rid])}
    ttft_total, excess_total = _i(t.get("ttft_ns")), _i(t.get("excess_ns"))
    part_of = {"queueing": ("queue_ns", "queue_ns"), "load_back": ("exposed_ns", "exposed_ns"),
               "storage_fetch": ("storage_wait_ns", "storage_wait_ns"),
               "routing": ("routing_ns", "routing_ns"), "recompute": ("recompute_rest_ns", "recompute_rest_ns"),
               "compute": ("compute_ns", "compute_excess_ns")}
    # Shares of excess are of the excess, or of the parts' sum where the parts add up to more: a
    # request sharing a prefill batch can wait longer than its excess (its compute there is below
    # its ideal), and no share is shown above 100 % (issue 40).
    parts_total = sum(_i(t.get(part_of[c][1])) for c in CAUSES if c != "none")
    excess_base = max(excess_total, parts_total)
    time_by_cause = []
    for cause in CAUSES:
        if cause == "none":
            time_by_cause.append(CauseShare(cause, cause_counts.get(cause, 0), None, None, None, None))
            continue
        ttft_key, excess_key = part_of[cause]
        ttft_part, excess_part = _i(t.get(ttft_key)), _i(t.get(excess_key))
        time_by_cause.append(CauseShare(
            cause=cause, num_requests=cause_counts.get(cause, 0), ttft_part_ns=ttft_part,
            ttft_share=share(ttft_part, ttft_total), excess_part_ns=excess_part,
            excess_share=share(excess_part, excess_base) if excess_total > 0 else None))

    hit_requests = _i(t.get("hit_requests"))
    return RunSummary(
        run_id=rid, run_name=run.name, status=run.status, trace_path=run.trace_path,
        model=run.config.get("model"), gpu=run.config.get("gpu"), num_requests=_i(t.get("n")),
        num_finished=finished, num_rejected=_i(t.get("n")) - finished, rejected_reasons=rejected,
        span_ns=span_ns, tokens=split, hit_requests=hit_requests,
        hit_request_share=share(hit_requests, finished),
        reused_token_share=share(split.device_tokens + split.host_tokens + split.storage_tokens,
                                 split.input_tokens),
        median_reused_tokens_per_hit=t.get("median_hit"), classes=_classes(con, rid), load_back=load_back,
        skipped=skipped, evictions=evictions, most_evicted_from=top_by("owner_req_id"),
        top_evictors=top_by("cause_req_id"), time_by_cause=tuple(time_by_cause),
        ttft_total_ns=ttft_total, excess_total_ns=excess_total,
    )
