"""Replay a trace through the engine into a run store: the one function behind `tierdiag replay`.

The `runs` row is written first (status running) so a crash leaves a visible trace of the run;
events are appended in bulk as the recorder fills, and at least every `TIERDIAG_FLUSH_EVERY_S`
seconds of wall time (default 5), so kill -9 loses only the last few seconds. The status
becomes complete, interrupted (Ctrl-C) or failed (an error) at the end, and whatever was
recorded before stays readable. A trace that is empty or bad from its first line fails before
any run (or database file) is created.

The store is written by a process of its own beside the engine where a core is free for it
(tierdiag/store/writer_process.py, `TIERDIAG_WRITER`), else on the engine's thread; the rows,
the errors and the statuses are the same either way.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
import time
from array import array
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from tierdiag import signals
from tierdiag.diagnose.read.quantile import nearest_rank, nearest_rank_index
from tierdiag.units import ns_to_ms
from tierdiag.config.engine import EngineConfig
from tierdiag.errors import ConfigError, TierdiagError, TraceError
from tierdiag.store.storage_dir import run_folder
from tierdiag.trace.fields import show
from tierdiag.trace.reader import MAX_ARRIVAL_NS, ReadReport, is_seekable_file, read_trace, trace_sha256
from tierdiag.threads import OnThread


@dataclass(frozen=True)
class ReplayResult:
    """What a replay did, as `replay` prints it (the closing table, --json)."""

    run_id: str | None
    db_path: str | None
    run_name: str
    status: str
    num_requests: int
    num_rejected: int
    input_tokens: int
    device_tokens: int
    host_tokens: int
    storage_tokens: int
    computed_tokens: int
    recomputed_tokens: int
    load_backs: int
    load_back_bytes: int
    load_back_p50_ms: float | None
    load_back_p99_ms: float | None
    skipped: dict
    evictions: dict
    ttft_p50_ms: float | None
    ttft_p90_ms: float | None
    ttft_p99_ms: float | None
    virtual_s: float  # the run's span: first arrival -> last finish (summary's span_ns)
    prefill_busy_share: float  # share of that span the GPU spent in prefill (--dp N: each GPU's, on average)
    wall_s: float
    bad_lines: int
    first_bad: list = field(default_factory=list)
    unknown_keys: list = field(default_factory=list)
    data_plane: dict = field(default_factory=dict)
    # The storage tier's page files: the run's folder (tierdiag.store.storage_dir) and their size
    # at the end; a replay that records nothing used a temporary folder, removed (dir None).
    storage_dir: str | None = None
    storage_bytes: int = 0
    writer: str | None = None  # how the store was written: "process" | "inline" (None: nothing recorded)
    # Where wall_s went: "start_s" (reading the first line, imports, the store and the engine set
    # up), "engine_s" (the engine's run, emitting and handing over rows), "close_s" (the run's
    # close: the last rows, the run evidence, the closing numbers). They add up to wall_s.
    wall_phases: dict = field(default_factory=dict)
    # Rejected requests by the kind of their reason (engine.scheduler.reject_kind): context_length,
    # session_ended, device_memory; they add up to num_rejected.
    rejected: dict = field(default_factory=dict)

    @property
    def reuse_share(self) -> float:
        from tierdiag.diagnose.request.tokens import TokenSplit

        return TokenSplit.of(self).reused_tokens / self.input_tokens if self.input_tokens else 0.0

    def to_json(self) -> dict:
        d = dict(self.__dict__)
        d["reuse_share"] = self.reuse_share
        return d


def twin_dp(db: Path | None, trace: Path) -> int | None:
    """The `--dp` a replay of `trace` into `db` takes when neither the command line nor its config
    says: the ranks an observed run in `db` saw, where `trace` is the `--trace-out` its import wrote
    (same sha256; docs/contract.md). None otherwise. The trace is hashed only when `db` holds such a
    run."""
    if db is None or not Path(db).is_file() or not is_seekable_file(trace):
        return None
    from tierdiag.diagnose.twin.observed_twin import ranks_by_trace_out
    from tierdiag.errors import StoreError
    from tierdiag.store.reader import open_store

    try:
        con = open_store(db)
    except StoreError:
        return None  # not a store with runs (yet): the replay's own open says what is wrong, if anything
    with con:
        ranks = ranks_by_trace_out(con)
    return ranks.get(trace_sha256(trace)) if ranks else None


def _percentile(values, q: float) -> float | None:
    """In ms, by nearest rank: the definition `summary` and the report use (diagnose/read/quantile.py).
    `values`: a list, or the engine's array('q') (EngineStats), sorted as int64 by numpy rather than
    as a million Python ints; the value picked, and so the result, is the same."""
    if isinstance(values, array) and values:
        import numpy as np

        s = np.sort(np.frombuffer(values, dtype=np.int64))
        v = int(s[nearest_rank_index(len(s), q)])
        return v / 1e6
    v = nearest_rank(values, q)
    return None if v is None else v / 1e6


def count_lines(path: Path) -> int | None:
    """Cheap total for the progress bar (None for compressed traces)."""
    try:
        with open(path, "rb") as fh:
            if fh.read(2) == b"\x1f\x8b":
                return None
            fh.seek(0)
            return sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
    except OSError:
        return None


DEFAULT_FLUSH_EVERY_S = 5.0


class ReplayInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) during a replay, after the run was closed as interrupted."""

    def __init__(self, run_id: str | None, db_path: str | None, num_requests: int,
                 write_problem: TierdiagError | None = None, status: str = "interrupted",
                 stopped_again: bool = False):
        super().__init__(run_id)
        self.run_id = run_id
        self.db_path = db_path
        self.num_requests = num_requests  # request rows in the file
        self.write_problem = write_problem  # why what was recorded could not all be kept
        self.status = status  # what the run was closed as
        # a second signal stopped the close once the rows and status were committed: no evidence
        self.stopped_again = stopped_again


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def _closed(writer) -> bool:
    return writer.closed_as is not None


