"""Bounds where input enters, and one exit code per kind of error (README's list).

Every value a trace or an option can carry fits int64 ns downstream, or is refused where it
enters (exit 3 for a trace line, 2 for an option). Output errors are exit 6 in one line naming
the path: stdout (a full disk behind `>`), the storage tier, `calibrate -o`. A closed pipe is
silent. A trace can come through a pipe. synth writes only what replay takes.
"""

from __future__ import annotations

import hashlib
import json
import subprocess

import pytest

from harness import SMALL, cli_argv, cli_env, good_lines, line, runs, sql, write_trace

from tests.support.cli import tierdiag_in_process
from tierdiag.config.engine import EngineConfig
from tierdiag.errors import OutputError, TraceError
from tierdiag.app.replay import replay
from tierdiag.trace.reader import read_trace

# The documented bounds (README): lengths up to 2**24 tokens, arrivals up to 2**62 ns.
MAX_LENGTH_TOKENS = 2**24
MAX_TIMESTAMP_MS = 2**62 // 1_000_000
CFG = EngineConfig(model="tiny", gpu="cpu", device_tokens=4096)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("b")
    db = root / "s.duckdb"
    replay(write_trace(root / "t.jsonl", good_lines(8)), CFG, db=db, run_name="s", probes=True, skip_bad=False)
    return db


