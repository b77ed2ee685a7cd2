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
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from tierdiag.diagnose.query import dataclass_json, fetch_dicts, fetch_one
from tierdiag.units import fmt_ms, fmt_pct, fmt_tokens, ns_to_ms, share
from tierdiag.errors import NotFoundError
from tierdiag.store.reader import RunInfo, list_runs

# A twin found by request ids (not by the trace's sha256) must share at least this share of the
# observed requests, with the same input length each.
TWIN_MIN_SHARED = 0.9
# A server-reported part of TTFT at least this share of it is named the primary cause; below,
# the unsplit rest (prefill with any load-back) could hold the cause, which the server does not say.
MAJORITY_SHARE = 0.5
# Page size when the replayed run does not record one (the engine's default, SGLang's too).
DEFAULT_PAGE_TOKENS = 64
TOP_PAIRS = 20

NOT_REPORTED = ("load-back bytes and time per request", "exposed vs overlapped load-back", "evictions",
                "the ideal TTFT (all reused tokens device-resident, no queueing)", "cache_protected_len",
                "page size")


# --------------------------------------------------------------------------- twin


@dataclass(frozen=True)
class Twin:
    run_id: str
    run_name: str
    matched_by: str  # trace_sha256 | request_ids
    num_shared: int  # observed requests also in the twin (same req_id)

    def describe(self) -> str:
        how = ("it replayed the trace this import wrote (same sha256)" if self.matched_by == "trace_sha256"
               else f"it holds {self.num_shared:,} of these requests with the same ids and input lengths")
        return f"replayed twin {self.run_name} ({self.run_id}): {how}"


def find_twin(con: duckdb.DuckDBPyConnection, run: RunInfo) -> Twin | None:
    """The newest complete replay of the same requests, if the database holds one."""
    replays = [r for r in list_runs(con) if r.kind == "replay" and r.run_id != run.run_id
               and r.status == "complete"]
    sha = run.config.get("trace_out_sha256")
    for r in reversed(replays):
        if sha and r.trace_sha256 == sha:
            return Twin(r.run_id, r.name, "trace_sha256", _shared(con, run.run_id, r.run_id))
    total = con.execute("SELECT count(*) FROM requests WHERE run_id = ?", [run.run_id]).fetchone()[0]
    for r in reversed(replays):
        n = _shared(con, run.run_id, r.run_id)
        if total and n >= TWIN_MIN_SHARED * total:
            return Twin(r.run_id, r.name, "request_ids", n)
    return None


def _shared(con: duckdb.DuckDBPyConnection, a: str, b: str) -> int:
    return int(con.execute(
        "SELECT count(*) FROM requests o JOIN requests r ON r.run_id = ? AND r.req_id = o.req_id "
        "AND r.input_tokens = o.input_tokens WHERE o.run_id = ?", [b, a]).fetchone()[0])


# --------------------------------------------------------------------------- agreement


@dataclass(frozen=True)
class RequestPair:
    req_id: str
    input_tokens: int | None
    observed_device_tokens: int | None
    observed_host_tokens: int | None
    observed_storage_tokens: int | None
    replayed_device_tokens: int | None
    replayed_host_tokens: int | None
    replayed_storage_tokens: int | None
    split_match: bool | None  # None: the observed split was not reported
    observed_ttft_ns: int | None
    replayed_ttft_ns: int | None
    ttft_error_ns: int | None  # replayed - observed
    ttft_rel_error: float | None  # (replayed - observed) / observed


@dataclass(frozen=True)
class TierTotals:
    device_tokens: int
    host_tokens: int
    storage_tokens: int
    computed_tokens: int


