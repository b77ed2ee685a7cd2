"""Routers that look at load only: round_robin, random, shortest_queue, power_of_two.

Each follows one policy of SGLang's model gateway (sgl-model-gateway/src/policies/), over the
load the gateway itself tracks (RanksView.in_flight) or a polled token load where one is given.
Ties go to the lowest rank, as Rust's `min_by_key` keeps the first minimum.
"""

from __future__ import annotations

import numpy as np

from tierdiag.config.router import RouterConfig, RouterName
from tierdiag.engine.routing.base import (RanksView, RequestView, RouteDecision, Router, fmt_loads,
                                          least_loaded, loads_of)


def _load_scores(loads) -> tuple[float, ...]:
    return tuple(float(x) for x in loads)


def _load_name(ranks: RanksView) -> str:
    return "pending tokens" if ranks.pending_tokens is not None else "in flight"


class RoundRobinRouter(Router):
    """Rank i, i+1, ... in turn, whatever their load."""

    name = RouterName.ROUND_ROBIN
    follows = "round_robin.rs RoundRobinPolicy::select_worker (a counter, fetch_add, modulo the workers)"

    def __init__(self, num_ranks: int, config: RouterConfig) -> None:
        super().__init__(num_ranks, config)
        self._turn = 0

    def route(self, request: RequestView, ranks: RanksView, now_ns: int) -> RouteDecision:
        turn = self._turn
        self._turn += 1
        rank = turn % ranks.num_ranks
        return RouteDecision(rank, self.name, "turn", f"round_robin: turn {turn} of {ranks.num_ranks} ranks: rank {rank}",
                             None, "in flight", _load_scores(ranks.in_flight))  # the turn is no "in flight" number


class RandomRouter(Router):
    """A uniform draw from a generator seeded by the run's seed (the gateway draws from the
    thread's RNG; a replay must repeat itself, so the seed is the run's)."""

    name = RouterName.RANDOM
    follows = "random.rs RandomPolicy::select_worker (uniform over healthy workers)"

    def __init__(self, num_ranks: int, config: RouterConfig) -> None:
        super().__init__(num_ranks, config)
        self._rng = np.random.default_rng(config.seed)

    def route(self, request: RequestView, ranks: RanksView, now_ns: int) -> RouteDecision:
        rank = int(self._rng.integers(ranks.num_ranks))
        return RouteDecision(rank, self.name, "draw", f"random: seeded draw: rank {rank}", None, "in flight",
                             _load_scores(ranks.in_flight))


class ShortestQueueRouter(Router):
    """The rank with the least load: cache_aware's imbalanced branch on its own."""

    name = RouterName.SHORTEST_QUEUE
    follows = "cache_aware.rs CacheAwarePolicy::select_worker_min_load (min_by_key over worker.load())"

    def route(self, request: RequestView, ranks: RanksView, now_ns: int) -> RouteDecision:
        loads = loads_of(ranks)
        rank = least_loaded(loads)
        what = _load_name(ranks)
        return RouteDecision(rank, self.name, "min_load",
                             f"shortest_queue: rank {rank} has the least {what} ({fmt_loads(loads)})",
                             float(loads[rank]), what, _load_scores(loads))


class PowerOfTwoRouter(Router):
    """Two distinct ranks drawn at random; the less loaded one (the first on a tie)."""

    name = RouterName.POWER_OF_TWO
    follows = ("power_of_two.rs PowerOfTwoPolicy::select_worker (idx2 = idx1 + 1 + draw(len - 1), "
               "load1 <= load2 keeps idx1)")

    def __init__(self, num_ranks: int, config: RouterConfig) -> None:
        super().__init__(num_ranks, config)
        self._rng = np.random.default_rng(config.seed)

    def route(self, request: RequestView, ranks: RanksView, now_ns: int) -> RouteDecision:
        n = ranks.num_ranks
        loads = loads_of(ranks)
        what = _load_name(ranks)
        if n == 1:
            return RouteDecision(0, self.name, "single", "power_of_two: one rank", float(loads[0]), what,
                                 _load_scores(loads))
        # The gateway's offset draw: the second pick can never equal the first.
        a = int(self._rng.integers(n))
        b = (a + 1 + int(self._rng.integers(n - 1))) % n
        rank = a if loads[a] <= loads[b] else b
        return RouteDecision(rank, self.name, "two_choices",
                             f"power_of_two: drew ranks {a} and {b}, {what} {loads[a]} vs {loads[b]}: rank {rank}",
                             float(loads[rank]), what, _load_scores(loads))
