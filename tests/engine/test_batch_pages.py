"""A prefill batch's shared pages (engine/miss.py, MissTracker.scheduled) from its members' key
chains (issue 41, session 36): _cplane.BatchPages (native/csrc/batch_pages.c) against its
reference miss._BatchPagesPy on any int64 keys, chained or not (the same steps, the same
answers), and both against what a set of the batch's keys counted (the engine's until session
36) on keys that chain as the engine's page keys do."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine.helpers import chained_keys
from tierdiag.engine import miss
from tierdiag.native import cplane

needs_c = pytest.mark.skipif(cplane.C is None, reason=f"_cplane: {cplane.WHY_NOT}")
_INT64 = st.integers(-(2**63), 2**63 - 1)
# keys as a hostile caller could hand them: int64's edges, repeats (small ints), anything within int64
_ANY_KEY = st.one_of(st.integers(0, 5), _INT64, st.sampled_from([-(2**63), 2**63 - 1, -1]))
_BOUND = st.integers(-5, 45)


def _sides() -> list:
    """Every implementation this process has: the reference, and the compiled one if built."""
    compiled, reference = cplane.pairs()["miss.batch_pages"]
    return [reference()] + ([compiled()] if cplane.C is not None else [])


def _as(keys: list[int], form: str):
    return array("q", keys) if form == "run" else tuple(keys) if form == "tuple" else list(keys)


def _set_count(batch: set, keys: list[int], lo: int, count_hi: int, add_hi: int) -> int:
    """What the set counted (count then add)."""
    found = sum(k in batch for k in keys[lo:count_hi])
    batch.update(keys[lo:add_hi])
    return found


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["count_add", "count_add", "add", "clear"]),
                              st.lists(_ANY_KEY, max_size=40), _BOUND, _BOUND, _BOUND,
                              st.sampled_from(["list", "tuple", "run"])), max_size=25))
def test_the_compiled_batch_pages_count_what_the_reference_counts_on_any_keys(ops):
    """Adds, count_adds and clears of any int64 keys (repeats, int64's edges, keys met at other
    pages: not chained), bounds clamped as a slice reads them (miss._span), count_hi below, at
    or past add_hi: the compiled side and the reference give the same counts and lengths, from
    a list, a tuple or a key run alike."""
    sides = _sides()
    for op, keys, lo, count_hi, add_hi, form in ops:
        n = len(keys)
        lo, count_hi = miss._span(n, lo, count_hi)
        add_hi = miss._span(n, lo, add_hi)[1]
        seq = _as(keys, form)
        if op == "count_add":
            got = {side.count_add(seq, lo, count_hi, add_hi) for side in sides}
            assert len(got) == 1 and 0 <= got.pop() <= max(count_hi - lo, 0)
        elif op == "add":
            for side in sides:
                side.add(seq, lo, add_hi)
        else:
            for side in sides:
                side.clear()
        assert len({len(side) for side in sides}) == 1


@st.composite
def _chained_batches(draw):
    """Batches of requests whose keys chain (helpers.chained_keys: shared prefixes that part,
    some long, some one page), each request with its window bounds drawn anywhere."""
    paths = draw(st.lists(st.lists(st.integers(0, 2), max_size=30), min_size=1, max_size=30))
    keys = chained_keys(paths)
    calls = []
    for k in keys:
        n = len(k)
        lo, count_hi = miss._span(n, draw(_BOUND), draw(_BOUND))
        add_hi = miss._span(n, lo, draw(_BOUND))[1]
        calls.append((draw(st.integers(0, 3)), k, lo, count_hi, add_hi, draw(st.sampled_from(["list", "run"]))))
    return calls


@settings(max_examples=300, deadline=None)
@given(calls=_chained_batches())
def test_on_chained_keys_a_batch_counts_what_a_set_of_its_keys_counted(calls):
    """The rows' fact: on keys that chain (the engine's page keys, trace/pages.py), a request's
    pages an earlier member of its batch holds are exactly those a set of the batch's keys held:
    the members' matching prefixes, found by a compare or two and halving, and their union, are
    the set's hits, whatever the windows (members starting past or before the request, chunks
    shorter than the count)."""
    sides = _sides()
    batch: set = set()
    for starts_batch, keys, lo, count_hi, add_hi, form in calls:
        if starts_batch == 0:
            batch.clear()
            for side in sides:
                side.clear()
        want = _set_count(batch, keys, lo, count_hi, add_hi)
        seq = _as(keys, form)
        assert [side.count_add(seq, lo, count_hi, add_hi) for side in sides] == [want] * len(sides)


def test_members_matching_over_one_another_are_counted_once():
    """Two members covering the same pages of a request, one from before its window and one
    from inside it, and a third parting from it early: the union, each page once."""
    a, b, c, d = chained_keys([[0] * 10, [0] * 8 + [1, 1], [0, 0, 1], [0] * 10])
    for side in _sides():
        side.add(a, 0, 6)      # pages 0..5
        assert side.count_add(b, 3, 10, 10) == 3  # b's pages 3..9: a holds 3..5 (b parts from it at 8)
        side.add(c, 1, 3)      # c parts at page 2
        assert side.count_add(d, 0, 10, 10) == 8  # 0..5 (a), 3..7 (b): 0..7
        assert len(side) == 6 + 7 + 2 + 10


@needs_c
def test_the_compiled_batch_pages_grow_past_their_first_room_and_clear():
    """Past the first room (1,024 keys, 16 members) the windows and the members grow with their
    keys intact; a clear forgets them all at once, many times over."""
    bp = cplane.C.BatchPages()
    keys = chained_keys([[0] * 3000, [0] * 2000 + [1] * 1000])
    assert bp.count_add(array("q", keys[0]), 0, 3000, 3000) == 0 and len(bp) == 3000
    for i in range(40):  # members past the first room, each a window of its own
        bp.add(keys[1], 2000 + i * 10, 2000 + i * 10 + 5)
    assert bp.count_add(keys[1], 0, 3000, 0) == 2000 + 40 * 5
    for round_ in range(2000):
        bp.clear()
        bp.add(keys[0], round_ % 50, round_ % 50 + 3)
        assert len(bp) == 3 and bp.count_add(keys[1], 0, 3000, 0) == 3
    bp.clear()
    assert len(bp) == 0 and bp.count_add(keys[0], 0, 3000, 0) == 0


@needs_c
@pytest.mark.parametrize("keys", [[2**63], [-(2**63) - 1], [1.0], [True], ["k"], [None], [1, 2**64]],
                         ids=repr)
def test_the_compiled_batch_pages_refuse_keys_past_int64_unchanged(keys):
    """Keys that are not ints within int64 (the engine's never are): TypeError naming the call,
    the members unchanged."""
    bp = cplane.C.BatchPages()
    bp.add([1, 2, 3], 0, 3)
    for call in (lambda: bp.add(keys, 0, len(keys)), lambda: bp.count_add(keys, 0, len(keys), len(keys))):
        with pytest.raises(TypeError, match="BatchPages"):
            call()
    assert len(bp) == 3 and bp.count_add([1, 2, 3], 0, 3, 0) == 3


@needs_c
def test_the_compiled_batch_pages_refuse_what_miss_never_passes():
    """Bounds outside 0..len(keys), a non-int bound, keys of another item type or shape, the
    wrong arity: an error naming the call, the members unchanged."""
    import numpy as np

    bp = cplane.C.BatchPages()
    bp.add(array("q", [1, 2, 3]), 0, 3)
    run = array("q", [1, 2, 3])
    for args, exc in (((run, -1, 1, 1), ValueError), ((run, 0, 4, 1), ValueError), ((run, 0, 1, 4), ValueError),
                      ((run, 0, 1, "1"), TypeError), ((run, 0, 1, 2**70), OverflowError), ((run, 0, 1), TypeError),
                      ((array("i", [1]), 0, 1, 1), TypeError), ((array("d", [1.0]), 0, 1, 1), TypeError),
                      ((np.ones((1, 1), dtype=np.int64), 0, 1, 1), TypeError), (({1}, 0, 1, 1), TypeError),
                      ((range(3), 0, 1, 1), TypeError), ((b"\x01" * 8, 0, 1, 1), TypeError)):
        with pytest.raises(exc):
            bp.count_add(*args)
    for args, exc in (((run, -1, 1), ValueError), ((run, 0, 4), ValueError), ((run, 0, "1"), TypeError),
                      ((run, 0, 2**70), OverflowError), ((run, 0), TypeError), ((array("i", [1]), 0, 1), TypeError),
                      ((np.ones(1, dtype=np.float64), 0, 1), TypeError), ((range(3), 0, 1), TypeError)):
        with pytest.raises(exc):
            bp.add(*args)
    assert len(bp) == 3 and bp.count_add(run, 0, 3, 0) == 3
    with pytest.raises(TypeError):
        cplane.C.BatchPages(1)


class _Int(int):
    """An int subclass (the engine's keys never are one)."""


_EDGE_INTS = sorted({s * m + d for m in (0, 1, 2**30, 2**60, 2**62, 2**63) for s in (1, -1) for d in (-1, 0, 1)
                     if -(2**63) <= s * m + d < 2**63})


@needs_c
@pytest.mark.parametrize("v", _EDGE_INTS)
def test_the_compiled_batch_pages_read_every_int64_at_its_value(v):
    """cplane.h's cp_small_int on the edges of its fast path (one 30-bit digit, two, three,
    int64's ends, read by the call): a key in a list is the int64 it names, told from its
    neighbours, as in a key run; an int subclass of the same value is refused."""
    for w in (v - 1, v, v + 1):
        if -(2**63) <= w < 2**63:
            for keys in ([v], (v,), array("q", [v])):
                bp = cplane.C.BatchPages()
                bp.add(keys, 0, 1)
                assert bp.count_add([w], 0, 1, 0) == bp.count_add(array("q", [w]), 0, 1, 0) == (w == v)
    with pytest.raises(TypeError, match="BatchPages"):
        cplane.C.BatchPages().add([_Int(v)], 0, 1)
