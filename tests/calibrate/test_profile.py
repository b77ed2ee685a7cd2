"""Fitted profiles as configs: TOML round trip, validation, what the cost model does with them,
and the fit's vectorised model checked against the cost model itself."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from tierdiag.config.engine import EngineConfig, load_config
from tierdiag.config.profile import CLOCK_PARAMS, PROFILE_FORMAT, load_profile, preset_clock, provenance_line, \
    write_profile
from tierdiag.diagnose.twin.calibrate import Geometry, PrefillPoints, decode_model, prefill_model
from tierdiag.engine.costmodel import CostModel
from tierdiag.errors import ConfigError, ConfigFileError

FIT = {"source_run": "20251201-090000-abcdef", "source_run_name": "prod", "source_db": "/x/runs.duckdb",
       "usable_requests": 40, "usable_batches": 38, "heldout_prefill_median_rel_error": 0.012,
       "heldout_prefill_p90_rel_error": 0.031, "kept_from_preset": ["d2h_bytes_per_s"],
       "intervals_95": {"prefill_ns_per_token": [1.0, 2.0]}}


def _clock(**over) -> dict[str, float]:
    c = preset_clock("tiny", "cpu")
    c.update({"prefill_ns_per_token": 1234.5678901234, "prefill_ns_per_token_pair": 0.1 + 0.2,
              "h2d_bytes_per_s": 3.3e9, "decode_step_ns": 777_777.7})
    c.update(over)
    return c


def test_profile_round_trips_through_toml(tmp_path):
    clock = _clock()
    path = write_profile(tmp_path / "p.toml", model="tiny", gpu="cpu", clock=clock, fit=FIT)
    p = load_profile(path)
    assert (p.kind, p.model, p.gpu) == ("fitted", "tiny", "cpu")
    assert p.clock == clock  # floats exactly (TOML keeps a float's repr)
    assert p.fit == FIT
    again = write_profile(tmp_path / "q.toml", model=p.model, gpu=p.gpu, clock=p.clock, fit=p.fit)
    assert again.read_bytes() == path.read_bytes()
    assert list(CLOCK_PARAMS) == [line.split(" =")[0] for line in path.read_text().split("[clock]\n")[1]
                                  .split("\n\n")[0].splitlines()]


def test_profile_sets_the_clock_and_model_and_is_recorded(tmp_path):
    path = write_profile(tmp_path / "p.toml", model="tiny", gpu="cpu", clock=_clock(), fit=FIT)
    pools = {"device_tokens": 4096, "host_tokens": 8192}
    cfg = load_config(None, {"profile": str(path), **pools})
    assert (cfg.model, cfg.gpu) == ("tiny", "cpu")  # taken from the profile
    conf = tmp_path / "c.toml"
    conf.write_text(f'profile = "{path}"\npage_size = 16\ndevice_tokens = 4096\nhost_tokens = 8192\n')
    assert load_config(conf, {}).model == "tiny"
    src = cfg.to_json()["profile_source"]
    assert (src["kind"], src["source_run"], src["usable_requests"]) == ("fitted", FIT["source_run"], 40)
    assert provenance_line(src) == ("clock: calibrated on observed run 20251201-090000-abcdef (40 usable requests; "
                                    "held-out prefill error median 1.2%, p90 3.1%; 1 parameter kept from the preset)")
    assert provenance_line(None) is None
    with pytest.raises(ConfigError, match="fitted for model tiny on gpu cpu, but the replay uses llama3-8b on cpu"):
        load_config(None, {"profile": str(path), "model": "llama3-8b", **pools})
    with pytest.raises(ConfigFileError, match="fitted for model tiny"):
        (tmp_path / "d.toml").write_text(f'profile = "{path}"\nmodel = "qwen2.5-7b"\n')
        load_config(tmp_path / "d.toml", pools)

    cost = CostModel.from_config(cfg)
    c = _clock()
    assert cost.h2d_bytes_per_s == c["h2d_bytes_per_s"] and cost.link_source == str(path)
    assert cost.decode_step_ns(1000) == int(c["decode_step_ns"] + 1000 * c["decode_ns_per_context_token"])
    for new, prefix in ((1, 0), (300, 0), (4096, 8192), (20_000, 100)):
        want = max(c["prefill_ns_per_token"] * new + c["prefill_ns_per_token_pair"] * new * (prefix + new / 2),
                   c["prefill_floor_ns"]) + c["batch_overhead_ns"]
        assert cost.prefill_alone_ns(new, prefix) == pytest.approx(want, abs=2)


def test_preset_clock_is_the_presets_cost_model():
    """A profile holding preset_clock's numbers times requests as the presets do (to the ns)."""
    for model, gpu in (("llama3-8b", "h200"), ("llama3-70b", "a100"), ("tiny", "cpu")):
        plain = CostModel.from_config(EngineConfig(model=model, gpu=gpu, device_tokens=4096, host_tokens=8192))
        fitted = dataclasses.replace(plain, clock=preset_clock(model, gpu))
        for new, prefix in ((1, 0), (64, 8192), (2048, 0), (8000, 30_000)):
            assert abs(fitted.prefill_alone_ns(new, prefix) - plain.prefill_alone_ns(new, prefix)) <= 1
        for ctx in (0, 5000, 400_000):
            assert abs(fitted.decode_step_ns(ctx) - plain.decode_step_ns(ctx)) <= 1


