"""Bad traces through `tierdiag replay`: one line naming file and line, exit 3, no traceback.

The reader's own tests (tests/trace) cover every bad-line message and fuzz it; these cover the
CLI end: exit codes, what is left in the database, the warning and skip reports.
"""

from __future__ import annotations

import gzip
import json

import pytest

from harness import ROOMY, SMALL, cli_env, good_lines, line, runs, sql, write_trace

from tests.support.cli import tierdiag_in_process


def test_missing_trace_file(tmp_path):
    db = tmp_path / "r.duckdb"
    r = tierdiag_in_process("replay", tmp_path / "nope.jsonl", "--db", db, *SMALL)
    r.fails(3, "nope.jsonl", "no such trace file")
    assert not db.exists(), "a trace that cannot be read creates no database"


def test_trace_that_is_a_folder(tmp_path):
    r = tierdiag_in_process("replay", tmp_path, "--db", tmp_path / "r.duckdb", *SMALL)
    r.fails(3, str(tmp_path), "is a directory")


@pytest.mark.parametrize("content", [b"", b"\n\n   \n"], ids=["empty", "blank-lines"])
def test_empty_trace(tmp_path, content):
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(content)
    db = tmp_path / "r.duckdb"
    tierdiag_in_process("replay", trace, "--db", db, *SMALL).fails(3, "t.jsonl", "no requests in the trace")
    assert not db.exists()


# (bad line, message fragment). The bad line goes first, or third after two good ones.
BAD_LINES = [
    ('{"timestamp": 0, "input_length": 5', "bad JSON"),
    ('[1, 2, 3]', "expected a JSON object"),
    (json.dumps({"timestamp": 0, "output_length": 3, "hash_ids": [1]}), "missing field 'input_length'"),
    (json.dumps({"timestamp": 0, "input_length": "900", "output_length": 3, "hash_ids": [1, 2]}),
     "'input_length' must be an integer"),
    (json.dumps({"timestamp": 0, "input_length": 900.5, "output_length": 3, "hash_ids": [1, 2]}),
     "'input_length' must be an integer"),
    (json.dumps({"timestamp": 0, "input_length": 900, "output_length": -3, "hash_ids": [1, 2]}),
     "'output_length' is negative"),
    (json.dumps({"timestamp": -5, "input_length": 900, "output_length": 3, "hash_ids": [1, 2]}),
     "'timestamp' is negative"),
    (json.dumps({"timestamp": 0, "input_length": 900, "output_length": 3, "hash_ids": [1, 2, 3]}),
     "'hash_ids' has 3 entries, expected 2"),
]


@pytest.mark.parametrize(("bad", "fragment"), BAD_LINES, ids=[f for _, f in BAD_LINES])
def test_bad_first_line_fails_before_any_run(tmp_path, bad, fragment):
    trace = write_trace(tmp_path / "t.jsonl", [bad] + good_lines(2, start_ts=10))
    db = tmp_path / "r.duckdb"
    tierdiag_in_process("replay", trace, "--db", db, *SMALL).fails(3, f"{trace}:1:", fragment, "--skip-bad")
    assert not db.exists(), "nothing was replayed, so nothing is recorded"


@pytest.mark.parametrize(("bad", "fragment"), BAD_LINES, ids=[f for _, f in BAD_LINES])
def test_bad_later_line_leaves_a_failed_run(tmp_path, bad, fragment):
    bad = bad.replace('"timestamp": 0', '"timestamp": 300')  # keep time moving forward
    trace = write_trace(tmp_path / "t.jsonl", good_lines(2) + [bad])
    db = tmp_path / "r.duckdb"
    err = tierdiag_in_process("replay", trace, "--db", db, *SMALL).fails(3, f"{trace}:3:", fragment, "as failed")
    (run,) = runs(db, process=False)
    assert run["status"] == "failed" and fragment in run["error"]
    assert run["run_id"] in err


def test_timestamps_going_backwards(tmp_path):
    trace = write_trace(tmp_path / "t.jsonl", [line(500, 1000, [0, 1]), line(600, 1000, [0, 2]),
                                               line(100, 1000, [0, 3])])
    tierdiag_in_process("replay", trace, "--db", tmp_path / "r.duckdb", *SMALL).fails(
        3, f"{trace}:3:", "timestamp 100 goes backwards")


