"""The compiled storage index (_cplane.StorageIndex) against its reference (storage._LruIndex) on
hostile key streams (issue 41, session 39, h49ix): keys whose table homes collide (a home is the
top bits of the key's tag, the int64 value times the golden ratio), keys whose whole 32-bit tags
collide, int64's extremes, -1 and -2 (whose hashes are equal), ints past 64 bits, bytes and str
mixed in; writes handed as int64 runs (the engine's: the key run's own admit loop) and as lists,
counted or not, into small tables that grow and rehash while keys are deleted by backward shift.
Every answer and the state after every step are the reference's."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierdiag.engine.storage import _SLOT_BITS, _LruIndex
from tierdiag.native import cplane

pytestmark = pytest.mark.skipif(cplane.C is None, reason=f"_cplane: {cplane.WHY_NOT}")

_K = 0x9E3779B97F4A7C15  # storage_index.c's IX_TAG multiplier
_K_INV = pow(_K, -1, 2**64)


def _int64(u: int) -> int:
    u &= 2**64 - 1
    return u - 2**64 if u >= 2**63 else u


def sharing_top_bits(bits: int, top: int, low: int) -> int:
    """An int64 key whose hash times _K (mod 2**64) has `top` as its top `bits` bits: keys made
    with one `top` share their home in every table of up to 2**bits slots (bits 32: their whole
    tag). The hash of an int64 key is its value (-1 made -2: never made here)."""
    v = _int64((((top << (64 - bits)) | (low & ((1 << (64 - bits)) - 1))) * _K_INV))
    return v if v != -1 else 0


def home(key: int, slots: int) -> int:
    """storage_index.c's home slot of int64 key `key` in a table of `slots` slots."""
    h = -2 if key == -1 else key
    return ((h * _K) % 2**64) >> (64 - (slots.bit_length() - 1))


def test_keys_made_to_share_top_bits_share_their_home():
    """(The strategy below does make colliding homes: the twin of the C home agrees.)"""
    keys = [sharing_top_bits(8, 0x5A, low) for low in range(1, 40, 3)]
    for slots in (16, 32, 64, 128, 256):
        assert len({home(k, slots) for k in keys}) == 1
    tags = {((k * _K) % 2**64) >> 32 for k in (sharing_top_bits(32, 7, low) for low in range(1, 9))}
    assert len(tags) == 1


int64_keys = st.one_of(
    st.builds(sharing_top_bits, st.just(8), st.sampled_from([0, 1, 2, 3, 128, 255]), st.integers(0, 2**56 - 1)),
    st.builds(sharing_top_bits, st.just(32), st.integers(0, 1), st.integers(0, 2**32 - 1)),
    st.sampled_from([-2**63, -2**63 + 1, 2**63 - 1, 2**63 - 2, -2, -1, 0, 1, 2**61 - 1, 2**61, -2**61]),
    st.integers(0, 30),  # a run of consecutive ints, as a hash_ids trace's pages
)
other_keys = st.one_of(
    st.integers(2**63, 2**70), st.integers(-2**70, -2**63 - 1),
    st.binary(max_size=3), st.text(max_size=2),
)


def _run(keys):
    return array("q", keys)


def _is_int64(k) -> bool:
    return type(k) is int and -2**63 <= k < 2**63


# an operation on a key pool: ("admit", positions, as a run, counted), ("read", positions),
# ("drop", positions), ("hits", positions, start)
steps = st.lists(st.one_of(
    st.tuples(st.just("admit"), st.lists(st.integers(0, 39), max_size=24), st.booleans(), st.booleans()),
    st.tuples(st.just("read"), st.lists(st.integers(0, 39), max_size=10)),
    st.tuples(st.just("drop"), st.lists(st.integers(0, 39), max_size=10)),
    st.tuples(st.just("hits"), st.lists(st.integers(0, 39), max_size=10), st.integers(0, 4)),
), max_size=40)


@settings(max_examples=300, deadline=None)
@given(capacity=st.integers(0, 30), reserve=st.sampled_from([0, 3, 40]),
       ints=st.lists(int64_keys, min_size=1, max_size=40, unique=True),
       others=st.lists(other_keys, max_size=6, unique=True), steps=steps)
