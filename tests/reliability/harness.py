"""Run the real `tierdiag` entry point in a subprocess and check how it fails.

Every error a user can cause must be exactly one line on stderr, a named exit code, and no
traceback; `Result.fails` asserts all three and returns the line.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import duckdb

# The one CLI runner, for the tests here: `tierdiag` (a process), `tierdiag_in_process` (this one).
from tests.support.cli import ENTRY, Result, cli_argv, cli_env, tierdiag, tierdiag_in_process  # noqa: F401
from tests.support.traces import good_lines, line, write_trace  # noqa: F401 - the one trace writer

REPO = Path(__file__).resolve().parents[2]
SHARED_TRACES = REPO / ".." / "shared" / "traces"
# A small engine: the tiny model's pools fill after a few requests, replays take seconds.
SMALL = ("--model", "tiny", "--gpu", "cpu", "--device-tokens", "4096")
# Room for the synthetic traces' long requests (up to 30k tokens), so they are served, not rejected.
ROOMY = ("--model", "tiny", "--gpu", "cpu", "--device-tokens", "65536")


def real_trace_head(path: Path, n: int, *, fallback: int) -> Path:
    """The conversation trace's first `n` lines into `path` (sessions, shared prefixes, hits and
    evictions: every reader and evidence section has rows), or `fallback` made-up lines
    (`good_lines`) where the shared traces are not here."""
    real = SHARED_TRACES / "conversation_trace.jsonl"
    if not real.exists():
        return write_trace(path, good_lines(fallback))
    with real.open() as f:
        return write_trace(path, [next(f).rstrip("\n") for _ in range(n)])


def sql(db: Path, query: str, params: list | None = None) -> list[tuple]:
    """A read-only look at the store, the way any other tool would take it: waiting a moment
    while a writer holds the file (after a kill -9 of a replay, its writer process still
    commits what it was handed before it exits)."""
    from tierdiag.store.reader import connect_with_retry

    with connect_with_retry(db, read_only=True) as con:
        return con.execute(query, params or []).fetchall()


# TIERDIAG_FLUSH_EVERY_S for a replay a test watches through the store (wait_for_recorded_rows)
# and then stops mid-run. Not 0: a writer process commits every min(this, 1 s) after its last
# commit ended, so 0 means back to back, and once it falls behind the engine (two cores shared
# by the engine, the writer and the test) the file is let go of only for the instant between
# two commits: the test's reader, polling every 0.1 s, then first got in at the run's close,
# with every row committed and the replay past the moment the test meant to stop it in (CI:
# the Ctrl-C landed while the closing numbers were printed; a writer killed once rows showed
# had already exited). Half a second leaves the file free for that long after each commit (the
# first comes FIRST_WRITE_S after the store is opened), and inline the rows are flushed as often.
WATCHED_FLUSH_EVERY_S = "0.5"


def wait_for_recorded_rows(proc: subprocess.Popen, db: Path, *, runs_before: int, timeout_s: float = 180) -> int:
    """Poll the store (as a reader would) until the new run has flushed some requests; their count.
    The run must still be `running` then: the caller stops the replay mid-run, and a run already
    closed means the rows showed too late for that (see WATCHED_FLUSH_EVERY_S)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the replay ended before it could be stopped: {proc.communicate()[1]}"
        try:
            with duckdb.connect(str(db), read_only=True) as con:
                rows = con.execute("SELECT run_id, status FROM runs ORDER BY created_at").fetchall()
                if len(rows) > runs_before:
                    run_id, status = rows[-1]
                    n = con.execute("SELECT count(*) FROM requests WHERE run_id = ?", [run_id]).fetchall()[0][0]
                    if n:
                        assert status == "running", f"the first rows showed after the run was closed ({status}, {n:,} requests)"
                        return n
        except duckdb.Error:
            pass  # not created yet, or a flush holds it this instant: look again
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("no requests were recorded in time")


def runs(db: Path, *, process: bool = True) -> list[dict]:
    """`runs --json`, each run as stored: without `default` (which run a command without --run
    reads is the store's newest user run: it moves to a later one, the earlier run unchanged).
    `process=False`: the CLI in this process (`tierdiag_in_process`), the same command and output."""
    listed = (tierdiag if process else tierdiag_in_process)("runs", "--db", db, "--json").json()
    for r in listed:
        r.pop("default", None)
    return listed


def assert_same_event_rows(con, a: str, b: str, *, may_be_empty: tuple[str, ...] = ()) -> None:
    """Runs `a` and `b` of one store hold the same rows in every event table (every column but
    the run id and the measured wall time of real copies), as multisets, both ways."""
    from tierdiag.store.schema import EVENT_TABLES, TABLES

    for table in EVENT_TABLES:
        cols = ", ".join(c for c in TABLES[table] if c not in ("run_id", "wall_ns"))
        n = con.execute(f"SELECT count(*) FROM {table} WHERE run_id = ?", [a]).fetchone()[0]
        assert n == con.execute(f"SELECT count(*) FROM {table} WHERE run_id = ?", [b]).fetchone()[0], table
        for x, y in ((a, b), (b, a)):
            diff = con.execute(f"""SELECT count(*) FROM (SELECT {cols} FROM {table} WHERE run_id = ?
                                   EXCEPT ALL SELECT {cols} FROM {table} WHERE run_id = ?)""", [x, y]).fetchone()[0]
            assert diff == 0, f"{table}: {diff} of {n} rows differ"
        assert n > 0 or table in may_be_empty, f"{table}: no rows to compare"


