"""`calibrate --from`: fit the clock to a recorded run and write the profile (a TOML config)."""

from __future__ import annotations

from pathlib import Path

from tierdiag.config.engine import EngineConfig
from tierdiag.config.presets import gpu_preset, model_preset
from tierdiag.config.profile import write_profile
from tierdiag.diagnose.calibrate import Calibration, Geometry, calibrate_run


def calibrate_from(db: Path, run: str, out: Path, *, model: str | None = None,
                   gpu: str | None = None) -> tuple[Calibration, Path]:
    """Fit run `run` of `db` under the `model`/`gpu` presets (default: replay's) and write `out`."""
    from tierdiag.store.reader import open_store, resolve_run

    defaults = EngineConfig.__dataclass_fields__
    model = model or defaults["model"].default
    gpu = gpu or defaults["gpu"].default
    model_preset(model)  # an unknown name lists the known ones, before the store is opened
    gpu_preset(gpu)
    g = Geometry(model, gpu, page_size=defaults["page_size"].default,
                 max_prefill_tokens=defaults["max_prefill_tokens"].default,
                 layerwise_overlap=defaults["layerwise_overlap"].default)
    with open_store(db) as con:
        info = resolve_run(con, run, db_label=str(db))
        c = calibrate_run(con, info, g, db_label=str(db))
    written = write_profile(out, model=model, gpu=gpu, clock=c.clock, fit=c.profile_fit_table())
    return c, written
