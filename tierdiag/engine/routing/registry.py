"""The routers by name, and the Gateway that runs one in front of N ranks.

The Gateway owns what the router tracks of load: requests sent to each rank and not yet
finished (the model gateway's `Worker::load()`, raised when it forwards a request and lowered
when the response ends). The engine calls `route` when a request arrives and `finish` when it
leaves its rank (finished or refused); everything a policy sees comes from those two calls and
the request itself.
"""

from __future__ import annotations

from typing import Sequence

from tierdiag.config.router import RouterConfig, RouterName
from tierdiag.errors import unknown_name
from tierdiag.engine.routing.affinity import PrefixHashRouter, SessionRouter
from tierdiag.engine.routing.base import RanksView, RequestView, RouteDecision, Router
from tierdiag.engine.routing.cache_aware import CacheAwareRouter
from tierdiag.engine.routing.load import PowerOfTwoRouter, RandomRouter, RoundRobinRouter, ShortestQueueRouter


_new_view = tuple.__new__

ROUTERS: dict[RouterName, type[Router]] = {cls.name: cls for cls in (
    RoundRobinRouter, RandomRouter, ShortestQueueRouter, PowerOfTwoRouter, SessionRouter, PrefixHashRouter,
    CacheAwareRouter)}

# One class a name of config/router.py's RouterName (tests/test_registries.py checks both ways).


def make_router(config: RouterConfig, num_ranks: int) -> Router:
    try:
        cls = ROUTERS[config.router]
    except KeyError:
        raise unknown_name("router", config.router, ROUTERS) from None
    if num_ranks < 1:
        raise ValueError(f"a deployment needs at least one rank, got {num_ranks}")
    return cls(num_ranks, config)


class Gateway:
    """One router in front of `num_ranks` ranks, with the load it tracks."""

    def __init__(self, config: RouterConfig, num_ranks: int) -> None:
        self.router = make_router(config, num_ranks)
        self.num_ranks = num_ranks
        self._in_flight = [0] * num_ranks

    @property
    def in_flight(self) -> tuple[int, ...]:
        return tuple(self._in_flight)

    def route(self, request: RequestView, now_ns: int, pending_tokens: Sequence[int] | None = None) -> RouteDecision:
        """Route `request`; `pending_tokens` is a load monitor's poll of every rank, if any."""
        # (tuple.__new__ as NamedTuple._make does: the generated __new__ is an interpreted frame
        # more, once a request; tests/engine/test_routing.py holds the two equal)
        view = _new_view(RanksView, (tuple(self._in_flight), None if pending_tokens is None else tuple(pending_tokens)))
        decision = self.router.route(request, view, now_ns)
        assert 0 <= decision.rank < self.num_ranks, (
            f"router {self.router.name} chose rank {decision.rank} of {self.num_ranks}: a bug in that policy")
        self._in_flight[decision.rank] += 1
        return decision

    def finish(self, rank: int, request: RequestView, now_ns: int) -> None:
        """The request the gateway sent to `rank` has left it (finished, or refused)."""
        assert self._in_flight[rank] > 0, (
            f"finish on rank {rank} with nothing in flight there: the engine reported a request twice "
            "or one the gateway never routed")
        self._in_flight[rank] -= 1
        self.router.on_finish(rank, request, now_ns)
