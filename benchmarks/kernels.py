"""Copy-kernel paths side by side: which plan wins at which page size and transfer size.

For each page size (one layer's row: 2 KiB .. 64 KiB) and transfer size (1 .. 4096 pages, capped
at --max-mib per transfer) it times, in one run and interleaved, medians of --repeats:
  flat        one contiguous copy of the same bytes (the yardstick);
  contiguous  copy_pages with consecutive pages on both sides (-> one slice copy);
  gather      scattered source pages into a consecutive destination (host pages -> fresh slots);
  scatter     consecutive source pages into scattered destination pages;
  scattered   scattered pages on both sides (the worst case);
  before      the same scattered transfer by the previous CPU algorithm (kept here, verbatim in
              effect, as the "before" column): up to 1 MiB index_select + index_copy_ over dim 1,
              above that a gather of up to 32 MiB into scratch, then index_copy_ from it;
and prints GB/s with the ratio to `flat`. `flat` is the faster of torch's copy_ and numpy's
single-threaded memcpy of the same bytes, timed side by side (on a busy machine torch's
parallel copy waits for its second thread). `--json` prints the rows instead.

    .venv/bin/python benchmarks/kernels.py [--quick] [--json]

`--replay-ab BEFORE` instead replays the Mooncake traces (conversation and synthetic, probes on
and off, and the conversation with a 50M-token storage tier) with the code of the checkout at
BEFORE and with this one, interleaved (the order flips every repeat), and prints the medians of
the replay process's CPU (user+sys) and of its `wall_s`, with the median of the per-pair ratios:
how the data plane's changes are measured on a shared machine (benchmarks/README.md).

    .venv/bin/python benchmarks/kernels.py --replay-ab /path/to/before/checkout [--repeats 3] [--only synthetic]

`--cpu-kernels` instead puts the CPU data plane's two backends (cplane.py: the compiled
_cplane.c and numpy) side by side: a table of one call of each operation (page move, content
write, verification, alloc+free) by pages per call on the engine's pools (page-first, 4 layers
x 64 B, scattered slots), interleaved medians in this process; then `Engine.run` alone (the
trace read beforehand, no probes) on the Mooncake traces, in fresh processes with
TIERDIAG_CPLANE=numpy and =c alternately (the order flips every repeat), CPU seconds' medians
and the median of the per-pair ratios. `--only` picks replays by name as above.

    .venv/bin/python benchmarks/kernels.py --cpu-kernels [--repeats 3] [--only conversation]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from tierdiag.engine.kernels import copy_pages, plan_copy  # noqa: E402

PATTERNS = ("contiguous", "gather", "scatter", "scattered", "before")
PLAN_ABBREV = {"runs": "R", "gather": "G", "scatter": "S", "two_pass": "2P", "empty": "-", "before": "old"}

_BEFORE_DIRECT_MAX_BYTES = 1 << 20
_BEFORE_SCRATCH_MAX_BYTES = 32 << 20


def copy_before(src: torch.Tensor, s: list[int], dst: torch.Tensor, d: list[int], scratch: torch.Tensor) -> int:
    """The CPU scattered->scattered copy as tierdiag did it before the numpy row path (wall ns):
    small transfers two torch ops over dim 1; big ones a 32 MiB two-pass over [L * P, w] rows of
    complex128 (the widest element), gather by index_select, scatter by index_copy_."""
    t0 = time.perf_counter_ns()
    layers, pages, elems = src.shape
    s_t, d_t = torch.tensor(s, dtype=torch.int64), torch.tensor(d, dtype=torch.int64)
    if len(s) * layers * elems * src.element_size() <= _BEFORE_DIRECT_MAX_BYTES:
        dst.index_copy_(1, d_t, src.index_select(1, s_t))
        return time.perf_counter_ns() - t0
    sw = src.view(torch.complex128).reshape(layers * pages, -1)
    dw = dst.view(torch.complex128).reshape(layers * dst.shape[1], -1)
    layer = torch.arange(layers, dtype=torch.int64).unsqueeze(1)
    fs = (layer * pages + s_t.unsqueeze(0)).reshape(-1)
    fd = (layer * dst.shape[1] + d_t.unsqueeze(0)).reshape(-1)
    chunk = max(1, _BEFORE_SCRATCH_MAX_BYTES // (sw.shape[1] * 16))
    for a in range(0, fs.numel(), chunk):
        b = min(a + chunk, fs.numel())
        part = scratch[: (b - a) * sw.shape[1]].view(b - a, sw.shape[1])
        torch.index_select(sw, 0, fs[a:b], out=part)
        dw.index_copy_(0, fd[a:b], part)
    return time.perf_counter_ns() - t0


def measure(*, quick: bool, repeats: int, layers: int = 4, max_mib: int = 64, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    row_sizes = [2048, 16384, 65536] if quick else [2048, 8192, 16384, 65536]
    page_counts = [1, 8, 64, 512] if quick else [1, 8, 64, 512, 4096]
    rows = []
    for row_bytes in row_sizes:
        elems = row_bytes // 8
        for n in page_counts:
            nbytes = n * layers * row_bytes
            if nbytes > max_mib * 2**20:
                continue
            pool_pages = 2 * n + 8
            src = torch.randint(0, 2**62, (layers, pool_pages, elems), dtype=torch.int64)
            dst = torch.zeros_like(src)
            flat_src = torch.randint(0, 2**62, (nbytes // 8,), dtype=torch.int64)
            flat_dst = torch.zeros_like(flat_src)
            scratch = torch.empty(min(nbytes, _BEFORE_SCRATCH_MAX_BYTES) // 16, dtype=torch.complex128)
            times: dict[str, list[int]] = {k: [] for k in ("flat", "flat_torch", "flat_memcpy") + PATTERNS}
            plans = {}
            for _ in range(repeats + 1):  # the first round warms up (page faults, allocator)
                s = rng.permutation(pool_pages)[:n].tolist()
                d = rng.permutation(pool_pages)[:n].tolist()
                cases = {
                    "contiguous": (range(3, 3 + n), range(5, 5 + n)),
                    "gather": (s, range(1, 1 + n)),
                    "scatter": (range(1, 1 + n), d),
                    "scattered": (s, d),
                }
                # each timed copy starts after a 1 ms sleep (as in calibrate: on a busy machine the
                # scheduler otherwise preempts whichever copy crosses the end of a time slice)
                time.sleep(0.001)
                t0 = time.perf_counter_ns()
                flat_dst.copy_(flat_src)
                times["flat_torch"].append(time.perf_counter_ns() - t0)
                time.sleep(0.001)
                t0 = time.perf_counter_ns()
                np.copyto(flat_dst.numpy(), flat_src.numpy())
                times["flat_memcpy"].append(time.perf_counter_ns() - t0)
                for name, (sp, dp) in cases.items():
                    time.sleep(0.001)
                    times[name].append(copy_pages(src, sp, dst, dp))
                    plans[name] = plan_copy(sp, dp, column_bytes=layers * row_bytes,
                                            src_num_pages=pool_pages, dst_num_pages=pool_pages).kind
                time.sleep(0.001)
                times["before"].append(copy_before(src, s, dst, d, scratch))
                plans["before"] = "before"
            med = {k: statistics.median(v[1:]) for k, v in times.items() if v}
            med["flat"] = min(med["flat_torch"], med["flat_memcpy"])
            row = {"row_bytes": row_bytes, "layers": layers, "pages": n, "bytes": nbytes,
                   "flat_bytes_per_s": nbytes / med["flat"] * 1e9,
                   "flat_torch_bytes_per_s": nbytes / med["flat_torch"] * 1e9,
                   "flat_memcpy_bytes_per_s": nbytes / med["flat_memcpy"] * 1e9}
            for name in PATTERNS:
                row[f"{name}_bytes_per_s"] = nbytes / med[name] * 1e9
                row[f"{name}_vs_flat"] = med["flat"] / med[name]
                row[f"{name}_plan"] = plans[name]
            rows.append(row)
    return rows


def render(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="copy kernels by path (GB/s, % of a flat copy of the same bytes; medians; "
                        "plans: R runs, G gather, S scatter, 2P two-pass; before: the previous "
                        "algorithm on the scattered case)")
    for col in ("row", "pages", "MiB", "flat") + PATTERNS + ("plans",):
        table.add_column(col, justify="right")
    for r in rows:
        cells = [f"{r['row_bytes'] // 1024} KiB", f"{r['pages']:,}", f"{r['bytes'] / 2**20:.2f}",
                 f"{r['flat_bytes_per_s'] / 1e9:.1f}"]
        for name in PATTERNS:
            cells.append(f"{r[f'{name}_bytes_per_s'] / 1e9:.1f} {r[f'{name}_vs_flat']:.0%}")
        cells.append(" ".join(PLAN_ABBREV[r[f"{name}_plan"]] for name in PATTERNS[:-1]))
        table.add_row(*cells)
    (Console() if sys.stdout.isatty() else Console(width=150)).print(table)


REPLAYS = (
    ("conversation, probes", ["conversation_trace.jsonl"]),
    ("conversation, --no-probes", ["conversation_trace.jsonl", "--no-probes"]),
    ("synthetic, probes", ["synthetic_trace.jsonl"]),
    ("synthetic, --no-probes", ["synthetic_trace.jsonl", "--no-probes"]),
    ("conversation, --storage-tokens 50000000", ["conversation_trace.jsonl", "--storage-tokens", "50000000"]),
)


def replay_ab(before: Path, after: Path, *, repeats: int, traces: Path, only: str = "") -> list[dict]:
    """Interleaved replays of REPLAYS (those whose name contains `only`) by two checkouts: one
    row per replay with the medians."""
    import resource
    import shutil
    import subprocess
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="tierdiag-replay-ab-"))
    replays = [(name, args) for name, args in REPLAYS if only in name]
    pairs: dict[str, list[dict]] = {name: [] for name, _ in replays}
    try:
        for rep in range(repeats):
            for name, args in replays:
                order = [("before", before), ("after", after)]
                pair = {}
                for side, root in (order if rep % 2 == 0 else order[::-1]):
                    db = work / f"{side}.duckdb"
                    for stale in (db, db.with_suffix(".duckdb.wal")):
                        stale.unlink(missing_ok=True)
                    shutil.rmtree(work / f"{side}.storage", ignore_errors=True)
                    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                    out = subprocess.run(
                        [sys.executable, "-c", "from tierdiag.cli.main import main; main()", "replay",
                         str(traces / args[0]), *args[1:], "--db", str(db), "--json"],
                        cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True,
                        check=True)
                    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                    pair[side] = ((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime),
                                  json.loads(out.stdout)["wall_s"])
                pairs[name].append(pair)
                print(f"{rep} {name}: before {pair['before'][0]:.2f} s CPU, after {pair['after'][0]:.2f} s CPU",
                      file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = statistics.median
    return [{"replay": name, "repeats": len(ps),
             "before_cpu_s": med(p["before"][0] for p in ps), "after_cpu_s": med(p["after"][0] for p in ps),
             "cpu_ratio": med(p["after"][0] / p["before"][0] for p in ps),
             "before_wall_s": med(p["before"][1] for p in ps), "after_wall_s": med(p["after"][1] for p in ps),
             "wall_ratio": med(p["after"][1] / p["before"][1] for p in ps)} for name, ps in pairs.items()]


def render_ab(rows: list[dict]) -> None:
    print("| replay | before CPU s | after CPU s | after/before (pairs) | before wall_s | after wall_s | after/before (pairs) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['replay']} | {r['before_cpu_s']:.2f} | {r['after_cpu_s']:.2f} | {r['cpu_ratio']:.2f} | "
              f"{r['before_wall_s']:.2f} | {r['after_wall_s']:.2f} | {r['wall_ratio']:.2f} |")


# --- the CPU data plane's backends (tierdiag/native/cplane.py) ----------------------------------
CPU_KERNEL_PAGES = (1, 8, 64, 256, 1024)
CPU_KERNEL_OPS = ("move", "write", "verify", "alloc+free")


def measure_cpu_kernels(*, repeats: int, calls: int = 400, seed: int = 0) -> list[dict]:
    """us a call of each operation, numpy and C alternately (medians of `repeats` rounds of
    `calls` calls), on a device and host pool of the engine's CPU geometry."""
    import random

    from tierdiag.engine import content, rows
    from tierdiag.engine.dataplane import DataPlane
    from tierdiag.engine.pagepool import PagePool
    from tierdiag.native import cplane

    if cplane.C is None:
        raise SystemExit(f"the compiled CPU data plane is not available: {cplane.WHY_NOT}")
    plane = DataPlane(4, 8, "cpu", False, 1 << 20, layout="page_first")
    device = PagePool("device", 65536, plane, on_device=True)
    host = PagePool("host", 131072, plane, on_device=False)
    rng = random.Random(seed)
    out = []
    for n in CPU_KERNEL_PAGES:
        s, d = rng.sample(range(device.capacity), n), rng.sample(range(host.capacity), n)
        keys = np.array([rng.getrandbits(63) - 2**62 for _ in range(n)], dtype=np.int64)
        slots = PagePool("host", 4 * n, plane, on_device=False)
        ops = {
            "move": {"numpy": lambda: rows.copy_rows_numpy(device.rows, s, host.rows, d),
                     "c": lambda: rows.copy_rows_c(device.rows, s, host.rows, d)},
            "write": {"numpy": lambda: content.write_content_numpy(device, s, keys),
                      "c": lambda: content.write_content_c(device, s, keys)},
            "verify": {"numpy": lambda: content.verify_content_numpy(device, s, keys),
                       "c": lambda: content.verify_content_c(device, s, keys)},
            "alloc+free": {"numpy": lambda: PagePool._free_numpy(slots, PagePool._alloc_numpy(slots, n)),
                           "c": lambda: PagePool._free_c(slots, PagePool._alloc_c(slots, n))},
        }
        row = {"pages": n}
        for op, sides in ops.items():
            times: dict[str, list[float]] = {"numpy": [], "c": []}
            for rep in range(repeats + 1):  # the first round warms up
                for side in (("numpy", "c") if rep % 2 == 0 else ("c", "numpy")):
                    f = sides[side]
                    t0 = time.perf_counter_ns()
                    for _ in range(calls):
                        f()
                    if rep:
                        times[side].append((time.perf_counter_ns() - t0) / calls / 1e3)
            row[f"{op}_numpy_us"] = statistics.median(times["numpy"])
            row[f"{op}_c_us"] = statistics.median(times["c"])
        out.append(row)
    return out


