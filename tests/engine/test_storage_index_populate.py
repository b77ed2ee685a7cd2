"""The compiled storage index's reserved pages made resident by a thread of its own (session 26,
issue 41's storage row): `StorageIndex(reserve)` of 8 MB or more starts a thread that faults its
table's pages in, and its entries' a 2 MiB chunk ahead of the ones in use, by
MADV_POPULATE_WRITE (no byte written). Nothing it does may show: the answers are the
reference's while it runs, an index dropped while it runs stops it (no thread left, nothing
unmapped under it), an index grown past its room stops it first, and a forked child's copy
(which has no thread) neither waits for it nor breaks."""

from __future__ import annotations

import os
import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierdiag.engine.storage import _LruIndex
from tierdiag.native import cplane

compiled = pytest.mark.skipif(cplane.C is None, reason=f"_cplane: {cplane.WHY_NOT}")

# 2 MiB of 32-byte entries: the chunk the thread populates ahead (storage_index.c IX_CHUNK_ENTRIES)
CHUNK = 65_536
BIG = 1 << 20  # a table of 2**21 slots (16 MB) and 32 MB of entries: the thread starts


def threads() -> int:
    """The process's threads (the kernel's count: native threads too)."""
    return len(os.listdir("/proc/self/task"))


def settle(before: int) -> int:
    """The thread count once the index threads started before have ended (a dropped index joins
    its thread before returning, so this only waits for threads other tests left)."""
    for _ in range(200):
        if threads() <= before:
            break
        time.sleep(0.01)
    return threads()


def drive(index, keys: list[int], capacity: int, batch: int, rng: random.Random) -> list:
    """Writes of `batch` keys each, every one placed, a tenth of the keys written before touched
    again between writes: everything the index answered, then its LRU order and locations."""
    seen, slot = [], 0
    for i in range(0, len(keys), batch):
        write = keys[i:i + batch]
        deleted, fresh, emptied = index.admit(write, capacity, True)
        placed = write if fresh is None else [write[j] for j in fresh]
        index.place(placed, 1 + slot // 262_144, slot % 262_144)
        slot += len(placed)
        again = [k for k in rng.sample(keys[:i + batch], min(len(write) // 10, i + batch)) if k in index]
        index.touch_all(list(dict.fromkeys(again)))
        seen.append((deleted, fresh, emptied, index.run(write, 0)))
    order = index.keys()
    return [seen, order, index.locs(order)]


@compiled
def test_a_big_index_answers_as_the_reference_while_its_pages_are_populated():
    """Past three chunks of entries (the thread told at each, populating the next), with
    deletions from capacity on and touches throughout: every answer, the LRU order and every
    location are the reference's."""
    keys = random.Random(5).sample(range(-2**61, 2**61), 4 * CHUNK)
    capacity = 3 * CHUNK + 1_000
    got = drive(cplane.C.StorageIndex(BIG), keys, capacity, 700, random.Random(9))
    assert got == drive(_LruIndex(BIG), keys, capacity, 700, random.Random(9))


@compiled
def test_an_index_grown_past_its_room_stops_the_thread_first():
    """Room for 2**18 keys (an 8 MB table and entries: the thread starts), then more keys than
    that: the table is rehashed and the entries' mapping copied into new ones, the thread
    stopped before the old ones are unmapped; the answers are the reference's."""
    keys = random.Random(6).sample(range(2**40), (1 << 18) + 3 * CHUNK)
    before = threads()
    a, b = cplane.C.StorageIndex(1 << 18), _LruIndex(1 << 18)
    for i in range(0, len(keys), 5_000):
        assert a.admit(keys[i:i + 5_000], 10**9, True) == b.admit(keys[i:i + 5_000], 10**9, True)
    assert a.keys() == b.keys() and len(a) == len(keys)
    assert settle(before) <= before  # the growth joined it: no thread left running


@compiled
@settings(max_examples=25, deadline=None)
@given(n=st.integers(0, 3_000), reserve=st.sampled_from([BIG, 1 << 21, (1 << 18) - 1, 1 << 18, 10**12]))
def test_an_index_dropped_while_its_pages_are_populated_leaves_no_thread(n, reserve):
    """Made and dropped at once, or after a few writes (the thread mid-table or waiting for the
    entries' next chunk): the drop stops and joins it, so no thread is left."""
    before = threads()
    index = cplane.C.StorageIndex(reserve)
    if n:
        index.admit(list(range(n)), 10**9, True)
        assert len(index) == n and index.run(list(range(n)), 0) == n
    del index
    assert settle(before) <= before


@compiled
def test_a_forked_childs_copy_neither_waits_for_the_thread_nor_breaks():
    """The child of a fork has the parent's index without its thread: it answers, writes and
    drops its copy (no join of a thread it does not have) and exits; the parent's goes on."""
    index = cplane.C.StorageIndex(BIG)
    index.admit(list(range(1_000)), 10**9, True)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            index.admit(list(range(1_000, 2 * CHUNK)), 10**9, True)
            code = 0 if len(index) == 2 * CHUNK and index.run(list(range(2 * CHUNK)), 0) == 2 * CHUNK else 2
            del index  # dropped here, where a join of the parent's thread would never return
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        assert time.monotonic() < deadline, "the forked child hung"
        time.sleep(0.01)
    assert os.waitstatus_to_exitcode(status) == 0
    index.admit(list(range(1_000, 3 * CHUNK)), 10**9, True)
    assert len(index) == 3 * CHUNK and index.keys() == list(range(3 * CHUNK))
