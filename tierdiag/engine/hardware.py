"""What this machine is: versions, GPUs and their PCIe links (through NVML), pinned memory.

`doctor_report()` is the full check behind `tierdiag doctor`; `hardware_summary()` is the small,
fast dict a replay stores in its run row (no benchmark; torch imported only where a GPU driver is).
Nothing here raises for a missing GPU or driver: an absent NVML is a finding, not an error.
torch and pynvml are imported inside functions, so importing this module costs nothing.
"""

from __future__ import annotations

import os
import platform
import resource
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from tierdiag.engine import compiled

NO_DRIVER = "no NVIDIA driver (NVML unavailable)"

# Per-lane transfer rate (GT/s) and line-code efficiency by PCIe generation: 8b/10b up to
# Gen 2, 128b/130b for Gen 3-5, FLIT mode (242 of 256 bytes carry data) for Gen 6.
_PCIE_GT_PER_S = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
_PCIE_EFFICIENCY = {1: 8 / 10, 2: 8 / 10, 3: 128 / 130, 4: 128 / 130, 5: 128 / 130, 6: 242 / 256}


def pcie_bytes_per_s(generation: int | None, width: int | None) -> float | None:
    """Theoretical one-direction bandwidth of a PCIe link: GT/s x lanes x encoding / 8 bits.
    Gen 4 x16 -> 31.5 GB/s, Gen 5 x16 -> 63.0 GB/s. None when unknown."""
    if not generation or not width or generation not in _PCIE_GT_PER_S:
        return None
    return _PCIE_GT_PER_S[generation] * 1e9 * width * _PCIE_EFFICIENCY[generation] / 8


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as NVML reports it."""

    index: int
    name: str
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    pcie_gen_current: int | None
    pcie_gen_max: int | None
    pcie_gen_gpu_max: int | None
    pcie_width_current: int | None
    pcie_width_max: int | None
    link_bytes_per_s_current: float | None
    link_bytes_per_s_max: float | None

    @property
    def link_below_max(self) -> bool:
        """The link trains below what both ends support: fewer lanes, or a lower generation."""
        gen = (self.pcie_gen_current is not None and self.pcie_gen_max is not None
               and self.pcie_gen_current < self.pcie_gen_max)
        width = (self.pcie_width_current is not None and self.pcie_width_max is not None
                 and self.pcie_width_current < self.pcie_width_max)
        return gen or width


@dataclass(frozen=True)
class NvmlInfo:
    """What NVML says of the machine's driver and GPUs (or why it cannot)."""

    available: bool
    error: str | None  # why not, in one line, when not available
    driver_version: str | None = None
    cuda_driver_version: str | None = None  # the CUDA version the driver supports, "12.4"
    gpus: tuple[GpuInfo, ...] = ()


@dataclass(frozen=True)
class TorchInfo:
    """torch's version, its CUDA build and the devices it sees."""

    version: str | None
    cuda_build: str | None  # CUDA toolkit torch was built with; None for a CPU build
    cuda_available: bool
    device_count: int
    error: str | None = None


@dataclass(frozen=True)
class PinnedMemoryInfo:
    """Whether page-locked host memory can be had, and the limit."""

    available: bool
    detail: str


@dataclass(frozen=True)
class Finding:
    """One line of `tierdiag doctor`'s verdict."""

    level: str  # "ok" | "info" | "warn"
    message: str


@dataclass(frozen=True)
class DoctorReport:
    """Everything `tierdiag doctor` checked."""

    python_version: str
    platform: str
    cpu_count: int
    tierdiag_version: str
    torch: TorchInfo
    nvml: NvmlInfo
    pinned_memory: PinnedMemoryInfo
    findings: tuple[Finding, ...] = field(default_factory=tuple)
    # The compiled CPU data plane (native/cplane.py): where it is not built (no C compiler when
    # installed) or is stale, every replay runs its Python/numpy twin, rows the same, slower.
    cpu_data_plane: dict[str, Any] = field(default_factory=dict)  # {kernel, why_not}
    # The engine core (engine/compiled.py): its hot modules compiled by mypyc, or their Python
    # source (no mypyc or C compiler at install, a stale build, or TIERDIAG_PURE_ENGINE=1).
    engine_core: dict[str, Any] = field(default_factory=dict)  # {mode, why, modules}
    # Diagnose's optional C passes (native/passes.py): where one is not built, its numpy/Python
    # reference computes the same evidence, slower on large runs.
    diagnose_passes: dict[str, Any] = field(default_factory=dict)  # {module: {mode, why}}

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["nvml"]["gpus"] = [dict(asdict(g), link_below_max=g.link_below_max) for g in self.nvml.gpus]
        return out


