"""`tierdiag calibrate`: measure the copy kernels here and save a profile for `replay --profile`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from tierdiag.cli.common import JsonOpt, err, out, print_json

OutOpt = Annotated[Optional[Path], typer.Option(
    "--out", "-o", help="Where to write the profile (default ~/.cache/tierdiag/profile.json).")]
QuickOpt = Annotated[bool, typer.Option("--quick", help="Fewer sizes and repeats: a couple of seconds.")]


def _gbps(v: float) -> str:
    return f"{v / 1e9:.2f}"


def _size(n: int) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.0f} {unit}"
    return f"{n} B"


def calibrate(json_: JsonOpt = False, out_path: OutOpt = None, quick: QuickOpt = False) -> None:
    """Measure contiguous copy bandwidth, load-back (host->device) and backup (device->host)
    kernel bandwidth from one page to thousands, and the per-transfer overhead; write the
    profile the cost model reads with `tierdiag replay --profile FILE`."""
    from tierdiag.engine.calibration import calibrate as run_calibration
    from tierdiag.engine.calibration import default_profile_path, save_profile

    path = out_path if out_path is not None else default_profile_path()
    if json_:
        profile = run_calibration(quick=quick)
    else:
        with err.status("measuring copy kernels…") as status:
            profile = run_calibration(quick=quick, progress=lambda msg: status.update(msg))
    written = save_profile(profile, path)
    if json_:
        print_json(profile.to_json())
        err.print(f"profile written to {written}")
        return
    table = Table(title=f"copy kernels on {profile.device} "
                        f"({profile.num_layers} layers, {_size(profile.page_bytes)} per page; GB/s, medians "
                        f"of {profile.repeats})")
    for col in ("pages", "size", "contig", "load", "load→run", "backup", "load/contig", "plan"):
        table.add_column(col, justify="right" if col != "plan" else "left")
    for r in profile.table:
        ratio = r.load_back_vs_contiguous
        table.add_row(f"{r.pages:,}", _size(r.bytes), _gbps(r.contiguous_bytes_per_s),
                      _gbps(r.load_back_bytes_per_s), _gbps(r.bytes / r.load_back_to_run_ns * 1e9),
                      _gbps(r.backup_bytes_per_s), f"{ratio:.0%}", r.load_back_plan)
    out.print(table)
    out.print(f"load-back (h2d): {_gbps(profile.h2d_bytes_per_s)} GB/s + {profile.transfer_overhead_ns / 1e3:.1f} us "
              f"per transfer; backup (d2h): {_gbps(profile.d2h_bytes_per_s)} GB/s + "
              f"{profile.backup_overhead_ns / 1e3:.1f} us; contiguous {_gbps(profile.contiguous_bytes_per_s)} GB/s")
    out.print(f"bulk transfers vs a contiguous copy: load-back {profile.load_back_vs_contiguous:.0%} "
              f"(scattered both sides), {profile.load_back_to_run_vs_contiguous:.0%} into a device run; "
              f"backup {profile.backup_vs_contiguous:.0%}")
    if profile.load_average_1m > (profile.host.get("cpu_count") or 1):
        out.print(f"[yellow]note[/]: load average {profile.load_average_1m:.1f} on "
                  f"{profile.host.get('cpu_count')} CPUs while measuring: other work competed; re-run when idle")
    out.print(f"profile written to {written}  (use: tierdiag replay TRACE --profile {written})")