@pytest.mark.parametrize("layerwise", [True, False])
def test_the_fits_model_is_the_cost_models(layerwise):
    """diagnose/twin/calibrate.prefill_model, vectorised, against CostModel term by term: one batch of
    one request with and without a load-back, overlapped or not."""
    model, gpu, ps = "llama3-70b", "a100", 64
    plain = CostModel.from_config(EngineConfig(model=model, gpu=gpu, device_tokens=4096, host_tokens=8192,
                                               page_size=ps, layerwise_overlap=layerwise))
    cases = [(64, 8192, 8192), (2048, 0, 0), (128, 4096, 4096), (512, 1024, 0), (64, 12288, 12288)]
    pts = PrefillPoints(np.array([n for n, _, _ in cases], float),
                        np.array([n * (p + n / 2) for n, p, _ in cases], float),
                        np.array([[h] for _, _, h in cases], float), np.zeros(len(cases)), np.zeros(len(cases)),
                        np.ones(len(cases), int))
    got = prefill_model(pts, Geometry(model, gpu, page_size=ps, layerwise_overlap=layerwise))(preset_clock(model, gpu))
    for (n, p, h), g in zip(cases, got):
        compute = plain.prefill_ns(plain.prefill_flops(n, p))
        load = plain.copy_ns(h * plain.kv_bytes_per_token, h // ps, to_device=True) if h else 0
        assert g == pytest.approx(plain.overlapped_ns(load, compute), abs=2)
    # decode: a request of `input` tokens decoding alone runs output - 1 steps, step j reading
    # input + j tokens (the engine's seq_len after the step's slot)
    decodes = [(1, 2), (8192, 16), (0, 5), (100_000, 3)]
    got = decode_model(np.array([o - 1 for _, o in decodes], float),
                       np.array([(o - 1) * i + (o - 1) * o / 2 for i, o in decodes], float))(preset_clock(model, gpu))
    for (i, o), g in zip(decodes, got):
        assert g == pytest.approx(sum(plain.decode_step_ns(i + j) for j in range(1, o)), abs=o)


@pytest.mark.parametrize("text, message", [
    ('format = "other/1"\n', "not a calibrate profile (format 'other/1'"),
    ('format = "{f}"\nmodel = "tiny"\ngpu = "cpu"\n', "no [clock] table"),
    ('format = "{f}"\nmodel = "tiny"\ngpu = "cpu"\n[clock]\nprefill_ns_per_token = 1.0\n', "no clock.prefill_ns_per_token_pair (it must be"),
    ("not = [toml", "neither JSON nor TOML"),
])
def test_bad_profiles_are_refused_with_the_reason(tmp_path, text, message):
    p = tmp_path / "bad.toml"
    p.write_text(text.replace("{f}", PROFILE_FORMAT))
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
        EngineConfig(profile=str(p), device_tokens=4096, host_tokens=8192)


def test_bad_clock_values_and_presets(tmp_path):
    for over, message in (({"h2d_bytes_per_s": 0.0}, r"clock.h2d_bytes_per_s 0.0 must be a bandwidth in bytes/s in \[1e\+06"),
                          ({"batch_overhead_ns": -1.0}, r"clock.batch_overhead_ns -1.0 must be a time in ns in \[0, ")):
        path = write_profile(tmp_path / "p.toml", model="tiny", gpu="cpu", clock=_clock(**over), fit={})
        with pytest.raises(ConfigError, match=message):
            load_profile(path)
    path = write_profile(tmp_path / "p.toml", model="tiny", gpu="cpu", clock=_clock(), fit={})
    path.write_text(path.read_text().replace('model = "tiny"', 'model = "gpt5"'))
    with pytest.raises(ConfigError, match="unknown .*gpt5"):
        load_profile(path)
    with pytest.raises(ConfigError, match="no such file"):
        EngineConfig(profile=str(tmp_path / "missing.toml"), device_tokens=4096, host_tokens=8192)


def test_copy_kernel_json_profiles_still_set_the_link_only(tmp_path):
    p = tmp_path / "profile.json"
    p.write_text(json.dumps({"h2d_bytes_per_s": 9e9, "d2h_bytes_per_s": 8e9, "transfer_overhead_ns": 1234}))
    pools = {"device_tokens": 4096, "host_tokens": 8192}
    cfg = EngineConfig(model="tiny", gpu="cpu", profile=str(p), **pools)
    cost = CostModel.from_config(cfg)
    plain = CostModel.from_config(EngineConfig(model="tiny", gpu="cpu", **pools))
    assert (cost.h2d_bytes_per_s, cost.d2h_bytes_per_s, cost.transfer_overhead_ns) == (9e9, 8e9, 1234)
    assert cost.clock is None and cost.prefill_alone_ns(500, 100) == plain.prefill_alone_ns(500, 100)
    assert cfg.to_json()["profile_source"]["kind"] == "copy_kernels"
    p.write_text("{}")
    with pytest.raises(ConfigError, match="profile.json: no h2d_bytes_per_s"):
        EngineConfig(profile=str(p), **pools)
