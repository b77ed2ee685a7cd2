"""The sweep runner: replay one trace under many configurations, record every run in one store.

    run_configs(trace, [(name, EngineConfig), ...], db, backend=Processes(jobs) | Ray(address),
                sweep_id=..., progress=callback) -> [run_id, ...]

Both back ends run the same worker function, `sweep_worker.replay_one`: an ordinary `tierdiag.app.replay.replay`
into a private DuckDB file (the same RunWriter, so the rows are exactly those of a single replay).
The driver is the only writer of `db`: as each combination finishes it copies that run in, in one
transaction (store/copy_run.py: file to file inside DuckDB for a worker's store, from Arrow for a
Ray task's tables), so `db` holds whole runs only and a reader can open it at any time. Local
workers are forked warm from a fork server that has imported the replay (`worker_context`).

    driver ──tasks──► worker 1: replay ─► run-0.duckdb ──┐
           ──tasks──► worker 2: replay ─► run-1.duckdb ──┤ (Ray: the tables come back as Arrow)
    db ◄── merge, one run per transaction ◄──────────────┘

A finished run is never thrown away. When `db` cannot take a run (another program holds it past
the wait, a full disk), that run and every later one go to a store of the sweep's own beside it
(`kept_store_path`: `DB-stem.SWEEP_ID.duckdb`, an ordinary run store every command reads with
`--db`); at the end the driver tries `db` once more, and if it still cannot take them the sweep
fails (SweepNotMerged, the write failure's exit code) naming the kept store and the command that
merges it later: `tierdiag sweep --resume KEPT --db DB` (`resume`).

Interrupts (Ctrl-C, SIGTERM) reach the driver; it stops handing out combinations and tells each
process worker to stop. A worker's replay then closes its run as `interrupted` (what it recorded
stays), the driver merges it beside the runs that had finished (`complete`), and raises
SweepInterrupted. Combinations that had not started are not recorded. Under Ray the in-flight
tasks are cancelled and only finished runs are kept (a cancelled task returns nothing).

This module knows nothing of advice or comparison: `sweep` and `advise` call it, `compare` reads
what it wrote.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import signal
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from tierdiag.config.engine import EngineConfig
from tierdiag.config.names import RunKind
from tierdiag.errors import ConfigError, ExitCode, TierdiagError
from tierdiag.threads import idle
from tierdiag.app.sweep_kept import Keeper, Resumed, kept_store_path, resume  # noqa: F401 - the sweep's API
from tierdiag.app.sweep_fork import warm_up_workers, worker_context  # noqa: F401 - the sweep's API
from tierdiag.app.sweep_worker import Task, WorkerResult, ray_task, worker_main

RAY_MISSING = "--ray needs Ray, which is not installed (pip install 'tierdiag[ray]')"
DRAIN_WAIT_S = 120.0  # after an interrupt: how long to wait for workers to close their runs


@dataclass(frozen=True)
class Processes:
    """Run combinations in `jobs` local worker processes (None: one per core)."""

    jobs: int | None = None


@dataclass(frozen=True)
class Ray:
    """Run each combination as a Ray task. `address` None starts a local Ray (`num_cpus` wide,
    None: one per core) for the sweep and stops it afterwards; an address joins that cluster."""

    address: str | None = None
    num_cpus: int | None = None


Backend = Processes | Ray


@dataclass(frozen=True)
class RunOutcome:
    """What became of one combination. `run_id` is None when nothing was recorded for it."""

    index: int  # position in the configs given to run_configs
    name: str
    run_id: str | None
    status: str  # complete | interrupted | failed | not_started
    error: str | None = None  # one line, for failed
    exit_code: int = 0  # the failure's exit code (ExitCode), 0 otherwise
    wall_s: float | None = None
    # The finished replay's headline, as `replay` computed it from the rows it wrote (its
    # ReplaySummary): None where the replay did not return one (interrupted, failed).
    reuse_share: float | None = None
    ttft_p50_ms: float | None = None
    kept_in: str | None = None  # the store holding the run when --db could not take it


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C / SIGTERM during a sweep, after every finished or interrupted run was merged."""

    def __init__(self, outcomes: Sequence[RunOutcome]):
        super().__init__("sweep interrupted")
        self.outcomes = tuple(outcomes)


