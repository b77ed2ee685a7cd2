"""lru's heaps as C structs (issue 41, session 31: native/csrc/lru_heap.c, RadixTree's `_c_heaps`).
The C heap must pop the entries the list heap of ints ((ns << 64 | seq) << 48 | id) pops, for any
sequence of pushes and pops; it must decline, having changed nothing, every stamp it cannot hold
(the tree then goes on with the list heaps); and a tree on C heaps must pick the victims a tree on
list heaps picks, whatever its stamps."""

from __future__ import annotations

from heapq import heappop, heappush

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierdiag.engine.tree import RadixTree
from tierdiag.native import cplane

C = cplane.C
needs_c = pytest.mark.skipif(C is None, reason="the compiled data plane is not built")

ID_BITS = 48
IN_RANGE = st.integers(0, 2**63 - 2)
HOSTILE = st.one_of(st.integers(-2**70, 2**70), st.floats(allow_nan=True), st.none(), st.text(max_size=2),
                    st.booleans(), st.sampled_from([-1, 2**63 - 1, 2**63, 2**64, 2**48, 2**48 - 1, -2**63]))


def _entry(ns: int, seq: int, nid: int) -> int:
    return (((ns << 64) | seq) << ID_BITS) | nid


def _pop_ref(heap: list[int], by_id: dict):
    """The list heap's pop as RadixTree._pop_lru takes entries: until one's id finds a node."""
    while heap:
        e = heappop(heap)
        node = by_id.get(e & ((1 << ID_BITS) - 1))
        if node is not None:
            return node, e
    return None, None


@needs_c
@settings(max_examples=300, deadline=None)
@given(ops=st.lists(st.one_of(
    st.tuples(st.just("push"), st.integers(0, 5), st.integers(0, 6), st.integers(0, 9)),
    st.tuples(st.just("push"), st.sampled_from([0, 2**62, 2**63 - 2]), st.sampled_from([0, 2**63 - 2]),
              st.sampled_from([0, 2**48 - 1])),
    st.tuples(st.just("pop"), st.integers(0, 0), st.integers(0, 0), st.integers(0, 0)),
    st.tuples(st.just("forget"), st.integers(0, 0), st.integers(0, 0), st.integers(0, 9))), max_size=80))
def test_the_c_heap_pops_what_the_list_heap_pops(ops):
    heap, ref = C.LruHeap(), []
    by_id = {nid: object() for nid in range(10)} | {2**48 - 1: object()}
    for op, a, b, c in ops:
        if op == "push":
            assert C.lru_push(heap, a, b, c) is True
            heappush(ref, _entry(a, b, c))
        elif op == "forget":
            by_id.pop(c, None)  # a deleted node: its entries are dropped when popped
        else:
            got = C.lru_pop(heap, by_id)
            want, e = _pop_ref(ref, by_id)
            assert got is want
            if e is not None:
                ns, seq = e >> (64 + ID_BITS), (e >> ID_BITS) & ((1 << 64) - 1)
                assert C.lru_fresh(heap, ns, seq) is True
                assert C.lru_fresh(heap, ns + 1, seq) is False and C.lru_fresh(heap, ns, seq + 1) is False
            else:
                assert C.lru_fresh(heap, 0, 0) is False  # nothing handed out
        assert len(heap) == len(ref)
        assert sorted(_entry(*t) for t in heap.items()) == sorted(ref)


@needs_c
@settings(max_examples=300, deadline=None)
@given(ns=st.one_of(IN_RANGE, HOSTILE), seq=st.one_of(IN_RANGE, HOSTILE), nid=st.one_of(st.integers(0, 2**48 - 1), HOSTILE))
def test_a_push_declines_what_the_heap_cannot_hold_having_changed_nothing(ns, seq, nid):
    heap = C.LruHeap()
    assert C.lru_push(heap, 3, 4, 5) is True
    fits = all(isinstance(v, int) and 0 <= v < lim for v, lim in ((ns, 2**63 - 1), (seq, 2**63 - 1), (nid, 2**48)))
    assert C.lru_push(heap, ns, seq, nid) is fits
    assert len(heap) == 1 + fits
    if fits:  # bool by its value, as the int entry's shifts read it
        assert (int(ns), int(seq), int(nid)) in heap.items()
    assert C.lru_fresh(heap, ns, seq) is False  # no pop yet
    by_id = {5: "five"}
    ref = [_entry(3, 4, 5)]
    if fits:
        by_id.setdefault(int(nid), "x")
        heappush(ref, _entry(int(ns), int(seq), int(nid)))
    want, e = _pop_ref(ref, by_id)
    assert C.lru_pop(heap, by_id) is want
    assert C.lru_fresh(heap, e >> (64 + ID_BITS), (e >> ID_BITS) & ((1 << 64) - 1)) is True


