"""Observed runs (imported from a server's own export): agreement with a replayed twin, explain,
slow and summary where the server's numbers are all there is.

An observed run holds what SGLang reported per request (tier split, arrival, queue time, TTFT,
storage prefetch wait) and NULL for what it did not (load-back bytes and time, evictions, the
ideal TTFT). Its *twin* is a replay of the trace the import wrote (`--trace-out`): the same
requests, same ids, through the reference engine with the server's cache sizes. The twin
supplies what the server cannot (steps 3-4 of the troubleshooting order), and comparing the two
request by request measures how far the engine is from the real server on this workload::

    observed (server)          replayed twin (engine)
    req 7: 2048 dev  512 host  req 7: 2048 dev  448 host   |diff| <= one page per tier -> match
           TTFT 240 ms                TTFT 205 ms          TTFT error -35 ms (-15 %)

Every sentence here is built from the two runs' rows; what neither knows is said to be unknown.

    observed_twin.py      the twin, and the agreement of the two runs (compare OBSERVED TWIN)
    observed_explain.py   explain for an observed request
    observed.py           slow and summary of an observed run; the names above, for the CLI
"""


from __future__ import annotations

from dataclasses import dataclass

import duckdb

from tierdiag.config.names import Cause
from tierdiag.diagnose.twin.observed_explain import (  # noqa: F401 - observed runs' views, one import for the CLI
    MAJORITY_SHARE,
    ObservedExplanation,
    ObservedParts,
    ObservedStep,
    explain_observed,
)
from tierdiag.diagnose.twin.observed_twin import (  # noqa: F401
    Agreement,
    RequestPair,
    TierTotals,
    Twin,
    agreement,
    find_twin,
)
from tierdiag.diagnose.read.query import dataclass_json
from tierdiag.diagnose.read import observed as read_obs
from tierdiag.diagnose.read import queries
from tierdiag.store.reader import RunInfo
from tierdiag.units import share

NOT_REPORTED = ("load-back bytes and time per request", "exposed vs overlapped load-back", "evictions",
                "the ideal TTFT (all reused tokens device-resident, no queueing)", "cache_protected_len",
                "page size")


# --------------------------------------------------------------------------- slow and summary


@dataclass(frozen=True)
class ObservedSlow:
    rank: int
    req_id: str
    hit_class: str | None
    arrival_ns: int | None
    ttft_ns: int
    queue_ns: int | None
    storage_wait_ns: int | None
    input_tokens: int
    device_tokens: int | None
    host_tokens: int | None
    storage_tokens: int | None
    computed_tokens: int | None
    server_cause: str | None  # queueing | storage_fetch when most of TTFT; else None (unknown)

    def to_json(self) -> dict:
        return dataclass_json(self)


def slow_observed(con: duckdb.DuckDBPyConnection, run: RunInfo, *, top: int = 20, hit_class: str | None = None,
                  cause: str | None = None) -> list[ObservedSlow]:
    """Finished requests ranked by their server-reported TTFT (no ideal TTFT is known)."""
    from tierdiag.diagnose.request.slow import check_hit_class
    from tierdiag.errors import ConfigError

    if top < 1:
        raise ConfigError(f"--top must be at least 1, got {top}")
    check_hit_class(hit_class)
    if cause is not None and cause not in (Cause.QUEUEING, Cause.STORAGE_FETCH):
        raise ConfigError(f"--cause {cause} cannot be told from an observed run (the server reports only "
                          f"queueing and storage_fetch); explain a request to use its replayed twin")
    rows = queries.slowest_observed(con, run, top=top, hit_class=hit_class, cause=cause)
    return [ObservedSlow(
        rank=i, req_id=r.req_id, hit_class=r.hit_class, arrival_ns=r.arrival_ns, ttft_ns=r.ttft_ns,
        queue_ns=r.queue_ns, storage_wait_ns=r.storage_wait_ns, input_tokens=r.input_tokens,
        device_tokens=r.device_hit_tokens, host_tokens=r.host_hit_tokens,
        storage_tokens=r.storage_hit_tokens, computed_tokens=r.computed_tokens,
        server_cause=server) for i, (r, server) in enumerate(rows, start=1)]


