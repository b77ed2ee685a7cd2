"""Page copy kernels: move whole pages between KV pools (load-back, backup, same-tier moves).

The torch backend's entry points and CPU path; its tensor planning and CUDA execution are in
kernels_cuda.py (imported here, never the other way), the Triton backend in kernels_triton.py.

A pool is `[num_layers, num_pages, page_elems]`, layer-major, so one layer's page is one
contiguous row and a transfer of n pages is n rows in every layer:

    pool[layer]:  | page 0 | page 1 | page 2 | page 3 | ...      one row = page_elems elements
    src_pages = [7, 8, 9, 2]   dst_pages = [0, 1, 2, 5]
                 └─run─┘  ·                 └─run─┘  ·      -> 2 runs consecutive on both sides

A page-first host pool (SGLang's `page_first`: a `[P, L, E]` buffer) is passed as
`buffer.permute(1, 0, 2)`: same indexing, other strides (`pool_layout` tells them apart).

Backends (one file each): this module's torch/numpy path, and the Triton kernel in
kernels_triton.py, chosen per transfer by `_choose_backend` (Triton on CUDA when installed, the
host pool pinned and the transfer at least the size `tierdiag calibrate` measured; never on a
CPU-only machine; `backend=` forces one).

torch path: every call is planned first (`plan_copy`), then executed with as few ops as the
layout allows; the cheapest of:
- `runs`:      pairs consecutive on both sides become slice copies, one op per run (all layers);
- `gather`:    destination consecutive (per dst run): one gather straight into the slice;
- `scatter`:   source consecutive (per src run): one scatter straight from the slice;
- `two_pass`:  both sides scattered: gather into a cache-sized scratch buffer, scatter, repeat.
The choice is a small cost model (`_OP_COST_BYTES`: what one op's fixed overhead is worth in
bytes moved), because a 64-byte page and a 64 KiB page want different plans. Transfers up to
1 MiB skip the planner (`_copy_direct`).

CPU: rows move as numpy items of one row each (`np.take`/`np.put`/`np.copyto`: one memcpy a
row, any dtype, on the calling thread; see `_np_rows`); tiny transfers are two torch ops.

CUDA: see kernels_cuda.py (side stream, pinned staging, one event per layer of a load-back).

torch is imported here at module level: this module is only imported by engine code paths that
have tensors (CUDA pools, calibrate, the tests' tensor pools); a CPU replay needs only rows.py.
"""

from __future__ import annotations

import ctypes
import time
import weakref

import numpy as np
import torch

from tierdiag.engine import rows as _rows
# The numpy side (row moves, the planner) lives in rows.py, which imports no torch; what the
# tensor paths here use of it, and copy_rows for callers of this module. Module constants are
# read through `_rows` (tests patch them there).
from tierdiag.engine.rows import (  # noqa: F401 - copy_rows, PlanKind re-exported
    CopyPlan, PageList, PlanKind, _as_index_array, _check_range, _execute_rows, _move_rows, copy_rows, count_runs,
    plan_copy, write_rows)
# The tensor side and the CUDA execution (LoadBackHandle is this module's API too).
from tierdiag.engine.kernels_cuda import (  # noqa: F401 - LoadBackHandle re-exported
    LoadBackHandle, _SideStreams, _check_pair, _cuda_device, _finish_staged, _is_cuda, _plan_for, _start_cuda,
    _wide_rows)

# --- CPU execution: numpy row moves ---------------------------------------------------------------
# On the CPU every plan runs as numpy moves of whole rows: a [L, P, E] pool is seen as an
# [L, P] array of opaque row-sized items, so a gather (`np.take`), a scatter (`np.put`) and a
# slice copy (`np.copyto`) move each row with one memcpy/memmove, whatever the dtype (bfloat16
# and fp8 too: the bytes are never interpreted). numpy runs them on the calling thread: torch's
# parallel copies must wake a second thread, which on a busy machine can take milliseconds.
# Row views of the pools (`register_pool`), built once: id -> (signature, [L, P] rows). The
# view is made over the tensor's memory without a reference to the tensor (a reference would
# keep every pool of every engine a process ever made alive); the entry goes when the tensor
# does, and a tensor whose memory or geometry changed is viewed afresh.
_ROWS: dict[int, tuple[tuple, np.ndarray]] = {}


