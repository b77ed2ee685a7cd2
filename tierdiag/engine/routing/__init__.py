"""Routers in front of data-parallel ranks (DESIGN §6 Deployments).

    base.py         RequestView, RanksView, RouteDecision, the Router base: what a router sees
    load.py         round_robin, random, shortest_queue, power_of_two
    affinity.py     session, prefix_hash (a consistent hash ring, hashring.py)
    cache_aware.py  SGLang model gateway's cache_aware, over its approximate tree (approx_tree.py)
    registry.py     ROUTERS by name, make_router
    gateway.py      Gateway (the load the router tracks), compiled with the engine core

The names and keys (RouterConfig) are the config's (config/router.py). Routers see what a real router sees (their own state, the load they track, the request);
never a rank's radix tree.
"""

from tierdiag.engine.routing.base import RanksView, RequestView, RouteDecision, Router
from tierdiag.config.router import RouterConfig
from tierdiag.engine.routing.registry import ROUTERS, make_router
from tierdiag.engine.routing.gateway import Gateway

__all__ = ["ROUTERS", "Gateway", "RanksView", "RequestView", "RouteDecision", "Router", "RouterConfig",
           "make_router"]
