"""Measure the copy kernels on this machine and write a profile the cost model can use.

For each transfer size (one page to thousands) and several repeats, side by side in one run:
- contiguous: one flat copy of the same bytes (host -> device), the yardstick;
- load-back:  `kernels.load_back` of scattered host pages into scattered device pages;
- load-back to a run: scattered host pages into consecutive device pages (what a fresh or
              defragmented device pool hands out; one gather, no second pass);
- backup:     `kernels.backup` of scattered device pages into scattered host pages.
Medians per size go into the table; `time = overhead + bytes / bandwidth` is fitted on them
(least squares on relative error, so the 1-page rows pin the overhead and the big rows the
bandwidth). Device = CUDA when present (pinned host pool, side stream), else CPU.

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
from tierdiag.errors import OutputError

PROFILE_FORMAT = "tierdiag-calibrate/1"
PATTERN = "random pages on both sides (distinct, unsorted)"


def default_profile_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tierdiag" / "profile.json"


@dataclass(frozen=True)
class CalibrationRow:
    pages: int
    bytes: int
    contiguous_ns: int
    load_back_ns: int
    load_back_to_run_ns: int
    backup_ns: int
    load_back_plan: str  # which kernel path the planner chose for this transfer

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
                        stream: Any) -> int:
    """One flat host -> device copy of `numel` elements (pinned + side stream on CUDA)."""
    if stream is None:
        t0 = time.perf_counter_ns()
        dev_flat[:numel].copy_(host_flat[:numel])
        return time.perf_counter_ns() - t0
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        start.record(stream)
        dev_flat[:numel].copy_(host_flat[:numel], non_blocking=True)
        end.record(stream)
    end.synchronize()
    return int(start.elapsed_time(end) * 1e6)


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

    # warm-up: first touches fault pages in, first CUDA calls initialise the context
    kernels.load_back(host, list(range(max_pages)), dev, list(range(max_pages))).wait()
    kernels.backup(dev, list(range(max_pages)), host, list(range(max_pages)))
    _sync(device)

    rows: list[CalibrationRow] = []
    for n in sizes:
        contiguous, loads, to_run, backups = [], [], [], []
        plan = ""
        for _ in range(repeats):
            host_pages = rng.permutation(pool_pages)[:n].tolist()
            dev_pages = rng.permutation(pool_pages)[:n].tolist()
            contiguous.append(_measure_contiguous(host_flat, dev_flat, n * num_layers * elems, stream))
            handle = kernels.load_back(host, host_pages, dev, dev_pages)
            loads.append(handle.wait())
            plan = handle.plan_kind
            to_run.append(kernels.load_back(host, host_pages, dev, range(max_pages - n, max_pages)).wait())
            backups.append(kernels.backup(dev, dev_pages, host, host_pages))
        row = CalibrationRow(n, n * page_bytes, int(statistics.median(contiguous)),
                             max(1, int(statistics.median(loads))), max(1, int(statistics.median(to_run))),
                             max(1, int(statistics.median(backups))), plan)
        rows.append(row)
        if progress:
            progress(f"{n} pages: load-back {row.load_back_bytes_per_s / 1e9:.2f} GB/s, "
                     f"contiguous {row.contiguous_bytes_per_s / 1e9:.2f} GB/s")

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
    )


def save_profile(profile: Profile, path: Path) -> Path:
    """Write the profile JSON atomically (a reader never sees half a file)."""
    path = Path(path).expanduser()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(profile.to_json(), indent=2) + "\n")
        tmp.replace(path)
    except OSError as exc:
        raise OutputError(f"cannot write profile {path}: {exc.strerror or exc}") from None
    return path