# --- probes ---------------------------------------------------------------------------------
def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml_call(pynvml: Any, fn: str, *args: Any) -> Any:
    """One NVML query; None when this GPU or driver does not support it (common on VMs)."""
    try:
        return getattr(pynvml, fn)(*args)
    except (pynvml.NVMLError, AttributeError):
        return None


def probe_nvml() -> NvmlInfo:
    """GPUs through NVML. A missing library or driver is reported, never raised."""
    try:
        import pynvml
    except ImportError:
        return NvmlInfo(False, f"{NO_DRIVER}: the nvidia-ml-py package is not installed")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return NvmlInfo(False, f"{NO_DRIVER}: {_text(exc) or type(exc).__name__}")
    except OSError as exc:  # a broken libnvidia-ml.so
        return NvmlInfo(False, f"{NO_DRIVER}: {exc}")
    try:
        driver = _nvml_call(pynvml, "nvmlSystemGetDriverVersion")
        cuda_int = _nvml_call(pynvml, "nvmlSystemGetCudaDriverVersion")
        cuda = f"{cuda_int // 1000}.{cuda_int % 1000 // 10}" if isinstance(cuda_int, int) else None
        count = _nvml_call(pynvml, "nvmlDeviceGetCount") or 0
        gpus = []
        for i in range(count):
            h = _nvml_call(pynvml, "nvmlDeviceGetHandleByIndex", i)
            if h is None:
                continue
            mem = _nvml_call(pynvml, "nvmlDeviceGetMemoryInfo", h)
            gen_cur = _nvml_call(pynvml, "nvmlDeviceGetCurrPcieLinkGeneration", h)
            # "Max" is what GPU and slot together can reach (the lower of the two); the GPU's
            # own maximum beside it shows a card held back by its slot.
            gen_max = _nvml_call(pynvml, "nvmlDeviceGetMaxPcieLinkGeneration", h)
            gen_gpu_max = _nvml_call(pynvml, "nvmlDeviceGetGpuMaxPcieLinkGeneration", h)
            width_cur = _nvml_call(pynvml, "nvmlDeviceGetCurrPcieLinkWidth", h)
            width_max = _nvml_call(pynvml, "nvmlDeviceGetMaxPcieLinkWidth", h)
            name = _nvml_call(pynvml, "nvmlDeviceGetName", h)
            gpus.append(GpuInfo(
                index=i, name=_text(name) if name is not None else f"GPU {i}",
                memory_total_bytes=int(mem.total) if mem is not None else None,
                memory_used_bytes=int(mem.used) if mem is not None else None,
                pcie_gen_current=gen_cur, pcie_gen_max=gen_max, pcie_gen_gpu_max=gen_gpu_max,
                pcie_width_current=width_cur, pcie_width_max=width_max,
                link_bytes_per_s_current=pcie_bytes_per_s(gen_cur, width_cur),
                link_bytes_per_s_max=pcie_bytes_per_s(gen_max, width_max),
            ))
        return NvmlInfo(True, None, _text(driver) if driver is not None else None, cuda, tuple(gpus))
    finally:
        _nvml_call(pynvml, "nvmlShutdown")


def probe_torch() -> TorchInfo:
    try:
        import torch
    except ImportError as exc:
        return TorchInfo(None, None, False, 0, error=f"torch is not importable: {exc}")
    try:
        available = bool(torch.cuda.is_available())
        count = torch.cuda.device_count() if available else 0
    except RuntimeError as exc:  # a driver/runtime mismatch surfaces here
        return TorchInfo(torch.__version__, torch.version.cuda, False, 0, error=str(exc).splitlines()[0])
    return TorchInfo(torch.__version__, torch.version.cuda, available, count)


def probe_pinned_memory(torch_info: TorchInfo) -> PinnedMemoryInfo:
    """Can we allocate page-locked host memory (what the host pool and fast load-back need)?"""
    if not torch_info.cuda_available:
        return PinnedMemoryInfo(False, "not applicable without CUDA: the host pool uses plain memory")
    import torch
    try:
        t = torch.empty(64 * 1024 * 1024, dtype=torch.uint8, pin_memory=True)
        ok = t.is_pinned()
    except RuntimeError as exc:
        return PinnedMemoryInfo(False, f"pinned allocation failed: {str(exc).splitlines()[0]}")
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    limit = "unlimited" if soft == resource.RLIM_INFINITY else f"{soft / 2**20:.0f} MiB"
    if not ok:
        return PinnedMemoryInfo(False, "a 64 MiB pin_memory allocation came back unpinned")
    return PinnedMemoryInfo(True, f"64 MiB pinned allocation ok (RLIMIT_MEMLOCK {limit})")


def _tierdiag_version() -> str:
    from tierdiag import __version__
    return __version__