class SweepNotMerged(TierdiagError):
    """--db could not take the sweep's finished runs: they are kept in a store of their own."""

    def __init__(self, outcomes: Sequence[RunOutcome], db: Path, kept: Path, cause: TierdiagError):
        self.outcomes = tuple(outcomes)
        self.kept = kept
        n = sum(1 for o in self.outcomes if o.kept_in)
        import shlex

        super().__init__(f"{cause.message}; {n} run{'s' if n != 1 else ''} of the sweep kept in {kept}",
                         hint=f"merge them when it is free: tierdiag sweep --resume {shlex.quote(str(kept))} "
                              f"--db {shlex.quote(str(db))}")
        self.exit_code = cause.exit_code


class SweepFailed(TierdiagError):
    """Some combinations failed (each recorded as failed where a run had started)."""

    def __init__(self, outcomes: Sequence[RunOutcome]):
        self.outcomes = tuple(outcomes)
        failed = [o for o in self.outcomes if o.status == "failed"]
        first = failed[0]
        super().__init__(f"{len(failed)} of {len(self.outcomes)} sweep runs failed; {first.name}: {first.error}")
        self.exit_code = ExitCode(first.exit_code) if first.exit_code in frozenset(ExitCode) else ExitCode.BUG


def new_sweep_id() -> str:
    return "sweep-" + time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def default_jobs() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def run_configs(trace: str | os.PathLike, configs: Sequence[tuple[str, EngineConfig]], db: str | os.PathLike, *,
                backend: Backend = Processes(), sweep_id: str | None = None, kind: str = RunKind.REPLAY,
                skip_bad: bool = False, command_line: Sequence[str] | None = None,
                progress: Callable[[RunOutcome], None] | None = None) -> list[str]:
    """Replay `trace` once per (run name, config) and record every run in `db` under `sweep_id`.

    Returns the run ids in the order of `configs`. `progress` is called in this thread once per
    combination, as soon as its run is in `db`. Raises SweepInterrupted on Ctrl-C / SIGTERM
    (finished runs kept complete, running ones kept as interrupted), SweepFailed when any
    combination failed (after all the others ran), and TierdiagError before any replay for a
    trace that is bad from its first line, a store that cannot be written, or (Ray) a missing
    or unreachable Ray.
    """
    trace = Path(trace)
    db = Path(db)
    if not configs:
        raise ConfigError("no configurations to replay")
    if isinstance(backend, Processes):
        warm_up_workers()  # it boots beside the checks below
    from tierdiag.paths import check_output
    from tierdiag.store.copy_run import RunFileCopier, open_destination

    check_output(db, what="--db", inputs=[("TRACE", trace)], store=True)
    _check_trace(trace, configs, skip_bad)

    # Busy, foreign, damaged, unwritable, or one of the files the sweep reads: say so before any replay.
    open_destination(db, inputs=[("TRACE", trace)], check=True).close()
    keeper = Keeper(db, sweep_id or new_sweep_id())  # the kept store is named after a sweep either way
    cmd = " ".join(command_line if command_line is not None else sys.argv)
    overrides = {"sweep_id": sweep_id, "kind": kind, "trace_path": str(Path(trace).absolute()), "command_line": cmd}
    tasks = [Task(i, name, cfg, str(db)) for i, (name, cfg) in enumerate(configs)]
    outcomes: dict[int, RunOutcome] = {}

    copier = RunFileCopier()  # one in-memory DuckDB connection for every merge of the sweep

    def record(result: "WorkerResult", tables) -> None:
        outcome = _merge(keeper, copier, tasks[result.index], result, tables, overrides)
        outcomes[result.index] = outcome
        if progress is not None:
            progress(outcome)

    def finish_interrupted(exc: BaseException) -> None:
        for t in tasks:
            outcomes.setdefault(t.index, RunOutcome(t.index, t.name, None, "not_started"))
        raise SweepInterrupted(keeper.last_try([outcomes[t.index] for t in tasks])) from exc

    try:
        if isinstance(backend, Ray):
            _run_ray(backend, trace, tasks, skip_bad, cmd, record, finish_interrupted)
        else:
            _run_processes(backend.jobs or default_jobs(), trace, tasks, skip_bad, cmd, record, finish_interrupted)
    finally:
        copier.close()
    ordered = keeper.last_try([outcomes[t.index] for t in tasks])
    if keeper.path is not None:
        raise SweepNotMerged(ordered, db, keeper.path, keeper.failure)
    if any(o.status == "failed" for o in ordered):
        raise SweepFailed(ordered)
    return [o.run_id for o in ordered]


def _check_trace(trace: Path, configs, skip_bad: bool) -> None:
    """A trace that is missing, empty or bad from its first line fails here, once, not N times."""
    from tierdiag.trace.reader import read_trace

    for block_size in sorted({cfg.block_size for _, cfg in configs}):
        next(read_trace(trace, block_size=block_size, skip_bad=skip_bad))