def synth_and_store(root: Path, *, seed: int, long: int) -> dict:
    """The signal tests' inputs: `tierdiag synth` traces "long" (`long` requests) and "short"
    (150), and "store", a store holding one complete run (copied for each trial: the run that
    must stay untouched). In this process: the inputs, not what is tested."""
    out: dict = {}
    for name, n in (("long", long), ("short", 150)):
        trace = root / f"{name}.jsonl"
        r = tierdiag_in_process("synth", trace, "--requests", n, "--seed", seed)
        assert r.code == 0, r.err
        out[name] = trace
    out["store"] = root / "earlier.duckdb"
    small = write_trace(root / "small.jsonl", good_lines(6))
    assert tierdiag_in_process("replay", small, "--db", out["store"], *SMALL).code == 0
    return out


@contextlib.contextmanager
def holder(db, *, read_only: bool):
    """Another process with the store open, until the block ends."""
    code = ("import duckdb, sys, time\n"
            f"con = duckdb.connect({str(db)!r}, read_only={read_only})\n"
            "print('ready', flush=True)\n"
            "sys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield proc.pid
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


WRITERS = ("inline", "process")  # the two ways a replay writes its store (tierdiag/store/writer_process.py)
_HERE = str(Path(__file__).resolve().parent)
_IN_WRITER_PROCESS = False  # set in a writer process a test started with a hook


def on_request_flush(monkeypatch, hook, *, writer: str = "inline", tmp_path: Path | None = None,
                     table: str | None = "requests"):
    """Run `hook(n)` before the n-th flush of `table`'s rows (1-based; None: any event table's,
    not the runs row) is inserted; it may raise (a full disk, a bug) or send a signal
    (`interrupt_engine`). Returns the live call count: calls["requests"].

    `writer`: the replays that follow write inline (TIERDIAG_WRITER=inline) or through a writer
    process; there the hook runs in the writer process, so it must pickle (a module-level
    function, or a functools.partial of one), and the count is kept in a file under `tmp_path`."""
    monkeypatch.setenv("TIERDIAG_WRITER", writer)
    if writer == "inline":
        calls = {"requests": 0}
        _patch_append(monkeypatch, hook, calls.__setitem__, calls.__getitem__, table)
        return calls
    import pickle

    from tierdiag.app import writer_child

    assert tmp_path is not None, "a writer process counts its flushes in a file: pass tmp_path"
    counter = tmp_path / "flushes.count"
    prelude = (f"import sys, pickle; sys.path.insert(0, {_HERE!r}); import harness; "
               f"harness._hook_in_writer_process(pickle.loads(bytes.fromhex({pickle.dumps(hook).hex()!r})), "
               f"{str(counter)!r}, {table!r})\n")
    monkeypatch.setattr(writer_child, "ENTRY", prelude + writer_child.ENTRY)
    return _FileCount(counter)


class _FileCount:
    def __init__(self, path: Path):
        self.path = path

    def __getitem__(self, key: str) -> int:
        assert key == "requests"
        return int(self.path.read_text() or 0) if self.path.exists() else 0


def _patch_append(monkeypatch, hook, put, get, table: str | None = "requests") -> None:
    from tierdiag.store.writer import RunWriter

    real = RunWriter._append

    def append(con, into, columns):
        if into == table or (table is None and into != "runs"):  # None: every event table's
            put("requests", get("requests") + 1)  # the key the callers read: the count of `table`'s
            hook(get("requests"))
        return real(con, into, columns)

    if monkeypatch is None:
        RunWriter._append = staticmethod(append)
    else:
        monkeypatch.setattr(RunWriter, "_append", staticmethod(append))


def _hook_in_writer_process(hook, counter: str, table: str | None = "requests") -> None:
    """In a writer process: count the flushes of `table` in `counter`, calling `hook` first."""
    global _IN_WRITER_PROCESS
    _IN_WRITER_PROCESS = True
    state = {"requests": 0}

    def put(key, n):
        state[key] = n
        Path(counter).write_text(str(n))

    _patch_append(None, hook, put, state.__getitem__, table)


def engine_pid() -> int:
    """The replay's process: this one, or the parent of the writer process this runs in."""
    return os.getppid() if _IN_WRITER_PROCESS else os.getpid()


# Hooks for on_request_flush (module-level, so that a writer process can unpickle them).

def disk_full_after(ok_flushes: int, n: int) -> None:
    if n > ok_flushes:
        raise duckdb.IOException('Could not write file "r.duckdb.wal": No space left on device')


def disk_full_once_at(at: int, n: int) -> None:
    """The disk full for the `at`-th flush only: freed again right after (a retry would succeed)."""
    if n == at:
        raise duckdb.IOException('Could not write file "r.duckdb.wal": No space left on device')


def bug_from(first: int, n: int) -> None:
    if n >= first:
        raise ValueError("a bug in the final flush")


def interrupt_engine_at(at: int, n: int) -> None:
    if n == at:
        import signal

        os.kill(engine_pid(), signal.SIGINT)  # handled before the INSERT runs (inline)
