"""routing/approx_tree.py's CacheAwareHead (cache_aware's state and its route's head, compiled with
the tree; issue 41, session 36) against its Python source, the twin: the same decisions, ticks,
eviction passes and trees on any stream of requests, loads and times, hostile ones included
(times out of order or negative, zero tokens, loads past 64 bits, thresholds of either number
type, intervals that never evict or evict at every request); and the gateway, which calls the head
itself, against the policy's own route, patched or not."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine.helpers import source_twin
from tests.engine.test_cache_aware_decide import _keys  # (a request's prefix-chained keys by family and path)
from tierdiag.engine import compiled
from tierdiag.engine.routing import Gateway, RanksView, RequestView, RouterConfig, make_router
from tierdiag.engine.routing import approx_tree
from tierdiag.engine.routing.base import RouteDecision
from tierdiag.engine.routing.cache_aware import CacheAwareRouter
from tierdiag.engine.routing.router_tree import NativeApproxTree

PS = 16
S = 1_000_000_000

TWIN = source_twin("routing.approx_tree", "_approx_tree_twin")

_int64 = st.integers(-2**63, 2**63 - 1)
_request = st.tuples(
    st.integers(0, 3),                                  # root family
    st.lists(st.integers(0, 2), max_size=7),            # the branch taken at each depth
    st.integers(0, 2**31),                              # input tokens (any: 0 included)
    st.one_of(st.just(PS), st.integers(0, 2**20)),      # page tokens (any: 0 included)
    st.booleans(),                                      # keys as an int64 run (the deployment's) or a list
)
_step = st.tuples(_request, st.lists(st.one_of(st.integers(0, 5), st.integers(0, 2**70)), min_size=9, max_size=9),
                  st.one_of(st.integers(0, 40), _int64))  # now: quarter seconds, or any int64
_config = st.fixed_dictionaries({
    "router_cache_threshold": st.one_of(st.sampled_from([0.0, 1.0, 0.3, 0, 1]), st.floats(0.0, 1.0)),
    "router_balance_abs_threshold": st.one_of(st.integers(0, 4), st.sampled_from([64, 2**63 - 1])),
    "router_balance_rel_threshold": st.one_of(st.sampled_from([1.5, 1, 3, 5e-324]), st.floats(1e-9, 1e6)),
    "router_max_tree_tokens": st.sampled_from([1, 3 * PS, 2**26]),
})


def _ticks(tree, n: int) -> list:
    return [sorted(tree._ticks_of(r).items()) for r in range(n)]


def _replay(module, tree, n: int, cfg: dict, interval_ns: int, at_once: bool, min_load: bool, steps) -> list:
    """Every answer (or what was raised: its type and text) and the head's state after each step."""
    head = module.CacheAwareHead(tree, "cache_aware", interval_ns)
    head.configure(RouterConfig(router="cache_aware", **cfg))
    head.at_once, head.miss_min_load = at_once, min_load
    out: list = [(head.thr_text, head.max_tree_tokens)]
    for (family, path, input_tokens, page_tokens, as_run), loads, now in steps:
        keys = _keys(family, path)
        request = RequestView("r", array("q", keys) if as_run else keys, input_tokens, page_tokens, None)
        step = now * S // 4 if 0 <= now <= 40 else now
        try:
            found = head.route(request, tuple(loads[:n]), step)
            out.append(found if found is None else (found, tuple(type(x) for x in found)))
        except Exception as exc:  # noqa: BLE001 - what each side raised is compared, not hidden
            out.append((type(exc).__name__, str(exc)))
        out.append((head.tick, head.next_eviction_ns, head.evictions, head.evicted_pages, head.page_tokens_seen,
                    list(tree.pages)))
    out.append(_ticks(tree, n))
    return out


