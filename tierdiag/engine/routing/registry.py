"""The routers by name (`make_router`); the Gateway that runs one in front of N ranks is
gateway.py's (compiled with the engine core)."""

from __future__ import annotations

from tierdiag.config.router import RouterConfig, RouterName
from tierdiag.errors import unknown_name
from tierdiag.engine.routing.affinity import PrefixHashRouter, SessionRouter
from tierdiag.engine.routing.base import Router
from tierdiag.engine.routing.cache_aware import CacheAwareRouter
from tierdiag.engine.routing.load import PowerOfTwoRouter, RandomRouter, RoundRobinRouter, ShortestQueueRouter


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
