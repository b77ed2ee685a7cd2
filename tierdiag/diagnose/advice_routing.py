"""Advice for data-parallel deployments (issue 31): the router's policy, its thresholds, and the
number of ranks. Rules like advice.py's (each reads RunContext and proposes at most one typed
`Advice` with a prediction from the run's rows), registered there in `RULES`; `advise` replays
each with the sweep runner like any other change (config keys `dp`, `router`, `router_*`).

    rule              fires when (run-wide)                                  advises
    router            routing lost >= 5 % of input (routing_loss.py) under a      router cache_aware, or session
                      router that never looks at the prefix                  when most of it was session turns'
    router_threshold  cache_aware, and routing still lost >= 5 % of input:   router_cache_threshold lower
                      by the rule that placed most of it (route_branch)      (cache_miss), or the balance
                                                                             thresholds x 4 (imbalanced)
    dp                queueing >= 20 % of the excess TTFT, and the offered   dp: the smallest N whose ranks
                      prefill above TARGET_LOAD of the ranks in a material   are each offered at most
                      share of the run (capacity.py)                         TARGET_LOAD there

Predictions, from the rows:
  router cache_aware  the gateway sends a request to the rank whose approximate tree matches more
                      than router_cache_threshold of it while the load is balanced: the routing
                      tokens of requests whose best rank held more than that share come back
                      (an upper bound: the tree is the router's belief, and imbalance overrides it)
  router session      the routing tokens of session turns come back (every turn on one rank)
  router_threshold    the routing tokens of requests the cache_miss rule placed whose best rank
                      held more than the new threshold; or those the imbalanced rule placed
  dp N                the windows' load at the material quantile (capacity.material_load, per
                      rank) x dp / N, the arrivals spread evenly over the N ranks, is at most
                      TARGET_LOAD: the queue capacity made goes, and with it queueing's share of
                      the excess falls below QUEUE_EXCESS_SHARE (advise measures it: `queue_excess_share`)
"""

from __future__ import annotations

import math

from tierdiag.config.router import DEFAULTS as ROUTER_DEFAULTS
from tierdiag.diagnose import claims as C
from tierdiag.diagnose.advice_types import Advice
from tierdiag.diagnose.capacity import MATERIAL_SHARE, TARGET_LOAD
from tierdiag.diagnose.runcontext import RunContext
from tierdiag.units import fmt_pct, fmt_tokens, share

# advice.MIN_LOSS_SHARE, every rule's bar (not imported: advice.py imports these rules; a test
# keeps the two equal).
ROUTING_LOSS_SHARE = 0.05
# Routers that place a request without looking at its prefix (engine/routing/load.py).
PREFIX_BLIND = ("round_robin", "random", "shortest_queue", "power_of_two")
# The session router is advised when session turns carry at least this share of routing's loss.
SESSION_SHARE = 0.5
# The dp rule fires when queueing is at least this share of the run's excess TTFT, and predicts
# the N under which it falls below it.
QUEUE_EXCESS_SHARE = 0.2
MAX_DP = 64
BALANCE_FACTOR = 4
LOWEST_CACHE_THRESHOLD = 0.05
# The gateway's command-line defaults (config/router.py).
DEFAULT_CACHE_THRESHOLD = ROUTER_DEFAULTS["router_cache_threshold"]
DEFAULT_BALANCE_ABS = ROUTER_DEFAULTS["router_balance_abs_threshold"]
DEFAULT_BALANCE_REL = ROUTER_DEFAULTS["router_balance_rel_threshold"]


def _significant(tokens: int | None, input_tokens: int | None) -> bool:
    return bool(tokens) and bool(input_tokens) and tokens >= ROUTING_LOSS_SHARE * input_tokens


def _lost(ev, tokens: int) -> str:
    return f"{fmt_tokens(tokens)} tokens ({fmt_pct(share(tokens, ev.input_tokens))} of input)"


