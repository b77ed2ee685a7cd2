"""Where a small Triton load-back's time goes on a GPU: the fixed cost of one call, split.

    .venv/bin/python benchmarks/gpu_overhead.py [--json FILE] [--repeats N]

`benchmarks/gpu_table.py` on an H100 (session 26, the first GPU run) showed the Triton load-back
at 0.1-1 GB/s for 1-16 pages of 16-64 KiB, a fixed ~250 us a call against ~15 us for one
contiguous copy of the same bytes. This splits that fixed cost, each part timed alone (host wall
with `time.perf_counter_ns`, medians of --repeats, after warm-up; GPU time with CUDA events):

    plan        kernels.plan_copy of the page lists (host)
    idx_upload  the two index arrays to the device (`torch.from_numpy(...).to(device)`, host wall,
                synchronized: a pageable copy waits for the host)
    wrapper     kernels_triton.copy_rows' own Python before the launch (dtype, views, overlap
                check): copy_rows minus _launch, host
    launch      one Triton launch (`_launch`), host wall to return, indices already on the device
    launch_gpu  one launch's GPU time: 20 back-to-back launches between two events, / 20
    load_back   kernels.load_back(backend="triton") whole, host wall to `.wait()`
    load_gpu    the same, its own start/end events (what gpu_table.py reports)

for 1, 16 and 256 pages of 64 KiB (4 layers of 16 KiB rows, layer-first pinned host pool).
Without CUDA it prints why and exits 0 (nothing measured).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from tierdiag.engine import kernels  # noqa: E402

LAYERS = 4
PAGE_BYTES = 64 << 10
COUNTS = (1, 16, 256)


def _median_ns(fn, repeats: int) -> float:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        out.append(time.perf_counter_ns() - t0)
    return float(statistics.median(out))


def measure(repeats: int) -> dict:
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA GPU: nothing measured"}
    from tierdiag.engine import kernels_triton as kt
    if not kt.AVAILABLE:
        return {"skipped": f"triton not available: {kt.IMPORT_ERROR}"}
    device = torch.device("cuda")
    elems = PAGE_BYTES // LAYERS // 8
    pool_pages = 2 * max(COUNTS)
    host = torch.empty((LAYERS, pool_pages, elems), dtype=torch.int64).pin_memory()
    host.copy_(torch.randint(0, 2**62, host.shape, dtype=torch.int64))
    dev = torch.zeros((LAYERS, pool_pages, elems), dtype=torch.int64, device=device)
    rng = np.random.default_rng(0)
    rows = []
    for n in COUNTS:
        hp = rng.permutation(pool_pages)[:n].tolist()
        dp = rng.permutation(pool_pages)[:n].tolist()
        for _ in range(3):  # warm-up: compile, first touches
            kernels.load_back(host, hp, dev, dp, backend="triton").wait()
        torch.cuda.synchronize()
        col = host.shape[0] * host.shape[2] * host.element_size()
        plan = kernels.plan_copy(hp, dp, column_bytes=col, src_num_pages=pool_pages, dst_num_pages=pool_pages)
        row: dict = {"pages": n, "bytes": n * PAGE_BYTES}
        row["plan_ns"] = _median_ns(lambda: kernels.plan_copy(hp, dp, column_bytes=col, src_num_pages=pool_pages,
                                                              dst_num_pages=pool_pages), repeats)

        def upload():
            torch.from_numpy(plan.src_idx).to(device)
            torch.from_numpy(plan.dst_idx).to(device)
            torch.cuda.synchronize()
        row["idx_upload_ns"] = _median_ns(upload, repeats)
        s_t = torch.from_numpy(plan.src_idx).to(device)
        d_t = torch.from_numpy(plan.dst_idx).to(device)
        s_rows, d_rows = kt.as_rows(host), kt.as_rows(dev)

        def one_copy_rows():
            kt.copy_rows(host, s_t, dev, d_t, layer=0)
        def one_launch():
            kt._launch(s_rows, s_t, d_rows, d_t, 0, 1)
        torch.cuda.synchronize()
        row["copy_rows_ns"] = _median_ns(one_copy_rows, repeats)
        torch.cuda.synchronize()
        row["launch_ns"] = _median_ns(one_launch, repeats)
        torch.cuda.synchronize()
        row["wrapper_ns"] = max(0.0, row["copy_rows_ns"] - row["launch_ns"])
        gpu = []
        for _ in range(repeats):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(20):
                kt._launch(s_rows, s_t, d_rows, d_t, 0, LAYERS)
            b.record()
            b.synchronize()
            gpu.append(a.elapsed_time(b) * 1e6 / 20)
        row["launch_gpu_ns"] = float(statistics.median(gpu))
        whole, ev = [], []
        for _ in range(repeats):
            t0 = time.perf_counter_ns()
            h = kernels.load_back(host, hp, dev, dp, backend="triton")
            ev.append(h.wait())
            whole.append(time.perf_counter_ns() - t0)
        row["load_back_ns"] = float(statistics.median(whole))
        row["load_gpu_ns"] = float(statistics.median(ev))
        rows.append(row)
    return {"device": torch.cuda.get_device_name(device), "layers": LAYERS, "page_bytes": PAGE_BYTES,
            "repeats": repeats, "triton": __import__("triton").__version__, "torch": torch.__version__,
            "rows": rows}


def _profile() -> None:
    import cProfile
    import pstats

    elems = PAGE_BYTES // LAYERS // 8
    host = torch.empty((LAYERS, 512, elems), dtype=torch.int64).pin_memory()
    dev = torch.zeros((LAYERS, 512, elems), dtype=torch.int64, device="cuda")
    hp, dp = list(range(0, 32, 2)), list(range(1, 33, 2))
    kernels.load_back(host, hp, dev, dp, backend="triton").wait()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(200):
        kernels.load_back(host, hp, dev, dp, backend="triton").wait()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--profile", action="store_true", help="also cProfile 200 load-backs of 16 pages (top 25 by own time)")
    args = ap.parse_args()
    res = measure(args.repeats)
    if args.profile and "skipped" not in res:
        _profile()
    if "skipped" in res:
        print(f"gpu overhead: skipped: {res['skipped']}")
    else:
        keys = ("plan_ns", "idx_upload_ns", "wrapper_ns", "launch_ns", "launch_gpu_ns", "load_back_ns", "load_gpu_ns")
        print(f"{res['device']}, triton {res['triton']}, torch {res['torch']}: us per call (medians of {res['repeats']})")
        print("pages " + " ".join(f"{k[:-3]:>12}" for k in keys))
        for r in res["rows"]:
            print(f"{r['pages']:>5} " + " ".join(f"{r[k] / 1000:>12.1f}" for k in keys))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
