"""The torch path's tensor side: a pair of pools planned as tensors (`_plan_for`), and the CUDA
execution of a plan: the side stream, staged host<->device copies, load-back handles with one
event per layer. kernels.py, the torch backend's entry points, imports this; this imports
nothing of kernels.py (rows.py holds the plans, numpy only).

CUDA: copies are issued on a dedicated side stream (which first waits for the current stream,
so it sees the KV the prefill wrote), host memory is pinned, host<->device copies are
`non_blocking`, and load-back records one `torch.cuda.Event` per layer so a prefill can start
on layer 0 while later layers are still in flight. The torch path gathers scattered host pages
into a pinned staging buffer by the CPU (torch's caching host allocator keeps a staging block
alive until the copy that reads it has completed), then scatters on the device; the Triton
path (kernels_triton.py) reads the scattered host pages from the GPU in one pass, one launch
per layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from tierdiag.engine.rows import CopyPlan, PageList, PlanKind, _runs_of, count_runs, plan_copy, within_one_pool

# The two-pass path stages at most this much at a time (bounds the scratch memory; CUDA).
_SCRATCH_MAX_BYTES = 32 * 1024 * 1024


# --- a pair of tensor pools, planned ------------------------------------------------------------
def _wide_rows(pool: torch.Tensor) -> torch.Tensor:
    """The pool as [L, P, w] of the widest element type that tiles a row exactly (a view)."""
    if pool.dim() != 3:
        raise ValueError(f"a KV pool is [num_layers, num_pages, page_elems]; got shape {tuple(pool.shape)}")
    if not pool.is_contiguous():
        raise ValueError("KV pool must be contiguous (a pool buffer, not a slice of one)")
    row_bytes = pool.shape[2] * pool.element_size()
    offset_bytes = pool.storage_offset() * pool.element_size()
    as_bytes = pool if pool.dtype == torch.uint8 else pool.view(torch.uint8)
    for dtype, size in ((torch.complex128, 16), (torch.int64, 8), (torch.int32, 4), (torch.int16, 2)):
        if row_bytes % size == 0 and offset_bytes % size == 0:
            return as_bytes.view(dtype)
    return as_bytes


def _check_pair(src: torch.Tensor, dst: torch.Tensor) -> None:
    if src.dtype != dst.dtype:
        raise ValueError(f"pool dtypes differ: {src.dtype} -> {dst.dtype}")
    if src.dim() != 3 or dst.dim() != 3 or src.shape[0] != dst.shape[0] or src.shape[2] != dst.shape[2]:
        raise ValueError(f"pool geometries differ: {tuple(src.shape)} -> {tuple(dst.shape)} "
                         "(need the same num_layers and page_elems)")


def _plan_for(src: torch.Tensor, src_pages: PageList, dst: torch.Tensor, dst_pages: PageList) -> CopyPlan:
    _check_pair(src, dst)
    column_bytes = src.shape[0] * src.shape[2] * src.element_size()
    plan = plan_copy(src_pages, dst_pages, column_bytes=column_bytes,
                     src_num_pages=src.shape[1], dst_num_pages=dst.shape[1])
    if plan.num_pages and src.device == dst.device and src.data_ptr() == dst.data_ptr():
        return within_one_pool(plan)
    return plan


_scratch: dict[tuple[torch.dtype, str], torch.Tensor] = {}


def _scratch_rows(rows: int, like: torch.Tensor) -> torch.Tensor:
    """A reused [rows, w] buffer: a fresh large allocation would page-fault on every call."""
    key = (like.dtype, str(like.device))
    width = like.shape[-1]
    buf = _scratch.get(key)
    if buf is None or buf.numel() < rows * width:
        buf = torch.empty(rows * width, dtype=like.dtype, device=like.device)
        _scratch[key] = buf
    return buf[: rows * width].view(rows, width)


def _same_empty(src: torch.Tensor, dst: torch.Tensor, plan: CopyPlan) -> None:
    return None


def _same_runs(src: torch.Tensor, dst: torch.Tensor, plan: CopyPlan) -> None:
    for s0, d0, n in plan.runs:
        dst[:, d0:d0 + n].copy_(src[:, s0:s0 + n])


def _same_gather(src: torch.Tensor, dst: torch.Tensor, plan: CopyPlan) -> None:
    s_t = torch.from_numpy(plan.src_idx).to(src.device)
    for pos, d0, n in _runs_of(plan.dst_idx):
        torch.index_select(src, 1, s_t[pos:pos + n], out=dst[:, d0:d0 + n])


def _same_scatter(src: torch.Tensor, dst: torch.Tensor, plan: CopyPlan) -> None:
    d_t = torch.from_numpy(plan.dst_idx).to(src.device)
    for pos, s0, n in _runs_of(plan.src_idx):
        dst.index_copy_(1, d_t[pos:pos + n], src[:, s0:s0 + n])


def _same_two_pass(src: torch.Tensor, dst: torch.Tensor, plan: CopyPlan) -> None:
    """Flatten to [L * P, w] rows, stage through scratch."""
    device = src.device
    num_layers = src.shape[0]
    s_t = torch.from_numpy(plan.src_idx).to(device)
    d_t = torch.from_numpy(plan.dst_idx).to(device)
    src_pages = src.shape[1]
    src_flat = src.reshape(num_layers * src_pages, src.shape[2])
    dst_flat = dst.reshape(num_layers * dst.shape[1], dst.shape[2])
    layer = torch.arange(num_layers, device=device, dtype=torch.int64).unsqueeze(1)
    fs = (layer * src_pages + s_t.unsqueeze(0)).reshape(-1)
    fd = (layer * dst.shape[1] + d_t.unsqueeze(0)).reshape(-1)
    row_bytes = src.shape[2] * src.element_size()
    total = fs.numel()
    chunk = total if plan.snapshot else max(1, _SCRATCH_MAX_BYTES // row_bytes)
    buf = _scratch_rows(min(chunk, total), src_flat)
    for a in range(0, total, chunk):
        b = min(a + chunk, total)
        part = buf[: b - a]
        torch.index_select(src_flat, 0, fs[a:b], out=part)
        dst_flat.index_copy_(0, fd[a:b], part)


# Each plan kind's execution between wide-row views on one CUDA device, all layers at once
# (rows.py's `_ROWS_BY_KIND` is the CPU's).
_SAME_DEVICE_BY_KIND = {PlanKind.EMPTY: _same_empty, PlanKind.RUNS: _same_runs, PlanKind.GATHER: _same_gather,
                        PlanKind.SCATTER: _same_scatter, PlanKind.TWO_PASS: _same_two_pass}


def _execute_same_device(src: torch.Tensor, dst: torch.Tensor, plan: CopyPlan) -> None:
    """All layers at once; src and dst are wide-row views on the same CUDA device."""
    _SAME_DEVICE_BY_KIND[plan.kind](src, dst, plan)


def _is_cuda(t: torch.Tensor) -> bool:
    return t.device.type == "cuda"


class _SideStreams:
    """One dedicated copy stream per CUDA device, created on first use."""
    _streams: dict[int, Any] = {}

    @classmethod
    def get(cls, device: torch.device):
        index = device.index if device.index is not None else torch.cuda.current_device()
        stream = cls._streams.get(index)
        if stream is None:
            stream = torch.cuda.Stream(device=index)
            cls._streams[index] = stream
        return stream


def _cuda_device(src: torch.Tensor, dst: torch.Tensor) -> torch.device:
    return src.device if _is_cuda(src) else dst.device


def _issue_layer_cross(src: torch.Tensor, dst: torch.Tensor, layer: int, plan: CopyPlan,
                       s_idx: dict, d_idx: dict, staged: list) -> None:
    """Copy one layer's pages between host and device (on the current = side stream).

    The scattered side is staged: host pages are gathered by the CPU into pinned memory
    (load-back) / scattered by the CPU after the copy (backup, done by the caller after sync);
    device pages are gathered/scattered on the device. Runs on both sides copy directly.
    """
    if plan.kind is PlanKind.RUNS:
        for s0, d0, n in plan.runs:
            dst[layer, d0:d0 + n].copy_(src[layer, s0:s0 + n], non_blocking=True)
        return
    n = plan.num_pages
    src_l = src[layer]
    dst_l = dst[layer]
    # source side -> a contiguous [n, w] tensor on the source's device
    if s_idx["one_run"]:
        s0 = int(plan.src_idx[0])
        moving = src_l[s0:s0 + n]
    elif src_l.is_cuda:
        moving = torch.index_select(src_l, 0, s_idx["cuda"])
    else:
        moving = torch.empty((n, src_l.shape[1]), dtype=src_l.dtype, pin_memory=True)
        torch.index_select(src_l, 0, s_idx["cpu"], out=moving)
    # destination side
    if d_idx["one_run"]:
        d0 = int(plan.dst_idx[0])
        dst_l[d0:d0 + n].copy_(moving, non_blocking=True)
    elif dst_l.is_cuda:
        landed = moving.to(dst_l.device, non_blocking=True)
        dst_l.index_copy_(0, d_idx["cuda"], landed)
    else:
        landed = torch.empty((n, dst_l.shape[1]), dtype=dst_l.dtype, pin_memory=True)
        landed.copy_(moving, non_blocking=True)
        staged.append((layer, landed))  # scattered into the host pool once the stream is done


@dataclass
class LoadBackHandle:
    """An in-flight (CUDA) or finished (CPU) load-back.

    `layer_events[i]` completes when layer i's pages are on the device: a prefill of layer i
    can `torch.cuda.current_stream().wait_event(handle.layer_events[i])`. Empty on CPU, where
    the copy has finished when `load_back` returns.
    """
    num_pages: int
    num_bytes: int
    plan_kind: str
    layer_events: list = field(default_factory=list)
    stream: Any = None
    start_event: Any = None
    end_event: Any = None
    wall_ns: int | None = None

    def done(self) -> bool:
        return self.wall_ns is not None or self.end_event is None or self.end_event.query()

    def wait(self) -> int:
        """Block until every layer has landed; return the transfer's wall time in ns
        (on CUDA measured on the stream between issue and the last layer, so calling wait()
        late does not inflate it)."""
        if self.wall_ns is None:
            self.end_event.synchronize()
            self.wall_ns = int(self.start_event.elapsed_time(self.end_event) * 1e6)
        return self.wall_ns


def _cross_device_indices(plan: CopyPlan, device: torch.device) -> tuple[dict, dict]:
    """Index tensors on each side that needs them (moved to the GPU once, not per layer)."""
    s_idx: dict = {}
    d_idx: dict = {}
    if not plan.kind.indexed:
        return s_idx, d_idx
    for idx, out in ((plan.src_idx, s_idx), (plan.dst_idx, d_idx)):
        out["one_run"] = count_runs(idx) == 1
        out["cpu"] = torch.from_numpy(idx)
        out["cuda"] = out["cpu"].to(device)
    return s_idx, d_idx


def _cross_plan(plan: CopyPlan) -> CopyPlan:
    """Across the link every op is a separate DMA, so only coalesce when runs are few;
    otherwise stage (the staged path handles one-run sides without staging them)."""
    if plan.kind is PlanKind.RUNS and plan.num_pages > 1 and len(plan.runs) > 4:
        return CopyPlan(PlanKind.TWO_PASS, plan.num_pages, plan.src_idx, plan.dst_idx, (), 2)
    return plan


def _start_cuda(src: torch.Tensor, dst: torch.Tensor, src_pages: PageList, dst_pages: PageList,
                *, per_layer_events: bool) -> tuple[LoadBackHandle, list, CopyPlan]:
    plan = _plan_for(src, src_pages, dst, dst_pages)
    src_w, dst_w = _wide_rows(src), _wide_rows(dst)
    same_device = src_w.device == dst_w.device
    if not same_device:
        plan = _cross_plan(plan)
    device = _cuda_device(src, dst)
    stream = _SideStreams.get(device)
    num_bytes = plan.num_pages * src.shape[0] * src.shape[2] * src.element_size()
    handle = LoadBackHandle(plan.num_pages, num_bytes, plan.kind, stream=stream)
    handle.start_event = torch.cuda.Event(enable_timing=True)
    handle.end_event = torch.cuda.Event(enable_timing=True)
    staged: list = []
    # The side stream must see what the compute stream wrote before copying it.
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        handle.start_event.record(stream)
        if same_device:
            _execute_same_device(src_w, dst_w, plan)
        else:
            s_idx, d_idx = _cross_device_indices(plan, device)
            for layer in range(src_w.shape[0]):
                if plan.num_pages:
                    _issue_layer_cross(src_w, dst_w, layer, plan, s_idx, d_idx, staged)
                if per_layer_events:
                    ev = torch.cuda.Event()
                    ev.record(stream)
                    handle.layer_events.append(ev)
        handle.end_event.record(stream)
    return handle, staged, plan


def _finish_staged(dst_w: torch.Tensor, plan_dst_idx: np.ndarray, staged: list) -> None:
    """Backup with scattered host pages: the pinned copies have landed; place the rows."""
    if not staged:
        return
    d_cpu = torch.from_numpy(plan_dst_idx)
    for layer, landed in staged:
        dst_w[layer].index_copy_(0, d_cpu, landed)
