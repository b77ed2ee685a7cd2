"""Faults during a replay: Ctrl-C, SIGTERM, kill -9, readers at the same time, a full disk.

What must hold: what was recorded before the fault stays in the file and is readable; earlier
runs are untouched; a run is never shown as complete unless it is; Ctrl-C exits 130.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from harness import (ROOMY, SHARED_TRACES, SMALL, WATCHED_FLUSH_EVERY_S, WRITERS, Result, cli_argv, cli_env,
                     good_lines, holder, runs, sql, tierdiag, wait_for_recorded_rows, write_trace)
from tests.support.cli import tierdiag_in_process
from tierdiag.store.writer import RunWriter

# Flush twice a second, so that rows reach the file long before the end, with room for readers
# between the writes (harness.WATCHED_FLUSH_EVERY_S).
FLUSH_OFTEN = cli_env(TIERDIAG_FLUSH_EVERY_S=WATCHED_FLUSH_EVERY_S)


@pytest.fixture(scope="module")
def big_trace(tmp_path_factory) -> Path:
    """Long enough that no replay here gets to its end before it is stopped."""
    trace = tmp_path_factory.mktemp("big") / "big.jsonl"
    r = tierdiag_in_process("synth", trace, "--requests", "30000", "--seed", "11")
    assert r.code == 0, r.err
    return trace


def small_complete_run(tmp_path: Path, db: Path) -> dict:
    trace = write_trace(tmp_path / "small.jsonl", good_lines(12))
    assert tierdiag_in_process("replay", trace, "--db", db, *SMALL).code == 0
    (run,) = runs(db, process=False)
    assert run["status"] == "complete" and run["num_requests"] == 12
    return run


def start_replay(trace: Path, db: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(cli_argv("replay", trace, "--db", db, *extra), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=FLUSH_OFTEN)


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 128 + signal.SIGTERM)],
                         ids=["ctrl-c", "sigterm"])
def test_interrupt_keeps_what_was_recorded(tmp_path, big_trace, sig, code):
    db = tmp_path / "r.duckdb"
    earlier = small_complete_run(tmp_path, db)
    proc = start_replay(big_trace, db, *ROOMY)
    seen = wait_for_recorded_rows(proc, db, runs_before=1)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    line = Result(proc.returncode, "", err).fails(code, "interrupted", "as interrupted", str(db))
    first, second = runs(db, process=False)
    assert first == earlier
    recorded = sql(db, "SELECT count(*) FROM requests WHERE run_id = ?", [second["run_id"]])[0][0]
    assert second["status"] == "interrupted"
    assert second["num_requests"] == recorded >= seen
    assert f"run {second['run_id']}" in line and f"{recorded:,} request" in line
    # Readable by the diagnose views too.
    assert tierdiag_in_process("summary", "--db", db, "--json").json()["num_requests"] == recorded


def test_kill_9_leaves_a_readable_file_and_earlier_runs_intact(tmp_path, big_trace):
    db = tmp_path / "r.duckdb"
    earlier = small_complete_run(tmp_path, db)
    earlier_rows = sql(db, "SELECT * FROM requests ORDER BY seq")
    proc = start_replay(big_trace, db, *ROOMY)
    wait_for_recorded_rows(proc, db, runs_before=1)
    proc.kill()
    proc.wait(timeout=60)
    first, dead = runs(db)  # a reader's process, as a user would look after the crash
    assert first == earlier
    assert sql(db, "SELECT * FROM requests WHERE run_id = ? ORDER BY seq", [first["run_id"]]) == earlier_rows
    # The dead run is not shown as complete: its process is gone, so it reads interrupted.
    assert dead["status"] == "interrupted"
    assert dead["num_requests"] == sql(db, "SELECT count(*) FROM requests WHERE run_id = ?", [dead["run_id"]])[0][0]
    assert dead["num_requests"] > 0
    assert tierdiag_in_process("summary", "--db", db, "--run", first["run_id"], "--json").json()["num_requests"] == 12
    # And the file takes the next replay as usual.
    trace = write_trace(tmp_path / "next.jsonl", good_lines(3))
    assert tierdiag_in_process("replay", trace, "--db", db, *SMALL).code == 0
    assert [r["status"] for r in runs(db, process=False)] == ["complete", "interrupted", "complete"]


@pytest.mark.shared
def test_readers_during_a_conversation_replay_succeed_or_say_busy(tmp_path):
    trace = SHARED_TRACES / "conversation_trace.jsonl"
    if not trace.is_file():
        pytest.skip("needs ../shared/traces/conversation_trace.jsonl")
    db = tmp_path / "conv.duckdb"
    proc = start_replay(trace, db)  # the default engine: llama3-8b on h200
    wait_for_recorded_rows(proc, db, runs_before=0)
    outcomes = []
    # The first round a reader's process each, as a user beside the replay; then the same readers
    # in this process (itself a process beside the replay's, taking the file's lock the same way).
    for i, args in enumerate([("runs",), ("summary",), ("slow", "--top", "3")] * 3):
        if proc.poll() is not None:
            break
        r = (tierdiag if i < 3 else tierdiag_in_process)(*args, "--db", db, "--json")
        if r.code == 0:
            outcomes.append("ok")
            assert r.json() is not None
        else:
            r.fails(4, str(db), "is busy")
            outcomes.append("busy")
    assert "ok" in outcomes, outcomes
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    (run,) = runs(db, process=False)
    # Stopped early (130, interrupted); or the Ctrl-C came once the final status was written, in
    # the close's last moments (130, complete: the line says the run was kept as complete, as
    # test_signals.check_outcome has it); or it had just finished (0, complete): never 'running'.
    assert (proc.returncode, run["status"]) in ((130, "interrupted"), (130, "complete"), (0, "complete")), err
    if proc.returncode == 130:
        assert "interrupted" in err and "Traceback" not in err, err


# --- in-process: the writer under a busy file and a full disk -----------------------------------

def _writer(db: Path) -> RunWriter:
    return RunWriter(db, name="w", trace_path="t.jsonl", trace_sha256="00" * 32, config={}, hardware={},
                     data_plane={}, timing="modelled")


def _requests(first: int, n: int) -> dict:
    return {"requests": {"req_id": [str(i) for i in range(first, first + n)], "seq": list(range(first, first + n)),
                         "status": ["finished"] * n}}


def test_a_flush_that_finds_the_file_busy_keeps_its_rows(tmp_path):
    db = tmp_path / "w.duckdb"
    w = _writer(db)
    with holder(db, read_only=True):
        w.append(_requests(0, 5))  # returns after a short wait: a reader holds the file
    assert sql(db, "SELECT count(*) FROM requests") == [(0,)]
    w.append(_requests(5, 3))
    assert sql(db, "SELECT req_id FROM requests ORDER BY seq") == [(str(i),) for i in range(8)]
    with holder(db, read_only=True):
        w.append(_requests(8, 2))
    w.finish("complete", num_requests=10)
    assert sql(db, "SELECT count(*) FROM requests") == [(10,)]
    assert runs(db, process=False)[0]["status"] == "complete"

# A full disk mid-run and at the end: test_store_recovery.py (the counts it reports, too).


# --- in-process: a signal after the run was closed ----------------------------------------------

@pytest.mark.parametrize("writer", WRITERS)
def test_a_signal_after_the_close_says_the_run_was_kept_complete(tmp_path, monkeypatch, writer):
    """A Ctrl-C that lands once the run is closed (here: while the closing numbers are computed)
    is still the replay's interrupt, saying what was kept (the run, complete, every row), not an
    interrupt of unknown state (the CLI's bare 'interrupted')."""
    import os

    from tierdiag import signals
    from tierdiag.app import replay as app_replay
    from tierdiag.config.engine import EngineConfig

    trace = write_trace(tmp_path / "t.jsonl", good_lines(40))
    db = tmp_path / "r.duckdb"
    monkeypatch.setenv("TIERDIAG_WRITER", writer)
    real = app_replay._percentile

    def percentile_then_ctrl_c(values, q):
        os.kill(os.getpid(), signal.SIGINT)  # handled at the next bytecode: inside this call
        return real(values, q)

    monkeypatch.setattr(app_replay, "_percentile", percentile_then_ctrl_c)
    previous = {s: signal.getsignal(s) for s in signals.HANDLED}
    signals.install()
    try:
        with pytest.raises(app_replay.ReplayInterrupted) as exc:
            app_replay.replay(trace, EngineConfig(model="tiny", gpu="cpu", device_tokens=4096), db=db,
                              run_name="x", probes=True, skip_bad=False)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        signals.reset()
    (run,) = runs(db, process=False)
    assert run["status"] == "complete" and run["num_requests"] == 40
    assert (exc.value.run_id, exc.value.db_path, exc.value.status) == (run["run_id"], str(db), "complete")
    assert exc.value.num_requests == 40 and exc.value.write_problem is None
