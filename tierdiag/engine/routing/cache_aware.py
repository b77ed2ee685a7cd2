"""cache_aware: SGLang's model gateway's cache-aware load balancing, over page keys.

CacheAwarePolicy::select_worker (sgl-model-gateway/src/policies/cache_aware.rs), step by step:

1. Load is the gateway's own count of requests in flight per worker (`worker.load()`). Over all
   workers, with max and min of those counts, the system is *imbalanced* when
       max - min > balance_abs_threshold   and   max > balance_rel_threshold × min
   (both; `saturating_sub` and an f32 product in the gateway). Imbalanced: the worker with the
   least load (the first on a tie) gets the request, and the tree still records it there
   (`select_worker_min_load`: "Even in imbalanced mode, update the tree").
2. Balanced: `Tree::prefix_match` finds the longest prefix of the request anywhere in the
   approximate tree and a worker holding all of it; match rate = matched / request length.
   match rate > cache_threshold (strictly: the code's comparison; its docs say "at least"):
   that worker. Otherwise the cache-miss rule: sgl-router's `tree.get_smallest_tenant()`, the
   worker whose approximate tree is smallest ("most available cache capacity"; this package's
   default, `smallest_tree`); the later sgl-model-gateway sends misses to the least loaded worker
   instead (`min_load`). `router_cache_miss` picks.
3. `Tree::insert(request, worker)` for the chosen worker, whatever it will really cache.
4. Every `eviction_interval_secs` the gateway's background thread runs
   `Tree::evict_tenant_by_size(max_tree_size)` (routing/approx_tree.py). Here the clock is the
   replay's: evictions fall at multiples of the interval of virtual time and are applied before
   the first request routed at or after each (only routing reads the tree, so that is exact).

Defaults are the gateway's command line (RouterArgs in sglang_router/router_args.py:
cache_threshold 0.3, balance_abs_threshold 64, balance_rel_threshold 1.5, eviction_interval_secs
60, max_tree_size 2**26), not the Rust `CacheAwareConfig::default()` (0.5, 32, 1.1, 30, 10000),
which only code that builds the policy by hand gets. max_tree_size counts characters in the text
tree and tokens in the gRPC token tree (the same limit is passed to both); here it is tokens,
whole pages.

What this view is not: the ranks' truth. The tree holds every prefix the router sent to a rank
until its own size limit, far beyond what the rank's device and host pools keep (2**26 tokens a
rank by default), so after the rank evicts, the router still believes it holds the prefix; it
never learns of output tokens (the next turn's history), of pages a rank fetched from the
shared storage tier, or of requests a rank refused. `explain` prints both: the router's belief
(RouteDecision.scores) and, from the ranks' trees, where the prefix really was.
"""

from __future__ import annotations

from typing import Any, Callable

from tierdiag.config.router import CacheMissRule, RouterConfig, RouterName
from tierdiag.engine.routing.approx_tree import ApproxTree, CacheAwareHead
from tierdiag.engine.routing.base import RanksView, RequestView, RouteDecision, Router, least_loaded
from tierdiag.engine.routing.router_tree import NativeApproxTree, new_tree


_new_decision = tuple.__new__


def _smallest_tree(router: "CacheAwareRouter", ranks: RanksView) -> tuple[int, str]:
    rank = router.tree.smallest_rank()
    return rank, f"smallest tree rank {rank} ({router.tree.pages[rank] * router.page_tokens_seen:,} tokens)"


def _min_load(router: "CacheAwareRouter", ranks: RanksView) -> tuple[int, str]:
    rank = least_loaded(ranks.in_flight)
    return rank, f"least loaded rank {rank} ({ranks.in_flight[rank]} in flight)"


# Where a request whose best match is at or under the threshold goes.
CACHE_MISS_RULES: dict[CacheMissRule, Callable[["CacheAwareRouter", RanksView], tuple[int, str]]] = {
    CacheMissRule.SMALLEST_TREE: _smallest_tree,  # sgl-router: tree.get_smallest_tenant()
    CacheMissRule.MIN_LOAD: _min_load,  # sgl-model-gateway: min_by_key(worker.load()) among healthy workers
}


def is_imbalanced(loads: tuple[int, ...], abs_threshold: int, rel_threshold: float) -> bool:
    """CacheAwarePolicy::select_worker's test: both thresholds must trip."""
    hi, lo = max(loads), min(loads)
    return hi - lo > abs_threshold and hi > rel_threshold * lo