def _findings(torch_info: TorchInfo, nvml: NvmlInfo, pinned: PinnedMemoryInfo) -> tuple[Finding, ...]:
    out: list[Finding] = []
    if not nvml.available:
        out.append(Finding("info", f"{nvml.error}; the device pool runs on the CPU and copy times "
                                   "come from the GPU preset (or a calibrate profile)"))
    elif not nvml.gpus:
        out.append(Finding("warn", "NVML is up but reports no GPU"))
    for g in nvml.gpus:
        if g.pcie_width_current is not None and g.pcie_width_max is not None \
                and g.pcie_width_current < g.pcie_width_max:
            out.append(Finding("warn", f"GPU {g.index} PCIe link runs x{g.pcie_width_current} of "
                                       f"x{g.pcie_width_max}: load-back bandwidth is cut accordingly "
                                       "(check the slot, riser or BIOS lane split)"))
        if g.pcie_gen_current is not None and g.pcie_gen_max is not None \
                and g.pcie_gen_current < g.pcie_gen_max:
            out.append(Finding("warn", f"GPU {g.index} PCIe link at Gen {g.pcie_gen_current} of "
                                       f"Gen {g.pcie_gen_max}: slow load-back if it stays there under "
                                       "load (idle GPUs lower the link speed to save power; re-check "
                                       "during `tierdiag calibrate`)"))
        if g.pcie_gen_gpu_max is not None and g.pcie_gen_max is not None \
                and g.pcie_gen_max < g.pcie_gen_gpu_max:
            out.append(Finding("info", f"GPU {g.index} supports PCIe Gen {g.pcie_gen_gpu_max} but its slot "
                                       f"allows Gen {g.pcie_gen_max}"))
        if not g.link_below_max and g.link_bytes_per_s_max:
            out.append(Finding("ok", f"GPU {g.index} PCIe Gen {g.pcie_gen_current} x{g.pcie_width_current}: "
                                     f"{g.link_bytes_per_s_max / 1e9:.1f} GB/s per direction theoretical"))
    if torch_info.error:
        out.append(Finding("warn", torch_info.error))
    elif nvml.available and nvml.gpus and not torch_info.cuda_available:
        build = "a CPU-only build" if torch_info.cuda_build is None else f"built for CUDA {torch_info.cuda_build}"
        out.append(Finding("warn", f"NVML sees {len(nvml.gpus)} GPU(s) but torch ({build}) cannot use "
                                   "them: the engine will run on the CPU"))
    if torch_info.cuda_available and not pinned.available:
        out.append(Finding("warn", f"pinned host memory unavailable ({pinned.detail}): host->device "
                                   "copies will be synchronous and slow"))
    return tuple(out)


def doctor_report() -> DoctorReport:
    torch_info = probe_torch()
    nvml = probe_nvml()
    pinned = probe_pinned_memory(torch_info)
    return DoctorReport(
        python_version=platform.python_version(),
        platform=platform.platform(),
        cpu_count=os.cpu_count() or 0,
        tierdiag_version=_tierdiag_version(),
        torch=torch_info, nvml=nvml, pinned_memory=pinned,
        findings=_findings(torch_info, nvml, pinned),
        cpu_data_plane=_cpu_data_plane(),
        engine_core=compiled.describe(),
        diagnose_passes=_diagnose_passes(),
    )


def _diagnose_passes() -> dict[str, Any]:
    from tierdiag.native import passes

    return passes.describe()


def _cpu_data_plane() -> dict[str, Any]:
    from tierdiag.native import cplane

    return {"kernel": cplane.CPU_KERNEL, "why_not": cplane.WHY_NOT or None}


_NVIDIA_DRIVER_FILES = ("/proc/driver/nvidia/version", "/dev/nvidiactl")


def nvidia_driver_present() -> bool:
    """Whether NVML could find anything, asked without importing pynvml: on Linux NVML needs the
    NVIDIA kernel driver (its /proc entry or /dev/nvidiactl). Elsewhere: assume it may."""
    if not sys.platform.startswith("linux"):
        return True
    return any(os.path.exists(p) for p in _NVIDIA_DRIVER_FILES)


def cuda_device_present() -> bool:
    """Whether this machine may have a GPU torch.cuda could use, asked without importing torch:
    on Linux a CUDA device needs the NVIDIA driver (its /proc entry and /dev/nvidiactl), and
    torch's ROCm build drives AMD GPUs through /dev/kfd. Elsewhere: assume it may."""
    return nvidia_driver_present() or os.path.exists("/dev/kfd")


def cuda_available() -> bool:
    """torch.cuda.is_available(), without importing torch where no GPU driver exists (a CPU
    replay never needs torch: its pools are numpy buffers, see engine/pagepool.py)."""
    torch = sys.modules.get("torch")
    if torch is None:
        if not cuda_device_present():
            return False
        import torch
    try:
        return bool(torch.cuda.is_available())
    except RuntimeError:
        return False


