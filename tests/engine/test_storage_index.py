"""The storage tier's index: the compiled one (_cplane.StorageIndex) against the reference
(storage._LruIndex) on the same operations, step by step: the same keys deleted in the same
order, the same positions to write, the same segments emptied, the same locations, live counts
and LRU order. Then a narrated write sequence through both, and the errors both raise."""

from __future__ import annotations

from array import array

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierdiag.engine import storage
from tierdiag.native import cplane
from tierdiag.engine.storage import _SLOT_BITS, _LruIndex

compiled = pytest.mark.skipif(cplane.C is None, reason=f"_cplane: {cplane.WHY_NOT}")
INDEXES = [pytest.param(_LruIndex, id="python"),
           pytest.param(lambda: cplane.C.StorageIndex(), id="c", marks=compiled)]


def digest(i: int) -> int:
    """A page key as the tier sees it: an int (consecutive ones, as a hash_ids trace's pages
    are, and negative ones, as output pages are)."""
    return i - 20


# A write's keys: any keys (repeats are rare among 41), or a few keys named again and again in
# one write (a key can be pushed out by the write's own pages and entered again before its end).
write_keys = st.one_of(
    st.lists(st.integers(0, 40), max_size=14),
    st.lists(st.integers(0, 40), min_size=1, max_size=6, unique=True).flatmap(
        lambda ks: st.lists(st.sampled_from(ks), min_size=len(ks), max_size=3 * len(ks) + 2)),
)

# An operation: ("write", keys, segment) enters the keys and places the fresh ones at the end
# of `segment` (as StorageTier._write does, one segment a write); ("read", keys) looks up and
# touches keys the index holds; ("compact", segment) moves a segment's live pages to a new one.
ops = st.lists(st.one_of(
    st.tuples(st.just("write"), write_keys, st.integers(1, 6)),
    st.tuples(st.just("read"), st.lists(st.integers(0, 40), max_size=6)),
    st.tuples(st.just("compact"), st.integers(1, 6)),
), max_size=60)


def apply(index, capacity: int, steps, ends: dict[int, int], seq=list) -> list:
    """Run `steps` on `index`, returning everything it answered, in order. `seq` makes the keys
    each call is handed: a list, or `run` (an int64 key run, as the engine's storage paths hand
    a node's or a request's keys)."""
    seen = []
    for step in steps:
        if step[0] == "write":
            keys = [digest(k) for k in step[1]]
            deleted, fresh, emptied = index.admit(seq(keys), capacity)
            placed = keys if fresh is None else [keys[i] for i in fresh]
            # each page to write is a placeholder, named once: a page is written and counted once
            assert len(set(placed)) == len(placed) and all(loc == -1 for loc in index.locs(seq(placed)))
            seg = step[2]
            index.place(seq(placed), seg, ends.get(seg, 0))
            ends[seg] = ends.get(seg, 0) + len(placed)
            seen.append(("write", deleted, fresh, emptied))
        elif step[0] == "read":
            keys = [digest(k) for k in step[1] if digest(k) in index]
            locs = index.locs(seq(keys))
            runs = index.loc_runs(seq(keys))
            seen.append(("read", locs, runs))
            # the runs are the locations, split where one is not the one before + 1 in its segment
            assert sum(runs[1::2]) == len(keys)
            assert [f + i for f, c in zip(runs[::2], runs[1::2]) for i in range(c)] == locs
            assert all(a + c != b or a >> _SLOT_BITS != b >> _SLOT_BITS
                       for a, c, b in zip(runs[0:-2:2], runs[1:-2:2], runs[2::2]))
            index.touch_all(seq(keys))
        else:
            slots, keys = index.segment_keys(step[1])
            index.place(keys, 100 + step[1], 0)
            index.clear_live(step[1])
            seen.append(("compact", slots, keys))
        segments = (*range(7), *range(100, 107))
        live = [index.live(s) for s in segments]
        # a segment's live count is the pages located there (too high, a segment never empties
        # and its compaction finds no page to move)
        locs = [loc >> _SLOT_BITS for loc in index.locs(index.keys()) if loc >= 0]
        assert live == [locs.count(s) for s in segments], f"live counts after {step}"
        seen.append(("state", len(index), index.keys(), live))
    return seen