@pytest.mark.parametrize(("field", "value", "fragment"), [
    ("output_length", 10**30, "'output_length'"),
    ("output_length", MAX_LENGTH_TOKENS + 1, "'output_length'"),
    ("input_length", MAX_LENGTH_TOKENS + 1, "'input_length'"),
    ("timestamp", MAX_TIMESTAMP_MS + 1, "'timestamp'"),
])
def test_out_of_bounds_trace_values_are_refused_at_their_line(tmp_path, field, value, fragment):
    fields = {"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}
    fields[field] = value
    trace = write_trace(tmp_path / "t.jsonl", [line(0, 600, [7, 8]), json.dumps(fields)])
    with pytest.raises(TraceError, match=f"t.jsonl:2: {fragment}.*too large"):
        list(read_trace(trace))


def test_the_largest_accepted_timestamp_replays_to_complete(tmp_path):
    """Before: a timestamp at the documented maximum plus the TTFT overflowed int64 at the final
    flush and lost the whole run."""
    trace = write_trace(tmp_path / "t.jsonl", [line(MAX_TIMESTAMP_MS - 5, 600, [1, 2], output_length=50),
                                              line(MAX_TIMESTAMP_MS, 600, [1, 3], output_length=50)])
    db = tmp_path / "r.duckdb"
    assert replay(trace, CFG, db=db, run_name="late", probes=True, skip_bad=False).status == "complete"
    (status, n, last_finish), = sql(db, "SELECT status, num_requests, (SELECT max(finish_ns) FROM requests) FROM runs")
    assert (status, n) == ("complete", 2) and MAX_TIMESTAMP_MS * 1_000_000 < last_finish < 2**63


@pytest.mark.parametrize("scale", ["1e10", "1e300", "1e-300"])
def test_a_time_scale_out_of_range_is_exit_2_before_any_run(tmp_path, scale):
    trace = write_trace(tmp_path / "t.jsonl", good_lines(3))
    db = tmp_path / "r.duckdb"
    tierdiag_in_process("replay", trace, "--db", db, "--time-scale", scale, *SMALL).fails(
        2, "--time-scale", "must be in [1e-09, 1e+06]")
    assert not db.exists()


def test_a_time_scale_that_pushes_an_arrival_past_int64_names_the_line_and_keeps_the_run(tmp_path):
    trace = write_trace(tmp_path / "t.jsonl", [line(0, 600, [1, 2]), line(10, 600, [1, 3]),
                                              line(MAX_TIMESTAMP_MS // 2, 600, [1, 4])])
    db = tmp_path / "r.duckdb"
    cfg = EngineConfig(model="tiny", gpu="cpu", device_tokens=4096, time_scale=4.0)
    with pytest.raises(TraceError, match="t.jsonl:3: timestamp .* times --time-scale 4") as exc:
        replay(trace, cfg, db=db, run_name="far", probes=True, skip_bad=False)
    (run,) = runs(db, process=False)
    assert run["status"] == "failed" and f"{run['num_requests']:,} request" in exc.value.one_line()


def test_an_integer_option_past_int64_is_exit_2(store):
    tierdiag_in_process("slow", "--db", store, "--top", "99999999999999999999").fails(2, "--top", "out of range")


def test_stdout_write_errors_are_exit_6_and_a_closed_pipe_is_silent(store):
    with open("/dev/full", "w") as full:
        proc = subprocess.run(cli_argv("summary", "--db", store, "--json"), stdout=full, stderr=subprocess.PIPE,
                              text=True, env=cli_env(), timeout=120)
    assert proc.returncode == 6 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("tierdiag: error: cannot write to standard output")
    proc = subprocess.Popen(cli_argv("slow", "--db", store, "--json"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=cli_env())
    proc.stdout.close()  # the reader went away before the first byte
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0 and err == b"", err


def test_a_trace_through_a_pipe_is_read_once(tmp_path):
    trace = write_trace(tmp_path / "t.jsonl", good_lines(10))
    db = tmp_path / "r.duckdb"
    cat = subprocess.Popen(["cat", str(trace)], stdout=subprocess.PIPE)
    proc = subprocess.run(cli_argv("replay", "/dev/stdin", "--db", db, *SMALL), stdin=cat.stdout,
                          capture_output=True, text=True, env=cli_env(), timeout=300)
    cat.stdout.close()
    cat.wait(timeout=60)
    assert proc.returncode == 0, proc.stderr
    (run,) = runs(db, process=False)
    assert run["status"] == "complete" and run["num_requests"] == 10
    assert run["trace_sha256"] == hashlib.sha256(trace.read_bytes()).hexdigest()


def test_synth_refuses_what_replay_would_refuse_and_replay_takes_what_synth_writes(tmp_path):
    out = tmp_path / "s.jsonl"
    tierdiag_in_process("synth", out, "--rate", "1e-300").fails(2, "--rate", "too low")
    assert not out.exists()
    # The slowest rate synth takes for 20 requests: replay accepts every timestamp it writes.
    assert tierdiag_in_process("synth", out, "--rate", "1e-5", "--requests", "20").code == 0
    assert len(list(read_trace(out))) == 20


def test_a_storage_tier_that_cannot_be_written_is_exit_6_naming_the_path(tmp_path):
    from tierdiag.engine.storage import StorageTier

    trace = write_trace(tmp_path / "t.jsonl", good_lines(6))
    blocker = tmp_path / "afile"
    blocker.write_text("not a folder")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'storage_dir = "{blocker}"\n')
    r = tierdiag_in_process("replay", trace, "--db", tmp_path / "r.duckdb", "--config", cfg, "--storage-tokens", "8192",
                            *SMALL)
    r.fails(6, "storage tier", str(blocker))
    with pytest.raises(OutputError, match=f"storage tier at {blocker}"):
        StorageTier(blocker / "below", 4)


def test_a_full_disk_under_the_storage_tier_is_an_output_error(tmp_path, monkeypatch):
    import errno
    import os

    import torch

    from tierdiag.engine.storage import StorageTier

    real_pwrite = os.pwrite

    def half_then_full(fd, data, offset):
        if len(data) > 8:  # the first half lands, then the disk is full
            return real_pwrite(fd, bytes(data[:len(data) // 2]), offset)
        raise OSError(errno.ENOSPC, "No space left on device")

    tier = StorageTier(tmp_path / "st", 4)
    monkeypatch.setattr(os, "pwrite", half_then_full)
    with pytest.raises(OutputError, match="storage tier at .*No space left"):
        tier.write(["ab" + "0" * 62], torch.zeros((1, 1, 4), dtype=torch.int64))
    # no half page is kept: the segment is cut back to the pages the index holds (none)
    assert [f.stat().st_size for f in (tmp_path / "st").iterdir()] == [0]
    assert tier.used_pages == 0 and "ab" + "0" * 62 not in tier


def test_calibrate_profile_write_failure_leaves_no_tmp_file(tmp_path):
    from tierdiag.engine.calibration import save_profile

    class Profile:
        def to_json(self):
            return {"x": 1}

    folder = tmp_path / "profile.json"
    folder.mkdir()  # -o onto a folder: refused before any temporary file is made (tierdiag/paths.py)
    with pytest.raises(OutputError, match="cannot write .*profile.json: it is a folder"):
        save_profile(Profile(), folder)
    assert [p.name for p in tmp_path.iterdir()] == ["profile.json"]


def test_report_on_a_run_with_no_finished_requests_says_so(tmp_path):
    from tierdiag.store.writer import RunWriter

    db = tmp_path / "e.duckdb"
    w = RunWriter(db, name="empty", trace_path="t.jsonl", trace_sha256="", config={}, hardware={}, data_plane={},
                  timing="modelled")
    w.finish("interrupted")
    out = tmp_path / "r.html"
    r = tierdiag_in_process("report", "--db", db, "-o", out)
    assert r.code == 0, r.err
    assert "No finished requests in this run" in out.read_text()


def test_output_folders_are_created_for_every_output(tmp_path, store):
    """One rule for every path tierdiag writes: missing parent folders are created."""
    deep = tmp_path / "a" / "b"
    assert tierdiag_in_process("report", "--db", store, "-o", deep / "r.html").code == 0
    assert tierdiag_in_process("export", deep / "pq", "--db", store).code == 0
    assert tierdiag_in_process("synth", deep / "more" / "s.jsonl", "--requests", "3").code == 0
    assert (deep / "r.html").is_file() and (deep / "pq").is_dir() and (deep / "more" / "s.jsonl").is_file()
