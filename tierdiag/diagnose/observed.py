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
from tierdiag.diagnose.observed_explain import (  # noqa: F401 - observed runs' views, one import for the CLI
    MAJORITY_SHARE,
    ObservedExplanation,
    ObservedParts,
    ObservedStep,
    explain_observed,
    server_cause_sql,
)
from tierdiag.diagnose.observed_twin import (  # noqa: F401
    Agreement,
    RequestPair,
    TierTotals,
    Twin,
    agreement,
    find_twin,
)
from tierdiag.diagnose.query import dataclass_json, fetch_dicts, fetch_one
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
    from tierdiag.diagnose.slow import check_hit_class
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
    t = fetch_one(con, f"""
        SELECT count(*) AS n, count(*) FILTER (WHERE status = 'finished') AS finished,
               count(*) FILTER (WHERE status = 'aborted') AS aborted,
               count(*) FILTER (WHERE device_hit_tokens IS NULL) AS unknown,
               count(ttft_ns) AS with_ttft,
               sum(input_tokens) FILTER (WHERE device_hit_tokens IS NOT NULL) AS input_tokens,
               sum(device_hit_tokens) AS d, sum(host_hit_tokens) AS h, sum(storage_hit_tokens) AS s,
               sum(computed_tokens) FILTER (WHERE device_hit_tokens IS NOT NULL) AS c,
               count(*) FILTER (WHERE device_hit_tokens + host_hit_tokens + storage_hit_tokens > 0) AS hits,
               count(device_hit_tokens) AS known,
               min(arrival_ns) AS t0, max(coalesce(finish_ns, first_token_ns, arrival_ns)) AS t1,
               sum(ttft_ns) AS ttft, sum(queue_ns) FILTER (WHERE ttft_ns IS NOT NULL) AS queue,
               sum(storage_wait_ns) AS wait,
               count(*) FILTER (WHERE ({server_cause_sql()}) = 'queueing') AS mostly_queueing
        FROM requests WHERE run_id = ?""", [rid]) or {}
    i = lambda k: int(t.get(k) or 0)  # noqa: E731
    classes = tuple(ObservedClass(
        hit_class="all" if r["is_total"] else (r["hit_class"] or "unknown"), num_requests=int(r["n"]),
        input_tokens=int(r["input_tokens"] or 0), ttft_p50_ns=r["p50"], ttft_p90_ns=r["p90"], ttft_p99_ns=r["p99"],
        queue_p50_ns=r["q50"])
        for r in sorted(fetch_dicts(con, """
            SELECT hit_class, grouping(hit_class) AS is_total, count(*) AS n, sum(input_tokens) AS input_tokens,
                   quantile_disc(ttft_ns, 0.5) AS p50, quantile_disc(ttft_ns, 0.9) AS p90,
                   quantile_disc(ttft_ns, 0.99) AS p99, quantile_disc(queue_ns, 0.5) AS q50
            FROM requests WHERE run_id = ? AND status = 'finished' GROUP BY GROUPING SETS ((hit_class), ())""",
                                        [rid]),
                        key=lambda r: (r["is_total"], {"device_hit": 0, "tiered_hit": 1, "miss": 2}.get(
                            r["hit_class"], 3))))
    twin = find_twin(con, run)
    agree = None
    if twin is not None:
        from tierdiag.store.reader import resolve_run

        agree = agreement(con, run, resolve_run(con, twin.run_id))
    reused = i("d") + i("h") + i("s")
    ttft = t.get("ttft")
    return ObservedSummary(
        run_id=rid, run_name=run.name, kind=run.kind, export_files=tuple(run.config.get("export_files") or ()),
        num_requests=i("n"), num_finished=i("finished"), num_aborted=i("aborted"), num_split_unknown=i("unknown"),
        num_with_ttft=i("with_ttft"),
        span_ns=(i("t1") - i("t0")) if t.get("t0") is not None else None, input_tokens=i("input_tokens"),
        device_tokens=i("d"), host_tokens=i("h"), storage_tokens=i("s"), computed_tokens=i("c"),
        hit_request_share=share(i("hits"), i("known")), reused_token_share=share(reused, i("input_tokens")),
        classes=classes, ttft_total_ns=int(ttft) if ttft is not None else None,
        queue_total_ns=int(t["queue"]) if t.get("queue") is not None else None,
        storage_wait_total_ns=int(t["wait"]) if t.get("wait") is not None else None,
        queue_share_of_ttft=share(t.get("queue"), ttft), requests_mostly_queueing=i("mostly_queueing"),
        not_reported=NOT_REPORTED, twin=twin, agreement=agree)