@dataclass(frozen=True)
class Agreement:
    """How well run B (replayed) reproduces run A (observed), request by request (same req_id)."""

    observed_run_id: str
    observed_run_name: str
    replayed_run_id: str
    replayed_run_name: str
    page_tokens: int
    num_observed: int
    num_replayed: int
    num_matched: int  # in both runs
    num_split_known: int  # matched, with a reported split
    num_split_match: int  # |observed - replayed| <= one page for device, host and storage
    split_match_share: float | None
    observed_tokens: TierTotals  # over the matched requests with a known split
    replayed_tokens: TierTotals
    num_ttft_pairs: int  # matched, TTFT on both sides
    ttft_abs_error_p50_ns: float | None
    ttft_abs_error_p90_ns: float | None
    ttft_rel_error_p50: float | None  # of |replayed - observed| / observed
    ttft_rel_error_p90: float | None
    ttft_bias_p50_ns: float | None  # median of replayed - observed (sign: + the engine is slower)
    requests: tuple[RequestPair, ...]  # the largest disagreements first (only when asked)

    def to_json(self) -> dict:
        return dataclass_json(self)

    def finding(self) -> str:
        """One paragraph, every figure from the fields above."""
        parts = [f"{self.num_matched:,} requests in both runs"]
        if self.num_observed - self.num_matched:
            parts.append(f"{self.num_observed - self.num_matched:,} only observed")
        if self.num_replayed - self.num_matched:
            parts.append(f"{self.num_replayed - self.num_matched:,} only replayed")
        text = ", ".join(parts) + "."
        if self.num_split_known:
            text += (f" The tier split matches within one page ({self.page_tokens} tokens per tier) for "
                     f"{self.num_split_match:,} of {self.num_split_known:,} ({fmt_pct(self.split_match_share)}).")
        else:
            text += " The observed run reports no tier split to compare."
        if self.num_ttft_pairs:
            text += (f" TTFT error over {self.num_ttft_pairs:,} requests: median {fmt_ms(self.ttft_abs_error_p50_ns)} "
                     f"({fmt_pct(self.ttft_rel_error_p50)}), p90 {fmt_ms(self.ttft_abs_error_p90_ns)} "
                     f"({fmt_pct(self.ttft_rel_error_p90)}); the replay is "
                     f"{'slower' if (self.ttft_bias_p50_ns or 0) > 0 else 'faster' if (self.ttft_bias_p50_ns or 0) < 0 else 'neither faster nor slower'}"
                     f" by a median {fmt_ms(abs(self.ttft_bias_p50_ns or 0))}.")
        else:
            text += " No request has a TTFT in both runs."
        return text


def _page_tokens(*runs: RunInfo) -> int:
    for r in runs:
        value = r.config.get("page_size")
        if value:
            return int(value)
    return DEFAULT_PAGE_TOKENS


_PAIRS = """
    WITH p AS (
        SELECT o.req_id, o.input_tokens,
               o.device_hit_tokens AS od, o.host_hit_tokens AS oh, o.storage_hit_tokens AS os,
               o.computed_tokens AS oc,
               r.device_hit_tokens AS rd, r.host_hit_tokens AS rh, r.storage_hit_tokens AS rs,
               r.computed_tokens AS rc,
               o.ttft_ns AS ot, r.ttft_ns AS rt, o.seq
        FROM requests o JOIN requests r ON r.run_id = $b AND r.req_id = o.req_id
        WHERE o.run_id = $a),
    q AS (
        SELECT *, CASE WHEN od IS NULL OR rd IS NULL THEN NULL
                       ELSE abs(od - rd) <= $page AND abs(coalesce(oh, 0) - coalesce(rh, 0)) <= $page
                            AND abs(coalesce(os, 0) - coalesce(rs, 0)) <= $page END AS split_match,
               CASE WHEN ot IS NOT NULL AND rt IS NOT NULL THEN rt - ot END AS err
        FROM p)
"""


def _named(con: duckdb.DuckDBPyConnection, sql: str, params: dict) -> list[dict]:
    """Rows as dicts, with DuckDB's named parameters ($name) — fetch_dicts takes positional ones."""
    cur = con.execute(sql, params)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


