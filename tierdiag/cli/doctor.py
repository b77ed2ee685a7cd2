"""`tierdiag doctor`: versions, GPUs and PCIe links, pinned memory; what would slow load-back."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from tierdiag.cli.common import JsonOpt
from tierdiag.cli.sink import Sink, renders
from tierdiag.report.terminal import plain

_MARK = {"ok": "green", "info": "cyan", "warn": "yellow"}


def _gib(n: int | None) -> str:
    return f"{n / 2**30:.1f} GiB" if n is not None else "?"


def _link(gen: int | None, width: int | None) -> str:
    return f"Gen {gen if gen is not None else '?'} x{width if width is not None else '?'}"


def _gbps(v: float | None) -> str:
    return f"{v / 1e9:.1f} GB/s" if v else "?"


def doctor(json_: JsonOpt = False) -> None:
    """Check this machine: Python, torch and CUDA versions, GPUs through NVML (memory, PCIe
    generation and width, current and max, theoretical link bandwidth), pinned memory."""
    from tierdiag.engine.hardware import doctor_report

    Sink(json=json_).emit(doctor_report())


@renders("tierdiag.engine.hardware.DoctorReport")
def _text(report, out) -> None:
    plane = report.cpu_data_plane
    t = report.torch
    setup = Table(title="tierdiag doctor", show_header=False)
    setup.add_column("what", style="bold")
    setup.add_column("value")
    setup.add_row("tierdiag", report.tierdiag_version)
    setup.add_row("python", f"{report.python_version} on {report.platform} ({report.cpu_count} CPUs)")
    if t.version is None:
        setup.add_row("torch", plain(t.error, "yellow"))
    else:
        build = f"built for CUDA {t.cuda_build}" if t.cuda_build else "CPU-only build"
        usable = f"{t.device_count} CUDA device(s) usable" if t.cuda_available else "CUDA not usable"
        setup.add_row("torch", f"{t.version} ({build}; {usable})")
    n = report.nvml
    if n.available:
        setup.add_row("driver", f"{n.driver_version or '?'} (supports CUDA {n.cuda_driver_version or '?'})")
    else:
        setup.add_row("driver", plain(n.error, "yellow"))
    setup.add_row("CPU data plane", Text("compiled (tierdiag/native/_cplane)", "green") if plane["kernel"] == "c"
                  else Text.assemble(("Python/numpy: ", "yellow"), plain(plane["why_not"] or "")))
    core = report.engine_core
    setup.add_row("engine core", Text(f"compiled ({core['why']})", "green") if core.get("mode") == "compiled"
                  else Text.assemble(("Python: ", "yellow"), plain(core.get("why") or "")))
    passes = report.diagnose_passes
    slow = {name: p["why"] for name, p in passes.items() if p["mode"] != "compiled"}
    setup.add_row("diagnose passes",
                  Text(f"compiled ({', '.join(passes)})", "green") if not slow
                  else Text.assemble(("Python/numpy: ", "yellow"),
                                     plain("; ".join(f"{name} {why}" for name, why in slow.items())
                                           + " (the same evidence, slower on large runs)")))
    pin = report.pinned_memory
    setup.add_row("pinned memory", Text.assemble(("yes ", "green") if pin.available else "no: ", plain(pin.detail)))
    out.print(setup)
    if n.gpus:
        gpus = Table(title="GPUs (NVML)")
        for col in ("#", "name", "memory", "PCIe now", "PCIe max", "link now", "link max"):
            gpus.add_column(col)
        for g in n.gpus:
            now = _link(g.pcie_gen_current, g.pcie_width_current)
            gpus.add_row(str(g.index), plain(g.name), _gib(g.memory_total_bytes),
                         plain(now, "yellow" if g.link_below_max else ""),
                         _link(g.pcie_gen_max, g.pcie_width_max),
                         _gbps(g.link_bytes_per_s_current), _gbps(g.link_bytes_per_s_max))
        out.print(gpus)
    elif n.available:
        out.print("GPUs: none reported by NVML")
    else:
        out.print("GPUs: none (no NVIDIA driver) — the device pool runs on the CPU")
    for f in report.findings:
        out.print(Text.assemble((f.level, _MARK[f.level]), "  ", plain(f.message)))