def _signature(pool: torch.Tensor) -> tuple:
    return (pool.data_ptr(), pool.shape, pool.stride(), pool.dtype)


def register_pool(pool: torch.Tensor) -> np.ndarray | None:
    """Keep the row view of a long-lived contiguous CPU pool buffer (the engine's pools), so
    each of its many small copies skips building one (~2 us a side). Returns an [L, P] row view
    for the caller (the handle `copy_rows` and `write_rows` take; unlike the registry's, it keeps
    the tensor alive), or None for a pool the numpy path cannot move (CUDA, not contiguous,
    empty): its copies go through `copy_pages`."""
    if pool.is_cuda or pool.dim() != 3 or not pool.is_contiguous() or pool.numel() == 0:
        return None
    rows = _np_rows_uncached(pool)
    raw = (ctypes.c_char * (pool.numel() * pool.element_size())).from_address(pool.data_ptr())
    _ROWS[id(pool)] = (_signature(pool), np.frombuffer(raw, dtype=rows.dtype).reshape(rows.shape))
    weakref.finalize(pool, _ROWS.pop, id(pool), None)
    return rows


def _np_rows(pool: torch.Tensor) -> np.ndarray:
    """A contiguous CPU [L, P, E] pool as an [L, P] numpy array of row items (a view)."""
    hit = _ROWS.get(id(pool))
    if hit is not None and hit[0] == _signature(pool):
        return hit[1]
    return _np_rows_uncached(pool)


def pool_rows(pool: torch.Tensor) -> np.ndarray:
    """A contiguous CPU [L, P, E] pool as its [L, P] numpy row-item view (the registered one
    when there is one); a pool that is not gets the error a copy of it would."""
    if pool.is_cuda or pool.dim() != 3 or not pool.is_contiguous():
        raise ValueError(f"a CPU row view needs a contiguous CPU [num_layers, num_pages, page_elems] pool; "
                         f"got {tuple(pool.shape)} on {pool.device}")
    return _np_rows(pool)


def _np_rows_uncached(pool: torch.Tensor) -> np.ndarray:
    as_bytes = pool if pool.dtype == torch.uint8 else pool.view(torch.uint8)
    row_bytes = pool.shape[2] * pool.element_size()
    return as_bytes.numpy().view(np.dtype((np.void, row_bytes))).reshape(pool.shape[0], pool.shape[1])


def _execute_cpu(src: torch.Tensor, dst: torch.Tensor, plan: CopyPlan) -> None:
    """Execute a plan between two contiguous CPU pools, all layers. Scattered pages on either
    side go by the compiled move where there is one (rows.py's `compiled_move`: each row memcpy'd
    straight from its source page to its destination page, one pass over memory), else by
    numpy (`_execute_rows`: gather into an L2-sized scratch, scatter from it). The compiled
    move takes 4,096 scattered 16 KiB pages at ~2x the numpy path's rate (benchmarks/README.md,
    issue 41); a move inside one pool whose pages overlap (`snapshot`) stays on numpy, which
    reads every row before writing any, and the compiled move declines what it does not take
    (nothing moved), which numpy then moves."""
    sv, dv = _np_rows(src), _np_rows(dst)
    move = _rows.compiled_move
    if (move is not None and plan.kind.indexed and not plan.snapshot
            and move(sv, plan.src_idx, dv, plan.dst_idx) >= 0):
        return
    _execute_rows(sv, dv, plan)


