"""cache_aware's approximate tree in C (native/csrc/approx_tree.c `RouterTree`, routing/router_tree.py
`NativeApproxTree`) against its Python twin `ApproxTree` and the reference `ApproxTreeByKey`
(issue 41, session 28): the same operations give the same answers, page counts, ticks of every
key and eviction order, on hostile keys (int64's edges, negative, zero); the router built on it
chooses the same rank for the same reason as on the Python trees. Skipped where the C data plane
is not built (the router then builds the Python twin: router_tree.new_tree).
"""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierdiag.engine.routing import RanksView, RequestView, RouterConfig, make_router
from tierdiag.engine.routing.approx_tree import ApproxTree, ApproxTreeByKey
from tierdiag.engine.routing.router_tree import NativeApproxTree, new_tree
from tierdiag.native import cplane

pytestmark = pytest.mark.skipif(NativeApproxTree is None, reason="the C data plane is not built")

PS = 64
S = 1_000_000_000
I64 = (-2**63, 2**63 - 1)

# Keys: every (family, path prefix) named once by a value drawn from a hostile pool (int64's
# edges, negative, zero, small), so keys stay prefix-chained (a key has one parent) as page keys are.
_key_pool = st.one_of(st.sampled_from([0, -1, 1, I64[0], I64[1], I64[0] + 1, I64[1] - 1]),
                      st.integers(*I64), st.integers(-8, 8))


def _namer(draw_key):
    names: dict[tuple, int] = {}
    used: set[int] = set()

    def keys_of(family: int, path: list[int]) -> list[int]:
        out = []
        for d in range(len(path)):
            prefix = (family, *path[:d + 1])
            if prefix not in names:
                k = draw_key()
                while k in used:
                    k = k + 1 if k < I64[1] else I64[0]  # (one way round: ends, the pool is finite)
                names[prefix] = k
                used.add(k)
            out.append(names[prefix])
        return out
    return keys_of


_op = st.one_of(
    st.tuples(st.just("insert"), st.integers(0, 3), st.lists(st.integers(0, 2), max_size=7), st.integers(0, 8)),
    st.tuples(st.just("match"), st.integers(0, 3), st.lists(st.integers(0, 2), max_size=7), st.booleans()),
    st.tuples(st.just("evict"), st.integers(-2, 12)),
)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 9), ops=st.lists(_op, max_size=70), key_runs=st.booleans(), data=st.data())
def test_the_c_tree_answers_as_the_python_trees(n, ops, key_runs, data):
    keys_of = _namer(lambda: data.draw(_key_pool))
    trees = [NativeApproxTree(n), ApproxTree(n), ApproxTreeByKey(n)]
    for tick, op in enumerate(ops, 1):
        if op[0] == "evict":
            assert len({t.evict(op[1]) for t in trees}) == 1
        else:
            keys = keys_of(op[1], op[2])
            run = array("q", keys) if key_runs else keys
            if op[0] == "insert":
                for t in trees:
                    t.insert(run, op[3] % n, tick)
            else:
                got = [t.prefix_match(run, tick, touch=op[3]) for t in trees]
                assert got[0] == got[1] == got[2] and type(got[0][2]) is list
                if not op[3] and got[0][1] is not None:  # cache_aware's own touch of the holder's path
                    for t in trees:
                        t.touch(run[:got[0][0]], got[0][1], tick)
        pages = [t.pages for t in trees]
        assert pages[0] == pages[1] == pages[2] and len(trees[0]) == len(trees[2])
        assert [trees[0]._ticks_of(r) for r in range(n)] == [trees[1]._ticks_of(r) for r in range(n)] == trees[2]._ticks
        trees[0].check()
    assert trees[0].smallest_rank() == trees[1].smallest_rank() == trees[2].smallest_rank()


