"""`tierdiag replay` end to end through the CLI, checked through the database it writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierdiag.trace.synth import DEMO_TRACE

from tests.support.cli import completed_in_process
from tests.support.replays import shared_replay

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"


def tierdiag(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from tierdiag.cli.main import main; main()", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, timeout=600)


def tierdiag_here(*args, cwd=None) -> subprocess.CompletedProcess:
    """`tierdiag` in this process (tests/support/cli.py `completed_in_process`): where what the
    replay records is tested, not its process (~0.45 s of CPU a start)."""
    return completed_in_process(*args, cwd=cwd)


def test_replay_records_a_complete_run_that_conserves_tokens(tmp_path):
    db = tmp_path / "run.duckdb"
    res = tierdiag_here("replay", DEMO_TRACE, "--db", db, "--device-tokens", 98304, "--host-tokens", 393216,
                        "--verify", "all", "--json")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["status"] == "complete" and summary["num_requests"] == 700
    con = duckdb.connect(str(db), read_only=True)
    (status, n, cfg) = con.execute("SELECT status, num_requests, config_json FROM runs").fetchone()
    assert status == "complete" and n == 700 and json.loads(cfg)["device_tokens"] == 98304
    bad = con.execute("""SELECT count(*) FROM requests WHERE device_hit_tokens + host_hit_tokens + storage_hit_tokens
                         + computed_tokens <> input_tokens
                         OR queue_ns + storage_wait_ns + loadback_exposed_ns + recompute_ns + compute_ns <> ttft_ns""").fetchone()[0]
    assert bad == 0
    # the demo exercises all three states and real, verified load-backs
    classes = dict(con.execute("SELECT hit_class, count(*) FROM requests GROUP BY 1").fetchall())
    assert set(classes) == {"device_hit", "tiered_hit", "miss"}
    lb_req, lb_tr, unverified = con.execute("""SELECT (SELECT sum(loadback_bytes) FROM requests),
        (SELECT sum(bytes) FROM transfers WHERE kind = 'load_back'),
        (SELECT count(*) FROM transfers WHERE kind = 'load_back' AND NOT verified)""").fetchone()
    assert lb_req == lb_tr > 0 and unverified == 0
    # token-weighted totals in the summary match the table
    dev, host = con.execute("SELECT sum(device_hit_tokens), sum(host_hit_tokens) FROM requests").fetchone()
    assert (summary["device_tokens"], summary["host_tokens"]) == (dev, host)
    assert con.execute("SELECT count(*) FROM evictions").fetchone()[0] > 0
    assert con.execute("SELECT count(DISTINCT tier) FROM pool_samples").fetchone()[0] == 2
    con.close()


def test_second_replay_appends_a_run_and_no_probes_records_nothing(tmp_path):
    db = tmp_path / "run.duckdb"
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": i * 10, "input_length": 700, "output_length": 5,
                                         "hash_ids": [1, 2]}) + "\n" for i in range(5)))
    assert tierdiag_here("replay", trace, "--db", db, "--model", "tiny").returncode == 0
    assert tierdiag_here("replay", trace, "--db", db, "--model", "tiny", "--run-name", "again").returncode == 0
    res = tierdiag_here("replay", trace, "--db", db, "--model", "tiny", "--no-probes", "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["run_id"] is None
    runs = json.loads(tierdiag_here("runs", "--db", db, "--json").stdout)
    assert [r["name"] for r in runs] == ["t", "again"] and all(r["status"] == "complete" for r in runs)


def test_same_trace_twice_gives_identical_rows_in_every_table(tmp_path):
    """Determinism end to end, through the recorder and the store's writer: every column of
    every event table, row for row (as multisets, both ways), except the measured wall time of
    the real copies. One replay in a process of its own, one in this one: two interpreters (two
    string hash seeds), as two runs of a user's are."""
    from tests.reliability.harness import assert_same_event_rows

    db = tmp_path / "run.duckdb"
    for run in (tierdiag, tierdiag_here):
        assert run("replay", DEMO_TRACE, "--db", db, "--device-tokens", 65536).returncode == 0
    con = duckdb.connect(str(db), read_only=True)
    a, b = [r[0] for r in con.execute("SELECT run_id FROM runs ORDER BY created_at").fetchall()]
    assert_same_event_rows(con, a, b)
    con.close()


