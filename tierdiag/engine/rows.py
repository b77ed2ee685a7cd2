"""CPU page moves between pools seen as numpy row views, and the copy planner: numpy only.

A KV pool `[num_layers, num_pages, page_elems]` (layer-major) is seen here as an `[L, P]` numpy
array of opaque row items, one row = one layer of one page, so every move is one memcpy a row
whatever the element type (see kernels.py for the layout and the torch/CUDA/Triton paths).

This module imports no torch: a CPU replay's pools are numpy buffers (pagepool.py), and the
engine's copies, content writes and verification all run through here, so a CPU replay never
pays torch's ~1.3 s import. kernels.py re-exports every name and adds the tensor paths; a
torch tensor passed as a page list is still accepted (converted through torch, which is then
necessarily imported already).

`copy_rows` is the chosen CPU kernel's (cplane.py): `copy_rows_c` (the compiled `_cplane.move`)
where it is built, else `copy_rows_numpy`, the reference the compiled one falls back to.
"""

from __future__ import annotations

import sys
import time
from array import array
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Sequence, Union

import numpy as np

from tierdiag.native import cplane

PageList = Union[Sequence[int], np.ndarray, Any]  # Any: a torch tensor of page ids

# One tensor op's fixed cost (dispatch, thread wake-up, index conversion) expressed as bytes
# it could have copied meanwhile: ~10 us at ~14 GB/s. Tuned with benchmarks/kernels.py.
_OP_COST_BYTES = 128 * 1024
# An indexed copy moves rows through an index; relative to a slice copy it costs a little more.
_INDEXED_FACTOR = 1.15
# On the CPU a gather-then-scatter goes through chunks this size: half of a 2 MiB L2, so the
# scratch is still in cache when the scatter reads it (benchmarks/kernels.py: 256 KiB-1 MiB
# all work; 2 MiB and up fall out of L2, 64 KiB pays too many ops).
_CHUNK_BYTES = 512 * 1024

# --- planning --------------------------------------------------------------------------------
def _as_index_array(pages: PageList) -> np.ndarray:
    torch = sys.modules.get("torch")  # a tensor can only come from a process that imported torch
    if torch is not None and isinstance(pages, torch.Tensor):
        return pages.detach().to("cpu", torch.int64).reshape(-1).numpy()
    if isinstance(pages, np.ndarray):
        return pages.astype(np.int64, copy=False).reshape(-1)
    if isinstance(pages, range):  # the engine passes ranges for freshly written rows
        return np.arange(pages.start, pages.stop, pages.step, dtype=np.int64)
    # np.fromiter is ~4x faster than torch.as_tensor (or np.array) on a list of Python ints.
    return np.fromiter(pages, dtype=np.int64, count=len(pages))


def _run_starts(idx: np.ndarray) -> np.ndarray:
    """Positions where a maximal run of consecutive ids (step +1) starts."""
    if idx.size == 0:
        return np.zeros(0, dtype=np.int64)
    brk: np.ndarray = np.flatnonzero(np.diff(idx) != 1) + 1
    return np.concatenate(([0], brk))


def slot_index(pages: list[int]) -> np.ndarray:
    """A list of page ids as an intp array, refusing a negative id (OverflowError) where numpy
    would wrap it around. Through array('Q'): a C loop over the list, ~2x np.fromiter's speed
    at a few hundred ids (the engine converts millions of slots a replay)."""
    return np.frombuffer(array("Q", pages), dtype=np.intp)


# Up to this many pages count_runs stays in Python (a C-level map, ~0.1 us a page); longer
# lists are converted and counted by numpy (~1.5 us whatever the length).
_RUNS_IN_PYTHON = 8


def _runs_of_index(idx: np.ndarray) -> int:
    """count_runs of a non-empty int array: steps of +1 are the pairs inside a run."""
    return int(idx.size) - int(np.count_nonzero((idx[1:] - idx[:-1]) == 1))


def count_runs(pages: PageList) -> int:
    """Number of maximal runs of consecutive page ids, in the order given (fragmentation):
    [4, 5, 6, 9, 10, 2] has 3 runs; [] has 0."""
    if isinstance(pages, list):  # the engine's slot lists
        if not pages:
            return 0
        if len(pages) <= _RUNS_IN_PYTHON:
            consecutive = sum(map(int.__eq__, pages[1:], map((1).__add__, pages)))
            return len(pages) - consecutive
        try:
            idx = np.frombuffer(array("q", pages), dtype=np.int64)
        except (OverflowError, TypeError):  # not int64s: numpy's conversion says what they are
            idx = _as_index_array(pages)
        return _runs_of_index(idx)
    idx = _as_index_array(pages)
    return _runs_of_index(idx) if idx.size else 0


