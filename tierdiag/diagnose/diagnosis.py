"""The run's diagnosis: its root cause, the part of its excess TTFT that is largest, what to
change (advice.py's rules), and, for the report, the numbers that back it (DESIGN §5).

    diagnose_run(ctx, excess parts, advice)      -> RunDiagnosis      (summary's diagnosis)
    backed(summary, prefill busy, busiest bin)   -> RunDiagnosis      (the report's verdict card)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tierdiag.diagnose.advice import Advice, advice_json
from tierdiag.diagnose.claims import BUSY_SHARE, RECOMPUTE_QUEUE_SHARE, loss_why
from tierdiag.diagnose.runcontext import RunContext
from tierdiag.diagnose.numbers import CauseShare, RunSummary
from tierdiag.units import fmt_bytes, fmt_ms, fmt_pct, fmt_tokens, share


@dataclass(frozen=True)
class RunDiagnosis:
    """The run's root cause and what to change; in the report, with the numbers behind it.

    `summary` fills the first four (its --json is exactly those); `backed` adds, from summary's
    numbers, the causes ranked by their part of the excess and the sentences that back the
    largest one (the report's verdict card)."""

    dominant_cause: str | None  # the root cause (often not the largest part: recompute makes a queue)
    proximate_cause: str | None  # the part of the run's excess TTFT that is largest
    finding: str | None
    advice: tuple[Advice, ...]
    ranked: tuple[CauseShare, ...] = ()  # causes with some excess, largest first
    facts: tuple[str, ...] = ()  # sentences from the run's numbers backing proximate_cause
    excess_total_ns: int = 0
    ttft_total_ns: int = 0

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
        return {"dominant_cause": self.dominant_cause, "proximate_cause": self.proximate_cause,
                "finding": self.finding, **advice_json(self.advice)}


_WAIT_WORDS_RUN = {"recompute": "recomputing once-cached tokens", "new_compute": "computing new tokens",
                   "load_back": "on exposed load-backs", "write_back": "blocked on write-backs",
                   "storage_wait": "idle while prefetches ran", "decode": "idle while decoding requests held memory",
                   "idle": "idle (waiting for memory or storage)"}


def diagnose_run(ctx: RunContext, excess_parts_ns: dict[str, int], advice: tuple[Advice, ...]) -> RunDiagnosis:
    """`excess_parts_ns`: cause -> the run total of the excess part it owns (summary's table)."""
    total = sum(excess_parts_ns.values())
    if not ctx.num_finished or total <= 0:
        return RunDiagnosis("none" if ctx.num_finished else None, None,
                            "no request was slower than its ideal." if ctx.num_finished else "no finished request.",
                            advice)
    proximate = max(excess_parts_ns, key=lambda k: excess_parts_ns[k])
    pshare = share(excess_parts_ns[proximate], total)
    lo = ctx.losses
    why = loss_why(ctx)
    rq = ctx.attribution_share("recompute")
    busy = ctx.prefill_busy_share
    if proximate == "queueing" and rq is not None and rq >= RECOMPUTE_QUEUE_SHARE and (busy or 0) >= BUSY_SHARE:
        finding = (f"Recompute of lost prefixes made the queue: queueing is {fmt_pct(pshare)} of the run's excess TTFT, "
                   f"and of the time requests waited, {fmt_pct(rq)} the GPU spent recomputing once-cached tokens "
                   f"({fmt_tokens(lo.recomputed_tokens)} tokens, {fmt_pct(lo.recomputed_share)} of input, "
                   f"{fmt_pct(ctx.recompute_share_of_prefill)} of prefill compute) on a prefill GPU "
                   f"{fmt_pct(busy)} busy ({fmt_pct(busy * (1 - (ctx.recompute_share_of_prefill or 0)))} busy had "
                   f"it not recomputed them)")
        finding += f"; {why}." if why else "."
        return RunDiagnosis("recompute", proximate, finding, advice)
    if proximate == "queueing":
        finding = f"Queueing is {fmt_pct(pshare)} of the run's excess TTFT on a prefill GPU {fmt_pct(busy)} busy"
        if ctx.queue_attribution:
            top = max(ctx.queue_attribution, key=lambda k: ctx.queue_attribution[k])
            finding += (f"; while requests waited the GPU was mostly {_WAIT_WORDS_RUN[top]} "
                        f"({fmt_pct(ctx.attribution_share(top))} of the wait), recomputing once-cached tokens for "
                        f"{fmt_pct(rq)}: the queue was not the cache's doing.")
        else:
            finding += " (this store has no per-batch recompute record, so the wait is not split)."
    elif proximate == "recompute":
        finding = (f"Recomputing once-cached tokens is {fmt_pct(pshare)} of the run's excess TTFT"
                   + (f"; {why}." if why else "."))
    elif proximate == "load_back":
        tr = ctx.transfers
        finding = (f"Exposed load-back is {fmt_pct(pshare)} of the run's excess TTFT; load-backs ran at "
                   f"{fmt_pct(tr.link_peak_share)} of link peak.")
    elif proximate == "storage_fetch":
        finding = f"Waiting for storage prefetches is {fmt_pct(pshare)} of the run's excess TTFT."
    else:
        finding = f"Requests' own new-token compute beyond their ideal is {fmt_pct(pshare)} of the run's excess TTFT."
    return RunDiagnosis(proximate, proximate, finding, advice)


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
    ranked = tuple(sorted((c for c in summary.time_by_cause if c.cause != "none" and (c.excess_part_ns or 0) > 0),
                          key=lambda c: -(c.excess_part_ns or 0)))
    dominant = ranked[0].cause if ranked else None
    items = _diagnosis_field(summary, "advice")
    return RunDiagnosis(
        dominant_cause=_diagnosis_field(summary, "dominant_cause"), proximate_cause=dominant,
        finding=_diagnosis_field(summary, "finding"),
        advice=tuple(items) if isinstance(items, (list, tuple)) else (),
        ranked=ranked, facts=tuple(_FACTS[dominant](summary, prefill_busy_share, busiest) if dominant in _FACTS else ()),
        excess_total_ns=summary.excess_total_ns, ttft_total_ns=summary.ttft_total_ns)


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
    dev = [e for e in summary.evictions if e.tier == "device"]
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
_FACTS = {"queueing": _queueing_facts, "recompute": _recompute_facts, "load_back": _load_back_facts,
          "storage_fetch": _storage_facts}
