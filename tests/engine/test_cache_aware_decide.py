"""cache_aware's decision made at once (routing/approx_tree.py `cache_aware_decide`, compiled with
the tree) against CacheAwareRouter.route's own body, the reference (issue 41, session 27).

The router takes the one call (through its compiled head, approx_tree.CacheAwareHead, session 36)
when its tree is an `ApproxTree` and its miss rule one of the two known; any other tree (the
reference `ApproxTreeByKey`), or `decide_at_once = False`, runs the route's own body. Both must
choose the same rank, for the same reason text, with the same scores and leave the same tree, on
any stream: loads given by hand (imbalanced, idle, huge), thresholds
at their edges and of either number type, both miss rules, evictions due often.
"""

from __future__ import annotations

from array import array

from hypothesis import given, settings
from hypothesis import strategies as st

from tierdiag.engine.routing import RanksView, RequestView, RouterConfig, make_router
from tierdiag.engine.routing.approx_tree import ApproxTree, ApproxTreeByKey
from tierdiag.engine.routing.router_tree import NativeApproxTree

PS = 64
S = 1_000_000_000


def _keys(family: int, path: list[int]) -> list[int]:
    keys, key = [], family + 1
    for branch in path:
        key = key * 4 + branch + 1
        keys.append(key)
    return keys


_load = st.one_of(st.integers(0, 5), st.integers(0, 300), st.integers(0, 2**70))
_request = st.tuples(
    st.integers(0, 3),                        # root family
    st.lists(st.integers(0, 2), max_size=7),  # the branch taken at each depth
    st.integers(0, PS - 1),                   # tokens after the last full page
    st.booleans(),                            # keys as an int64 run (the deployment's) or a list
)
_config = st.fixed_dictionaries({
    "router_cache_threshold": st.one_of(st.sampled_from([0.0, 1.0, 0.3, 0.5, 0, 1]), st.floats(0.0, 1.0)),
    "router_balance_abs_threshold": st.one_of(st.integers(0, 4), st.sampled_from([64, 2**62, 2**63 - 1])),
    "router_balance_rel_threshold": st.one_of(st.sampled_from([1.5, 1.0, 1, 3, 1e6, 5e-324]),
                                              st.floats(1e-9, 1e6)),
    "router_cache_miss": st.sampled_from(["smallest_tree", "min_load"]),
    "router_eviction_interval_s": st.sampled_from([0.0, 0.5, 60.0]),
    "router_max_tree_tokens": st.sampled_from([1, 3 * PS, 2**26]),
})


def _replay(n: int, cfg: dict, stream, tree_cls, at_once: bool) -> tuple[list, list]:
    router = make_router(RouterConfig(router="cache_aware", **cfg), n)
    router.tree = tree_cls(n)
    router.decide_at_once = at_once
    out = []
    for step, ((family, path, extra, as_run), loads) in enumerate(stream):
        keys = _keys(family, path)
        request = RequestView(f"r{step}", array("q", keys) if as_run else keys, len(keys) * PS + extra, PS, None)
        d = router.route(request, RanksView(tuple(loads[:n]) + (0,) * max(0, n - len(loads))), step * S // 4)
        out.append((tuple(d), tuple(type(x) for x in d), type(d)))
    tree = router.tree
    state = [list(tree.pages), router.evictions, router.evicted_pages, router.head.tick, router.head.next_eviction_ns]
    state.append([sorted(tree._ticks[r].items()) if isinstance(tree, ApproxTreeByKey) else sorted(tree._ticks_of(r).items())
                  for r in range(n)])
    return out, state


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 9), cfg=_config,
       stream=st.lists(st.tuples(_request, st.lists(_load, min_size=1, max_size=9)), max_size=40))
def test_the_decision_at_once_is_the_routes_own_on_any_stream(n, cfg, stream):
    fast = _replay(n, cfg, stream, ApproxTree, True)
    assert fast == _replay(n, cfg, stream, ApproxTree, False)
    assert fast == _replay(n, cfg, stream, ApproxTreeByKey, True)  # (another tree: the route's own body)
    if NativeApproxTree is not None:  # the C tree (router_tree.py) through the same call and the route's body
        assert fast == _replay(n, cfg, stream, NativeApproxTree, True)
        assert fast == _replay(n, cfg, stream, NativeApproxTree, False)


def test_the_route_takes_the_one_call_only_for_its_own_tree_and_rules():
    """The head decides (`at_once`) for its own trees and rules with `decide_at_once`; any other
    tree, rule or `decide_at_once = False` (set in any order) runs the route's own body, `_decide`,
    with the tick the head took."""
    calls = []
    router = make_router(RouterConfig(router="cache_aware"), 2)
    real = router._decide

    def spy(request, ranks, tick):
        calls.append((request.req_id, tick))
        return real(request, ranks, tick)

    router._decide = spy
    assert router.head.at_once and not router.head.miss_min_load
    d = router.route(RequestView("a", [1, 2], 128, PS), RanksView((0, 0)), 0)
    assert calls == [] and (d.rank, d.branch) == (0, "cache_miss")
    router.tree = ApproxTreeByKey(2)
    assert not router.head.at_once
    router.route(RequestView("b", [1, 2], 128, PS), RanksView((0, 0)), 1)
    router.decide_at_once = False
    router.tree = ApproxTree(2)
    assert not router.head.at_once
    router.route(RequestView("c", [1, 2], 128, PS), RanksView((0, 0)), 2)
    router.decide_at_once = True
    assert router.head.at_once
    router._miss = lambda r, ranks: (1, "a rule of a test's own")
    assert not router.head.at_once
    d = router.route(RequestView("d", [7], 64, PS), RanksView((0, 0)), 3)
    assert calls == [("b", 2), ("c", 3), ("d", 4)] and router.head.tick == 4
    assert d.reason == "cache_aware: best match 0.00 <= 0.30: a rule of a test's own"
    from tierdiag.config.router import CacheMissRule
    from tierdiag.engine.routing.cache_aware import CACHE_MISS_RULES
    router._miss = CACHE_MISS_RULES[CacheMissRule.MIN_LOAD]
    assert router.head.at_once and router.head.miss_min_load
    router.route(RequestView("e", [7], 64, PS), RanksView((0, 0)), 4)
    assert len(calls) == 3 and router.head.tick == 5