@pytest.mark.shared
@pytest.mark.skipif(not (SHARED / "conversation_trace.jsonl").exists(), reason="needs ../shared/traces")
def test_conversation_trace_replays_complete_with_plausible_reuse(tmp_path_factory):
    # the one default replay of the trace this run (test_report_chromium renders the same run)
    db, res = shared_replay(tmp_path_factory, SHARED / "conversation_trace.jsonl", "--json")
    assert res.returncode == 0, res.stderr
    con = duckdb.connect(str(db), read_only=True)
    status, n = con.execute("SELECT status, num_requests FROM runs").fetchone()
    assert (status, n) == ("complete", 12_031)
    assert con.execute("SELECT count(*) FROM requests WHERE status = 'finished'").fetchone()[0] == 12_031
    reused, total = con.execute("""SELECT sum(device_hit_tokens + host_hit_tokens + storage_hit_tokens),
                                   sum(input_tokens) FROM requests""").fetchone()
    # between 5 % and the trace's unlimited-cache bound (SOURCES.md: 37.4 %)
    assert 0.05 <= reused / total <= 0.374
    con.close()


@pytest.mark.shared
@pytest.mark.skipif(not (SHARED / "synthetic_trace.jsonl").exists(), reason="needs ../shared/traces")
def test_synthetic_trace_uses_both_tiers_twice_identically(tmp_path):
    """Issue 2's acceptance: 2M-token device pool, 6M-token host pool, write_through. The two
    replays in two interpreters (one a process of its own, one this one), as in the test above."""
    db = tmp_path / "syn.duckdb"
    opts = ["--device-tokens", 2_000_000, "--host-tokens", 6_000_000, "--write-policy", "write_through"]
    for run in (tierdiag, tierdiag_here):
        res = run("replay", SHARED / "synthetic_trace.jsonl", "--db", db, *opts)
        assert res.returncode == 0, res.stderr
    con = duckdb.connect(str(db), read_only=True)
    a, b = [r[0] for r in con.execute("SELECT run_id FROM runs ORDER BY created_at").fetchall()]
    dev, host, broken = con.execute("""SELECT sum(device_hit_tokens), sum(host_hit_tokens),
        count(*) FILTER (WHERE device_hit_tokens + host_hit_tokens + storage_hit_tokens + computed_tokens
                         <> input_tokens) FROM requests WHERE run_id = ? AND status = 'finished'""", [a]).fetchone()
    assert dev > 0 and host > 0 and broken == 0
    # The few requests longer than the model's context (Llama-3.1-8B: 131,072 tokens) are refused
    # as SGLang refuses them, never served.
    reasons = con.execute("SELECT DISTINCT split_part(reject_reason, ':', 1) FROM requests WHERE run_id = ? "
                          "AND status = 'rejected'", [a]).fetchall()
    assert reasons in ([], [("context_length",)])
    cols = "req_id, device_hit_tokens, host_hit_tokens, computed_tokens, ttft_ns"
    assert con.execute(f"""SELECT count(*) FROM (SELECT {cols} FROM requests WHERE run_id = ?
                           EXCEPT SELECT {cols} FROM requests WHERE run_id = ?)""", [a, b]).fetchone()[0] == 0
    con.close()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, (1 << 62)), max_size=60), st.sampled_from([0.0, 0.01, 0.5, 0.9, 0.99, 1.0]))
def test_replay_percentiles_of_the_engines_int64_array_equal_the_lists(values, q):
    # EngineStats keeps ttft_ns and load_back_ns as array('q') (issue 41: a million Python ints
    # were ~40 MB of a 1M-request engine process); the replay's percentiles sort it with numpy:
    # the same nearest-rank value, to the bit, as the list the engine used to keep.
    from array import array

    from tierdiag.app.replay import _percentile

    assert _percentile(array("q", values), q) == _percentile(list(values), q)
