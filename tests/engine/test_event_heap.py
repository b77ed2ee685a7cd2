"""The deployment's event heap (deployment.EventHeap, a rank's own beside it) and EngineStats'
eviction counts (issue 41, session 36): the compiled classes and their Python source, the twin,
against heapq on the tuples the loop pushed before (time, order given by the pushes, ...): the
same events popped in the same order, ties at one time in the order they were pushed, whatever
the times (int64's ends, past them, negative); the counts' dict as the dict that counted them."""

from __future__ import annotations

import copy
import dataclasses
import heapq

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine.helpers import small_config
from tierdiag.engine import compiled, controller, deployment
from tierdiag.engine.engine import Engine
from tierdiag.native import cplane


def _twin(module: str, name: str):
    """source_twin, the module in sys.modules while it runs (a dataclass's fields are looked up
    there), the data plane's pairs left as they were (the source's `cplane.choose` registers its
    own functions under the compiled module's names, which test_cplane checks)."""
    import importlib.util
    import sys

    kept = cplane.pairs()
    spec = importlib.util.spec_from_file_location(name, compiled.source_path(module))
    sys.modules[name] = loaded = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(loaded)
    finally:
        cplane._PAIRS.clear()
        cplane._PAIRS.update(kept)
    return loaded


DEPLOYMENT_TWIN = _twin("deployment", "_deployment_twin")
CONTROLLER_TWIN = _twin("controller", "_controller_twin")

# times: a few (ties at every pop), or any int64, or past it either way
_time = st.one_of(st.integers(0, 3), st.integers(-2**63, 2**63 - 1), st.integers(-2**70, 2**70))
# an op: a push at a time, or a pop (None)
_ops = st.lists(st.one_of(_time, st.none()), max_size=300)


@pytest.fixture(scope="module")
def scheds():
    """Two real schedulers (the compiled Event types its rank's as Scheduler)."""
    return Engine(small_config(dp=2)).deployment.ranks


def test_the_compiled_heap_is_the_one_tested():
    if compiled.is_compiled():
        assert not hasattr(deployment.EventHeap.push, "__code__")
        assert not hasattr(controller.EngineStats.count_evictions, "__code__")
    assert hasattr(DEPLOYMENT_TWIN.EventHeap.push, "__code__")


@settings(max_examples=300, deadline=None)
@given(ops=_ops)
def test_events_pop_in_heapq_s_order(scheds, ops):
    for module in (deployment, DEPLOYMENT_TWIN):
        heap, ref = module.EventHeap(), []
        order = 0
        for i, t in enumerate(ops):
            if t is not None:
                order += 1
                sched = scheds[i % 2]
                heap.push(t, sched, len, i)
                heapq.heappush(ref, (t, order, sched, len, i))
                assert heap.last_order == order
            elif ref:
                event = heap.pop()
                want = heapq.heappop(ref)
                assert (event.t_ns, event.order, event.sched, event.fn, event.arg) == want
            assert len(heap) == len(ref)
            if ref:
                assert (heap.items[0].t_ns, heap.items[0].order) == ref[0][:2]
        while ref:  # drained: every tie in push order
            event = heap.pop()
            assert (event.t_ns, event.order, event.arg) == (lambda w: (w[0], w[1], w[4]))(heapq.heappop(ref))
        assert heap.items == []


@settings(max_examples=300, deadline=None)
@given(ops=_ops, ranks=st.integers(1, 4))
def test_each_rank_s_own_heap_pops_the_event_the_deployment_s_pops(scheds, ops, ranks):
    """A rank's own heap (the same Events, `put` in as pushed): its head is the rank's next
    event, and the event the deployment's heap pops next for a rank is its own heap's pop."""
    for module in (deployment, DEPLOYMENT_TWIN):
        heap = module.EventHeap()
        own = [module.EventHeap() for _ in range(ranks)]
        for i, t in enumerate(ops):
            if t is not None:
                own[i % ranks].put(heap.push(t, scheds[0], len, i % ranks))
            elif heap.items:
                event = heap.pop()
                assert own[event.arg].pop() is event
            for rank, mine in enumerate(own):
                pending = [e for e in heap.items if e.arg == rank]
                assert len(mine) == len(pending)
                if pending:
                    assert mine.items[0] is min(pending, key=lambda e: (e.t_ns, e.order))
        while heap.items:
            event = heap.pop()
            assert own[event.arg].pop() is event
        assert all(not mine.items for mine in own)


_count = st.tuples(st.integers(0, 4), st.one_of(st.integers(1, 3), st.integers(1, 2**70)))


@settings(max_examples=200, deadline=None)
@given(counts=st.lists(_count, max_size=60))
def test_eviction_counts_read_as_the_dict_that_counted_them(counts):
    keys = controller.EVICTION_KEYS
    assert keys == CONTROLLER_TWIN.EVICTION_KEYS == (
        "device/demote", "device/drop", "host/delete", "host/free_duplicate", "storage/delete")
    want: dict[str, int] = {}
    for code, n in counts:
        want[keys[code]] = want.get(keys[code], 0) + n
    for module in (controller, CONTROLLER_TWIN):
        stats = module.EngineStats()
        for code, n in counts:
            stats.count_evictions(code, n)
        got = stats.evictions
        assert got == want and list(got) == list(want)  # the keys in the order first counted
        got["device/demote"] = -1  # a copy: the counts are the stats'
        assert stats.evictions == want
        assert dataclasses.asdict(copy.deepcopy(stats))["eviction_order"] == [keys.index(k) for k in want]


