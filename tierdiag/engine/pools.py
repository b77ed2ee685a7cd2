"""Pools own slots and buffers (never residency: that is the tree's).

A KV pool buffer is `[num_layers, num_pages, page_elems]` int64, layer-major like SGLang's
layer_first host layout, so one layer's page is one contiguous row and a layer can be
loaded back on its own. The device pool lives on CUDA when there is one; the host pool is
pinned CPU memory then (plain CPU memory otherwise).

A CPU pool's memory is a numpy array, and `buffer` the torch tensor over that same memory
(`torch.from_numpy`, made on first use): every copy, content write and check of a CPU replay
goes through the numpy row view (engine/rows.py), so a CPU replay never imports torch (~1.3 s,
a fifth of a replay's wall time). A CUDA pool, and the pinned host pool beside it, are torch
tensors from the start.

Layout (`DataPlane.layout`): on CUDA both pools are layer-first, as SGLang's device pool is (a
layer loads back on its own event). A CPU replay's pools are page-first (SGLang's `page_first`
host layout: a `[P, L, E]` buffer, seen as `[L, P, E]` through a transpose), so a page's layers
are one contiguous block: a copy of n pages moves n blocks instead of n x L rows scattered over
the pool (measured ~1.5-2x faster at 80-200 scattered pages), and a layer's page is still one
contiguous row. Content and verification are the same function of the page key either way.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tierdiag.native import cplane
from tierdiag.engine import rows as _rows
from tierdiag.errors import OutputError


@dataclass(frozen=True)
class DataPlane:
    """The real buffers' geometry, and how it relates to the modelled one."""
    num_layers: int
    page_elems: int  # int64 elements per page per layer
    device: str
    pinned_host: bool
    modelled_page_bytes: int
    layout: str = "layer_first"  # layer_first: [L, P, E] buffers; page_first: [P, L, E] (CPU pools only)

    def __post_init__(self) -> None:
        if self.layout not in ("layer_first", "page_first"):
            raise ValueError(f"data plane layout {self.layout!r}: layer_first or page_first")
        if self.layout == "page_first" and (self.device != "cpu" or self.pinned_host):
            raise ValueError("the page_first data plane is for CPU pools (a CUDA one is layer_first)")

    @property
    def page_bytes(self) -> int:
        return self.num_layers * self.page_elems * 8

    @property
    def reduced(self) -> bool:
        return self.page_bytes < self.modelled_page_bytes

    def to_json(self) -> dict:
        return {
            "num_layers": self.num_layers, "page_elems": self.page_elems, "device": self.device,
            "pinned_host": self.pinned_host, "page_bytes": self.page_bytes,
            "modelled_page_bytes": self.modelled_page_bytes, "reduced_width": self.reduced,
            "scale": self.page_bytes / self.modelled_page_bytes, "layout": self.layout,
            # What moved, wrote and checked the CPU pools' bytes: the compiled kernel or numpy
            # (cplane.py; the same bytes either way, the time differs).
            "cpu_kernel": cplane.CPU_KERNEL,
        }


# Widest row the engine's pools get (one layer of one page): 64 B. Every computed page is
# written and every write-through backup copied for real, so row width is replay time: at
# 256 B rows (1 KiB pages) those copies were ~40 % of a CPU replay of the conversation trace,
# at 64 B ~2.7x cheaper (benchmarks/README.md), and a slot mix-up shows at any width.
MAX_ROW_BYTES = 64