def _router(ctx: RunContext) -> list[Advice]:
    ev = ctx.routing
    router = ctx.config.get("router") or "round_robin"
    if ev is None or router not in PREFIX_BLIND or not _significant(ev.routing_tokens, ev.input_tokens):
        return []
    numbers = dict(routing_tokens=ev.routing_tokens, input_tokens=ev.input_tokens, requests=ev.routed_requests,
                   ranks=ev.num_ranks, router=router, share_of_recomputed=ev.share_of_recomputed,
                   session_tokens=ev.session_tokens, cache_threshold=DEFAULT_CACHE_THRESHOLD,
                   balance_abs=int(ctx.config.get("router_balance_abs_threshold", DEFAULT_BALANCE_ABS)),
                   balance_rel=float(ctx.config.get("router_balance_rel_threshold", DEFAULT_BALANCE_REL)))
    evidence = {"routing_tokens": ev.routing_tokens, "input_tokens": ev.input_tokens,
                "routed_requests": ev.routed_requests, "session_routing_tokens": ev.session_tokens,
                "dp": ev.num_ranks, "router": router}
    if ev.session_tokens >= SESSION_SHARE * ev.routing_tokens and _significant(ev.session_tokens, ev.input_tokens):
        return [Advice(
            "router", "router", "session", {"router": "session"}, C.advice_router_claim(**numbers, to="session").text,
            evidence, prediction=f"predicted: brings back the {_lost(ev, ev.session_tokens)} routing lost on "
                                 f"session turns, as far as the rank keeps them between turns")]
    threshold, changes = DEFAULT_CACHE_THRESHOLD, {"router": "cache_aware"}
    kept = ev.tokens_above(threshold)
    if not _significant(kept, ev.input_tokens):
        # The prefixes routing lost are shorter shares of their requests than cache_aware's default
        # threshold: cache_aware alone would place them as before. Where routing lost most of the
        # reuse (issue 40), advise it with router_cache_threshold just under their best rank's share.
        shares = [x for x, _ in ev.best_share_tokens if x > LOWEST_CACHE_THRESHOLD]
        if not ev.dominates_lost_reuse or not shares:
            return []
        threshold = max(math.floor(min(shares) * 100 - 1) / 100, LOWEST_CACHE_THRESHOLD)
        kept = ev.tokens_above(threshold)
        if threshold >= DEFAULT_CACHE_THRESHOLD or not _significant(kept, ev.input_tokens):
            return []
        changes = {"router": "cache_aware", "router_cache_threshold": threshold}
        numbers["cache_threshold"] = threshold
    return [Advice(
        "router", "router", "cache_aware", changes,
        C.advice_router_claim(**numbers, to="cache_aware").text, {**evidence, "kept_tokens": kept},
        prediction=(f"predicted: brings back up to {_lost(ev, kept)}, those of requests whose best rank held more "
                    f"than {fmt_pct(threshold)} of their input (fewer where the load is imbalanced, "
                    f"{numbers['balance_abs']} in flight apart and {numbers['balance_rel']:g}×)"))]


