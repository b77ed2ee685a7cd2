"""prefetch: storage matches recomputed because their prefetch was late; advises prefetch_policy
wait_complete. Predicted under the engine's prefetch rules: wait_complete holds a request until
its read is done (engine/prefetch.py), so its late tokens are loaded rather than recomputed, each
costing a storage read (the cost model's DISK_BYTES_PER_S) instead of its recompute. Worth it
where a read is cheaper than the recompute, or where the prefill GPU was at least BUSY_SHARE
busy (the wait frees it for others); else not proposed. Ignores: longer holds keeping host room
for prefetches in flight (more may be rate_limited), and evictions during the wait."""

from __future__ import annotations

from tierdiag.config.constants import DISK_BYTES_PER_S
from tierdiag.config.names import PrefetchPolicy
from tierdiag.diagnose.advice import targets as T
from tierdiag.diagnose.advice.base import Evidence, Rule, significant
from tierdiag.diagnose.advice.types import Advice
from tierdiag.diagnose.request.claims import BUSY_SHARE, Claim
from tierdiag.units import fmt_ms, fmt_pct, fmt_tokens, ns_to_ms, share


def read_or_recompute(*, disk_per_token_ns: float | None, recompute_per_token_ns: float,
                      prefill_busy_share: float | None, busy_words: str) -> str:
    """Why a storage read pays: cheaper than the recompute, else the busy prefill GPU."""
    cheaper = disk_per_token_ns is not None and disk_per_token_ns < recompute_per_token_ns
    return (f"a token comes from disk in {fmt_ms(disk_per_token_ns)} against {fmt_ms(recompute_per_token_ns)} to "
            f"recompute it" if cheaper else f"the prefill GPU was {fmt_pct(prefill_busy_share)} busy: {busy_words}")


class Prefetch(Rule):
    kinds = ("prefetch",)
    options = {"prefetch_policy": "prefetch"}
    target = T.RECOMPUTE_SHARE

    def trigger(self, ev: Evidence) -> list[Advice]:
        ctx = ev.ctx
        lo = ctx.losses
        late = lo.storage_unused_tokens.get("prefetch_incomplete", 0)
        if not significant(late, lo.input_tokens) or ctx.config.get("prefetch_policy") == PrefetchPolicy.WAIT_COMPLETE:
            return []
        kv = ctx.kv_bytes_per_token
        recompute_per_token_ns = share(ctx.recompute_ns, lo.recomputed_tokens) or 0.0
        disk_per_token_ns = kv * 1e9 / DISK_BYTES_PER_S if kv else None
        cheaper = disk_per_token_ns is not None and disk_per_token_ns < recompute_per_token_ns
        busy = (ctx.prefill_busy_share or 0) >= BUSY_SHARE
        if not (cheaper or busy):
            return []  # predicted to trade each recompute for a slower read, on a GPU with room
        return [Advice(
            "prefetch", "prefetch_policy", "wait_complete", {"prefetch_policy": "wait_complete"},
            self.sentence(late_tokens=late, input_tokens=lo.input_tokens, policy=ctx.config.get("prefetch_policy"),
                          disk_per_token_ns=disk_per_token_ns, recompute_per_token_ns=recompute_per_token_ns,
                          prefill_busy_share=ctx.prefill_busy_share).text,
            {"prefetch_incomplete_tokens": late, "input_tokens": lo.input_tokens,
             "recompute_per_token_ms": ns_to_ms(recompute_per_token_ns), "disk_per_token_ms": ns_to_ms(disk_per_token_ns),
             "prefill_busy_share": ctx.prefill_busy_share},
            prediction=self.prediction(late_tokens=late))]

    def sentence(self, *, late_tokens: int, input_tokens: int, policy, disk_per_token_ns: float | None,
                 recompute_per_token_ns: float, prefill_busy_share: float | None) -> Claim:
        why = read_or_recompute(disk_per_token_ns=disk_per_token_ns, recompute_per_token_ns=recompute_per_token_ns,
                                prefill_busy_share=prefill_busy_share, busy_words="the wait frees it for others")
        return Claim("prefetch", (
            f"{fmt_tokens(late_tokens)} tokens ({fmt_pct(share(late_tokens, input_tokens))} of input) were matched in "
            f"storage but recomputed because their prefetch had not completed when the request was scheduled "
            f"(prefetch_policy {policy}); waiting for it loads them instead ({why})"))

    def prediction(self, *, late_tokens: int) -> str:
        return (f"predicted under the run's prefetch rules (wait_complete holds a request until its read "
                f"completes): keeps ~{fmt_tokens(late_tokens)} of the lost tokens")
