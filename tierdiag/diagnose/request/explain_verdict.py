"""`explain`'s verdict for one request: the primary cause (causes.py) as a headline, then the
verdict's sentences, each a claim built by claims.py from the request's typed evidence.

The headline is looked up by cause (`HEADLINES`), one entry per cause of causes.CAUSES.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from tierdiag.config.names import Cause
from tierdiag.diagnose.request import claims as C
from tierdiag.diagnose.run import run_claims as RC
from tierdiag.diagnose.request.causes import CAUSES, NONE_TOLERANCE_PCT, TtftParts
from tierdiag.diagnose.request.context import QueueAttribution, RequestContext
from tierdiag.diagnose.run.runcontext import RunContext
from tierdiag.diagnose.request.explain_result import EvictionEvidence, LoadBackEvidence, Step
from tierdiag.diagnose.request.explain_steps import plural
from tierdiag.diagnose.request.tokens import TokenSplit
from tierdiag.units import NS_PER_S, fmt_ms, fmt_pct, fmt_tokens, share
from tierdiag.diagnose.read.requests import RequestRow, RowLike


@dataclass(frozen=True)
class VerdictInputs:
    """What the verdict's claims are built from: the row and the typed evidence around it."""

    row: RequestRow
    tokens: TokenSplit
    parts: TtftParts | None
    cause: str | None
    steps: tuple[Step, ...]
    context: RequestContext | None
    attribution: QueueAttribution | None
    run: RunContext | None
    threshold: int | None
    storage_tier: bool

    @property
    def load_back(self) -> LoadBackEvidence:
        return self.steps[2].evidence  # type: ignore[return-value]

    @property
    def eviction(self) -> EvictionEvidence:
        return self.steps[3].evidence  # type: ignore[return-value]


# cause -> the claim that names it (the verdict's second sentence); causes without one are
# told by the claims every request with such numbers gets (queueing: its wait; recompute: its recompute).
CAUSE_CLAIMS: dict[str, Callable[[VerdictInputs], C.Claim]] = {
    Cause.NONE: lambda v: C.none_claim(NONE_TOLERANCE_PCT),
    Cause.LOAD_BACK: lambda v: C.load_back_claim(v.row, v.load_back.loaded_tokens, v.tokens.reused_tokens,
                                             v.load_back.loadback_bytes, v.load_back.loadback_ns,
                                             v.load_back.achieved_bytes_per_s),
    Cause.STORAGE_FETCH: lambda v: C.storage_fetch_claim(v.row, v.load_back.storage_bytes),
    Cause.COMPUTE: lambda v: C.compute_claim(v.row, v.tokens.new_tokens, v.parts.excess_parts_ns()[Cause.COMPUTE]),
    Cause.ROUTING: lambda v: C.routing_claim(v.row, v.run.config if v.run is not None else {}),
}


def _claims(v: VerdictInputs) -> tuple[C.Claim, ...]:
    """The verdict after its first sentence: the primary cause's claim, then the claims every
    request with such numbers gets (its wait, its recompute, evictors, counterfactuals, break-even)."""
    row, tokens, parts, cause = v.row, v.tokens, v.parts, v.cause
    lb, evs = v.load_back, v.eviction
    ttft = parts.ttft_ns
    out: list[C.Claim] = []
    if cause in CAUSE_CLAIMS:
        out.append(CAUSE_CLAIMS[cause](v))
    # Its wait, when it is the cause or a sizeable part of TTFT.
    if parts.queue_ns and (cause == Cause.QUEUEING or share(parts.queue_ns, ttft) >= 0.2):
        out.append(C.queue_claim(row, v.attribution, v.context, RC.loss_why(v.run)))
    if tokens.recomputed_tokens:
        out.append(C.recompute_claim(row, v.threshold, evs.host_deleted_tokens, v.storage_tier))
    if cause != Cause.ROUTING and parts.routing_tokens:  # part of that recompute was routing's (causes.py)
        out.append(C.routing_claim(row, v.run.config if v.run is not None else {}))
    if evs.evicted_by and (tokens.recomputed_tokens or tokens.host_tokens or tokens.storage_tokens):
        out.append(C.evicted_by_claim(evs.evicted_by, {e.tier for e in evs.events}, evs.thrashing_when_evicted))
    for claim in (C.counterfactual_claim(row), C.break_even_claim(row, lb.link_peak_share, lb.achieved_bytes_per_s, cause)):
        if claim is not None:
            out.append(claim)
    return tuple(out)


