"""A second SIGINT/SIGTERM during an interrupted replay's close (issue 41, session 37 h47sig).

The close of a long interrupted run (its evidence: 18-146 s at 1M requests) used to ignore every
later signal, so `docker stop` or `timeout -k` killed it meanwhile. Now, with a writer process, a
second signal that comes once the run's rows and its `interrupted` status are committed ends the
command at once: one line, the first signal's exit code, the run kept as interrupted without its
evidence (the first reader that can write the store computes and stores it: the close's row),
no process or temporary file left, the store usable by the next replay. One that comes before that point is ignored as before: nothing
recorded is lost.

The writer process's close is held still where each case needs it (a test prelude in its entry,
as harness.on_request_flush's), so that the moment is known, not guessed from a clock.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import duckdb
import pytest

from harness import Result, cli_env, good_lines, sql, synth_and_store, tierdiag_in_process, wait_for_recorded_rows, write_trace
from test_signals import CODE, ENGINE, listed_runs
from test_writer_process import MARK, assert_no_process_left
from tierdiag.diagnose.run.evidence import record_run_evidence

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc (Linux)")

CLI = "from tierdiag.cli.main import main; main()"

# In the writer process: the interrupted run's evidence held up (after its status is committed).
AFTER_COMMIT = """
import time
from tierdiag.diagnose.run import close as _close
_real = _close.after_commit
def _held(con, db_path, run_id, status):
    if status == "interrupted":
        open({marker!r}, "w").close()
        time.sleep(120)
    return _real(con, db_path, run_id, status)
_close.after_commit = _held
"""

# In the writer process: the close held up before its status is written (its last rows
# committed), until the test has sent its signals and lets it go (`_let_go`). It was held 2 s:
# a test process descheduled that long on a loaded machine sent its later signals after the
# status commit, and the replay stopped again (exit and line of a second signal after it).
BEFORE_STATUS = """
import os, time
from tierdiag.store.writer import RunWriter as _W
_real = _W._lift_memory
def _held(self):
    open({marker!r}, "w").close()
    deadline = time.monotonic() + 300
    while not os.path.exists({marker!r} + ".go") and time.monotonic() < deadline:
        time.sleep(0.01)
    return _real(self)
_W._lift_memory = _held
"""


def _let_go(tmp_path: Path) -> None:
    """Let a close held by BEFORE_STATUS go on to write its status."""
    (tmp_path / "held.go").touch()


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    out = synth_and_store(tmp_path_factory.mktemp("second"), seed=11, long=40000)
    (out["earlier"],) = listed_runs(out["store"])
    return out


def _start(tmp_path: Path, trace: Path, db: Path, mark: str, writer_prelude: str,
           writer: str = "process") -> subprocess.Popen:
    """The CLI's replay with a writer process whose entry runs `writer_prelude` first; `writer`
    "inline": no writer process, the prelude run by the replay's own process."""
    engine_prelude = ("from tierdiag.app import writer_child as _wc\n"
                      f"_wc.ENTRY = {writer_prelude!r} + '\\n' + _wc.ENTRY\n") if writer == "process" else writer_prelude
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = cli_env(TIERDIAG_FLUSH_EVERY_S="0.5", TIERDIAG_WRITER=writer, TMPDIR=str(tmp), **{MARK: mark})
    return subprocess.Popen([sys.executable, "-c", engine_prelude + CLI, "replay", str(trace), "--db", str(db), *ENGINE],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, env=env)