def _requests(n: int) -> str:
    return f"{n:,} request{'' if n == 1 else 's'}"


def _flush_every_s() -> float:
    raw = os.environ.get("TIERDIAG_FLUSH_EVERY_S")
    if not raw:
        return DEFAULT_FLUSH_EVERY_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ConfigError(f"TIERDIAG_FLUSH_EVERY_S={raw!r} must be a number of seconds (0 or more)")
    return value


@contextlib.contextmanager
def _fewer_gc_passes(process_ends: bool = False):
    """A replay allocates millions of short-lived objects beside ~10^5 long-lived tree nodes;
    CPython's default gen-0 threshold (700) makes the collector rescan them constantly (measured:
    1.2 s of a 8 s conversation-trace replay). Nothing here relies on prompt cycle collection.

    The engine is a reference cycle (its ranks' callbacks hold their schedulers), dead once the
    replay returns. With the default thresholds back, the next allocation's pass may traverse it
    whole (its page lists, router runs, tree nodes: 0.05-0.22 s CPU at `--dp 8`). Where the
    caller's process ends unfreed (`process_ends`: the CLI, `cli/exits.py`) the heap is frozen
    first, so no pass sees it again; a library caller's engine is left to the collector."""
    old = gc.get_threshold()
    gc.set_threshold(50_000, 20, 100)
    try:
        yield
    finally:
        if process_ends:
            gc.freeze()
        gc.set_threshold(*old)


# What OpenBLAS reads for its thread count, in its order: any one set is the user's choice.
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")


def single_threaded_blas(environ=os.environ) -> bool:
    """OpenBLAS (numpy's, loaded with it) to one thread, in this process and those it starts (the
    writer process), unless the user set its thread count; whether it was set here. The library
    starts its threads as it loads (`gotoblas_init`), and each spins ~2^28 cycles (~0.1 s of a
    core at 2.6 GHz) waiting for work before it sleeps: a replay makes no BLAS call at all (no
    matrix product, no linalg; gdb on `exec_blas`: never reached), yet that spin was ~4 % of its
    CPU samples, taken from the second core the writer process runs on. Read by OpenBLAS when numpy
    is first imported: call this before (a process that imported numpy already keeps its threads;
    its children still get one)."""
    if any(name in environ for name in BLAS_THREAD_VARIABLES):
        return False
    environ["OPENBLAS_NUM_THREADS"] = "1"
    return True



class _Digest(OnThread):
    """`trace_sha256(path)` on a thread of its own from now; `result()` waits for it and returns
    it, or raises what it raised (where the call itself would have)."""

    def __init__(self, path: Path):
        # hashlib (imported where a digest is taken: trace/reader.py) is imported here, on the
        # caller's thread, never on this one: an import on it raced the engine's import on the
        # main thread (which imports hashlib too, engine/compiled.py) and, under CPython 3.11's
        # module locks, hung both (seen: 2 replays in 3).
        import hashlib  # noqa: F401

        super().__init__(trace_sha256, path, name="tierdiag-trace-digest")