@pytest.mark.parametrize("code", [-1, 5, 2**64])
def test_an_unknown_eviction_code_is_refused(code):
    for module in (controller, CONTROLLER_TWIN):
        stats = module.EngineStats()
        with pytest.raises((ValueError, OverflowError)):
            stats.count_evictions(code, 1)
        assert stats.evictions == {}


@settings(max_examples=300, deadline=None)
@given(ops=_ops)
def test_the_heap_s_slots_never_shrink_and_hold_only_its_events(scheds, ops):
    """`slots` (issue 41 session 37): a pop lowers `n`, a put fills the slot past it, so the list
    only grows, to the heap's largest size; a slot at or past `n` holds the heap's `hole` (no
    callback, no argument), never an event popped. `clear` empties it."""
    for module in (deployment, DEPLOYMENT_TWIN):
        heap = module.EventHeap()
        most = 0
        for i, t in enumerate(ops):
            if t is not None:
                heap.push(t, scheds[0], len, i)
            elif len(heap):
                popped = heap.pop()
                assert not any(popped is e for e in heap.slots)
            most = max(most, len(heap))
            assert len(heap.slots) == most and heap.n == len(heap) == len(heap.items)
            live = heap.slots[:heap.n]
            assert heap.items == live and heap.items is not heap.slots
            assert heap.hole not in live
            for stale in heap.slots[heap.n:]:
                assert stale is heap.hole and (stale.fn, stale.arg) == (None, None)
        heap.clear()
        assert (heap.n, heap.slots, heap.items) == (0, [], [])
        heap.push(5, scheds[1], len, "again")
        assert heap.pop().arg == "again" and len(heap) == 0


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.one_of(_time, st.none(), st.just("untrack")), max_size=120), ranks=st.integers(1, 3))
def test_a_rank_s_clock_puts_the_events_the_closure_put(scheds, ops, ranks):
    """deployment.RankClock (a native `at`, issue 41 session 37) against what `sched.at`'s
    closure did: each event pushed on the deployment's heap with its rank's scheduler, and on
    the rank's own heap while tracked; none there once untracked. Compiled and twin alike."""
    for module in (deployment, DEPLOYMENT_TWIN):
        events = module.EventHeap()
        own = [module.EventHeap() for _ in range(ranks)]
        clocks = [module.RankClock(events, own[r], scheds[r % 2]) for r in range(ranks)]
        ref, ref_own = [], [[] for _ in range(ranks)]
        tracked, order = True, 0
        for i, t in enumerate(ops):
            r = i % ranks
            if t == "untrack":
                tracked = False
                for clock, mine, ref_mine in zip(clocks, own, ref_own):
                    clock.tracked = False
                    mine.clear()
                    ref_mine.clear()
            elif t is None:
                if ref:
                    event, want = events.pop(), heapq.heappop(ref)
                    assert (event.t_ns, event.order, event.sched, event.arg) == want
                    if tracked:
                        assert own[want[3][0]].pop() is event
                        assert heapq.heappop(ref_own[want[3][0]])[:2] == want[:2]
            else:
                order += 1
                clocks[r].at(t, len, (r, i))
                heapq.heappush(ref, (t, order, scheds[r % 2], (r, i)))
                if tracked:
                    heapq.heappush(ref_own[r], (t, order))
            assert len(events) == len(ref)
            for mine, ref_mine in zip(own, ref_own):
                assert sorted((e.t_ns, e.order) for e in mine.items) == sorted(ref_mine)


def test_the_scheduler_s_own_clock_pushes_heapq_s_tuples():
    """scheduler.OwnClock: the tuples (t_ns, order, fn, arg) Scheduler._at_own pushed, on the
    list its loop reads (`_events`), orders from 1; its controller holds the same clock."""
    engine = Engine(small_config())
    sched = engine.scheduler
    assert sched.clock is sched.ctrl.clock and sched._events is sched.clock.events
    ref = []
    for i, t in enumerate([5, 3, 5, 0, 2**62, -1]):
        sched.clock.at(t, len, i)
        heapq.heappush(ref, (t, i + 1, len, i))
    assert sched._events == ref


def test_a_clock_with_no_loop_refuses_and_a_call_clock_calls():
    from tierdiag.engine.controller import CallClock, Clock
    from tierdiag.engine.schedule_common import EngineError

    with pytest.raises(EngineError, match="no event loop"):
        Clock().at(7, len, None)
    seen = []
    CallClock(lambda t, fn, arg: seen.append((t, fn, arg))).at(2**70, len, "x")
    assert seen == [(2**70, len, "x")]


def test_a_deployment_s_ranks_take_its_clocks():
    engine = Engine(small_config(dp=3))
    dep = engine.deployment
    for rank, sched in enumerate(dep.ranks):
        clock = dep.clocks[rank]
        assert sched.clock is clock and sched.ctrl.clock is clock
        assert clock.sched is sched and clock.own is dep.own_times[rank] and clock.events is dep.events
    dep._untrack()
    assert not any(clock.tracked for clock in dep.clocks)
