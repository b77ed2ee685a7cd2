"""`tierdiag convert` end to end: public session traces in, a trace `tierdiag replay` takes out;
malformed input is exit 3 naming file:line, an output that is an input exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from tests.cli.cli_helpers import cli_here

FIXTURES = Path(__file__).resolve().parents[1] / "trace" / "fixtures"
SMALL = ("--model", "tiny", "--gpu", "cpu", "--device-tokens", "4096")


def one_error_line(res, code: int) -> str:
    assert res.returncode == code, (res.returncode, res.stderr)
    assert "Traceback" not in res.stderr and res.stderr.count("\n") == 1, res.stderr
    return res.stderr


@pytest.mark.parametrize(("fmt", "src", "block"), [("kv-cache-tester", FIXTURES / "kv-cache-tester", 64),
                                                   ("bailian", FIXTURES / "bailian" / "usage.jsonl", 512)])
def test_convert_then_replay(tmp_path, fmt, src, block):
    out = tmp_path / "t.jsonl"
    res = cli_here("convert", fmt, src, "-o", out, "--block-size", block)
    assert res.returncode == 0, res.stderr
    assert f"wrote 7 requests" in res.stdout and "next: tierdiag replay" in res.stdout
    db = tmp_path / "r.duckdb"
    flags = () if block == 512 else ("--block-size", block)
    rep = cli_here("replay", out, "--db", db, *flags, *SMALL, "--json")
    assert rep.returncode == 0, rep.stderr
    assert "unknown" not in rep.stderr  # session and think_ms are trace keys, not unknown ones
    with duckdb.connect(str(db), read_only=True) as con:
        ids = {row[0] for row in con.execute("SELECT req_id FROM requests").fetchall()}
    assert ids == {json.loads(line)["id"] for line in out.read_text().splitlines()}


def test_convert_json_summary(tmp_path):
    res = cli_here("convert", "bailian", FIXTURES / "bailian" / "usage.jsonl", "-o", tmp_path / "b.jsonl", "--json")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["format"] == "bailian" and summary["num_sessions"] == 4 and summary["forks"] == 1
    assert summary["block_size"] == 512


def test_malformed_input_is_exit_3_with_file_and_line(tmp_path):
    bad = tmp_path / "u.jsonl"
    bad.write_text(json.dumps({"chat_id": 1, "timestamp": 0, "input_length": 16, "output_length": 1,
                               "hash_ids": [1]}) + "\n" + '{"chat_id": 2, "timestamp": "late"}\n')
    err = one_error_line(cli_here("convert", "bailian", bad, "-o", tmp_path / "o.jsonl"), 3)
    assert f"{bad}:2: 'timestamp' must be a finite number" in err
    conv = tmp_path / "c.json"
    conv.write_text('{"requests": [\n {"t": 0, "in": 64, "out": 1}\n]}\n')
    err = one_error_line(cli_here("convert", "kv-cache-tester", conv, "-o", tmp_path / "o.jsonl"), 3)
    assert f"{conv}:2: missing field 'hash_ids'" in err
    assert not (tmp_path / "o.jsonl").exists()


def test_output_that_is_an_input_is_exit_2_naming_both(tmp_path):
    src = tmp_path / "u.jsonl"
    src.write_bytes((FIXTURES / "bailian" / "usage.jsonl").read_bytes())
    err = one_error_line(cli_here("convert", "bailian", src, "-o", src), 2)
    assert f"-o {src} is the input {src}" in err
    assert src.read_bytes() == (FIXTURES / "bailian" / "usage.jsonl").read_bytes()


@pytest.mark.parametrize(("args", "words"), [
    (["sharegpt", "x", "-o", "o.jsonl"], "unknown format 'sharegpt'; known: bailian, kv-cache-tester"),
    (["bailian", "x", "-o", "o.jsonl", "--start-spread", "5"], "--start-spread applies to kv-cache-tester"),
    (["kv-cache-tester", "x", "-o", "o.jsonl", "--block-size", "0"], "--block-size must be 1"),
])
def test_bad_options_are_exit_2(tmp_path, args, words):
    assert words in one_error_line(cli_here("convert", *args, cwd=tmp_path), 2)


def test_unchained_source_ids_warn_on_stderr(tmp_path):
    src = tmp_path / "u.jsonl"
    rows = [{"chat_id": 1, "timestamp": 0, "input_length": 32, "output_length": 1, "hash_ids": [1, 2]},
            {"chat_id": 2, "timestamp": 1, "input_length": 32, "output_length": 1, "hash_ids": [7, 2]}]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = cli_here("convert", "bailian", src, "-o", tmp_path / "o.jsonl", "--block-size", "16")
    assert res.returncode == 0, res.stderr
    assert res.stderr.startswith("tierdiag: warning: 1 distinct source block id(s)") and "not prefix-chained" in res.stderr


def test_convert_is_listed_in_help():
    res = cli_here("--help", columns=200)
    assert res.returncode == 0 and "convert" in res.stdout and "kv-cache-tester" in res.stdout