@compiled
@settings(max_examples=400, deadline=None)
@given(capacity=st.integers(1, 24), steps=ops)
def test_the_compiled_index_answers_as_the_reference_does(capacity, steps):
    """Repeated keys within a write (some pushed out by the write's own pages and entered again),
    a write longer than the capacity, reads, compactions: every answer and the state after every
    step are the same, and each index's live counts are its pages' locations."""
    assert apply(cplane.C.StorageIndex(), capacity, steps, {}) == apply(_LruIndex(), capacity, steps, {})


_M61 = 2**61 - 1  # an int's hash is its value modulo this prime: k and k + _M61 hash alike

# Key values as the engine's are (hashes of up to 63 bits), around the edges of the in-place read
# (2**63 - 1, -2**63, three digits whose top is 8) and past it (64 bits and more), negative ones,
# and pairs whose hashes are equal but values are not (k, k + 2**61 - 1).
big_values = st.one_of(
    st.integers(-2**63, 2**63 - 1),
    st.integers(0, 40).map(lambda k: 2**63 - 1 - k),
    st.integers(0, 40).map(lambda k: -2**63 + k),
    st.integers(0, 40).map(lambda k: (8 << 60) + k - 20),
    st.integers(2**63, 2**70),
    st.integers(-2**70, -2**63 - 1),
    st.integers(0, 40).map(lambda k: 1_000_003 + k * _M61),
    # the compiled index hashes ints of up to 63 bits itself (Python's rule: modulo 2**61 - 1,
    # the sign kept, -1 made -2): the modulus's edges, -1 and -2 (whose hashes are equal)
    st.sampled_from([-2, -1, 0, 1, _M61 - 1, _M61, _M61 + 1, 2 * _M61, 2 * _M61 + 1, 3 * _M61 + 2,
                     -_M61 + 1, -_M61, -_M61 - 1, -2 * _M61, 2**62, -2**62, 2**63 - 2, -2**63 + 1]),
)


def big_values_64():
    """big_values within int64 (what a key run holds)."""
    return big_values.filter(lambda v: -2**63 <= v < 2**63)


def fresh_int(v: int) -> int:
    """`v` as a new int object (never a cached small int or an object another key shares): the
    compiled index then compares two objects of one value, as it does for a request's page
    keys, each request's list made anew."""
    return int(str(v))


def run(keys) -> array:
    """Keys as an int64 key run (tree_node.KeyRun: a node's or a request's page keys)."""
    return array("q", keys)


@pytest.mark.parametrize("make", INDEXES)
@settings(max_examples=300, deadline=None)
@given(capacity=st.integers(1, 24), steps=ops)
def test_an_index_handed_key_runs_answers_as_the_reference_handed_lists(make, capacity, steps):
    """The engine hands the index a node's or a request's keys as they are, an array('q') run
    (controller._write_storage, prefetch.py's queries and reads), where before they were made a
    list of ints a write (issue 41's storage row, h41stor8): admit, place, locs, touch_all on
    runs give every answer and state the reference gives on lists, for both indexes."""
    assert apply(make(), capacity, steps, {}, run) == apply(_LruIndex(), capacity, steps, {})


@compiled
@settings(max_examples=300, deadline=None)
@given(capacity=st.integers(1, 12), pool=st.lists(st.integers(-2**63, 2**63 - 1) | big_values_64(),
                                                  min_size=1, max_size=12, unique=True),
       writes=st.lists(st.tuples(st.lists(st.integers(0, 11), max_size=10), st.booleans()), max_size=12),
       probes=st.lists(st.integers(0, 11), max_size=12), start=st.integers(0, 13))
