"""router_threshold (data-parallel runs): under cache_aware, routing still lost >= MIN_LOSS_SHARE
of input. By the rule that placed most of it (route_branch): cache_miss gets router_cache_threshold
just under its requests' lowest best-rank share (to the hundredth); imbalanced gets the balance
thresholds x BALANCE_FACTOR.

Predictions, from the rows: the routing tokens of requests the cache_miss rule placed whose best
rank held more than the new threshold; or those the imbalanced rule placed."""

from __future__ import annotations

import math

from tierdiag.diagnose.advice import targets as T
from tierdiag.diagnose.advice.base import Evidence, Rule, significant
from tierdiag.diagnose.advice.rules.router import (DEFAULT_BALANCE_ABS, DEFAULT_BALANCE_REL, DEFAULT_CACHE_THRESHOLD,
                                                   LOWEST_CACHE_THRESHOLD, lost_words, routing_leads)
from tierdiag.diagnose.advice.types import Advice
from tierdiag.diagnose.request.claims import Claim
from tierdiag.units import fmt_pct, fmt_tokens, share

BALANCE_FACTOR = 4


class RouterThreshold(Rule):
    kinds = ("router_threshold",)
    options = {"router_cache_threshold": "router_threshold", "router_balance_abs_threshold": "router_threshold",
               "router_balance_rel_threshold": "router_threshold"}
    target = T.ROUTING_SHARE

    def trigger(self, ev: Evidence) -> list[Advice]:
        ctx = ev.ctx
        rl = ctx.routing
        if (rl is None or ctx.config.get("router") != "cache_aware"
                or not significant(rl.routing_tokens, rl.input_tokens)):
            return []
        branch = max(rl.branch_tokens, key=lambda b: rl.branch_tokens[b], default=None)
        tokens = rl.branch_tokens.get(branch, 0)
        evidence = {"routing_tokens": rl.routing_tokens, "input_tokens": rl.input_tokens, "branch": branch,
                    "branch_tokens": tokens}
        if branch == "cache_miss":
            current = float(ctx.config.get("router_cache_threshold", DEFAULT_CACHE_THRESHOLD))
            # The lowest best-rank share among the miss's routing-lost requests, just under it (to the
            # hundredth), within [LOWEST_CACHE_THRESHOLD, current): cache_aware then matches them.
            shares = [s for s, _ in rl.miss_best_share_tokens if s > LOWEST_CACHE_THRESHOLD]
            if not shares:
                return []
            new = max(math.floor(min(shares) * 100 - 1) / 100, LOWEST_CACHE_THRESHOLD)
            kept = rl.tokens_above(new, miss_only=True)
            if new >= current or not significant(kept, rl.input_tokens):
                return []
            return [Advice(
                "router_threshold", "router_cache_threshold", new, {"router_cache_threshold": new},
                self.sentence(
                    routing_tokens=rl.routing_tokens, input_tokens=rl.input_tokens, branch=branch,
                    branch_tokens=tokens, cache_threshold=current, new_threshold=new,
                    miss_rule=ctx.config.get("router_cache_miss") or "smallest_tree").text,
                {**evidence, "router_cache_threshold": current, "kept_tokens": kept},
                prediction=self.prediction(rl, branch=branch, kept_tokens=kept, new_threshold=new))]
        if branch == "imbalanced":
            abs_t = int(ctx.config.get("router_balance_abs_threshold", DEFAULT_BALANCE_ABS))
            rel_t = float(ctx.config.get("router_balance_rel_threshold", DEFAULT_BALANCE_REL))
            if not significant(tokens, rl.input_tokens):
                return []
            changes = {"router_balance_abs_threshold": abs_t * BALANCE_FACTOR,
                       "router_balance_rel_threshold": rel_t * BALANCE_FACTOR}
            return [Advice(
                "router_threshold", "router_balance_abs_threshold", abs_t * BALANCE_FACTOR, changes,
                self.sentence(
                    routing_tokens=rl.routing_tokens, input_tokens=rl.input_tokens, branch=branch,
                    branch_tokens=tokens, balance_abs=abs_t, balance_rel=rel_t, factor=BALANCE_FACTOR).text,
                {**evidence, "router_balance_abs_threshold": abs_t, "router_balance_rel_threshold": rel_t},
                prediction=self.prediction(rl, branch=branch, kept_tokens=tokens))]
        return []

    def sentence(self, *, routing_tokens: int, input_tokens: int, branch: str, branch_tokens: int,
                 cache_threshold: float | None = None, new_threshold: float | None = None,
                 miss_rule: str | None = None, balance_abs: int | None = None,
                 balance_rel: float | None = None, factor: int | None = None) -> Claim:
        text = (f"routing lost {fmt_tokens(routing_tokens)} tokens ({fmt_pct(share(routing_tokens, input_tokens))} of "
                f"input); {fmt_tokens(branch_tokens)} of it by cache_aware's {branch} rule: ")
        if branch == "cache_miss":
            text += (f"the best match was at most router_cache_threshold {cache_threshold:g}, so the request went to "
                     f"the {miss_rule} rank while another held part of its prefix; a threshold of {new_threshold:g} "
                     f"matches those")
        else:
            text += (f"in-flight loads {balance_abs} apart and {balance_rel:g}× sent requests to the least loaded rank "
                     f"whatever held their prefix; thresholds {factor}× higher let the cache decide")
        return Claim("router_threshold", text)

    def prediction(self, rl, *, branch: str, kept_tokens: int, new_threshold: float | None = None) -> str:
        if branch == "cache_miss":
            return (f"predicted: brings back up to {lost_words(rl, kept_tokens)} (requests the cache_miss rule placed "
                    f"whose best rank held more than {fmt_pct(new_threshold)} of their input)")
        return (f"predicted: brings back up to {lost_words(rl, kept_tokens)} (the imbalanced rule's), at the price of "
                f"less even queues")

    def place(self, ev: Evidence) -> int:
        return routing_leads(ev)