@dataclass(frozen=True)
class ObservedClass:
    hit_class: str  # device_hit | tiered_hit | miss | unknown | all
    num_requests: int
    input_tokens: int
    ttft_p50_ns: int | None
    ttft_p90_ns: int | None
    ttft_p99_ns: int | None
    queue_p50_ns: int | None


@dataclass(frozen=True)
class ObservedSummary:
    run_id: str
    run_name: str
    kind: str
    export_files: tuple[str, ...]
    num_requests: int
    num_finished: int
    num_aborted: int
    num_split_unknown: int
    num_with_ttft: int
    span_ns: int | None
    input_tokens: int  # of the requests with a known split
    device_tokens: int
    host_tokens: int
    storage_tokens: int
    computed_tokens: int
    hit_request_share: float | None
    reused_token_share: float | None
    classes: tuple[ObservedClass, ...]
    ttft_total_ns: int | None
    queue_total_ns: int | None
    storage_wait_total_ns: int | None
    queue_share_of_ttft: float | None
    requests_mostly_queueing: int
    not_reported: tuple[str, ...]
    twin: Twin | None
    agreement: Agreement | None

    def to_json(self) -> dict:
        return dataclass_json(self)


def observed_summary(con: duckdb.DuckDBPyConnection, run: RunInfo) -> ObservedSummary:
    rid = run.run_id
    t = read_obs.observed_totals(con, rid)
    classes = tuple(ObservedClass(
        hit_class="all" if r.is_total else (r.hit_class or "unknown"), num_requests=int(r.requests),
        input_tokens=int(r.input_tokens or 0), ttft_p50_ns=r.ttft_p50_ns, ttft_p90_ns=r.ttft_p90_ns,
        ttft_p99_ns=r.ttft_p99_ns, queue_p50_ns=r.queue_p50_ns)
        for r in sorted(read_obs.observed_classes(con, rid),
                        key=lambda r: (r.is_total, {"device_hit": 0, "tiered_hit": 1, "miss": 2}.get(
                            r.hit_class, 3))))
    twin = find_twin(con, run)
    agree = None
    if twin is not None:
        from tierdiag.store.reader import resolve_run

        agree = agreement(con, run, resolve_run(con, twin.run_id))
    reused = int(t.device_tokens or 0) + int(t.host_tokens or 0) + int(t.storage_tokens or 0)
    ttft = t.ttft_ns
    return ObservedSummary(
        run_id=rid, run_name=run.name, kind=run.kind, export_files=tuple(run.config.get("export_files") or ()),
        num_requests=int(t.requests), num_finished=int(t.finished), num_aborted=int(t.aborted),
        num_split_unknown=int(t.split_unknown), num_with_ttft=int(t.with_ttft),
        span_ns=(int(t.last_event_ns or 0) - int(t.first_arrival_ns)) if t.first_arrival_ns is not None else None,
        input_tokens=int(t.input_tokens or 0), device_tokens=int(t.device_tokens or 0),
        host_tokens=int(t.host_tokens or 0), storage_tokens=int(t.storage_tokens or 0),
        computed_tokens=int(t.computed_tokens or 0), hit_request_share=share(int(t.hit_requests), int(t.split_known)),
        reused_token_share=share(reused, int(t.input_tokens or 0)),
        classes=classes, ttft_total_ns=int(ttft) if ttft is not None else None,
        queue_total_ns=int(t.queue_ns) if t.queue_ns is not None else None,
        storage_wait_total_ns=int(t.storage_wait_ns) if t.storage_wait_ns is not None else None,
        queue_share_of_ttft=share(t.queue_ns, ttft), requests_mostly_queueing=int(t.mostly_queueing),
        not_reported=NOT_REPORTED, twin=twin, agreement=agree)