def _copy_direct(src: torch.Tensor, src_pages: PageList, dst: torch.Tensor, dst_pages: PageList) -> bool:
    """CPU, no plan: one numpy gather and fancy-indexed store of row items (each [L, P, E] pool
    seen as [L, P] rows of page_elems bytes, so every row is one memcpy, a slice copy where a
    side is a range). False when the plan is worth making (big transfers, a move inside one
    pool, a pool that is not a contiguous layer-first buffer).

    The engine's copies are mostly this size (a request's prefill output, a node's backup, a
    short load-back): at a few to a few hundred 1 KiB pages the fixed costs are the whole cost,
    ~6-17 us here for 16-100 pages against ~15-35 us for torch's index_select + index_copy_."""
    n = len(src_pages)
    if n != len(dst_pages) or src.dim() != 3 or dst.dim() != 3:
        return False
    if n * src.shape[0] * src.shape[2] * src.element_size() > _rows._DIRECT_MAX_BYTES:
        return False
    if n == 0:
        return True
    if src.data_ptr() == dst.data_ptr() or not (src.is_contiguous() and dst.is_contiguous()):
        return False  # the planner stages aliasing moves and names a non-contiguous pool
    _check_pair(src, dst)
    _move_rows(_np_rows(src), src_pages, _np_rows(dst), dst_pages)
    return True



def _copy_compiled(src: torch.Tensor, src_pages: PageList, dst: torch.Tensor, dst_pages: PageList) -> bool:
    """CPU, no plan: the compiled move (rows.py's `compiled_move`) straight from the page lists,
    as the engine's CPU copies go (rows.copy_rows_c). The plan would only choose among numpy's
    ways of moving the same rows (and reorder the pairs to find runs), which the compiled move
    does not use: past 1 MiB it streams four rows at a time whatever their order (pages.c), and
    planning 256 scattered pages cost ~60 us, a sixth of copying their 4 MiB. False, having moved
    nothing, where there is no compiled move or it declines (a page outside a pool, one pool
    into itself, lengths or geometries that differ, pages given as a tensor): the planner then
    moves the pages or raises its message."""
    move = _rows.compiled_move
    if (move is None or src.dim() != 3 or dst.dim() != 3 or not (src.is_contiguous() and dst.is_contiguous())):
        return False
    _check_pair(src, dst)
    return move(_np_rows(src), src_pages, _np_rows(dst), dst_pages) >= 0

# --- layouts, backends --------------------------------------------------------------------------
LAYER_FIRST = "layer_first"  # buffer [L, P, E]: one layer's pages are consecutive rows
PAGE_FIRST = "page_first"    # buffer [P, L, E], passed as buffer.permute(1, 0, 2): a page's layers are adjacent
BACKENDS = ("torch", "triton")


def pool_layout(pool: torch.Tensor) -> str:
    """Which host layout a [L, P, E] pool view has: layer-first (a contiguous buffer) or
    page-first (a contiguous [P, L, E] buffer seen through .permute(1, 0, 2))."""
    if pool.dim() != 3:
        raise ValueError(f"a KV pool is [num_layers, num_pages, page_elems]; got shape {tuple(pool.shape)}")
    if pool.is_contiguous():
        return LAYER_FIRST
    if pool.permute(1, 0, 2).is_contiguous():
        return PAGE_FIRST
    raise ValueError("KV pool must be contiguous (a pool buffer, not a slice of one), layer-first [L, P, E] "
                     "or page-first [P, L, E] seen as .permute(1, 0, 2)")


def _triton_module():
    """kernels_triton, imported on first need (importing triton costs a second on a CPU box)."""
    from tierdiag.engine import kernels_triton

    return kernels_triton


_profile_threshold_loaded = False


def _load_profile_threshold(device: torch.device) -> None:
    """Once per process: the Triton threshold `tierdiag calibrate` measured on this GPU, from
    the saved default profile (a profile of another device or without one keeps the default)."""
    global _profile_threshold_loaded
    if _profile_threshold_loaded:
        return
    _profile_threshold_loaded = True
    import json
    import os
    from pathlib import Path

    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    path = Path(base) / "tierdiag" / "profile.json"
    try:
        profile = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if "triton_min_bytes" in profile and profile.get("device") == f"cuda: {torch.cuda.get_device_name(device)}":
        _triton_module().set_min_bytes(profile["triton_min_bytes"])


def _nbytes(src: torch.Tensor, num_pages: int) -> int:
    return num_pages * src.shape[0] * src.shape[2] * src.element_size()


# A transfer whose pages form at most this many runs on the two sides together is a handful of
# DMA copies (cudaMemcpyAsync of whole runs, the link's ceiling): the torch path keeps it.
_DMA_MAX_RUNS = 5