def test_unknown_keys_warn_once_and_replay(tmp_path):
    lines = [line(100 * i, 1000, [0, 10 + i], colour="red", weight=i) for i in range(20)]
    trace = write_trace(tmp_path / "t.jsonl", lines)
    r = tierdiag_in_process("replay", trace, "--db", tmp_path / "r.duckdb", *SMALL)
    assert r.code == 0, r.err
    warnings = [x for x in r.err.splitlines() if "unknown" in x]
    assert warnings == ["tierdiag: warning: ignored unknown trace keys: colour, weight"]
    assert "Traceback" not in r.err


def test_gzip_trace_replays(tmp_path):
    trace = tmp_path / "t.jsonl.gz"
    trace.write_bytes(gzip.compress("".join(x + "\n" for x in good_lines(30)).encode()))
    db = tmp_path / "r.duckdb"
    r = tierdiag_in_process("replay", trace, "--db", db, *SMALL, "--json")
    assert r.json()["num_requests"] == 30
    assert sql(db, "SELECT count(*) FROM requests") == [(30,)]


def test_truncated_gzip_names_the_file(tmp_path):
    data = gzip.compress("".join(x + "\n" for x in good_lines(400)).encode())
    trace = tmp_path / "t.jsonl.gz"
    trace.write_bytes(data[: len(data) // 2])
    tierdiag_in_process("replay", trace, "--db", tmp_path / "r.duckdb", *SMALL).fails(3, str(trace), "gzip")


def test_skip_bad_reports_count_and_first_lines(tmp_path):
    lines = good_lines(40)
    bad_at = [3, 7, 8, 20, 21, 30, 35]  # 1-based line numbers
    for ln in bad_at:
        lines[ln - 1] = "not json" if ln != 3 else json.dumps({"timestamp": 200, "output_length": 1, "hash_ids": [0]})
    trace = write_trace(tmp_path / "t.jsonl", lines)
    db = tmp_path / "r.duckdb"
    r = tierdiag_in_process("replay", trace, "--db", db, *SMALL, "--skip-bad", "--json")
    summary = r.json()
    assert r.err.strip().splitlines() == [
        "tierdiag: skipped 7 bad lines (line 3: missing field 'input_length'; also line 7, line 8, line 20, "
        "line 21, ...)"]
    assert summary["bad_lines"] == 7 and [ln for ln, _ in summary["first_bad"]] == bad_at[:5]
    assert summary["num_requests"] == 33
    assert sql(db, "SELECT count(*) FROM requests") == [(33,)]
    assert runs(db, process=False)[0]["status"] == "complete"


def test_bad_line_found_mid_run_keeps_what_was_recorded(tmp_path):
    """The reader streams: a bad line deep in the trace is found after thousands of requests
    were replayed and flushed. The run ends `failed`, not `running`, and keeps them."""
    trace = tmp_path / "big.jsonl"
    assert tierdiag_in_process("synth", trace, "--requests", "1500", "--seed", "5").code == 0
    lines = trace.read_text().splitlines()
    lines.insert(1200, '{"timestamp": 1, "input_length": ')
    write_trace(trace, lines)
    db = tmp_path / "r.duckdb"
    # Flush every few hundred requests, so the bad line is met with rows already in the file.
    r = tierdiag_in_process("replay", trace, "--db", db, *ROOMY, env=cli_env(TIERDIAG_FLUSH_EVERY_S="0"))
    err = r.fails(3, f"{trace}:1201:", "bad JSON", "as failed")
    (run,) = runs(db, process=False)
    recorded = sql(db, "SELECT count(*) FROM requests WHERE run_id = ?", [run["run_id"]])[0][0]
    assert run["status"] == "failed" and run["error"].startswith(f"{trace}:1201:")
    assert recorded == run["num_requests"] > 0
    assert f"{recorded:,} requests recorded" in err
    # What was recorded is readable by every view.
    assert tierdiag_in_process("summary", "--db", db, "--json").json()["num_requests"] == recorded