class PlanKind(StrEnum):
    """How a plan moves its pages; each backend maps every kind to its implementation in one
    table (`_ROWS_BY_KIND` here, kernels_cuda.py's `_SAME_DEVICE_BY_KIND`)."""

    EMPTY = "empty"  # nothing to move
    RUNS = "runs"  # pairs consecutive on both sides: one slice copy a run
    GATHER = "gather"  # destination consecutive: one gather into each destination run
    SCATTER = "scatter"  # source consecutive: one scatter from each source run
    TWO_PASS = "two_pass"  # both sides scattered: gather into scratch, then scatter

    @property
    def indexed(self) -> bool:
        """Moves rows through an index on at least one side (not whole runs)."""
        return self in (PlanKind.GATHER, PlanKind.SCATTER, PlanKind.TWO_PASS)


@dataclass(frozen=True, eq=False)  # holds arrays: identity, not value, equality
class CopyPlan:
    """How one transfer will be executed. `runs` holds (src_start, dst_start, num_pages)."""
    kind: PlanKind
    num_pages: int
    src_idx: np.ndarray
    dst_idx: np.ndarray
    runs: tuple[tuple[int, int, int], ...] = ()
    num_ops: int = 0
    snapshot: bool = False  # read every source row before writing any (src and dst overlap)


def _check_range(idx: np.ndarray, num_pages: int, side: str) -> None:
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= num_pages):
        bad = idx[(idx < 0) | (idx >= num_pages)][0]
        raise IndexError(f"{side} page {int(bad)} out of range: the pool has {num_pages} pages "
                         f"(a slot freed twice or a stale page list?)")


def _check_range_small(idx: list[int], num_pages: int, side: str) -> None:
    if min(idx) < 0 or max(idx) >= num_pages:
        bad = next(i for i in idx if i < 0 or i >= num_pages)
        raise IndexError(f"{side} page {bad} out of range: the pool has {num_pages} pages "
                         f"(a slot freed twice or a stale page list?)")


# Below this many pages the plan is made with Python ints: numpy's per-call overhead would
# dominate a transfer of a handful of pages (the engine's common case).
_SMALL_PLAN = 16


def _cheapest(total_bytes: int, k_both: int, k_src: int, k_dst: int) -> tuple[float, PlanKind]:
    """(estimated cost, kind) of the cheapest plan: ops' fixed cost + bytes moved."""
    costs = {
        PlanKind.RUNS: k_both * _OP_COST_BYTES + total_bytes,
        PlanKind.GATHER: k_dst * _OP_COST_BYTES + _INDEXED_FACTOR * total_bytes,
        PlanKind.SCATTER: k_src * _OP_COST_BYTES + _INDEXED_FACTOR * total_bytes,
        PlanKind.TWO_PASS: 2 * _OP_COST_BYTES + 2 * _INDEXED_FACTOR * total_bytes,
    }
    kind = min(costs, key=costs.__getitem__)
    return costs[kind], kind


def _indexed_ops(kind: PlanKind, k_src: int, k_dst: int) -> int:
    """Ops of an indexed plan: one per destination run (gather), source run (scatter), or the
    two passes."""
    return k_dst if kind is PlanKind.GATHER else k_src if kind is PlanKind.SCATTER else 2


def _candidate_small(s: list[int], d: list[int], column_bytes: int) -> tuple[float, CopyPlan]:
    runs: list[tuple[int, int, int]] = []
    k_src = k_dst = 1
    s0, d0, length = s[0], d[0], 1
    for i in range(1, len(s)):
        step_s = s[i] == s[i - 1] + 1
        step_d = d[i] == d[i - 1] + 1
        k_src += not step_s
        k_dst += not step_d
        if step_s and step_d:
            length += 1
        else:
            runs.append((s0, d0, length))
            s0, d0, length = s[i], d[i], 1
    runs.append((s0, d0, length))
    cost, kind = _cheapest(len(s) * column_bytes, len(runs), k_src, k_dst)
    s_arr = np.array(s, dtype=np.int64)
    d_arr = np.array(d, dtype=np.int64)
    if kind is PlanKind.RUNS:
        return cost, CopyPlan(PlanKind.RUNS, len(s), s_arr, d_arr, tuple(runs), len(runs))
    return cost, CopyPlan(kind, len(s), s_arr, d_arr, (), _indexed_ops(kind, k_src, k_dst))