@needs_c
def test_the_heap_functions_refuse_wrong_arguments():
    heap = C.LruHeap()
    with pytest.raises(TypeError, match="no arguments"):
        C.LruHeap(1)
    with pytest.raises(TypeError, match="must be an LruHeap"):
        C.lru_push([], 1, 2, 3)
    with pytest.raises(TypeError, match="must be an LruHeap"):
        C.lru_pop([], {})
    with pytest.raises(TypeError, match="must be an LruHeap"):
        C.lru_fresh(None, 1, 2)
    with pytest.raises(TypeError, match="by_id must be a dict"):
        C.lru_pop(heap, [])
    with pytest.raises(TypeError, match="takes 4 arguments"):
        C.lru_push(heap, 1, 2)
    with pytest.raises(TypeError, match="takes 2 arguments"):
        C.lru_pop(heap)
    with pytest.raises(TypeError, match="takes 3 arguments"):
        C.lru_fresh(heap, 1)
    assert len(heap) == 0 and heap.items() == [] and C.lru_pop(heap, {}) is None
    for i in range(1000):  # grown past its first allocation, popped in order
        assert C.lru_push(heap, 1000 - i, i, i)
    ids = {i: i for i in range(1000)}
    assert [C.lru_pop(heap, ids) for _ in range(1000)] == list(range(999, -1, -1))


def _replay(tree: RadixTree, inserts, matches, times, pops):
    """Inserts (stamped at `times`), matches (a split, both halves stamped), victims popped and
    deleted; the victims' ids in order."""
    slot = iter(range(100_000))
    victims = []
    for i, raw in enumerate(inserts):
        keys = [sum(raw[:j + 1]) * 10 + j for j in range(len(raw))]
        now = times[i % len(times)]
        tree.insert(keys, 0, [next(slot) for _ in keys], now_ns=now)
        if i < len(matches) and matches[i]:
            tree.match(keys[: max(1, len(keys) // 2)], now_ns=now)
        for _ in range(pops[i % len(pops)]):
            victim = tree.pop_device_victim()
            if victim is None:
                break
            victims.append(victim.id)
            tree.delete(victim)
    while (victim := tree.pop_device_victim()) is not None:
        victims.append(victim.id)
        tree.delete(victim)
    return victims


@needs_c
@settings(max_examples=80, deadline=None)
@given(inserts=st.lists(st.lists(st.integers(1, 6), min_size=1, max_size=6), min_size=1, max_size=14),
       matches=st.lists(st.booleans(), max_size=14),
       times=st.lists(st.one_of(st.integers(0, 20), st.sampled_from([-5, 2**63, 2**70, 2**63 - 2])), min_size=1,
                      max_size=6),
       pops=st.lists(st.integers(0, 3), min_size=1, max_size=5))
def test_a_tree_on_c_heaps_picks_the_list_heaps_victims(inserts, matches, times, pops):
    """Any stamps (negative, past 2**63: the C heaps give way to the list heaps mid-run) and any
    mix of inserts, splits and evictions: the same victims in the same order."""
    c_tree, list_tree = RadixTree(64, "lru"), RadixTree(64, "lru")
    assert c_tree._c_heaps
    list_tree._to_list_heaps()
    assert not list_tree._c_heaps and list_tree._device_heap == []
    got = _replay(c_tree, inserts, matches, times, pops)
    assert got == _replay(list_tree, inserts, matches, times, pops)
    in_range = all(0 <= t < 2**63 - 1 for t in times[: len(inserts)])
    if in_range:
        assert c_tree._c_heaps  # stamps it holds: it never gave way


@needs_c
def test_the_heaps_turn_into_lists_with_their_entries():
    tree = RadixTree(64, "lru")
    tree.insert([1, 2, 3], 0, [0, 1, 2], now_ns=7)
    tree.insert([1, 5], 0, [3, 4], now_ns=8)  # a split: three nodes, two leaves
    entries = sorted(_entry(*t) for t in tree._device_heap.items())
    assert len(entries) >= 2
    tree.insert([9], 0, [5], now_ns=-1)  # a stamp the C cannot hold
    assert not tree._c_heaps and isinstance(tree._device_heap, list) and isinstance(tree._host_heap, list)
    new = tree._by_id[max(tree._by_id)]
    assert new.keys == [9] and tree._lru_entry(new) in tree._device_heap
    assert set(entries) <= set(tree._device_heap)
    order = []
    while (victim := tree.pop_device_victim()) is not None:
        order.append(victim)
        tree.delete(victim)
    assert order[0] is new and len(order) == 4 and tree._by_id == {}


def test_the_numpy_data_plane_keeps_the_list_heaps():
    tree = RadixTree(64, "lru")
    assert tree._c_heaps is (C is not None)
    assert RadixTree(64, "lfu")._c_heaps is False  # tuple entries: lists whatever the plane