def auto_backend(*, host_pinned: bool, num_bytes: int, runs, triton_min_bytes: int | None) -> str:
    """The automatic choice on CUDA (`runs`: a callable, counted only when it matters)."""
    if not host_pinned or triton_min_bytes is None or num_bytes < triton_min_bytes:
        return "torch"
    return "torch" if runs() <= _DMA_MAX_RUNS else "triton"


def _choose_backend(src: torch.Tensor, dst: torch.Tensor, num_pages: int, backend: str | None,
                    src_pages: PageList = (), dst_pages: PageList = ()) -> str:
    """"torch" or "triton" for this transfer. Auto (None): Triton on CUDA when it is installed,
    the host side is pinned (the GPU reads/writes it directly), the pages are scattered (not a
    few runs a DMA copies whole) and the transfer is at least the measured threshold; the torch
    path everywhere else (always on a CPU-only machine)."""
    if backend not in (None,) + BACKENDS:
        raise ValueError(f"unknown copy backend {backend!r}; known: {', '.join(BACKENDS)}")
    cuda = _is_cuda(src) or _is_cuda(dst)
    if backend == "torch" or (backend is None and not cuda):
        return "torch"
    if backend is None:
        try:
            kt = _triton_module()
        except ImportError:
            return "torch"
        _load_profile_threshold(_cuda_device(src, dst))
        host_ok = all(t.is_cuda or t.is_pinned() for t in (src, dst))
        return auto_backend(host_pinned=host_ok, num_bytes=_nbytes(src, num_pages),
                            runs=lambda: count_runs(src_pages) + count_runs(dst_pages),
                            triton_min_bytes=kt.TRITON_MIN_BYTES if kt.AVAILABLE else None)
    kt = _triton_module()
    if not kt.AVAILABLE:
        raise RuntimeError(f"copy backend 'triton': {kt.IMPORT_ERROR}")
    if not cuda and not kt.interpreting():
        raise RuntimeError("copy backend 'triton' on CPU tensors needs TRITON_INTERPRET=1 (Triton's interpreter)")
    if cuda and not all(t.is_cuda or t.is_pinned() for t in (src, dst)):
        raise RuntimeError("copy backend 'triton': host pool must be pinned (the GPU accesses it directly)")
    return "triton"


def _index_pair(src_pages: PageList, dst_pages: PageList, src_num_pages: int, dst_num_pages: int) -> np.ndarray:
    """The pages of a Triton copy as one [2, n] int64 array (row 0 the sources, row 1 the
    destinations), range-checked as `plan_copy` checks them. The kernel takes the pairs in any
    order, so no plan is chosen (the torch path's `plan_copy` weighs three orders of the pairs:
    ~100 us of host time for 16 pages, measured on CPU), and both rows go to the GPU in one
    upload."""
    n = len(src_pages)
    if n != len(dst_pages):
        raise ValueError(f"copy of {n} source pages into {len(dst_pages)} destination pages")
    idx = np.empty((2, n), dtype=np.int64)
    idx[0] = _as_index_array(src_pages)
    idx[1] = _as_index_array(dst_pages)
    _check_range(idx[0], src_num_pages, "source")
    _check_range(idx[1], dst_num_pages, "destination")
    return idx


