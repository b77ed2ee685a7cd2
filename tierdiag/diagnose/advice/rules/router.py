"""router (data-parallel runs, issue 31): routing lost >= MIN_LOSS_SHARE of input (routing_loss.py)
under a router that never looks at the prefix. Advises router session where most of the loss was
session turns', else cache_aware (with router_cache_threshold just under the routing-lost requests'
best-rank share where the default threshold would place them as before and routing lost most of
the reuse, issue 40). Where routing lost most of the run's lost reuse, the router's items lead.

Predictions, from the rows:
  cache_aware   the gateway sends a request to the rank whose approximate tree matches more than
                router_cache_threshold of it while the load is balanced: the routing tokens of
                requests whose best rank held more than that share come back (an upper bound: the
                tree is the router's belief, and imbalance overrides it)
  session       the routing tokens of session turns come back (every turn on one rank)
"""

from __future__ import annotations

import math

from tierdiag.config.router import DEFAULTS as ROUTER_DEFAULTS
from tierdiag.diagnose.advice import targets as T
from tierdiag.diagnose.advice.base import Evidence, Rule, significant
from tierdiag.diagnose.advice.types import Advice
from tierdiag.diagnose.request.claims import Claim
from tierdiag.units import fmt_pct, fmt_tokens, share

# Routers that place a request without looking at its prefix (engine/routing/load.py).
PREFIX_BLIND = ("round_robin", "random", "shortest_queue", "power_of_two")
# The session router is advised when session turns carry at least this share of routing's loss.
SESSION_SHARE = 0.5
LOWEST_CACHE_THRESHOLD = 0.05
# The gateway's command-line defaults (config/router.py).
DEFAULT_CACHE_THRESHOLD = ROUTER_DEFAULTS["router_cache_threshold"]
DEFAULT_BALANCE_ABS = ROUTER_DEFAULTS["router_balance_abs_threshold"]
DEFAULT_BALANCE_REL = ROUTER_DEFAULTS["router_balance_rel_threshold"]


def lost_words(ev, tokens: int) -> str:
    return f"{fmt_tokens(tokens)} tokens ({fmt_pct(share(tokens, ev.input_tokens))} of input)"


def routing_leads(ev: Evidence) -> int:
    """Where routing lost most of the run's lost reuse (RoutingLoss.dominates_lost_reuse), the
    router's items lead: a bigger pool on every rank keeps what the router scattered, the router
    keeps it where it is (and `advise --budget 1` replays the router first)."""
    return -1 if ev.ctx.routing is not None and ev.ctx.routing.dominates_lost_reuse else 0


class Router(Rule):
    kinds = ("router",)
    options = {"router": "router"}
    target = T.ROUTING_SHARE

    def trigger(self, ev: Evidence) -> list[Advice]:
        ctx = ev.ctx
        rl = ctx.routing
        router = ctx.config.get("router") or "round_robin"
        if rl is None or router not in PREFIX_BLIND or not significant(rl.routing_tokens, rl.input_tokens):
            return []
        numbers = dict(routing_tokens=rl.routing_tokens, input_tokens=rl.input_tokens, requests=rl.routed_requests,
                       ranks=rl.num_ranks, router=router, share_of_recomputed=rl.share_of_recomputed,
                       session_tokens=rl.session_tokens, cache_threshold=DEFAULT_CACHE_THRESHOLD,
                       balance_abs=int(ctx.config.get("router_balance_abs_threshold", DEFAULT_BALANCE_ABS)),
                       balance_rel=float(ctx.config.get("router_balance_rel_threshold", DEFAULT_BALANCE_REL)))
        evidence = {"routing_tokens": rl.routing_tokens, "input_tokens": rl.input_tokens,
                    "routed_requests": rl.routed_requests, "session_routing_tokens": rl.session_tokens,
                    "dp": rl.num_ranks, "router": router}
        if rl.session_tokens >= SESSION_SHARE * rl.routing_tokens and significant(rl.session_tokens, rl.input_tokens):
            return [Advice(
                "router", "router", "session", {"router": "session"}, self.sentence(**numbers, to="session").text,
                evidence, prediction=self.prediction(rl, to="session"))]
        threshold, changes = DEFAULT_CACHE_THRESHOLD, {"router": "cache_aware"}
        kept = rl.tokens_above(threshold)
        if not significant(kept, rl.input_tokens):
            # The prefixes routing lost are shorter shares of their requests than cache_aware's default
            # threshold: cache_aware alone would place them as before. Where routing lost most of the
            # reuse (issue 40), advise it with router_cache_threshold just under their best rank's share.
            shares = [x for x, _ in rl.best_share_tokens if x > LOWEST_CACHE_THRESHOLD]
            if not rl.dominates_lost_reuse or not shares:
                return []
            threshold = max(math.floor(min(shares) * 100 - 1) / 100, LOWEST_CACHE_THRESHOLD)
            kept = rl.tokens_above(threshold)
            if threshold >= DEFAULT_CACHE_THRESHOLD or not significant(kept, rl.input_tokens):
                return []
            changes = {"router": "cache_aware", "router_cache_threshold": threshold}
            numbers["cache_threshold"] = threshold
        return [Advice(
            "router", "router", "cache_aware", changes,
            self.sentence(**numbers, to="cache_aware").text, {**evidence, "kept_tokens": kept},
            prediction=self.prediction(rl, to="cache_aware", kept_tokens=kept, threshold=threshold,
                                       balance_abs=numbers["balance_abs"], balance_rel=numbers["balance_rel"]))]

    def sentence(self, *, routing_tokens: int, input_tokens: int, requests: int, ranks: int, router: str,
                 share_of_recomputed: float | None, to: str, session_tokens: int,
                 cache_threshold: float, balance_abs: int = 64, balance_rel: float = 1.5) -> Claim:
        text = (f"routing lost {fmt_tokens(routing_tokens)} tokens ({fmt_pct(share(routing_tokens, input_tokens))} of "
                f"input) in {requests:,} requests across {ranks} ranks: at their arrival another rank held the prefix "
                f"on device or host and {router} sent them elsewhere ({fmt_pct(share_of_recomputed)} of the run's "
                f"recomputed tokens)")
        if to == "session":
            text += (f"; {fmt_tokens(session_tokens)} of them were session turns: the session router keeps every turn "
                     f"of a session on one rank, where its earlier turns left the prefix")
        else:
            text += (f"; cache_aware sends a request to the rank its approximate tree says holds more than "
                     f"router_cache_threshold {cache_threshold:g} of it while the load stays balanced "
                     f"(router_balance_abs_threshold {balance_abs} in flight apart, router_balance_rel_threshold "
                     f"{balance_rel:g}×)")
        return Claim("router", text)

    def prediction(self, rl, *, to: str, kept_tokens: int = 0, threshold: float = DEFAULT_CACHE_THRESHOLD,
                   balance_abs: int = DEFAULT_BALANCE_ABS, balance_rel: float = DEFAULT_BALANCE_REL) -> str:
        if to == "session":
            return (f"predicted: brings back the {lost_words(rl, rl.session_tokens)} routing lost on "
                    f"session turns, as far as the rank keeps them between turns")
        return (f"predicted: brings back up to {lost_words(rl, kept_tokens)}, those of requests whose best rank held "
                f"more than {fmt_pct(threshold)} of their input (fewer where the load is imbalanced, "
                f"{balance_abs} in flight apart and {balance_rel:g}×)")

    def place(self, ev: Evidence) -> int:
        return routing_leads(ev)