_load = st.one_of(st.integers(0, 5), st.integers(0, 300), st.integers(0, 2**70))
_config = st.fixed_dictionaries({
    "router_cache_threshold": st.one_of(st.sampled_from([0.0, 1.0, 0.3, 0.5]), st.floats(0.0, 1.0)),
    "router_balance_abs_threshold": st.one_of(st.integers(0, 4), st.sampled_from([64, 2**63 - 1])),
    "router_balance_rel_threshold": st.one_of(st.sampled_from([1.5, 1.0, 1e6]), st.floats(1e-9, 1e6)),
    "router_cache_miss": st.sampled_from(["smallest_tree", "min_load"]),
    "router_eviction_interval_s": st.sampled_from([0.0, 0.5, 60.0]),
    "router_max_tree_tokens": st.sampled_from([1, 3 * PS, 2**26]),
})


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 9), cfg=_config, data=st.data(),
       stream=st.lists(st.tuples(st.integers(0, 3), st.lists(st.integers(0, 2), max_size=7), st.integers(0, PS - 1),
                                 st.booleans(), st.lists(_load, min_size=1, max_size=9)), max_size=40))
def test_the_router_on_the_c_tree_chooses_as_on_the_python_trees(n, cfg, data, stream):
    """The worker, the branch, the reason's text, the scores, the evictions: equal on every tree."""
    keys_of = _namer(lambda: data.draw(_key_pool))
    requests = []
    for step, (family, path, extra, as_run, loads) in enumerate(stream):
        keys = keys_of(family, path)
        requests.append((RequestView(f"r{step}", array("q", keys) if as_run else keys, len(keys) * PS + extra, PS),
                         RanksView(tuple(loads[:n]) + (0,) * max(0, n - len(loads))), step * S // 4))
    results = []
    for tree_cls in (NativeApproxTree, ApproxTree, ApproxTreeByKey):
        router = make_router(RouterConfig(router="cache_aware", **cfg), n)
        router.tree = tree_cls(n)
        out = [tuple(router.route(*r)) for r in requests]
        ticks = [router.tree._ticks_of(r) for r in range(n)] if tree_cls is not ApproxTreeByKey else router.tree._ticks
        results.append((out, list(router.tree.pages), router.evictions, router.evicted_pages, ticks))
    assert results[0] == results[1] == results[2]


def test_the_router_builds_the_c_tree_on_the_compiled_data_plane():
    tree = make_router(RouterConfig(router="cache_aware"), 3).tree
    assert type(tree) is (ApproxTree if cplane.C is None else NativeApproxTree)
    assert cplane.pairs()["routing.approx_tree"] == (NativeApproxTree, ApproxTree) and new_tree is NativeApproxTree


@settings(deadline=None)  # (2**20 ranks: ~50 MB of roots made and freed an example)
@given(n=st.one_of(st.integers(-3, 0), st.integers(2**20 + 1, 2**64), st.just(2**20)),
       rank=st.one_of(st.integers(-2**70, -1), st.integers(4, 2**70)))
def test_hostile_arguments_are_refused_with_the_tree_unchanged(n, rank):
    if n == 2**20:
        assert NativeApproxTree(n).num_ranks == n
    else:
        with pytest.raises((ValueError, OverflowError)):
            NativeApproxTree(n)
    t = NativeApproxTree(4)
    t.insert([5, 6], 1, 1)
    with pytest.raises((IndexError, OverflowError)):
        t.insert([5, 7], rank, 2)
    with pytest.raises((IndexError, OverflowError)):
        t.touch([5], rank, 2)
    for bad in ([2**63], [1, -2**63 - 1], ["a"], [1.0], None, "ab"):
        with pytest.raises(TypeError):
            t.insert(bad, 0, 3)
        with pytest.raises(TypeError):
            t.prefix_match(bad, 3)
    for call in (lambda: t.prefix_match([5], 3, nudge=True), lambda: t.prefix_match([5]),
                 lambda: t.insert([5], 0), lambda: t.evict("1"), lambda: t.insert([5], 0, 1.5)):
        with pytest.raises(TypeError):
            call()
    assert t.pages == [0, 2, 0, 0] and t._ticks_of(1) == {5: 1, 6: 1}
    t.check()