def _single_threaded_data_plane() -> None:
    """The replay's copies are many and small (a page row is a few hundred bytes at reduced
    width): torch's intra-op threads only add wake-up stalls, of milliseconds on a busy machine.
    OMP_NUM_THREADS, when set, is the user's choice and stays. Without a GPU driver torch is not
    imported at all (CPU pools are numpy buffers, moved on this thread)."""
    from tierdiag.engine.hardware import cuda_device_present

    if "OMP_NUM_THREADS" not in os.environ and cuda_device_present():
        import torch

        torch.set_num_threads(1)


def _scaled_arrivals(requests, time_scale: float, trace: Path, closed: bool = True):
    """The requests, refusing one whose arrival times --time-scale would leave int64 ns. In
    closed loop a session's turn arrives no earlier than its first turn's scaled arrival plus the
    pauses since (not scaled); the reader bounds that sum unscaled (`reader.SessionClock`), so
    only a --time-scale above 1 can push it past the range: refused here, naming the line."""
    sessions: dict[str, int] | None = {} if closed and time_scale > 1 else None
    for req in requests:
        if req.arrival_ns * time_scale > MAX_ARRIVAL_NS:
            raise TraceError(f"{trace}:{req.line}: timestamp {req.arrival_ns // 1_000_000:,} ms times --time-scale "
                             f"{time_scale:g} is past the latest arrival tierdiag can time "
                             f"({MAX_ARRIVAL_NS // 1_000_000:,} ms)", hint="use a smaller --time-scale")
        if sessions is not None and req.session is not None:
            at = sessions.get(req.session)
            at = int(req.arrival_ns * time_scale) if at is None else at + (req.think_ns or 0)
            if at > MAX_ARRIVAL_NS:
                raise TraceError(f"{trace}:{req.line}: session {show(req.session)}: its first arrival times --time-scale "
                                 f"{time_scale:g} plus its pauses is past the latest arrival tierdiag can time "
                                 f"({MAX_ARRIVAL_NS // 1_000_000:,} ms)", hint="use a smaller --time-scale")
            sessions[req.session] = at
        yield req


def replay(trace: Path, cfg: EngineConfig, *, db: Path | None, run_name: str | None, probes: bool,
           skip_bad: bool, command_line: list[str] | None = None,
           progress: Callable[[int, int, object], None] | None = None,
           process_ends: bool = False,
           leave_stopped_again: Callable[[ReplayInterrupted], None] | None = None) -> ReplayResult:
    # Fewer collector passes over the whole replay, the closing flush and summary included: the
    # recorder's last ~10^5 buffered events and the tree are live objects that a default-
    # threshold pass right after the engine rescans (0.1-0.3 s on the conversation trace).
    # The stack reaps a writer process however the replay ends. `process_ends`: the caller's
    # process ends after this replay without freeing its objects (the CLI): the heap is frozen
    # at the end instead of left to the collector (`_fewer_gc_passes`). `leave_stopped_again`:
    # a caller whose process may end inside the close (the CLI) says there what the run kept and
    # ends it, when a second signal comes while an inline writer computes an interrupted run's
    # evidence (app/replay_writers.py `InlineWriter._close_hooks`); it must not return.
    closed: list = []  # the writer, once the run is closed (_replay appends it)
    try:
        with _fewer_gc_passes(process_ends), contextlib.ExitStack() as cleanup:
            return _replay(trace, cfg, db=db, run_name=run_name, probes=probes, skip_bad=skip_bad,
                           command_line=command_line, progress=progress, cleanup=cleanup, closed=closed,
                           reap_at_exit=process_ends, leave_stopped_again=leave_stopped_again)
    except KeyboardInterrupt as exc:
        if isinstance(exc, ReplayInterrupted) or not closed:
            raise
        # The signal landed after the run was closed (its closing numbers being computed, its
        # storage files closed): the run stays as closed, and the line says so, as for one that
        # lands during the close's last write; not the bare "interrupted" of an unknown state.
        (writer,) = closed
        raise ReplayInterrupted(writer.run_id, str(db), writer.recorded, None, writer.closed_as) from exc