def agreement(con: duckdb.DuckDBPyConnection, observed: RunInfo, replayed: RunInfo, *,
              top: int | None = None) -> Agreement:
    """Per-request agreement of `replayed` with `observed`; `top` pairs listed, worst first."""
    page = _page_tokens(replayed, observed)
    params = {"a": observed.run_id, "b": replayed.run_id, "page": page}
    agg = _named(con, _PAIRS + """
        SELECT count(*) AS matched,
               count(split_match) AS split_known, count(*) FILTER (WHERE split_match) AS split_match,
               coalesce(sum(od) FILTER (WHERE split_match IS NOT NULL), 0) AS od,
               coalesce(sum(oh) FILTER (WHERE split_match IS NOT NULL), 0) AS oh,
               coalesce(sum(os) FILTER (WHERE split_match IS NOT NULL), 0) AS os,
               coalesce(sum(oc) FILTER (WHERE split_match IS NOT NULL), 0) AS oc,
               coalesce(sum(rd) FILTER (WHERE split_match IS NOT NULL), 0) AS rd,
               coalesce(sum(rh) FILTER (WHERE split_match IS NOT NULL), 0) AS rh,
               coalesce(sum(rs) FILTER (WHERE split_match IS NOT NULL), 0) AS rs,
               coalesce(sum(rc) FILTER (WHERE split_match IS NOT NULL), 0) AS rc,
               count(err) AS ttft_pairs,
               quantile_cont(abs(err), 0.5) AS abs50, quantile_cont(abs(err), 0.9) AS abs90,
               quantile_cont(abs(err) / ot, 0.5) FILTER (WHERE ot > 0) AS rel50,
               quantile_cont(abs(err) / ot, 0.9) FILTER (WHERE ot > 0) AS rel90,
               quantile_cont(err, 0.5) AS bias50
        FROM q""", params)[0]
    counts = dict(con.execute("SELECT run_id, count(*) FROM requests WHERE run_id IN (?, ?) GROUP BY run_id",
                              [observed.run_id, replayed.run_id]).fetchall())
    pairs: tuple[RequestPair, ...] = ()
    if top:
        rows = _named(con, _PAIRS + """
            SELECT * FROM q
            ORDER BY split_match NULLS LAST, abs(err) DESC NULLS LAST, seq, req_id LIMIT $top""",
                           {**params, "top": int(top)})
        pairs = tuple(RequestPair(
            req_id=r["req_id"], input_tokens=r["input_tokens"], observed_device_tokens=r["od"],
            observed_host_tokens=r["oh"], observed_storage_tokens=r["os"], replayed_device_tokens=r["rd"],
            replayed_host_tokens=r["rh"], replayed_storage_tokens=r["rs"], split_match=r["split_match"],
            observed_ttft_ns=r["ot"], replayed_ttft_ns=r["rt"], ttft_error_ns=r["err"],
            ttft_rel_error=r["err"] / r["ot"] if r["err"] is not None and r["ot"] else None) for r in rows)
    i = lambda k: int(agg.get(k) or 0)  # noqa: E731
    return Agreement(
        observed_run_id=observed.run_id, observed_run_name=observed.name, replayed_run_id=replayed.run_id,
        replayed_run_name=replayed.name, page_tokens=page, num_observed=int(counts.get(observed.run_id, 0)),
        num_replayed=int(counts.get(replayed.run_id, 0)), num_matched=i("matched"),
        num_split_known=i("split_known"), num_split_match=i("split_match"),
        split_match_share=share(i("split_match"), i("split_known")),
        observed_tokens=TierTotals(i("od"), i("oh"), i("os"), i("oc")),
        replayed_tokens=TierTotals(i("rd"), i("rh"), i("rs"), i("rc")),
        num_ttft_pairs=i("ttft_pairs"), ttft_abs_error_p50_ns=agg.get("abs50"),
        ttft_abs_error_p90_ns=agg.get("abs90"), ttft_rel_error_p50=agg.get("rel50"),
        ttft_rel_error_p90=agg.get("rel90"), ttft_bias_p50_ns=agg.get("bias50"), requests=pairs)