def plan_data_plane(*, model_layers: int, modelled_page_bytes: int, total_pages: int,
                    budget_bytes: int, device: str, pinned_host: bool) -> DataPlane:
    """Fit both pools into `budget_bytes`: up to 4 layers of rows as wide as the modelled page
    (a power of two of int64s) up to MAX_ROW_BYTES; then drop layers, then narrow down to one
    int64 a page (the config refuses pools that would not fit even then)."""
    layers = min(model_layers, 4)
    full_elems = max(1, min(modelled_page_bytes // (model_layers * 8), MAX_ROW_BYTES // 8))
    elems = 1 << (full_elems.bit_length() - 1)  # power of two <= full row

    def size() -> int:
        return layers * elems * 8 * total_pages

    while elems > 8 and size() > budget_bytes:
        elems //= 2
    while layers > 1 and size() > budget_bytes:
        layers -= 1
    while elems > 1 and size() > budget_bytes:
        elems //= 2
    layout = "page_first" if device == "cpu" and not pinned_host else "layer_first"
    return DataPlane(layers, elems, device, pinned_host, modelled_page_bytes, layout)


# Frees of up to this many slots take the Python path (PagePool._free_small).
_SMALL_FREE = 8
if cplane.C is not None:
    _c_alloc, _c_free = cplane.C.alloc, cplane.C.free


class PagePool:
    """Slots of one tier. Exact accounting: free + used == capacity, no slot owned twice.

    The free slots are a stack (an int array, top at `_top`): `free` pushes a list reversed and
    `alloc` pops from the top, so a freed run comes back out as the same run. Ownership is one
    byte a slot (`_owned`). A free proves every slot owned (one gather of their bytes) and the
    list free of repeats, then clears the bytes and pushes the slots: a few numpy calls a list
    instead of hashing every slot into a pool-sized set (12 % of a replay before), and nothing
    that grows with the pool. An alloc pops and marks; it need not check, since a slot reaches
    the stack only from __init__ or from a free that proved it owned (`check` verifies).
    """

    def __init__(self, name: str, num_pages: int, plane: DataPlane, *, on_device: bool):
        self.name = name
        self.capacity = num_pages
        # Lowest slot first, so fresh pools hand out contiguous runs (fewer, larger transfers).
        self._stack = np.arange(num_pages - 1, -1, -1, dtype=np.intp)
        self._top = num_pages  # _stack[:_top] are the free slots
        self._owned_bytes = bytearray(num_pages)  # 1: handed out (Python indexes it fast) ...
        self._owned = np.frombuffer(self._owned_bytes, dtype=np.uint8)  # ... numpy the same bytes
        shape = (plane.num_layers, num_pages, plane.page_elems)
        self._tensor = None
        self.page_major = plane.layout == "page_first"  # rows are whole pages: [1, P] items
        # The buffer's memory as numpy [L, P, E] (CPU pools; a transposed view when page-first).
        self.array: np.ndarray | None = None
        if (on_device and plane.device != "cpu") or (not on_device and plane.pinned_host):
            import torch  # a CUDA machine: the kernels' tensor paths

            from tierdiag.engine import kernels

            if on_device:
                self._tensor = torch.zeros(shape, dtype=torch.int64, device=plane.device)
            else:
                self._tensor = torch.zeros(shape, dtype=torch.int64, pin_memory=True)
            if not self._tensor.is_cuda:
                self.array = self._tensor.numpy()
            # The [L, P] numpy row view when copies can take the numpy path (pinned host),
            # else None (CUDA: the torch/Triton kernels).
            self.rows = kernels.register_pool(self._tensor)
        elif self.page_major:
            self.array = np.zeros((num_pages, plane.num_layers, plane.page_elems), dtype=np.int64).transpose(1, 0, 2)
            self.rows = _rows.array_rows(self.array, page_first=True)  # [1, P]: a page's layers are one item
        else:
            self.array = np.zeros(shape, dtype=np.int64)
            self.rows = _rows.array_rows(self.array, page_first=False)
        # Geometry kept as plain ints.
        self.num_layers, self.page_elems = plane.num_layers, plane.page_elems
        self.page_bytes = plane.num_layers * plane.page_elems * 8  # data plane (int64)

    @property
    def buffer(self):
        """The pool as a torch tensor [layers, pages, elems]; a CPU pool's is made on first use,
        over the same memory (so torch is imported only when someone asks for it)."""
        if self._tensor is None:
            import torch

            if self.page_major:  # the [P, L, E] buffer seen as [L, P, E]: kernels.PAGE_FIRST
                self._tensor = torch.from_numpy(self.array.transpose(1, 0, 2)).permute(1, 0, 2)
            else:
                self._tensor = torch.from_numpy(self.array)
        return self._tensor

    @property
    def free_pages(self) -> int:
        return self._top

    @property
    def used_pages(self) -> int:
        return self.capacity - self._top

    def _alloc_numpy(self, n: int) -> list[int] | None:
        top = self._top
        if n > top:
            return None
        if n <= 0:
            if n < 0:
                raise ValueError(f"{self.name}: alloc of {n} pages")
            return []
        slots = self._stack[top - n:top][::-1]
        # No ownership check: a slot reaches the stack only from __init__ or a free that proved
        # it owned and unique, so the stack never holds an owned slot (check() verifies).
        self._owned[slots] = 1
        self._top = top - n
        return slots.tolist()

    def _alloc_c(self, n: int) -> list[int] | None:
        """`_alloc_numpy` by the compiled kernel: the same slots, in one C loop."""
        top = self._top
        if not 0 < n <= top:  # nothing to hand out, or too much: numpy's answer (None, [], an error)
            return self._alloc_numpy(n)
        slots = _c_alloc(self._stack, self._owned_bytes, top, n)
        self._top = top - n
        return slots

    def _free_c(self, slots: list[int]) -> None:
        """`_free_numpy` by the compiled kernel: every slot proved owned and named once (marked
        as it is seen, no set), then cleared and pushed. A free it refuses, having changed
        nothing, goes to the numpy path, which names the slot and raises."""
        top = _c_free(self._stack, self._owned_bytes, self._top, slots)
        if top < 0:
            self._free_numpy(slots)
            return
        self._top = top

    def _free_numpy(self, slots: list[int]) -> None:
        n = len(slots)
        if not n:
            return
        if n <= _SMALL_FREE:
            self._free_small(slots, n)
            return
        try:
            idx = _rows.slot_index(slots)
        except OverflowError:  # a negative slot
            raise AssertionError(f"{self.name} slot {min(slots)} freed but not owned (not a slot of this pool)") from None
        owned = self._owned
        try:
            held = np.count_nonzero(owned.take(idx))
        except IndexError:
            raise AssertionError(f"{self.name} slot {max(slots)} freed but not owned (not a slot of this pool)") from None
        if held != n or (n > 1 and self._repeats(slots, idx)):
            self._refuse_free(slots)
        owned[idx] = 0
        top = self._top
        self._stack[top:top + n] = idx[::-1]
        self._top = top + n

    def _free_small(self, slots: list[int], n: int) -> None:
        """`free` of a few slots in Python: inside a replay each numpy call costs 1-2 us with the
        caches cold, a few Python steps a slot less (same checks, same stack)."""
        owned = self._owned_bytes
        try:
            held = min(slots) >= 0 and all(map(owned.__getitem__, slots))
        except (IndexError, TypeError):
            held = False
        if not held or (n > 1 and len(set(slots)) != n):
            self._refuse_free(slots)
        for s in slots:
            owned[s] = 0
        top = self._top
        self._stack[top:top + n] = slots[::-1]
        self._top = top + n

    @staticmethod
    def _repeats(slots: list[int], idx: np.ndarray) -> bool:
        """Whether a slot list names a slot twice: a set of a short list, a sort of a long one
        (the set is cheaper up to a few hundred slots)."""
        if len(slots) <= 256:
            return len(set(slots)) != len(slots)
        ordered = np.sort(idx)
        return bool((ordered[1:] == ordered[:-1]).any())

    def _refuse_free(self, slots: list[int]) -> None:
        """Name the slot that makes a free wrong (nothing has changed yet) and raise."""
        seen: set[int] = set()
        for s in slots:
            if s in seen:
                raise AssertionError(f"{self.name}: slot {s} freed twice in one call")
            if not (0 <= s < self.capacity and self._owned[s]):
                raise AssertionError(f"{self.name} slot {s} freed but not owned (double free?)")
            seen.add(s)
        raise AssertionError(f"{self.name}: a free of {len(slots)} slots refused for no slot (a pool bug)")

    # The chosen CPU kernel's (cplane.py); both hand out the same slots in the same order.
    alloc = _alloc_c if cplane.C is not None else _alloc_numpy
    free = _free_c if cplane.C is not None else _free_numpy

    def check(self) -> None:
        free = self._stack[:self._top]
        assert int(np.count_nonzero(self._owned)) == self.used_pages, \
            f"{self.name}: owned slots disagree with the free list"
        assert np.unique(free).size == free.size, f"{self.name}: a slot is free twice"
        assert not self._owned[free].any(), f"{self.name}: a slot is both free and owned"


# --- page content: a deterministic function of the page key --------------------------------
_MIX = 0x9E3779B97F4A7C15 - (1 << 64)  # golden-ratio constant as a signed int64


_PATTERNS: dict[tuple[int, int], np.ndarray] = {}


def _pattern(num_layers: int, page_elems: int) -> np.ndarray:
    """[layers, 1, elems]: what distinguishes one layer's and one column's bytes (cached)."""
    pat = _PATTERNS.get((num_layers, page_elems))
    if pat is None:
        layer = np.arange(num_layers, dtype=np.int64).reshape(-1, 1, 1)
        col = np.arange(page_elems, dtype=np.int64).reshape(1, 1, -1)
        pat = _PATTERNS[(num_layers, page_elems)] = (layer * 1_000_003) ^ (col * 2_654_435_761)
    return pat


def page_content_np(keys: list[int], num_layers: int, page_elems: int) -> np.ndarray:
    """[layers, len(keys), elems] int64 whose every row is derived from its page key and layer
    (key × golden ratio, wrapping like int64 arithmetic, XOR the layer/column pattern)."""
    k = np.array(keys, dtype=np.int64)
    k *= _MIX  # wraps modulo 2**64, as the int64 multiply of a kernel would
    return k.reshape(1, -1, 1) ^ _pattern(num_layers, page_elems)


def page_content(keys: list[int], num_layers: int, page_elems: int):
    """`page_content_np` as a CPU tensor (shares its memory)."""
    import torch

    return torch.from_numpy(page_content_np(keys, num_layers, page_elems))


class _ContentRows:
    """Where a prefill's page content is computed, for one geometry and layout: the layer/column
    pattern tiled along each row of items and an output buffer of the same shape, whose row-item
    view the first n items of are handed out.

    Layer-first ([layers, cap * elems], items of one layer's page):
        layer l:  mix(k0) x elems | mix(k1) x elems | ...   (the keys, each repeated elems times)
              XOR pattern[l]      | pattern[l]      | ...   (tiled)
    Page-first ([1, cap * layers * elems], items of a whole page, its layers in order):
                  mix(k0) x (layers * elems)        | mix(k1) x ...
              XOR pattern[0] pattern[1] ...         | pattern[0] pattern[1] ...
    The same values (mix(key) XOR pattern[layer, column]) in the pool's memory order.

    One XOR with a long inner loop a row, instead of page_content_np's broadcast whose inner
    loop is one row (~3x the time at a few hundred pages)."""

    def __init__(self, num_layers: int, page_elems: int, page_major: bool = False):
        self.num_layers, self.page_elems, self.page_major = num_layers, page_elems, page_major
        self.width = num_layers * page_elems if page_major else page_elems  # int64s an item
        self.row = np.dtype((np.void, self.width * 8))
        self._grow(256)

    def _grow(self, cap: int) -> None:
        self.cap = cap
        pattern = _pattern(self.num_layers, self.page_elems)  # [layers, 1, elems]
        if self.page_major:
            block = pattern.reshape(1, self.num_layers * self.page_elems)  # one page: layer after layer
            self.tiled = np.ascontiguousarray(np.tile(block, (1, cap)))
        else:
            self.tiled = np.ascontiguousarray(np.broadcast_to(pattern, (self.num_layers, cap, self.page_elems)))
            self.tiled = self.tiled.reshape(self.num_layers, cap * self.page_elems)
        self.out = np.empty_like(self.tiled)
        self.out_rows = self.out.view(self.row)  # [layers, cap] or [1, cap]

    def __call__(self, keys) -> np.ndarray:
        """`page_content_np(keys)` as row items in the pool's layout (valid until the next call)."""
        n = len(keys)
        if n > self.cap:
            self._grow(max(n, 2 * self.cap))
        width = n * self.width
        mixed = np.multiply(np.asarray(keys, dtype=np.int64), _MIX)  # wraps modulo 2**64, as in page_content_np
        np.bitwise_xor(mixed.repeat(self.width), self.tiled[:, :width], out=self.out[:, :width])
        return self.out_rows[:, :n]


_CONTENT: dict[tuple[int, int, bool], _ContentRows] = {}


def _content_rows(keys, num_layers: int, page_elems: int, page_major: bool = False) -> np.ndarray:
    """`page_content_np(keys, ...)` as row items in a pool's layout ([layers, n] items of
    page_elems int64s, or [1, n] items of whole pages), computed into a reused buffer (valid
    until the next call): a prefill's pages go from there straight into their slots, without a
    fresh array a call."""
    make = _CONTENT.get((num_layers, page_elems, page_major))
    if make is None:
        make = _CONTENT[(num_layers, page_elems, page_major)] = _ContentRows(num_layers, page_elems, page_major)
    return make(keys)


def write_content_numpy(pool: PagePool, slots: list[int], keys: list[int]) -> None:
    """What a prefill would produce: KV derived from the page keys, into the given slots."""
    if not len(slots):
        return
    if pool.rows is not None and len(keys) == len(slots):
        _rows.write_rows(_content_rows(keys, pool.num_layers, pool.page_elems, pool.page_major), pool.rows, slots)
        return
    from tierdiag.engine import kernels

    kernels.write_pages(page_content_np(keys, pool.num_layers, pool.page_elems), pool.buffer, slots)


def read_pages(pool: PagePool, slots: list[int]):
    """The pages in `slots` as a fresh CPU tensor [layers, len(slots), elems]."""
    import torch

    from tierdiag.engine import kernels

    out = torch.empty((pool.num_layers, len(slots), pool.page_elems), dtype=pool.buffer.dtype)
    kernels.copy_pages(pool.buffer, slots, out, range(len(slots)))
    return out


def write_content_c(pool: PagePool, slots: list[int], keys: list[int]) -> None:
    """`write_content_numpy` by the compiled kernel: each page's values generated straight into
    its slot (no content buffer, no row copy). What it declines (a slot outside the pool, a key
    that is no int64, a pool without a numpy row view) takes the numpy path."""
    if pool.rows is None or not len(slots) or _c_write_content(pool.rows, slots, keys, pool.num_layers,
                                                               pool.page_elems) < 0:
        write_content_numpy(pool, slots, keys)


def verify_content_c(pool: PagePool, slots: list[int], keys: list[int]) -> bool:
    """`verify_content_numpy` by the compiled kernel: the pages compared in place with the
    values the keys imply (no gather, no content buffer)."""
    if pool.rows is not None and len(slots):
        same = _c_verify_content(pool.rows, slots, keys, pool.num_layers, pool.page_elems)
        if same >= 0:
            return bool(same)
    return verify_content_numpy(pool, slots, keys)


def verify_content_numpy(pool: PagePool, slots: list[int], keys: list[int]) -> bool:
    """Whether the pages in `slots` hold, byte for byte, what `write_content` writes for `keys`."""
    if not len(slots):
        return True
    if pool.rows is not None and len(keys) == len(slots):
        # The rows read straight out of the pool (a gather copy), compared with the content
        # the keys imply, as whole rows of bytes
        held = _rows.read_rows(pool.rows, slots)
        expected = _content_rows(keys, pool.num_layers, pool.page_elems, pool.page_major)
        return bool(np.array_equal(held.view(np.uint8), expected.view(np.uint8)))
    import torch

    expected = page_content(keys, pool.num_layers, pool.page_elems)
    return bool(torch.equal(read_pages(pool, slots), expected))


# The chosen CPU kernel's (cplane.py).
if cplane.C is not None:
    _c_write_content, _c_verify_content = cplane.C.write_content, cplane.C.verify_content
write_content = write_content_c if cplane.C is not None else write_content_numpy
_c_gather_pages = cplane.C.gather_pages if cplane.C is not None else None
verify_content = verify_content_c if cplane.C is not None else verify_content_numpy


# --- storage tier: pages in append-only segment files, keyed by chained SHA-256 ------------
@contextlib.contextmanager
def _storage_errors(path: Path):
    """A filesystem error of the storage tier (its folder read-only or a file, the disk full, a
    page file gone) is an output error naming the path: exit 6, one line, not a bug."""
    try:
        yield
    except OSError as exc:
        where = exc.filename or path
        raise OutputError(f"cannot use the storage tier at {where}: {exc.strerror or exc}",
                          hint="set storage_dir (--config) to a writable folder with room, or pass --storage-tokens 0"
                          ) from None


SEGMENT_BYTES = 64 << 20  # a segment file's target size; larger tiers get larger segments
MAX_SEGMENTS = 256  # ... so that the files (and descriptors) held open stay few
SEGMENT_SUFFIX = ".kvseg"
_SLOT_BITS = 32  # a page's location in the index: segment number << 32 | slot in the segment


class _Segment:
    """One append-only file of whole pages (`pages` slots, live or holes); which of them are live
    is the index's (`_LruIndex.live`, `segment_keys`)."""
    __slots__ = ("number", "path", "fd", "pages")

    def __init__(self, number: int, path: Path, fd: int):
        self.number, self.path, self.fd = number, path, fd
        self.pages = 0


def lookup_prefix(mapping: dict, keys: list) -> list:
    """[mapping[k] for k in keys], stopping before the first key not in `mapping`: the storage
    keys already known of a request's pages (Scheduler._storage_keys) or of a node's (all of
    them, CacheController._write_storage). Compiled when the data plane is built: a dict
    lookup a page of every request was ~10 % of a storage replay."""
    if cplane.C is not None:
        out = cplane.C.lookup_prefix(mapping, keys)
        if out != -1:
            return out
    out = []
    for k in keys:
        v = mapping.get(k)
        if v is None:
            break
        out.append(v)
    return out


class _LruIndex:
    """The storage tier's index: page key -> location (segment << _SLOT_BITS | slot; -1 while the
    page is being written) in LRU order, oldest first, and the live pages of each segment. The
    reference and the fallback of `_cplane.StorageIndex`, which has the same methods and is what
    a run uses when the compiled data plane is built (tests/engine/test_storage_index.py runs
    both on the same operations). The per-page work of a write is all here, in `admit`: compiled,
    the tier does no Python work a page.
    """

    def __init__(self):
        self._od: OrderedDict = OrderedDict()
        self._live: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._od)

    def __contains__(self, key) -> bool:
        return key in self._od

    def touch(self, key) -> None:
        self._od.move_to_end(key)

    def touch_all(self, keys: list) -> None:
        for key in keys:
            self._od.move_to_end(key)

    def keys(self) -> list:
        return list(self._od)

    def run(self, keys: list, start: int) -> int:
        """How many of keys[start:] are in the index before the first that is not."""
        if start < 0:
            raise ValueError("start must be >= 0")
        od, end = self._od, start
        while end < len(keys) and keys[end] in od:
            end += 1
        return end - start

    def locs(self, keys: list) -> list[int]:
        od = self._od
        return [od[k] for k in keys]

    def live(self, segment: int) -> int:
        return self._live.get(segment, 0)

    def clear_live(self, segment: int) -> None:
        self._live.pop(segment, None)

    def segment_keys(self, segment: int) -> tuple[list[int], list]:
        """The live pages of `segment` as (slots, keys), in slot order (a scan: compaction is rare)."""
        lo, mask = segment << _SLOT_BITS, (1 << _SLOT_BITS) - 1
        found = sorted((loc, k) for k, loc in self._od.items() if lo <= loc <= lo + mask)
        return [loc & mask for loc, _ in found], [k for _, k in found]

    def admit(self, keys: list, capacity: int) -> tuple[list, list[int] | None, list[int]]:
        """Enter the keys of a write, one at a time as files a page would go: a key already there
        is touched; a new one first deletes the oldest pages while the index holds `capacity`
        (even one entered earlier in this call), then goes in as the newest, at location -1.
        Returns (deleted keys oldest first, fresh, emptied): fresh, the positions of the keys
        still at -1 at the end (None when no more than capacity keys were all entered new at
        their turn: all of them, in order); emptied, the segments whose last live page went, in
        that order.

        A key named twice in one write is the same key written twice, one page at a time: named
        again while it is there, it is touched (as a key from an earlier write is: its page is
        not written again); pushed out in between by the write's own keys, it is entered anew
        (and is in `deleted` too). Either way fresh names it once, at the position whose page
        the tier keeps: the one that entered it last."""
        od, deleted, emptied = self._od, [], []
        distinct = set(keys)
        if len(keys) <= capacity and len(distinct) == len(keys) and od.keys().isdisjoint(distinct):
            # All new (the common case): what the loop below does, at once. With the index full,
            # the loop pops the oldest page before each insert; as none of these keys is in the
            # index yet, those are exactly the len(od) + len(keys) - capacity oldest pages, all
            # from before this call (there are at least that many).
            for _ in range(len(od) + len(keys) - capacity):
                self._pop_oldest(deleted, emptied)
            od.update(zip(keys, itertools.repeat(-1)))
            return deleted, None, emptied
        fresh: list[int] = []
        all_new = len(keys) <= capacity
        for i, key in enumerate(keys):
            if key in od:
                od.move_to_end(key)
                all_new = False
                continue
            while len(od) >= capacity:
                self._pop_oldest(deleted, emptied)
            od[key] = -1
            fresh.append(i)
        if all_new:  # (a key there before the call but pushed out before its turn)
            return deleted, None, emptied
        if len(distinct) == len(keys):
            return deleted, [i for i in fresh if od.get(keys[i]) == -1], emptied
        # A key entered, pushed out by this write's own keys and entered again is at -1 for both
        # entries, but its page is the later one's (written twice, it was counted live twice).
        last = {keys[i]: i for i in fresh}
        return deleted, [i for i in fresh if last[keys[i]] == i and od.get(keys[i]) == -1], emptied

    def _pop_oldest(self, deleted: list, emptied: list) -> None:
        """Delete the least recently used page: its key to `deleted`, its segment to `emptied`
        when that was the segment's last live page (a page not placed yet has no segment)."""
        old, loc = self._od.popitem(last=False)
        deleted.append(old)
        if loc >= 0:
            seg = loc >> _SLOT_BITS
            self._live[seg] -= 1
            if not self._live[seg]:
                emptied.append(seg)

    def place(self, keys: list, segment: int, first: int) -> None:
        """The pages of `keys` (all in the index) went to slots first, first + 1, ... of
        `segment`: their locations change, their LRU places do not."""
        od = self._od
        loc = (segment << _SLOT_BITS) + first
        for i, key in enumerate(keys):
            if key not in od:
                raise KeyError(key)
            od[key] = loc + i
            self._live[segment] = self._live.get(segment, 0) + 1

    def drop_placeholders(self, keys: list) -> None:
        """Delete those of `keys` still at -1 (pages that never reached the disk)."""
        od = self._od
        for key in keys:
            if od.get(key) == -1:
                del od[key]


def _new_index():
    """The compiled index when the data plane is built (cplane.py), else the reference."""
    return _LruIndex() if cplane.C is None else cplane.C.StorageIndex()


class StorageTier:
    """The L3 tier of SGLang's HiCache as files on local disk (HiCacheFile's role).

    Layout: pages are appended to segment files `NNNNNN.kvseg` under `root`, each page the
    `page_bytes` of its rows (layer after layer), so a transfer of n pages is one write and a
    prefetch of consecutive pages one read. The index (page key -> segment, slot) and the LRU
    order over it live in memory (_LruIndex): the tier is the run's, made empty at its start.

        segment 000001.kvseg  |page a|page b|page c|  ...  (append only)
        index: a -> (1, 0), b -> (1, 1), ...   LRU: a b c ... (oldest first)

    Past `capacity_pages` the least recently used page is deleted from the index (as one file a
    page was unlinked before); its bytes become a hole in its segment. A segment with no live
    page is unlinked; while the files hold more than twice the live pages (plus two segments),
    the sparsest segment is compacted: its live pages are appended anew and the file unlinked.
    No fsync: the tier is a cache of the run, not a durable store.
    """

    def __init__(self, root: Path, capacity_pages: int):
        # Keys: the pages' chained SHA-256 digests (trace.pages.storage_key_chain); the tier only
        # hashes and compares them, so any bytes or str key works.
        self.root = Path(root)
        with _storage_errors(self.root):
            self.root.mkdir(parents=True, exist_ok=True)
            if not os.access(self.root, os.W_OK | os.X_OK):
                raise PermissionError(errno.EACCES, "Permission denied", str(self.root))
        self.capacity = capacity_pages
        self._index = _new_index()  # key -> location, LRU order; live pages a segment
        self._segments: dict[int, _Segment] = {}
        self._active: _Segment | None = None
        self._next_segment = 1
        self._page_shape: tuple[int, int] | None = None  # (layers, elems), from the first write
        self._segment_pages = 0
        self._disk_pages = 0  # pages the segment files hold, live or holes
        self._emptied: list[_Segment] = []  # segments whose last live page went (unlinked when not active)
        self.bytes_written = 0  # bytes appended to segment files (compaction included)
        self.bytes_read = 0

    def __contains__(self, key) -> bool:
        return key in self._index

    def hits(self, keys: list, start: int) -> int:
        """How many of keys[start:] the tier holds before the first it does not (a prefetch's
        hit query), without touching them."""
        return self._index.run(keys, start)

    @property
    def used_pages(self) -> int:
        return len(self._index)

    @property
    def page_bytes(self) -> int:
        return 0 if self._page_shape is None else self._page_shape[0] * self._page_shape[1] * 8

    def disk_bytes(self) -> int:
        """Bytes the segment files hold now (live pages and holes)."""
        return self._disk_pages * self.page_bytes

    def touch(self, key) -> None:
        self._index.touch(key)

    # --- writing -----------------------------------------------------------------------------
    def write(self, keys: list, rows) -> list:
        """Write pages (rows: [layers, n, elems] on CPU). Returns the keys deleted to make room."""
        page_major = rows.numpy().transpose(1, 0, 2)
        return self._write(keys, lambda idx: np.ascontiguousarray(page_major if idx is None else page_major[idx]),
                           (rows.shape[0], rows.shape[2]))

    def write_from(self, pool, slots: list[int], keys: list, *, rows: np.ndarray | None = None) -> list:
        """Write the pages in `slots` of a [layers, pages, elems] CPU pool buffer (a numpy array,
        or a CPU tensor) under `keys`: one gather into page-major rows, one append. Returns the
        keys deleted to make room. `rows`: the pool's row view when the caller keeps one (the
        engine's host pool), instead of making it again."""
        if rows is not None:
            layer_rows = rows
        elif isinstance(pool, np.ndarray):
            layer_rows = _rows.array_rows(pool)  # [layers, pages] row items ([1, pages] page-first)
        else:
            from tierdiag.engine import kernels

            layer_rows = kernels.pool_rows(pool)
        def gather(idx):
            # Page-major for the file, never a pass over the whole pool: the compiled gather
            # (one copy of the transfer's bytes, slots range-checked), else numpy's rows of each
            # layer, then transposed (two copies). A page-first pool's items are whole pages
            # already ([1, n] -> [n, 1]).
            if idx is None:
                pages = slots
            else:
                pages = [slots[i] for i in idx] if isinstance(slots, list) else np.asarray(slots)[np.asarray(idx)]
            if _c_gather_pages is not None:
                out = _c_gather_pages(layer_rows, pages)
                if out != -1:
                    return np.frombuffer(out, dtype=np.int64).reshape(len(pages), -1)
            slots_a = _rows.slot_index(pages) if isinstance(pages, list) else np.asarray(pages, dtype=np.intp)
            rows = layer_rows.take(slots_a, axis=1)
            return np.ascontiguousarray(rows.T).view(np.int64)  # [n, layers * elems]

        return self._write(keys, gather, (pool.shape[0], pool.shape[2]))

    def _write(self, keys: list, gather, shape: tuple[int, int]) -> list:
        self._set_shape(shape)
        keys = keys if type(keys) is list else list(keys)
        deleted, fresh, emptied = self._index.admit(keys, self.capacity)
        if emptied:
            segments = self._segments
            self._emptied.extend(segments[n] for n in emptied)
        if fresh is None:  # all new, in order: one gather of every slot
            self._place(keys, gather(None))
            # Nothing to unlink or compact without deletions: the files grew as the index did.
            # (A key there before the call but pushed out before its turn is a deletion.)
            if deleted:
                self._collect()
            return deleted
        if fresh:
            self._place([keys[i] for i in fresh], gather(fresh))
        self._collect()
        return deleted

    def _place(self, keys: list, data: np.ndarray) -> None:
        """Append the pages of `keys` (in the index as -1) and record where they went."""
        try:
            self._append(keys, data.reshape(len(keys), -1))
        except BaseException:
            self._index.drop_placeholders(keys)  # pages that never reached the disk are not in the tier
            raise

    def _set_shape(self, shape: tuple[int, int]) -> None:
        if self._page_shape is None:
            self._page_shape = (int(shape[0]), int(shape[1]))
            cap_bytes = self.capacity * self.page_bytes
            seg_bytes = max(SEGMENT_BYTES, -(-cap_bytes // MAX_SEGMENTS))
            self._segment_pages = max(1, min(seg_bytes // self.page_bytes, (1 << _SLOT_BITS) - 1))
        assert self._page_shape == (shape[0], shape[1]), \
            f"storage pages are {self._page_shape} (layers, elems); got {tuple(shape)} (data plane changed mid-run?)"

    def _new_segment(self) -> _Segment:
        while True:
            number = self._next_segment
            self._next_segment += 1
            path = self.root / f"{number:06d}{SEGMENT_SUFFIX}"
            with _storage_errors(path):
                try:
                    # O_EXCL: a folder shared by mistake never has its pages overwritten.
                    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                except FileExistsError:
                    continue
            seg = self._segments[number] = _Segment(number, path, fd)
            return seg

    def _append(self, keys: list, data) -> None:
        """Append pages (data: [n, page_bytes/8] int64, C order; keys in the index) at the end of
        the active segment, starting a new one when it is full; one pwrite per segment touched."""
        index, per_seg, page_bytes = self._index, self._segment_pages, self.page_bytes
        done = 0
        while done < len(keys):
            seg = self._active
            if seg is None or seg.pages >= per_seg:
                seg = self._active = self._new_segment()
            first = seg.pages
            n = min(len(keys) - done, per_seg - first)
            buf = memoryview(data[done:done + n]).cast("B")
            offset = first * page_bytes
            with _storage_errors(seg.path):
                try:
                    written = 0
                    while written < len(buf):
                        written += os.pwrite(seg.fd, buf[written:], offset + written)
                except BaseException:
                    os.ftruncate(seg.fd, offset)  # a full disk must not keep half a page
                    raise
            index.place(keys[done:done + n] if done or n < len(keys) else keys, seg.number, first)
            seg.pages += n
            self._disk_pages += n
            self.bytes_written += n * page_bytes
            done += n

    def _collect(self) -> None:
        """Unlink segments without a live page. Then, while the files hold more than about twice
        the live pages, compact the sparsest segment. Deletion is LRU and writes append, so the
        oldest segments mostly empty on their own; only pages kept alive by hits get copied."""
        live = self._index.live
        if self._emptied:
            for seg in self._emptied:
                if seg is not self._active and not live(seg.number) and seg.number in self._segments:
                    self._unlink(seg)
            self._emptied = [s for s in self._emptied if s.number in self._segments and not live(s.number)]
        slack = 2 * self._segment_pages
        while self._disk_pages > 2 * len(self._index) + slack:
            seg = min((s for s in self._segments.values() if s is not self._active),
                      key=lambda s: live(s.number) / s.pages)
            self._compact(seg)
            self._unlink(seg)

    def _compact(self, seg: _Segment) -> None:
        """Move the live pages of `seg` to the end of the files (the caller unlinks it). A
        segment whose pages are all gone has nothing to move: only its count is cleared."""
        slots, keys = self._index.segment_keys(seg.number)
        if slots:
            data = self._read_slots(seg, slots)
            # Re-appending keeps each key's place in the LRU order (a location update does not move it).
            self._append(keys, data.reshape(len(slots), -1))
        self._index.clear_live(seg.number)

    def _unlink(self, seg: _Segment) -> None:
        del self._segments[seg.number]
        self._disk_pages -= seg.pages
        with _storage_errors(seg.path):
            os.close(seg.fd)
            seg.path.unlink(missing_ok=True)

    # --- reading -----------------------------------------------------------------------------
    def _read_slots(self, seg: _Segment, slots: list[int]):
        """[len(slots), layers, elems] int64 read from `seg`, one preadv per run of adjacent slots."""
        layers, elems = self._page_shape
        out = np.empty((len(slots), layers, elems), dtype=np.int64)
        page_bytes = self.page_bytes
        i = 0
        while i < len(slots):
            j = i + 1
            while j < len(slots) and slots[j] == slots[j - 1] + 1:
                j += 1
            want = (j - i) * page_bytes
            with _storage_errors(seg.path):
                got = os.preadv(seg.fd, [memoryview(out[i:j]).cast("B")], slots[i] * page_bytes)
                if got != want:
                    raise OSError(errno.EIO, f"page file truncated (read {got:,} of {want:,} bytes)",
                                  str(seg.path))
            i = j
        self.bytes_read += len(slots) * page_bytes
        return out

    def read_pages(self, keys: list):
        """The pages of `keys` as [n, layers, elems] int64 (numpy), each touched in the LRU:
        pages adjacent in a segment are read together."""
        keys = keys if type(keys) is list else list(keys)
        locs = self._index.locs(keys)
        layers, elems = self._page_shape
        out = np.empty((len(keys), layers, elems), dtype=np.int64)
        mask = (1 << _SLOT_BITS) - 1
        i = 0
        while i < len(keys):
            seg_no, j = locs[i] >> _SLOT_BITS, i + 1
            while j < len(keys) and locs[j] >> _SLOT_BITS == seg_no:
                j += 1
            out[i:j] = self._read_slots(self._segments[seg_no], [loc & mask for loc in locs[i:j]])
            i = j
        self._index.touch_all(keys)
        return out

    def read(self, keys: list, num_layers: int, page_elems: int):
        """The pages of `keys` as a fresh [layers, n, elems] CPU tensor."""
        import torch

        if not keys:
            return torch.empty((num_layers, 0, page_elems), dtype=torch.int64)
        assert self._page_shape == (num_layers, page_elems), "storage page geometry differs from the pool's"
        return torch.from_numpy(self.read_pages(keys)).permute(1, 0, 2).contiguous()

    def read_into(self, keys: list, pool, slots: list[int]) -> int:
        """Read the pages of `keys` into `slots` of a [layers, pages, elems] CPU pool buffer (a
        numpy array, or a CPU tensor); returns the bytes read."""
        if not keys:
            return 0
        target = pool if isinstance(pool, np.ndarray) else pool.numpy()
        target[:, np.asarray(slots, dtype=np.int64)] = self.read_pages(keys).transpose(1, 0, 2)
        return len(keys) * self.page_bytes

    def close(self) -> None:
        """Close the segment files (they stay on disk: the run's folder keeps them)."""
        for seg in self._segments.values():
            with contextlib.suppress(OSError):
                os.close(seg.fd)
        self._segments.clear()
        self._active = None
