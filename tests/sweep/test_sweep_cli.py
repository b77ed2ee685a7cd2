"""`tierdiag sweep` end to end: 4 combinations in 2 processes give the rows of 4 single replays,
`compare --sweep` shows them, bad --set values fail before any replay, and an interrupted sweep
keeps every finished run complete and readable."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import duckdb
import pytest

from tests.sweep.sweep_helpers import (BASE, DEMO, ENTRY, NAMES, SETS, SHARED_TRACES, assert_same_runs, cli, cli_here,
                                       env, one_line_error, runs_by_name)


def test_sweep_rows_are_those_of_single_replays(swept, singles):
    runs = runs_by_name(swept)
    assert set(runs) == NAMES
    assert {r["status"] for r in runs.values()} == {"complete"}
    assert len({r["sweep_id"] for r in runs.values()}) == 1 and next(iter(runs.values()))["sweep_id"]
    assert {r["kind"] for r in runs.values()} == {"replay"}
    assert_same_runs(swept, singles, NAMES)


def test_compare_sweep_shows_every_run(swept):
    proc = cli_here("compare", "--db", swept, "--json", "--by", "ttft_p50")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["varied"] == ["host_tokens", "write_policy"]
    rows = result["runs"]
    assert {r["name"] for r in rows} == NAMES
    p50 = [r["ttft_p50_ms"] for r in rows]
    assert p50 == sorted(p50)
    for r in rows:
        assert set(r["changes"]) == {"host_tokens", "write_policy"}
        assert r["memory_bytes"] > 0 and 0 < r["gpu_busy_share"] <= 1
        assert {c["hit_class"] for c in r["ttft_by_class"]} <= {"device_hit", "tiered_hit", "miss"}
    # The table view names the sweep and both varied options; it starts with the sweep id.
    text = cli_here("compare", "--db", swept)
    assert text.returncode == 0, text.stderr
    assert "host_tokens" in text.stdout and "write_policy" in text.stdout and result["sweep_id"] in text.stdout


def test_compare_requests_between_two_runs_of_the_sweep(swept):
    a, b = "host_tokens=16k,write_policy=write_through", "host_tokens=64k,write_policy=write_back"
    proc = cli_here("compare", a, b, "--requests", "--top", "3", "--db", swept, "--json")
    assert proc.returncode == 0, proc.stderr
    rc = json.loads(proc.stdout)
    assert rc["name_a"] == a and rc["name_b"] == b
    assert rc["num_common"] == 200 and rc["num_only_a"] == rc["num_only_b"] == 0
    assert len(rc["gains"]) == 3 and all(g["delta_ms"] < 0 for g in rc["gains"])
    assert [g["delta_ms"] for g in rc["gains"]] == sorted(g["delta_ms"] for g in rc["gains"])
    assert all(c["cause_a"] != c["cause_b"] for c in rc["changed"])
    assert sum(t["num_requests"] for t in rc["transitions"]) == rc["num_changed"]
    one_line_error(cli_here("compare", a, "--requests", "--db", swept), 2, "exactly two runs")


@pytest.mark.parametrize("sets, fragments", [
    (("--set", "hots_tokens=1M"), ("unknown key 'hots_tokens'", "known: ", "write_policy")),
    (("--set", "host_tokens=lots"), ("host_tokens value 'lots' must be a whole number",)),
    (("--set", "host_tokens="), ("no values for host_tokens",)),
    (("--set", "host_tokens=1M", "--set", "host_tokens=2M"), ("given twice",)),
    (("--set", "write_policy=write_back,wb"), ("unknown write_policy 'wb'",)),
    (("--set", "host_tokens=1M", "--jobs", "0"), ("--jobs 0",)),
])
def test_bad_set_fails_before_any_replay(tmp_path, trace, sets, fragments):
    db = tmp_path / "never.duckdb"
    one_line_error(cli_here("sweep", trace, *sets, "--db", db), 2, *fragments)
    assert not db.exists()


def test_ray_missing_is_one_line_with_the_install_hint(tmp_path, trace):
    fake = tmp_path / "no_ray"
    fake.mkdir()
    (fake / "ray.py").write_text("raise ImportError('No module named ray')\n")
    db = tmp_path / "never.duckdb"
    proc = cli("sweep", trace, *BASE, "--set", "host_tokens=16k", "--ray", "--db", db,
               PYTHONPATH=f"{fake}:{env()['PYTHONPATH']}")
    one_line_error(proc, 2, "--ray needs Ray", "pip install 'tierdiag[ray]'")
    assert not db.exists()


@pytest.mark.slow
def test_interrupted_sweep_keeps_finished_runs_complete(tmp_path):
    """One worker, three combinations: SIGINT to the driver once the first run is in --db, while
    the second replays (the demo trace COPIES times over, each copy's sessions its own, so a
    replay lasts well beyond the 0.5 s this waits, however fast replays get: four copies were
    once enough, and stopped being when session turns began to arrive closed-loop)."""
    db = tmp_path / "int.duckdb"
    trace = tmp_path / "demo4.jsonl"
    demo = [json.loads(line) for line in DEMO.read_text().splitlines() if line.strip()]
    span = max(r["timestamp"] for r in demo) + 1000
    copies = 12
    with open(trace, "w") as fh:
        for k in range(copies):
            for r in demo:
                own = {"session": f"{r['session']}-{k}"} if "session" in r else {}
                fh.write(json.dumps({**r, **own, "id": f"{r['id']}-{k}", "timestamp": r["timestamp"] + k * span}) + "\n")
    argv = [sys.executable, "-c", ENTRY, "sweep", trace, *BASE, "--set", "host_tokens=16k,32k,64k", "--jobs", "1",
            "--db", db]
    proc = subprocess.Popen(list(map(str, argv)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env(TIERDIAG_FLUSH_EVERY_S="0"))
    lines = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        lines.append(line)
        if ": complete, reuse" in line or not line:
            break
    assert any("host_tokens=16k: complete" in ln for ln in lines), lines
    time.sleep(0.5)  # the second replay is under way (it takes seconds)
    proc.send_signal(signal.SIGINT)
    _, rest = proc.communicate(timeout=120)
    assert proc.returncode == 130, rest
    assert "Traceback" not in rest
    assert "1 complete, 1 interrupted, 1 not started" in rest, rest
    runs = runs_by_name(db)
    assert set(runs) == {"host_tokens=16k", "host_tokens=32k"}
    assert runs["host_tokens=16k"]["status"] == "complete"
    assert runs["host_tokens=32k"]["status"] == "interrupted"
    with duckdb.connect(str(db), read_only=True) as con:
        n = con.execute("SELECT count(*) FROM requests WHERE run_id = ?", [runs["host_tokens=16k"]["run_id"]]).fetchone()[0]
    assert n == runs["host_tokens=16k"]["num_requests"] == copies * len(demo)
    for name in runs:  # both readable by every reader
        assert cli_here("summary", "--run", name, "--db", db, "--json").returncode == 0


@pytest.mark.shared
@pytest.mark.skipif(not (SHARED_TRACES / "synthetic_trace.jsonl").exists(), reason="needs ../shared/traces")
def test_sweep_of_the_synthetic_trace(tmp_path):
    """The issue's own command; one of the four replayed alone for the row check (time)."""
    from tierdiag.config.engine import EngineConfig
    from tierdiag.app.replay import replay

    trace = SHARED_TRACES / "synthetic_trace.jsonl"
    db, single = tmp_path / "sweep.duckdb", tmp_path / "single.duckdb"
    proc = cli_here("sweep", trace, "--set", "host_tokens=2M,8M", "--set", "write_policy=write_through,write_back",
                    "--jobs", "2", "--db", db)
    assert proc.returncode == 0, proc.stderr
    runs = runs_by_name(db)
    assert len(runs) == 4 and {r["status"] for r in runs.values()} == {"complete"}
    name = "host_tokens=8M,write_policy=write_back"
    replay(trace, EngineConfig(host_tokens=8 * 2**20, write_policy="write_back"), db=single, run_name=name,
           probes=True, skip_bad=False)
    assert_same_runs(db, single, [name])


