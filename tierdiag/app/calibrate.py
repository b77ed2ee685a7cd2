"""`calibrate`: measure the copy kernels here, or (`--from`) fit the clock to a recorded run, and
write the profile `replay --profile` reads."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from tierdiag.config.engine import EngineConfig, load_config
from tierdiag.config.presets import gpu_preset, model_preset
from tierdiag.config.profile import write_profile
from tierdiag.diagnose.twin.calibrate import Calibration, Geometry, calibrate_run


@dataclass(frozen=True)
class MeasuredProfile:
    """`calibrate`: the copy kernels' profile (engine.calibration.Profile) and where it was written."""

    profile: Any
    path: Path

    def to_json(self) -> dict:
        return self.profile.to_json()

    def json_note(self) -> str:
        """Where the profile went, said on stderr beside the JSON view (the text view says it)."""
        return f"profile written to {self.path}"


def measure(out: Path | None, *, quick: bool, progress: Callable[[str], None] | None = None) -> MeasuredProfile:
    """Measure the copy kernels (torch: imported here) and write the profile to `out` (default:
    ~/.cache/tierdiag/profile.json)."""
    from tierdiag.engine.calibration import calibrate, default_profile_path, save_profile

    path = out if out is not None else default_profile_path()
    profile = calibrate(quick=quick, progress=progress)
    return MeasuredProfile(profile, save_profile(profile, path))


@dataclass(frozen=True)
class FittedProfile:
    """`calibrate --from`: the fit and the TOML profile it was written to."""

    calibration: Calibration
    path: Path

    def to_json(self) -> dict:
        return {**self.calibration.to_json(), "profile": str(self.path)}


def fit_profile(db: Path, run: str, out: Path, *, model: str | None = None, gpu: str | None = None,
                config: Path | None = None) -> FittedProfile:
    """`calibrate_from` as the command's one call: out is never one of its inputs."""
    from tierdiag.paths import check_output

    check_output(out, what="-o/--out", inputs=[("--config", config), ("--db", db)])  # never an input
    return FittedProfile(*calibrate_from(db, run, out, model=model, gpu=gpu, config=config))


def calibrate_from(db: Path, run: str, out: Path, *, model: str | None = None,
                   gpu: str | None = None, config: Path | None = None) -> tuple[Calibration, Path]:
    """Fit run `run` of `db` and write `out`. The server's geometry (model, GPU, page size, prefill
    chunk, layer-wise overlap) is replay's: its defaults, or the `config` file the twin will be
    replayed with, so the fit prices each request as that replay will; `model`/`gpu` override."""
    from tierdiag.store.reader import open_store, resolve_run

    if config is not None:
        cfg = load_config(config, {"model": model, "gpu": gpu})  # a bad file: one line, exit 3
        model, gpu = cfg.model, cfg.gpu
        page_size, chunk, overlap = cfg.page_size, cfg.max_prefill_tokens, cfg.layerwise_overlap
    else:
        defaults = EngineConfig.__dataclass_fields__
        model = model or defaults["model"].default
        gpu = gpu or defaults["gpu"].default
        page_size = defaults["page_size"].default
        chunk = defaults["max_prefill_tokens"].default
        overlap = defaults["layerwise_overlap"].default
    model_preset(model)  # an unknown name lists the known ones, before the store is opened
    gpu_preset(gpu)
    g = Geometry(model, gpu, page_size=page_size, max_prefill_tokens=chunk, layerwise_overlap=overlap)
    with open_store(db) as con:
        info = resolve_run(con, run, db_label=str(db))
        c = calibrate_run(con, info, g, db_label=str(db))
    written = write_profile(out, model=model, gpu=gpu, clock=c.clock, fit=c.profile_fit_table())
    return c, written
