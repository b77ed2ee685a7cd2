"""The Triton page-copy kernel, byte for byte against a page-at-a-time torch reference: both host
layouts (layer-first, page-first), both directions (load-back host -> device, backup device ->
host), the per-layer variant, random / run / singleton / empty page lists, every pool dtype, and
moves inside one pool whose pages overlap.

Without a GPU the kernel runs under Triton's interpreter (TRITON_INTERPRET=1, numpy underneath,
a few MB/s: the cases are small) on CPU tensors standing in for both pools. With a GPU and the
variable unset (benchmarks/gpu_check.sh) the same cases run compiled: host pools pinned, device
pools on CUDA, per-layer events checked.

The interpreter is chosen when the kernel is jitted (kernels_triton jits on first use, reading
the environment then), so setting the variable here, before any launch, is enough even when an
earlier test module imported tierdiag.engine.kernels.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
import torch

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1"
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"

from tierdiag.engine import kernels  # noqa: E402

HAS_TRITON = importlib.util.find_spec("triton") is not None
pytestmark = [pytest.mark.triton,
              pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (pip install triton)")]

DEVICE = "cuda" if ON_GPU else "cpu"
LF, PF = kernels.LAYER_FIRST, kernels.PAGE_FIRST
DTYPES = [torch.int64, torch.float32, torch.bfloat16, torch.float16, torch.uint8, torch.int32, torch.float64,
          torch.float8_e4m3fn]


def _bits(layers: int, pages: int, elems: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """[layers, pages, elems] of random bits in `dtype` (NaN payloads, -0.0 included), on CPU."""
    size = torch.empty((), dtype=dtype).element_size()
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (layers, pages, elems * size), generator=g, dtype=torch.uint8)
    return raw.view(dtype)


def _pool(layers: int, pages: int, elems: int, dtype: torch.dtype, seed: int, *, layout: str, host: bool) -> torch.Tensor:
    """A pool as the kernels take it: an [L, P, E] buffer (layer-first) or a [P, L, E] buffer
    seen as .permute(1, 0, 2) (page-first); on a GPU host buffers are pinned, device ones CUDA."""
    data = _bits(layers, pages, elems, dtype, seed)
    buf = data.permute(1, 0, 2).contiguous() if layout == PF else data
    if ON_GPU:
        buf = buf.pin_memory() if host else buf.cuda()
    pool = buf.permute(1, 0, 2) if layout == PF else buf
    assert kernels.pool_layout(pool) == layout
    return pool


def _reference(src: torch.Tensor, s: list[int], dst: torch.Tensor, d: list[int]) -> torch.Tensor:
    """Page at a time, every source page read before any destination page is written."""
    out = dst.cpu().clone()
    rows = [src[:, i].cpu().clone() for i in s]
    for row, j in zip(rows, d):
        out[:, j] = row
    return out


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.cpu().contiguous(), b.cpu().contiguous()
    return a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def _pages(kind: str, n_src: int, n_dst: int, n: int, seed: int) -> tuple[list[int], list[int]]:
    rng = np.random.default_rng(seed)
    if kind == "random":
        return rng.permutation(n_src)[:n].tolist(), rng.permutation(n_dst)[:n].tolist()
    if kind == "runs":  # consecutive on both sides, in two pieces, shuffled
        s0, d0 = int(rng.integers(0, n_src - n + 1)), int(rng.integers(0, n_dst - n + 1))
        cut = n // 2
        s, d = list(range(s0, s0 + n)), list(range(d0, d0 + n))
        return s[cut:] + s[:cut], d[cut:] + d[:cut]
    if kind == "singleton":
        return [int(rng.integers(0, n_src))], [int(rng.integers(0, n_dst))]
    assert kind == "empty"
    return [], []


def _transfer(direction: str, host_layout: str, kind: str, dtype: torch.dtype, *, layers: int = 3,
              host_pages: int = 12, device_pages: int = 10, elems: int = 24, n: int = 6, seed: int = 0):
    host = _pool(layers, host_pages, elems, dtype, seed, layout=host_layout, host=True)
    device = _pool(layers, device_pages, elems, dtype, seed + 1, layout=LF, host=False)
    if direction == "load_back":
        s, d = _pages(kind, host_pages, device_pages, n, seed)
        return host, s, device, d
    s, d = _pages(kind, device_pages, host_pages, n, seed)
    return device, s, host, d


CASES = [(direction, layout, kind)
         for direction in ("load_back", "backup")
         for layout in (LF, PF)
         for kind in ("random", "runs", "singleton", "empty")]


@pytest.mark.parametrize("direction,host_layout,kind", CASES)
def test_kernel_matches_reference_by_layout_direction_and_page_list(direction, host_layout, kind):
    dtype = torch.bfloat16 if kind == "runs" else torch.int64
    src, s, dst, d = _transfer(direction, host_layout, kind, dtype, seed=len(kind))
    expected = _reference(src, s, dst, d)
    src_before = src.cpu().clone()
    if direction == "load_back":
        handle = kernels.load_back(src, s, dst, d, backend="triton")
        assert handle.plan_kind == "triton" and handle.num_pages == len(s)
        assert len(handle.layer_events) == (src.shape[0] if ON_GPU else 0)
        assert handle.wait() >= 0
    else:
        assert kernels.backup(src, s, dst, d, backend="triton") >= 0
    assert _same_bytes(dst, expected), "pages differ from the page-at-a-time reference"
    assert _same_bytes(src, src_before), "the source pool was modified"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_pool_dtype_is_copied_bit_for_bit(dtype):
    # 5 elements a row: odd widths take the narrow element types (uint8 rows of 5 bytes, ...)
    elems = 5 if dtype.itemsize <= 2 else 4
    for direction, layout in (("load_back", PF), ("backup", LF)):
        src, s, dst, d = _transfer(direction, layout, "random", dtype, elems=elems, n=5, seed=dtype.itemsize)
        expected = _reference(src, s, dst, d)
        kernels.copy_pages(src, s, dst, d, backend="triton")
        assert _same_bytes(dst, expected), f"{dtype} {direction} {layout}"


@pytest.mark.parametrize("layout", [LF, PF])
@pytest.mark.parametrize("shape", ["shift_up", "shift_down", "swap", "random"])
def test_moves_inside_one_pool_read_every_page_before_writing(layout, shape):
    pages = 12
    pool = _pool(2, pages, 8, torch.int64, 5, layout=layout, host=False)
    if shape == "shift_up":      # 0..5 -> 1..6: a forward copy would smear page 0 everywhere
        s, d = list(range(0, 6)), list(range(1, 7))
    elif shape == "shift_down":
        s, d = list(range(3, 9)), list(range(0, 6))
    elif shape == "swap":
        s, d = [2, 7, 4], [7, 2, 5]
    else:
        rng = np.random.default_rng(11)
        s, d = rng.permutation(pages)[:7].tolist(), rng.permutation(pages)[:7].tolist()
    expected = _reference(pool, s, pool, d)
    kernels.copy_pages(pool, s, pool, d, backend="triton")
    assert _same_bytes(pool, expected)


def test_per_layer_variant_touches_only_its_layer():
    kt = kernels._triton_module()
    src = _pool(3, 8, 16, torch.int64, 3, layout=PF, host=True)
    dst = _pool(3, 8, 16, torch.int64, 4, layout=LF, host=False)
    s = torch.tensor([6, 0, 3], dtype=torch.int64, device=DEVICE)
    d = torch.tensor([1, 7, 2], dtype=torch.int64, device=DEVICE)
    before = dst.cpu().clone()
    kt.copy_rows(src, s, dst, d, layer=1)
    if ON_GPU:
        torch.cuda.synchronize()
    after = dst.cpu()
    assert torch.equal(after[0], before[0]) and torch.equal(after[2], before[2])
    assert torch.equal(after[1, d.cpu()], src.cpu()[1, s.cpu()])
    untouched = [p for p in range(8) if p not in (1, 7, 2)]
    assert torch.equal(after[1, untouched], before[1, untouched])


def test_rows_longer_than_one_program_are_split_and_reassembled(monkeypatch):
    """A row bigger than PROGRAM_BYTES is several programs (grid axis 2) and a ragged tail."""
    kt = kernels._triton_module()
    monkeypatch.setattr(kt, "PROGRAM_BYTES", 64)
    monkeypatch.setattr(kt, "BLOCK_BYTES", 16)
    src, s, dst, d = _transfer("load_back", PF, "random", torch.int64, layers=2, elems=37, n=3, seed=9)
    expected = _reference(src, s, dst, d)
    kernels.load_back(src, s, dst, d, backend="triton").wait()
    assert _same_bytes(dst, expected)


def test_kernel_refuses_mismatched_pools_before_touching_anything():
    src = _pool(2, 4, 8, torch.int64, 1, layout=LF, host=True)
    dst = _pool(2, 4, 8, torch.int64, 2, layout=LF, host=False)
    before = dst.cpu().clone()
    with pytest.raises(IndexError, match="destination page 4 out of range"):
        kernels.copy_pages(src, [0, 1], dst, [3, 4], backend="triton")
    with pytest.raises(ValueError, match="dtypes differ"):
        kernels.copy_pages(src, [0], dst.view(torch.float64), [0], backend="triton")
    assert _same_bytes(dst, before)


@pytest.mark.skipif(ON_GPU, reason="the interpreter's own check")
def test_triton_on_cpu_tensors_without_the_interpreter_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    src = torch.zeros(1, 2, 8, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        kernels.copy_pages(src, [0], torch.zeros_like(src), [1], backend="triton")


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_PAGE = st.integers(min_value=-2**63, max_value=2**63 - 1)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(s=st.lists(_PAGE, max_size=20), d=st.lists(_PAGE, max_size=20),
       kind=st.sampled_from(["list", "numpy", "tensor", "range"]))
def test_index_pair_takes_any_page_list_or_refuses_it_before_a_launch(s, d, kind):
    """The Triton path's page lists (kernels._index_pair): one [2, n] int64 array in the caller's
    order where every page is in range and the lengths agree; otherwise the same errors as the
    torch path's plan_copy (lengths: ValueError; a page out of range: IndexError naming it), and
    the destination pool untouched."""
    num = 8

    def as_kind(pages):
        if kind == "numpy":
            return np.array(pages, dtype=np.int64)
        if kind == "tensor":
            return torch.tensor(pages, dtype=torch.int64)
        if kind == "range" and pages:  # the engine's ranges: small starts (no int64 overflow)
            start = max(-100, min(100, pages[0]))
            return range(start, start + len(pages))
        return pages

    sp, dp = as_kind(s), as_kind(d)
    s_vals, d_vals = [int(x) for x in sp], [int(x) for x in dp]
    src = _pool(2, num, 8, torch.int64, 1, layout=LF, host=True)
    dst = _pool(2, num, 8, torch.int64, 2, layout=LF, host=False)
    before = dst.cpu().clone()
    if len(s_vals) != len(d_vals):
        with pytest.raises(ValueError, match="source pages into"):
            kernels._index_pair(sp, dp, num, num)
        return
    bad_s = next((x for x in s_vals if not 0 <= x < num), None)
    bad_d = next((x for x in d_vals if not 0 <= x < num), None)
    if bad_s is not None or bad_d is not None:
        side, bad = ("source", bad_s) if bad_s is not None else ("destination", bad_d)
        with pytest.raises(IndexError, match=f"{side} page {bad} out of range"):
            kernels.copy_pages(src, sp, dst, dp, backend="triton")
        assert _same_bytes(dst, before)
        return
    pages = kernels._index_pair(sp, dp, num, num)
    assert pages.dtype == np.int64 and pages.shape == (2, len(s_vals))
    assert pages[0].tolist() == s_vals and pages[1].tolist() == d_vals
    if len(set(d_vals)) == len(d_vals):  # the kernel's contract: destination pages distinct
        kernels.copy_pages(src, sp, dst, dp, backend="triton")
        assert _same_bytes(dst, _reference(src, s_vals, before, d_vals))


def test_prepared_launches_equal_copy_rows_per_layer():
    """A load-back's launches share one `prepare` (kernels_triton.copy_prepared); each layer's
    bytes equal `copy_rows(layer=)` on its own, the overlapping move inside one pool included."""
    from tierdiag.engine import kernels_triton as kt

    for same_pool in (False, True):
        src = _pool(3, 8, 16, torch.float16, 5, layout=LF, host=True)
        dst = src if same_pool else _pool(3, 8, 16, torch.float16, 6, layout=LF, host=False)
        a, b = dst.clone(), dst.clone()
        s_src = src.clone() if not same_pool else a
        s_idx = torch.tensor([0, 2, 4], device=DEVICE)
        d_idx = torch.tensor([2, 4, 6], device=DEVICE)
        prep = kt.prepare(s_src, s_idx, a, d_idx)
        assert prep.staged is same_pool
        for layer in range(3):
            kt.copy_prepared(prep, s_idx, d_idx, layer=layer)
        ref_src = src.clone() if not same_pool else b
        for layer in range(3):
            kt.copy_rows(ref_src, s_idx, b, d_idx, layer=layer)
        assert _same_bytes(a, b)