def test_hostile_key_streams_answer_as_the_reference(capacity, reserve, ints, others, steps):
    """Every admit (deleted, fresh, emptied), place, hit run, location run, touch and dropped
    placeholder, then the LRU order, length and live counts after each step, are the
    reference's: int64 keys that collide in home or tag, at int64's ends, -1 beside -2, in runs
    and lists, with key objects mixed in (which leave the run loop for the generic one), at
    capacities from 0 (an admit that must delete from an empty index: the same KeyError)."""
    pool = ints + [k for k in others if not _is_int64(k)]
    a, b = cplane.C.StorageIndex(reserve), _LruIndex(reserve)
    end = 0
    for step in steps:
        keys = [pool[i % len(pool)] for i in step[1]]
        if step[0] == "admit":
            as_run, counted = step[2], step[3]
            if as_run:
                keys = [k for k in keys if _is_int64(k)]
            got, want = _both(lambda ix: ix.admit(_run(keys) if as_run else list(keys), capacity, counted), a, b)
            assert got == want, (keys, capacity)
            if want[0] == "answer":
                placed = keys if want[1][1] is None else [keys[i] for i in want[1][1]]
                for ix in (a, b):
                    ix.place(list(placed), 1 + end % 3, end)
                end += len(placed)
        elif step[0] == "read":
            held = [k for k in keys if k in b]
            assert [k in a for k in keys] == [k in b for k in keys]
            assert a.loc_runs(list(held)) == b.loc_runs(held)
            a.touch_all(list(held))
            b.touch_all(held)
        elif step[0] == "drop":
            a.drop_placeholders(list(keys))
            b.drop_placeholders(keys)
        else:
            ints_only = [k for k in keys if _is_int64(k)]
            assert a.run(_run(ints_only), step[2]) == b.run(ints_only, step[2])
            assert a.run(list(keys), step[2]) == b.run(keys, step[2])
        assert a.keys() == b.keys() and len(a) == len(b)
        assert a.locs(a.keys()) == b.locs(b.keys())
        assert [a.live(s) for s in (1, 2, 3)] == [b.live(s) for s in (1, 2, 3)]
        assert all(loc == -1 or 1 <= loc >> _SLOT_BITS <= 3 for loc in a.locs(a.keys()))


def _both(call, a, b):
    """call(a), call(b): each ("answer", its answer) or ("raised", its error's type and message)."""
    out = []
    for ix in (a, b):
        try:
            out.append(("answer", call(ix)))
        except Exception as e:  # noqa: BLE001 -- compared, not swallowed: both must raise alike
            out.append(("raised", type(e), str(e)))
    return out


@settings(max_examples=60, deadline=None)
@given(top=st.integers(0, 255), n=st.integers(1, 200), capacity=st.integers(1, 120), rounds=st.integers(1, 4))
def test_a_run_of_keys_all_sharing_one_home_answers_as_the_reference(top, n, capacity, rounds):
    """The worst table: every key of the run homes to one slot (tables of up to 256 slots), so
    each probe walks one cluster and each deletion's backward shift moves the whole of it. Writes
    that overlap (half of each write named again by the next) as runs: the same answers, the
    same LRU order."""
    keys = [sharing_top_bits(8, top, low * 2**40 + 1) for low in range(n)]
    a, b = cplane.C.StorageIndex(), _LruIndex()
    for r in range(rounds):
        for i in range(0, n, 16):
            w = keys[i:i + 16] + keys[max(0, i - 8):i]
            assert a.admit(_run(w), capacity, r % 2 == 0) == b.admit(w, capacity, r % 2 == 0)
            assert a.keys() == b.keys()
        assert a.run(_run(keys), 0) == b.run(keys, 0)


@pytest.mark.parametrize("as_run", [True, False])
def test_a_deletion_shifts_a_displaced_key_back_to_its_home(as_run):
    """Two keys of one home (the second one slot past it) and a write of a key homed elsewhere
    into a full index of capacity 2: the oldest goes, and the second must move back into the
    emptied home slot (a probe stops at an empty slot: left where it was, it would be lost)."""
    a1, a2 = sharing_top_bits(8, 1, 11), sharing_top_bits(8, 1, 12)
    c = sharing_top_bits(8, 200, 13)
    a, b = cplane.C.StorageIndex(40), _LruIndex()
    seq = _run if as_run else list
    for w in ([a1, a2], [c]):
        assert a.admit(seq(w), 2, True) == b.admit(w, 2, True)
    assert a.keys() == b.keys() == [a2, c]
    assert a2 in a and a.run(seq([a2, c]), 0) == 2
    assert a.locs(seq([a2, c])) == [-1, -1]


@settings(max_examples=300, deadline=None)
@given(capacity=st.integers(0, 12), reserve=st.sampled_from([0, 8, 40]),
       groups=st.lists(st.tuples(st.integers(0, 255), st.integers(1, 4)), min_size=1, max_size=4),
       writes=st.lists(st.tuples(st.lists(st.integers(0, 15), max_size=12), st.booleans()), max_size=12))
def test_int64_runs_of_few_homes_answer_as_the_reference(capacity, reserve, groups, writes):
    """The engine's case only (int64 key runs into an index of int64 keys: the run loop with its
    inlined deletions), the keys in a few groups sharing a home, so that nearly every deletion
    shifts displaced keys back and nearly every probe walks a cluster: after each write, the
    answers, every key's location found, the hit run and the LRU order are the reference's."""
    keys = [sharing_top_bits(8, top, low * 7919 + 1) for top, size in groups for low in range(size)]
    a, b = cplane.C.StorageIndex(reserve), _LruIndex()
    for positions, counted in writes:
        w = [keys[p % len(keys)] for p in positions]
        got, want = _both(lambda ix: ix.admit(_run(w) if ix is a else w, capacity, counted), a, b)
        assert got == want, w
        assert a.keys() == b.keys() and a.locs(_run(a.keys())) == b.locs(b.keys())
        assert a.run(_run(keys), 0) == b.run(keys, 0)