def _candidate(s: np.ndarray, d: np.ndarray, column_bytes: int) -> tuple[float, CopyPlan]:
    n = int(s.size)
    ds = np.diff(s) == 1
    dd = np.diff(d) == 1
    both = ds & dd
    k_both = n - int(np.count_nonzero(both))
    k_src = n - int(np.count_nonzero(ds))
    k_dst = n - int(np.count_nonzero(dd))
    cost, kind = _cheapest(n * column_bytes, k_both, k_src, k_dst)
    if kind is PlanKind.RUNS:
        starts = np.concatenate(([0], np.flatnonzero(~both) + 1))
        lens = np.diff(np.concatenate((starts, [n])))
        runs = tuple(zip(s[starts].tolist(), d[starts].tolist(), lens.tolist()))
        return cost, CopyPlan(PlanKind.RUNS, n, s, d, runs, len(runs))
    return cost, CopyPlan(kind, n, s, d, (), _indexed_ops(kind, k_src, k_dst))


def plan_copy(src_pages: PageList, dst_pages: PageList, *, column_bytes: int,
              src_num_pages: int, dst_num_pages: int) -> CopyPlan:
    """Choose the cheapest execution for copying pages src_pages[i] -> dst_pages[i].

    `column_bytes` is one page across all layers (num_layers * row bytes); it decides whether a
    run is long enough to be worth its own op. Destination pages must be distinct, so the pairs
    may be reordered: the order given, sorted by destination and sorted by source are all
    candidates ([3, 1, 2] -> [7, 5, 6] is one run once sorted).
    """
    n = len(src_pages)
    if n != len(dst_pages):
        raise ValueError(f"copy of {n} source pages into {len(dst_pages)} destination pages")
    if n == 0:
        empty: np.ndarray = np.zeros(0, dtype=np.int64)
        return CopyPlan(PlanKind.EMPTY, 0, empty, empty)
    if n <= _SMALL_PLAN:
        s_list = [int(x) for x in src_pages]
        d_list = [int(x) for x in dst_pages]
        _check_range_small(s_list, src_num_pages, "source")
        _check_range_small(d_list, dst_num_pages, "destination")
        best = _candidate_small(s_list, d_list, column_bytes)
        if best[1].num_ops > 1:
            for key in (d_list, s_list):
                order = sorted(range(n), key=key.__getitem__)
                cand = _candidate_small([s_list[i] for i in order], [d_list[i] for i in order], column_bytes)
                best = min(best, cand, key=lambda c: c[0])
        return best[1]
    s = _as_index_array(src_pages)
    d = _as_index_array(dst_pages)
    _check_range(s, src_num_pages, "source")
    _check_range(d, dst_num_pages, "destination")
    best = _candidate(s, d, column_bytes)
    if best[1].num_ops > 1:
        for key in (d, s):
            if np.all(key[1:] >= key[:-1]):
                continue  # already sorted: same candidate
            order = np.argsort(key, kind="stable")
            best = min(best, _candidate(s[order], d[order], column_bytes), key=lambda c: c[0])
    return best[1]



def within_one_pool(plan: CopyPlan) -> CopyPlan:
    """The plan for a move inside one pool. Indexed ops refuse (CUDA) or race when their output
    aliases their input, and with overlapping pages a slice copy would read rows it has already
    overwritten: stage through scratch (`snapshot`: reading everything first)."""
    overlap = bool(np.intersect1d(plan.src_idx, plan.dst_idx).size)
    if overlap or plan.kind in (PlanKind.GATHER, PlanKind.SCATTER):
        return CopyPlan(PlanKind.TWO_PASS, plan.num_pages, plan.src_idx, plan.dst_idx, (), 2, snapshot=overlap)
    return plan


def _runs_of(idx: np.ndarray) -> list[tuple[int, int, int]]:
    """(position in the list, first id, length) for each maximal run of consecutive ids."""
    starts = _run_starts(idx)
    lens = np.diff(np.concatenate((starts, [idx.size])))
    return list(zip(starts.tolist(), idx[starts].tolist(), lens.tolist()))



