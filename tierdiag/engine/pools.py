"""Pools own slots and buffers (never residency: that is the tree's).

A KV pool buffer is `[num_layers, num_pages, page_elems]` int64, layer-major like SGLang's
layer_first host layout, so one layer's page is one contiguous row and a layer can be
loaded back on its own. The device pool lives on CUDA when there is one; the host pool is
pinned CPU memory then (plain CPU memory otherwise).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tierdiag.engine import kernels
from tierdiag.errors import OutputError


@dataclass(frozen=True)
class DataPlane:
    """The real buffers' geometry, and how it relates to the modelled one."""
    num_layers: int
    page_elems: int  # int64 elements per page per layer
    device: str
    pinned_host: bool
    modelled_page_bytes: int

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
            "scale": self.page_bytes / self.modelled_page_bytes,
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
    return DataPlane(layers, elems, device, pinned_host, modelled_page_bytes)


class PagePool:
    """Slots of one tier. Exact accounting: free + used == capacity, no slot owned twice."""

    def __init__(self, name: str, num_pages: int, plane: DataPlane, *, on_device: bool):
        self.name = name
        self.capacity = num_pages
        # Lowest slot first, so fresh pools hand out contiguous runs (fewer, larger transfers).
        self._free = list(range(num_pages - 1, -1, -1))
        self._used: set[int] = set()  # slots handed out (a set: C-speed checks of whole slot lists)
        shape = (plane.num_layers, num_pages, plane.page_elems)
        if on_device:
            self.buffer = torch.zeros(shape, dtype=torch.int64, device=plane.device)
        else:
            self.buffer = torch.zeros(shape, dtype=torch.int64, pin_memory=plane.pinned_host)
        kernels.register_pool(self.buffer)

    @property
    def free_pages(self) -> int:
        return len(self._free)

    @property
    def used_pages(self) -> int:
        return self.capacity - len(self._free)

    def alloc(self, n: int) -> list[int] | None:
        if n > len(self._free):
            return None
        if n == 0:
            return []
        slots = self._free[-n:]
        del self._free[-n:]
        slots.reverse()
        used = self._used
        assert used.isdisjoint(slots), f"{self.name} slot {min(used.intersection(slots))} handed out twice"
        used.update(slots)
        return slots

    def free(self, slots: list[int]) -> None:
        used = self._used
        if not used.issuperset(slots):
            bad = next(s for s in slots if s not in used)
            raise AssertionError(f"{self.name} slot {bad} freed but not owned (double free?)")
        before = len(used)
        used.difference_update(slots)
        assert before - len(used) == len(slots), f"{self.name}: a slot freed twice in one call"
        self._free.extend(reversed(slots))

    def check(self) -> None:
        assert len(self._used) == self.used_pages, f"{self.name}: owned slots disagree with the free list"
        assert len(set(self._free)) == len(self._free), f"{self.name}: a slot is free twice"
        assert self._used.isdisjoint(self._free), f"{self.name}: a slot is both free and owned"


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


def page_content(keys: list[int], num_layers: int, page_elems: int) -> torch.Tensor:
    """`page_content_np` as a CPU tensor (shares its memory)."""
    return torch.from_numpy(page_content_np(keys, num_layers, page_elems))


def write_content(pool: PagePool, slots: list[int], keys: list[int]) -> None:
    """What a prefill would produce: KV derived from the page keys, into the given slots."""
    if not slots:
        return
    kernels.write_pages(page_content_np(keys, pool.buffer.shape[0], pool.buffer.shape[2]), pool.buffer, slots)


def read_pages(pool: PagePool, slots: list[int]) -> torch.Tensor:
    """The pages in `slots` as a fresh CPU tensor [layers, len(slots), elems]."""
    out = torch.empty((pool.buffer.shape[0], len(slots), pool.buffer.shape[2]), dtype=pool.buffer.dtype)
    kernels.copy_pages(pool.buffer, slots, out, range(len(slots)))
    return out


def verify_content(pool: PagePool, slots: list[int], keys: list[int]) -> bool:
    if not slots:
        return True
    expected = page_content(keys, pool.buffer.shape[0], pool.buffer.shape[2])
    return bool(torch.equal(read_pages(pool, slots), expected))


# --- storage tier: page files on local disk, keyed by chained SHA-256 -----------------------
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


class StorageTier:
    """Page files under `root`, one file a page (`ab/abcdef…`), LRU-deleted past capacity."""

    def __init__(self, root: Path, capacity_pages: int):
        self.root = Path(root)
        with _storage_errors(self.root):
            self.root.mkdir(parents=True, exist_ok=True)
            if not os.access(self.root, os.W_OK | os.X_OK):
                raise PermissionError(errno.EACCES, "Permission denied", str(self.root))
        self.capacity = capacity_pages
        self._index: OrderedDict[str, None] = OrderedDict()

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / key

    def __contains__(self, key: str) -> bool:
        return key in self._index

    @property
    def used_pages(self) -> int:
        return len(self._index)

    def touch(self, key: str) -> None:
        self._index.move_to_end(key)

    def write(self, keys: list[str], rows: torch.Tensor) -> list[str]:
        """Write pages (rows: [layers, n, elems] on CPU). Returns the keys deleted to make room."""
        deleted = []
        data = rows.permute(1, 0, 2).contiguous().numpy()
        for i, key in enumerate(keys):
            if key in self._index:
                self._index.move_to_end(key)
                continue
            while len(self._index) >= self.capacity:
                old, _ = self._index.popitem(last=False)
                self._path(old).unlink(missing_ok=True)
                deleted.append(old)
            path = self._path(key)
            tmp = path.with_suffix(".tmp")
            with _storage_errors(path):
                path.parent.mkdir(exist_ok=True)
                try:
                    tmp.write_bytes(data[i].tobytes())
                    os.replace(tmp, path)
                except BaseException:
                    tmp.unlink(missing_ok=True)  # a full disk must not keep half a page
                    raise
            self._index[key] = None
        return deleted

    def read(self, keys: list[str], num_layers: int, page_elems: int) -> torch.Tensor:
        out = torch.empty((len(keys), num_layers, page_elems), dtype=torch.int64)
        for i, key in enumerate(keys):
            with _storage_errors(self._path(key)):
                raw = self._path(key).read_bytes()
            out[i] = torch.frombuffer(bytearray(raw), dtype=torch.int64).view(num_layers, page_elems)
            self._index.move_to_end(key)
        return out.permute(1, 0, 2).contiguous()