def observed_and_replayed(a: RunInfo, b: RunInfo) -> tuple[RunInfo, RunInfo] | None:
    """(observed, replayed) when exactly one of the two runs is observed, else None."""
    if a.kind == "observed" and b.kind != "observed":
        return a, b
    if b.kind == "observed" and a.kind != "observed":
        return b, a
    return None


# --------------------------------------------------------------------------- the server's TTFT


@dataclass(frozen=True)
class ObservedParts:
    """What SGLang's numbers say about one request's TTFT (ns; None = not reported)."""

    ttft_ns: int | None
    queue_ns: int | None
    storage_wait_ns: int | None
    rest_ns: int | None  # TTFT - queue - storage wait: prefill with any load-back, not split by the server

    @classmethod
    def from_row(cls, row: dict) -> "ObservedParts":
        ttft, queue, wait = row.get("ttft_ns"), row.get("queue_ns"), row.get("storage_wait_ns")
        rest = None
        if ttft is not None and queue is not None:
            rest = max(int(ttft) - int(queue) - int(wait or 0), 0)
        return cls(ttft, queue, wait, rest)

    def cause(self) -> str | None:
        """queueing / storage_fetch when that part is most of TTFT; None when the server's
        numbers cannot tell (the unsplit rest holds prefill and load-back alike)."""
        if not self.ttft_ns:
            return None
        for name, part in (("queueing", self.queue_ns), ("storage_fetch", self.storage_wait_ns)):
            if part is not None and part >= MAJORITY_SHARE * self.ttft_ns:
                return name
        return None


def _cause_sql() -> str:
    return (f"CASE WHEN ttft_ns > 0 AND queue_ns >= {MAJORITY_SHARE} * ttft_ns THEN 'queueing' "
            f"WHEN ttft_ns > 0 AND storage_wait_ns >= {MAJORITY_SHARE} * ttft_ns THEN 'storage_fetch' END")


# --------------------------------------------------------------------------- explain


@dataclass(frozen=True)
class ObservedStep:
    step: int
    name: str
    source: str  # server | replayed twin | unknown
    finding: str
    evidence: dict

    def to_json(self) -> dict:
        return {"step": self.step, "name": self.name, "source": self.source, "finding": self.finding,
                "evidence": self.evidence}


@dataclass(frozen=True)
class ObservedExplanation:
    run_id: str
    run_name: str
    req_id: str
    status: str
    hit_class: str | None
    ttft_ns: int | None
    tokens: dict  # input/device/host/storage/computed (None where not reported)
    parts: ObservedParts
    steps: tuple[ObservedStep, ...]
    primary_cause: str | None
    primary_cause_source: str | None  # server | replayed twin
    headline: str
    verdict: str
    twin: Twin | None
    twin_primary_cause: str | None
    counterfactual: dict
    evicted_by: tuple[str, ...]

    def to_json(self) -> dict:
        return {
            "run_id": self.run_id, "req_id": self.req_id, "class": self.hit_class,
            "ttft_ms": ns_to_ms(self.ttft_ns), "tokens": self.tokens,
            "steps": [s.to_json() for s in self.steps], "primary_cause": self.primary_cause,
            "counterfactual": self.counterfactual, "evicted_by": list(self.evicted_by),
            "kind": "observed", "run_name": self.run_name, "status": self.status,
            "primary_cause_source": self.primary_cause_source, "headline": self.headline,
            "verdict": self.verdict, "observed_ttft_parts": dataclass_json(self.parts),
            "twin": dataclass_json(self.twin) if self.twin else None,
            "twin_primary_cause": self.twin_primary_cause,
        }


def _row(con: duckdb.DuckDBPyConnection, run: RunInfo, req_id: str) -> dict:
    row = fetch_one(con, "SELECT * FROM requests WHERE run_id = ? AND req_id = ?", [run.run_id, req_id])
    if row is None:
        import difflib

        ids = [r[0] for r in con.execute("SELECT req_id FROM requests WHERE run_id = ?", [run.run_id]).fetchall()]
        close = difflib.get_close_matches(req_id, ids, n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(close)}?" if close else "list requests with `tierdiag slow`"
        raise NotFoundError(f"no request {req_id!r} in run {run.run_id} ({run.name})", hint=hint)
    return row