def _router_threshold(ctx: RunContext) -> list[Advice]:
    ev = ctx.routing
    if ev is None or ctx.config.get("router") != "cache_aware" or not _significant(ev.routing_tokens, ev.input_tokens):
        return []
    branch = max(ev.branch_tokens, key=lambda b: ev.branch_tokens[b], default=None)
    tokens = ev.branch_tokens.get(branch, 0)
    evidence = {"routing_tokens": ev.routing_tokens, "input_tokens": ev.input_tokens, "branch": branch,
                "branch_tokens": tokens}
    if branch == "cache_miss":
        current = float(ctx.config.get("router_cache_threshold", DEFAULT_CACHE_THRESHOLD))
        # The lowest best-rank share among the miss's routing-lost requests, just under it (to the
        # hundredth), within [LOWEST_CACHE_THRESHOLD, current): cache_aware then matches them.
        shares = [s for s, _ in ev.miss_best_share_tokens if s > LOWEST_CACHE_THRESHOLD]
        if not shares:
            return []
        new = max(math.floor(min(shares) * 100 - 1) / 100, LOWEST_CACHE_THRESHOLD)
        kept = ev.tokens_above(new, miss_only=True)
        if new >= current or not _significant(kept, ev.input_tokens):
            return []
        return [Advice(
            "router_threshold", "router_cache_threshold", new, {"router_cache_threshold": new},
            C.advice_router_threshold_claim(
                routing_tokens=ev.routing_tokens, input_tokens=ev.input_tokens, branch=branch, branch_tokens=tokens,
                cache_threshold=current, new_threshold=new,
                miss_rule=ctx.config.get("router_cache_miss") or "smallest_tree").text,
            {**evidence, "router_cache_threshold": current, "kept_tokens": kept},
            prediction=f"predicted: brings back up to {_lost(ev, kept)} (requests the cache_miss rule placed whose "
                       f"best rank held more than {fmt_pct(new)} of their input)")]
    if branch == "imbalanced":
        abs_t = int(ctx.config.get("router_balance_abs_threshold", DEFAULT_BALANCE_ABS))
        rel_t = float(ctx.config.get("router_balance_rel_threshold", DEFAULT_BALANCE_REL))
        if not _significant(tokens, ev.input_tokens):
            return []
        changes = {"router_balance_abs_threshold": abs_t * BALANCE_FACTOR,
                   "router_balance_rel_threshold": rel_t * BALANCE_FACTOR}
        return [Advice(
            "router_threshold", "router_balance_abs_threshold", abs_t * BALANCE_FACTOR, changes,
            C.advice_router_threshold_claim(
                routing_tokens=ev.routing_tokens, input_tokens=ev.input_tokens, branch=branch, branch_tokens=tokens,
                balance_abs=abs_t, balance_rel=rel_t, factor=BALANCE_FACTOR).text,
            {**evidence, "router_balance_abs_threshold": abs_t, "router_balance_rel_threshold": rel_t},
            prediction=f"predicted: brings back up to {_lost(ev, tokens)} (the imbalanced rule's), at the price of "
                       f"less even queues")]
    return []


def _dp(ctx: RunContext) -> list[Advice]:
    cap = ctx.capacity
    queued = share(ctx.queue_total_ns, ctx.excess_total_ns)
    if cap is None or queued is None or queued < QUEUE_EXCESS_SHARE or ctx.excess_total_ns <= 0:
        return []
    dp = cap.num_ranks
    per_rank = cap.material_load  # capacity's loads are per rank already
    if per_rank <= TARGET_LOAD:
        return []  # the ranks were not offered more than they can do: more of them is not the fix
    offered = per_rank * dp  # in GPUs' worth
    n = max(math.ceil(offered / TARGET_LOAD - 1e-9), dp + 1)
    if n > MAX_DP:
        return []
    return [Advice(
        "dp", "dp", n, {"dp": n}, C.advice_dp_claim(cap, queue_excess_share=queued, dp=dp, n=n).text,
        {"queue_excess_share": queued, "material_load": cap.material_load, "dp": dp,
         "per_rank_load": per_rank, "window_ms": cap.window_ns / 1e6},
        prediction=(f"predicted: with the arrivals spread evenly over {n} ranks, fewer than {fmt_pct(MATERIAL_SHARE)} "
                    f"of the windows offer a rank more than {fmt_pct(TARGET_LOAD)} of a GPU, so queueing falls "
                    f"below {fmt_pct(QUEUE_EXCESS_SHARE)} of the excess TTFT"))]


ROUTING_RULES = (_router, _router_threshold, _dp)


def routing_first(ctx: RunContext, items: list[Advice]) -> list[Advice]:
    """Where routing lost most of the run's lost reuse (RoutingLoss.dominates_lost_reuse), the
    router's items lead: a bigger pool on every rank keeps what the router scattered, the router
    keeps it where it is (and `advise --budget 1` replays the router first)."""
    if ctx.routing is None or not ctx.routing.dominates_lost_reuse:
        return items
    ours = ("router", "router_threshold")
    return [a for a in items if a.kind in ours] + [a for a in items if a.kind not in ours]
