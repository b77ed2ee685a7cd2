"""PagePool: the slots of one tier and the buffer behind them. Pools own slots and buffers,
never residency (that is the tree's).

A CPU pool's memory is a numpy array, and `buffer` the torch tensor over that same memory
(`torch.from_numpy`, made on first use): every copy, content write and check of a CPU replay
goes through the numpy row view (engine/rows.py), so a CPU replay never imports torch (~1.3 s,
a fifth of a replay's wall time). A CUDA pool, and the pinned host pool beside it, are torch
tensors from the start. The geometry and layout are the data plane's (dataplane.py).
"""

from __future__ import annotations

import mmap
from array import array
from typing import Any

import numpy as np

from tierdiag.engine import rows as _rows
from tierdiag.engine.dataplane import DataPlane
from tierdiag.native import cplane


# Frees of up to this many slots take the Python path (PagePool._free_small).
_SMALL_FREE = 8
# alloc's runs are slices of a zero run this long (a longer one is made by repetition)
_RUN_TEMPLATE = 4096
# On the compiled data plane PagePool's base is _cplane.SlotCore: it holds the stack, the owned
# bytes and the runs' template (bound in __init__) and the free count (`free_pages`, a property of
# the base), and its `_alloc_c` / `_free_c` are the pool's alloc and free in one C call each: the
# compiled engine calls them ~16 times a request, and an interpreted wrapper frame plus two buffer
# exports a call was most of their cost (issue 41, session 19). What they decline goes, with the
# same argument, to `_alloc_numpy` / `_free_numpy` below (the reference). On the numpy data plane
# the base is a plain class and `free_pages` an ordinary attribute.
_SlotCore = cplane.compiled("SlotCore")


# A CPU pool's array starts at a 2 MiB boundary and its whole 2 MiB chunks are madvised as huge
# pages (transparent huge pages, where the kernel offers them on request): a replay writes every
# slot's content, so the pool's pages are all touched, one fault each. At --dp 8 the 16 pools'
# arrays (8 x 3.1 MiB device, 8 x 6.3 MiB host, the conversation trace) faulted ~10 k pages: a
# fifth of the engine's minor faults, ~2-6 us of system CPU each on this VM (issue 41, session
# 37). numpy's own hint (arrays >= 4 MiB) covers only the aligned part inside its heap block.
# The tail past the last whole chunk stays in 4 KiB pages: no page beyond the array is touched.
_HUGE = 2 << 20


