"""Triton page copy: n pages x L layers, scattered source pages -> scattered destination pages,
in one pass (no staging), for both host layouts SGLang uses; the launcher; when to use it.

A pool is handed over as a `[num_layers, num_pages, row]` view whatever its memory layout:

    layer-first  buffer [L, P, E]                      row (l, p) at l * P * E + p * E
    page-first   buffer [P, L, E], passed .permute(1, 0, 2)   row (l, p) at p * L * E + l * E

so a layout is just the view's (layer, page) strides, and one kernel covers layer-first and
page-first on either side, in both directions: load-back reads pinned host memory from the GPU
(a pinned tensor's address is valid on the device), backup writes pinned host memory from it.
One program copies one (page pair, layer, row chunk); rows move as the widest integer that tiles
them (int64 for any row of 8n bytes), so the copy is bit for bit whatever the pool dtype.

`copy_rows(...)` launches it for all layers at once (one launch) or for one layer (the per-layer
variant a load-back uses, so an event can be recorded after each layer). A move inside one pool
whose pages overlap goes through a scratch buffer in two launches (programs run concurrently: a
page read after another program wrote it would be the new bytes).

When: kernels.py's `auto_backend` decides, by the size threshold `tierdiag calibrate` measured on CUDA
(`TRITON_MIN_BYTES`; `set_min_bytes` sets it). Under `TRITON_INTERPRET=1` the same kernel runs on
CPU tensors through Triton's numpy interpreter (what the tests use: slow, a few MB/s). The kernel
is jitted on first use, not at import, so whether it is interpreted follows the environment at
that moment, not at whichever import of this module came first.

triton is optional: `AVAILABLE` is False without it and nothing here is called.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import torch

try:  # torch's CUDA wheels bring triton; CPU installs may not have it
    import triton
    import triton.language as tl

    AVAILABLE = True
    IMPORT_ERROR: str | None = None
except ImportError as exc:  # pragma: no cover - depends on the install
    triton = None
    tl = None
    AVAILABLE = False
    IMPORT_ERROR = f"triton is not installed ({exc})"

# One program moves at most this many bytes of one row (a 2 MiB row is 32 programs), in
# BLOCK-element steps; both are powers of two.
PROGRAM_BYTES = 64 * 1024
BLOCK_BYTES = 8 * 1024

# Below this transfer size the torch path is used even where Triton runs. The default is
# a guess until `tierdiag calibrate` measures the crossover on this GPU (it then calls
# set_min_bytes; `replay` picks it up from the saved profile through kernels.py).
DEFAULT_MIN_BYTES = 64 * 1024
TRITON_MIN_BYTES: int | None = DEFAULT_MIN_BYTES


def set_min_bytes(min_bytes: int | None) -> None:
    """Use Triton for transfers of at least `min_bytes` (None: never)."""
    global TRITON_MIN_BYTES
    TRITON_MIN_BYTES = min_bytes


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _copy_rows_kernel(src, dst, src_idx, dst_idx,
                      src_layer_stride, src_page_stride, dst_layer_stride, dst_page_stride,
                      layer0, row_elems,
                      PROGRAM_ELEMS: tl.constexpr, BLOCK: tl.constexpr):
    pair = tl.program_id(0)
    layer = (tl.program_id(1) + layer0).to(tl.int64)
    start = tl.program_id(2).to(tl.int64) * PROGRAM_ELEMS
    s = tl.load(src_idx + pair).to(tl.int64)
    d = tl.load(dst_idx + pair).to(tl.int64)
    src_row = src + layer * src_layer_stride + s * src_page_stride
    dst_row = dst + layer * dst_layer_stride + d * dst_page_stride
    offs = tl.arange(0, BLOCK)
    for step in range(0, PROGRAM_ELEMS, BLOCK):
        at = start + step + offs
        mask = at < row_elems
        tl.store(dst_row + at, tl.load(src_row + at, mask=mask), mask=mask)


_jitted: dict[bool, Any] = {}


def _kernel():
    mode = interpreting()
    k = _jitted.get(mode)
    if k is None:
        k = _jitted[mode] = triton.jit(_copy_rows_kernel)
    return k


_WIDTHS = ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2))
_SIZE = {torch.int64: 8, torch.int32: 4, torch.int16: 2, torch.uint8: 1}


def _row_dtype(pool: torch.Tensor) -> torch.dtype:
    """The widest integer dtype that tiles every row and stride of the pool exactly."""
    es = pool.element_size()
    row_bytes = pool.shape[2] * es
    s0, s1 = pool.stride(0) * es, pool.stride(1) * es
    offset = pool.storage_offset() * es
    for dtype, size in _WIDTHS:
        if row_bytes % size == 0 and s0 % size == 0 and s1 % size == 0 and offset % size == 0:
            return dtype
    return torch.uint8


def as_rows(pool: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The pool as [L, P, w] of an integer dtype (a view with the same layout)."""
    if pool.dim() != 3 or pool.stride(2) != 1:
        raise ValueError(f"a KV pool view is [num_layers, num_pages, page_elems] with unit-stride rows; "
                         f"got shape {tuple(pool.shape)} strides {pool.stride()}")
    dtype = dtype or _row_dtype(pool)
    if pool.dtype == dtype:
        return pool
    as_bytes = pool if pool.dtype == torch.uint8 else pool.view(torch.uint8)
    return as_bytes if dtype == torch.uint8 else as_bytes.view(dtype)


