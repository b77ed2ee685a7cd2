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
from typing import Any, Callable

import duckdb

from tierdiag.config.names import Cause
from tierdiag.diagnose.request.causes import CAUSES
from tierdiag.diagnose.read.query import dataclass_json, link_peak_bytes_per_s
from tierdiag.diagnose.read import totals as read
from tierdiag.diagnose.read.run_scan import RunScan
from tierdiag.diagnose.request.tokens import TokenSplit
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


def _classes(con: duckdb.DuckDBPyConnection, rid: str) -> tuple[ClassStats, ...]:
    rows = read.class_totals(con, rid)
    order = {"device_hit": 0, "tiered_hit": 1, "miss": 2}
    rows.sort(key=lambda r: (r.is_total, order.get(r.hit_class, 3), r.hit_class))
    return tuple(ClassStats(
        hit_class="all" if r.is_total else r.hit_class, num_requests=_i(r.requests),
        input_tokens=_i(r.input_tokens), reused_tokens=_i(r.reused_tokens), ttft_p50_ns=r.ttft_p50_ns,
        ttft_p90_ns=r.ttft_p90_ns, ttft_p99_ns=r.ttft_p99_ns, ttft_mean_ns=r.ttft_mean_ns, ttft_max_ns=r.ttft_max_ns)
        for r in rows)