def test_the_compiled_index_finds_a_runs_keys_by_value(capacity, pool, writes, probes, start):
    """A run's int64 values hash as their ints do (modulo 2**61 - 1, the sign kept, -1 made -2)
    and are compared by value with the int objects the index holds, whichever way they were
    entered (a list or a run, writes of both mixed): every admit, hit run, location and the LRU
    order are the reference's, and a value that hashes like a key held but is not one is absent."""
    a, b = cplane.C.StorageIndex(), _LruIndex()
    for w, as_run in writes:
        keys = [pool[i % len(pool)] for i in w]
        got = a.admit(run(keys) if as_run else [fresh_int(k) for k in keys], capacity)
        assert got == b.admit(keys, capacity), keys
        placed = keys if got[1] is None else [keys[i] for i in got[1]]
        a.place(run(placed) if as_run else [fresh_int(k) for k in placed], 1, 0)
        b.place(placed, 1, 0)
    ks = [pool[i % len(pool)] for i in probes]
    assert a.run(run(ks), start) == b.run(ks, start) == a.run(ks, start)
    held = [k for k in ks if k in b]
    assert a.locs(run(held)) == b.locs(held)
    a.touch_all(run(held))
    b.touch_all(held)
    assert a.keys() == b.keys() and a.locs(a.keys()) == b.locs(b.keys())
    absent = [k + _M61 for k in a.keys() if -2**63 <= k + _M61 < 2**63 and k + _M61 not in b]
    assert a.run(run(absent), 0) == 0 or not absent
    a.drop_placeholders(run(ks))
    b.drop_placeholders(ks)
    assert a.keys() == b.keys()


# Keys handed as neither a list nor a native int64 run: another item type or size, another byte
# order, more than one dimension, a strided view, a tuple, a scalar, text, None.
not_keys = st.sampled_from([
    array("i", [1, 2]), array("d", [1.0]), array("Q", [1]), array("b", [1]), b"\1\2", bytearray(8), "12", None, 7,
    (1, 2), np.arange(4, dtype=np.int32), np.arange(4, dtype=">i8"), np.arange(6, dtype=np.int64).reshape(2, 3),
    np.arange(8, dtype=np.int64)[::2], np.float64(1.5), {1: 2}, "\u00e9\x00",
])


@compiled
@settings(max_examples=60, deadline=None)
@given(bad=not_keys, method=st.sampled_from(["admit", "place", "locs", "loc_runs", "touch_all", "run",
                                             "drop_placeholders"]))
def test_the_compiled_index_refuses_keys_that_are_neither_a_list_nor_an_int64_run(bad, method):
    """One TypeError naming what it takes, and the index as it was."""
    ix = cplane.C.StorageIndex()
    ix.admit(run([5, 6]), 4)
    ix.place([5, 6], 1, 0)
    call = {"admit": lambda: ix.admit(bad, 4), "place": lambda: ix.place(bad, 1, 2),
            "locs": lambda: ix.locs(bad), "loc_runs": lambda: ix.loc_runs(bad), "touch_all": lambda: ix.touch_all(bad),
            "run": lambda: ix.run(bad, 0),
            "drop_placeholders": lambda: ix.drop_placeholders(bad)}[method]
    with pytest.raises(TypeError, match=r"keys must be a list or a run of int64 \(array\('q'\)\)"):
        call()
    assert ix.keys() == [5, 6] and ix.locs([5, 6]) == [1 << _SLOT_BITS, (1 << _SLOT_BITS) + 1]


@compiled
def test_a_runs_absent_key_is_a_key_error_naming_its_value():
    ix = cplane.C.StorageIndex()
    ix.admit(run([1, 2]), 4)
    with pytest.raises(KeyError, match="-9223372036854775808"):
        ix.locs(run([1, -2**63]))
    with pytest.raises(KeyError, match="77"):
        ix.touch_all(run([77]))
    with pytest.raises(KeyError, match="78"):
        ix.loc_runs(run([1, 2, 78]))
    with pytest.raises(KeyError, match="9"):
        ix.place(run([9]), 1, 0)
    assert ix.keys() == [1, 2] and ix.run(np.array([1, 2, 3], dtype=np.int64), 0) == 2


