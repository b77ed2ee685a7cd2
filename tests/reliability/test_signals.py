"""Ctrl-C and SIGTERM at many moments of a real replay, sent to a real subprocess.

An interrupt is an interrupt wherever it lands (in the engine, in a DuckDB flush, in the final
flush, while the store is created): exit 130 (143 for SIGTERM) with one "interrupted" line, the
run marked interrupted with exactly the rows it flushed, each once; earlier runs untouched; the
file readable and writable afterwards. `TIERDIAG_FLUSH_EVERY_S=0` flushes every 256 requests,
so a good share of the random moments fall inside a flush transaction.

The moments are drawn from a fixed seed (the same every run) over the whole replay; the test
waits until the CLI has installed its handlers (SigCgt in /proc) so that "the first moments"
means the CLI's, not the interpreter's start-up.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import duckdb
import pytest

from harness import (WRITERS, Result, cli_argv, cli_env, interrupt_engine_at, on_request_flush, sql, synth_and_store,
                     tierdiag_in_process)

FLUSH_OFTEN = cli_env(TIERDIAG_FLUSH_EVERY_S="0")
ENGINE = ("--model", "tiny", "--gpu", "cpu", "--device-tokens", "65536", "--verify", "off")
CODE = {signal.SIGINT: 130, signal.SIGTERM: 143}

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc (Linux)")


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    root = tmp_path_factory.mktemp("signals")
    out = synth_and_store(root, seed=5, long=4000)
    (out["earlier"],) = listed_runs(out["store"])
    # How long the long replay runs once its run row is written, measured here: the random
    # moments are drawn inside it. (A fixed window outlived the replay twice as it got faster,
    # and then every signal came after the end.)
    # From the moment the run row shows, as the delays are counted: the start-up before it is
    # not part of the window (counted in, it put a share of the moments past the end, and all
    # four there on a faster run).
    shutil.copy(out["store"], root / "timed.duckdb")
    seen: dict = {}
    r = interrupt_replay(out["long"], root / "timed.duckdb", None, 0.0, after_run_row=1, seen=seen)
    assert r.code == 0, r.err
    out["long_s"] = time.monotonic() - seen["run_row"]
    return out


def handlers_installed(pid: int) -> bool:
    """True once the process catches SIGTERM (the CLI installs SIGINT's and SIGTERM's together)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(int(ln.split()[1], 16) for ln in status.splitlines() if ln.startswith("SigCgt:"))
    return bool(caught & (1 << (signal.SIGTERM - 1)))


def run_started(db: Path, runs_before: int) -> bool:
    """The replay's run row is in the file (read the way any reader would)."""
    try:
        with duckdb.connect(str(db), read_only=True) as con:
            return con.execute("SELECT count(*) FROM runs").fetchall()[0][0] > runs_before
    except duckdb.Error:
        return False  # not created yet, or a flush holds it this instant


def interrupt_replay(trace: Path, db: Path, sig: int, delay_s: float, *, after_run_row: int | None = None,
                     seen: dict | None = None) -> Result:
    """Start a replay, wait for its handlers (and, with `after_run_row`, for its run row beside
    that many earlier ones), wait `delay_s` more, send `sig` (None: none, let it finish).
    `seen["run_row"]`: when that wait ended (time.monotonic())."""
    proc = subprocess.Popen(cli_argv("replay", trace, "--db", db, *ENGINE), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=FLUSH_OFTEN)
    deadline = time.monotonic() + 120
    while proc.poll() is None and not (handlers_installed(proc.pid) and (
            after_run_row is None or run_started(db, after_run_row))):
        assert time.monotonic() < deadline, "the replay never got going"
        time.sleep(0.002 if after_run_row is None else 0.05)
    if seen is not None:
        seen["run_row"] = time.monotonic()
    time.sleep(delay_s)
    if proc.poll() is None and sig is not None:
        proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    return Result(proc.returncode, out, err)


def listed_runs(db: Path) -> list[dict]:
    """What `tierdiag runs --json` prints, read in-process (a subprocess per check is slow)."""
    from tierdiag.store.reader import list_runs, open_store

    with open_store(db) as con:
        return [json.loads(json.dumps(r.to_json(), default=str)) for r in list_runs(con)]


def check_outcome(r: Result, db: Path, sig: int, earlier: dict) -> str:
    """Every invariant of an interrupted (or just finished) replay; returns the run's status."""
    assert "Traceback" not in r.err, r.err
    listed = listed_runs(db)
    assert listed[0] == earlier, "an earlier run changed"
    later = listed[1:]
    if r.code == 0:
        (run,) = later
        assert run["status"] == "complete", run
    else:
        line = r.fails(CODE[sig], "interrupted")
        if not later:  # stopped before its run row was written
            return "none"
        (run,) = later
        # Interrupted, with the line saying how many requests the file holds; or complete, when
        # the signal came after the final status was written (in the last moments of the close:
        # the line says "as complete"; or after the replay returned, while printing: the plain
        # "interrupted").
        assert run["status"] in ("interrupted", "complete"), (run, line)
        if run["status"] == "interrupted" or line != "tierdiag: interrupted":
            assert f"as {run['status']}, {run['num_requests']:,} request" in line, (run, line)
    rid = run["run_id"]
    n, distinct = sql(db, "SELECT count(*), count(DISTINCT seq) FROM requests WHERE run_id = ?", [rid])[0]
    assert n == distinct, f"{n - distinct} request rows written twice"
    assert run["num_requests"] == n, (run, n)
    for table, key in (("evictions", "eviction_id"), ("transfers", "transfer_id"), ("batches", "batch_id")):
        total, unique = sql(db, f"SELECT count(*), count(DISTINCT {key}) FROM {table} WHERE run_id = ?", [rid])[0]
        assert total == unique, f"{table}: {total - unique} rows written twice"
    return run["status"]