_ENGINE_RUN = """
import gc, json, sys, tempfile, time
from dataclasses import replace
from pathlib import Path
from tierdiag.native import cplane
from tierdiag.config.engine import EngineConfig
from tierdiag.engine.engine import Engine
from tierdiag.trace.reader import ReadReport, read_trace
cfg = replace(EngineConfig(), **json.loads(sys.argv[2]))
reqs = list(read_trace(Path(sys.argv[1]), block_size=cfg.block_size, skip_bad=False, report=ReadReport()))
gc.set_threshold(50_000, 20, 100)  # as a replay sets it
with tempfile.TemporaryDirectory() as storage:
    engine = Engine(cfg, storage_dir=storage)
    c, t = time.process_time(), time.perf_counter()
    engine.run(reqs)
    print(json.dumps([cplane.CPU_KERNEL, time.process_time() - c, time.perf_counter() - t]))
"""

ENGINE_RUNS = (
    ("conversation", "conversation_trace.jsonl", {}),
    ("synthetic", "synthetic_trace.jsonl", {}),
    ("conversation, verify all", "conversation_trace.jsonl", {"verify": "all"}),
    ("conversation, storage 50M tokens", "conversation_trace.jsonl", {"storage_tokens": 50_000_000}),
)


def engine_cpu_kernels(*, repeats: int, traces: Path, only: str = "") -> list[dict]:
    """Engine.run's CPU and wall seconds with each backend, in fresh processes, interleaved."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    runs = [r for r in ENGINE_RUNS if only in r[0]]
    pairs: dict[str, list[dict]] = {name: [] for name, _, _ in runs}
    for rep in range(repeats):
        for name, trace, cfg in runs:
            pair = {}
            for kernel in (("numpy", "c") if rep % 2 == 0 else ("c", "numpy")):
                out = subprocess.run([sys.executable, "-c", _ENGINE_RUN, str(traces / trace), json.dumps(cfg)],
                                     cwd=root, capture_output=True, text=True, check=True,
                                     env={**os.environ, "PYTHONPATH": str(root), "TIERDIAG_CPLANE": kernel})
                used, cpu_s, wall_s = json.loads(out.stdout)
                assert used == kernel, f"asked for {kernel}, ran {used}"
                pair[kernel] = (cpu_s, wall_s)
            pairs[name].append(pair)
            print(f"{rep} {name}: numpy {pair['numpy'][0]:.2f} s CPU, c {pair['c'][0]:.2f} s CPU",
                  file=sys.stderr, flush=True)
    med = statistics.median
    return [{"run": name, "repeats": len(ps),
             "numpy_cpu_s": med(p["numpy"][0] for p in ps), "c_cpu_s": med(p["c"][0] for p in ps),
             "cpu_ratio": med(p["c"][0] / p["numpy"][0] for p in ps),
             "numpy_wall_s": med(p["numpy"][1] for p in ps), "c_wall_s": med(p["c"][1] for p in ps)}
            for name, ps in pairs.items()]


def render_cpu_kernels(calls: list[dict], engine: list[dict]) -> None:
    print("| pages a call | " + " | ".join(f"{op} numpy us | {op} C us" for op in CPU_KERNEL_OPS) + " |")
    print("|---" * (1 + 2 * len(CPU_KERNEL_OPS)) + "|")
    for r in calls:
        cells = [f"{r[f'{op}_{side}_us']:.2f}" for op in CPU_KERNEL_OPS for side in ("numpy", "c")]
        print(f"| {r['pages']:,} | " + " | ".join(cells) + " |")
    print()
    print("| Engine.run | numpy CPU s | C CPU s | C/numpy (pairs) | numpy wall s | C wall s |")
    print("|---|---|---|---|---|---|")
    for r in engine:
        print(f"| {r['run']} | {r['numpy_cpu_s']:.2f} | {r['c_cpu_s']:.2f} | {r['cpu_ratio']:.2f} | "
              f"{r['numpy_wall_s']:.2f} | {r['c_wall_s']:.2f} |")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--replay-ab", type=Path, metavar="BEFORE", help="checkout to compare replays with (see above)")
    ap.add_argument("--traces", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "traces")
    ap.add_argument("--only", default="", help="with --replay-ab or --cpu-kernels: only the replays whose name contains this")
    ap.add_argument("--cpu-kernels", action="store_true", help="the CPU data plane's backends, C and numpy (see above)")
    args = ap.parse_args(argv)
    if args.cpu_kernels:
        calls = measure_cpu_kernels(repeats=args.repeats or 5)
        engine = engine_cpu_kernels(repeats=args.repeats or 3, traces=args.traces.resolve(), only=args.only)
        if args.json:
            print(json.dumps({"calls": calls, "engine": engine}, indent=2))
        else:
            render_cpu_kernels(calls, engine)
        return
    if args.replay_ab is not None:
        rows = replay_ab(args.replay_ab.resolve(), Path(__file__).resolve().parents[1], repeats=args.repeats or 3,
                         traces=args.traces.resolve(), only=args.only)
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            render_ab(rows)
        return
    rows = measure(quick=args.quick, repeats=args.repeats or (3 if args.quick else 7))
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        render(rows)


if __name__ == "__main__":
    main()