def _replay(trace: Path, cfg: EngineConfig, *, db: Path | None, run_name: str | None, probes: bool,
            skip_bad: bool, command_line: list[str] | None,
            progress: Callable[[int, int, object], None] | None, cleanup: contextlib.ExitStack,
            closed: list, reap_at_exit: bool = False,
            leave_stopped_again: Callable[[ReplayInterrupted], None] | None = None) -> ReplayResult:
    from tierdiag.app.replay_writers import for_mode

    t0 = time.perf_counter()
    single_threaded_blas()  # before the writer process starts and numpy loads (the engine's import)
    flush_every_s = _flush_every_s()
    mode = None
    if db is not None and probes:  # nothing recorded: the writer's modules (subprocess...) not loaded
        from tierdiag.store.writer_process import writer_mode

        mode = writer_mode()
    recording = for_mode(mode)
    # cfg.time_scale is inside its declared bounds (config/engine.py): an EngineConfig is never outside them.
    report = ReadReport()
    requests = _scaled_arrivals(read_trace(trace, block_size=cfg.block_size, skip_bad=skip_bad, report=report),
                                cfg.time_scale, trace, closed=cfg.arrivals != "trace")
    # The reader streams: pull the first request now, so that a trace that is empty or bad from
    # its first line fails here, before a run (or the database file) exists, and before torch.
    first = next(requests)
    requests = itertools.chain([first], requests)
    recording = recording.start(cleanup)  # a writer process starts now, beside the engine's import
    if leave_stopped_again is not None:
        def stopped_again() -> None:
            writer = recording.writer
            leave_stopped_again(ReplayInterrupted(writer.run_id, str(db), writer.recorded, None,
                                                  writer.closed_as or "interrupted", stopped_again=True))

        recording.leave_when_stopped_again = stopped_again
    # The run's row names the trace's digest (nothing recorded: none taken). A trace read through
    # a pipe can be read once only: its digest is taken while replaying and recorded at the end
    # (the reader fills report.sha256). A file's is taken on a thread beside the engine's import
    # (hashlib and the reads let the GIL go: ~2-3 ms of a 3 MB trace off the start's path).
    digest = _Digest(trace) if recording.kind is not None and is_seekable_file(trace) else None

    # Imported here: read-only commands share this package and must not pay for torch. Signals
    # wait for the imports: torch's initialisation calls back into Python from C++, and an
    # interrupt raised there aborts the process instead of unwinding it.
    with signals.deferred():
        from tierdiag.engine.engine import Engine, describe_data_plane

        _single_threaded_data_plane()
    sha = digest.result() if digest is not None else None
    storage_dir = None
    storage_tmp = None
    engine = None
    last_flush = [time.monotonic()]

    def on_progress(done: int, now_ns: int, stats) -> None:
        # Called every few hundred requests: flush by wall time too, so a killed replay loses little.
        if recording.recorder is not None and time.monotonic() - last_flush[0] >= flush_every_s:
            recording.recorder.flush()
            last_flush[0] = time.monotonic()
        if progress is not None:
            # Virtual time since the run's first arrival, where every view's clock starts (a
            # trace sliced from a longer one starts late).
            progress(done, max(now_ns - int(first.arrival_ns * cfg.time_scale), 0), stats)

    def recorded() -> int:
        """Requests in the file (with probes), else those the engine got to."""
        if recording.writer is not None:
            return recording.writer.recorded
        return engine.stats.requests_finished + engine.stats.requests_rejected if engine is not None else 0

    try:
        if recording.kind is not None:
            # Deferred: an interrupt while the store is created or the run row written waits for
            # that transaction, then lands below with the writer set, and the run is closed.
            with signals.deferred():
                storage_dir = _open_run(recording, db, trace, cfg, run_name=run_name, sha=sha,
                                        command_line=command_line, flush_every_s=flush_every_s)
        elif cfg.storage_tokens:
            # Nothing is recorded, so no run owns the pages: a temporary folder, removed at the end.
            storage_tmp = _temporary_storage(cfg.storage_dir)
            storage_dir = storage_tmp
        engine = Engine(cfg, probe=recording.recorder, storage_dir=storage_dir, progress=on_progress)
        t_engine = time.perf_counter()
        stats = engine.run(requests)
        t_close = time.perf_counter()
        if recording.writer is not None:
            # The final flush and status, all held against signals: a Ctrl-C that lands here
            # waits for them and then marks the run interrupted (with all its rows) instead.
            with signals.deferred():
                problem = recording.close(lambda: "complete" if signals.pending() is None else "interrupted", None,
                                          trace_sha256=report.sha256)
                # The caller's process ends after it prints this replay's result (the CLI): a
                # writer process that closed the run (the store committed and let go of) is
                # reaped at that exit, after the result, not waited for here.
                recording.finished(reap_at_exit=reap_at_exit)
            if problem is not None:
                raise problem
            closed.append(recording.writer)
    except BaseException as exc:
        _on_failure(exc, recording, db, recorded)
        raise
    finally:
        storage_bytes = _close_storage(engine, storage_tmp)
        if storage_dir is not None and storage_tmp is None and getattr(recording.writer, "no_run", False):
            # The run's own folder, of a run that was never recorded (its writer process died, or
            # refused the store, before the run's row): no run owns its pages, and nothing would
            # ever find or delete them (`runs --delete` goes by the run's row).
            _remove_unowned_storage(storage_dir)
    # A recorded run's closing numbers are `summary`'s, read back: one definition per metric
    # (by the writer process, after the run evidence it stored, when there is one).
    numbers = recording.numbers()
    t_end = time.perf_counter()
    return _result(stats, numbers, recording, trace, cfg, first_arrival_ns=int(first.arrival_ns * cfg.time_scale),
                   db=db, run_name=run_name, report=report, data_plane=describe_data_plane(cfg),
                   storage_dir=storage_dir if storage_tmp is None else None, storage_bytes=storage_bytes,
                   wall_phases={"start_s": t_engine - t0, "engine_s": t_close - t_engine, "close_s": t_end - t_close},
                   wall_s=t_end - t0)


