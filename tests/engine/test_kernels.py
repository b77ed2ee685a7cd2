"""Copy kernels: every plan (runs, gather, scatter, two-pass) moves exactly the named pages,
bit for bit, for any dtype, and touches nothing else."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierdiag.engine import kernels, rows
from tierdiag.engine.kernels import backup, copy_pages, count_runs, load_back, plan_copy

HAS_CUDA = torch.cuda.is_available()


def _pool(layers: int, pages: int, elems: int, dtype: torch.dtype, seed: int, device: str = "cpu",
          pin: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(-(2**62), 2**62, (layers, pages, elems * 8), generator=g, dtype=torch.int64)
    # Random bits reinterpreted: for float dtypes this includes NaN payloads and -0.0, which a
    # copy must preserve exactly.
    t = raw.view(torch.uint8)[..., : elems * torch.empty((), dtype=dtype).element_size()].contiguous().view(dtype)
    t = t.to(device)
    return t.pin_memory() if pin else t


def _reference(src: torch.Tensor, src_pages, dst: torch.Tensor, dst_pages) -> torch.Tensor:
    """The naive page-at-a-time copy the kernels must agree with."""
    out = dst.clone()
    for s, d in zip(list(src_pages), list(dst_pages)):
        out[:, int(d)] = src[:, int(s)].to(out.device)
    return out


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.cpu().reshape(-1).view(torch.uint8), b.cpu().reshape(-1).view(torch.uint8))


def test_count_runs_narrated():
    assert count_runs([]) == 0
    assert count_runs([3]) == 1
    assert count_runs([4, 5, 6, 9, 10, 2]) == 3
    assert count_runs([5, 4, 3]) == 3  # descending ids are not a run: each is its own copy
    assert count_runs(torch.tensor([0, 1, 2, 3])) == 1
    assert count_runs(np.array([7, 9, 11])) == 3


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 40), max_size=60))
def test_count_runs_of_lists_arrays_and_copies_agree_with_a_loop(pages):
    """Short lists (Python), long ones (numpy), arrays, and the runs copy_rows counts from the
    index it built: all the same number as a page-by-page loop."""
    expected = sum(1 for i, p in enumerate(pages) if i == 0 or p != pages[i - 1] + 1)
    assert count_runs(pages) == expected
    assert count_runs(np.array(pages, dtype=np.int64)) == expected
    if len(set(pages)) == len(pages):  # a copy needs distinct destinations
        src = kernels.register_pool(torch.zeros((2, 41, 4), dtype=torch.int64))
        dst = kernels.register_pool(torch.zeros((2, 64, 4), dtype=torch.int64))
        assert kernels.copy_rows(src, pages, dst, list(range(len(pages))))[1] == expected


def test_plan_coalesces_runs_consecutive_on_both_sides():
    plan = plan_copy([7, 8, 9, 2], [0, 1, 2, 5], column_bytes=1 << 20, src_num_pages=16, dst_num_pages=16)
    assert plan.kind == "runs"
    assert plan.runs == ((7, 0, 3), (2, 5, 1))


def test_plan_prefers_one_gather_when_destination_is_consecutive_and_pages_small():
    src = [9, 3, 14, 1, 6, 11, 0, 4]
    plan = plan_copy(src, list(range(8)), column_bytes=256, src_num_pages=16, dst_num_pages=16)
    assert plan.kind == "gather" and plan.num_ops == 1
    plan = plan_copy(list(range(8)), src, column_bytes=256, src_num_pages=16, dst_num_pages=16)
    assert plan.kind == "scatter" and plan.num_ops == 1


def test_plan_scattered_both_sides_is_two_pass():
    rng = np.random.default_rng(0)
    s = rng.permutation(1000)[:200]
    d = rng.permutation(1000)[:200]
    plan = plan_copy(s.tolist(), d.tolist(), column_bytes=4096, src_num_pages=1000, dst_num_pages=1000)
    assert plan.kind == "two_pass"


def test_out_of_range_and_mismatched_lists_are_refused():
    src = torch.zeros(2, 4, 8, dtype=torch.int64)
    dst = torch.zeros(2, 4, 8, dtype=torch.int64)
    with pytest.raises(IndexError, match="destination page 4 out of range"):
        copy_pages(src, [0, 1], dst, [3, 4])
    with pytest.raises(IndexError, match="source page -1"):
        copy_pages(src, [-1], dst, [0])
    with pytest.raises(ValueError, match="2 source pages into 1"):
        copy_pages(src, [0, 1], dst, [0])
    with pytest.raises(ValueError, match="geometries differ"):
        copy_pages(src, [0], torch.zeros(2, 4, 16, dtype=torch.int64), [0])
    with pytest.raises(ValueError, match="dtypes differ"):
        copy_pages(src, [0], torch.zeros(2, 4, 8, dtype=torch.int32), [0])
    assert torch.count_nonzero(dst) == 0  # refused before touching anything


def test_empty_copy_is_a_no_op():
    src = _pool(2, 4, 8, torch.int64, 1)
    dst = torch.zeros_like(src)
    assert copy_pages(src, [], dst, []) >= 0
    assert torch.count_nonzero(dst) == 0


_DTYPES = [torch.int64, torch.float32, torch.bfloat16, torch.float16, torch.uint8, torch.int32, torch.float64]


@st.composite
def _transfers(draw):
    layers = draw(st.integers(1, 4))
    src_pages = draw(st.integers(1, 48))
    dst_pages = draw(st.integers(1, 48))
    elems = draw(st.sampled_from([1, 3, 8, 16, 24, 64]))
    dtype = draw(st.sampled_from(_DTYPES))
    n = draw(st.integers(0, min(src_pages, dst_pages)))
    shape = draw(st.sampled_from(["random", "runs", "src_run", "dst_run", "both_run"]))
    if shape == "random":
        s = draw(st.permutations(range(src_pages)))[:n]
        d = draw(st.permutations(range(dst_pages)))[:n]
    else:
        # a few runs, each consecutive on both sides, in shuffled order
        s0 = draw(st.integers(0, src_pages - n))
        d0 = draw(st.integers(0, dst_pages - n))
        s = list(range(s0, s0 + n))
        d = list(range(d0, d0 + n))
        if shape == "runs" and n:
            cut = sorted(draw(st.lists(st.integers(0, n), max_size=4)))
            pieces = [(s[a:b], d[a:b]) for a, b in zip([0] + cut, cut + [n]) if b > a]
            order = draw(st.permutations(range(len(pieces))))
            s = [x for i in order for x in pieces[i][0]]
            d = [x for i in order for x in pieces[i][1]]
        elif shape == "src_run":
            d = draw(st.permutations(range(dst_pages)))[:n]
        elif shape == "dst_run":
            s = draw(st.permutations(range(src_pages)))[:n]
    as_tensor = draw(st.sampled_from(["list", "tensor", "range"]))  # range: where a side is consecutive
    seed = draw(st.integers(0, 2**16))
    return layers, src_pages, dst_pages, elems, dtype, list(s), list(d), as_tensor, seed


def _as_kind(pages: list[int], kind: str):
    if kind == "tensor":
        return torch.tensor(pages, dtype=torch.int64)
    if kind == "range" and pages and pages == list(range(pages[0], pages[0] + len(pages))):
        return range(pages[0], pages[0] + len(pages))
    return pages


# Which CPU route a transfer takes depends on its size; the cases here are small (the default
# route: no plan, one fancy-indexed numpy move of rows), so each is also forced down the planner
# (every plan kind, numpy row moves, gather-then-scatter one row at a time through the scratch).
# planner: the big-transfer route on small pools (the compiled move straight from the page lists
# where it is built, the planner for what it declines: pages given as a tensor, one pool into
# itself); planner_numpy: the plans by numpy alone (its gather/scatter through scratch).
_ROUTES = {"default": {}, "planner": {"_DIRECT_MAX_BYTES": -1, "_CHUNK_BYTES": 3},
           "planner_numpy": {"_DIRECT_MAX_BYTES": -1, "_CHUNK_BYTES": 3, "compiled_move": None}}


@contextlib.contextmanager
def _route(name: str):
    saved = {k: getattr(rows, k) for k in _ROUTES[name]}  # the CPU route's constants live in rows.py
    for k, v in _ROUTES[name].items():
        setattr(rows, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(rows, k, v)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_transfers(), st.sampled_from(sorted(_ROUTES)))
def test_copy_pages_matches_naive_reference(case, route):
    layers, sp, dp, elems, dtype, s, d, as_tensor, seed = case
    src = _pool(layers, sp, elems, dtype, seed)
    dst = _pool(layers, dp, elems, dtype, seed + 1)
    expected = _reference(src, s, dst, d)
    src_before = src.clone()
    pages_s, pages_d = _as_kind(s, as_tensor), _as_kind(d, as_tensor)
    with _route(route):
        wall_ns = copy_pages(src, pages_s, dst, pages_d)
    assert isinstance(wall_ns, int) and wall_ns >= 0
    assert _same_bits(dst, expected), "pages differ from the page-at-a-time reference"
    assert _same_bits(src, src_before), "the source pool was modified"


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_transfers(), st.sampled_from(sorted(set(_ROUTES) - {"planner_numpy"})))  # copy_rows_c calls the move itself
def test_copy_rows_between_row_views_matches_naive_reference(case, route):
    """The engine's CPU path (two pools' row views, kernels.copy_rows): same bytes as the
    page-at-a-time reference on every dtype and route, and the runs of the source pages."""
    layers, sp, dp, elems, dtype, s, d, as_tensor, seed = case
    src = _pool(layers, sp, elems, dtype, seed)
    dst = _pool(layers, dp, elems, dtype, seed + 1)
    expected = _reference(src, s, dst, d)
    src_before = src.clone()
    with _route(route):
        wall_ns, runs = kernels.copy_rows(kernels.register_pool(src), _as_kind(s, as_tensor),
                                          kernels.register_pool(dst), _as_kind(d, as_tensor))
    assert isinstance(wall_ns, int) and wall_ns >= 0 and runs == count_runs(s)
    assert _same_bits(dst, expected), "pages differ from the page-at-a-time reference"
    assert _same_bits(src, src_before), "the source pool was modified"


def test_copy_rows_refuses_what_copy_pages_refuses():
    src = kernels.register_pool(torch.zeros(2, 4, 8, dtype=torch.int64))
    dst_t = torch.zeros(2, 4, 8, dtype=torch.int64)
    dst = kernels.register_pool(dst_t)
    with pytest.raises(IndexError, match="destination page 4 out of range"):
        kernels.copy_rows(src, [0, 1], dst, [3, 4])
    with pytest.raises(IndexError, match="source page -1"):
        kernels.copy_rows(src, [-1], dst, [0])
    with pytest.raises(ValueError, match="2 source pages into 1"):
        kernels.copy_rows(src, [0, 1], dst, [0])
    with pytest.raises(ValueError, match="geometries differ"):
        kernels.copy_rows(src, [0], kernels.register_pool(torch.zeros(2, 4, 16, dtype=torch.int64)), [0])
    assert torch.count_nonzero(dst_t) == 0  # refused before touching anything
    assert kernels.register_pool(torch.zeros(2, 4, 8).permute(1, 0, 2)) is None  # not a layer-first buffer


@settings(max_examples=40, deadline=None)
@given(_transfers(), st.sampled_from(sorted(_ROUTES)))
def test_load_back_and_backup_round_trip(case, route):
    layers, sp, dp, elems, dtype, s, d, kind, seed = case
    host = _pool(layers, sp, elems, dtype, seed)
    device = _pool(layers, dp, elems, dtype, seed + 1)
    with _route(route):
        handle = load_back(host, _as_kind(s, kind), device, _as_kind(d, kind))
    assert handle.layer_events == []  # CPU: done on return, no events
    assert handle.wait() >= 0 and handle.done()
    assert handle.num_pages == len(s)
    assert handle.num_bytes == len(s) * layers * elems * host.element_size()
    assert _same_bits(device[:, d], host[:, s])
    host2 = torch.zeros_like(host)
    with _route(route):
        backup(device, _as_kind(d, kind), host2, _as_kind(s, kind))
    assert _same_bits(host2[:, s], host[:, s])


@pytest.mark.parametrize("kind_pages", [
    ("runs", list(range(40, 56)), list(range(3, 19))),
    ("gather", [5, 90, 17, 33, 2, 71, 64, 8], list(range(20, 28))),
    ("scatter", list(range(20, 28)), [5, 90, 17, 33, 2, 71, 64, 8]),
    ("two_pass", [5, 90, 17, 33, 2, 71, 64, 8], [99, 0, 45, 12, 88, 31, 6, 50]),
])
def test_each_plan_kind_is_exercised_and_correct(kind_pages):
    kind, s, d = kind_pages
    src = _pool(3, 100, 4, torch.int64, 7)  # small pages: the planner picks the indexed paths
    dst = _pool(3, 100, 4, torch.int64, 8)
    plan = plan_copy(s, d, column_bytes=3 * 4 * 8, src_num_pages=100, dst_num_pages=100)
    assert plan.kind == kind
    expected = _reference(src, s, dst, d)
    copy_pages(src, s, dst, d)
    assert torch.equal(dst, expected)


def test_two_pass_chunks_through_a_bounded_scratch(monkeypatch):
    monkeypatch.setattr(rows, "_CHUNK_BYTES", 3 * 16 * 8)  # 3 rows a chunk (CPU)
    monkeypatch.setattr(rows, "_DIRECT_MAX_BYTES", -1)  # through the planner, not the direct path
    monkeypatch.setattr(rows, "compiled_move", None)  # numpy's two-pass (the compiled move needs no scratch)
    rng = np.random.default_rng(3)
    s = rng.permutation(64)[:20].tolist()
    d = rng.permutation(64)[:20].tolist()
    src = _pool(2, 64, 16, torch.int64, 1)
    dst = _pool(2, 64, 16, torch.int64, 2)
    expected = _reference(src, s, dst, d)
    copy_pages(src, s, dst, d)
    assert torch.equal(dst, expected)


def test_non_contiguous_pool_is_refused():
    src = _pool(2, 8, 8, torch.int64, 1)
    with pytest.raises(ValueError, match="contiguous"):
        copy_pages(src[:, ::2], [0], torch.zeros(2, 4, 8, dtype=torch.int64), [0])


# --- CUDA: the same properties through the side stream, pinned memory and layer events -------
cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs an NVIDIA GPU")


@pytest.mark.cuda
@cuda
@settings(max_examples=60, deadline=None)
@given(_transfers())
def test_cuda_load_back_backup_and_device_copy(case):
    layers, sp, dp, elems, dtype, s, d, _as_tensor, seed = case
    host = _pool(layers, sp, elems, dtype, seed, pin=True)
    device = _pool(layers, dp, elems, dtype, seed + 1, device="cuda")
    expected = _reference(host, s, device, d)
    handle = load_back(host, s, device, d)
    assert len(handle.layer_events) == layers
    for layer, event in enumerate(handle.layer_events):
        torch.cuda.current_stream().wait_event(event)
    assert handle.wait() >= 0
    assert _same_bits(device, expected)
    host2 = torch.zeros_like(host).pin_memory()
    expected_host = _reference(device, d, host2, s)
    backup(device, d, host2, s)
    assert _same_bits(host2, expected_host)
    device2 = torch.zeros_like(device)
    copy_pages(device, d, device2, d)
    assert _same_bits(device2[:, d], device[:, d])


@pytest.mark.cuda
@cuda
def test_cuda_load_back_sees_writes_queued_on_the_compute_stream():
    host = torch.zeros(2, 64, 256, dtype=torch.int64).pin_memory()
    device = torch.zeros(2, 64, 256, dtype=torch.int64, device="cuda")
    device[:, 10:20] = 7  # queued on the current stream; backup must wait for it
    backup(device, list(range(10, 20)), host, [3, 50, 4, 9, 60, 1, 2, 30, 31, 32])
    assert int(host[:, [3, 50, 4, 9, 60, 1, 2, 30, 31, 32]].min()) == 7
    handle = load_back(host, [3, 50, 4], device, [0, 40, 41])
    handle.wait()
    assert int(device[:, [0, 40, 41]].min()) == 7


@pytest.mark.parametrize("n", [1, 5, 40])
def test_range_and_ndarray_page_lists(n):
    """The engine passes ranges for freshly written rows; numpy arrays work too."""
    src = _pool(2, 100, 8, torch.int64, 5)
    dst = _pool(2, 100, 8, torch.int64, 6)
    rng = np.random.default_rng(n)
    d = rng.permutation(100)[:n]
    expected = _reference(src, range(10, 10 + 2 * n, 2), dst, d.tolist())
    copy_pages(src, range(10, 10 + 2 * n, 2), dst, d)
    assert torch.equal(dst, expected)


@pytest.mark.parametrize("n", [6, 300])
def test_pairs_are_sorted_when_that_coalesces_them(n):
    """A shuffled but contiguous destination set is one gather once the pairs are sorted."""
    rng = np.random.default_rng(n)
    d = rng.permutation(np.arange(50, 50 + n))
    s = rng.permutation(1000)[:n]
    plan = plan_copy(s, d, column_bytes=256, src_num_pages=1000, dst_num_pages=1000)
    assert plan.kind == "gather" and plan.num_ops == 1
    assert sorted(zip(plan.dst_idx.tolist(), plan.src_idx.tolist())) == sorted(zip(d.tolist(), s.tolist()))
    plan = plan_copy(d, d + 100, column_bytes=256, src_num_pages=1000, dst_num_pages=1000)
    assert plan.kind == "runs" and plan.runs == ((50, 150, n),)
    src = _pool(2, 1000, 4, torch.int64, n)
    dst = _pool(2, 1000, 4, torch.int64, n + 1)
    expected = _reference(src, s, dst, d)
    copy_pages(src, s, dst, d)
    assert torch.equal(dst, expected)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.integers(2, 60), st.data())
def test_moves_inside_one_pool_read_before_they_write(layers, pages, data):
    """Source and destination in the same pool may overlap (a compaction): the result is as
    if every source page were read before any destination page is written."""
    n = data.draw(st.integers(1, pages))
    s = data.draw(st.permutations(range(pages)))[:n]
    d = data.draw(st.permutations(range(pages)))[:n]
    if n < pages and data.draw(st.booleans()):  # shifted runs: what a forward slice copy gets wrong
        shift = data.draw(st.integers(1, pages - n)) * data.draw(st.sampled_from([1, -1]))
        start = data.draw(st.integers(max(0, -shift), pages - n - max(0, shift)))
        s = list(range(start, start + n))
        d = [x + shift for x in s]
    pool = _pool(layers, pages, 4, torch.int64, n)
    expected = _reference(pool, s, pool, d)
    with _route(data.draw(st.sampled_from(sorted(_ROUTES)))):
        copy_pages(pool, s, pool, d)
    assert torch.equal(pool, expected)


# --- layouts and backends ---------------------------------------------------------------------
def _page_first(layers: int, pages: int, elems: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """A page-first pool: a [P, L, E] buffer seen as [L, P, E]."""
    return _pool(layers, pages, elems, dtype, seed).permute(1, 0, 2).contiguous().permute(1, 0, 2)


def test_pool_layouts_are_recognised_and_other_strides_refused():
    lf = _pool(3, 8, 4, torch.int64, 1)
    assert kernels.pool_layout(lf) == kernels.LAYER_FIRST
    assert kernels.pool_layout(_page_first(3, 8, 4, torch.int64, 1)) == kernels.PAGE_FIRST
    with pytest.raises(ValueError, match="layer-first .* or page-first"):
        kernels.pool_layout(lf[:, ::2])


@pytest.mark.parametrize("dtype", [torch.int64, torch.bfloat16, torch.uint8])
def test_page_first_host_pools_take_the_torch_path_both_directions(dtype):
    rng = np.random.default_rng(4)
    host = _page_first(3, 20, 6, dtype, 2)
    device = _pool(3, 16, 6, dtype, 3)
    s, d = rng.permutation(20)[:9].tolist(), rng.permutation(16)[:9].tolist()
    expected = _reference(host, s, device, d)
    handle = load_back(host, s, device, d)
    assert handle.plan_kind == "generic" and handle.num_pages == 9
    assert _same_bits(device, expected)
    host2 = _page_first(3, 20, 6, dtype, 5)
    expected_host = _reference(device, d, host2, s)
    backup(device, d, host2, s)
    assert _same_bits(host2.permute(1, 0, 2), expected_host.permute(1, 0, 2))
    pool = _page_first(2, 10, 4, dtype, 6)  # a move inside one page-first pool, overlapping
    expected_pool = _reference(pool, [0, 1, 2, 3], pool, [1, 2, 3, 4])
    copy_pages(pool, [0, 1, 2, 3], pool, [1, 2, 3, 4])
    assert _same_bits(pool.permute(1, 0, 2), expected_pool.permute(1, 0, 2))


def test_cuda_auto_choice_takes_triton_only_for_scattered_transfers_past_the_threshold():
    def pick(pinned=True, nbytes=1 << 20, runs=50, min_bytes=64 << 10):
        return kernels.auto_backend(host_pinned=pinned, num_bytes=nbytes, runs=lambda: runs,
                                    triton_min_bytes=min_bytes)

    assert pick() == "triton"
    assert pick(pinned=False) == "torch"       # the GPU can only reach pinned host memory
    assert pick(nbytes=32 << 10) == "torch"    # below the calibrated threshold
    assert pick(min_bytes=None) == "torch"     # calibrate found Triton never wins (or no triton)
    assert pick(runs=2) == "torch"             # one run each side: two DMA copies are the ceiling


def test_cpu_never_picks_triton_and_unknown_backends_are_named():
    src = _pool(2, 8, 4, torch.int64, 1)
    assert kernels._choose_backend(src, torch.zeros_like(src), 8, None) == "torch"
    assert load_back(src, [1, 2], torch.zeros_like(src), [3, 4]).plan_kind != "triton"
    with pytest.raises(ValueError, match="unknown copy backend 'cuda'; known: torch, triton"):
        copy_pages(src, [0], torch.zeros_like(src), [0], backend="cuda")


def test_everything_works_without_triton_installed():
    """triton is optional: with it unimportable, kernels_triton says why and the torch path runs."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch\n"
        "from tierdiag.engine import kernels, kernels_triton\n"
        "assert not kernels_triton.AVAILABLE and 'triton is not installed' in kernels_triton.IMPORT_ERROR\n"
        "src = torch.arange(2 * 6 * 4, dtype=torch.int64).view(2, 6, 4); dst = torch.zeros_like(src)\n"
        "kernels.copy_pages(src, [5, 0, 3], dst, [1, 2, 4])\n"
        "assert torch.equal(dst[:, [1, 2, 4]], src[:, [5, 0, 3]])\n"
        "try:\n"
        "    kernels.copy_pages(src, [0], dst, [0], backend='triton')\n"
        "except RuntimeError as exc:\n"
        "    print(exc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("copy backend 'triton': triton is not installed")


