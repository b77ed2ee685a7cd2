"""`calibrate --from` against a server whose clock is known: llama3-70b on an A100, replayed by the
engine itself and written as SGLang 0.5.23 exports; the fit runs under llama3-70b on an H200
(the default GPU), so every GPU-dependent constant starts 2-3x off.

No timing asserts: the fit's own wall time is printed by benchmarks/calibrate_fit.py.
"""

from __future__ import annotations

import json
import math

import pytest

from tests.calibrate.server import POOLS, export_server, run_server, workload
from tests.diagnose.test_cli import run_cli, run_cli_here
from tierdiag.config.profile import load_profile, preset_clock
from tierdiag.diagnose.twin.calibrate import Geometry, calibrate_run, twin_error
from tierdiag.diagnose.read.quantile import nearest_rank
from tierdiag.importers.load import import_sglang
from tierdiag.store.reader import open_store, resolve_run

TRUE = preset_clock("llama3-70b", "a100")  # the server's clock
BASE = Geometry("llama3-70b", "h200")
RECOVERED = ("prefill_ns_per_token", "prefill_ns_per_token_pair", "prefill_floor_ns", "batch_overhead_ns",
             "decode_step_ns", "decode_ns_per_context_token", "h2d_bytes_per_s")
POOL_ARGS = ["--device-tokens", str(POOLS["device_tokens"]), "--host-tokens", str(POOLS["host_tokens"]),
             "--page-size", str(POOLS["page_size"]), "--verify", "off"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("server")
    lines = workload()
    db, run_id = run_server(tmp, lines)
    return tmp, lines, db, run_id


def _observed(server, name: str, **export_kw):
    tmp, lines, db, run_id = server
    export = export_server(db, run_id, tmp / f"export-{name}", lines, **export_kw)
    odb = tmp / f"{name}.duckdb"
    s = import_sglang([export], db=odb, run_name=name, trace_out=tmp / f"{name}.jsonl")
    return odb, s.run_id, tmp / f"{name}.jsonl"


def _fit(odb, run_id):
    with open_store(odb) as con:
        return calibrate_run(con, resolve_run(con, run_id), BASE, db_label=str(odb))


@pytest.fixture(scope="module")
def clean(server):
    return _observed(server, "clean")


def test_recovers_the_servers_constants(clean):
    odb, run_id, _ = clean
    c = _fit(odb, run_id)
    for name in RECOVERED:
        p = c.params[name]
        assert p.fitted, (name, p.reason)
        assert p.value == pytest.approx(TRUE[name], rel=0.05), name
        assert p.low <= p.value <= p.high
        # the presets it started from were far off (the overhead is the same on both GPUs)
        if name != "batch_overhead_ns":
            assert abs(preset_clock("llama3-70b", "h200")[name] / TRUE[name] - 1) > 0.5, name
    # 10 us on a 100 ms load-back moves nothing; backups never show in a request's time
    assert c.kept == ["transfer_overhead_ns", "d2h_bytes_per_s"]
    assert "too small to show" in c.params["transfer_overhead_ns"].reason
    u = c.usable
    assert u.num_requests == 60 and u.prefill_requests == 51
    # 4 waited for another request's prefill (close pairs' second halves, a long document behind
    # another); 5 arrived during another's decode step and waited for it (SGLang's loop takes
    # new requests between steps): queued, left out of the prefill fit
    assert u.excluded == {"queued (more than 2 ms before its batch)": 9}
    # decode: the requests whose steps ran alone (no other request prefilled or decoded between
    # their first token and finish); the rest's steps read others' KV too, or waited for a prefill
    assert len(u.decode_ns) == 45 and u.decode_excluded == {
        "decoded beside another request (batched steps or a prefill between them: the steps' context and count "
        "are not its own)": 15}
    # held out: the last 30 % by arrival, not fitted on
    assert c.heldout_prefill.num_points == len(u.prefill.observed_ns) - math.ceil(0.7 * len(u.prefill.observed_ns))
    assert c.heldout_prefill.median_rel_error < 0.01 and c.heldout_prefill.p90_rel_error < 0.01
    assert c.heldout_prefill_preset.median_rel_error > 0.5
    assert c.heldout_decode.median_rel_error < 0.01
    assert c.wide == []


def test_calibrated_twin_agrees_with_the_server_where_the_presets_do_not(clean, tmp_path):
    odb, run_id, trace = clean
    profile = tmp_path / "server.toml"
    code, out, err, heavy = run_cli("calibrate", "--from", run_id, "--db", str(odb), "--model", "llama3-70b",
                                    "-o", str(profile))
    assert code == 0, err
    text = " ".join(out.split())
    assert "51 of 60 timed requests for prefill" in text and "9 queued" in text
    assert "transfer_overhead_ns kept: too small to show in any usable request's time" in text
    assert "held-out check (fitted on the first 70% by arrival, measured on the other 15 batches)" in text
    assert heavy == [], f"calibrate --from imported {heavy}"
    prof = load_profile(profile)
    assert (prof.kind, prof.model, prof.gpu, prof.fit["source_run"]) == ("fitted", "llama3-70b", "h200", run_id)

    twins = {}
    for name, extra in (("cal", ["--profile", str(profile)]), ("cal-again", ["--profile", str(profile)]),
                        ("preset", ["--model", "llama3-70b"])):
        code, out, err = run_cli_here("replay", str(trace), "--db", str(odb), "--run-name", name, *extra, *POOL_ARGS)
        assert code == 0, err
        twins[name] = out
    assert "clock: calibrated on observed run" in " ".join(twins["cal"].split())
    with open_store(odb) as con:
        ids = {n: resolve_run(con, n).run_id for n in twins}
        cal, preset = twin_error(con, run_id, ids["cal"]), twin_error(con, run_id, ids["preset"])
        rows = [con.execute("SELECT req_id, ttft_ns, finish_ns, host_hit_tokens FROM requests WHERE run_id = ? "
                            "ORDER BY req_id", [ids[n]]).fetchall() for n in ("cal", "cal-again")]
        pairs = con.execute("SELECT o.ttft_ns, t.ttft_ns FROM requests o JOIN requests t USING (req_id) "
                            "WHERE o.run_id = ? AND t.run_id = ?", [run_id, ids["preset"]]).fetchall()
    assert rows[0] == rows[1]  # replays with a profile are deterministic
    for e in (cal, preset):
        assert e.unmatched == 0 and [c.hit_class for c in e.classes] == ["all", "device_hit", "miss", "tiered_hit"]
    for c in cal.classes:
        assert c.median_rel <= 0.05 and c.num_requests > 0
    for c in preset.classes:
        assert c.median_rel > 0.3
    # nearest rank, by hand
    rel = sorted(abs(t - o) / o for o, t in pairs)
    assert preset.by_class()["all"].median_rel == nearest_rank(rel, 0.5)
    assert preset.by_class()["all"].p90_abs_ms == nearest_rank(sorted(abs(t - o) / 1e6 for o, t in pairs), 0.9)

    code, out, err = run_cli_here("runs", "--db", str(odb))
    assert code == 0, err
    flat = "".join(out.split())  # the cell folds anywhere
    assert f"clock:calibratedonobservedrun{run_id}(51usablerequests;held-outprefillerrormedian0.0%" in flat
    code, out, err = run_cli_here("summary", "--run", "cal", "--db", str(odb))
    assert code == 0 and f"clock: calibrated on observed run {run_id}" in " ".join(out.split()), err
    code, out, err = run_cli_here("summary", "--run", "cal", "--db", str(odb), "--json")
    clock = json.loads(out)["clock"]
    assert (clock["source_run"], clock["usable_requests"], clock["kind"]) == (run_id, 51, "fitted")
    assert clock["sha256"] == load_profile(profile).sha256


def test_noise_widens_the_intervals_and_the_tool_says_so(server, clean, tmp_path):
    exact = _fit(*clean[:2])
    odb, run_id, _ = _observed(server, "noisy", noise=0.03)
    noisy = _fit(odb, run_id)
    for name in ("prefill_ns_per_token", "prefill_floor_ns", "decode_step_ns", "h2d_bytes_per_s"):
        assert noisy.params[name].fitted
        assert noisy.params[name].rel_half_width > 100 * exact.params[name].rel_half_width, name
    assert noisy.wide and noisy.prefill_fit.scatter > 0.01
    assert noisy.params["prefill_ns_per_token"].value == pytest.approx(TRUE["prefill_ns_per_token"], rel=0.05)
    code, out, err = run_cli_here("calibrate", "--from", run_id, "--db", str(odb), "--model", "llama3-70b",
                                  "-o", str(tmp_path / "noisy.toml"))
    assert code == 0, err
    text = " ".join(out.split())
    assert "wide intervals (more than ±5%)" in text and "noise the model does not explain" in text
    assert load_profile(tmp_path / "noisy.toml").fit["intervals_95"]


def test_all_queued_keeps_the_prefill_presets_and_says_why(server):
    odb, run_id, _ = _observed(server, "queued", queue_all=True)
    c = _fit(odb, run_id)
    preset = preset_clock("llama3-70b", "h200")
    for name in ("prefill_ns_per_token", "prefill_ns_per_token_pair", "prefill_floor_ns", "batch_overhead_ns",
                 "h2d_bytes_per_s", "transfer_overhead_ns"):
        assert not c.params[name].fitted and c.params[name].value == preset[name]
        assert c.params[name].reason == "no usable point"
    assert c.usable.prefill_requests == 0 and c.usable.excluded == {"queued (more than 2 ms before its batch)": 60}
    assert any("no usable prefill batch" in w for w in c.warnings)
    assert c.heldout_prefill.num_points == 0 and "heldout_prefill_median_rel_error" not in c.profile_fit_table()
    # decode does not need an idle GPU: still fitted
    assert c.params["decode_step_ns"].fitted
    assert c.params["decode_step_ns"].value == pytest.approx(TRUE["decode_step_ns"], rel=0.05)


def test_no_host_hits_keeps_the_link_presets(tmp_path):
    # the same workload with pools that never push a document to host
    lines = [x for x in workload(docs=2, unique=12, revisits=14)]
    from tests.calibrate import server as srv

    roomy = dict(POOLS, device_tokens=200_000, host_tokens=400_000)
    saved = srv.POOLS
    srv.POOLS = roomy
    try:
        db, rid = run_server(tmp_path, lines)
    finally:
        srv.POOLS = saved
    export_server(db, rid, tmp_path / "export", lines)
    odb = tmp_path / "obs.duckdb"
    s = import_sglang([tmp_path / "export"], db=odb)
    c = _fit(odb, s.run_id)
    assert c.usable.prefill.loaded.sum() == 0
    for name in ("h2d_bytes_per_s", "transfer_overhead_ns"):
        assert not c.params[name].fitted
        assert c.params[name].reason == "no usable request loaded tokens back from host"
    assert c.params["prefill_ns_per_token"].value == pytest.approx(TRUE["prefill_ns_per_token"], rel=0.05)
    # replay's line and the profile name what was kept
    table = c.profile_fit_table()
    assert {"h2d_bytes_per_s", "transfer_overhead_ns", "d2h_bytes_per_s"} <= set(table["kept_from_preset"])
    assert table["kept_reasons"]["h2d_bytes_per_s"] == "no usable request loaded tokens back from host"


def test_calibrate_from_errors(clean, tmp_path):
    odb, run_id, _ = clean
    code, _, err = run_cli_here("calibrate", "--from", run_id, "--db", str(odb))
    assert code == 2 and "-o" in err
    code, _, err = run_cli_here("calibrate", "--from", "nosuchrun", "--db", str(odb), "-o", str(tmp_path / "p.toml"))
    assert code != 0 and "nosuchrun" in err and not (tmp_path / "p.toml").exists()
    code, _, err = run_cli_here("calibrate", "--from", run_id, "--db", str(odb), "--model", "gpt5", "-o",
                                str(tmp_path / "p.toml"))
    assert code == 2 and "llama3-70b" in err  # the known names


def test_config_sets_the_geometry_the_fit_prices_under(clean, tmp_path):
    """`calibrate --from RUN --config FILE`: the twin's replay config (model, page size, prefill chunk)
    is the geometry of the fit, as `--model` is; `--model` on the line overrides the file's; `-o`
    that is the config file is refused before anything is written."""
    odb, run_id, _ = clean
    cfg = tmp_path / "twin.toml"
    cfg.write_text('model = "llama3-70b"\ndevice_tokens = 28672\npage_size = 32\nmax_prefill_tokens = 8192\n')
    code, out, err = run_cli_here("calibrate", "--from", run_id, "--db", str(odb), "--config", str(cfg),
                                  "-o", str(tmp_path / "a.toml"), "--json")
    assert code == 0, err
    fitted = json.loads(out)
    assert fitted["geometry"] == {"model": "llama3-70b", "gpu": "h200", "page_size": 32,
                                  "max_prefill_tokens": 8192, "layerwise_overlap": True}
    code, out, err = run_cli_here("calibrate", "--from", run_id, "--db", str(odb), "--config", str(cfg),
                                  "--model", "llama3-8b", "-o", str(tmp_path / "b.toml"), "--json")
    assert code == 0, err
    assert json.loads(out)["geometry"]["model"] == "llama3-8b"
    before = cfg.read_text()
    code, _, err = run_cli_here("calibrate", "--from", run_id, "--db", str(odb), "--config", str(cfg), "-o", str(cfg))
    assert code == 2 and "--config" in err and cfg.read_text() == before
    cfg.write_text('page_sise = 32\n')
    code, _, err = run_cli_here("calibrate", "--from", run_id, "--db", str(odb), "--config", str(cfg),
                                "-o", str(tmp_path / "c.toml"))
    assert code == 3 and "page_sise" in err and not (tmp_path / "c.toml").exists()