def compute_run_summary(con: duckdb.DuckDBPyConnection, run: RunInfo, *,
                        cause_counts: Callable[[], dict[str, int] | None] | None = None,
                        scan: Callable[[], RunScan] | None = None,
                        evictions: Callable[[], Any] | None = None) -> RunSummary:
    """`summary.run_summary`'s numbers from the run's rows, without the diagnosis (what evidence.py stores).
    `cause_counts`, if given, is asked last for the finished requests per primary cause (the run
    story's, story.py `run_story(cause_counts=...)`: the run's close computes both, issue 41);
    where it gives None they are queried (read/totals.py `requests_by_cause`), as without it.
    `scan`, if given, gives the run's request and transfer totals (read/run_scan.py: one query
    for these, the run context's and the run totals', issue 41 session 26); else queried here.
    `evictions`, if given, gives the eviction queries' results folded while the run was recorded
    (eviction_rows.py `EvictionResults`: the evictions by tier and action; issue 41 session 34);
    where it is None, queried here."""
    rid = run.run_id
    s = scan() if scan is not None else None
    t = read.request_totals(con, rid) if s is None else s.totals
    span_ns = max(_i(t.t1_ns) - _i(t.t0_ns), 0)
    split = TierSplit(
        input_tokens=_i(t.input_tokens), device_tokens=_i(t.device_tokens),
        host_tokens=_i(t.host_tokens), storage_tokens=_i(t.storage_tokens),
        computed_tokens=_i(t.computed_tokens), recomputed_tokens=_i(t.recomputed_tokens),
        loadback_skipped_tokens=_i(t.loadback_skipped_tokens))
    finished = _i(t.finished)

    rejected = tuple(ReasonCount(reason=r.reason, num_requests=_i(r.requests), tokens=_i(r.tokens))
                     for r in read.rejected_by_reason(con, rid))

    tr = read.transfer_totals(con, rid) if s is None else s.transfers
    lb_bytes, busy = _i(tr.loadback_bytes), _i(tr.loadback_busy_ns)
    achieved = lb_bytes * NS_PER_S / busy if lb_bytes and busy else None
    peak = link_peak_bytes_per_s(run)
    load_back = LoadBackTotals(
        num_requests=_i(t.loadback_requests), num_transfers=_i(tr.loadbacks),
        loaded_tokens=_i(t.loaded_tokens), bytes=lb_bytes, pages=_i(tr.loadback_pages),
        runs=_i(tr.loadback_runs), link_busy_ns=busy, exposed_ns=_i(t.exposed_ns),
        queued_ns=_i(t.queued_ns), achieved_bytes_per_s=achieved, link_peak_bytes_per_s=peak,
        link_peak_share=share(achieved, peak),
        loadbacks_per_s=_i(tr.loadbacks) * NS_PER_S / span_ns if span_ns else None,
        loadback_bytes_per_s=lb_bytes * NS_PER_S / span_ns if span_ns else None,
        num_prefetches=_i(tr.prefetches), prefetch_bytes=_i(tr.prefetch_bytes),
        storage_wait_ns=_i(t.storage_wait_ns))

    skipped = tuple(SkipCount(tier=r.tier, reason=r.reason, num_requests=_i(r.requests), tokens=_i(r.tokens))
                    for r in read.skipped_by_reason(con, rid))

    tier_order = {"device": 0, "host": 1, "storage": 2}
    folded = evictions() if evictions is not None else None
    ev_rows = read.evictions_by_tier(con, rid) if folded is None else list(folded.by_tier)
    # A NULL tier or action (hand-made or foreign rows; the engine writes neither) sorts last.
    ev_rows.sort(key=lambda r: (tier_order.get(r.tier, 3), r.tier is None, r.tier or "",
                                r.action is None, r.action or ""))
    evictions = tuple(EvictionCount(tier=r.tier, action=r.action, num_events=_i(r.events),
                                    tokens=_i(r.tokens)) for r in ev_rows)

    def top_by(column: str) -> tuple[RequestCount, ...]:
        return tuple(RequestCount(req_id=r.req_id, num_events=_i(r.events), tokens=_i(r.tokens))
                     for r in read.evictions_by_request(con, rid, column, TOP_EVICTED))

    classes = _classes(con, rid)
    most_evicted_from, top_evictors = top_by("owner_req_id"), top_by("cause_req_id")
    counts = cause_counts() if cause_counts is not None else None  # last: the story's thread may still count them
    if counts is None:
        counts = read.requests_by_cause(con, rid)
    ttft_total, excess_total = _i(t.ttft_ns), _i(t.excess_ns)
    part_of = {Cause.QUEUEING: ("queue_ns", "queue_ns"), Cause.LOAD_BACK: ("exposed_ns", "exposed_ns"),
               Cause.STORAGE_FETCH: ("storage_wait_ns", "storage_wait_ns"),
               Cause.ROUTING: ("routing_ns", "routing_ns"), Cause.RECOMPUTE: ("recompute_rest_ns", "recompute_rest_ns"),
               Cause.COMPUTE: ("compute_ns", "compute_excess_ns")}
    # Shares of excess are of the excess, or of the parts' sum where the parts add up to more: a
    # request sharing a prefill batch can wait longer than its excess (its compute there is below
    # its ideal), and no share is shown above 100 % (issue 40).
    parts_total = sum(_i(getattr(t, part_of[c][1])) for c in CAUSES if c != Cause.NONE)
    excess_base = max(excess_total, parts_total)
    time_by_cause = []
    for cause in CAUSES:
        if cause == Cause.NONE:
            time_by_cause.append(CauseShare(cause, counts.get(cause, 0), None, None, None, None))
            continue
        ttft_key, excess_key = part_of[cause]
        ttft_part, excess_part = _i(getattr(t, ttft_key)), _i(getattr(t, excess_key))
        time_by_cause.append(CauseShare(
            cause=cause, num_requests=counts.get(cause, 0), ttft_part_ns=ttft_part,
            ttft_share=share(ttft_part, ttft_total), excess_part_ns=excess_part,
            excess_share=share(excess_part, excess_base) if excess_total > 0 else None))

    hit_requests = _i(t.hit_requests)
    return RunSummary(
        run_id=rid, run_name=run.name, status=run.status, trace_path=run.trace_path,
        model=run.config.get("model"), gpu=run.config.get("gpu"), num_requests=_i(t.requests),
        num_finished=finished, num_rejected=_i(t.requests) - finished, rejected_reasons=rejected,
        span_ns=span_ns, tokens=split, hit_requests=hit_requests,
        hit_request_share=share(hit_requests, finished),
        reused_token_share=share(split.device_tokens + split.host_tokens + split.storage_tokens,
                                 split.input_tokens),
        median_reused_tokens_per_hit=t.median_hit_tokens, classes=classes, load_back=load_back,
        skipped=skipped, evictions=evictions, most_evicted_from=most_evicted_from,
        top_evictors=top_evictors, time_by_cause=tuple(time_by_cause),
        ttft_total_ns=ttft_total, excess_total_ns=excess_total,
    )