class CacheAwareRouter(Router):
    name = RouterName.CACHE_AWARE
    follows = ("cache_aware.rs CacheAwarePolicy::select_worker / select_worker_min_load; tree.rs Tree::insert, "
               "prefix_match, evict_tenant_by_size, get_smallest_tenant")

    def __init__(self, num_ranks: int, config: RouterConfig) -> None:
        # What route reads and writes a request (the tree, the tick, the eviction clock, the
        # config's thresholds) and the route's head over it, compiled with the tree
        # (approx_tree.CacheAwareHead; the Gateway calls its route without this class's frame);
        # the properties below read and set it under the names this router always had.
        self.head = CacheAwareHead(new_tree(num_ranks),  # the C tree on the compiled data plane, else ApproxTree
                                   self.name, int(config.router_eviction_interval_s * 1e9))
        self._decide_at_once = True
        self._miss_rule = CACHE_MISS_RULES[config.router_cache_miss]
        super().__init__(num_ranks, config)  # (sets `config`: the head reads its thresholds)
        self._settle()

    # route's decision by approx_tree.cache_aware_decide (the head's `at_once`) where the tree is
    # an ApproxTree (or its C twin, router_tree.py), the miss rule one of CACHE_MISS_RULES and
    # `decide_at_once` (False: this class's own body, the reference, always); decided when one of
    # the three is set, not a request
    def _settle(self) -> None:
        head, miss = self.head, self._miss_rule
        kind = type(head.tree)
        head.miss_min_load = miss is _min_load
        head.at_once = bool(self._decide_at_once and (kind is NativeApproxTree or kind is ApproxTree)
                            and (miss is _smallest_tree or miss is _min_load))

    @property
    def decide_at_once(self) -> bool:
        return self._decide_at_once

    @decide_at_once.setter
    def decide_at_once(self, value: bool) -> None:
        self._decide_at_once = value
        self._settle()

    @property
    def tree(self) -> Any:
        return self.head.tree

    @tree.setter
    def tree(self, tree: Any) -> None:
        self.head.tree = tree
        self._settle()

    @property
    def _miss(self) -> Callable[["CacheAwareRouter", RanksView], tuple[int, str]]:
        """Where a request whose best match is at or under the threshold goes (CACHE_MISS_RULES)."""
        return self._miss_rule

    @_miss.setter
    def _miss(self, rule: Callable[["CacheAwareRouter", RanksView], tuple[int, str]]) -> None:
        self._miss_rule = rule
        self._settle()

    @property
    def config(self) -> RouterConfig:
        return self._config

    @config.setter
    def config(self, config: RouterConfig) -> None:  # (the first, or another put in its place)
        self._config = config
        self.head.configure(config)

    @property
    def page_tokens_seen(self) -> int:
        """The page size requests come with (one per run)."""
        return self.head.page_tokens_seen

    @property
    def evictions(self) -> int:
        """Eviction passes run."""
        return self.head.evictions

    @property
    def evicted_pages(self) -> int:
        """(page, rank) entries the eviction passes dropped."""
        return self.head.evicted_pages

    def route(self, request: RequestView, ranks: RanksView, now_ns: int) -> RouteDecision:
        head = self.head
        # The head (the page size seen, an eviction pass due, the tick) and, where `at_once`, the
        # decision: one compiled call (approx_tree.CacheAwareHead.route; tests/engine/
        # test_cache_aware_decide.py holds it equal to this class's own body)
        found = head.route(request, ranks.in_flight, now_ns)
        if found is not None:
            # (tuple.__new__ as NamedTuple._make does: the generated __new__ is an interpreted frame more)
            return _new_decision(RouteDecision, found)
        return self._decide(request, ranks, head.tick)

    def _decide(self, request: RequestView, ranks: RanksView, tick: int) -> RouteDecision:
        """The decision after the head, step by step (the reference of cache_aware_decide)."""
        cfg = self.config
        keys = request.page_keys
        loads = ranks.in_flight
        tree = self.tree
        thr = cfg.router_cache_threshold
        thr_text = self.head.thr_text
        if is_imbalanced(loads, cfg.router_balance_abs_threshold, cfg.router_balance_rel_threshold):
            rank = least_loaded(loads)
            tree.insert(keys, rank, tick)
            hi, lo = max(loads), min(loads)
            return RouteDecision(rank, self.name, "imbalanced",
                                 f"imbalanced: max load {hi} - min {lo} > {cfg.router_balance_abs_threshold} and "
                                 f"{hi} > {cfg.router_balance_rel_threshold:g} × {lo}: shortest queue rank {rank}",
                                 float(loads[rank]), "in flight", tuple(float(x) for x in loads))
        matched, holder, depth_of = tree.prefix_match(keys, tick, touch=False)
        per_token = request.page_tokens / request.input_tokens if request.input_tokens else 0.0
        rate = matched * per_token
        scores = tuple([d * per_token for d in depth_of])
        if holder is not None and rate > thr:
            rank, branch = holder, "cache_hit"
            reason = f"cache_aware: match {rate:.2f} > {thr_text} on rank {rank}"
        else:
            rank, where = self._miss(self, ranks)
            branch = "cache_miss"
            reason = f"cache_aware: best match {rate:.2f} <= {thr_text}: {where}"
        if holder is not None and holder != rank:  # Tree::prefix_match touched it before the choice
            tree.touch(keys[:matched], holder, tick)
        # (what the rank holds of `keys`: prefix_match's depth for it; the touch above changes
        # ticks only, and of keys the holder holds)
        tree.insert(keys, rank, tick, depth_of[rank])  # (held: positional, a compiled call's quicker form)
        return _new_decision(RouteDecision, (rank, self.name, branch, reason, rate, "approx match", scores))
