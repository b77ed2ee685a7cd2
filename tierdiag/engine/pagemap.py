"""PageMap: page key -> a small non-negative int (an eviction id), for every page a replay has
ever cached. It answers "was this computed page cached before, and which eviction took it?"
for every computed page of every request, so it is as big as the trace's distinct pages and as
hot as the prefill path.

Keys of hash_ids traces (Mooncake, `tierdiag synth`) are small dense ints (hash id x pages a
block + offset): those live in an int32 array indexed by key, 4 bytes a page and vectorised
reads and writes. A slot holds its value's bitwise complement (`~value`: 0 for MISSING = -1,
and every value in [0, 2**31) fits), so a slot never set is zero bytes. The array is two-level:
`_top[k >> LEAF_SHIFT]` is the number of the leaf (LEAF slots, 256 bytes) that holds key k's
slot, 0 where no key of its range was ever set, and `_leaves` the leaves packed in the order they
were first set, leaf 0 never written (a key of no leaf reads its zero slot: MISSING). Both are
anonymous private mappings (mmap) grown by mremap, so only pages of leaves actually made are
touched, and a read of a key of no leaf touches no leaf page at all. At --dp 8 each rank's two
maps span the whole trace's key range but a rank sets ~8 % of it, in runs of ~120 keys: a flat
array filled with MISSING held 121 MiB touched against 16 at dp 1; one of zero pages (session 36)
still touched 13.8 k pages (45 % of them, a set key every ~12 slots) and its reads of never-set
pages ~5 k more; the leaves touch ~3.7 k (issue 41, session 37). Keys beyond DENSE_LIMIT (token traces: 63-bit digests; `extra_key` salts) go
to a dict. Negative keys are output pages (trace/pages.output_page_keys): no request computes
them again, so they are not kept (a set is a no-op, a get MISSING). A dict entry costs ~100 bytes: a million-request trace has tens of millions of
distinct pages, which a dict alone would hold in gigabytes.
"""

from __future__ import annotations

import mmap
from array import array
from itertools import repeat
from typing import Iterable

import numpy as np

from tierdiag.native import cplane

# On the compiled data plane PageMap's base is _cplane.MapCore: `_dense` is its attribute, and
# its `_set_many_c` is set_many's common case (every key inside the array) in one C call, what it
# declines going with the same arguments to `_set_many_py` (the reference). The compiled engine
# calls set_many ~7 times a request; an interpreted wrapper frame was most of its cost (issue 41,
# session 19). On the numpy data plane the base is a plain class.
_MapCore = cplane.compiled("MapCore")


class _PyMap:
    """PageMap's base on the numpy data plane: nothing."""

MISSING = -1
DENSE_LIMIT = 1 << 28  # keys below this may be array slots (at most 1 GiB of int32, grown on demand)
LEAF_SHIFT = 6  # a leaf holds 64 slots (256 bytes): the conversation trace's --dp 8 maps touch
LEAF = 1 << LEAF_SHIFT  # 3.7 k pages (16 slots a leaf 2.8 k, 256 6.6 k, 1024 13.8 k)
_LOW = LEAF - 1
_MAX_VALUE = (1 << 31) - 1
# Up to this many keys a call loops in Python over the array (~0.1-0.2 us a key inside a replay,
# where the caches are cold); above, numpy's vectorised ops pay for their ~10 us of set-up
# (measured in a replay, alternating the two call by call: 4 keys 3.8 vs 14 us, 16 keys ~11
# both, 48 keys 18 vs 12 us).
SMALL_CALL = 24


GROW_SHIFT = 3  # the array grows to its top key and an eighth more (_grow)
GROW_SHIFT_MANY = 1  # ... and half more, a map of one of several ranks' (CacheController)
# Below this many slots (32 MiB of int32: glibc's largest mmap threshold) the array grows at
# least to twice its length (_grow): glibc keeps a chunk that small on the heap, where realloc
# copies it, so each grow was a copy of the whole array.
DOUBLE_SLOTS = 1 << 23


def _slots(n: int) -> tuple[mmap.mmap, memoryview]:
    """`n` native int32s, every one zero: an anonymous private mapping, none of its pages
    touched, and its view as native ints (what `_top` and `_leaves` are)."""
    mem = mmap.mmap(-1, _SLOT_BYTES * n, flags=mmap.MAP_PRIVATE)
    return mem, memoryview(mem).cast("i")


def _resized(mem: mmap.mmap, nbytes: int) -> mmap.mmap:
    """The mapping grown to `nbytes`: in place by mremap (Linux: the pages moved, none copied,
    the new ones zero and untouched), or, where the platform has no mremap (CPython's resize
    raises SystemError there), a new mapping with the old bytes copied in."""
    try:
        mem.resize(nbytes)
        return mem
    except (SystemError, OSError):
        grown = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)
        grown[: len(mem)] = mem[:]
        mem.close()
        return grown