def _fresh_db(tmp_path: Path, i: int, traces) -> tuple[Path, dict]:
    db = tmp_path / f"r{i}.duckdb"
    shutil.copy(traces["store"], db)
    return db, traces["earlier"]


@pytest.mark.slow
def test_signal_at_random_moments_of_a_replay(tmp_path, traces):
    """SIGINT and SIGTERM over the whole of a replay that flushes every 256 requests."""
    rnd = random.Random(17)
    statuses = []
    for i in range(4):
        sig = (signal.SIGINT, signal.SIGTERM)[i % 2]
        db, earlier = _fresh_db(tmp_path, i, traces)
        r = interrupt_replay(traces["long"], db, sig, rnd.uniform(0.0, 0.9 * traces["long_s"]), after_run_row=1)
        statuses.append(check_outcome(r, db, sig, earlier))
    # Every moment may come after the close on a run faster than the timed one (a fresh-clone
    # CI run had all four complete): then signals as soon as the run row shows, until one lands
    # inside the replay.
    for i in range(4, 7):
        if "interrupted" in statuses:
            break
        db, earlier = _fresh_db(tmp_path, i, traces)
        statuses.append(check_outcome(interrupt_replay(traces["long"], db, signal.SIGINT, 0.0, after_run_row=1),
                                      db, signal.SIGINT, earlier))
    assert "interrupted" in statuses, statuses
    # And the file still takes every reader.
    assert tierdiag_in_process("summary", "--db", db, "--json").code == 0


def test_signal_at_random_moments_of_a_short_replay(tmp_path, traces):
    """A short run has one flush, the final one: a signal in it still closes the run."""
    rnd = random.Random(23)
    for i in range(3):
        sig = (signal.SIGTERM, signal.SIGINT)[i % 2]
        db, earlier = _fresh_db(tmp_path, i, traces)
        r = interrupt_replay(traces["short"], db, sig, rnd.uniform(0.0, 0.8), after_run_row=1)
        check_outcome(r, db, sig, earlier)


def test_signal_in_the_first_moments(tmp_path, traces):
    """While the trace is read, torch imported, a new store created: 130/143 with the line,
    and the file is never left refused: the next replay's writer takes it."""
    from tierdiag.store.writer import RunWriter

    rnd = random.Random(31)
    for i in range(4):
        sig = (signal.SIGTERM, signal.SIGINT)[i % 2]
        db = tmp_path / f"new{i}.duckdb"
        r = interrupt_replay(traces["short"], db, sig, rnd.uniform(0.0, 1.0) ** 2)
        assert "Traceback" not in r.err, r.err
        if r.code != 0:
            r.fails(CODE[sig], "interrupted")
        if db.exists() and db.stat().st_size:
            for run in listed_runs(db):
                assert run["status"] in ("interrupted", "complete"), run
        w = RunWriter(db, name="next", trace_path="t.jsonl", trace_sha256="", config={}, hardware={},
                      data_plane={}, timing="modelled")
        w.finish("complete")
        assert listed_runs(db)[-1]["name"] == "next"


# --- in-process, deterministic: the signal lands exactly inside a flush transaction --------------

@pytest.mark.parametrize("writer", WRITERS)
def test_a_signal_inside_a_flush_transaction_waits_for_it_and_writes_each_row_once(tmp_path, monkeypatch, writer):
    """Inline, the signal lands inside the flush's transaction and waits for it; with a writer
    process, it lands in the engine while the writer commits, and the close hands over the rest."""
    import functools

    from tierdiag import signals
    from tierdiag.config.engine import EngineConfig
    from tierdiag.app.replay import ReplayInterrupted, replay

    trace = tmp_path / "t.jsonl"
    # Longer with a writer process: it commits behind the engine, and its third flush should
    # still come before the engine's end (else the run is complete before the signal lands).
    n_requests = 800 if writer == "inline" else 3000
    assert tierdiag_in_process("synth", trace, "--requests", n_requests, "--seed", "3").code == 0
    db = tmp_path / "r.duckdb"
    monkeypatch.setenv("TIERDIAG_FLUSH_EVERY_S", "0")
    # The third flush, mid-run: the signal is handled before the INSERT runs.
    calls = on_request_flush(monkeypatch, functools.partial(interrupt_engine_at, 3), writer=writer, tmp_path=tmp_path)
    previous = {s: signal.getsignal(s) for s in signals.HANDLED}
    signals.install()
    try:
        with pytest.raises(ReplayInterrupted) as exc:
            replay(trace, EngineConfig(model="tiny", gpu="cpu", device_tokens=65536), db=db, run_name="x",
                   probes=True, skip_bad=False)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        signals.reset()
    flushes = calls["requests"]
    monkeypatch.undo()
    (run,) = listed_runs(db)
    n, distinct = sql(db, "SELECT count(*), count(DISTINCT seq) FROM requests")[0]
    assert n == distinct == run["num_requests"] >= 3 * 256
    assert exc.value.num_requests == n and exc.value.status == run["status"]
    if writer == "inline":
        # The interrupted flush committed (the third, at 768 finished requests), no flush of
        # requests after it, nothing twice.
        assert run["status"] == "interrupted" and flushes == 3
    else:
        # What the engine had handed over before the signal reached it is committed too; on a
        # busy machine the writer may reach its third flush only after the run was closed as
        # complete (the line then says "as complete").
        assert flushes >= 3 and run["status"] in ("interrupted", "complete")
        assert run["status"] == "complete" or n < 3000