def _queueing_headline(v: VerdictInputs, pct: str, short: str) -> str:
    doing = C.queue_is_the_caches_doing(v.attribution, v.context)
    return (f"queueing: {pct} of TTFT; " +
            ("the queue was the cache's doing (recompute of lost prefixes ahead of it)" if doing else short))


# cause -> the headline: (inputs, its part's share of TTFT, the short cache context) -> text.
HEADLINES: dict[str, Callable[[VerdictInputs, str, str], str]] = {
    Cause.NONE: lambda v, pct, short: f"none: TTFT within {NONE_TOLERANCE_PCT} % of its ideal; {short}",
    Cause.QUEUEING: _queueing_headline,
    Cause.LOAD_BACK: lambda v, pct, short: (f"load_back: {pct} of TTFT was exposed load-back of "
                                        f"{fmt_tokens(v.load_back.loaded_tokens)} tokens"),
    Cause.STORAGE_FETCH: lambda v, pct, short: (f"storage_fetch: {pct} of TTFT waiting for "
                                            f"{fmt_tokens(int(v.row.storage_match_tokens or 0))} tokens from storage"),
    Cause.ROUTING: lambda v, pct, short: (f"routing: {pct} of TTFT recomputing {fmt_tokens(v.parts.routing_tokens)} "
                                      f"tokens rank {v.row.best_rank} held at arrival (the router sent it to "
                                      f"rank {v.row.dp_rank})"),
    Cause.RECOMPUTE: lambda v, pct, short: (f"recompute: {pct} of TTFT recomputing "
                                        f"{fmt_tokens(v.tokens.recomputed_tokens - v.parts.routing_tokens)} "
                                        f"once-cached tokens"),
    Cause.COMPUTE: lambda v, pct, short: f"compute: {pct} of TTFT was new-token compute beyond its ideal; {short}",
}
assert tuple(HEADLINES) == CAUSES


def verdict(v: VerdictInputs) -> tuple[str, str, tuple[C.Claim, ...]]:
    """(headline, verdict, the verdict's claims after its first sentence)."""
    row, tokens, parts, cause = v.row, v.tokens, v.parts, v.cause
    req = row.req_id
    if parts is None or cause is None:
        reason = row.reject_reason or "no reason recorded"
        return (f"rejected: {reason}",
                f"Request {req} was rejected ({reason}) and never produced a first token; there is no "
                f"TTFT to explain.", ())
    ttft, ideal, excess = parts.ttft_ns, parts.ideal_ttft_ns, parts.excess_ns
    short = C.cache_context(tokens, short=True)
    base = (f"Request {req} ({tokens.label()}) took {fmt_ms(ttft)} to its first token against an ideal of "
            f"{fmt_ms(ideal)} (excess {fmt_ms(excess)}); {C.cache_context(tokens)}.")
    # compute names only its part beyond the ideal; every other cause its whole TTFT part.
    part_ns = parts.excess_parts_ns()[Cause.COMPUTE] if cause == Cause.COMPUTE else parts.part_ns(cause)
    headline = HEADLINES[cause](v, fmt_pct(share(part_ns, ttft)), short)
    claims = _claims(v)
    return headline, " ".join([base] + [c.text for c in claims]), claims


def context_sentence(ctx: RequestContext | None, row: RowLike | None = None) -> str:
    """Step 3's closing sentence: the prefill GPU around the request. Where the only batches in the
    window were its own (its chunks), the context is the request itself: said so, not as a
    busy share of "the system around it" (issue 40)."""
    if ctx is None:
        return ""
    own = int(RequestRow.of(row).num_chunks or 0) if row is not None else 0
    head = f" Prefill GPU from {C.CONTEXT_LOOKBACK_NS // NS_PER_S} s before its arrival to its first token: "
    if own and ctx.num_batches <= own and not ctx.queue_depth_at_arrival:
        return (head + f"only the {plural(ctx.num_batches, 'batch')} running its own prefill "
                f"({fmt_pct(ctx.prefill_busy_share)} of the window), and no request queued ahead of it at arrival: "
                f"the context is the request itself.")
    return (head + f"{fmt_pct(ctx.prefill_busy_share)} busy over {plural(ctx.num_batches, 'batch')}"
            + (f" ({own} of them running its own prefill)" if own else "")
            + f", {fmt_pct(ctx.recompute_share_of_prefill)} of that compute recomputing once-cached tokens; "
            f"{fmt_tokens(ctx.queue_depth_at_arrival)} requests queued ahead of it at arrival.")