@pytest.mark.parametrize("make", INDEXES)
@settings(max_examples=200, deadline=None)
@given(capacity=st.integers(1, 24), steps=ops)
def test_a_counted_admit_counts_the_deletions_and_changes_the_index_alike(make, capacity, steps):
    """admit(keys, capacity, True), as the engine's storage writes call it (StorageTier.write_from:
    the controller only counts the deletions): the count of the keys the listing call deletes, the
    same positions to write and segments emptied, and the same index after (keys in LRU order,
    locations), the compiled index making no list of the deleted keys (issue 41, h41stor3)."""
    listed, counted = make(), make()
    ends: dict[int, int] = {}
    for step in steps:
        if step[0] != "write":
            continue
        keys = [digest(k) for k in step[1]]
        deleted, fresh, emptied = listed.admit(keys, capacity)
        n, fresh2, emptied2 = counted.admit(keys, capacity, True)
        assert type(n) is int and n == len(deleted) and fresh2 == fresh and emptied2 == emptied, step
        placed = keys if fresh is None else [keys[i] for i in fresh]
        for ix in (listed, counted):
            ix.place(placed, step[2], ends.get(step[2], 0))
        ends[step[2]] = ends.get(step[2], 0) + len(placed)
        assert counted.keys() == listed.keys() and counted.locs(counted.keys()) == listed.locs(listed.keys())
    assert listed.admit([], capacity, False)[0] == [] and counted.admit([], capacity, True)[0] == 0


@compiled
@settings(max_examples=300, deadline=None)
@given(capacity=st.integers(1, 12), pool=st.lists(big_values, min_size=1, max_size=12, unique=True),
       writes=st.lists(st.lists(st.integers(0, 11), max_size=10), max_size=12),
       probes=st.lists(st.integers(0, 11), max_size=12))
def test_the_compiled_index_compares_int_keys_by_value(capacity, pool, writes, probes):
    """Equal ints as distinct objects are the same key and unequal ints of equal hashes are not,
    inside the in-place read's range (63 bits: compared as int64) and past it (the generic
    compare): every admit, membership, hit run and the LRU order are the reference's."""
    a, b = cplane.C.StorageIndex(), _LruIndex()
    for w in writes:
        keys = [pool[i % len(pool)] for i in w]
        got = a.admit([fresh_int(k) for k in keys], capacity)
        assert got == b.admit([fresh_int(k) for k in keys], capacity), keys
        placed = keys if got[1] is None else [keys[i] for i in got[1]]
        for ix in (a, b):
            ix.place([fresh_int(k) for k in placed], 1, 0)
    ks = [fresh_int(pool[i % len(pool)]) for i in probes]
    assert [k in a for k in ks] == [k in b for k in ks]
    assert a.run(ks, 0) == b.run(ks, 0)
    assert a.keys() == b.keys() and a.locs(a.keys()) == b.locs(b.keys())
    # a value that hashes like a key held but is not one is absent
    absent = [fresh_int(k + _M61) for k in a.keys() if k + _M61 not in b]
    assert not any(k in a for k in absent)


@compiled
def test_the_compiled_admit_takes_two_or_three_arguments():
    ix = cplane.C.StorageIndex()
    with pytest.raises(TypeError, match="2 or 3 arguments"):
        ix.admit([1], 4, True, 0)
    with pytest.raises(TypeError, match="2 or 3 arguments"):
        ix.admit([1])
    assert len(ix) == 0


@compiled
@settings(max_examples=200, deadline=None)
@given(present=st.lists(st.integers(0, 30), max_size=20), keys=st.lists(st.integers(0, 30), max_size=20),
       start=st.integers(0, 22))
def test_the_compiled_hit_run_is_the_references(present, keys, start):
    """run(keys, start): the prefetch's consecutive hits past the device/host match."""
    a, b = cplane.C.StorageIndex(), _LruIndex()
    for ix in (a, b):
        ix.admit([digest(k) for k in dict.fromkeys(present)], 100)
    ks = [digest(k) for k in keys]
    assert a.run(ks, start) == b.run(ks, start)
    for ix in (a, b):
        with pytest.raises(ValueError):
            ix.run(ks, -1)