def _step1(row: dict) -> ObservedStep:
    d, h, s, c, n = (row.get(k) for k in ("device_hit_tokens", "host_hit_tokens", "storage_hit_tokens",
                                          "computed_tokens", "input_tokens"))
    ev = {"hit_class": row.get("hit_class"), "input_tokens": n, "device_hit_tokens": d, "host_hit_length": h,
          "storage_hit_tokens": s, "computed_tokens": c}
    if d is None:
        cached = None if c is None else n - c
        finding = (f"SGLang exported no cached_tokens_details for it: {fmt_tokens(cached)} of {fmt_tokens(n)} "
                   f"tokens were cached, split by tier not reported.")
    elif d + h + s == 0:
        finding = (f"miss (server-reported: cached_tokens_details null): nothing was reused; all "
                   f"{fmt_tokens(c)} tokens were computed.")
    elif h + s == 0:
        finding = (f"device hit (server-reported): {fmt_tokens(d)} of {fmt_tokens(n)} tokens reused, all "
                   f"device-resident (host_hit_length 0); {fmt_tokens(c)} computed.")
    else:
        finding = (f"tiered hit (server-reported): {fmt_tokens(d + h + s)} of {fmt_tokens(n)} tokens reused: "
                   f"{fmt_tokens(d)} device-resident, {fmt_tokens(h)} loaded back from host (host_hit_length "
                   f"{fmt_tokens(h)}), {fmt_tokens(s)} fetched from storage through host; {fmt_tokens(c)} computed.")
    return ObservedStep(1, "host_hit_length", "server", finding, ev)


def _step2(row: dict) -> ObservedStep:
    d, h, s = (row.get(k) for k in ("device_hit_tokens", "host_hit_tokens", "storage_hit_tokens"))
    if d is None:
        return ObservedStep(2, "prefix_indices", "unknown",
                            "without the tier split, the restored share of the prefix is not known.",
                            {"prefix_indices_len": None, "device_original_tokens": None, "restored_tokens": None})
    restored = h + s
    usable = d + restored
    ev = {"prefix_indices_len": usable, "device_original_tokens": d, "restored_tokens": restored,
          "restored_share": share(restored, usable), "cache_protected_len": None}
    if not usable:
        finding = "nothing was matched, so len(prefix_indices) is 0 and nothing was restored."
    else:
        finding = (f"len(prefix_indices) {fmt_tokens(usable)} = {fmt_tokens(d)} device original + "
                   f"{fmt_tokens(restored)} restored from host/storage: {fmt_pct(share(restored, usable))} of the "
                   f"usable prefix was restored rather than resident. cache_protected_len is not in SGLang's export.")
    return ObservedStep(2, "prefix_indices", "server", finding, ev)


def _unknown_steps(row: dict, run: RunInfo, parts: ObservedParts) -> tuple[ObservedStep, ObservedStep]:
    how = ("replay the trace written by `tierdiag import sglang --trace-out` with the server's cache sizes "
           "into this database to get it from the replayed twin")
    loaded = (row.get("host_hit_tokens") or 0) + (row.get("storage_hit_tokens") or 0)
    s3 = ("SGLang does not report per-request load-back bytes or time, so whether transfer cost amplified "
          "this request's latency cannot be known from the export")
    if loaded and parts.rest_ns is not None:
        s3 += (f"; {fmt_tokens(loaded)} tokens were loaded back, inside the {fmt_ms(parts.rest_ns)} of TTFT "
               f"that is neither queueing nor storage wait (prefill and load-back, not split by the server)")
    s4 = ("SGLang does not report evictions, so why the prefix was not on the device cannot be known from "
          "the export")
    ev = {"reported_by_server": False, "how_to_know": how}
    return (ObservedStep(3, "load_back", "unknown", f"{s3}; {how}.", dict(ev)),
            ObservedStep(4, "eviction", "unknown", f"{s4}; {how}.", dict(ev)))


