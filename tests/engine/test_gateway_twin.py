"""routing/gateway.py's Gateway is compiled with the engine core (issue 41, session 35): the
compiled class and its Python source (the twin) must route, count and refuse alike, for every
router, any deployment size and any stream of routes and finishes, hostile request ids and
sessions included (the hashing routers read them), with or without a load monitor's poll."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine.helpers import source_twin
from tierdiag.engine import compiled
from tierdiag.engine.routing import ROUTERS, Gateway, RequestView, RouterConfig
from tierdiag.engine.routing import gateway as gateway_module
from tierdiag.engine.routing.base import RouteDecision

PS = 16
S = 1_000_000_000

TWIN = source_twin("routing.gateway", "_gateway_twin")

_text = st.text(st.characters(codec="utf-8"), max_size=12)  # any text a trace may carry
_request = st.tuples(
    _text,                                          # request id
    st.lists(st.integers(-2**63, 2**63 - 1), max_size=8),  # page keys (any int64, shared or not)
    st.one_of(st.none(), _text),                    # session
    st.integers(0, PS - 1),                         # tokens after the last full page
    st.one_of(st.none(), st.lists(st.integers(0, 2**40), min_size=9, max_size=9)),  # a load poll
)
_op = st.one_of(st.tuples(st.just("route"), _request), st.tuples(st.just("finish"), st.integers(0, 1000)))


def _replay(cls, router: str, n: int, seed: int, ops) -> list:
    """Every decision, the counts after each step, and what the gateway raised (its type and text)."""
    gw = cls(RouterConfig(router=router, seed=seed, router_balance_abs_threshold=2, router_max_tree_tokens=3 * PS,
                          router_eviction_interval_s=0.5), n)
    open_requests: list = []
    out: list = []
    for step, (kind, arg) in enumerate(ops):
        now_ns = step * S // 4
        try:
            if kind == "route":
                req_id, keys, session, extra, poll = arg
                request = RequestView(req_id, array("q", keys), len(keys) * PS + extra, PS, session)
                d = gw.route(request, now_ns, None if poll is None else poll[:n])
                assert type(d) is RouteDecision
                open_requests.append((d.rank, request))
                out.append(tuple(d))
            elif open_requests:
                rank, request = open_requests.pop(arg % len(open_requests))
                gw.finish(rank, request, now_ns)
        except Exception as exc:  # noqa: BLE001 - what each side raised is compared, not hidden
            out.append((type(exc).__name__, str(exc)))
        out.append(gw.in_flight)
    return out


def test_the_gateway_is_compiled_where_the_core_is():
    assert Gateway is gateway_module.Gateway
    if compiled.is_compiled():
        assert gateway_module.__file__.endswith(".so"), gateway_module.__file__
    assert TWIN.__file__.endswith("gateway.py")


@settings(max_examples=60, deadline=None)
@given(router=st.sampled_from(sorted(ROUTERS)), n=st.integers(1, 9), seed=st.integers(0, 2**16),
       ops=st.lists(_op, max_size=30))
def test_the_compiled_gateway_routes_as_its_python_source(router, n, seed, ops):
    assert _replay(Gateway, router, n, seed, ops) == _replay(TWIN.Gateway, router, n, seed, ops)


@pytest.mark.parametrize("cls", [Gateway, TWIN.Gateway], ids=["as imported", "python source"])
def test_a_finish_the_gateway_never_routed_and_a_rank_out_of_range_are_refused(cls):
    gw = cls(RouterConfig(router="round_robin"), 2)
    with pytest.raises(AssertionError, match="finish on rank 1 with nothing in flight there"):
        gw.finish(1, RequestView("x", [], 1, PS), 0)
    with pytest.raises(IndexError):
        gw.finish(5, RequestView("x", [], 1, PS), 0)
    assert gw.in_flight == (0, 0)

    def wrong(request, ranks, now_ns):
        return RouteDecision(2, "round_robin", "ring", "off the end", None, "in flight", (0.0, 0.0))

    gw.router.route = wrong
    with pytest.raises(AssertionError, match="router round_robin chose rank 2 of 2: a bug in that policy"):
        gw.route(RequestView("y", [1], PS, PS), 0)
    assert gw.in_flight == (0, 0)


@settings(max_examples=30, deadline=None)
@given(router=st.sampled_from(sorted(ROUTERS)), n=st.integers(1, 9), seed=st.integers(0, 2**16),
       ops=st.lists(_op, max_size=30))
def test_route_fields_are_routes_decision_in_order(router, n, seed, ops):
    """What the deployment reads (`route_fields`, by position) is `route`'s RouteDecision, field
    for field, on both sides (cache_aware's head's plain tuple included)."""
    for cls in (Gateway, TWIN.Gateway):
        class ByFields:
            """The gateway's route as the deployment reads it: its fields, made a RouteDecision here."""

            def __init__(self, config, num_ranks):
                self.gw = cls(config, num_ranks)

            def route(self, request, now_ns, poll=None):
                found = self.gw.route_fields(request, now_ns, poll)
                assert type(found) in (tuple, RouteDecision) and len(found) == len(RouteDecision._fields)
                return RouteDecision(*found)

            def finish(self, rank, request, now_ns):
                self.gw.finish(rank, request, now_ns)

            @property
            def in_flight(self):
                return self.gw.in_flight

        assert _replay(ByFields, router, n, seed, ops) == _replay(cls, router, n, seed, ops)


@pytest.mark.parametrize("cls", [Gateway, TWIN.Gateway], ids=["as imported", "python source"])
def test_a_policys_on_finish_is_called_where_one_is_set(cls):
    """routing/base.py's `on_finish` is None (nothing called at a finish) unless a policy sets it:
    on the instance, on its class, by a subclass's method."""
    from tierdiag.engine.routing.load import RoundRobinRouter

    seen: list = []
    gw = cls(RouterConfig(router="round_robin"), 2)
    assert gw.router.on_finish is None
    a = RequestView("a", [1], PS, PS)
    gw.finish(gw.route(a, 0).rank, a, 1)
    gw.router.on_finish = lambda rank, request, now_ns: seen.append(("instance", rank, request.req_id, now_ns))
    gw.finish(gw.route(a, 2).rank, a, 3)
    del gw.router.on_finish

    class Keeping(RoundRobinRouter):
        def on_finish(self, rank, request, now_ns):
            seen.append(("class", rank, request.req_id, now_ns))

    gw.router = Keeping(2, RouterConfig(router="round_robin"))
    gw.finish(gw.route(a, 4).rank, a, 5)
    gw.router = RoundRobinRouter(2, RouterConfig(router="round_robin"))
    gw.finish(gw.route(a, 6).rank, a, 7)
    assert seen == [("instance", 1, "a", 3), ("class", 0, "a", 5)] and gw.in_flight == (0, 0)