def platform_string() -> str:
    """platform.platform(terse=True)'s string without the child process it forks: on Linux the
    stdlib runs `uname -p` for a processor field it then drops (blank or equal to the machine),
    a fork of the whole CLI in every replay's start-up. Built here from os.uname() and glibc's
    version; elsewhere the stdlib's own."""
    u = os.uname()
    if u.sysname != "Linux":
        return platform.platform(terse=True)
    lib, version = platform.libc_ver()  # os.confstr for glibc; no file scan, no child
    parts = [u.sysname, u.release, u.machine] + (["with", lib + version] if lib else [])
    return "-".join(p.replace(" ", "_") for p in parts)


def installed_version(name: str) -> str | None:
    """`importlib.metadata.version(name)`, None where it is not installed, read without importing
    importlib.metadata where the answer is plain (its email parser, zipfile and csv were ~15 ms of
    every recorded replay's start-up, for torch's version in the run row; issue 41): the first
    `NAME-*.dist-info` on sys.path, in importlib.metadata's order (each folder's entries as listed),
    and its METADATA's `Version:` header. Anything less plain (a zip or egg on the path, an
    .egg-info, no such header, a folded one, not found at all) is importlib.metadata's to answer."""
    import re

    def normalized(text: str) -> str:  # importlib.metadata's Prepared.normalize
        return re.sub(r"[-_.]+", "-", text).lower().replace("-", "_")

    want = normalized(name)
    for entry in sys.path:
        root = entry or "."
        try:
            children = os.listdir(root)
        except OSError:
            if os.path.exists(root):
                break  # a zip on the path: importlib.metadata reads those
            continue
        if root.lower().endswith(".egg"):
            break
        for child in children:
            low = child.lower()
            if not low.endswith((".dist-info", ".egg-info")) or \
                    normalized(low.rpartition(".")[0].partition("-")[0]) != want:
                continue
            if low.endswith(".dist-info"):
                found = _metadata_version(os.path.join(root, child, "METADATA"))
                if found is not None:
                    return found
            break  # an .egg-info, or METADATA less plain than one `Version:` line
        else:
            continue
        break
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _metadata_version(path: str) -> str | None:
    """The `Version:` header of a METADATA file as email's parser reads it (the first one, leading
    blanks dropped); None where the file cannot be read or the header is absent or folded."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().split("\n")
    except (OSError, UnicodeDecodeError):
        return None
    for i, line in enumerate(lines):
        if not line.strip("\r"):
            return None  # the headers end at the first blank line
        key, colon, value = line.partition(":")
        if colon and key.lower() == "version":
            if i + 1 < len(lines) and lines[i + 1][:1] in (" ", "\t"):
                return None
            return value.lstrip(" \t").rstrip("\r")
    return None


def hardware_summary() -> dict[str, Any]:
    """Small and fast, for the run row: no benchmark; NVML only if pynvml imports; torch's
    version from the module or package metadata; torch is imported only where a GPU driver exists
    (a replay there imports it anyway)."""
    summary: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform_string(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count() or 0,
    }
    # The same keys whether or not this process has imported torch already (a sweep's rows must
    # equal single replays'): torch's CUDA build and availability where a GPU driver exists
    # (torch is imported then: the replay needs it), else the installed version only.
    if cuda_device_present():
        try:
            import torch
        except ImportError:
            summary["torch"] = None
        else:
            summary["torch"] = torch.__version__
            summary["torch_cuda"] = torch.version.cuda
        summary["cuda_available"] = cuda_available() if summary["torch"] else False
    else:
        torch = sys.modules.get("torch")
        summary["torch"] = torch.__version__ if torch is not None else installed_version("torch")
        summary["cuda_available"] = False  # known without torch: no GPU driver on this machine
    # Without the kernel driver NVML cannot start: not asked (importing pynvml and failing to
    # start it was ~10-20 ms of every recorded replay's start on a machine without a GPU).
    nvml = probe_nvml() if nvidia_driver_present() else NvmlInfo(
        False, f"{NO_DRIVER}: the NVIDIA kernel driver is not loaded (no {' or '.join(_NVIDIA_DRIVER_FILES)})")
    if nvml.available:
        summary["driver"] = nvml.driver_version
        summary["gpus"] = [
            {"name": g.name, "memory_bytes": g.memory_total_bytes,
             "pcie": f"gen{g.pcie_gen_current}x{g.pcie_width_current}",
             "pcie_max": f"gen{g.pcie_gen_max}x{g.pcie_width_max}",
             "link_bytes_per_s_max": g.link_bytes_per_s_max}
            for g in nvml.gpus
        ]
    else:
        summary["gpus"] = []
        summary["nvml"] = nvml.error
    return summary
