"""GB/s of the copy kernels on an NVIDIA GPU: torch path, Triton kernel and the ceiling.

For page sizes 16 KiB .. 2 MiB (one page across all layers; 4 layers, layer-first host pool,
pinned) and 1 .. 4,096 pages per transfer (capped at --max-mib per transfer), medians of
--repeats, side by side in one run:
  contiguous  one pinned cudaMemcpyAsync of the same bytes (the ceiling), on the copy stream;
  torch       kernels.load_back / kernels.backup with backend="torch" (staging, index ops);
  triton      the same with backend="triton" (kernels_triton.py: one pass, GPU reads/writes
              pinned host memory);
for load-back (host -> device) and backup (device -> host), random distinct pages on both
sides. Prints the table and writes it as JSON (--json FILE). Without a GPU it says so on one
line, writes the reason to the JSON and exits 0 (benchmarks/gpu_check.sh's CPU dry run).

    .venv/bin/python benchmarks/gpu_table.py [--quick] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from tierdiag.engine import kernels  # noqa: E402

LAYERS = 4
PAGE_SIZES = [16 << 10, 64 << 10, 256 << 10, 2 << 20]
PAGE_COUNTS = [1, 16, 256, 4096]


def _events_ns(fn, stream) -> int:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        start.record(stream)
        fn()
        end.record(stream)
    end.synchronize()
    return int(start.elapsed_time(end) * 1e6)


def measure(*, quick: bool, repeats: int, max_mib: int, seed: int = 0) -> dict:
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA GPU (torch.cuda.is_available() is False): GPU table not measured"}
    try:
        from tierdiag.engine import kernels_triton
        triton_why = None if kernels_triton.AVAILABLE else kernels_triton.IMPORT_ERROR
    except ImportError as exc:
        triton_why = str(exc)
    backends = ("torch", "triton") if triton_why is None else ("torch",)
    device = torch.device("cuda")
    stream = kernels._SideStreams.get(device)
    rng = np.random.default_rng(seed)
    page_sizes = PAGE_SIZES[::3] if quick else PAGE_SIZES
    counts = [1, 256] if quick else PAGE_COUNTS
    rows = []
    for page_bytes in page_sizes:
        elems = page_bytes // LAYERS // 8
        fit = [n for n in counts if n * page_bytes <= max_mib << 20]
        skipped = [n for n in counts if n not in fit]
        if not fit:
            continue
        pool_pages = 2 * max(fit)  # room to scatter over twice the largest transfer
        host = torch.empty((LAYERS, pool_pages, elems), dtype=torch.int64).pin_memory()
        host.copy_(torch.randint(0, 2**62, host.shape, dtype=torch.int64))
        dev = torch.zeros((LAYERS, pool_pages, elems), dtype=torch.int64, device=device)
        hflat, dflat = host.view(-1), dev.view(-1)
        for backend in backends:  # warm-up: CUDA context, Triton compile, first touches
            kernels.load_back(host, list(range(fit[-1])), dev, list(range(fit[-1])), backend=backend).wait()
            kernels.backup(dev, list(range(fit[-1])), host, list(range(fit[-1])), backend=backend)
        for n in fit:
            t: dict[str, list[int]] = {}
            numel = n * LAYERS * elems
            for _ in range(repeats):
                hp = rng.permutation(pool_pages)[:n].tolist()
                dp = rng.permutation(pool_pages)[:n].tolist()
                t.setdefault("load_contiguous", []).append(
                    _events_ns(lambda: dflat[:numel].copy_(hflat[:numel], non_blocking=True), stream))
                t.setdefault("backup_contiguous", []).append(
                    _events_ns(lambda: hflat[:numel].copy_(dflat[:numel], non_blocking=True), stream))
                for backend in backends:
                    t.setdefault(f"load_{backend}", []).append(
                        kernels.load_back(host, hp, dev, dp, backend=backend).wait())
                    t.setdefault(f"backup_{backend}", []).append(kernels.backup(dev, dp, host, hp, backend=backend))
            nbytes = n * page_bytes
            row = {"page_bytes": page_bytes, "pages": n, "bytes": nbytes}
            for key, values in t.items():
                row[f"{key}_gbps"] = nbytes / statistics.median(values)
            rows.append(row)
        for n in skipped:
            rows.append({"page_bytes": page_bytes, "pages": n, "bytes": n * page_bytes,
                         "skipped": f"over --max-mib {max_mib}"})
        del host, dev
        torch.cuda.empty_cache()
    return {"device": torch.cuda.get_device_name(device), "layers": LAYERS, "repeats": repeats,
            "backends": list(backends), "triton": triton_why or "measured", "rows": rows}


def render(res: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console() if sys.stdout.isatty() else Console(width=160)
    if "skipped" in res:
        con.print(f"gpu table: skipped: {res['skipped']}")
        return
    table = Table(title=f"copy kernels on {res['device']} ({res['layers']} layers, layer-first pinned host pool; "
                        f"GB/s, medians of {res['repeats']}; triton: {res['triton']})")
    cols = ["page", "pages", "MiB"]
    for direction in ("load", "backup"):
        cols += [f"{direction} contig", f"{direction} torch", f"{direction} triton", f"{direction} triton/contig"]
    for col in cols:
        table.add_column(col, justify="right")
    for r in res["rows"]:
        cells = [f"{r['page_bytes'] // 1024} KiB", f"{r['pages']:,}", f"{r['bytes'] / 2**20:.2f}"]
        if "skipped" in r:
            table.add_row(*cells, f"skipped ({r['skipped']})", *[""] * (len(cols) - 4))
            continue
        for direction in ("load", "backup"):
            contig = r[f"{direction}_contiguous_gbps"]
            tri = r.get(f"{direction}_triton_gbps")
            cells += [f"{contig:.1f}", f"{r[f'{direction}_torch_gbps']:.1f}",
                      f"{tri:.1f}" if tri else "-", f"{tri / contig:.0%}" if tri else "-"]
        table.add_row(*cells)
    con.print(table)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="two page sizes, two counts, 3 repeats")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--max-mib", type=int, default=1024, help="largest transfer measured (default 1024)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    res = measure(quick=args.quick, repeats=args.repeats or (3 if args.quick else 5), max_mib=args.max_mib)
    render(res)
    if args.json:
        args.json.write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
