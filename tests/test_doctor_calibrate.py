"""`tierdiag doctor` (real no-driver path, fake NVML path) and `tierdiag calibrate`."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tierdiag.cli.main import app
from tierdiag.engine.calibration import fit_overhead_and_bandwidth, pick_triton_min_bytes
from tierdiag.engine.hardware import (NO_DRIVER, doctor_report, hardware_summary, pcie_bytes_per_s, platform_string,
                                      probe_nvml)

REQUIRED_PROFILE_KEYS = {"h2d_bytes_per_s", "d2h_bytes_per_s", "transfer_overhead_ns", "contiguous_bytes_per_s",
                         "load_back_vs_contiguous", "device", "created_at", "table"}


def _main(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from tierdiag.cli.main import main; main()", *args],
                          capture_output=True, text=True, timeout=120, env=env)


def _calibrate(*args: str) -> subprocess.CompletedProcess:
    """`tierdiag calibrate ARGS` in this process (tests/support/cli.py `completed_in_process`, no
    width, as a pipe's child has it): what it prints, writes and exits with, not the process. A
    child was ~2.5 s of CPU more a call than the measurement itself (an interpreter importing
    torch), which this process has imported already."""
    from tests.support.cli import cli_env, completed_in_process

    return completed_in_process("calibrate", *args, env=cli_env(columns=None))


@functools.cache
def _doctor(cplane: str, *args: str) -> subprocess.CompletedProcess:
    """`tierdiag doctor ARGS` in a subprocess with TIERDIAG_CPLANE=cplane, once per test process
    (each start imports torch; several tests read the same report)."""
    import os

    return _main("doctor", *args, env={**os.environ, "TIERDIAG_CPLANE": cplane})


# --- a fake pynvml: two GPUs, the second one's link trained down ------------------------------
class _FakeNVMLError(Exception):
    pass


def _fake_pynvml(*, init_error: bool = False, unsupported: tuple[str, ...] = ()) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    m.NVMLError = _FakeNVMLError
    gpus = [
        dict(name=b"NVIDIA H200", total=141 * 2**30, used=2**30, gen=(5, 5, 5), width=(16, 16)),
        dict(name="NVIDIA H100 80GB HBM3", total=80 * 2**30, used=0, gen=(4, 5, 5), width=(8, 16)),
    ]
    calls = {"shutdown": 0}

    def init():
        if init_error:
            raise _FakeNVMLError("Driver Not Loaded")

    def q(name, fn):
        def call(*args):
            if name in unsupported:
                raise _FakeNVMLError("Not Supported")
            return fn(*args)
        setattr(m, name, call)

    m.nvmlInit = init
    m.nvmlShutdown = lambda: calls.__setitem__("shutdown", calls["shutdown"] + 1)
    m.calls = calls
    q("nvmlSystemGetDriverVersion", lambda: "550.54.15")
    q("nvmlSystemGetCudaDriverVersion", lambda: 12040)
    q("nvmlDeviceGetCount", lambda: len(gpus))
    q("nvmlDeviceGetHandleByIndex", lambda i: gpus[i])
    q("nvmlDeviceGetName", lambda h: h["name"])
    q("nvmlDeviceGetMemoryInfo", lambda h: types.SimpleNamespace(total=h["total"], used=h["used"]))
    q("nvmlDeviceGetCurrPcieLinkGeneration", lambda h: h["gen"][0])
    q("nvmlDeviceGetMaxPcieLinkGeneration", lambda h: h["gen"][1])
    q("nvmlDeviceGetGpuMaxPcieLinkGeneration", lambda h: h["gen"][2])
    q("nvmlDeviceGetCurrPcieLinkWidth", lambda h: h["width"][0])
    q("nvmlDeviceGetMaxPcieLinkWidth", lambda h: h["width"][1])
    return m


def test_pcie_bandwidth_from_generation_and_width():
    assert pcie_bytes_per_s(5, 16) == pytest.approx(63.0e9, rel=1e-3)  # 32 GT/s x16, 128b/130b
    assert pcie_bytes_per_s(4, 16) == pytest.approx(31.5e9, rel=1e-3)
    assert pcie_bytes_per_s(3, 8) == pytest.approx(7.88e9, rel=1e-3)
    assert pcie_bytes_per_s(2, 16) == pytest.approx(8.0e9, rel=1e-3)  # 8b/10b
    assert pcie_bytes_per_s(None, 16) is None and pcie_bytes_per_s(4, 0) is None and pcie_bytes_per_s(9, 16) is None


@given(st.integers(1, 6), st.integers(1, 6), st.sampled_from([1, 2, 4, 8, 16, 32]))
def test_pcie_bandwidth_grows_with_generation_and_is_linear_in_width(g1, g2, width):
    lo, hi = sorted((g1, g2))
    assert pcie_bytes_per_s(lo, width) <= pcie_bytes_per_s(hi, width)
    assert pcie_bytes_per_s(lo, 2 * width) == pytest.approx(2 * pcie_bytes_per_s(lo, width))


def test_fake_nvml_reports_gpus_links_and_flags_the_degraded_one(monkeypatch):
    fake = _fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    info = probe_nvml()
    assert info.available and info.driver_version == "550.54.15" and info.cuda_driver_version == "12.4"
    h200, h100 = info.gpus
    assert h200.name == "NVIDIA H200" and h200.memory_total_bytes == 141 * 2**30
    assert not h200.link_below_max and h200.link_bytes_per_s_max == pytest.approx(63.0e9, rel=1e-3)
    assert h100.link_below_max
    assert h100.link_bytes_per_s_current == pytest.approx(15.75e9, rel=1e-3)  # Gen4 x8
    assert fake.calls["shutdown"] == 1
    report = doctor_report()
    warnings = [f.message for f in report.findings if f.level == "warn"]
    assert any("GPU 1 PCIe link runs x8 of x16" in w for w in warnings)
    assert any("GPU 1 PCIe link at Gen 4 of Gen 5" in w for w in warnings)
    assert not any("GPU 0" in w for w in warnings)


def test_doctor_cli_renders_fake_gpus_in_text_and_json(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    result = CliRunner().invoke(app, ["doctor", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [g["name"] for g in data["nvml"]["gpus"]] == ["NVIDIA H200", "NVIDIA H100 80GB HBM3"]
    assert [g["link_below_max"] for g in data["nvml"]["gpus"]] == [False, True]
    assert data["nvml"]["gpus"][1]["pcie_width_current"] == 8
    text = CliRunner().invoke(app, ["doctor"])
    assert text.exit_code == 0
    assert "NVIDIA H200" in text.stdout and "Gen 4 x8" in text.stdout and "63.0 GB/s" in text.stdout


def test_unsupported_nvml_queries_become_unknown_fields_not_errors(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(unsupported=(
        "nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkWidth", "nvmlDeviceGetMemoryInfo")))
    info = probe_nvml()
    g = info.gpus[0]
    assert g.pcie_gen_current is None and g.pcie_width_max is None and g.memory_total_bytes is None
    assert g.link_bytes_per_s_current is None and not g.link_below_max
    assert CliRunner().invoke(app, ["doctor"]).exit_code == 0


def test_driver_not_loaded_is_a_finding_not_a_traceback(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(init_error=True))
    info = probe_nvml()
    assert not info.available and info.error == f"{NO_DRIVER}: Driver Not Loaded"
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 0 and "Traceback" not in result.output
    assert NO_DRIVER in result.stdout


def test_missing_pynvml_package_is_reported(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    info = probe_nvml()
    assert not info.available and "nvidia-ml-py" in info.error
    assert hardware_summary()["gpus"] == []


def _real_nvml_available() -> bool:
    return probe_nvml().available


@pytest.mark.skipif(_real_nvml_available(), reason="this machine has an NVIDIA driver")
def test_doctor_without_a_driver_for_real():
    proc = _doctor("auto")
    assert proc.returncode == 0, proc.stderr
    assert "no NVIDIA driver (NVML unavailable)" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
    data = json.loads(_doctor("auto", "--json").stdout)
    assert data["nvml"]["available"] is False and data["nvml"]["gpus"] == []
    assert data["python_version"].count(".") == 2 and data["torch"]["version"]
    assert data["pinned_memory"]["available"] is False  # no CUDA: nothing to pin for


def test_hardware_summary_is_small_and_does_not_import_torch():
    code = ("import sys, json; from tierdiag.engine.hardware import hardware_summary; "
            "s = hardware_summary(); assert 'torch' not in sys.modules, 'imported torch'; "
            "print(json.dumps(s)); print('pynvml' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    line, nvml_imported = proc.stdout.splitlines()
    summary = json.loads(line)
    assert {"python", "platform", "cpu_count", "torch", "gpus"} <= set(summary)
    assert len(line) < 2000
    from tierdiag.engine.hardware import nvidia_driver_present

    if not nvidia_driver_present():  # no kernel driver: NVML is not asked, and says why
        assert nvml_imported == "False" and summary["gpus"] == []
        assert summary["nvml"].startswith(NO_DRIVER) and "kernel driver is not loaded" in summary["nvml"]


def test_the_platform_string_is_the_stdlib_s_without_a_child_process(monkeypatch):
    """The run row's platform is platform.platform(terse=True)'s string, built without the
    `uname -p` child the stdlib forks for it on Linux (a fork of the CLI in every replay)."""
    import platform

    expected = platform.platform(terse=True)  # before the patch: this one may fork

    def no_children(*args, **kwargs):
        raise AssertionError(f"a child process was started: {args}")

    monkeypatch.setattr(subprocess, "Popen", no_children)
    got = platform_string()
    assert hardware_summary()["platform"] == got
    if platform.system() == "Linux" and platform.processor() in ("", platform.machine()):
        assert got == expected
    assert got.startswith(f"{platform.system()}-{platform.release()}")


# --- calibrate ----------------------------------------------------------------------------------
@settings(max_examples=50, deadline=None)
@given(st.floats(0, 1e6), st.floats(1e8, 1e12), st.floats(-0.02, 0.02))
def test_fit_recovers_overhead_and_bandwidth(overhead_ns, bytes_per_s, noise):
    sizes = [2**k * 4096 for k in range(0, 13)]
    # bandwidth is only identifiable when the biggest transfer is bandwidth-bound
    assume(sizes[-1] / bytes_per_s * 1e9 >= 2 * overhead_ns)
    times = [(overhead_ns + s / bytes_per_s * 1e9) * (1 + noise * (-1) ** i) for i, s in enumerate(sizes)]
    fit = fit_overhead_and_bandwidth(sizes, times)
    assert fit.overhead_ns >= 0
    assert fit.bytes_per_s == pytest.approx(bytes_per_s, rel=0.1)
    # the overhead is recovered where it matters, i.e. relative to the smallest transfer
    assert abs(fit.overhead_ns - overhead_ns) <= 0.1 * times[0]


def test_calibrate_quick_json_writes_the_profile_the_cost_model_reads(tmp_path):
    out = tmp_path / "sub" / "profile.json"
    proc = _calibrate("--quick", "--json", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)  # stdout is the JSON alone
    assert REQUIRED_PROFILE_KEYS <= set(data)
    assert json.loads(out.read_text()) == data
    assert f"profile written to {out}" in proc.stderr
    assert data["h2d_bytes_per_s"] > 0 and data["d2h_bytes_per_s"] > 0 and data["transfer_overhead_ns"] >= 0
    assert data["load_back_vs_contiguous"] > 0 and isinstance(data["device"], str)
    pages = [row["pages"] for row in data["table"]]
    assert pages == sorted(pages) and pages[0] == 1 and pages[-1] >= 1000
    for row in data["table"]:
        assert row["bytes"] == row["pages"] * data["page_bytes"]
        assert row["load_back_ns"] > 0 and row["backup_ns"] > 0 and row["contiguous_ns"] > 0
        assert row["load_back_plan"] in ("direct", "compiled", "runs", "gather", "scatter", "two_pass", "triton")
        assert row["load_back_path"] in ("torch", "triton") and row["backup_path"] in ("torch", "triton")
        # the yardstick is the faster of the two contiguous copies, both measured in this run
        assert row["contiguous_ns"] == min(row["contiguous_torch_ns"], row["contiguous_memcpy_ns"])
    if "cpu" in data["device"]:
        assert data["triton"].startswith("not used on CPU") and data["triton_min_bytes"] is None
        assert {row["load_back_path"] for row in data["table"]} == {"torch"}
        assert all(row["load_back_triton_ns"] is None for row in data["table"])

    from tierdiag.config.engine import EngineConfig
    from tierdiag.engine.costmodel import CostModel

    model = CostModel.from_config(EngineConfig(profile=str(out), device_tokens=4096))
    assert model.h2d_bytes_per_s == pytest.approx(data["h2d_bytes_per_s"])
    assert model.transfer_overhead_ns == data["transfer_overhead_ns"] and model.link_source == str(out)


def test_triton_threshold_is_where_it_wins_from_then_on():
    sizes = [1, 2, 4, 8, 16]
    assert pick_triton_min_bytes(sizes, [5, 5, 5, 5, 5], [9, 4, 6, 4, 3]) == 8  # loses at 4: from 8 on
    assert pick_triton_min_bytes(sizes, [5] * 5, [1] * 5) == 1
    assert pick_triton_min_bytes(sizes, [5] * 5, [1, 1, 1, 1, 6]) is None  # loses at the largest: never
    assert pick_triton_min_bytes([], [], []) is None


@pytest.mark.slow
@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the GPU run is the real thing, not a dry run")
def test_gpu_check_script_runs_end_to_end_on_cpu_and_says_what_it_skipped(tmp_path):
    root = Path(__file__).resolve().parents[1]
    env = dict(__import__("os").environ, OUT=str(tmp_path), PYTHON=sys.executable, GPU_CHECK_QUICK="1")
    proc = subprocess.run(["bash", str(root / "benchmarks" / "gpu_check.sh")], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = (tmp_path / "summary.txt").read_text()
    for line in ("doctor: ok", "calibrate: ok", "pytest: skipped: no CUDA GPU", "gpu_table: ok",
                 "gpu table: skipped: no CUDA GPU", "gpu_overhead: ok", "gpu overhead: skipped: no CUDA GPU",
                 "all steps ok"):
        assert line in summary, summary
    assert json.loads((tmp_path / "doctor.json").read_text())["nvml"]["available"] is False
    profile = json.loads((tmp_path / "calibrate.json").read_text())
    assert profile == json.loads((tmp_path / "profile.json").read_text()) and profile["quick"] is True
    assert "skipped" in json.loads((tmp_path / "gpu_table.json").read_text())
    assert "skipped" in json.loads((tmp_path / "gpu_overhead.json").read_text())


def test_calibrate_default_path_honours_xdg_cache_home(tmp_path, monkeypatch):
    from tierdiag.engine.calibration import default_profile_path

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_profile_path() == tmp_path / "tierdiag" / "profile.json"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_profile_path() == Path.home() / ".cache" / "tierdiag" / "profile.json"


def test_calibrate_text_output_and_unwritable_profile(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    proc = _calibrate("--quick", "--out", str(blocker / "profile.json"))
    assert proc.returncode == 6  # ExitCode.IO
    assert proc.stderr.startswith("tierdiag: error: cannot write ") and proc.stderr.count("\n") == 1
    assert "profile.json" in proc.stderr and "is not a folder" in proc.stderr
    ok = _calibrate("--quick", "--out", str(tmp_path / "p.json"))
    assert ok.returncode == 0, ok.stderr
    assert "load-back" in ok.stdout and "profile written to" in ok.stdout
    assert "path: what kernels.load_back uses" in ok.stdout and "Triton kernel:" in ok.stdout


@pytest.mark.parametrize("choice", ["auto", "numpy"])
def test_doctor_says_which_cpu_data_plane_replays_run(choice):
    """Issue 41: a machine where the compiled data plane is not built (no C compiler at install)
    or not used replays on the Python/numpy twins, rows the same; `doctor` says which, and why."""
    from tierdiag.native import cplane

    proc = _doctor(choice, "--json")
    assert proc.returncode == 0, proc.stderr
    plane = json.loads(proc.stdout)["cpu_data_plane"]
    if choice == "numpy" or cplane.C is None:
        assert plane["kernel"] == "numpy" and plane["why_not"]
    else:
        assert plane == {"kernel": "c", "why_not": None}
    text = _doctor(choice).stdout
    assert ("CPU data plane" in text) and (("Python/numpy" in text) == (plane["kernel"] == "numpy"))


def test_doctor_says_which_diagnose_passes_are_compiled(monkeypatch):
    """Diagnose's two optional C passes (native/passes.py: `_stackdist`, `_sessions`; setup.py
    builds them with `optional=True`): where one is not built, its numpy/Python reference runs and
    `doctor` says so, naming the module and why; where both are, one green line."""
    from tierdiag.native import passes

    built = passes.describe()
    assert set(built) == {"_stackdist", "_sessions"}
    for p in built.values():
        assert p["mode"] in ("compiled", "python") and (p["why"] is None) == (p["mode"] == "compiled")
    real_import = passes.importlib.import_module

    def refuse(name, *args, **kwargs):
        if name == "tierdiag.native._sessions":
            raise ImportError("No module named 'tierdiag.native._sessions'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(passes.importlib, "import_module", refuse)
    monkeypatch.setenv("TIERDIAG_CPLANE", "numpy")
    now = passes.describe()
    assert now["_sessions"] == {"mode": "python", "why": "not built (No module named 'tierdiag.native._sessions')"}
    assert now["_stackdist"]["mode"] == "python" and now["_stackdist"]["why"] == "TIERDIAG_CPLANE=numpy"


@pytest.mark.parametrize("choice", ["auto", "numpy"])
def test_doctor_renders_the_diagnose_passes_in_text_and_json(choice):
    proc = _doctor(choice, "--json")
    assert proc.returncode == 0, proc.stderr
    passes = json.loads(proc.stdout)["diagnose_passes"]
    assert set(passes) == {"_stackdist", "_sessions"}
    text = _doctor(choice).stdout
    assert "diagnose passes" in text
    slow = [name for name, p in passes.items() if p["mode"] == "python"]
    assert ("Python/numpy" in text.split("diagnose passes", 1)[1].split("\n", 1)[0]) == bool(slow)
    if choice == "numpy":
        assert passes["_stackdist"]["mode"] == "python" and "_stackdist" in slow
