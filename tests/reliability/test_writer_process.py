"""The writer process under faults: kill -9 of either side, signals to the whole process group at
any moment (the writer's start-up and the close included), and never an orphan left behind.

Each replay runs in a session of its own (so a signal to its group is what a terminal's Ctrl-C
is) and carries a marker in its environment, which its writer process inherits: the processes
holding the marker are exactly this replay's, whatever else runs on the machine.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from harness import (SMALL, WATCHED_FLUSH_EVERY_S, Result, cli_argv, cli_env, good_lines, runs, sql,
                     synth_and_store, tierdiag_in_process, wait_for_recorded_rows, write_trace)
from test_signals import CODE, ENGINE, check_outcome, handlers_installed, listed_runs

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc (Linux)")

MARK = "TIERDIAG_TEST_MARK"


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    # "long" is only ever killed part-way, once rows show: long enough that its writer is still
    # there then. Its length was not what made that fail (6,000, then 20,000 requests once
    # were "replayed and closed by then"): with the writer committing back to back
    # (TIERDIAG_FLUSH_EVERY_S=0), a test's reader first got in at the close, whatever the length
    # (harness.WATCHED_FLUSH_EVERY_S).
    out = synth_and_store(tmp_path_factory.mktemp("wp"), seed=7, long=40000)
    (out["earlier"],) = listed_runs(out["store"])
    return out


def marked(mark: str) -> list[int]:
    """Live (not zombie) processes whose environment holds the marker."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if f"{MARK}={mark}".encode() not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            found.append(int(entry.name))
    return found


def writer_of(proc: subprocess.Popen, mark: str, timeout_s: float = 60) -> int:
    """The replay's writer process: the marked process running the writer's entry point. Not
    "any other marked process": a child the CLI forks for a moment (once, platform's `uname -p`)
    holds the marker too, and with pids wrapping at 32,768 it can list before the writer."""
    from tierdiag.app.writer_child import ENTRY as CHILD_ENTRY

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for pid in marked(mark):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if pid != proc.pid and CHILD_ENTRY.encode() in argv:
                return pid
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    raise AssertionError("no writer process appeared")