def _flat_index(idx: np.ndarray, num_layers: int, num_pages: int) -> np.ndarray:
    """Row ids in the flat [L * P] view of page ids `idx` for every layer, layer-major."""
    if num_layers == 1:
        return idx
    return (np.arange(num_layers, dtype=np.int64)[:, None] * num_pages + idx[None, :]).reshape(-1)


_np_scratch: dict[int, np.ndarray] = {}


def _np_scratch_rows(rows: int, row_bytes: int) -> np.ndarray:
    """A reused buffer of row items (a fresh MiB would be page-faulted in on every call)."""
    buf = _np_scratch.get(row_bytes)
    if buf is None or buf.size < rows:
        buf = _np_scratch[row_bytes] = np.empty(rows, dtype=np.dtype((np.void, row_bytes)))
    return buf[:rows]


def _gather_scatter_cpu(src_v: np.ndarray, fs: np.ndarray, dst_v: np.ndarray, fd: np.ndarray,
                        *, snapshot: bool) -> None:
    """dst_v[fd[i]] = src_v[fs[i]] over flat row items, through a cache-sized scratch buffer.

    One big staging pass (gather everything, then scatter everything) streams the bytes through
    memory twice; chunks of `_CHUNK_BYTES` are still in L2 when the scatter reads them, so memory
    sees each byte read once and written once, as in a contiguous copy. `snapshot` (a move
    inside one pool whose pages overlap) reads every row before writing any.
    """
    total = int(fs.size)
    if total == 0:
        return
    chunk = total if snapshot else max(1, min(total, _CHUNK_BYTES // src_v.itemsize))
    buf = _np_scratch_rows(chunk, src_v.itemsize)
    for a in range(0, total, chunk):
        b = min(a + chunk, total)
        # mode="clip": the planner range-checked every id; "raise" would buffer the output
        np.take(src_v, fs[a:b], out=buf[: b - a], mode="clip")
        np.put(dst_v, fd[a:b], buf[: b - a])



def _rows_empty(sv: np.ndarray, dv: np.ndarray, plan: CopyPlan) -> None:
    return None


def _rows_runs(sv: np.ndarray, dv: np.ndarray, plan: CopyPlan) -> None:
    for s0, d0, n in plan.runs:
        np.copyto(dv[:, d0:d0 + n], sv[:, s0:s0 + n])


def _rows_gather(sv: np.ndarray, dv: np.ndarray, plan: CopyPlan) -> None:
    """Destination runs: take straight into each layer's slice."""
    num_layers, n, sf = sv.shape[0], plan.num_pages, sv.reshape(-1)
    fs = _flat_index(plan.src_idx, num_layers, sv.shape[1])
    for pos, d0, length in _runs_of(plan.dst_idx):
        for layer in range(num_layers):
            np.take(sf, fs[layer * n + pos: layer * n + pos + length], out=dv[layer, d0:d0 + length],
                    mode="clip")


def _rows_scatter(sv: np.ndarray, dv: np.ndarray, plan: CopyPlan) -> None:
    """Source runs: put straight from each layer's slice."""
    num_layers, n, df = sv.shape[0], plan.num_pages, dv.reshape(-1)
    fd = _flat_index(plan.dst_idx, num_layers, dv.shape[1])
    for pos, s0, length in _runs_of(plan.src_idx):
        for layer in range(num_layers):
            np.put(df, fd[layer * n + pos: layer * n + pos + length], sv[layer, s0:s0 + length])


def _rows_two_pass(sv: np.ndarray, dv: np.ndarray, plan: CopyPlan) -> None:
    num_layers = sv.shape[0]
    fs = _flat_index(plan.src_idx, num_layers, sv.shape[1])
    fd = _flat_index(plan.dst_idx, num_layers, dv.shape[1])
    _gather_scatter_cpu(sv.reshape(-1), fs, dv.reshape(-1), fd, snapshot=plan.snapshot)


# Each plan kind's execution on two [L, P] row views, all layers.
_ROWS_BY_KIND = {PlanKind.EMPTY: _rows_empty, PlanKind.RUNS: _rows_runs, PlanKind.GATHER: _rows_gather,
                 PlanKind.SCATTER: _rows_scatter, PlanKind.TWO_PASS: _rows_two_pass}


def _execute_rows(sv: np.ndarray, dv: np.ndarray, plan: CopyPlan) -> None:
    """Execute a plan between two pools' [L, P] row views, all layers."""
    _ROWS_BY_KIND[plan.kind](sv, dv, plan)



# --- small transfers: no plan ----------------------------------------------------------------------
# Below this many bytes a plan costs more than the copy it optimises (measured: 8 pages of 1 KiB
# took 100 us planned and 10 us direct; 200 pages 194 vs 57 us; 1,000 pages 602 vs 431 us). The
# engine's write-through backups and prefill writes are mostly this size; load-backs of long
# prefixes and calibrate's bulk sizes still go through the planner.
_DIRECT_MAX_BYTES = 1 << 20


def _cpu_index(pages: PageList, num_pages: int, side: str):
    """Pages as a numpy index: a slice for a unit-step range, else an array. Lists become
    uint64 so a negative id is refused by the conversion (numpy would wrap it around) and one
    past the pool by the move itself; either way the planner's message names it (`slot_index`)."""
    if isinstance(pages, list):
        try:
            return slot_index(pages)
        except OverflowError:
            _check_range_small(pages, num_pages, side)
            raise
    if isinstance(pages, range) and pages.step == 1:
        if pages.start < 0 or pages.stop > num_pages:
            _check_range_small([pages.start, pages.stop - 1], num_pages, side)
        return slice(pages.start, pages.stop)
    idx = _as_index_array(pages)
    _check_range(idx, num_pages, side)
    return idx


def _move_rows(sv: np.ndarray, src_pages: PageList, dv: np.ndarray, dst_pages: PageList):
    """dv[:, dst_pages[i]] = sv[:, src_pages[i]] for every layer, by numpy: a gather of the
    source rows (`take`, or a slice for a range), then one fancy-indexed store. Pages that fall
    outside a pool are refused, naming the page, before a byte moves. Returns the source index
    it made (an intp array or a slice)."""
    s = _cpu_index(src_pages, sv.shape[1], "source")
    d = _cpu_index(dst_pages, dv.shape[1], "destination")
    try:
        # take + store beats one `dv[:, d] = sv[:, s]` (~2x at 16-256 rows a layer): the mixed
        # slice/fancy getitem goes through numpy's general mapiter
        dv[:, d] = sv[:, s] if isinstance(s, slice) else sv.take(s, axis=1)
    except IndexError:  # numpy checks every id before it moves a byte
        for pages, rows, side in ((src_pages, sv, "source"), (dst_pages, dv, "destination")):
            _check_range(_as_index_array(pages), rows.shape[1], side)
        raise
    return s



def copy_rows_numpy(src_rows: np.ndarray, src_pages: PageList, dst_rows: np.ndarray,
                    dst_pages: PageList) -> tuple[int, int]:
    """`copy_pages` between two CPU pools given by their row views (what `register_pool`
    returned): the same bytes into the same pages, by the same numpy moves, without re-checking
    the tensors on every call (their geometry was checked once, when the views were made).
    Returns (wall ns, `count_runs(src_pages)`), the runs counted from the index the copy made
    rather than from the list again.

    This is the engine's hot path: tens of thousands of backups and load-backs of a few to a few
    hundred pages, where the ~20 tensor attribute reads of `copy_pages` and a second pass over the
    page list cost more than the copy."""
    t0 = time.perf_counter_ns()
    n = len(src_pages)
    if n != len(dst_pages):
        raise ValueError(f"copy of {n} source pages into {len(dst_pages)} destination pages")
    if not n:
        return time.perf_counter_ns() - t0, 0
    if src_rows.dtype != dst_rows.dtype or src_rows.shape[0] != dst_rows.shape[0]:
        raise ValueError(f"pool geometries differ: {src_rows.shape[0]} layers of {src_rows.dtype.itemsize} B rows -> "
                         f"{dst_rows.shape[0]} of {dst_rows.dtype.itemsize} B")
    column_bytes = src_rows.shape[0] * src_rows.dtype.itemsize
    if n * column_bytes <= _DIRECT_MAX_BYTES and not np.may_share_memory(src_rows, dst_rows):
        s = _move_rows(src_rows, src_pages, dst_rows, dst_pages)
        wall = time.perf_counter_ns() - t0
        if isinstance(s, slice):
            return wall, 1
        # a short list (hot in cache now) is counted by Python; numpy's ~4 us start-up pays from ~10 pages
        return wall, count_runs(src_pages) if n <= _RUNS_IN_PYTHON else _runs_of_index(s)
    plan = plan_copy(src_pages, dst_pages, column_bytes=column_bytes,
                     src_num_pages=src_rows.shape[1], dst_num_pages=dst_rows.shape[1])
    if np.may_share_memory(src_rows, dst_rows):
        plan = within_one_pool(plan)
    _execute_rows(src_rows, dst_rows, plan)
    return time.perf_counter_ns() - t0, count_runs(src_pages)


def copy_rows_c(src_rows: np.ndarray, src_pages: PageList, dst_rows: np.ndarray,
                dst_pages: PageList) -> tuple[int, int]:
    """`copy_rows_numpy` by the compiled kernel (_cplane.move: every page range-checked, then
    one memcpy a run of pages consecutive on both sides, in every layer), where numpy's ~5 us
    of calls a transfer was most of the cost of moving a few hundred 256 B pages. What the
    kernel declines, having moved nothing (a page outside a pool, lengths or geometries that
    differ, overlapping pools, a tensor of page ids), takes the numpy path, with its errors."""
    t0 = time.perf_counter_ns()
    runs = compiled_move(src_rows, src_pages, dst_rows, dst_pages)
    if runs < 0:
        return copy_rows_numpy(src_rows, src_pages, dst_rows, dst_pages)
    return time.perf_counter_ns() - t0, runs


def read_rows(src_rows: np.ndarray, src_pages: PageList) -> np.ndarray:
    """A copy of pages `src_pages` of a CPU pool's row view: [L, n] row items."""
    s = _cpu_index(src_pages, src_rows.shape[1], "source")
    try:
        return src_rows[:, s].copy() if isinstance(s, slice) else src_rows.take(s, axis=1)
    except IndexError:
        _check_range(_as_index_array(src_pages), src_rows.shape[1], "source")
        raise


def write_rows(data: np.ndarray, dst_rows: np.ndarray, dst_pages: PageList) -> None:
    """Rows `data` ([L, n] row items of the pool's row dtype: a prefill's output) into pages
    `dst_pages` of a CPU pool's row view."""
    if len(dst_pages):
        d = _cpu_index(dst_pages, dst_rows.shape[1], "destination")
        try:
            dst_rows[:, d] = data
        except IndexError:
            _check_range(_as_index_array(dst_pages), dst_rows.shape[1], "destination")
            raise


def array_rows(buffer: np.ndarray, *, page_first: bool | None = None) -> np.ndarray:
    """A numpy pool buffer [L, P, E] as its row-item view (shares memory): the handle
    `copy_rows`, `read_rows` and `write_rows` take. Layer-first (a contiguous [L, P, E]): [L, P]
    items of one layer's page. Page-first (a contiguous [P, L, E] seen as [L, P, E] through a
    transpose): [1, P] items of a whole page, its layers in order; the moves are the same code
    (a page-first pool is a one-"layer" pool of wide rows), so both pools of a copy must share
    the layout (`copy_rows` checks the item size and count of layers). `page_first`: the layout
    the pool was made with; None tells it from the strides, which cannot for a one-page pool
    (both layouts are the same bytes then, but the views differ, and a copy between a one-page
    page-first pool and a larger one would be refused)."""
    if buffer.ndim != 3:
        raise ValueError(f"a pool buffer is [num_layers, num_pages, page_elems]; got shape {buffer.shape}")
    layers, pages, elems = buffer.shape
    if buffer.flags.c_contiguous and not page_first:
        row = np.dtype((np.void, elems * buffer.itemsize))
        return buffer.reshape(-1).view(np.uint8).view(row).reshape(layers, pages)
    page_major = buffer.transpose(1, 0, 2)
    if page_major.flags.c_contiguous and page_first is not False:
        row = np.dtype((np.void, layers * elems * buffer.itemsize))
        return page_major.reshape(-1).view(np.uint8).view(row).reshape(1, pages)
    raise ValueError("a pool buffer must be contiguous: layer-first [L, P, E] or page-first [P, L, E] "
                     "seen as [L, P, E] through .transpose(1, 0, 2)")


# --- the CPU kernel: the one native/cplane.py chose ------------------------------------------
compiled_move = cplane.compiled("move")
copy_rows = cplane.choose("rows.copy_rows", copy_rows_c, copy_rows_numpy)
