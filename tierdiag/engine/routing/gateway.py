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
cannot have interpreted subclasses: routing/base.py's Router is subclassed by each).
"""

from __future__ import annotations

from typing import Any, Final, Sequence

from tierdiag.config.router import RouterConfig
from tierdiag.engine.routing.base import RanksView, RequestView, RouteDecision
from tierdiag.engine.routing.registry import make_router

# (tuple.__new__ as NamedTuple._make does: the generated __new__ is an interpreted frame more, once
# a request; tests/engine/test_routing.py holds the two equal)
_new_view: Final = tuple.__new__


class Gateway:
    """One router in front of `num_ranks` ranks, with the load it tracks."""

    def __init__(self, config: RouterConfig, num_ranks: int) -> None:
        # (Any: a policy is an interpreted class; its calls are generic either way)
        self.router: Any = make_router(config, num_ranks)
        self.num_ranks = num_ranks
        self._in_flight: list[int] = [0] * num_ranks

    @property
    def in_flight(self) -> tuple[int, ...]:
        return tuple(self._in_flight)

    def route(self, request: RequestView, now_ns: int, pending_tokens: Sequence[int] | None = None) -> RouteDecision:
        """Route `request`; `pending_tokens` is a load monitor's poll of every rank, if any."""
        view = _new_view(RanksView, (tuple(self._in_flight), None if pending_tokens is None else tuple(pending_tokens)))
        decision = self.router.route(request, view, now_ns)
        rank: int = decision.rank
        assert 0 <= rank < self.num_ranks, (
            f"router {self.router.name} chose rank {rank} of {self.num_ranks}: a bug in that policy")
        self._in_flight[rank] += 1
        return decision

    def finish(self, rank: int, request: RequestView, now_ns: int) -> None:
        """The request the gateway sent to `rank` has left it (finished, or refused)."""
        assert self._in_flight[rank] > 0, (
            f"finish on rank {rank} with nothing in flight there: the engine reported a request twice "
            "or one the gateway never routed")
        self._in_flight[rank] -= 1
        self.router.on_finish(rank, request, now_ns)