@pytest.mark.parametrize("make", INDEXES)
def test_a_write_sequence_step_by_step(make):
    """Capacity 4, segment 1 then 2: the oldest go first, a touched page stays, a hole empties
    segment 1 only when its last live page goes."""
    ix = make()
    a, b, c, d, e, f = (digest(i) for i in range(6))
    assert ix.admit([a, b, c], 4) == ([], None, [])  # all new: every position is written
    ix.place([a, b, c], 1, 0)
    assert [ix.live(1), len(ix)] == [3, 3] and ix.locs([a, c]) == [1 << _SLOT_BITS, (1 << _SLOT_BITS) + 2]
    ix.touch(a)  # LRU now b c a
    deleted, fresh, emptied = ix.admit([d, e], 4)  # 5 pages for 4 places: b goes
    assert (deleted, fresh, emptied) == ([b], None, [])
    ix.place([d, e], 2, 0)
    assert ix.keys() == [c, a, d, e] and [ix.live(1), ix.live(2)] == [2, 2]
    assert ix.segment_keys(1) == ([0, 2], [a, c])  # slot order, not LRU order
    deleted, fresh, emptied = ix.admit([d, f], 4)  # d there: touched, not written; c goes
    assert (deleted, fresh, emptied) == ([c], [1], [])
    ix.place([f], 2, 2)
    deleted, fresh, emptied = ix.admit([b, c], 4)  # a and e go: segment 1's last live page
    assert (deleted, fresh, emptied) == ([a, e], None, [1])
    assert ix.keys() == [d, f, b, c] and ix.locs([b]) == [-1]  # placeholders until placed
    ix.drop_placeholders([b, c])  # the write failed: the pages are not in the tier
    assert ix.keys() == [d, f] and b not in ix and ix.live(1) == 0


@pytest.mark.parametrize("make", INDEXES)
def test_a_key_named_twice_in_one_write_is_one_page(make):
    """A write is its keys entered one at a time: a key named again while it is there is touched
    (not written again); one pushed out in between by the write's own pages is entered anew and
    written from that later position. Either way one page to write, counted live once."""
    ix = make()
    a, b, c, d, e = (digest(i) for i in range(5))
    assert ix.admit([a, b, a], 4) == ([], [0, 1], [])  # a's second naming touches it: LRU b a
    ix.place([a, b], 1, 0)
    assert ix.keys() == [b, a] and ix.live(1) == 2
    # capacity 2: c, d push out b and a (segment 1 empties), e pushes out c, then c is entered
    # anew and pushes out d: the pages to write are e's and c's, c's from position 3 (not 0)
    assert ix.admit([c, d, e, c], 2) == ([b, a, c, d], [2, 3], [1])
    ix.place([e, c], 2, 0)
    assert ix.keys() == [e, c] and [ix.live(1), ix.live(2)] == [0, 2]
    assert ix.segment_keys(2) == ([0, 1], [e, c])
    assert ix.admit([a, b], 2) == ([e, c], None, [2])  # both pages go: segment 2 empties


@pytest.mark.parametrize("make", INDEXES)
def test_errors_are_the_dicts(make):
    ix = make()
    ix.admit([digest(1)], 2)
    with pytest.raises(KeyError):
        ix.touch(digest(2))
    with pytest.raises(KeyError):
        ix.locs([digest(1), digest(2)])
    with pytest.raises(KeyError):
        ix.admit([digest(2)], 0)  # no room at all: the dict's "popitem(): dictionary is empty"


@compiled
def test_the_compiled_index_takes_int_bytes_and_str_keys_only():
    """Comparing exact ints, bytes or str never runs Python code, so no key's __eq__ can change
    the index in the middle of a call; the tier's keys are page keys (ints), any int included."""
    ix = cplane.C.StorageIndex()
    ix.admit(["00" * 32, b"\1" * 32, 7, 2**70, -(2**63)], 8)
    assert "00" * 32 in ix and b"\1" * 32 in ix and 7 in ix and 2**70 in ix and -(2**63) in ix
    assert b"\0" * 32 not in ix and "7" not in ix and 8 not in ix and 2**70 + 1 not in ix
    for bad in (3.0, True, __import__("numpy").int64(7)):
        with pytest.raises(TypeError, match="int, bytes or str"):
            ix.admit([8, bad], 8)
    assert len(ix) == 5  # nothing entered: every key is checked first


