"""`calibrate --from`: fit the clock to a recorded run and write the profile (a TOML config)."""

from __future__ import annotations

from pathlib import Path

from tierdiag.config.engine import EngineConfig, load_config
from tierdiag.config.presets import gpu_preset, model_preset
from tierdiag.config.profile import write_profile
from tierdiag.diagnose.calibrate import Calibration, Geometry, calibrate_run


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