_NO_TORCH = """
import json, sys
sys.argv = ["tierdiag", *json.loads(sys.argv[1])]
from tierdiag.cli.main import main
try:
    main()
except SystemExit as exc:
    assert not exc.code, exc.code
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "ray"))
assert heavy == [], heavy
"""


@pytest.mark.parametrize("args", [("compare", "--json"), ("compare",), ("runs",), ("runs", "--json"),
                                  ("report", "--sweep", "sweep-", "-o", "{tmp}/r.html")])
def test_readers_never_import_torch(swept, tmp_path, args):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    proc = subprocess.run([sys.executable, "-c", _NO_TORCH, json.dumps([*args, "--db", str(swept)])],
                          capture_output=True, text=True, env=env(), timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_runs_shows_kind_sweep_and_changed_options(swept):
    proc = cli_here("runs", "--db", swept, "--json")
    assert proc.returncode == 0, proc.stderr
    runs = {r["name"]: r for r in json.loads(proc.stdout)}
    r = runs["host_tokens=64k,write_policy=write_back"]
    assert r["kind"] == "replay" and r["sweep_id"].startswith("sweep-")
    # model/gpu/pools were set for every run; write_through is the default, so it is not listed.
    assert r["changed_from_defaults"] == {"model": "tiny", "gpu": "cpu", "device_tokens": 16384,
                                          "host_tokens": 65536, "write_policy": "write_back"}
    assert "write_policy" not in runs["host_tokens=64k,write_policy=write_through"]["changed_from_defaults"]
    table = cli_here("runs", "--db", swept)
    assert "replay" in table.stdout and r["sweep_id"] in table.stdout and "write_policy=write_back" in table.stdout


def test_run_accepts_unique_prefixes_of_ids_and_names(swept):
    runs = runs_by_name(swept)
    target = runs["host_tokens=64k,write_policy=write_through"]
    for ref in (target["run_id"], target["run_id"][:-2], "host_tokens=64k,write_policy=write_t"):
        proc = cli_here("summary", "--run", ref, "--db", swept, "--json")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["run_id"] == target["run_id"]
    one_line_error(cli_here("summary", "--run", "host_tokens=64k", "--db", swept), 4, "ambiguous",
                   "host_tokens=64k,write_policy=write_through")


def test_a_bad_line_mid_trace_fails_every_run_and_keeps_them(tmp_path, trace):
    bad = tmp_path / "bad.jsonl"
    lines = trace.read_text().splitlines(keepends=True)
    bad.write_text("".join(lines[:50]) + "{not json\n" + "".join(lines[50:]))
    db = tmp_path / "bad.duckdb"
    proc = cli_here("sweep", bad, *BASE, "--set", "host_tokens=16k,64k", "--jobs", "2", "--db", db)
    assert proc.returncode == 3, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("tierdiag: error: 2 of 2 sweep runs failed;") and "bad.jsonl:51: bad JSON" in last, last
    assert f"kept in {db} as failed" in last and "tierdiag-sweep-" not in last
    runs = runs_by_name(db)
    assert {r["status"] for r in runs.values()} == {"failed"} and len(runs) == 2
    assert all("bad.jsonl:51: bad JSON" in r["error"] for r in runs.values())