def _twin_steps(con: duckdb.DuckDBPyConnection, twin: Twin, req_id: str, row: dict):
    """Steps 3-4 (and the twin's verdict) from the replayed twin's explanation of the same request."""
    from tierdiag.diagnose.explain import explain_request
    from tierdiag.store.reader import resolve_run

    twin_run = resolve_run(con, twin.run_id)
    try:
        expl = explain_request(con, twin_run, req_id)
    except NotFoundError:
        return None
    t = expl.tokens
    same = None
    if row.get("device_hit_tokens") is not None:
        page = _page_tokens(twin_run)
        same = (abs(t.device_tokens - row["device_hit_tokens"]) <= page
                and abs(t.host_tokens - (row["host_hit_tokens"] or 0)) <= page
                and abs(t.storage_tokens - (row["storage_hit_tokens"] or 0)) <= page)
    prefix = f"From the {twin.describe()}. "
    if same is False:
        prefix += (f"Its split differs from the server's ({fmt_tokens(t.device_tokens)} device / "
                   f"{fmt_tokens(t.host_tokens)} host / {fmt_tokens(t.storage_tokens)} storage replayed vs "
                   f"{fmt_tokens(row['device_hit_tokens'])} / {fmt_tokens(row['host_hit_tokens'])} / "
                   f"{fmt_tokens(row['storage_hit_tokens'])} observed), so read it as the engine's account. ")
    elif same:
        prefix += "Its tier split matches the server's within one page. "
    steps = []
    for s in expl.steps[2:4]:
        ev = dataclass_json(s.evidence)
        ev["twin_split_matches_server"] = same
        steps.append(ObservedStep(s.step, s.name, "replayed twin", prefix + s.finding, ev))
    return tuple(steps), expl


def explain_observed(con: duckdb.DuckDBPyConnection, run: RunInfo, req_id: str) -> ObservedExplanation:
    """The troubleshooting order for an imported request: steps 1-2 from the server's numbers,
    3-4 from its replayed twin when the database holds one, else what cannot be known."""
    req_id = str(req_id)
    row = _row(con, run, req_id)
    parts = ObservedParts.from_row(row)
    twin = find_twin(con, run)
    twin_result = _twin_steps(con, twin, req_id, row) if twin is not None else None
    steps34 = twin_result[0] if twin_result else _unknown_steps(row, run, parts)
    twin_expl = twin_result[1] if twin_result else None
    steps = (_step1(row), _step2(row)) + tuple(steps34)
    server_cause = parts.cause()
    twin_cause = twin_expl.primary_cause if twin_expl is not None else None
    cause, source = (server_cause, "server") if server_cause else (
        (twin_cause, "replayed twin") if twin_cause else (None, None))
    headline, verdict = _verdict(row, parts, server_cause, twin, twin_expl)
    counterfactual = {"ttft_if_device_resident_ms": None, "recompute_instead_ms": None}
    if twin_expl is not None:
        counterfactual = {"ttft_if_device_resident_ms": ns_to_ms(twin_expl.ttft_if_device_resident_ns),
                          "recompute_instead_ms": ns_to_ms(twin_expl.recompute_instead_ns),
                          "source": "replayed twin"}
    tokens = {"input": row.get("input_tokens"), "device": row.get("device_hit_tokens"),
              "host": row.get("host_hit_tokens"), "storage": row.get("storage_hit_tokens"),
              "computed": row.get("computed_tokens")}
    return ObservedExplanation(
        run_id=run.run_id, run_name=run.name, req_id=req_id, status=row.get("status") or "finished",
        hit_class=row.get("hit_class"), ttft_ns=row.get("ttft_ns"), tokens=tokens, parts=parts,
        steps=steps, primary_cause=cause, primary_cause_source=source, headline=headline, verdict=verdict,
        twin=twin if twin_expl is not None else None, twin_primary_cause=twin_cause,
        counterfactual=counterfactual, evicted_by=twin_expl.evicted_by if twin_expl is not None else ())