def assert_no_process_left(mark: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while marked(mark):
        assert time.monotonic() < deadline, f"processes left behind: {marked(mark)}"
        time.sleep(0.05)


def start(trace: Path, db: Path, mark: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen(cli_argv("replay", trace, "--db", db, *ENGINE), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=cli_env(TIERDIAG_FLUSH_EVERY_S=WATCHED_FLUSH_EVERY_S, TIERDIAG_WRITER="process",
                                       **{MARK: mark}, **env))


def test_kill_9_of_the_replay_the_writer_commits_what_it_had_and_exits(tmp_path, traces):
    db = tmp_path / "r.duckdb"
    mark = uuid.uuid4().hex
    proc = start(traces["long"], db, mark)
    writer = writer_of(proc, mark)
    seen = wait_for_recorded_rows(proc, db, runs_before=0)
    proc.kill()
    proc.wait(timeout=60)
    assert_no_process_left(mark)  # the writer saw its pipe end, committed, and left
    assert not Path(f"/proc/{writer}/environ").exists() or writer not in marked(mark)
    (run,) = runs(db)  # a reader's process, as a user would look after the crash
    # The runs row records the replay's pid, which is gone: readers show the run as interrupted.
    assert run["status"] == "interrupted"
    assert sql(db, "SELECT pid FROM runs") == [(proc.pid,)]
    n = sql(db, "SELECT count(*), count(DISTINCT seq) FROM requests")[0]
    assert n[0] == n[1] == run["num_requests"] >= seen
    assert tierdiag_in_process("replay", write_trace(tmp_path / "next.jsonl", good_lines(3)), "--db", db,
                               *SMALL).code == 0


def test_kill_9_of_the_writer_is_one_line_exit_4_and_the_run_is_closed_as_failed(tmp_path, traces):
    db = tmp_path / "r.duckdb"
    mark = uuid.uuid4().hex
    proc = start(traces["long"], db, mark)
    writer = writer_of(proc, mark)
    wait_for_recorded_rows(proc, db, runs_before=0)
    os.kill(writer, signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    line = Result(proc.returncode, out, err).fails(4, "writer process", f"pid {writer}", "SIGKILL", "as failed")
    assert_no_process_left(mark)
    (run,) = runs(db, process=False)
    n = sql(db, "SELECT count(*), count(DISTINCT seq) FROM requests")[0]
    assert run["status"] == "failed" and n[0] == n[1] == run["num_requests"] > 0
    assert f"{n[0]:,} request" in line and "writer process" in run["error"]


def test_the_writer_ignores_signals_sent_to_it(tmp_path, traces):
    """A SIGINT or SIGTERM that reaches the writer alone (not through the group) does nothing:
    only the replay's process decides how a run ends."""
    db = tmp_path / "r.duckdb"
    mark = uuid.uuid4().hex
    proc = start(traces["short"], db, mark)
    writer = writer_of(proc, mark)
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            os.kill(writer, sig)
        except ProcessLookupError:
            break  # the replay was done already
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert runs(db, process=False)[0]["status"] == "complete"
    assert_no_process_left(mark)


@pytest.mark.slow
def test_signals_to_the_process_group_at_any_moment(tmp_path, traces):
    """Ctrl-C and SIGTERM to the whole group, from the CLI's first moments (the writer starting)
    to the close: 130/143 with one line, the run interrupted (or complete) with each row once,
    earlier runs untouched, and no process left behind."""
    import shutil

    rnd = random.Random(41)
    outcomes = []
    for i in range(6):
        sig = (signal.SIGINT, signal.SIGTERM)[i % 2]
        db = tmp_path / f"g{i}.duckdb"
        shutil.copy(traces["store"], db)
        mark = uuid.uuid4().hex
        proc = start(traces["short"], db, mark)
        deadline = time.monotonic() + 60
        while proc.poll() is None and not handlers_installed(proc.pid):
            assert time.monotonic() < deadline
            time.sleep(0.002)
        time.sleep(rnd.uniform(0.0, 2.0) ** 2 / 2)  # most early (start-up), some in the close
        if proc.poll() is None:
            os.killpg(proc.pid, sig)
        out, err = proc.communicate(timeout=120)
        outcomes.append(check_outcome(Result(proc.returncode, out, err), db, sig, traces["earlier"]))
        assert_no_process_left(mark)
    assert "interrupted" in outcomes or "none" in outcomes, outcomes


def test_a_replay_stopped_before_its_writer_opened_the_store_leaves_no_process(tmp_path, traces):
    """Stopped while the writer process starts (before the store is created): nothing recorded,
    the file never made, the writer gone."""
    mark = uuid.uuid4().hex
    db = tmp_path / "never.duckdb"
    proc = start(traces["short"], db, mark)
    writer_of(proc, mark)
    os.killpg(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    r = Result(proc.returncode, out, err)
    if r.code != 0:
        r.fails(CODE[signal.SIGTERM], "interrupted")
    assert_no_process_left(mark)
    if db.exists() and db.stat().st_size:
        assert all(run["status"] in ("interrupted", "complete") for run in listed_runs(db))


_DIES_MID_WRITE = r"""
import os, sys
from tierdiag.store.writer import RunWriter

def batch(f, n=3000):
    seq = list(range(f * n, (f + 1) * n))
    return {"requests": {"req_id": [f"r{i}" for i in seq], "seq": seq, "status": ["finished"] * n},
            "batches": {"batch_id": seq}, "evictions": {"eviction_id": seq, "tokens": seq}}

w = RunWriter(sys.argv[1], name="k", trace_path="t.jsonl", trace_sha256="", config={}, hardware={},
              data_plane={}, timing="modelled", command_line=["t"], run_id=sys.argv[2], let_rows_go=True)
w.append(batch(0))
plain = RunWriter._append
inserted = []

def append(con, table, cols):
    plain(con, table, cols)
    inserted.append(table)
    if len(inserted) == 2:  # two tables' pieces inserted and let go, the third not: the process dies
        sys.stdout.write(" ".join(inserted) + "\n")
        sys.stdout.flush()
        os._exit(9)

RunWriter._append = staticmethod(append)
w.take(batch(1))
w.take(batch(2))
w.write()
"""


def test_a_writer_killed_part_way_through_a_write_that_let_rows_go_leaves_the_earlier_writes(tmp_path):
    """The writer process's writes let each piece go once inserted (store/writer.py let_rows_go,
    issue 41): a writer that dies after some of a write's pieces were inserted and let go, before
    its commit, leaves the store as the earlier writes left it, every table at the same hand-over
    (nothing of the uncommitted write, nothing twice), and the run closes from outside with the
    request rows committed, as a kill -9 of the writer's process does."""
    from tierdiag.store.writer import close_run_row

    db = tmp_path / "k.duckdb"
    proc = subprocess.run([sys.executable, "-c", _DIES_MID_WRITE, str(db), "run-k"], capture_output=True, text=True,
                          env=cli_env(), timeout=120)
    assert proc.returncode == 9, proc.stderr
    assert proc.stdout.split() == ["requests", "batches"]  # died inside the second write
    assert sql(db, "SELECT status, num_requests FROM runs") == [("running", 0)]
    counts = sql(db, "SELECT (SELECT count(*) FROM requests), (SELECT count(DISTINCT seq) FROM requests), "
                     "(SELECT max(seq) FROM requests), (SELECT count(*) FROM batches), (SELECT count(*) FROM evictions)")
    assert counts == [(3000, 3000, 2999, 3000, 3000)]
    assert close_run_row(db, "run-k", "failed", "writer died") == 3000
    assert sql(db, "SELECT status, num_requests, error FROM runs") == [("failed", 3000, "writer died")]