_SLOT_BYTES = array("i").itemsize


class PageMap(_MapCore or _PyMap):  # type: ignore[misc]
    def __init__(self, grow_shift: int = GROW_SHIFT) -> None:
        """`grow_shift`: the array grows to its top key and top >> grow_shift more (_grow)."""
        if type(grow_shift) is not int or not 0 <= grow_shift <= 16:
            raise ValueError(f"page map grow_shift {grow_shift!r}: an int in [0, 16] expected")
        self._sparse: dict[int, int] = {}
        self._grow_shift = grow_shift
        self._nleaves = 0  # leaves made (1.. of `_leaves`; leaf 0 is the zero leaf)
        self._n = 0
        self._top_mem, self._top = _slots(1)
        self._leaf_mem, self._leaves = _slots(LEAF)
        self._size(1 << 12)

    def _size(self, n: int) -> None:
        """The array `n` slots long (a multiple of LEAF): `_top` one entry a leaf's range, and
        room in `_leaves` for every one of them and the zero leaf (untouched pages: only the
        leaves made are ever written)."""
        self._views_released()
        self._top_mem = _resized(self._top_mem, _SLOT_BYTES * (n >> LEAF_SHIFT))
        self._leaf_mem = _resized(self._leaf_mem, _SLOT_BYTES * (n + LEAF))
        self._top = memoryview(self._top_mem).cast("i")
        self._leaves = memoryview(self._leaf_mem).cast("i")
        self._top_np = np.frombuffer(self._top, dtype=np.int32)  # the same memory, for big calls
        self._leaves_np = np.frombuffer(self._leaves, dtype=np.int32)
        self._n = n

    def _views_released(self) -> None:
        """A mapping with a view exporting it cannot be resized: drop them (the compiled base
        holds views of `_top` and `_leaves` until they are set again: None first)."""
        top, leaves = self._top, self._leaves
        self._top = self._leaves = None
        for name in ("_top_np", "_leaves_np"):
            if name in self.__dict__:
                delattr(self, name)
        top.release()
        leaves.release()

    def _flat(self) -> np.ndarray:
        """The slots as a flat array (`~value`, 0 where never set; `_n` of them): copy and
        pickle, and the tests."""
        return self._leaves_np.reshape(-1, LEAF)[self._top_np].reshape(-1)

    def __getstate__(self) -> dict:
        """copy / pickle: the attributes and the array as before session 36, an array('i') of
        the values, MISSING where never set (the mappings and their views are made again)."""
        values = array("i", np.invert(self._flat()).tobytes())
        return {"_dense": values, "_sparse": self._sparse, "_grow_shift": self._grow_shift}

    def __setstate__(self, state: dict) -> None:
        values = np.frombuffer(state["_dense"], dtype=np.int32)
        self._nleaves, self._n = 0, 0
        self._top_mem, self._top = _slots(1)
        self._leaf_mem, self._leaves = _slots(LEAF)
        self._size(((max(len(values), 1) - 1) | _LOW) + 1)
        set_at = np.flatnonzero(values != MISSING)  # leaves made for set slots only
        self._store(set_at, np.invert(values[set_at]))
        self._sparse = state["_sparse"]
        self._grow_shift = state.get("_grow_shift", GROW_SHIFT)

    def __len__(self) -> int:
        n = self._n
        shadowed = sum(1 for k in self._sparse if k < n and self._slot(k))  # moved into the array
        return int(np.count_nonzero(self._leaves_np)) + len(self._sparse) - shadowed

    def _slot(self, k: int) -> int:
        """Key k's slot (0 <= k < `_n`): ~value, 0 where never set."""
        return self._leaves[(self._top[k >> LEAF_SHIFT] << LEAF_SHIFT) | (k & _LOW)]

    def _store(self, arr: np.ndarray, slots) -> None:
        """Slots of keys 0 <= k < `_n` (an int64 array) set, leaves made for the ranges without
        one in the order their first key comes (what the C `map_set` does key by key)."""
        hi = arr >> LEAF_SHIFT
        made = self._top_np[hi]
        new = hi[made == 0]
        if new.size:
            ranges, first = np.unique(new, return_index=True)
            ranges = ranges[np.argsort(first, kind="stable")]
            self._top_np[ranges] = np.arange(self._nleaves + 1, self._nleaves + 1 + ranges.size, dtype=np.int32)
            self._nleaves += int(ranges.size)
            made = self._top_np[hi]
        self._leaves_np[(made.astype(np.int64) << LEAF_SHIFT) | (arr & _LOW)] = slots

    @staticmethod
    def keys_array(keys: Iterable[int] | np.ndarray) -> np.ndarray:
        if isinstance(keys, np.ndarray):
            return keys
        if isinstance(keys, array) and keys.typecode == "q":  # a key run (tree_node.KeyRun): read in place
            return np.frombuffer(keys, dtype=np.int64)
        # array("q") converts a list in one C loop (~2x np.fromiter at a few hundred keys)
        return np.frombuffer(array("q", keys if isinstance(keys, list) else list(keys)), dtype=np.int64)

    def _reach(self) -> int:
        """Keys below this may go to the array: it grows by doubling, as a hash_ids trace's keys
        climb, but a stray small digest of a token trace does not make it allocate ahead."""
        return min(DENSE_LIMIT, 8 * self._n + (1 << 20))

    def _grow(self, top: int) -> None:
        """Room up to key `top` and an eighth more (in whole 4096-slot pages), and, while the
        array is under DOUBLE_SLOTS, at least twice its length. Above DOUBLE_SLOTS glibc's realloc
        moves the (mmapped) array by remapping its pages, not copying them, so the eighth: a
        doubling there left up to half of it unused (a 1M-request synth run: 22.5M keys in 33.5M
        slots, 134 MB a map, against ~101 MB; issue 41). Below it the array is on the heap and a
        grow is a copy of all of it: the conversation trace's maps grew by an eighth ~50 times
        each in its first 3,000 requests, copies of ~7 times the final array (issue 41, session
        30); doubling copies less than the final array in all, and leaves at most 32 MiB a map
        unused. Which keys the array holds, and so every answer, is the same.
        A map of one of several ranks grows by half (`grow_shift` 1): every rank's maps climb the
        same keys, each grow a copy of its array (realloc) and a fill, and 16 maps grown by an
        eighth were ~560 grows and ~0.1 s of a --dp 8 conversation replay (issue 41), against
        ~10 a map by half; a map holds at most twice its top key below DOUBLE_SLOTS, half again
        above. The array is mappings now (session 36; two-level, session 37): a grow is mremap,
        which moves the pages and copies none, its new entries the kernel's zero pages (no leaf,
        MISSING), written by nothing; the sizes are kept as they were (the doubling no longer
        saves a copy, only mremap calls), so the array holds the same keys as before."""
        self._size(max(((top + (top >> self._grow_shift)) | 4095) + 1, min(2 * self._n, DOUBLE_SLOTS)))

    def _set_many_py(self, keys, value: int, *, outputs_last: bool = False) -> None:
        """Map every key to `value` (0 <= value < 2**31). `outputs_last`: the caller vouches that
        negative keys, if any, come after every other (a tree node's keys: a request's input
        pages, then its output pages), so the last key alone says whether there are any. The
        reference and the fallback of `_set_many_c` (MapCore's; tests/engine/test_cplane.py checks they
        agree: the same leaves made in the same order)."""
        if not 0 <= value <= _MAX_VALUE:
            raise OverflowError(f"page map value {value} outside [0, 2**31)")
        slot = ~value  # what a slot holds (module doc); the dict holds values as they are
        if len(keys) <= SMALL_CALL and not isinstance(keys, np.ndarray):
            reach = self._reach()
            for k in keys:
                if k < 0:
                    continue  # an output page
                if k >= self._n:
                    if k >= reach:
                        self._sparse[k] = value
                        continue
                    self._grow(k)
                top, hi = self._top, k >> LEAF_SHIFT
                leaf = top[hi]
                if not leaf:
                    self._nleaves = leaf = self._nleaves + 1
                    top[hi] = leaf
                self._leaves[(leaf << LEAF_SHIFT) | (k & _LOW)] = slot
            return
        arr = self.keys_array(keys)
        if not arr.size:
            return
        if (arr[-1] < 0) if outputs_last else (arr.min() < 0):
            arr = arr[arr >= 0]  # output pages
            if not arr.size:
                return
        elif arr.max() < self._n:  # every key inside the array already (the common case)
            self._store(arr, slot)
            return
        inside = arr < self._reach()
        part = arr if inside.all() else arr[inside]
        if part.size:
            top = int(part.max())
            if top >= self._n:
                self._grow(top)
            self._store(part, slot)
        if part is not arr:
            self._sparse.update(dict.fromkeys(arr[~inside].tolist(), value))

    # The compiled side (MapCore's; None on the numpy data plane) and the backend native/cplane.py
    # chose; both leave the same map.
    _set_many_c = None if _MapCore is None else _MapCore._set_many_c
    set_many = cplane.choose("pagemap.PageMap.set_many", _set_many_c, _set_many_py)

    def get_list(self, keys: list[int]) -> list[int]:
        """The values of a few keys, MISSING for keys never set (a Python loop: for small calls)."""
        top, leaves, n, sparse = self._top, self._leaves, self._n, self._sparse
        out = [~leaves[(top[k >> LEAF_SHIFT] << LEAF_SHIFT) | (k & _LOW)] if 0 <= k < n else MISSING for k in keys]
        if sparse:
            out = [sparse.get(k, MISSING) if v == MISSING else v for k, v in zip(keys, out)]
        return out

    def _gather(self, arr: np.ndarray) -> np.ndarray:
        """The slots of keys 0 <= k (int64), IndexError where one is past the array."""
        made = self._top_np.take(arr >> LEAF_SHIFT)
        return self._leaves_np.take((made.astype(np.int64) << LEAF_SHIFT) | (arr & _LOW))

    def get_many(self, keys, *, inputs: bool = False) -> np.ndarray:
        """Values of the keys (int32 or int64), MISSING for keys never set. The array is asked
        first; a key it does not hold may be in the dict (set before the array reached it).
        `inputs`: the caller vouches that no key is negative (input pages only), which saves
        the scan for output pages."""
        arr = self.keys_array(keys)
        out = None
        if arr.size and (inputs or arr.min() >= 0):
            try:  # every key inside the array (the common case): one gather
                out = np.invert(self._gather(arr))
            except IndexError:  # a key past the array's end: the masked path below
                out = None
        if out is None:
            inside = (arr < self._n) & (arr >= 0)
            out = np.full(arr.size, MISSING, dtype=np.int64)
            out[inside] = np.invert(self._gather(arr[inside]))
        if self._sparse and arr.size:
            ask = np.flatnonzero((out == MISSING) & (arr >= 0))
            if ask.size:
                out[ask] = list(map(self._sparse.get, arr[ask].tolist(), repeat(MISSING)))
        return out

    def get(self, key: int, default: int | None = None) -> int | None:
        (v,) = self.get_list([key])
        return default if v == MISSING else v