def test_the_head_is_compiled_where_the_core_is():
    if compiled.is_compiled():
        assert approx_tree.__file__.endswith(".so"), approx_tree.__file__
    assert TWIN.__file__.endswith("approx_tree.py")
    assert TWIN.CacheAwareHead is not approx_tree.CacheAwareHead


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 9), cfg=_config, interval_ns=st.sampled_from([0, -S, 1, S // 2, 60 * S, 2**63]),
       at_once=st.booleans(), min_load=st.booleans(), steps=st.lists(_step, max_size=30))
def test_the_compiled_head_routes_as_its_python_source(n, cfg, interval_ns, at_once, min_load, steps):
    twin = _replay(TWIN, TWIN.ApproxTree(n), n, cfg, interval_ns, at_once, min_load, steps)
    assert _replay(approx_tree, approx_tree.ApproxTree(n), n, cfg, interval_ns, at_once, min_load, steps) == twin
    if NativeApproxTree is not None:  # the C tree, which the router builds on the compiled data plane
        assert _replay(approx_tree, NativeApproxTree(n), n, cfg, interval_ns, at_once, min_load, steps) == twin


# --- the gateway calls the head itself (no interpreted route frame) ---------------------------------------

def _stream(gw: Gateway, steps) -> list:
    out = []
    for i, ((family, path, extra, _, as_run), loads, _now) in enumerate(steps):
        keys = _keys(family, path)
        request = RequestView(f"r{i}", array("q", keys) if as_run else keys, len(keys) * PS + extra % PS, PS, None)
        d = gw.route(request, i * S // 4, loads[:gw.num_ranks] if i % 3 == 0 else None)
        assert type(d) is RouteDecision
        out.append((tuple(d), gw.in_flight))
        if i % 2:
            gw.finish(d.rank, request, i * S // 4)
    router = gw.router
    return out + [router.head.tick, router.evictions, router.evicted_pages, list(router.tree.pages)]


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 9), cfg=_config, miss=st.sampled_from(["smallest_tree", "min_load"]),
       steps=st.lists(_step, max_size=25))
def test_the_gateways_own_call_of_the_head_is_the_policys_route(n, cfg, miss, steps):
    """A gateway whose policy's route is patched on the instance (a spy that calls the real one)
    takes the policy's route; an unpatched one calls the head itself: the same decisions."""
    cfg = RouterConfig(router="cache_aware", router_cache_miss=miss, router_eviction_interval_s=0.5, **cfg)
    fast = Gateway(cfg, n)
    slow = Gateway(cfg, n)
    real, calls = slow.router.route, []

    def spy(request, ranks, now_ns):
        calls.append(request.req_id)
        return real(request, ranks, now_ns)

    slow.router.route = spy
    assert _stream(fast, steps) == _stream(slow, steps)
    assert len(calls) == len(steps)


def test_a_route_patched_on_the_class_or_a_subclass_runs_in_the_heads_place(monkeypatch):
    cfg = RouterConfig(router="cache_aware")
    seen: list = []
    real = CacheAwareRouter.route

    def on_class(self, request, ranks, now_ns):
        seen.append(("class", request.req_id, ranks))
        return real(self, request, ranks, now_ns)

    gw = Gateway(cfg, 2)
    gw.route(RequestView("a", [1], PS, PS), 0)
    monkeypatch.setattr(CacheAwareRouter, "route", on_class)
    gw.route(RequestView("b", [1], PS, PS), 1, [3, 4])
    assert seen == [("class", "b", RanksView((1, 0), (3, 4)))] and gw.router.head.tick == 2
    monkeypatch.undo()

    class Sub(CacheAwareRouter):
        def route(self, request, ranks, now_ns):
            seen.append(("sub", request.req_id, ranks))
            return super().route(request, ranks, now_ns)

    gw.router = Sub(2, cfg)  # the gateway's head follows its router
    gw.route(RequestView("c", [1], PS, PS), 2)
    assert seen[-1] == ("sub", "c", RanksView((2, 0))) and gw.router.head.tick == 1
    gw.router = make_router(cfg, 2)
    gw.route(RequestView("d", [1], PS, PS), 3)
    assert len(seen) == 2 and gw.router.head.tick == 1 and gw.in_flight == (4, 0)
    gw.router = make_router(RouterConfig(router="round_robin"), 2)
    assert gw.route(RequestView("e", [1], PS, PS), 4).router == "round_robin"


def test_a_config_put_in_the_routers_place_moves_its_thresholds():
    """The reference read the thresholds off `config` every request: one put in its place is
    read at once (the head's copies follow it), on the head's call and on the route's own body."""
    for at_once in (True, False):
        router = make_router(RouterConfig(router="cache_aware"), 2)
        router.decide_at_once = at_once
        router.route(RequestView("a", [1, 2], 2 * PS, PS), RanksView((0, 0)), 0)
        d = router.route(RequestView("b", [1, 2, 3, 4], 4 * PS, PS), RanksView((0, 0)), 1)
        assert (d.branch, d.reason) == ("cache_hit", "cache_aware: match 0.50 > 0.30 on rank 0")
        router.config = RouterConfig(router="cache_aware", router_cache_threshold=0.75,
                                     router_balance_abs_threshold=0, router_balance_rel_threshold=1.0)
        d = router.route(RequestView("c", [1, 2, 3, 9], 4 * PS, PS), RanksView((0, 0)), 2)
        assert (d.branch, d.reason) == ("cache_miss", "cache_aware: best match 0.75 <= 0.75: smallest tree rank 1 (0 tokens)")
        d = router.route(RequestView("d", [5], PS, PS), RanksView((1, 0)), 3)
        assert (d.branch, d.reason) == ("imbalanced", "imbalanced: max load 1 - min 0 > 0 and 1 > 1 × 0: shortest queue rank 1")
        assert router.head.thr_text == "0.75"


@pytest.mark.parametrize("module", [approx_tree, TWIN], ids=["as imported", "python source"])
def test_an_eviction_pass_falls_at_each_interval_of_virtual_time(module):
    tree = module.ApproxTree(1)
    head = module.CacheAwareHead(tree, "cache_aware", S)
    head.configure(RouterConfig(router="cache_aware", router_max_tree_tokens=2 * PS))
    head.at_once = True
    for t, keys in ((0, [1, 5, 21]), (S - 1, [2, 9]), (S, [3]), (S, [4]), (5 * S + 7, [6])):
        head.route(RequestView("r", keys, len(keys) * PS, PS, None), (0,), t)
    # passes at S (the first request at or after it: 5 pages to 2, the oldest path's 3 dropped) and
    # at 5 S + 7 (4 pages to 2: [2, 9]'s); the next at the multiple after it, 6 S
    assert (head.evictions, head.next_eviction_ns, head.tick) == (2, 6 * S, 5)
    assert tree.pages == [3] and head.evicted_pages == 3 + 2
