"""Page content: what a prefill would produce, a deterministic function of the page key, written
into a pool's slots (`write_content`) and checked after a load-back (`verify_content`), so a
slot mix-up or a copy-kernel bug shows as different bytes.

    value(key, layer, col) = (key * golden ratio, wrapping as int64) ^ (layer * 1000003)
                             ^ (col * 2654435761)

`write_content` and `verify_content` are the backend native/cplane.py chose: the compiled ones
(`_c`, generated and compared in place) or numpy's (`_numpy`, the reference).
"""

from __future__ import annotations

import numpy as np

from tierdiag.engine import rows as _rows
from tierdiag.engine.pagepool import PagePool
from tierdiag.native import cplane


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


_c_write_content, _c_verify_content = cplane.compiled("write_content"), cplane.compiled("verify_content")


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


# The backend native/cplane.py chose.
write_content = cplane.choose("content.write_content", write_content_c, write_content_numpy)
verify_content = cplane.choose("content.verify_content", verify_content_c, verify_content_numpy)
