"""Routers that hash the request to a rank: session and prefix_hash.

Both look a key up on a consistent hash ring (routing/hashring.py), so the same session or the
same leading pages go to the same rank for as long as the number of ranks stays the same, without
any state. They differ in the key and in whether load can overrule the ring.
"""

from __future__ import annotations

from tierdiag.config.router import RouterConfig, RouterName
from tierdiag.engine.routing.base import (RanksView, RequestView, RouteDecision, Router, key_bytes,
                                          least_loaded, stable_hash)
from tierdiag.engine.routing.hashring import HashRing


def _scores(ranks: RanksView) -> tuple[float, ...]:
    return tuple(float(x) for x in ranks.in_flight)


class SessionRouter(Router):
    """Affinity by the trace's session: every turn of a session on one rank, as the gateway's
    `consistent_hashing` does with an X-SMG-Routing-Key header (find_by_consistent_hash: the key
    on the ring, load never consulted; bounded_consistent_hashing is a different policy). Where
    the gateway has no key it draws a random worker (Branch::RandomFallback); here a request
    without a session is keyed by its first page key instead (requests that open alike stay
    together, and a replay repeats itself), and one without a full page by its id."""

    name = RouterName.SESSION
    follows = ("consistent_hashing.rs ConsistentHashingPolicy::select_worker_impl / find_by_consistent_hash "
               "(routing key on a hash ring, no load check)")

    def __init__(self, num_ranks: int, config: RouterConfig) -> None:
        super().__init__(num_ranks, config)
        self._ring = HashRing(num_ranks)

    def route(self, request: RequestView, ranks: RanksView, now_ns: int) -> RouteDecision:
        if request.session is not None:
            branch, key, what = "session", request.session.encode(), f"session {request.session!r}"
        elif request.page_keys:
            branch, key, what = "first_page", key_bytes(request.page_keys[0]), "no session; its first page"
        else:
            branch, key, what = "request_id", request.req_id.encode(), "no session, no full page; its id"
        rank = self._ring.rank_of(stable_hash(key))
        return RouteDecision(rank, self.name, branch, f"session: {what} hashes to rank {rank}", None, "in flight",
                             _scores(ranks))


class PrefixHashRouter(Router):
    """The first K page keys on a consistent hash ring, K = router_prefix_hash_tokens // page
    size (at least 1). Keys are chained, so the K-th key alone names the first K pages: one
    lookup, no hashing of the pages themselves. A rank whose load is above load_factor × the
    average (counting the incoming request) gives way to the least loaded rank within that bound,
    as PrefixHashPolicy::find_worker_with_load_balance; if none is within it, the ring's rank."""

    name = RouterName.PREFIX_HASH
    follows = ("prefix_hash.rs PrefixHashPolicy::find_worker_with_load_balance and load_ok "
               "(prefix_token_count 256, load_factor 1.25)")

    def __init__(self, num_ranks: int, config: RouterConfig) -> None:
        super().__init__(num_ranks, config)
        self._ring = HashRing(num_ranks)

    def route(self, request: RequestView, ranks: RanksView, now_ns: int) -> RouteDecision:
        loads = ranks.in_flight
        scores = _scores(ranks)
        if not request.page_keys:
            # The gateway has no prefix to hash (Branch::NoTokens); a replay must still place it.
            rank = least_loaded(loads)
            return RouteDecision(rank, self.name, "no_full_page",
                                 f"prefix_hash: no full page to hash: least loaded rank {rank}",
                                 float(loads[rank]), "in flight", scores)
        pages = max(1, self.config.router_prefix_hash_tokens // request.page_tokens)
        pages = min(pages, len(request.page_keys))
        ring_rank = self._ring.rank_of(stable_hash(key_bytes(request.page_keys[pages - 1])))
        limit = (sum(loads) + 1) / len(loads) * self.config.router_prefix_hash_load_factor
        if sum(loads) == 0 or loads[ring_rank] <= limit:
            return RouteDecision(ring_rank, self.name, "ring",
                                 f"prefix_hash: first {pages} pages hash to rank {ring_rank} "
                                 f"(load {loads[ring_rank]} <= {limit:.2f})", float(loads[ring_rank]), "in flight",
                                 scores)
        within = [r for r in range(len(loads)) if loads[r] <= limit]
        rank = least_loaded(loads, within) if within else ring_rank
        return RouteDecision(rank, self.name, "load_walk",
                             f"prefix_hash: first {pages} pages hash to rank {ring_rank}, overloaded "
                             f"(load {loads[ring_rank]} > {limit:.2f}): rank {rank}", float(loads[rank]),
                             "in flight", scores)