def _open_run(recording, db: Path, trace: Path, cfg: EngineConfig, *, run_name: str | None, sha: str | None,
              command_line: list[str] | None, flush_every_s: float) -> Path | None:
    """The run's row, through `recording`; the run's storage folder (None without a storage tier)."""
    from tierdiag.engine.engine import describe_data_plane
    from tierdiag.engine.hardware import hardware_summary
    from tierdiag.store.writer_process import new_run_id

    run_id = new_run_id()
    config = cfg.to_json()
    # The run's own folder, recorded so `runs --delete` finds it; none without a tier (a
    # --storage-dir given anyway names a root no run of this kind writes into).
    config["storage_dir"] = None
    storage_dir = None
    if cfg.storage_tokens:
        storage_dir = run_folder(db, cfg.storage_dir, run_id)
        config["storage_dir"] = str(storage_dir)
    # Paths as absolute ones: `advise` re-reads the trace and the profile, maybe from another
    # folder than the one the replay ran in.
    if config.get("profile"):
        config["profile"] = str(Path(config["profile"]).absolute())
    run = dict(name=run_name, trace_path=str(Path(trace).absolute()), trace_sha256=sha or "", config=config,
               hardware=hardware_summary(), run_id=run_id, data_plane=describe_data_plane(cfg),
               timing=cfg.timing, command_line=command_line)
    recording.open(db, run, flush_every_s=flush_every_s)
    return storage_dir


def _on_failure(exc: BaseException, recording, db: Path | None, recorded: Callable[[], int]) -> None:
    """What a replay that did not finish leaves: its run closed as interrupted or failed, with
    every row already written, and where it is told in the error. Raises ReplayInterrupted for an
    interrupt; returns for the caller to re-raise anything else."""
    writer = recording.writer
    # An interrupt is an interrupt wherever it lands: also when DuckDB or an import it cut
    # short turned it into an error of another kind (the signal was seen all the same).
    if isinstance(exc, KeyboardInterrupt) or signals.received() is not None:
        problem = None
        if writer is not None and not _closed(writer):
            # A second Ctrl-C does not cut the close short, except once a writer process has
            # committed the rows and the status (WriterProcess: StoppedAgain, the evidence given up).
            try:
                with signals.deferred(reraise=False):
                    problem = recording.close("interrupted", None)
            except signals.StoppedAgain:
                pass
        kept = writer is not None and writer.has_run  # a writer process may have refused the store
        raise ReplayInterrupted(writer.run_id if kept else None, str(db) if kept else None, recorded(),
                                problem, (writer.closed_as or "running") if kept else "interrupted",
                                stopped_again=kept and getattr(writer, "stopped_again", False)) from exc
    if writer is None:
        return
    if isinstance(exc, TierdiagError):
        closing = None
        if not _closed(writer):
            with signals.deferred(reraise=False):
                closing = recording.close("failed", exc.one_line())
        # Still one line: the error, then where the partial run is (the count is what the file
        # holds, not what the engine got to). No run: the writer process refused the store
        # (damaged, busy, ...), the error as a RunWriter would have raised it.
        if writer.has_run:
            exc.hint = ((exc.hint + "; ") if exc.hint else "") + (
                f"run {writer.run_id} kept in {db} as {writer.closed_as or 'running'}, "
                f"{_requests(recorded())} recorded"
                + ("" if closing is None or closing is exc else f" ({closing.message})"))
    elif not _closed(writer):
        with signals.deferred(reraise=False):
            recording.close("failed", f"{type(exc).__name__}: {_first_line(exc)}")