def _merge(keeper: Keeper, copier, task: Task, result: WorkerResult, tables, overrides: dict) -> RunOutcome:
    """Copy a worker's run into --db (or the kept store); its status as recorded (a run left
    `running`, whose worker was stopped while closing it, is interrupted). The worker's store
    is removed only once its run is committed elsewhere. Its rows go from file to file inside
    DuckDB (`copier`, a RunFileCopier) where the worker's store is a local file; Ray's come as
    Arrow `tables`."""
    from_file = tables is None and result.db_path is not None
    if from_file:
        row = copier.source(result.db_path)
    else:
        row = None if tables is None or tables["runs"].num_rows == 0 else {
            "status": tables["runs"].column("status")[0].as_py(), "error": tables["runs"].column("error")[0].as_py()}
    if row is None:
        status = "failed" if result.error else "not_started"
        return RunOutcome(task.index, task.name, None, status, result.error, result.exit_code, result.wall_s)
    status = row["status"]
    if status == "running":
        status = "interrupted"
    if from_file:
        run_id, kept_in = keeper.write_from(copier, {**overrides, "status": status})
        copier.release_source()
        _remove_worker_store(Path(result.db_path))
    else:
        run_id, kept_in = keeper.write(tables, {**overrides, "status": status})
    error = result.error or row["error"]
    return RunOutcome(task.index, task.name, run_id, status, error if status == "failed" else None,
                      result.exit_code if status == "failed" else 0, result.wall_s,
                      result.reuse_share, result.ttft_p50_ms, kept_in)


def _remove_worker_store(path: Path) -> None:
    for p in (path, path.with_name(path.name + ".wal")):
        p.unlink(missing_ok=True)
    shutil.rmtree(path.with_suffix(".storage"), ignore_errors=True)


# --- back end 1: local processes ------------------------------------------------------------------

_WORKDIR_PREFIX = "tierdiag-sweep-"
_UNMERGED_PREFIX = "tierdiag-unmerged-"  # a workers' folder kept for its runs: never cleaned up


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _sweep_workdir() -> Path:
    """The workers' folder, named after this process. A sweep killed with kill -9 cannot remove
    its own (each holds a partial store per worker, gigabytes on big traces), so a new sweep
    first removes those whose process is gone: ours by name, holding only workers' files."""
    root = Path(tempfile.gettempdir())
    for old in root.glob(f"{_WORKDIR_PREFIX}*-*"):
        pid = old.name[len(_WORKDIR_PREFIX):].split("-", 1)[0]
        try:
            ours = (pid.isdigit() and old.is_dir() and not old.is_symlink() and old.stat().st_uid == os.getuid()
                    and all(f.name.startswith("run-") for f in old.iterdir()))
        except OSError:  # gone meanwhile, or not readable: not ours to remove
            continue
        if ours and not _pid_alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{_WORKDIR_PREFIX}{os.getpid()}-"))


def _run_processes(jobs: int, trace: Path, tasks: list[Task], skip_bad: bool, command_line: str,
                   record, finish_interrupted) -> None:
    ctx = worker_context()
    jobs_q, results_q = ctx.Queue(), ctx.Queue()
    n_workers = max(1, min(jobs, len(tasks)))
    for t in tasks:
        jobs_q.put(t)
    for _ in range(n_workers):
        jobs_q.put(None)
    workdir = _sweep_workdir()
    workers = [ctx.Process(target=worker_main, name=f"tierdiag-sweep-{i}", daemon=True,
                           args=(jobs_q, results_q, str(trace), str(workdir), skip_bad, command_line))
               for i in range(n_workers)]
    in_flight: dict[int, int] = {}  # worker pid -> task index
    done: set[int] = set()
    failure: TierdiagError | None = None

    def handle(msg) -> None:
        if msg[0] == "started":
            in_flight[msg[2]] = msg[1]
            return
        result = msg[1]
        in_flight.pop(next((pid for pid, i in in_flight.items() if i == result.index), -1), None)
        done.add(result.index)
        record(result, None)

    def reap_dead() -> None:
        """A worker that died without reporting (killed, out of memory) fails its task; what it
        had flushed into its store is kept as that run, marked interrupted."""
        for w in workers:
            if w.exitcode is not None and w.pid in in_flight:
                index = in_flight.pop(w.pid)
                if index in done:
                    continue
                done.add(index)
                db = workdir / f"run-{index}.duckdb"
                record(WorkerResult(index, str(db) if db.exists() else None,
                                     f"worker process exited with code {w.exitcode}", int(ExitCode.BUG)), None)

    try:
        for w in workers:
            w.start()
        try:
            # The caller's work left for this thread's first wait (threads.idle_work: `sweep`'s
            # comparison modules), done while the workers replay rather than before they start.
            idle()
            while len(done) < len(tasks):
                try:
                    handle(results_q.get(timeout=0.5))
                except queue.Empty:
                    reap_dead()
                    if all(w.exitcode is not None for w in workers) and results_q.empty():
                        for t in tasks:  # every worker gone: nothing else will run
                            if t.index not in done:
                                done.add(t.index)
                                record(WorkerResult(t.index, None, "no worker process left to run it",
                                                     int(ExitCode.BUG)), None)
        except KeyboardInterrupt as exc:
            with _ignoring_sigint():
                _drain(workers, results_q, handle, reap_dead, in_flight)
            finish_interrupted(exc)
    except TierdiagError as exc:
        failure = exc  # neither --db nor a kept store took a run: its worker's store must stay
        raise
    finally:
        try:
            for w in workers:
                if w.pid is None:  # never started
                    continue
                w.join(timeout=5)
                if w.is_alive():
                    w.kill()
                    w.join(timeout=5)
            jobs_q.close()
            results_q.close()
        finally:
            _leave_workdir(workdir, failure)