def _verdict(row: dict, parts: ObservedParts, server_cause: str | None, twin: Twin | None,
             twin_expl) -> tuple[str, str]:
    req = row["req_id"]
    if (row.get("status") or "finished") != "finished" and parts.ttft_ns is None:
        why = row.get("reject_reason") or "no reason recorded"
        return (f"{row.get('status')}: {why}",
                f"Request {req} was {row.get('status')} ({why}) before its first token; there is no TTFT to explain.")
    if parts.ttft_ns is None:
        return ("TTFT not reported",
                f"SGLang reported no first_token_latency for request {req} (it needs --enable-metrics), so "
                f"there is no TTFT to explain; its tier split is above.")
    ttft = parts.ttft_ns
    text = f"Request {req} took {fmt_ms(ttft)} to its first token (server-reported)"
    if parts.queue_ns is not None:
        text += (f": {fmt_ms(parts.queue_ns)} ({fmt_pct(share(parts.queue_ns, ttft))}) waiting in the queue"
                 + (f", {fmt_ms(parts.storage_wait_ns)} ({fmt_pct(share(parts.storage_wait_ns, ttft))}) waiting "
                    f"for a storage prefetch" if parts.storage_wait_ns else "")
                 + f", and {fmt_ms(parts.rest_ns)} ({fmt_pct(share(parts.rest_ns, ttft))}) in prefill with any "
                   f"load-back, which SGLang does not split.")
    else:
        text += "; the server did not report its queue time."
    if server_cause == "queueing":
        headline = f"queueing: {fmt_pct(share(parts.queue_ns, ttft))} of TTFT (server-reported)"
    elif server_cause == "storage_fetch":
        headline = f"storage_fetch: {fmt_pct(share(parts.storage_wait_ns, ttft))} of TTFT waiting for storage (server-reported)"
    else:
        headline = (f"TTFT {fmt_ms(ttft)}: no server-reported part is most of it"
                    if parts.queue_ns is not None else f"TTFT {fmt_ms(ttft)}: parts not reported")
    if twin_expl is not None:
        text += (f" The replayed twin ({twin.run_name}) took {fmt_ms(twin_expl.ttft_ns)} and says: "
                 f"{twin_expl.headline}.")
        if server_cause is None:
            headline += f"; the twin names {twin_expl.primary_cause}"
    else:
        text += (" Without a replayed twin, the share of the rest spent on load-back, recompute or new "
                 "compute cannot be known from the export.")
    return headline, text


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
    if cause is not None and cause not in ("queueing", "storage_fetch"):
        raise ConfigError(f"--cause {cause} cannot be told from an observed run (the server reports only "
                          f"queueing and storage_fetch); explain a request to use its replayed twin")
    rows = fetch_dicts(con, f"""
        SELECT * FROM (SELECT *, {_cause_sql()} AS server_cause FROM requests
                       WHERE run_id = ? AND status = 'finished' AND ttft_ns IS NOT NULL)
        WHERE (CAST(? AS VARCHAR) IS NULL OR hit_class = ?) AND (CAST(? AS VARCHAR) IS NULL OR server_cause = ?)
        ORDER BY ttft_ns DESC, seq, req_id LIMIT ?""", [run.run_id, hit_class, hit_class, cause, cause, top])
    return [ObservedSlow(
        rank=i, req_id=r["req_id"], hit_class=r["hit_class"], arrival_ns=r["arrival_ns"], ttft_ns=r["ttft_ns"],
        queue_ns=r["queue_ns"], storage_wait_ns=r["storage_wait_ns"], input_tokens=r["input_tokens"],
        device_tokens=r["device_hit_tokens"], host_tokens=r["host_hit_tokens"],
        storage_tokens=r["storage_hit_tokens"], computed_tokens=r["computed_tokens"],
        server_cause=r["server_cause"]) for i, r in enumerate(rows, start=1)]


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
               count(*) FILTER (WHERE ({_cause_sql()}) = 'queueing') AS mostly_queueing
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