def _run_triton(src: torch.Tensor, src_pages: PageList, dst: torch.Tensor, dst_pages: PageList,
                *, per_layer_events: bool) -> LoadBackHandle:
    """One-pass copy by the Triton kernel: one launch for all layers, or one per layer with an
    event after each (load-back). CUDA: on the side stream, returns at once; CPU (interpreter):
    done on return. What the launches share (the pools' row views, the overlap check) is worked
    out once (`kernels_triton.prepare`), not once a layer."""
    kt = _triton_module()
    pool_layout(src), pool_layout(dst)
    _check_pair(src, dst)
    pages = _index_pair(src_pages, dst_pages, src.shape[1], dst.shape[1])
    n = pages.shape[1]
    num_bytes = _nbytes(src, n)
    layers = range(src.shape[0]) if per_layer_events else (None,)
    if not (_is_cuda(src) or _is_cuda(dst)):
        t0 = time.perf_counter_ns()
        if n:
            idx = torch.from_numpy(pages)
            s_t, d_t = idx[0], idx[1]
            prep = kt.prepare(src, s_t, dst, d_t)
            for layer in layers:
                kt.copy_prepared(prep, s_t, d_t, layer=layer)
        return LoadBackHandle(n, num_bytes, "triton", wall_ns=time.perf_counter_ns() - t0)
    device = _cuda_device(src, dst)
    stream = _SideStreams.get(device)
    handle = LoadBackHandle(n, num_bytes, "triton", stream=stream)
    handle.start_event = torch.cuda.Event(enable_timing=True)
    handle.end_event = torch.cuda.Event(enable_timing=True)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.device(device), torch.cuda.stream(stream):
        handle.start_event.record(stream)
        prep = None
        if n:
            idx = torch.from_numpy(pages).to(device)
            s_t, d_t = idx[0], idx[1]
            prep = kt.prepare(src, s_t, dst, d_t)
        for layer in layers:
            if prep is not None:
                kt.copy_prepared(prep, s_t, d_t, layer=layer)
            if per_layer_events:
                ev = torch.cuda.Event()
                ev.record(stream)
                handle.layer_events.append(ev)
        handle.end_event.record(stream)
    return handle


def _copy_generic(src: torch.Tensor, src_pages: PageList, dst: torch.Tensor, dst_pages: PageList) -> int:
    """torch path for page-first pools (any device): one index_select, one move, one index_copy_.
    The gather makes a copy first, so a move inside one pool reads before it writes."""
    pool_layout(src), pool_layout(dst)
    _check_pair(src, dst)
    plan = plan_copy(src_pages, dst_pages, column_bytes=src.shape[0] * src.shape[2] * src.element_size(),
                     src_num_pages=src.shape[1], dst_num_pages=dst.shape[1])
    if plan.num_pages:
        rows = src.index_select(1, torch.from_numpy(plan.src_idx).to(src.device))
        dst.index_copy_(1, torch.from_numpy(plan.dst_idx).to(dst.device), rows.to(dst.device))
        if _is_cuda(src) or _is_cuda(dst):
            torch.cuda.synchronize(_cuda_device(src, dst))
    return plan.num_pages


def _layer_first_both(src: torch.Tensor, dst: torch.Tensor) -> bool:
    return pool_layout(src) == LAYER_FIRST and pool_layout(dst) == LAYER_FIRST


# --- public API --------------------------------------------------------------------------------
def copy_pages(src: torch.Tensor, src_pages: PageList, dst: torch.Tensor, dst_pages: PageList,
               *, backend: str | None = None) -> int:
    """Copy whole pages src[:, src_pages[i]] -> dst[:, dst_pages[i]] for all layers.

    Returns the measured wall time in ns; the copy is complete when this returns (on CUDA it is
    issued on the side stream and synchronized). Destination pages must be distinct. Pools are
    [L, P, E] views, layer-first or page-first (`pool_layout`). `backend`: None picks (see
    `_choose_backend`), "torch" or "triton" forces one.
    """
    t0 = time.perf_counter_ns()
    if backend in (None, "torch") and not (src.is_cuda or dst.is_cuda) and (
            _copy_direct(src, src_pages, dst, dst_pages) or _copy_compiled(src, src_pages, dst, dst_pages)):
        return time.perf_counter_ns() - t0  # the CPU's common case, before any dispatch
    if _choose_backend(src, dst, len(src_pages), backend, src_pages, dst_pages) == "triton":
        handle = _run_triton(src, src_pages, dst, dst_pages, per_layer_events=False)
        handle.wait()
        return time.perf_counter_ns() - t0
    if not _layer_first_both(src, dst):
        _copy_generic(src, src_pages, dst, dst_pages)
        return time.perf_counter_ns() - t0
    if not (_is_cuda(src) or _is_cuda(dst)):
        if _copy_direct(src, src_pages, dst, dst_pages):
            return time.perf_counter_ns() - t0
        _execute_cpu(src, dst, _plan_for(src, src_pages, dst, dst_pages))
        return time.perf_counter_ns() - t0
    handle, staged, plan = _start_cuda(src, dst, src_pages, dst_pages, per_layer_events=False)
    handle.end_event.synchronize()
    # staged rows are in the plan's order (pairs may have been sorted), not the caller's
    _finish_staged(_wide_rows(dst), plan.dst_idx, staged)
    return time.perf_counter_ns() - t0