# Below this many pages the Python blame loops over lists; above, numpy pays for itself.
SMALL_BLAME = 48


def blame_c(cached: PageMap, demoted: PageMap, keys, lost: dict[int, int] | None, ps: int) -> int:
    """`blame_py` by the compiled data plane (_cplane.blame, on the maps' arrays) when both maps
    are arrays only; what it declines (a map with a dict part, a negative key, odd types) takes
    the Python path."""
    if not cached._sparse and not demoted._sparse:
        found = _c_blame(cached, demoted, keys, lost, ps)
        if found >= 0:
            return found
    return blame_py(cached, demoted, keys, lost, ps)


def blame_py(cached: PageMap, demoted: PageMap, keys, lost: dict[int, int] | None, ps: int) -> int:
    """Of these input pages (no negative key), how many were cached once (`cached` value >= 0),
    and, with `lost` a dict, which evictions took them: `ps` tokens are added to lost[eid] for
    each page an eviction took (its `cached` value, when > 0), then for each once-cached page's
    demotion before (`demoted` value > 0), ids added in that order. This runs over every
    computed page of every request (~2M pages on the conversation trace), so `blame` is
    `blame_c` where native/cplane.py chose the compiled data plane (this is the reference and the
    fallback; tests/engine/test_cplane.py checks they agree). Lists for a handful of pages, numpy
    above."""
    if len(keys) <= SMALL_BLAME:
        if isinstance(keys, np.ndarray):
            keys = keys.tolist()
        eids = cached.get_list(keys)
        was = [k for k, e in zip(keys, eids) if e >= 0]
        if not was or lost is None:
            return len(was)
        took = [e for e in eids if e > 0] + [e for e in demoted.get_list(was) if e > 0]
        for eid in took:
            lost[eid] = lost.get(eid, 0) + ps
        return len(was)
    arr = PageMap.keys_array(keys)  # input pages: no negative (output) key
    eids = cached.get_many(arr, inputs=True)
    was_cached = eids >= 0
    found = int(np.count_nonzero(was_cached))
    if not found or lost is None:
        return found
    both = np.concatenate((eids, demoted.get_many(arr[was_cached], inputs=True)))
    took = both[both > 0]  # the evictions that took each page, then the demotions before
    if took.size:
        # Pages an eviction took are mostly adjacent (a node's run): count by runs of equal
        # ids, an id seen in several runs adding up (no sort, unlike np.unique; and not a
        # Counter over every page: ~4x the instructions).
        heads = np.flatnonzero(took[1:] != took[:-1]) + 1
        ends = heads.tolist() + [took.size]
        begin = 0
        for eid, end in zip(took[np.concatenate(([0], heads))].tolist(), ends):
            lost[eid] = lost.get(eid, 0) + (end - begin) * ps
            begin = end
    return found


_c_blame = cplane.compiled("blame")
blame = cplane.choose("pagemap.blame", blame_c, blame_py)