@pytest.mark.parametrize("pages", [[3, 0, 7], range(2, 5), []])
def test_write_pages_lands_the_staging_rows_in_the_given_pages(pages):
    """kernels.write_pages (a prefill's output into its slots): the numpy path on a CPU pool and
    the copy_pages fallback (a page-first view) put the same bytes in the same pages."""
    data = np.arange(2 * len(pages) * 4, dtype=np.int64).reshape(2, len(pages), 4) * 7919
    for pool in (torch.zeros((2, 8, 4), dtype=torch.int64), torch.zeros((8, 2, 4), dtype=torch.int64).permute(1, 0, 2)):
        before = pool.clone()
        kernels.write_pages(data, pool, pages)
        idx = list(pages)
        assert torch.equal(pool[:, idx], torch.from_numpy(data))
        others = [p for p in range(8) if p not in idx]
        assert torch.equal(pool[:, others], before[:, others]), "pages outside the list were touched"
    with pytest.raises(IndexError, match="destination page 8 out of range"):
        kernels.write_pages(np.zeros((2, 1, 4), dtype=np.int64), torch.zeros((2, 8, 4), dtype=torch.int64), [8])


def test_big_cpu_transfers_take_the_compiled_move_unplanned_and_land_the_same_bytes(monkeypatch):
    """Issue 41: on the compiled data plane a CPU transfer past the direct size is one compiled
    move straight from the page lists (kernels._copy_compiled), each row from its page to its
    page: no plan is made (planning 256 scattered pages cost a sixth of moving their 4 MiB) and
    numpy's two-pass is not called. Bytes as the page-at-a-time reference, the source untouched."""
    if rows.compiled_move is None:
        pytest.skip("the compiled CPU data plane is not built here (numpy's path is the route tested above)")
    monkeypatch.setattr(rows, "_DIRECT_MAX_BYTES", -1)
    called = []
    monkeypatch.setattr(kernels, "_execute_rows", lambda *a: called.append(a))
    monkeypatch.setattr(kernels, "_plan_for", lambda *a: called.append(a))
    rng = np.random.default_rng(5)
    for s, d in ((rng.permutation(64)[:20].tolist(), rng.permutation(64)[:20].tolist()),  # two_pass
                 (rng.permutation(64)[:8].tolist(), list(range(30, 38))),  # gather
                 (list(range(30, 38)), rng.permutation(64)[:8].tolist())):  # scatter
        src = _pool(3, 64, 4, torch.int64, 1)
        dst = _pool(3, 64, 4, torch.int64, 2)
        expected, before = _reference(src, s, dst, d), src.clone()
        handle = load_back(src, s, dst, d)
        assert handle.plan_kind == "compiled" and handle.num_pages == len(s)
        assert torch.equal(dst, expected) and torch.equal(src, before)
        back = _pool(3, 64, 4, torch.int64, 3)
        expected = _reference(dst, d, back, s)
        backup(dst, d, back, s)
        assert torch.equal(back, expected)
    assert called == [], "a plan or numpy's row path ran although the compiled move takes these"
    # A move inside one pool whose pages overlap still reads everything first, on numpy.
    monkeypatch.undo()
    pool = _pool(2, 32, 4, torch.int64, 3)
    expected = _reference(pool, [1, 2, 3, 4], pool.clone(), [2, 3, 4, 5])
    monkeypatch.setattr(rows, "_DIRECT_MAX_BYTES", -1)
    copy_pages(pool, [1, 2, 3, 4], pool, [2, 3, 4, 5])
    assert torch.equal(pool, expected)