@compiled
def test_the_compiled_index_finds_runs_of_consecutive_keys():
    """A hash_ids trace's page keys come in runs of consecutive ints (hash id x pages a block +
    page): every one found, absent neighbours not, after deletions shuffled the table."""
    ix, ref = cplane.C.StorageIndex(), _LruIndex()
    keys = [b * 64 + j for b in range(0, 400, 3) for j in range(16)]
    for index in (ix, ref):
        index.admit(keys, len(keys) // 2)  # the older half deleted
    assert ix.keys() == ref.keys()
    probe = list(range(-5, 400 * 64))
    assert [k in ix for k in probe] == [k in ref for k in probe]
    assert ix.run(keys, len(keys) // 2) == ref.run(keys, len(keys) // 2) == len(keys) - len(keys) // 2


def test_the_tier_uses_the_compiled_index_when_it_is_built(tmp_path):
    tier = storage.StorageTier(tmp_path / "st", 4)
    assert isinstance(tier._index, _LruIndex if cplane.C is None else cplane.C.StorageIndex)


@compiled
def test_a_tier_sized_index_answers_as_the_reference_does():
    """Past 2 MiB of table and entries (the arrays the compiled index maps with huge pages, grown
    and rehashed several times over) and through ~170k deletions, each prefetching the next
    victims' table slot and entry: every write's deletions, positions and emptied segments, then
    the LRU order and locations, are the reference's (issue 41, h41stor5)."""
    a, b = cplane.C.StorageIndex(), _LruIndex()
    capacity, ends = 150_000, [0, 0, 0]
    for w in range(3_200):
        # 100 new keys a write (runs of consecutive ints, as a hash_ids trace's pages), every
        # 7th write naming 30 keys of an earlier one again (touched, or entered anew if gone)
        keys = list(range(w * 1_000, w * 1_000 + 100))
        if w % 7 == 6:
            keys[:30] = range((w // 2) * 1_000, (w // 2) * 1_000 + 30)
        got = a.admit(keys, capacity, True)
        assert got == b.admit(keys, capacity, True), w
        placed = keys if got[1] is None else [keys[i] for i in got[1]]
        seg = 1 + w % 3
        for ix in (a, b):
            ix.place(placed, seg, ends[seg - 1])
        ends[seg - 1] += len(placed)
    assert len(a) == len(b) == capacity
    assert a.keys() == b.keys() and a.locs(a.keys()) == b.locs(b.keys())
    assert [a.live(s) for s in (1, 2, 3)] == [b.live(s) for s in (1, 2, 3)]
    probe = list(range(0, 3_200_000, 997))
    assert [k in a for k in probe] == [k in b for k in probe]


@compiled
@settings(max_examples=40, deadline=None)
@given(capacity=st.integers(1, 300),
       writes=st.lists(st.tuples(st.lists(st.integers(0, 399), max_size=120), st.booleans()), max_size=8))
def test_the_compiled_index_holds_int64_keys_as_values_and_others_as_objects(capacity, writes):
    """The compiled index holds an int64 key as its value and any other key (an int past 64 bits,
    bytes, str) as its object, in a side array made at the first such key and grown with the
    entries (past their first 64); a freed entry is reused by either kind. Writes of both kinds
    mixed, as lists and as runs, give the reference's answers and the same keys back."""
    def key(i: int):
        return (i - 200, 2**70 + i, f"k{i}\u00e9", bytes([i % 256, i // 256]))[i % 4]

    a, b = cplane.C.StorageIndex(), _LruIndex()
    for w, as_run in writes:
        keys = [key(i) for i in w]
        ints = [k for k in keys if type(k) is int and -2**63 <= k < 2**63]
        if as_run:  # the int64 keys of the write as a run, the others as a list after it
            for part in (ints, [k for k in keys if k not in ints]):
                got = a.admit(run(part) if part is ints else part, capacity)
                assert got == b.admit(part, capacity)
        else:
            assert a.admit(keys, capacity) == b.admit(keys, capacity)
        assert a.keys() == b.keys() and len(a) == len(b)
    held = b.keys()
    assert a.locs(held) == b.locs(held) and all(k in a for k in held)
    assert a.run([key(i) for i in range(400)], 0) == b.run([key(i) for i in range(400)], 0)


# --- StorageIndex(reserve): the tier's capacity made room for up front (session 24) ----------

@compiled
@settings(max_examples=200, deadline=None)
@given(capacity=st.integers(1, 24), reserve=st.one_of(st.integers(0, 64), st.just(1 << 21), st.just(10**12)),
       steps=ops)
def test_a_reserved_index_answers_as_one_grown_by_doubling(capacity, reserve, steps):
    """Room made up front (none, fewer keys than are written, the capacity, the cap and past it)
    changes no answer: every walk of the index is in LRU order, never in its table's order, and
    the entries a reserved index hands out are reused from its free list as a grown one's are."""
    assert apply(cplane.C.StorageIndex(reserve), capacity, steps, {}) == apply(_LruIndex(), capacity, steps, {})


@compiled
def test_a_reserved_index_fills_and_overflows_its_room_as_the_reference():
    """More keys than the room reserved (the arrays then grow by doubling from the reserved size,
    the entries' mapping copied): the same deletions and the same LRU order as the reference.
    3,000 keys into room for 100 (a table of 256 slots, grown at 128 keys), capacity 2,500."""
    keys = [(k * 7919) % 100_003 for k in range(3_000)]
    a, b = cplane.C.StorageIndex(100), _LruIndex(100)
    for i in range(0, len(keys), 70):
        assert a.admit(keys[i:i + 70], 2_500, True) == b.admit(keys[i:i + 70], 2_500, True)
    assert a.keys() == b.keys() and len(a) == len(b) == 2_500


hostile_reserve = st.one_of(
    st.integers(max_value=-1), st.integers(min_value=2**63), st.floats(allow_nan=True), st.text(max_size=4),
    st.none(), st.binary(max_size=4), st.lists(st.integers(0, 3), max_size=2), st.just(float("nan")),
    st.just("\u2603"), st.just("1\x00"))


@settings(max_examples=200, deadline=None)
@given(reserve=hostile_reserve)
@pytest.mark.parametrize("make", INDEXES[:1] + [pytest.param(lambda r: cplane.C.StorageIndex(r), id="c",
                                                              marks=compiled)])
def test_a_hostile_reserve_is_refused_alike(make, reserve):
    """A negative reserve is a ValueError naming it; a float, text, bytes, None or a list a
    TypeError; an int past 64 bits (either sign) an OverflowError: the reference and the
    compiled index alike."""
    make = _LruIndex if make is _LruIndex else make
    if isinstance(reserve, int):
        want = ValueError if -2**63 <= reserve < 0 else OverflowError
    else:
        want = TypeError
    with pytest.raises(want) as err:
        make(reserve)
    if want is ValueError:
        assert "reserve must be >= 0" in str(err.value) and str(reserve) in str(err.value)


def test_the_tier_reserves_its_capacity_up_to_the_cap(tmp_path, monkeypatch):
    """StorageTier hands the index its capacity in pages as the room to make, bounded by
    INDEX_RESERVE_MAX (the compiled index's IX_RESERVE_MAX): a 50M-token tier of 64-token pages
    reserves 781,250 keys, a huge tier the cap, an empty one none."""
    asked = []

    def spy(reserve=0):
        asked.append(reserve)
        return _LruIndex(reserve)

    monkeypatch.setattr(storage, "new_index", spy)
    for pages in (0, 781_250, 10**15):
        storage.StorageTier(tmp_path / str(pages), pages)
    assert asked == [0, 781_250, storage.INDEX_RESERVE_MAX] and storage.INDEX_RESERVE_MAX == 1 << 21


@pytest.mark.parametrize("make", INDEXES)
def test_a_reads_runs_split_at_a_gap_a_segment_and_a_step_back(make):
    """loc_runs: adjacent pages of one segment are one run; a gap, another segment (the last
    slot of one and the first of the next are adjacent numbers, not pages of one file) or a
    page before the last start a new one; a key named twice is two pages of the read."""
    ix = make()
    keys = [digest(k) for k in range(9)]
    ix.admit(keys, 20)
    ix.place(keys[:3], 1, 0)
    ix.place(keys[3:5], 1, 7)
    ix.place(keys[5:6], 1, (1 << _SLOT_BITS) - 1)
    ix.place(keys[6:9], 2, 0)
    s1, s2 = 1 << _SLOT_BITS, 2 << _SLOT_BITS
    assert ix.loc_runs(keys) == [s1, 3, s1 + 7, 2, s2 - 1, 1, s2, 3]
    assert ix.loc_runs(run(keys[1:3] + keys[:1] + keys[:1])) == [s1 + 1, 2, s1, 1, s1, 1]
    assert ix.loc_runs([]) == [] and ix.loc_runs(run([])) == []
    assert ix.keys() == keys  # nothing touched