def _leave_workdir(workdir: Path, failure: TierdiagError | None) -> None:
    """Remove the workers' folder, unless a failure to write their runs anywhere left stores in
    it: then it is renamed out of the way of `_sweep_workdir`'s clean-up and the error says where."""
    left = sorted(workdir.glob("run-*.duckdb")) if failure is not None else []
    if not left:
        shutil.rmtree(workdir, ignore_errors=True)
        return
    kept = workdir.with_name(_UNMERGED_PREFIX + workdir.name[len(_WORKDIR_PREFIX):])
    try:
        workdir.rename(kept)
    except OSError:
        kept = workdir
    failure.message += (f"; {len(left)} run store{'s' if len(left) != 1 else ''} of the sweep kept in {kept} "
                        f"(merge each with tierdiag sweep --resume STORE --db DB)")


def _drain(workers, results_q, handle, reap_dead, in_flight) -> None:
    """Stop every worker and merge what the in-flight replays recorded."""
    for w in workers:
        if w.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(w.pid, signal.SIGTERM)
    deadline = time.monotonic() + DRAIN_WAIT_S
    while time.monotonic() < deadline:
        try:
            handle(results_q.get(timeout=0.2))
        except queue.Empty:
            reap_dead()
            if not in_flight and all(not w.is_alive() for w in workers) and results_q.empty():
                return


@contextlib.contextmanager
def _ignoring_sigint():
    """While the driver merges after an interrupt, a second Ctrl-C must not tear that up."""
    try:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


# --- back end 2: Ray tasks ------------------------------------------------------------------------

def import_ray():
    """Ray, or the one-line error saying how to install it (exit 2)."""
    try:
        import ray
    except ImportError:
        raise ConfigError(RAY_MISSING) from None
    return ray


def _run_ray(backend: Ray, trace: Path, tasks: list[Task], skip_bad: bool, command_line: str,
             record, finish_interrupted) -> None:
    import logging

    ray = import_ray()
    started_here = not ray.is_initialized()
    if started_here:
        options = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
        try:
            if backend.address:
                ray.init(address=backend.address, **options)
            else:
                ray.init(num_cpus=backend.num_cpus or default_jobs(), **options)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            where = f"at {backend.address}" if backend.address else "locally"
            text = str(exc).strip().splitlines()
            raise ConfigError(f"--ray: cannot start or reach Ray {where}: {text[0] if text else type(exc).__name__}") from None
    try:
        trace_ref = ray.put(trace.read_bytes())  # shipped once; every task reads it from the object store
        remote = ray.remote(num_cpus=1, max_retries=0)(ray_task)
        pending = {remote.remote(trace_ref, trace.name, t, skip_bad, command_line): t for t in tasks}
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
                for ref in ready:
                    task = pending.pop(ref)
                    try:
                        result, tables = ray.get(ref)
                    except ray.exceptions.RayError as exc:
                        text = str(exc).strip().splitlines()
                        result, tables = WorkerResult(task.index, None, f"Ray task failed: {text[0] if text else exc}",
                                                       int(ExitCode.BUG)), None
                    record(result, tables)
        except KeyboardInterrupt as exc:
            for ref in pending:
                ray.cancel(ref)
            finish_interrupted(exc)
    finally:
        if started_here:
            ray.shutdown()
