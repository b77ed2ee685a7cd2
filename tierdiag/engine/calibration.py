"""Measure the copy kernels on this machine and write a profile the cost model can use.

For each transfer size (one page to thousands) and several repeats, side by side in one run:
- contiguous: one flat copy of the same bytes (host -> device), the yardstick (CPU: the faster
              of torch's copy_ and a single-threaded memcpy; CUDA: pinned cudaMemcpyAsync);
- load-back:  `kernels.load_back` of scattered host pages into scattered device pages;
- load-back to a run: scattered host pages into consecutive device pages (what a fresh or
              defragmented device pool hands out; one gather, no second pass);
- backup:     `kernels.backup` of scattered device pages into scattered host pages.
Medians per size go into the table; `time = overhead + bytes / bandwidth` is fitted on them
(least squares on relative error, so the 1-page rows pin the overhead and the big rows the
bandwidth). Device = CUDA when present (pinned host pool, side stream), else CPU.

On CUDA with triton installed, load-back and backup are timed on both paths (torch and the
Triton kernel, kernels_triton.py); the smallest size from which Triton wins at every larger size
becomes the threshold (`triton_min_bytes`, set for this process and saved in the profile, which
kernels.py reads on first CUDA use), and each row says which path that size uses.

The profile's `h2d_bytes_per_s`, `d2h_bytes_per_s` and `transfer_overhead_ns` are what
`replay --profile` reads (see costmodel.CostModel.from_config).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from tierdiag.engine import kernels
from tierdiag.paths import write_output

PROFILE_FORMAT = "tierdiag-calibrate/1"
PATTERN = "random pages on both sides (distinct, unsorted)"


def default_profile_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tierdiag" / "profile.json"


@dataclass(frozen=True)
class CalibrationRow:
    pages: int
    bytes: int
    contiguous_ns: int  # the faster of the two contiguous copies below (the yardstick)
    load_back_ns: int   # the path the kernels choose for this size (`load_back_path`)
    load_back_to_run_ns: int
    backup_ns: int
    load_back_plan: str  # which kernel path the planner chose for this transfer
    load_back_path: str = "torch"  # "torch" | "triton": what kernels.load_back picks at this size
    backup_path: str = "torch"
    # CPU: torch's copy_ (on torch's threads) and one thread's memcpy, medians side by side; CUDA:
    # one pinned cudaMemcpyAsync (both fields the same).
    contiguous_torch_ns: int | None = None
    contiguous_memcpy_ns: int | None = None
    # CUDA only: both load-back and backup paths, medians side by side (None where not run)
    load_back_torch_ns: int | None = None
    load_back_triton_ns: int | None = None
    backup_torch_ns: int | None = None
    backup_triton_ns: int | None = None

    @property
    def contiguous_bytes_per_s(self) -> float:
        return self.bytes / self.contiguous_ns * 1e9

    @property
    def load_back_bytes_per_s(self) -> float:
        return self.bytes / self.load_back_ns * 1e9

    @property
    def backup_bytes_per_s(self) -> float:
        return self.bytes / self.backup_ns * 1e9

    @property
    def load_back_vs_contiguous(self) -> float:
        return self.contiguous_ns / self.load_back_ns

    def to_json(self) -> dict[str, Any]:
        return dict(asdict(self),
                    contiguous_bytes_per_s=self.contiguous_bytes_per_s,
                    load_back_bytes_per_s=self.load_back_bytes_per_s,
                    backup_bytes_per_s=self.backup_bytes_per_s,
                    load_back_vs_contiguous=self.load_back_vs_contiguous,
                    load_back_to_run_vs_contiguous=self.contiguous_ns / self.load_back_to_run_ns,
                    backup_vs_contiguous=self.contiguous_ns / self.backup_ns)


@dataclass(frozen=True)
class LinearFit:
    overhead_ns: float
    bytes_per_s: float


@dataclass(frozen=True)
class Profile:
    device: str
    created_at: str
    h2d_bytes_per_s: float
    d2h_bytes_per_s: float
    transfer_overhead_ns: int
    backup_overhead_ns: int
    contiguous_bytes_per_s: float
    load_back_vs_contiguous: float
    load_back_to_run_vs_contiguous: float
    backup_vs_contiguous: float
    num_layers: int
    page_bytes: int  # one page across all layers
    pattern: str
    repeats: int
    quick: bool
    wall_s: float
    torch_threads: int
    load_average_1m: float  # > CPU count means other work competed with the measurement
    table: tuple[CalibrationRow, ...]
    host: dict
    # The Triton kernel: "measured" (CUDA: both paths timed, threshold below), or why not.
    triton: str = "not measured"
    triton_min_bytes: int | None = None  # Triton from this transfer size up (None: never)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["format"] = PROFILE_FORMAT
        out["table"] = [r.to_json() for r in self.table]
        return out


def fit_overhead_and_bandwidth(sizes_bytes: list[int], times_ns: list[float]) -> LinearFit:
    """Fit t = a + b * bytes minimising relative error; a >= 0, b > 0."""
    x = np.asarray(sizes_bytes, dtype=np.float64)
    t = np.asarray(times_ns, dtype=np.float64)
    w = 1.0 / t  # relative error: small transfers count as much as big ones
    a_mat = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    (a, b), *_ = np.linalg.lstsq(a_mat, t * w, rcond=None)
    if b <= 0:  # degenerate (all sizes equal, or noise): no bandwidth term to speak of
        b = float(np.min(t / x))
    if a < 0:  # refit through the origin: negative overhead is noise
        a, b = 0.0, float(np.sum(w * w * x * t) / np.sum(w * w * x * x))
    return LinearFit(overhead_ns=float(a), bytes_per_s=1e9 / float(b))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _measure_contiguous(host_flat: torch.Tensor, dev_flat: torch.Tensor, numel: int,
                        stream: Any, src_at: int = 0, dst_at: int = 0) -> tuple[int, int]:
    """One flat host -> device copy of `numel` elements from element `src_at` to `dst_at`:
    (torch copy_, one thread's memcpy) ns on the CPU; (cudaMemcpyAsync, same) from pinned
    memory on a side stream on CUDA. Callers move the offsets around the pools, so the block
    is as cold or warm in the caches as the scattered pages it is compared with.

    On the CPU torch splits a big copy over its threads; on a busy machine waking the second
    thread can cost milliseconds, which would flatter every ratio against it. So the yardstick
    is the faster of a torch copy and numpy's single-threaded memcpy, measured side by side.
    """
    src = host_flat[src_at:src_at + numel]
    dst = dev_flat[dst_at:dst_at + numel]
    if stream is None:
        t0 = time.perf_counter_ns()
        dst.copy_(src)
        t1 = time.perf_counter_ns()
        np.copyto(dst.numpy(), src.numpy())
        return t1 - t0, time.perf_counter_ns() - t1
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        start.record(stream)
        dst.copy_(src, non_blocking=True)
        end.record(stream)
    end.synchronize()
    ns = int(start.elapsed_time(end) * 1e6)
    return ns, ns


def _settle(cuda: bool) -> None:
    """Before each timed CPU copy, sleep a millisecond: on a machine with more runnable work
    than cores the scheduler otherwise preempts whichever copy crosses the end of a time slice
    (a 3 ms copy measured as 20 ms, the 1 ms one beside it not), and the ratios would measure
    the scheduler. Every measurement gets the same, so the comparison stays side by side."""
    if not cuda:
        time.sleep(0.001)


def pick_triton_min_bytes(sizes_bytes: list[int], torch_ns: list[float], triton_ns: list[float]) -> int | None:
    """Smallest measured size from which Triton is at least as fast as the torch path at every
    larger measured size (vLLM's rule for its swap-blocks kernel); None if it loses at the largest."""
    min_bytes = None
    for size, t_torch, t_triton in reversed(list(zip(sizes_bytes, torch_ns, triton_ns))):
        if t_triton > t_torch:
            break
        min_bytes = size
    return min_bytes


def _triton_status(cuda: bool, host: torch.Tensor) -> str:
    """"measured" when calibrate can time the Triton kernel here, else why not."""
    if not cuda:
        return "not used on CPU (the kernel runs on CUDA; tests run it under Triton's interpreter)"
    try:
        from tierdiag.engine import kernels_triton
    except ImportError as exc:
        return f"unavailable: {exc}"
    if not kernels_triton.AVAILABLE:
        return f"unavailable: {kernels_triton.IMPORT_ERROR}"
    if not host.is_pinned():
        return "unavailable: host pool is not pinned"
    return "measured"


def calibrate(*, quick: bool = False, num_layers: int = 4, row_bytes: int = 4096,
              seed: int = 0, progress: Callable[[str], None] | None = None) -> Profile:
    """Run the measurements (default ~10 s on a laptop CPU, `quick` ~1-2 s) and return the profile."""
    t_start = time.perf_counter()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda") if cuda else torch.device("cpu")
    sizes = [1, 4, 16, 64, 256, 1024] if quick else [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
    repeats = 3 if quick else 7
    max_pages = sizes[-1]
    pool_pages = 2 * max_pages  # room for pages scattered over twice the transfer
    elems = row_bytes // 8
    host = torch.empty((num_layers, pool_pages, elems), dtype=torch.int64, pin_memory=cuda)
    host.copy_(torch.randint(0, 2**62, host.shape, dtype=torch.int64))
    dev = torch.zeros((num_layers, pool_pages, elems), dtype=torch.int64, device=device)
    host_flat, dev_flat = host.view(-1), dev.view(-1)
    stream = kernels._SideStreams.get(device) if cuda else None
    page_bytes = num_layers * row_bytes
    rng = np.random.default_rng(seed)

    triton_status = _triton_status(cuda, host)
    with_triton = triton_status == "measured"
    backends = ("torch", "triton") if with_triton else ("torch",)

    # warm-up: first touches fault pages in, first CUDA calls initialise the context (and
    # compile the Triton kernel)
    for backend in backends:
        kernels.load_back(host, list(range(max_pages)), dev, list(range(max_pages)), backend=backend).wait()
        kernels.backup(dev, list(range(max_pages)), host, list(range(max_pages)), backend=backend)
    _sync(device)

    measured: list[dict[str, Any]] = []
    for n in sizes:
        t: dict[str, list[int]] = {k: [] for k in ("contig_torch", "contig_memcpy", "to_run")}
        plan = ""
        for _ in range(repeats):
            host_pages = rng.permutation(pool_pages)[:n].tolist()
            dev_pages = rng.permutation(pool_pages)[:n].tolist()
            numel = n * num_layers * elems
            src_at, dst_at = (int(x) * elems for x in rng.integers(0, num_layers * pool_pages - n * num_layers + 1, 2))
            _settle(cuda)
            c_torch, c_memcpy = _measure_contiguous(host_flat, dev_flat, numel, stream, src_at, dst_at)
            t["contig_torch"].append(c_torch)
            t["contig_memcpy"].append(c_memcpy)
            for backend in backends:
                _settle(cuda)
                handle = kernels.load_back(host, host_pages, dev, dev_pages, backend=backend)
                t.setdefault(f"load_{backend}", []).append(handle.wait())
                if backend == "torch":
                    plan = handle.plan_kind
            _settle(cuda)
            t["to_run"].append(kernels.load_back(host, host_pages, dev, range(max_pages - n, max_pages)).wait())
            for backend in backends:
                _settle(cuda)
                t.setdefault(f"backup_{backend}", []).append(
                    kernels.backup(dev, dev_pages, host, host_pages, backend=backend))
        med = {k: max(1, int(statistics.median(v))) for k, v in t.items()}
        measured.append(dict(n=n, med=med, plan=plan))
        if progress:
            progress(f"{n} pages: load-back {n * page_bytes / med['load_torch']:.2f} GB/s (torch), "
                     f"contiguous {n * page_bytes / min(med['contig_torch'], med['contig_memcpy']):.2f} GB/s")

    # Where Triton wins, the kernels use it from then on (this process; replay reads the profile).
    triton_min_bytes = None
    if with_triton:
        from tierdiag.engine import kernels_triton

        sizes_b = [m["n"] * page_bytes for m in measured]
        triton_min_bytes = pick_triton_min_bytes(
            sizes_b, [m["med"]["load_torch"] + m["med"]["backup_torch"] for m in measured],
            [m["med"]["load_triton"] + m["med"]["backup_triton"] for m in measured])
        kernels_triton.set_min_bytes(triton_min_bytes)

    rows: list[CalibrationRow] = []
    for m in measured:
        n, med = m["n"], m["med"]
        nbytes = n * page_bytes
        path = "triton" if triton_min_bytes is not None and nbytes >= triton_min_bytes else "torch"
        rows.append(CalibrationRow(
            n, nbytes, min(med["contig_torch"], med["contig_memcpy"]), med[f"load_{path}"], med["to_run"],
            med[f"backup_{path}"], "triton" if path == "triton" else m["plan"], path, path,
            med["contig_torch"], med["contig_memcpy"], med["load_torch"], med.get("load_triton"),
            med["backup_torch"], med.get("backup_triton")))

    sizes_b = [r.bytes for r in rows]
    h2d = fit_overhead_and_bandwidth(sizes_b, [r.load_back_ns for r in rows])
    d2h = fit_overhead_and_bandwidth(sizes_b, [r.backup_ns for r in rows])
    contig = fit_overhead_and_bandwidth(sizes_b, [r.contiguous_ns for r in rows])
    # The headline ratio is taken in the bulk regime (the largest transfers), where fixed
    # per-call costs no longer hide the kernel's bandwidth.
    bulk = rows[-2:] if len(rows) >= 2 else rows
    lb_vs = sum(r.contiguous_ns for r in bulk) / sum(r.load_back_ns for r in bulk)
    run_vs = sum(r.contiguous_ns for r in bulk) / sum(r.load_back_to_run_ns for r in bulk)
    bk_vs = sum(r.contiguous_ns for r in bulk) / sum(r.backup_ns for r in bulk)
    from tierdiag.engine.hardware import hardware_summary

    device_name = torch.cuda.get_device_name(device) if cuda else f"cpu ({os.cpu_count()} cores)"
    return Profile(
        device=f"{device.type}: {device_name}",
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        h2d_bytes_per_s=h2d.bytes_per_s, d2h_bytes_per_s=d2h.bytes_per_s,
        transfer_overhead_ns=int(round(h2d.overhead_ns)), backup_overhead_ns=int(round(d2h.overhead_ns)),
        contiguous_bytes_per_s=contig.bytes_per_s,
        load_back_vs_contiguous=lb_vs, load_back_to_run_vs_contiguous=run_vs, backup_vs_contiguous=bk_vs,
        num_layers=num_layers, page_bytes=page_bytes, pattern=PATTERN, repeats=repeats, quick=quick,
        wall_s=time.perf_counter() - t_start, torch_threads=torch.get_num_threads(),
        load_average_1m=os.getloadavg()[0], table=tuple(rows),
        host=dict(hardware_summary(), hostname=socket.gethostname()),
        triton=triton_status, triton_min_bytes=triton_min_bytes,
    )


def save_profile(profile: Profile, path: Path) -> Path:
    """Write the profile JSON atomically (a reader never sees half a file)."""
    path = Path(path).expanduser()
    # The one output writer (tierdiag/paths.py): never over a DuckDB store, an exclusive temporary
    # file renamed into place, a FIFO or device streamed into.
    write_output(path, (json.dumps(profile.to_json(), indent=2) + "\n").encode("utf-8"), what="-o")
    return path
