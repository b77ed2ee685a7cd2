"""The writer process killed (SIGKILL) in each window of a run (issue 41, session 38 h48kill).

Session 37's signal matrix once left a store "with no runs" after a kill of the writer: it had
made the file and not yet the run's row. Each window is held still here (a prelude in the
writer's entry writes a marker and sleeps where the window is), so the kill lands in it every
time, not by a clock:

- a: before the writer creates (or opens) the file
- a1: the marker of a store being made left beside the path (store/creating.py), the file not made
- a2: the file made (DuckDB's header), before the schema is committed
- b: the schema committed, before the run's row
- c: after the run's row and a write of rows
- d1: in the close, its last rows committed, before the status
- d2: in the close, the status committed, while the evidence is computed
- d3 (CLI only): after the writer answered the close, while it checkpoints the file

What must hold (docs/contract.md section 7): nothing already recorded is lost (a store that was
there keeps its runs; a run the writer had closed stays as it closed it, complete or interrupted,
with every row); a file this command made and put no run in is removed, and the line says so;
a run still `running` is closed as failed with the rows committed, each once.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from harness import Result, cli_env, sql, synth_and_store
from test_signals import CODE, ENGINE, listed_runs
from test_writer_process import MARK, assert_no_process_left

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc (Linux)")

# In the writer process: `_hold()` says where it is (the marker) and waits to be killed.
HOLD = """
import time
def _hold():
    open({marker!r}, "w").close()
    time.sleep(600)
"""

# A RunWriter method held before it runs.
_HELD_BEFORE = """
from tierdiag.store import writer as _w
_real = _w.RunWriter.{method}
def _held(self, *a, **k):
    _hold()
    return _real(self, *a, **k)
_w.RunWriter.{method} = _held
"""

# Where each window holds the writer (in its own process, before its entry runs).
WINDOWS = {
    "a": _HELD_BEFORE.format(method="__init__"),
    "a1": _HELD_BEFORE.format(method="_connect"),
    "a2": """
from tierdiag.store import writer as _w
_real = _w.init_store
def _held(con, **k):
    _hold()
    return _real(con, **k)
_w.init_store = _held
""",
    "b": """
from tierdiag.store import writer as _w
_real = _w.RunWriter._append
def _held(con, table, cols):
    if table == "runs":
        _hold()
    return _real(con, table, cols)
_w.RunWriter._append = staticmethod(_held)
""",
    "c": """
from tierdiag.store import writer_serve as _s
_real = _s._Serve.write
def _held(self):
    _real(self)
    if self.writer.recorded:
        _hold()
_s._Serve.write = _held
""",
    "d1": _HELD_BEFORE.format(method="_lift_memory"),
    "d2": "",  # the close hook holds (`_after` below; the replay's: diagnose.run.close.after_commit)
    "d3": _HELD_BEFORE.format(method="let_go"),
    # the evidence stored, as the writer is about to answer the close (test_writer_died_late.py)
    "d2b": """
from tierdiag.store import writer_serve as _s
_real_reply = _s._Serve.reply
def _held_reply(self, msg):
    if msg[0] == "finished":
        _hold()
    return _real_reply(self, msg)
_s._Serve.reply = _held_reply
""",
}

# The store writer's own loop (no replay's evidence), its close hook held in window d2.
STORE_ENTRY = """
def _after(con, db_path, run_id, status):
    if {window!r} == "d2":
        _hold()
    return None
from tierdiag.store.writer_serve import main
main(after_commit=_after)
"""

# The replay's close hook held (the CLI's writer, app/writer_child.py).
REPLAY_D2 = """
from tierdiag.diagnose.run import close as _close
_real_after = _close.after_commit
def _held_after(*a):
    _hold()
    return _real_after(*a)
