"""The run's diagnosis: its root cause, the part of its excess TTFT that is largest, what to
change (advice/'s rules), and, for the report, the numbers that back it (DESIGN §5).

    diagnose_run(ctx, excess parts, advice)      -> RunDiagnosis      (summary's diagnosis)
    backed(summary, prefill busy, busiest bin)   -> RunDiagnosis      (the report's verdict card)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tierdiag.config.names import Cause, Tier
from tierdiag.diagnose.advice import Advice, advice_json
from tierdiag.diagnose.request import claims as C
from tierdiag.diagnose.run import run_claims as RC
from tierdiag.diagnose.run.miss_reasons import in_batch_claim_text, prefetch_lost_claim_text
from tierdiag.diagnose.run.capacity import Capacity
from tierdiag.diagnose.run.run_claims import loss_why
from tierdiag.diagnose.run.runcontext import RunContext
from tierdiag.diagnose.run.numbers import CauseShare, RunSummary
from tierdiag.units import fmt_bytes, fmt_ms, fmt_pct, fmt_tokens, ns_to_ms, share


@dataclass(frozen=True)
class RunDiagnosis:
    """The run's root cause and what to change; in the report, with the numbers behind it.

    `summary` fills the first four (its --json is exactly those); `backed` adds, from summary's
    numbers, the causes ranked by their part of the excess and the sentences that back the
    largest one (the report's verdict card)."""

    dominant_cause: str | None  # the root cause (often not the largest part: recompute makes a queue;
    #                             "capacity": the offered prefill exceeded the GPU; "routing": the
    #                             recomputed tokens were mostly ones another rank held, routing_loss.py)
    proximate_cause: str | None  # the part of the run's excess TTFT that is largest
    finding: str | None
    advice: tuple[Advice, ...]
    ranked: tuple[CauseShare, ...] = ()  # causes with some excess, largest first
    facts: tuple[str, ...] = ()  # sentences from the run's numbers backing proximate_cause
    excess_total_ns: int = 0
    ttft_total_ns: int = 0
    claims: tuple = ()  # claims.Claim: the finding's sentences, each from named numbers
    capacity: Capacity | None = None  # offered prefill against the GPU (capacity.py)
    # Where the max_running_requests cap held the queue (run_claims.cap_held): its numbers
    # (run_claims.running_cap_json); None otherwise, and then absent from the JSON.
    running_cap: dict | None = None

    @property
    def dominant(self) -> str | None:
        """The cause that dominated the run's excess TTFT (the verdict card's headline)."""
        return self.proximate_cause

    @property
    def root_cause(self) -> str | None:
        return self.dominant_cause

    @property
    def share(self) -> float | None:
        """The dominant cause's share of the run's excess TTFT."""
        return self.ranked[0].excess_share if self.ranked else None

    def to_json(self) -> dict:
        cap = self.capacity
        return {"dominant_cause": self.dominant_cause, "proximate_cause": self.proximate_cause,
                "finding": self.finding, **advice_json(self.advice),
                "claims": [c.to_json() for c in self.claims],
                "capacity": None if cap is None else {
                    "overloaded": cap.overloaded, "overloaded_share": cap.overloaded_share,
                    "overload_factor": cap.overload_factor, "peak_load": cap.peak_load,
                    "material_load": cap.material_load,
                    "mean_load": cap.mean_load, "window_ms": ns_to_ms(cap.window_ns),
                    "offered_ms": ns_to_ms(cap.offered_ns)},
                **({"running_cap": self.running_cap} if self.running_cap is not None else {})}


def diagnose_run(ctx: RunContext, excess_parts_ns: dict[str, int], advice: tuple[Advice, ...],
                 miss_reasons: dict | None = None) -> RunDiagnosis:
    """`excess_parts_ns`: cause -> the run total of the excess part it owns (summary's table).

    The verdict is the requests' (ctx.story: each request's own primary cause and queue
    attribution, weighted by its excess TTFT), led by capacity when the offered prefill exceeded
    the GPU for a material share of the run; each sentence is a claim (claims.py). A store
    without per-batch records (no story) falls back on the run's excess parts."""
    total = sum(excess_parts_ns.values())
    cap = ctx.capacity if ctx.capacity is not None and ctx.capacity.overloaded else None
    if not ctx.num_finished or total <= 0:
        return RunDiagnosis("none" if ctx.num_finished else None, None,
                            "no request was slower than its ideal." if ctx.num_finished else "no finished request.",
                            advice, capacity=ctx.capacity)
    story = ctx.story
    if story is None or story.top is None or not story.excess_total_ns:
        return _from_parts(ctx, excess_parts_ns, advice, cap)
    top = story.top
    why = loss_why(ctx)
    claims: list[C.Claim] = [RC.capacity_claim(cap)] if cap is not None else []
    claims.append(RC.verdicts_claim(story))
    queued_share = share(story.queued_excess_ns, story.excess_total_ns) or 0.0
    running_cap = None
    if top.cause == Cause.QUEUEING or queued_share >= MATERIAL_QUEUE_SHARE:
        claims.append(RC.queued_wait_claim(story, ctx.prefill_busy_share))
        claims.append(RC.queue_cause_claim(story, cap is not None, why))
        if RC.cap_held(story, cap is not None):
            running_cap = RC.running_cap_json(story)
    routing = ctx.routing
    routing_told = routing is not None and routing.routing_tokens > 0 and (
        top.cause == Cause.ROUTING or routing.dominates_lost_reuse)
    if routing_told:
        claims.append(RC.run_routing_claim(routing))
    if top.cause == Cause.RECOMPUTE:
        claims.append(C.Claim("recompute", "Recomputing once-cached tokens is the largest part of the slow requests' "
                                           "TTFT" + (f"; {why}." if why else ".")))
    elif top.cause == Cause.LOAD_BACK:
        claims.append(C.Claim("load_back", f"Load-backs ran at {fmt_pct(ctx.transfers.link_peak_share)} of link peak."))
    waited = RC.evicted_while_waiting_claim(story)
    if waited is not None:
        claims.append(waited)
    in_batch = in_batch_claim_text(miss_reasons or {}, ctx.losses.input_tokens)  # miss_reasons.py
    if in_batch is not None:
        claims.append(C.Claim("in_batch", in_batch))
    lost_read = prefetch_lost_claim_text(miss_reasons or {}, ctx.losses.input_tokens)  # miss_reasons.py
    if lost_read is not None:
        claims.append(C.Claim("prefetch_lost", lost_read))
    if top.cause == Cause.QUEUEING and top.caches_doing:
        dominant = "recompute"
    elif cap is not None and top.cause in (Cause.QUEUEING, Cause.NONE):
        dominant = "capacity"
    else:
        dominant = top.cause
    # The once-cached tokens recomputed were mostly routing's: the router, not the cache, lost them.
    if dominant == Cause.RECOMPUTE and routing_told:
        dominant = "routing"
    return RunDiagnosis(dominant, top.cause, " ".join(c.text for c in claims), advice, claims=tuple(claims),
                        capacity=ctx.capacity, running_cap=running_cap)


# Queueing is told (around the queued requests, whose doing) when the requests whose verdict it
# is carry at least this share of the excess, even when another verdict carries more.
MATERIAL_QUEUE_SHARE = 0.25


def _from_parts(ctx: RunContext, excess_parts_ns: dict[str, int], advice: tuple[Advice, ...], cap) -> RunDiagnosis:
    """Without the requests' own attributions (no per-batch records): the largest excess part."""
    total = sum(excess_parts_ns.values())
    proximate = max(excess_parts_ns, key=lambda k: excess_parts_ns[k])
    pshare = share(excess_parts_ns[proximate], total)
    why = loss_why(ctx)
    claims = [RC.capacity_claim(cap)] if cap is not None else []
    if proximate == Cause.QUEUEING:
        text = (f"Queueing is {fmt_pct(pshare)} of the run's excess TTFT; this store has no per-batch record of "
                f"what the GPU did while requests waited, so whose doing the queue was is not known.")
    elif proximate == Cause.RECOMPUTE:
        text = (f"Recomputing once-cached tokens is {fmt_pct(pshare)} of the run's excess TTFT"
                + (f"; {why}." if why else "."))
    elif proximate == Cause.LOAD_BACK:
        text = (f"Exposed load-back is {fmt_pct(pshare)} of the run's excess TTFT; load-backs ran at "
                f"{fmt_pct(ctx.transfers.link_peak_share)} of link peak.")
    elif proximate == Cause.STORAGE_FETCH:
        text = f"Waiting for storage prefetches is {fmt_pct(pshare)} of the run's excess TTFT."
    elif proximate == Cause.ROUTING:
        text = (f"Recomputing prefixes another data-parallel rank held at arrival is {fmt_pct(pshare)} of the run's "
                f"excess TTFT.")
    else:
        text = f"Requests' own new-token compute beyond their ideal is {fmt_pct(pshare)} of the run's excess TTFT."
    claims.append(C.Claim(proximate, text))
    dominant = "capacity" if cap is not None and proximate == Cause.QUEUEING else proximate
    return RunDiagnosis(dominant, proximate, " ".join(c.text for c in claims), advice, claims=tuple(claims),
                        capacity=ctx.capacity)


# --------------------------------------------------------------------------- backed by the numbers


def _diagnosis_field(summary: RunSummary, name: str) -> Any:
    """A field of `summary`'s diagnosis, whether it is a RunDiagnosis or a plain dict (a caller's
    own, e.g. a test's); None where summary carries none."""
    diagnosis = getattr(summary, "diagnosis", None)
    if diagnosis is None:
        return None
    return diagnosis.get(name) if isinstance(diagnosis, dict) else getattr(diagnosis, name, None)


def backed(summary: RunSummary, prefill_busy_share: float | None,
           busiest: tuple[float, float, float] | None) -> RunDiagnosis:
    """`summary`'s diagnosis with the causes ranked by their part of the run's excess TTFT (its
    cause shares, not re-derived) and the sentences that back the largest.

    `prefill_busy_share`: the GPU's prefill share of the run's span; `busiest`: (t in s since the
    first arrival, mean requests waiting, mean input tokens queued) of the time bin with the most
    waiting requests (None: no bins). Both are the report's load series."""
    ranked = tuple(sorted((c for c in summary.time_by_cause if c.cause != Cause.NONE and (c.excess_part_ns or 0) > 0),
                          key=lambda c: -(c.excess_part_ns or 0)))
    dominant = ranked[0].cause if ranked else None
    items = _diagnosis_field(summary, "advice")
    return RunDiagnosis(
        dominant_cause=_diagnosis_field(summary, "dominant_cause"), proximate_cause=dominant,
        finding=_diagnosis_field(summary, "finding"),
        advice=tuple(items) if isinstance(items, (list, tuple)) else (),
        ranked=ranked, facts=tuple(_FACTS[dominant](summary, prefill_busy_share, busiest) if dominant in _FACTS else ()),
        excess_total_ns=summary.excess_total_ns, ttft_total_ns=summary.ttft_total_ns,
        claims=tuple(_diagnosis_field(summary, "claims") or ()), capacity=_diagnosis_field(summary, "capacity"))


def _queueing_facts(summary: RunSummary, busy: float | None, busiest) -> list[str]:
    out = [f"The GPU was busy in prefill {fmt_pct(busy)} of the run's "
           f"{fmt_ms(summary.span_ns)} (first arrival to last finish)."]
    if busiest is not None:
        t_s, waiting, tokens = busiest
        out.append(f"At the busiest moment (t = {t_s:,.1f} s) {waiting:,.1f} requests "
                   f"waited on average, with {tokens:,.0f} input tokens queued.")
    return out


def _recompute_facts(summary: RunSummary, busy: float | None, busiest) -> list[str]:
    t = summary.tokens
    out = [f"{fmt_tokens(t.recomputed_tokens)} of {fmt_tokens(t.input_tokens)} input tokens "
           f"({fmt_pct(share(t.recomputed_tokens, t.input_tokens))}) were recomputed after the cache "
           f"had held them."]
    dev = [e for e in summary.evictions if e.tier == Tier.DEVICE]
    if dev:
        out.append("Device evictions: " + ", ".join(f"{e.num_events:,} {e.action} ({fmt_tokens(e.tokens)} tokens)"
                                                    for e in dev) + ".")
    if t.loadback_skipped_tokens:
        out.append(f"{fmt_tokens(t.loadback_skipped_tokens)} tokens were recomputed because their "
                   f"load-back was skipped.")
    return out


def _load_back_facts(summary: RunSummary, busy: float | None, busiest) -> list[str]:
    lb = summary.load_back
    return [f"{lb.num_transfers:,} load-backs moved {fmt_bytes(lb.bytes)} in {fmt_ms(lb.link_busy_ns)} of "
            f"link time, {fmt_ms(lb.exposed_ns)} of it exposed"
            + (f", at {fmt_pct(lb.link_peak_share)} of the link's peak." if lb.link_peak_share else ".")]


def _storage_facts(summary: RunSummary, busy: float | None, busiest) -> list[str]:
    lb = summary.load_back
    return [f"Requests waited {fmt_ms(lb.storage_wait_ns)} in all for {lb.num_prefetches:,} storage "
            f"prefetches ({fmt_bytes(lb.prefetch_bytes)})."]


# cause -> the sentences backing it when it dominates the run's excess (compute: none beyond its share).
_FACTS = {Cause.QUEUEING: _queueing_facts, Cause.RECOMPUTE: _recompute_facts, Cause.LOAD_BACK: _load_back_facts,
          Cause.STORAGE_FETCH: _storage_facts}