def _result(stats, numbers: dict | None, recording, trace: Path, cfg: EngineConfig, *, first_arrival_ns: int,
            db: Path | None, run_name: str | None, report: ReadReport, data_plane: dict,
            storage_dir: Path | None, storage_bytes: int, wall_phases: dict, wall_s: float) -> ReplayResult:
    """The replay's closing numbers: a recorded run's span and TTFT percentiles as `summary` reads
    them back (`numbers`); unrecorded, the engine's own (its span ends at the last event)."""
    from tierdiag.diagnose.request.tokens import TokenSplit  # the close's, not the replay's start-up

    ttft_q = {q: _percentile(stats.ttft_ns, q) for q in (0.5, 0.9, 0.99)}
    # The run's span starts at its first arrival (a sliced trace starts late).
    span_ns = max(stats.virtual_end_ns - first_arrival_ns, 0)
    if numbers is not None:
        span_ns = numbers["span_ns"]
        if numbers["ttft_ns"] is not None:
            ttft_q = dict(zip((0.5, 0.9, 0.99), map(ns_to_ms, numbers["ttft_ns"])))
    writer = recording.writer
    return ReplayResult(
        run_id=writer.run_id if writer else None, db_path=str(db) if writer else None,
        run_name=writer.name if writer else (run_name or trace.stem), status="complete",
        num_requests=stats.requests_finished, num_rejected=stats.requests_rejected,
        **asdict(TokenSplit.of(stats)), load_backs=stats.load_backs,
        load_back_bytes=stats.load_back_bytes, load_back_p50_ms=_percentile(stats.load_back_ns, 0.5),
        load_back_p99_ms=_percentile(stats.load_back_ns, 0.99), skipped=dict(stats.skipped),
        evictions=dict(stats.evictions), ttft_p50_ms=ttft_q[0.5], ttft_p90_ms=ttft_q[0.9], ttft_p99_ms=ttft_q[0.99],
        virtual_s=span_ns / 1e9, prefill_busy_share=stats.busy_ns / cfg.dp / span_ns if span_ns else 0.0,
        wall_s=wall_s, bad_lines=report.bad_lines, first_bad=list(report.first_bad),
        unknown_keys=sorted(report.unknown_keys), data_plane=data_plane,
        storage_dir=str(storage_dir) if storage_dir is not None else None,
        storage_bytes=storage_bytes, writer=recording.kind if writer is not None else None,
        wall_phases=wall_phases,
        rejected=dict(sorted(stats.rejected.items(), key=lambda kv: -kv[1])),
    )


def _temporary_storage(root: str | None) -> Path:
    import tempfile

    from tierdiag.store.storage_dir import storage_root

    parent = None
    if root:
        parent = storage_root("", root)
        parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="tierdiag-storage-", dir=parent))


def _remove_unowned_storage(folder: Path) -> None:
    """Remove a run's storage folder no run owns, and the storage root above it where that is
    left empty (a root holding other runs' folders stays)."""
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
    with contextlib.suppress(OSError):  # not empty (other runs' pages), or gone: left as it is
        folder.parent.rmdir()


def _close_storage(engine, temporary: Path | None) -> int:
    """Close the storage tier's files; returns their size. A temporary folder is removed."""
    tier = getattr(engine, "storage", None)
    size = tier.disk_bytes() if tier is not None else 0
    if tier is not None:
        tier.close()
    if temporary is not None:
        import shutil  # here: shutil loads bz2 and lzma, for a replay that has a folder to remove

        shutil.rmtree(temporary, ignore_errors=True)
    return size
