"""`explain` for an observed request (imported from a server's export): steps 1-2 from the
server's numbers, 3-4 from the replayed twin's explanation of the same request when the database
holds one (observed_twin.py), else what cannot be known, said so. Every sentence is built from
the two runs' rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from tierdiag.config.names import Cause, RunKind
from tierdiag.diagnose.request.explain import explain_request
from tierdiag.diagnose.twin.observed_twin import Twin, page_tokens, find_twin
from tierdiag.diagnose.read.query import dataclass_json
from tierdiag.diagnose.read import observed as read_obs
from tierdiag.diagnose.read import queries
from tierdiag.diagnose.twin.twin_error import ClassError, RankError, twin_clock, twin_error
from tierdiag.errors import NotFoundError
from tierdiag.store.reader import RunInfo
from tierdiag.units import fmt_ms, fmt_pct, fmt_tokens, ns_to_ms, share
from tierdiag.diagnose.read.requests import RequestRow, RowLike

from tierdiag.diagnose.request.causes import MAJORITY_SHARE  # noqa: F401 - the server's cause rule


# --------------------------------------------------------------------------- the server's TTFT


@dataclass(frozen=True)
class ObservedParts:
    """What SGLang's numbers say about one request's TTFT (ns; None = not reported)."""

    ttft_ns: int | None
    queue_ns: int | None
    storage_wait_ns: int | None
    rest_ns: int | None  # TTFT - queue - storage wait: prefill with any load-back, not split by the server

    @classmethod
    def from_row(cls, row: RowLike) -> "ObservedParts":
        row = RequestRow.of(row)
        ttft, queue, wait = row.ttft_ns, row.queue_ns, row.storage_wait_ns
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
class TwinTrust:
    """How far the twin's TTFT for this request was from the server's, beside the twin's error over
    all requests and the clock it ran on: how far to trust steps 3-4, which come from the twin."""

    twin_ttft_ns: int | None
    error_ns: int | None  # twin - server (+: the twin was slower); None: a TTFT missing on a side
    rel_error: float | None  # error / the server's TTFT
    run_error: ClassError | None  # the twin's error over every request with a TTFT on both sides
    clock: str
    # The server's data-parallel rank of this request and the twin's error over the requests that
    # rank served (None: the export names no rank); the rank the twin's router sent it to.
    dp_rank: int | None = None
    rank_error: RankError | None = None
    twin_dp_rank: int | None = None

    def sentence(self, *, clock: bool = True) -> str:
        if self.error_ns is None:
            text = "the twin's TTFT for this request cannot be set beside the server's (one of them is not known)"
        else:
            way = "slower" if self.error_ns > 0 else "faster" if self.error_ns < 0 else "neither slower nor faster"
            text = (f"the twin's TTFT for this request was {fmt_ms(self.twin_ttft_ns)}, "
                    f"{fmt_ms(abs(self.error_ns))} ({fmt_pct(abs(self.rel_error or 0))}) {way} than the server's")
        r = self.run_error
        if r is not None and r.num_requests:
            text += (f"; over {r.num_requests:,} requests its TTFT error is median {fmt_pct(r.median_rel)}, "
                     f"p90 {fmt_pct(r.p90_rel)}")
        k = self.rank_error
        if k is not None and k.num_requests:
            text += (f"; over the {k.num_requests:,} requests the server's dp_rank {k.dp_rank} served, median "
                     f"{fmt_pct(k.median_rel)}, p90 {fmt_pct(k.p90_rel)} (the twin sent {k.same_rank:,} of them to "
                     f"that rank" + (f", this one to rank {self.twin_dp_rank}" if self.twin_dp_rank is not None
                                     else "") + ")")
        return f"{text} ({self.clock})" if clock else text


def twin_trust(con: duckdb.DuckDBPyConnection, run: RunInfo, twin_run: RunInfo, row: RowLike, twin_ttft_ns: int | None,
               ) -> TwinTrust:
    row = RequestRow.of(row)
    server = row.ttft_ns
    err = None if server is None or twin_ttft_ns is None else int(twin_ttft_ns) - int(server)
    errors = twin_error(con, run.run_id, twin_run.run_id)
    rank = row.dp_rank
    twin_rank = None
    if rank is not None:
        twin_rank = read_obs.request_rank(con, twin_run.run_id, row.req_id)
    return TwinTrust(twin_ttft_ns, err, err / server if err is not None and server else None,
                     errors.by_class().get("all"), twin_clock(twin_run.config), rank,
                     errors.by_rank().get(rank) if rank is not None else None, twin_rank)


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
    twin_trust: TwinTrust | None = None  # how far the twin's TTFT was from the server's (None: no twin)

    def to_json(self) -> dict:
        return {
            "run_id": self.run_id, "req_id": self.req_id, "class": self.hit_class,
            "ttft_ms": ns_to_ms(self.ttft_ns), "tokens": self.tokens,
            "steps": [s.to_json() for s in self.steps], "primary_cause": self.primary_cause,
            "counterfactual": self.counterfactual, "evicted_by": list(self.evicted_by),
            "kind": RunKind.OBSERVED, "run_name": self.run_name, "status": self.status,
            "primary_cause_source": self.primary_cause_source, "headline": self.headline,
            "verdict": self.verdict, "observed_ttft_parts": dataclass_json(self.parts),
            "twin": dataclass_json(self.twin) if self.twin else None,
            "twin_primary_cause": self.twin_primary_cause,
            "twin_run_id": self.twin.run_id if self.twin else None,
            "twin_ttft_ms": ns_to_ms(self.twin_trust.twin_ttft_ns) if self.twin_trust else None,
            "twin_ttft_error_ms": ns_to_ms(self.twin_trust.error_ns) if self.twin_trust else None,
            "twin_ttft_rel_error": self.twin_trust.rel_error if self.twin_trust else None,
            "twin_clock": self.twin_trust.clock if self.twin_trust else None,
            "twin_run_error": self.twin_trust.run_error.to_json() if self.twin_trust and self.twin_trust.run_error
            else None,
            "dp_rank": self.twin_trust.dp_rank if self.twin_trust else None,
            "twin_dp_rank": self.twin_trust.twin_dp_rank if self.twin_trust else None,
            "twin_rank_error": self.twin_trust.rank_error.to_json() if self.twin_trust and self.twin_trust.rank_error
            else None,
        }


def _step1(row: RequestRow) -> ObservedStep:
    d, h, s, c, n = (getattr(row, k) for k in ("device_hit_tokens", "host_hit_tokens", "storage_hit_tokens",
                                          "computed_tokens", "input_tokens"))
    ev = {"hit_class": row.hit_class, "input_tokens": n, "device_hit_tokens": d, "host_hit_length": h,
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


def _step2(row: RequestRow) -> ObservedStep:
    d, h, s = (getattr(row, k) for k in ("device_hit_tokens", "host_hit_tokens", "storage_hit_tokens"))
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


def _unknown_steps(row: RequestRow, run: RunInfo, parts: ObservedParts) -> tuple[ObservedStep, ObservedStep]:
    how = ("replay the trace written by `tierdiag import sglang --trace-out` with the server's cache sizes "
           "into this database to get it from the replayed twin")
    loaded = (row.host_hit_tokens or 0) + (row.storage_hit_tokens or 0)
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


def _twin_steps(con: duckdb.DuckDBPyConnection, run: RunInfo, twin: Twin, req_id: str, row: RequestRow):
    """Steps 3-4 (and the twin's verdict) from the replayed twin's explanation of the same request."""
    from tierdiag.store.reader import resolve_run

    twin_run = resolve_run(con, twin.run_id)
    try:
        expl = explain_request(con, twin_run, req_id)
    except NotFoundError:
        return None
    t = expl.tokens
    same = None
    if row.device_hit_tokens is not None:
        page = page_tokens(twin_run)
        same = (abs(t.device_tokens - row.device_hit_tokens) <= page
                and abs(t.host_tokens - (row.host_hit_tokens or 0)) <= page
                and abs(t.storage_tokens - (row.storage_hit_tokens or 0)) <= page)
    trust = twin_trust(con, run, twin_run, row, expl.ttft_ns)
    prefix = f"From the {twin.describe()}; {trust.sentence(clock=False)}. "
    if same is False:
        prefix += (f"Its split differs from the server's ({fmt_tokens(t.device_tokens)} device / "
                   f"{fmt_tokens(t.host_tokens)} host / {fmt_tokens(t.storage_tokens)} storage replayed vs "
                   f"{fmt_tokens(row.device_hit_tokens)} / {fmt_tokens(row.host_hit_tokens)} / "
                   f"{fmt_tokens(row.storage_hit_tokens)} observed), so read it as the engine's account. ")
    elif same:
        prefix += "Its tier split matches the server's within one page. "
    steps = []
    for s in expl.steps[2:4]:
        ev = dataclass_json(s.evidence)
        ev["twin_split_matches_server"] = same
        steps.append(ObservedStep(s.step, s.name, "replayed twin", prefix + s.finding, ev))
    return tuple(steps), expl, trust


def explain_observed(con: duckdb.DuckDBPyConnection, run: RunInfo, req_id: str) -> ObservedExplanation:
    """The troubleshooting order for an imported request: steps 1-2 from the server's numbers,
    3-4 from its replayed twin when the database holds one, else what cannot be known."""
    req_id = str(req_id)
    row = queries.request(con, run, req_id)
    parts = ObservedParts.from_row(row)
    twin = find_twin(con, run)
    twin_result = _twin_steps(con, run, twin, req_id, row) if twin is not None else None
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
    tokens = {"input": row.input_tokens, "device": row.device_hit_tokens,
              "host": row.host_hit_tokens, "storage": row.storage_hit_tokens,
              "computed": row.computed_tokens}
    return ObservedExplanation(
        run_id=run.run_id, run_name=run.name, req_id=req_id, status=row.status or "finished",
        hit_class=row.hit_class, ttft_ns=row.ttft_ns, tokens=tokens, parts=parts,
        steps=steps, primary_cause=cause, primary_cause_source=source, headline=headline, verdict=verdict,
        twin=twin if twin_expl is not None else None, twin_primary_cause=twin_cause,
        counterfactual=counterfactual, evicted_by=twin_expl.evicted_by if twin_expl is not None else (),
        twin_trust=twin_result[2] if twin_result else None)


def _verdict(row: RequestRow, parts: ObservedParts, server_cause: str | None, twin: Twin | None,
             twin_expl) -> tuple[str, str]:
    req = row.req_id
    status = row.status or "finished"
    why = row.reject_reason or "no reason recorded"
    if status != "finished" and parts.ttft_ns is None:
        return (f"{status}: {why}",
                f"Request {req} was {status} ({why}) before its first token; there is no TTFT to explain.")
    headline, text = _ttft_verdict(req, parts, server_cause, twin, twin_expl)
    if status != "finished":
        # The server stopped it after its first token (a client gone mid-decode): its TTFT is
        # still explained, and the verdict says first that it did not finish.
        return (f"{status} after its first token ({why}); {headline}",
                f"Request {req} was {status} ({why}) after its first token, so it did not finish. {text}")
    return headline, text


def _ttft_verdict(req: str, parts: ObservedParts, server_cause: str | None, twin: Twin | None,
                  twin_expl) -> tuple[str, str]:
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
    if server_cause == Cause.QUEUEING:
        headline = f"queueing: {fmt_pct(share(parts.queue_ns, ttft))} of TTFT (server-reported)"
    elif server_cause == Cause.STORAGE_FETCH:
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
