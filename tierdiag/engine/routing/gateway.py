"""The Gateway that runs one router in front of N ranks, and the load it tracks.

The Gateway owns what the router tracks of load: requests sent to each rank and not yet
finished (the model gateway's `Worker::load()`, raised when it forwards a request and lowered
when the response ends). The engine calls `route` when a request arrives and `finish` when it
leaves its rank (finished or refused); everything a policy sees comes from those two calls and
the request itself.

Compiled with the engine core (engine/compiled.py: `routing.gateway`); this source is its Python
twin. As interpreted frames, `route`, `finish` and `in_flight` were ~0.1 G instructions of a
--dp 8 replay of the conversation trace (a route, a finish and a count a request, called from the
compiled deployment; issue 41, session 35). The policies stay interpreted (a compiled class
cannot have interpreted subclasses: routing/base.py's Router is subclassed by each); for
cache_aware, `route` calls the policy's compiled head (approx_tree.CacheAwareHead: its state, the
eviction and tick, the decision) itself, without the policy's interpreted frame, while the
policy's own route is the one that would run (one patched on its instance or class runs instead).
"""

from __future__ import annotations

from typing import Any, Final, Sequence

from tierdiag.config.router import RouterConfig
from tierdiag.engine.routing.approx_tree import CacheAwareHead
from tierdiag.engine.routing.base import RanksView, RequestView, RouteDecision
from tierdiag.engine.routing.cache_aware import CacheAwareRouter
from tierdiag.engine.routing.registry import make_router

# (tuple.__new__ as NamedTuple._make does: the generated __new__ is an interpreted frame more, once
# a request; tests/engine/test_routing.py holds the two equal)
_new_view: Final = tuple.__new__
# cache_aware's own route (the class's, as defined): the gateway calls its compiled head in its
# place while this is the route that would run
_CACHE_AWARE_ROUTE: Final = CacheAwareRouter.route


def _own_route(router: Any) -> bool:
    """`router` (a CacheAwareRouter: the gateway keeps a head for no other class) routes by its
    class's own route: none patched on the class or on the instance."""
    return type(router).route is _CACHE_AWARE_ROUTE and "route" not in router.__dict__


class Gateway:
    """One router in front of `num_ranks` ranks, with the load it tracks."""

    def __init__(self, config: RouterConfig, num_ranks: int) -> None:
        self._router: Any = None
        self._head: CacheAwareHead | None = None
        self.router = make_router(config, num_ranks)
        self.num_ranks = num_ranks
        self._in_flight: list[int] = [0] * num_ranks

    @property
    def router(self) -> Any:
        """The policy (Any: an interpreted class; its calls are generic either way)."""
        return self._router

    @router.setter
    def router(self, router: Any) -> None:
        self._router = router
        # cache_aware's head, which `route` calls itself (the policy's interpreted route frame
        # was ~5,500 instructions a request at --dp 8; issue 41, session 36)
        self._head = router.head if type(router) is CacheAwareRouter else None

    @property
    def in_flight(self) -> tuple[int, ...]:
        return tuple(self._in_flight)

    def route(self, request: RequestView, now_ns: int, pending_tokens: Sequence[int] | None = None) -> RouteDecision:
        """Route `request`; `pending_tokens` is a load monitor's poll of every rank, if any."""
        found = self.route_fields(request, now_ns, pending_tokens)
        return found if type(found) is RouteDecision else _new_view(RouteDecision, found)

    def route_fields(self, request: RequestView, now_ns: int, pending_tokens: Sequence[int] | None = None) -> tuple:
        """`route`'s decision as RouteDecision's fields in order, a plain tuple where cache_aware's
        head decided (the deployment reads them by position: a RouteDecision built and its six
        fields read by name were ~1,900 instructions a request at --dp 8; issue 41, session 36)."""
        loads = tuple(self._in_flight)
        router = self._router
        head = self._head
        found: tuple
        if head is not None and head.at_once and _own_route(router):
            # CacheAwareRouter.route without its frame: the head's route decides (at_once), and
            # that policy never reads a load poll
            decided = head.route(request, loads, now_ns)
            assert decided is not None
            found = decided
        else:
            view = _new_view(RanksView, (loads, None if pending_tokens is None else tuple(pending_tokens)))
            found = router.route(request, view, now_ns)
        rank: int = found[0]
        assert 0 <= rank < self.num_ranks, (
            f"router {router.name} chose rank {rank} of {self.num_ranks}: a bug in that policy")
        self._in_flight[rank] += 1
        return found

    def finish(self, rank: int, request: RequestView, now_ns: int) -> None:
        """The request the gateway sent to `rank` has left it (finished, or refused)."""
        assert self._in_flight[rank] > 0, (
            f"finish on rank {rank} with nothing in flight there: the engine reported a request twice "
            "or one the gateway never routed")
        self._in_flight[rank] -= 1
        hook = self._router.on_finish  # (routing/base.py: None where the policy keeps nothing to update)
        if hook is not None:
            hook(rank, request, now_ns)