def write_pages(data: np.ndarray, dst: torch.Tensor, dst_pages: PageList) -> int:
    """Write `data` ([L, n, E], a CPU staging buffer: a prefill's output) into pages `dst_pages`
    of a pool; returns the wall ns. On the CPU one numpy move of rows straight from the buffer
    (no tensor wrapped around it); elsewhere `copy_pages` from it."""
    t0 = time.perf_counter_ns()
    n = len(dst_pages)
    if (not dst.is_cuda and dst.dim() == 3 and dst.is_contiguous() and data.ndim == 3 and data.shape[1] == n
            and data.shape[0] == dst.shape[0] and data.shape[2] == dst.shape[2] and data.flags.c_contiguous
            and data.itemsize == dst.element_size()):  # rows move as opaque bytes, like every CPU copy
        if n:
            rows = data.view(np.dtype((np.void, data.shape[2] * data.itemsize))).reshape(data.shape[0], n)
            write_rows(rows, _np_rows(dst), dst_pages)
        return time.perf_counter_ns() - t0
    copy_pages(torch.from_numpy(np.ascontiguousarray(data)), range(n), dst, dst_pages)
    return time.perf_counter_ns() - t0


def load_back(host: torch.Tensor, host_pages: PageList, device: torch.Tensor,
              device_pages: PageList, *, backend: str | None = None) -> LoadBackHandle:
    """Host -> device, layer by layer. On CUDA returns at once with one event per layer
    (`handle.wait()` blocks and returns the wall ns); on CPU the copy is done on return.
    `handle.plan_kind` names the path taken ("direct", "compiled", a plan kind, "triton" or
    "generic")."""
    if backend in (None, "torch") and not (host.is_cuda or device.is_cuda):
        t0 = time.perf_counter_ns()
        if _copy_direct(host, host_pages, device, device_pages):
            return LoadBackHandle(len(host_pages), _nbytes(host, len(host_pages)), "direct",
                                  wall_ns=time.perf_counter_ns() - t0)
        if _copy_compiled(host, host_pages, device, device_pages):
            return LoadBackHandle(len(host_pages), _nbytes(host, len(host_pages)), "compiled",
                                  wall_ns=time.perf_counter_ns() - t0)
    if _choose_backend(host, device, len(host_pages), backend, host_pages, device_pages) == "triton":
        return _run_triton(host, host_pages, device, device_pages, per_layer_events=True)
    if not _layer_first_both(host, device):
        t0 = time.perf_counter_ns()
        n = _copy_generic(host, host_pages, device, device_pages)
        return LoadBackHandle(n, _nbytes(host, n), "generic", wall_ns=time.perf_counter_ns() - t0)
    if not _is_cuda(device):
        t0 = time.perf_counter_ns()
        if _copy_direct(host, host_pages, device, device_pages):
            return LoadBackHandle(len(host_pages), _nbytes(host, len(host_pages)), "direct",
                                  wall_ns=time.perf_counter_ns() - t0)
        plan = _plan_for(host, host_pages, device, device_pages)
        _execute_cpu(host, device, plan)
        return LoadBackHandle(plan.num_pages, _nbytes(host, plan.num_pages), plan.kind,
                              wall_ns=time.perf_counter_ns() - t0)
    handle, staged, _plan = _start_cuda(host, device, host_pages, device_pages, per_layer_events=True)
    assert not staged, "load-back lands on the device: nothing is staged on the host side"
    return handle


def backup(device: torch.Tensor, device_pages: PageList, host: torch.Tensor, host_pages: PageList,
           *, backend: str | None = None) -> int:
    """Device -> host; returns the wall ns once the pages are on the host."""
    return copy_pages(device, device_pages, host, host_pages, backend=backend)