def _launch(src: torch.Tensor, src_idx: torch.Tensor, dst: torch.Tensor, dst_idx: torch.Tensor,
            layer0: int, num_layers: int) -> None:
    n = int(src_idx.numel())
    row_elems = src.shape[2]
    if n == 0 or num_layers == 0 or row_elems == 0:
        return
    es = src.element_size()
    program_elems = max(1, min(PROGRAM_BYTES // es, triton.next_power_of_2(row_elems)))
    block = min(BLOCK_BYTES // es, program_elems)
    grid = (n, num_layers, triton.cdiv(row_elems, program_elems))
    _kernel()[grid](src, dst, src_idx, dst_idx,
                    src.stride(0), src.stride(1), dst.stride(0), dst.stride(1),
                    layer0, row_elems, PROGRAM_ELEMS=program_elems, BLOCK=block)


def _overlaps(src: torch.Tensor, src_idx: torch.Tensor, dst: torch.Tensor, dst_idx: torch.Tensor) -> bool:
    if src.untyped_storage().data_ptr() != dst.untyped_storage().data_ptr():
        return False
    if src.stride() != dst.stride() or src.storage_offset() != dst.storage_offset():
        return True  # two different views of one buffer: assume the worst
    return bool(torch.isin(src_idx, dst_idx).any())


class Prepared(NamedTuple):
    """A copy's pools as row views of their common integer dtype, and whether it must be staged
    (`prepare`): what every launch of one transfer shares, worked out once (a load-back launches
    once a layer)."""
    src: torch.Tensor
    dst: torch.Tensor
    staged: bool


def prepare(src: torch.Tensor, src_idx: torch.Tensor, dst: torch.Tensor, dst_idx: torch.Tensor) -> Prepared:
    """Check a copy's pools and indices (`copy_rows`' contract) and work out what its launches
    share: the pools as [L, P, w] views of the widest integer dtype that tiles both, and whether
    source and destination pages overlap in one buffer (then each launch goes through a scratch
    buffer). A load-back calls it once and `copy_prepared` once a layer (the per-call checks were
    ~30-90 us of host time a layer, measured on CPU: benchmarks/README.md, GPU check)."""
    if not AVAILABLE:
        raise RuntimeError(IMPORT_ERROR)
    if src.dtype != dst.dtype or src.shape[0] != dst.shape[0] or src.shape[2] != dst.shape[2]:
        raise ValueError(f"pool geometries differ: {tuple(src.shape)} {src.dtype} -> {tuple(dst.shape)} {dst.dtype}")
    if src_idx.numel() != dst_idx.numel():
        raise ValueError(f"copy of {src_idx.numel()} source pages into {dst_idx.numel()} destination pages")
    a, b = _row_dtype(src), _row_dtype(dst)
    dtype = a if _SIZE[a] <= _SIZE[b] else b
    return Prepared(as_rows(src, dtype), as_rows(dst, dtype), _overlaps(src, src_idx, dst, dst_idx))


def copy_prepared(p: Prepared, src_idx: torch.Tensor, dst_idx: torch.Tensor, *, layer: int | None = None) -> None:
    """`copy_rows` of a prepared copy (`prepare`, with the same indices)."""
    s, d = p.src, p.dst
    layer0, num_layers = (0, s.shape[0]) if layer is None else (layer, 1)
    if p.staged:
        # read every source row before writing any: stage through a dense [L, n, w] scratch
        n = int(src_idx.numel())
        scratch = torch.empty((s.shape[0], n, s.shape[2]), dtype=s.dtype, device=s.device)
        dense = torch.arange(n, dtype=torch.int64, device=src_idx.device)
        _launch(s, src_idx, scratch, dense, layer0, num_layers)
        _launch(scratch, dense, d, dst_idx, layer0, num_layers)
        return
    _launch(s, src_idx, d, dst_idx, layer0, num_layers)


def copy_rows(src: torch.Tensor, src_idx: torch.Tensor, dst: torch.Tensor, dst_idx: torch.Tensor,
              *, layer: int | None = None) -> None:
    """dst[l, dst_idx[i]] = src[l, src_idx[i]] for every layer l (or only `layer`).

    `src`/`dst`: [L, P, E] views (layer-first or page-first, see the module doc) of the same
    dtype and row size; the indices are int64 tensors on the device the kernel runs on (the
    GPU; the CPU under the interpreter), destination pages distinct. Asynchronous on CUDA (the
    current stream): the caller records events or synchronizes. Several launches of one
    transfer (a layer each): `prepare` once, then `copy_prepared`.
    """
    copy_prepared(prepare(src, src_idx, dst, dst_idx), src_idx, dst_idx, layer=layer)
