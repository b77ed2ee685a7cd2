"""`tierdiag calibrate`: measure the copy kernels here (or, with --from, fit the whole clock to an
observed run) and save a profile for `replay --profile`."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table
from rich.text import Text

from tierdiag.cli.choices import choices, completer, listed
from tierdiag.cli.common import DEFAULT_DB_PATH, DbOpt, JsonOpt, err
from tierdiag.cli.sink import Sink, renders
from tierdiag.config.presets import GPUS, MODELS

OutOpt = Annotated[Optional[Path], typer.Option(
    "--out", "-o", help="Where to write the profile (default ~/.cache/tierdiag/profile.json; with --from: required, TOML).")]
QuickOpt = Annotated[bool, typer.Option("--quick", help="Fewer sizes and repeats: a couple of seconds.")]


# the torch path's plan for a size, as benchmarks/kernels.py abbreviates them
_PLAN = {"direct": "direct", "compiled": "compiled", "runs": "R", "gather": "G", "scatter": "S", "two_pass": "2P", "generic": "generic"}


def _gbps(v: float) -> str:
    return f"{v / 1e9:.2f}"


def _size(n: int) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.0f} {unit}"
    return f"{n} B"


FromOpt = Annotated[Optional[str], typer.Option(
    "--from", metavar="OBSERVED_RUN", show_default=False,
    help="Fit the cost model's clock to this run's requests (an id, prefix or name; `import sglang` makes one) "
         "instead of measuring copy kernels; writes a TOML profile (-o, required).")]
ModelOpt = Annotated[Optional[str], typer.Option(
    metavar="NAME", autocompletion=completer(MODELS),
    help="With --from: the model preset the server runs (layers, KV bytes): " + listed(MODELS) + "  [default: llama3-8b]")]
ConfigOpt = Annotated[Optional[Path], typer.Option(
    "--config", help="With --from: the TOML config the twin will be replayed with (its model, GPU, page size and "
                     "prefill chunk price the fit); --model/--gpu override it.")]
GpuOpt = Annotated[Optional[str], typer.Option(
    **choices(GPUS), help="With --from: the GPU preset whose values are kept where the fit cannot tell  [default: h200]")]


def calibrate(json_: JsonOpt = False, out_path: OutOpt = None, quick: QuickOpt = False, from_: FromOpt = None,
              db: DbOpt = DEFAULT_DB_PATH, model: ModelOpt = None, gpu: GpuOpt = None,
              config: ConfigOpt = None) -> None:
    """Measure contiguous copy bandwidth, load-back (host->device) and backup (device->host)
    kernel bandwidth from one page to thousands, and the per-transfer overhead; write the
    profile the cost model reads with `tierdiag replay --profile FILE`. With --from RUN, fit the
    whole clock (prefill, decode, load-back) to an observed run instead, with intervals and a
    held-out error."""
    if from_ is not None:
        if out_path is None:
            raise typer.BadParameter("calibrate --from writes a TOML profile: name it", param_hint="-o/--out")
        from tierdiag.app.calibrate import fit_profile

        return Sink(json=json_).emit(fit_profile(db, from_, out_path, model=model, gpu=gpu, config=config))
    if model is not None or gpu is not None or config is not None:
        raise typer.BadParameter("only means something with --from RUN", param_hint="--model/--gpu/--config")
    from tierdiag.app.calibrate import measure

    # A spinner on stderr while measuring, unless the output is JSON.
    with (contextlib.nullcontext() if json_ else err.status("measuring copy kernels…")) as status:
        result = measure(out_path, quick=quick, progress=None if status is None else status.update)
    Sink(json=json_).emit(result)


@renders("tierdiag.app.calibrate.MeasuredProfile")
def _measured(result, out) -> None:
    profile, written = result.profile, result.path
    table = Table(title=f"copy kernels on {profile.device} "
                        f"({profile.num_layers} layers, {_size(profile.page_bytes)} per page; GB/s, medians "
                        f"of {profile.repeats})")
    both = any(r.load_back_triton_ns for r in profile.table)
    cols = ["pages", "size", "contig", "load", "load→run", "backup", "vs contig", "path"]
    if both:
        cols[6:6] = ["load torch", "load triton", "backup torch", "backup triton"]
    for col in cols:
        table.add_column(col, justify="left" if col == "path" else "right")
    for r in profile.table:
        cells = [f"{r.pages:,}", _size(r.bytes), _gbps(r.contiguous_bytes_per_s),
                 _gbps(r.load_back_bytes_per_s), _gbps(r.bytes / r.load_back_to_run_ns * 1e9),
                 _gbps(r.backup_bytes_per_s)]
        if both:
            cells += [_gbps(r.bytes / ns * 1e9) if ns else "-" for ns in
                      (r.load_back_torch_ns, r.load_back_triton_ns, r.backup_torch_ns, r.backup_triton_ns)]
        path = "triton" if r.load_back_path == "triton" else f"torch {_PLAN.get(r.load_back_plan, r.load_back_plan)}"
        table.add_row(*cells, f"{r.load_back_vs_contiguous:.0%}", path)
    out.print(table)
    out.print("path: what kernels.load_back uses at that size — torch (direct: no plan, numpy; compiled: no plan, "
              "the C data plane's move; R runs, G gather, S scatter, 2P gather+scatter through a cache-sized "
              "scratch) or the Triton kernel")
    if profile.triton_min_bytes is not None:
        out.print(f"Triton kernel: used from {_size(profile.triton_min_bytes)} per transfer up (faster than the torch "
                  f"path at every larger size measured)")
    elif profile.triton == "measured":
        out.print("Triton kernel: measured, slower than the torch path at the largest size: not used")
    else:
        out.print(f"Triton kernel: {profile.triton}")
    out.print(f"load-back (h2d): {_gbps(profile.h2d_bytes_per_s)} GB/s + {profile.transfer_overhead_ns / 1e3:.1f} us "
              f"per transfer; backup (d2h): {_gbps(profile.d2h_bytes_per_s)} GB/s + "
              f"{profile.backup_overhead_ns / 1e3:.1f} us; contiguous {_gbps(profile.contiguous_bytes_per_s)} GB/s")
    out.print(f"bulk transfers vs a contiguous copy: load-back {profile.load_back_vs_contiguous:.0%} "
              f"(scattered both sides), {profile.load_back_to_run_vs_contiguous:.0%} into a device run; "
              f"backup {profile.backup_vs_contiguous:.0%}")
    if profile.load_average_1m > (profile.host.get("cpu_count") or 1):
        out.print(Text.assemble(("note", "yellow"), f": load average {profile.load_average_1m:.1f} on "
                  f"{profile.host.get('cpu_count')} CPUs while measuring: other work competed; re-run when idle"))
    out.print(f"profile written to {written}  (use: tierdiag replay TRACE --profile {written})")


@renders("tierdiag.app.calibrate.FittedProfile")
def _fitted(result, out) -> None:
    from tierdiag.report.calibrate_terminal import render_calibration

    render_calibration(result.calibration, out, profile_path=str(result.path))