_close.after_commit = _held_after
"""

BEFORE_RUN = ("a", "a1", "a2", "b")  # no run's row committed: nothing recorded
N = 3000  # request rows a batch


def _batch(f: int, n: int = N) -> dict:
    seq = list(range(f * n, (f + 1) * n))
    return {"requests": {"req_id": [f"r{i}" for i in seq], "seq": seq, "status": ["finished"] * n}}


def _run(run_id: str) -> dict:
    return dict(name="k", trace_path="t.jsonl", trace_sha256="", config={}, hardware={}, data_plane={},
                timing="modelled", command_line=["t"], run_id=run_id)


def _killer(marker: Path, pid: int, done: threading.Event) -> threading.Thread:
    """SIGKILL `pid` once the writer is held (the marker made); gives up when `done` is set."""
    def kill() -> None:
        while not done.is_set():
            if marker.exists():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                return
            time.sleep(0.005)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


@pytest.fixture(scope="module")
def earlier(tmp_path_factory):
    """A store with one complete run (copied for each case: the run that must stay untouched)."""
    out = synth_and_store(tmp_path_factory.mktemp("killed"), seed=5, long=20000)
    (out["earlier"],) = listed_runs(out["store"])
    return out


def _kill_in(root: Path, window: str, before: str, status: str, earlier_store: Path):
    """A writer process held in `window` and killed there, driven as the replay drives it
    (app/replay_writers.WriterInProcess: open, hand rows over, close with `status`); `before`:
    what was at the store's path ("none", "empty": a 0-byte file, "store": a run in it).
    Returns (the store's path, the close's problem, the run's id, the writer's pid)."""
    from tierdiag.app.replay_writers import WriterInProcess
    from tierdiag.store.writer_process import WriterProcess, new_run_id

    root.mkdir(parents=True)
    db = root / "r.duckdb"
    if before == "store":
        shutil.copy(earlier_store, db)
    elif before == "empty":
        db.touch()
    marker = root / "held"
    entry = HOLD.format(marker=str(marker)) + WINDOWS[window] + STORE_ENTRY.format(window=window)
    rec = WriterInProcess()
    rec.process = WriterProcess.start(entry=entry)
    done = threading.Event()
    killer = _killer(marker, rec.process.pid, done)
    run_id = new_run_id()
    pid = rec.process.pid
    try:
        rec.open(db, _run(run_id), flush_every_s=0.5)
        try:
            rec.writer.append(_batch(0))
            if window == "c":  # the first write (FIRST_WRITE_S after the open) commits it, then holds
                killer.join(60)
        except Exception as exc:  # noqa: BLE001 - the writer died before: the replay closes as failed
            assert type(exc).__name__ == "StoreError", exc
            status = "failed"
        problem = rec.close(status, None)
    finally:
        done.set()
        killer.join(60)
        rec.process.close()
    assert marker.exists(), f"the writer never reached window {window}"
    return db, problem, run_id, pid


def _check(db: Path, problem, run_id: str, window: str, before: str, status: str, pid: int, earlier: dict) -> None:
    assert problem is not None and type(problem).__name__ == "StoreError", problem
    line = problem.one_line()
    assert "\n" not in line and f"pid {pid}" in line and "SIGKILL" in line, line
    assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    from tierdiag.store.creating import marker

    assert not marker(db).exists(), "the marker of a store being made left behind"  # store/creating.py
    if before == "store":
        assert db.exists()
        assert listed_runs(db)[0] == earlier, "an earlier run changed"
    if window in BEFORE_RUN:
        assert "nothing was recorded" in line, line
        if before == "store":
            assert [r["run_id"] for r in listed_runs(db)] == [earlier["run_id"]]
        else:  # made by this command, with no run in it: removed, and said
            assert not db.exists() and not Path(str(db) + ".wal").exists(), line
            assert "was removed" in line, line
        return
    got = sql(db, "SELECT status, num_requests, error FROM runs WHERE run_id = ?", [run_id])
    n, distinct = sql(db, "SELECT count(*), count(DISTINCT seq) FROM requests WHERE run_id = ?", [run_id])[0]
    assert got and n == distinct == got[0][1] == N, (got, n, distinct)
    if window == "d2" and status != "failed":
        # The writer had closed it: kept as it closed it, every row, no error written over it.
        assert got[0][0] == status and got[0][2] is None, got
        assert "after it had closed the run" in line and "before its evidence was stored" in line, line
    else:
        assert got[0][0] == "failed" and "writer process" in got[0][2], got
        assert "before the run was closed" in line, line


@pytest.mark.parametrize("window", ["a", "a1", "b", "c", "d2"])
def test_the_writer_killed_in_a_window_of_a_new_store(tmp_path, earlier, window):
    """One of each kind, quick: the file removed (a, b), the run failed with its rows (c), the
    run kept as the writer closed it (d2)."""
    db, problem, run_id, pid = _kill_in(tmp_path / "k", window, "none", "complete", earlier["store"])
    _check(db, problem, run_id, window, "none", "complete", pid, earlier["earlier"])


@pytest.mark.slow
@settings(max_examples=24, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(window=st.sampled_from(["a", "a1", "a2", "b", "c", "d1", "d2"]), before=st.sampled_from(["none", "empty", "store"]),
       status=st.sampled_from(["complete", "interrupted"]))
def test_the_writer_killed_in_any_window(tmp_path, earlier, window, before, status):
    """Every window x what was at the path x the close's status (Hypothesis draws): the rules
    above, each time; no writer process left."""
    db, problem, run_id, pid = _kill_in(tmp_path / uuid.uuid4().hex, window, before, status, earlier["store"])
    _check(db, problem, run_id, window, before, status, pid, earlier["earlier"])


# ----------------------------------------------------------------------------- the CLI, signals


def _cli(tmp_path: Path, trace: Path, db: Path, mark: str, window: str,
         engine: tuple[str, ...] = ENGINE) -> tuple[subprocess.Popen, Path]:
    marker = tmp_path / "held"
    prelude = HOLD.format(marker=str(marker)) + (REPLAY_D2 if window == "d2" else WINDOWS[window])
    engine_prelude = ("from tierdiag.app import writer_child as _wc\n"
                      f"_wc.ENTRY = {prelude!r} + '\\n' + _wc.ENTRY\n")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = cli_env(TIERDIAG_FLUSH_EVERY_S="0.5", TIERDIAG_WRITER="process", TMPDIR=str(tmp), **{MARK: mark})
    proc = subprocess.Popen([sys.executable, "-c", engine_prelude + "from tierdiag.cli.main import main; main()",
                             "replay", str(trace), "--db", str(db), *engine],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, env=env)
    return proc, marker


def _writer_pid(proc: subprocess.Popen, marker: Path, mark: str) -> int:
    from test_writer_process import marked

    deadline = time.monotonic() + 180
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the writer never reached its window"
        time.sleep(0.02)
    for pid in marked(mark):  # the entry is the prelude's and the writer's: `writer_of` matches the bare one
        with contextlib.suppress(OSError):
            if pid != proc.pid and b"writer_child" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
    raise AssertionError("no writer process")


@pytest.mark.slow
@pytest.mark.parametrize("window", ["b", "d2", "d3"])
def test_the_cli_with_its_writer_killed(tmp_path, earlier, window):
    """The CLI (`TIERDIAG_WRITER=process`), the writer killed in window b (the store session 37
    saw left "with no runs"), d2 (the run closed as complete, its evidence not stored) and d3
    (everything answered: the replay's result stands, the file's log replayed by the next open)."""
    db = tmp_path / "r.duckdb"
    mark = uuid.uuid4().hex
    proc, marker = _cli(tmp_path, earlier["short"], db, mark, window)
    os.kill(_writer_pid(proc, marker, mark), signal.SIGKILL)
    out, err = proc.communicate(timeout=180)
    r = Result(proc.returncode, out, err)
    assert_no_process_left(mark)
    assert not any((tmp_path / "tmp").iterdir())
    if window == "b":
        line = r.fails(4, "writer process", "SIGKILL", "nothing was recorded", "was removed")
        assert not db.exists() and str(db) in line
        return
    if window == "d2":
        r.fails(4, "after it had closed the run", "before its evidence was stored", "as complete")
    else:
        assert r.code == 0, r.err
    (run,) = listed_runs(db)
    n, distinct = sql(db, "SELECT count(*), count(DISTINCT seq) FROM requests")[0]
    assert run["status"] == "complete" and n == distinct == run["num_requests"] > 0


def _again_until_it_ends(proc: subprocess.Popen, sig: int, timeout_s: float = 90) -> None:
    """`sig` to the replay every 0.3 s until it exits. The writer held in window d2 has sent
    "status_committed" before its hold; a signal the engine takes before it has read that
    answer is one before the status commit, ignored by design (test_second_signal): sent once,
    that left the replay waiting on the held writer when the engine was descheduled a moment
    (load 20: the suite's one failure, a timeout; an engine stalled 3 s at the hold repeats it)."""
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None:
        assert time.monotonic() < deadline, "a second signal after the status commit did not end the replay"
        os.kill(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0.3)


@pytest.mark.slow
@pytest.mark.parametrize("sig, again", [(signal.SIGINT, None), (signal.SIGTERM, signal.SIGINT)])
def test_an_interrupted_close_whose_writer_is_killed_keeps_the_run_interrupted(tmp_path, earlier, sig, again):
    """A signal, then the writer killed while it computes the interrupted run's evidence (its
    status committed), with or without a second signal first (which ends the wait, h47sig): the
    first signal's exit code, one line saying where the run is, the run `interrupted` with its
    rows each once (never written over as failed), the earlier run untouched."""
    from harness import wait_for_recorded_rows

    db = tmp_path / "r.duckdb"
    shutil.copy(earlier["store"], db)
    mark = uuid.uuid4().hex
    proc, marker = _cli(tmp_path, earlier["long"], db, mark, "d2")
    wait_for_recorded_rows(proc, db, runs_before=1)
    os.kill(proc.pid, sig)
    writer = _writer_pid(proc, marker, mark)
    if again is None:
        os.kill(writer, signal.SIGKILL)
    else:
        _again_until_it_ends(proc, again)  # the engine stops the close (STOP, then reaps the writer)
    out, err = proc.communicate(timeout=180)
    line = Result(proc.returncode, out, err).fails(CODE[sig], "interrupted", "as interrupted")
    assert_no_process_left(mark)
    if again is None:
        assert "after it had closed the run" in line, line
    listed = listed_runs(db)
    assert listed[0] == earlier["earlier"]
    (run,) = listed[1:]
    n, distinct = sql(db, "SELECT count(*), count(DISTINCT seq) FROM requests WHERE run_id = ?", [run["run_id"]])[0]
    assert run["status"] == "interrupted" and n == distinct == run["num_requests"] > 0


# ----------------------------------------------------------------------------- remove_runless_store


def _made(path: Path, what: str) -> None:
    import duckdb

    from tierdiag.store.writer import init_store

    if what == "empty":
        path.touch()
        return
    if what == "header":  # DuckDB's header only: a creation killed before the schema
        duckdb.connect(str(path)).close()
        return
    if what == "schema-in-log":  # the schema committed to DuckDB's log, the process gone
        code = (f"import duckdb, os\nfrom tierdiag.store.writer import init_store\n"
                f"c = duckdb.connect({str(path)!r}); c.execute('SET checkpoint_threshold = \\'1GB\\''); init_store(c)\n"
                f"os._exit(0)\n")
        subprocess.run([sys.executable, "-c", code], check=True, env=cli_env(), timeout=120)
        assert Path(str(path) + ".wal").exists()
        return
    with duckdb.connect(str(path)) as con:
        init_store(con)
        if what == "run":
            con.execute("INSERT INTO runs (run_id, status) VALUES ('r', 'running')")


@pytest.mark.parametrize("what", ["empty", "header", "schema", "schema-in-log", "run"])
def test_remove_runless_store_removes_a_file_with_no_run_only(tmp_path, what):
    from tierdiag.store.writer import remove_runless_store

    path = tmp_path / "s.duckdb"
    _made(path, what)
    got = remove_runless_store(path)
    if what == "run":
        assert got is None and path.exists()
        assert sql(path, "SELECT run_id FROM runs") == [("r",)]
    else:
        assert got is True and not path.exists() and not Path(str(path) + ".wal").exists()
    assert remove_runless_store(tmp_path / "never.duckdb") is True


def test_remove_runless_store_leaves_a_file_another_process_holds(tmp_path):
    from harness import holder
    from tierdiag.store.writer import remove_runless_store

    path = tmp_path / "s.duckdb"
    _made(path, "schema")
    with holder(path, read_only=False):
        assert remove_runless_store(path) is False
    assert path.exists()
    (tmp_path / "t.txt").write_text("not a store\n")
    assert remove_runless_store(tmp_path / "t.txt") is False and (tmp_path / "t.txt").exists()


@pytest.mark.parametrize("table", ["meta", "runs"])
def test_a_store_a_writer_made_and_could_not_put_its_run_in_is_removed(tmp_path, monkeypatch, table):
    """RunWriter (inline, and the writer process's open): the schema's transaction or the runs
    row failing on a full disk leaves no file it made; a store that was there is left as it was."""
    import duckdb

    from tierdiag.errors import OutputError
    from tierdiag.store import writer as writer_module
    from tierdiag.store.writer import RunWriter

    if table == "meta":
        real_init = writer_module.init_store

        def full(con, **kwargs):
            real_init(con, **kwargs)  # committed, then the disk is full
            raise duckdb.IOException('Could not write file "r.duckdb.wal": No space left on device')

        monkeypatch.setattr(writer_module, "init_store", full)
    else:
        real_append = RunWriter._append

        def full_at_runs(con, name, cols):
            if name == "runs":
                raise duckdb.IOException('Could not write file "r.duckdb.wal": No space left on device')
            return real_append(con, name, cols)

        monkeypatch.setattr(RunWriter, "_append", staticmethod(full_at_runs))
    db = tmp_path / "r.duckdb"
    with pytest.raises(OutputError, match="no space left"):
        RunWriter(db, **_run("run-x"))
    assert not db.exists() and not Path(str(db) + ".wal").exists()
    monkeypatch.undo()
    RunWriter(db, **_run("run-y")).finish("complete")
    if table == "runs":  # the disk full again, at the next run's row: the store kept as it was
        monkeypatch.setattr(RunWriter, "_append", staticmethod(full_at_runs))
        with pytest.raises(OutputError):
            RunWriter(db, **_run("run-z"))
    assert sql(db, "SELECT run_id, status FROM runs") == [("run-y", "complete")]


@pytest.mark.slow
def test_a_run_never_recorded_leaves_no_storage_pages(tmp_path, earlier):
    """With a storage tier, the writer killed in window b: the engine had begun writing the run's
    page files; no run owns them, so its folder goes with the store file (the storage root too,
    where nothing else is in it; another run's folder there is kept)."""
    db = tmp_path / "r.duckdb"
    other = tmp_path / "r.storage" / "other-run"
    other.mkdir(parents=True)
    (other / "000001.kvseg").write_bytes(b"kept")
    mark = uuid.uuid4().hex
    engine = ("--model", "tiny", "--gpu", "cpu", "--device-tokens", "100000", "--host-tokens", "200000",
              "--storage-tokens", "50000000", "--verify", "off")
    proc, marker = _cli(tmp_path, earlier["short"], db, mark, "b", engine)
    os.kill(_writer_pid(proc, marker, mark), signal.SIGKILL)
    out, err = proc.communicate(timeout=180)
    Result(proc.returncode, out, err).fails(4, "nothing was recorded", "was removed")
    assert_no_process_left(mark)
    assert not db.exists()
    assert sorted(p.name for p in (tmp_path / "r.storage").iterdir()) == ["other-run"]
    assert (other / "000001.kvseg").read_bytes() == b"kept"