def _wait_for(path: Path, proc: subprocess.Popen, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the writer's close never reached the held point"
        time.sleep(0.02)


def _first_signal(tmp_path: Path, traces, sig: int, prelude: str, writer: str = "process"):
    db = tmp_path / "r.duckdb"
    shutil.copy(traces["store"], db)
    mark = uuid.uuid4().hex
    marker = tmp_path / "held"
    proc = _start(tmp_path, traces["long"], db, mark, prelude.format(marker=str(marker)), writer)
    wait_for_recorded_rows(proc, db, runs_before=1)
    os.kill(proc.pid, sig)
    _wait_for(marker, proc)
    return db, mark, proc


def _the_run(db: Path, earlier: dict) -> dict:
    listed = listed_runs(db)
    assert listed[0] == earlier, "an earlier run changed"
    (run,) = listed[1:]
    n, distinct = sql(db, "SELECT count(*), count(DISTINCT seq) FROM requests WHERE run_id = ?", [run["run_id"]])[0]
    assert n == distinct == run["num_requests"] > 0
    return run


@pytest.mark.parametrize("first, second", [(signal.SIGINT, signal.SIGINT), (signal.SIGTERM, signal.SIGTERM),
                                           (signal.SIGTERM, signal.SIGINT)])
def test_a_second_signal_once_the_status_is_committed_ends_the_close(tmp_path, traces, first, second):
    db, mark, proc = _first_signal(tmp_path, traces, first, AFTER_COMMIT)
    # The writer is in the evidence (held for 120 s): the status is committed. The engine
    # reads the writer's "status_committed" a moment after: signals until it stops.
    deadline = time.monotonic() + 90
    while proc.poll() is None:
        assert time.monotonic() < deadline, "a second signal after the status commit did not end the replay"
        os.kill(proc.pid, second)
        try:
            proc.wait(timeout=0.3)
        except subprocess.TimeoutExpired:
            pass
    out, err = proc.communicate(timeout=30)
    _stopped_again(Result(proc.returncode, out, err), CODE[first], tmp_path, db, mark, traces)


def _stopped_again(r: Result, code: int, tmp_path: Path, db: Path, mark: str, traces) -> None:
    """What a second signal that ended the close leaves: the first signal's code, the one line,
    no process or temporary file, the run interrupted with its rows and no evidence row, the
    earlier run untouched; readers and the next replay work on the store."""
    line = r.fails(code, "interrupted, then stopped again", "as interrupted", "evidence was not stored")
    assert_no_process_left(mark)
    assert list((tmp_path / "tmp").iterdir()) == []  # no spill folder, no temporary file
    run = _the_run(db, traces["earlier"])
    assert run["status"] == "interrupted" and f"{run['num_requests']:,} request" in line
    assert sql(db, "SELECT count(*) FROM run_evidence WHERE run_id = ?", [run["run_id"]]) == [(0,)]
    # What the close would have stored for these rows (its own path, on a copy: the file and
    # DuckDB's log of the status commit).
    ref = tmp_path / "ref.duckdb"
    for suffix in ("", ".wal"):
        if Path(f"{db}{suffix}").exists():
            shutil.copy(f"{db}{suffix}", f"{ref}{suffix}")
    with duckdb.connect(str(ref)) as con:
        assert record_run_evidence(ref, run["run_id"], con=con) is None
    # Readers work on it: the first computes the evidence and stores it, the close's row byte
    # for byte (diagnose/run/backfill.py); the store takes the next replay.
    evidence = "SELECT evidence_version, evidence_json FROM run_evidence WHERE run_id = ?"
    lookup = "SELECT bucket, req_id, seq FROM request_lookup WHERE run_id = ? ORDER BY ALL"
    for command in ("summary", "slow"):
        r = tierdiag_in_process(command, "--db", db, "--run", run["run_id"])
        assert r.code == 0, r.err
        assert sql(db, evidence, [run["run_id"]]) == sql(ref, evidence, [run["run_id"]])
        assert sql(db, lookup, [run["run_id"]]) == sql(ref, lookup, [run["run_id"]])
    assert tierdiag_in_process("replay", write_trace(tmp_path / "next.jsonl", good_lines(3)), "--db", db,
                               "--model", "tiny", "--gpu", "cpu", "--device-tokens", "4096").code == 0
    assert [r["status"] for r in listed_runs(db)] == ["complete", "interrupted", "complete"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_second_signal_before_the_status_is_committed_is_ignored(tmp_path, traces, sig):
    db, mark, proc = _first_signal(tmp_path, traces, sig, BEFORE_STATUS)
    for _ in range(3):  # while the close is held before its status
        assert proc.poll() is None
        os.kill(proc.pid, sig)
        time.sleep(0.2)
    _let_go(tmp_path)
    out, err = proc.communicate(timeout=180)
    line = Result(proc.returncode, out, err).fails(CODE[sig], "interrupted; run", "as interrupted")
    assert "stopped again" not in line
    assert_no_process_left(mark)
    run = _the_run(db, traces["earlier"])
    assert run["status"] == "interrupted"
    assert sql(db, "SELECT count(*) FROM run_evidence WHERE run_id = ?", [run["run_id"]]) == [(1,)]


# The inline writer (session 38 h48kill): the evidence runs in the replay's own process, on its
# thread and on threads of its own; a second signal once the status is committed ends the
# process from the signal handler (cli/exits.py `leave_now`), unwinding nothing.

# In the replay's process: the evidence held up where its other sections' threads have started
# (the main thread about to make the size curves).
INLINE_IN_EVIDENCE = """
import time
from tierdiag.diagnose.run import evidence as _ev
_real = _ev.size_curves
def _held(con, run):
    open({marker!r}, "w").close()
    time.sleep(120)
    return _real(con, run)
_ev.size_curves = _held
"""


@pytest.mark.slow
@pytest.mark.parametrize("first, second", [(signal.SIGINT, signal.SIGINT), (signal.SIGTERM, signal.SIGTERM),
                                           (signal.SIGTERM, signal.SIGINT)])
def test_inline_a_second_signal_once_the_status_is_committed_ends_the_process(tmp_path, traces, first, second):
    """TIERDIAG_WRITER=inline: the first signal's code, the line a writer process's stop says, the
    run interrupted with its rows each once and no evidence row, the earlier run untouched, no
    process or temporary file left; readers and the next replay work on the store."""
    db, mark, proc = _first_signal(tmp_path, traces, first, INLINE_IN_EVIDENCE, "inline")
    os.kill(proc.pid, second)
    out, err = proc.communicate(timeout=60)
    _stopped_again(Result(proc.returncode, out, err), CODE[first], tmp_path, db, mark, traces)


@pytest.mark.slow
def test_inline_a_second_signal_before_the_status_is_committed_is_ignored(tmp_path, traces):
    db, mark, proc = _first_signal(tmp_path, traces, signal.SIGINT, BEFORE_STATUS, "inline")
    os.kill(proc.pid, signal.SIGINT)  # while the close is held before its status
    _let_go(tmp_path)
    out, err = proc.communicate(timeout=180)
    line = Result(proc.returncode, out, err).fails(130, "interrupted; run", "as interrupted")
    assert "stopped again" not in line
    assert_no_process_left(mark)
    run = _the_run(db, traces["earlier"])
    assert sql(db, "SELECT count(*) FROM run_evidence WHERE run_id = ?", [run["run_id"]]) == [(1,)]