def _zeros(shape: tuple[int, int, int]) -> np.ndarray:
    """np.zeros(shape, int64), in an anonymous mapping 2 MiB aligned, its whole 2 MiB chunks
    MADV_HUGEPAGE; np.zeros itself where smaller than a chunk or the platform has no such hint."""
    nbytes = shape[0] * shape[1] * shape[2] * 8
    if nbytes < _HUGE or not hasattr(mmap, "MADV_HUGEPAGE"):
        return np.zeros(shape, dtype=np.int64)
    mem = mmap.mmap(-1, nbytes + _HUGE, flags=mmap.MAP_PRIVATE)  # zero pages, none touched
    raw = np.frombuffer(mem, dtype=np.uint8)
    off = -raw.ctypes.data % _HUGE
    try:
        mem.madvise(mmap.MADV_HUGEPAGE, off, nbytes // _HUGE * _HUGE)
    except OSError:  # a kernel built without transparent huge pages (EINVAL): plain pages
        return np.zeros(shape, dtype=np.int64)
    return raw[off:off + nbytes].view(np.int64).reshape(shape)


class _PySlots:
    """PagePool's base on the numpy data plane: nothing (free_pages is an instance attribute)."""


class PagePool(_SlotCore or _PySlots):  # type: ignore[misc]
    """Slots of one tier. Exact accounting: free + used == capacity, no slot owned twice.

    The free slots are a stack (an int array, top at `free_pages`): `free` pushes a list reversed and
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
        # _stack[:free_pages] are the free slots. A plain attribute, not a property over a
        # private one: the compiled engine reads it ~30 times a request (eviction loops, decode
        # room), and a property is a call into an interpreted frame each time (issue 41).
        self.free_pages = num_pages
        self._owned_bytes = bytearray(num_pages)  # 1: handed out (Python indexes it fast) ...
        self._owned = np.frombuffer(self._owned_bytes, dtype=np.uint8)  # ... numpy the same bytes
        # alloc hands out slot runs, array('q') (tree_node.SlotRun): the compiled one slices this
        # zero run and writes the slots into the slice (no int object a page; session 21)
        self._ints = array("q")
        self._ints.frombytes(bytes(8 * max(1, min(num_pages, _RUN_TEMPLATE))))
        if _SlotCore is not None:
            self._bind(self._stack, self._owned_bytes, self._ints)
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
            self.array = _zeros((num_pages, plane.num_layers, plane.page_elems)).transpose(1, 0, 2)
            self.rows = _rows.array_rows(self.array, page_first=True)  # [1, P]: a page's layers are one item
        else:
            self.array = _zeros(shape)
            self.rows = _rows.array_rows(self.array, page_first=False)
        # Geometry kept as plain ints.
        self.num_layers, self.page_elems = plane.num_layers, plane.page_elems
        self.page_bytes = plane.num_layers * plane.page_elems * 8  # data plane (int64)

    def __getstate__(self) -> dict:
        """copy / pickle: the instance's attributes and the free count (on the compiled data
        plane the count lives in the C base, not in __dict__)."""
        return {**self.__dict__, "free_pages": self.free_pages}

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        free = state.pop("free_pages")
        self.__dict__.update(state)
        self.free_pages = free
        # views are copied as arrays of their own: made again over the copy's memory
        self._owned = np.frombuffer(self._owned_bytes, dtype=np.uint8)
        if self._tensor is None and self.array is not None:
            if self.page_major and not self.array.transpose(1, 0, 2).flags.c_contiguous:  # pickle made it C-order
                self.array = np.ascontiguousarray(self.array.transpose(1, 0, 2)).transpose(1, 0, 2)
            self.rows = _rows.array_rows(self.array, page_first=self.page_major)
        if _SlotCore is not None:  # the copy's own stack and bytes, bound again
            self._bind(self._stack, self._owned_bytes, self._ints)

    @property
    def buffer(self) -> Any:
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
    def used_pages(self) -> int:
        return self.capacity - self.free_pages

    def _alloc_numpy(self, n: int) -> Any:
        top = self.free_pages
        if n > top:
            return None
        if n <= 0:
            if n < 0:
                raise ValueError(f"{self.name}: alloc of {n} pages")
            return array("q")
        slots = self._stack[top - n:top][::-1]
        # No ownership check: a slot reaches the stack only from __init__ or a free that proved
        # it owned and unique, so the stack never holds an owned slot (check() verifies).
        self._owned[slots] = 1
        self.free_pages = top - n
        out = array("q")
        out.frombytes(slots.astype(np.int64).tobytes())
        return out

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
        top = self.free_pages
        self._stack[top:top + n] = idx[::-1]
        self.free_pages = top + n

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
        top = self.free_pages
        self._stack[top:top + n] = slots[::-1]
        self.free_pages = top + n

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

    # The compiled side (SlotCore's methods; None on the numpy data plane) and the backend
    # native/cplane.py chose; both hand out the same slots in the same order.
    _alloc_c = None if _SlotCore is None else _SlotCore._alloc_c
    _free_c = None if _SlotCore is None else _SlotCore._free_c
    alloc = cplane.choose("pagepool.PagePool.alloc", _alloc_c, _alloc_numpy)
    free = cplane.choose("pagepool.PagePool.free", _free_c, _free_numpy)

    def check(self) -> None:
        free = self._stack[:self.free_pages]
        assert int(np.count_nonzero(self._owned)) == self.used_pages, \
            f"{self.name}: owned slots disagree with the free list"
        assert np.unique(free).size == free.size, f"{self.name}: a slot is free twice"
        assert not self._owned[free].any(), f"{self.name}: a slot is both free and owned"
