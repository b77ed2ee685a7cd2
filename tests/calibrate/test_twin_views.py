"""`compare OBSERVED PRESET_TWIN CALIBRATED_TWIN` and `explain REQ --run OBSERVED` say how far each
twin's TTFTs are from the server's, and which clock each twin ran on.

The server is tests/calibrate/server.py's (llama3-70b on an A100, the engine itself); the twins run
llama3-70b on an H200: one on the presets' clock, one on the clock `calibrate --from` fitted.
"""

from __future__ import annotations

import json

import pytest

from tests.calibrate.server import POOLS, export_server, run_server, workload
from tests.diagnose.test_cli import run_cli, run_cli_here
from tierdiag.config.engine import EngineConfig
from tierdiag.diagnose.twin.twin_error import twin_error
from tierdiag.importers.load import import_sglang
from tierdiag.store.reader import open_store, resolve_run


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from tierdiag.app.calibrate import calibrate_from
    from tierdiag.app.replay import replay

    tmp = tmp_path_factory.mktemp("twins")
    lines = workload(docs=4, unique=12, revisits=16)
    sdb, srun = run_server(tmp, lines)
    export = export_server(sdb, srun, tmp / "export", lines)
    db, trace = tmp / "obs.duckdb", tmp / "twin.jsonl"
    observed = import_sglang([export], db=db, run_name="server-obs", trace_out=trace).run_id
    profile = tmp / "server.toml"
    calibrate_from(db, observed, profile, model="llama3-70b")
    runs = {}
    for name, prof in (("preset-twin", None), ("calibrated-twin", str(profile))):
        cfg = EngineConfig(model="llama3-70b", gpu="h200", profile=prof, verify="off", **POOLS)
        runs[name] = replay(trace, cfg, db=db, run_name=name, probes=True, skip_bad=False).run_id
    # the same export in a store with no twin
    alone = tmp / "alone.duckdb"
    import_sglang([export], db=alone, run_name="server-alone")
    return db, observed, runs, alone


def test_compare_shows_each_twins_error_and_clock(store):
    db, observed, runs, _ = store
    code, out, err, heavy = run_cli("compare", "server-obs", "preset-twin", "calibrated-twin", "--db", str(db),
                                    "--json")
    assert code == 0, err
    assert heavy == [], f"compare imported {heavy}"
    c = json.loads(out)
    assert c["observed_run_id"] == observed
    preset, cal = c["twins"]  # in the order given
    assert (preset["replayed_run_id"], cal["replayed_run_id"]) == (runs["preset-twin"], runs["calibrated-twin"])
    assert preset["profile_source"] is None and preset["clock"] == "clock: the presets' (llama3-70b on h200)"
    assert cal["profile_source"]["source_run"] == observed
    assert cal["clock"].startswith(f"clock: calibrated on observed run {observed} (")
    for t in (preset, cal):
        assert [k["hit_class"] for k in t["twin_error"]["classes"]] == ["all", "device_hit", "miss", "tiered_hit"]
        assert t["twin_error"]["unmatched"] == 0
    by = {name: {k["hit_class"]: k for k in t["twin_error"]["classes"]} for name, t in (("p", preset), ("c", cal))}
    for k in by["c"]:
        assert by["c"][k]["median_rel"] <= 0.05, k
        assert by["p"][k]["median_rel"] > 0.3, k  # an H200's roofline for an A100 server
    # the JSON carries twin_error() itself
    with open_store(db) as con:
        assert cal["twin_error"] == twin_error(con, observed, runs["calibrated-twin"]).to_json()

    code, out, err = run_cli_here("compare", "server-obs", "preset-twin", "calibrated-twin", "--db", str(db))
    assert code == 0, err
    text = " ".join(out.split())
    assert f"twin preset-twin ({runs['preset-twin']}): clock: the presets' (llama3-70b on h200)" in text
    assert f"twin calibrated-twin ({runs['calibrated-twin']}): clock: calibrated on observed run {observed}" in text
    assert "twin TTFT error against the server" in text
    assert "tiered hit" in text and "device hit" in text

    # one twin: the agreement as before, its error and clock beside it (either order)
    code, out, err = run_cli_here("compare", "calibrated-twin", "server-obs", "--db", str(db), "--json")
    assert code == 0, err
    one = json.loads(out)
    assert one["replayed_run_id"] == runs["calibrated-twin"] and one["num_matched"] > 0
    assert one["twin_error"] == cal["twin_error"] and one["clock"] == cal["clock"]


def test_explain_says_how_far_the_twin_was_for_this_request(store):
    db, observed, runs, alone = store
    with open_store(db) as con:
        req, server_ttft = con.execute(
            "SELECT req_id, ttft_ns FROM requests WHERE run_id = ? AND hit_class = 'tiered_hit' "
            "ORDER BY req_id LIMIT 1", [observed]).fetchone()
        twin_ttft = con.execute("SELECT ttft_ns FROM requests WHERE run_id = ? AND req_id = ?",
                                [runs["calibrated-twin"], req]).fetchone()[0]
        run_error = twin_error(con, observed, runs["calibrated-twin"]).by_class()["all"]
    code, out, err, heavy = run_cli("explain", req, "--run", "server-obs", "--db", str(db), "--json")
    assert code == 0, err
    assert heavy == [], f"explain imported {heavy}"
    e = json.loads(out)
    # the newest replay of the import's trace: the calibrated twin
    assert e["twin_run_id"] == runs["calibrated-twin"]
    assert e["twin_ttft_error_ms"] == pytest.approx((twin_ttft - server_ttft) / 1e6)
    assert e["twin_ttft_rel_error"] == pytest.approx((twin_ttft - server_ttft) / server_ttft)
    assert abs(e["twin_ttft_rel_error"]) <= 0.05
    assert e["twin_run_error"]["median_rel"] == run_error.median_rel
    assert e["twin_clock"].startswith(f"clock: calibrated on observed run {observed}")
    assert "the twin's TTFT for this request was" in e["steps"][2]["finding"]

    code, out, err = run_cli_here("explain", req, "--run", "server-obs", "--db", str(db))
    assert code == 0, err
    text = " ".join(out.replace("│", " ").split())  # the panel's lines, joined
    assert "how far to trust steps 3-4 (from the twin): the twin's TTFT for this request was" in text
    assert f"clock: calibrated on observed run {observed}" in text

    code, out, err = run_cli_here("explain", req, "--run", "server-alone", "--db", str(alone), "--json")
    assert code == 0, err
    e = json.loads(out)
    assert e["twin_run_id"] is None and e["twin_ttft_error_ms"] is None and e["twin_clock"] is None
