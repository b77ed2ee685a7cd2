"""The sweep's worker side: one combination replayed into a private store, in a worker process
(`worker_main`, back end 1) or a Ray task (`ray_task`, back end 2). The driver (sweep.py) hands
out `Task`s and merges what comes back; this side knows nothing of the sweep's store.

A worker's interrupt state (`FLAGS`): the driver's stop request raises KeyboardInterrupt only
while a replay runs (which then closes its run as interrupted), and only once."""

from __future__ import annotations

import dataclasses
import os
import queue
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tierdiag.config.engine import EngineConfig
from tierdiag.errors import ExitCode, TierdiagError


@dataclass(frozen=True)
class Task:
    index: int
    name: str
    config: EngineConfig
    db_label: str  # the sweep's --db, named in messages in place of the worker's own store


@dataclass(frozen=True)
class WorkerResult:
    index: int
    db_path: str | None  # the worker's store, when it holds a run
    error: str | None = None
    exit_code: int = 0
    wall_s: float = 0.0
    reuse_share: float | None = None  # from the replay's summary, so the driver need not query it
    ttft_p50_ms: float | None = None


class StopFlags:
    """A worker's interrupt state: the driver's stop request raises KeyboardInterrupt only while
    a replay runs (which then closes its run as interrupted), and only once, so that closing is
    never itself interrupted; between replays it only stops the worker taking the next task."""

    stop = False
    in_replay = False
    raised = False


FLAGS = StopFlags()


def on_stop_signal(signum, frame) -> None:
    FLAGS.stop = True
    if FLAGS.in_replay and not FLAGS.raised:
        FLAGS.raised = True
        # Through the CLI's one interrupt path: inside a store write (signals.deferred) it is held
        # until the write is done, as in `tierdiag replay`; raised anywhere in it, DuckDB turns it
        # into an error of its own and the run would be closed as failed, not interrupted.
        from tierdiag import signals

        signals.interrupt(signal.SIGINT)


def replay_one(trace: Path, task: Task, workdir: Path, skip_bad: bool, command_line: str) -> WorkerResult:
    """One combination into `workdir/run-<index>.duckdb` with the ordinary replay."""
    from tierdiag.app.replay import ReplayInterrupted, replay

    t0 = time.perf_counter()
    db = workdir / f"run-{task.index}.duckdb"
    error, code, summary = None, 0, None
    FLAGS.in_replay = True
    try:
        if not FLAGS.stop:
            summary = replay(trace, task.config, db=db, run_name=task.name, probes=True, skip_bad=skip_bad,
                             command_line=command_line.split(" "))
    except (ReplayInterrupted, KeyboardInterrupt):
        pass  # the run (if one was created) is closed as interrupted in `db`
    except TierdiagError as exc:
        # "run ... kept in <worker store> as failed": the driver keeps it in --db.
        error, code = exc.one_line().replace(str(db), task.db_label), int(exc.exit_code)
    except Exception as exc:  # a bug in one combination must not take the others down
        first = str(exc).strip().splitlines()
        error, code = f"internal error: {type(exc).__name__}: {first[0] if first else ''}", int(ExitCode.BUG)
    finally:
        FLAGS.in_replay = False
    return WorkerResult(task.index, str(db) if db.exists() else None, error, code, time.perf_counter() - t0,
                         summary.reuse_share if summary else None, summary.ttft_p50_ms if summary else None)


def worker_main(jobs_q, results_q, trace: str, workdir: str, skip_bad: bool, command_line: str) -> None:
    """A worker process: take tasks until the sentinel (None) or a stop request."""
    # A terminal's Ctrl-C reaches the whole process group: only the driver acts on it, and
    # tells the workers with SIGTERM, so that every replay is stopped exactly once.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, on_stop_signal)
    parent = os.getppid()
    while not FLAGS.stop:
        try:
            task = jobs_q.get(timeout=0.5)
        except queue.Empty:
            if os.getppid() != parent:  # the driver is gone (kill -9): nobody will merge
                return
            continue
        if task is None:
            return
        results_q.put(("started", task.index, os.getpid()))
        results_q.put(("done", replay_one(Path(trace), task, Path(workdir), skip_bad, command_line)))


def ray_task(trace_bytes: bytes, trace_name: str, task: Task, skip_bad: bool, command_line: str):
    """One combination on a Ray worker: the trace (from the object store) into a local file, the
    ordinary replay into a local store, and that run's tables back to the driver as Arrow."""
    from tierdiag.store.copy_run import read_run_tables

    with tempfile.TemporaryDirectory(prefix="tierdiag-ray-") as tmp:
        trace = Path(tmp) / trace_name
        trace.write_bytes(trace_bytes)
        result = replay_one(trace, task, Path(tmp), skip_bad, command_line)
        tables = read_run_tables(result.db_path) if result.db_path else None
    return dataclasses.replace(result, db_path=None), tables  # that path is gone, and on another node
