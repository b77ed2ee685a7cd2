"""eviction_policy: hot prefixes (hit 3 or more times) among the removed tokens; advises
eviction_policy lfu. Predicted by a policy simulation over the run's own re-references: LFU
(SGLang's LFUStrategy: fewest hits first, then least recent) evicts once-hit content before a hot
page, so a hot re-reference is kept when the hot volume live beside it (every hot re-reference
whose interval from last use to re-reference overlaps its own, itself included:
LossEvidence.hot_competing_deciles_tokens) fits the pools (held_capacity). Not proposed when the
hot tokens so kept are below MIN_LOSS_SHARE of input. Ignores what the rows do not record: hits on
content never removed (it competes too), pages locked by running requests, and what LFU loses,
once-hit prefixes asked for again soon that LRU kept (a replay measures that: `advise`)."""

from __future__ import annotations

from tierdiag.diagnose.advice import targets as T
from tierdiag.diagnose.advice.base import Evidence, Rule, covered, significant
from tierdiag.diagnose.advice.types import Advice
from tierdiag.diagnose.request.claims import NAMED_REASON_SHARE, Claim
from tierdiag.diagnose.run.run_claims import held_capacity
from tierdiag.units import fmt_tokens


class EvictionPolicy(Rule):
    kinds = ("eviction_policy",)
    options = {"eviction_policy": "eviction_policy"}
    target = T.RECOMPUTE_SHARE

    def trigger(self, ev: Evidence) -> list[Advice]:
        ctx = ev.ctx
        lo = ctx.losses
        removed = lo.deleted_from_host_tokens + lo.dropped_unbacked_tokens
        policy = ctx.config.get("eviction_policy")
        if (policy == "lfu" or not removed or lo.hot_removed_tokens < NAMED_REASON_SHARE * removed
                or not significant(lo.hot_removed_tokens, lo.input_tokens)):
            return []
        held, pools = held_capacity(ctx.config, lo.device_capacity_tokens, lo.host_capacity_tokens)
        cover = covered(lo.hot_competing_deciles_tokens, held)
        if cover is None:
            return []  # no re-reference to simulate (evidence from before the prediction): nothing predicted
        kept = int(cover * lo.hot_removed_tokens)
        if not significant(kept, lo.input_tokens):
            return []  # the hot prefixes alone outgrow the pools: lfu would evict them all the same
        return [Advice(
            "eviction_policy", "eviction_policy", "lfu", {"eviction_policy": "lfu"},
            self.sentence(hot_tokens=lo.hot_removed_tokens, removed_tokens=removed, policy=policy).text,
            {"hot_removed_tokens": lo.hot_removed_tokens, "removed_tokens": removed,
             "hot_competing_p90_tokens": lo.hot_competing_deciles_tokens[9], "held_tokens": held},
            prediction=self.prediction(kept_tokens=kept, hot_tokens=lo.hot_removed_tokens, pools=pools))]

    def sentence(self, *, hot_tokens: int, removed_tokens: int, policy) -> Claim:
        return Claim("eviction_policy", (
            f"{fmt_tokens(hot_tokens)} of the {fmt_tokens(removed_tokens)} removed tokens that were asked for again "
            f"came from hot prefixes (hit 3 or more times): eviction_policy {policy} evicted them behind one-off "
            f"prefixes; lfu keeps the frequently hit ones"))

    def prediction(self, *, kept_tokens: int, hot_tokens: int, pools: str) -> str:
        return (f"predicted under lfu (once-hit content evicted first): keeps ~{fmt_tokens(kept_tokens)} of the "
                f"{fmt_tokens(hot_tokens)} hot tokens lost, those whose live hot prefixes fit {pools}")
