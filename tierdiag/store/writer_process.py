"""The run store's writer in a process of its own, beside the engine.

A replay on a machine with a core to spare hands its recorder's rows to a second process,
which owns the ordinary `RunWriter` (writer.py) and does everything DuckDB and Arrow: the
conversion of the values, the inserts, the checkpoint each close makes, the run evidence at the
end and the closing numbers the replay prints. The engine's process pays only for encoding its
events as they come (the recorder's compiled row buffers) and writing the bytes onto a pipe (the
writer decodes them into Arrow arrays), and imports neither duckdb nor pyarrow.

    engine process                          writer process (python -c ..., a clean interpreter)
    Recorder ── rows, encoded ──pipe──►     reader thread ─► columns ─► RunWriter.take (Arrow)
             ◄── opened / error / finished ─ writes pending rows every WRITE_EVERY_S, one transaction

Which path a replay takes (`writer_mode`): TIERDIAG_WRITER=process|inline when set; otherwise
the process only where it pays: a core is idle for it (two usable CPUs or more, and at most
CPUs - 1.5 other tasks runnable as the replay starts), and the replay is not a sweep or advise worker (a
multiprocessing child or a Ray worker: they run one replay per core already). Else inline.

The contract is the inline writer's, unchanged: the process starts once the trace's first line
is read (its own start-up, ~0.3 s, overlaps the engine's import and set-up and is never waited
for: the store is opened by a message the engine does not wait on), the runs row records the engine's pid,
readers can open the file between writes (at most every WRITE_EVERY_S, or TIERDIAG_FLUSH_EVERY_S
when smaller), each write is one transaction, and `recorded` is the request rows committed.
Errors the writer meets (a damaged, foreign, busy or unwritable --db, a full disk) come back
as the same exceptions, raised in the engine's process at its next hand-over or at the close.

Signals: the writer runs in a process group of its own and ignores SIGINT and SIGTERM, so a
Ctrl-C of the terminal (or a SIGTERM to the group) reaches the engine's process only, which
decides: it closes the run as interrupted through the writer, as inline. If the engine's
process dies (kill -9), the writer sees the pipe close, commits what it was handed and exits,
leaving the run `running` with a pid that is gone: readers show it as interrupted, as after a
kill -9 of an inline replay. If the writer dies, the engine's process says so in one line (exit
4) and closes the run as failed itself, keeping every row that was committed.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping

from tierdiag import signals
from tierdiag.errors import ConfigError, StoreError
from tierdiag.store.frames import EOF, out_of_band, read_frame, send_frame, send_stop  # noqa: F401 - EOF: the engine's side reads it too
from tierdiag.store.schema import new_run_id  # noqa: F401 - the engine's process names its run by it

ENV = "TIERDIAG_WRITER"
MODES = ("process", "inline")
# The writer process commits what it was handed at most this often. Each write costs ~25-35 ms
# of the writer's CPU whatever its size (the transaction and its checkpoint: DuckDB 2.0.1, the
# conversation trace's ~9k rows a write at 0.25 s) beside ~2 us a row: writing the conversation
# replay's rows every 4th hand-over instead of every one took 1.05 s of the writer's CPU against
# 1.35 s (benchmarks/README.md), CPU it takes from the engine's through the shared machine. The
# close then writes at most a second's rows (~40k, ~2 us each).
WRITE_EVERY_S = 1.0
# The first writes come sooner, the interval doubling from this up to WRITE_EVERY_S: a replay's
# close writes everything since the last write, on the path the replay waits for, and a replay
# of a few seconds (the Mooncake synthetic trace: ~1 s of engine) otherwise had no write before
# its close, which then inserted every row (measured: close 0.19 -> 0.10 s, the last write
# 70-88 -> 20-30 ms; the conversation trace's close is unchanged: its writes come at 0.2, 0.6,
# 1.4, 2.4 s, then every second, where they came at 1, 2, 3 s: one more of ~25 ms on the writer's
# core in its first three seconds).
FIRST_WRITE_S = 0.2
# ... except in a small run whose late writes will come (writer_serve.py `_Serve.interval`): while
# under LATE_FROM of its trace's requests are handed over, with fewer of them than VACUUM_ROWS and
# no table of as many rows, and fewer rows pending (all tables) than this, a write waits for the
# longest interval (STRETCH_MOST_S, or the flush interval where smaller: the contract's "at least
# this often"). A write costs ~20-25 ms of the writer's CPU whatever its rows (its inserts' binds,
# its checkpoint's pass over every column; 1 row a table, 3 writes: 58-65 ms), and the
# conversation trace's early write (~27 % of its rows, 0.2-0.4 s in) was merged into the next by
# that one's vacuum, its rows compressed twice; the late writes (50, 75, 87.5 %) leave the close as
# little as before (issue 41; benchmarks/README.md, session 36 h46writes). A row group's rows
# (~15 MB of Arrow at the conversation trace's ~120 bytes a row); a large run, or one with more
# rows pending, is written as before.
SMALL_PENDING_ROWS = 122_880
# A write that took longer than this share of the interval stretches the next interval to its
# time over the share (writer_serve.next_interval), up to the replay's flush interval
# (TIERDIAG_FLUSH_EVERY_S, 5 s by default: the contract's "at least this often"). A write's cost
# grows with the store: each write's checkpoint rewrites the row group its rows were appended to
# (a table's last, up to 122,880 rows), so at 200k synth requests a write took ~0.1-0.15 s of CPU
# against ~25-30 ms on the conversation trace; that run's rows written in 56 writes took 8.0 s of
# CPU, in 14 writes 4.9 s (benchmarks/writes_by_count.py; README.md, session 22 h41wcpu). A quiet
# conversation replay's writes stay under the share: its interval is WRITE_EVERY_S as before.
WRITE_COST_SHARE = 0.1
# ... and the stretch stops at STRETCH_MOST_S where the flush interval is longer: a late write of
# a 1M-request replay carried up to 5 s of rows, and its vacuuming checkpoint (on a writer whose
# resident floor those pending rows raise) set the run's peak: 935-1,005 MB over four quiet runs
# (load 1-4.5), one past 1 GB, against 917 / 920 MB with writes stretched to 2 s at most, for
# ~+3 % of the two processes' CPU (issue 41's 1M row; benchmarks/README.md, session 33 h43m1).
# Writing more often than the flush interval keeps its contract ("at least this often").
STRETCH_MOST_S = 2.0
# Every VACUUM_EVERY-th write's checkpoint merges the small row groups the writes before it left
# (DuckDB's vacuum: writer._vacuum); the others' leave them: a write's checkpoint vacuuming
# rewrites the rows it merges (as a binary counter carries). The conversation trace's rows at a
# quiet engine's pace (benchmarks/writer_writes.py, three paces, 3 writes each): the writes' CPU
# 0.86 -> 0.67 s (-22 %), the files 22.0 -> 24.5 MB (+11 %: row groups left unmerged, and blocks a
# vacuum freed, which the store's next writes reuse); every 4th write: -25 %, +27 %. The close
# never vacuums.
VACUUM_EVERY = 2
# ... and, once a table of the run holds a row group of DuckDB's (122,880 rows), only once the rows
# written since the last vacuum fill one in the table with the most, or VACUUM_MOST_WRITES writes
# have left theirs (`vacuum_due`, writer_serve.py): a vacuum rewrites the table's trailing row
# groups it merges (the last full one's partial successor included), so merging a row group's worth
# of small ones at once rewrites each row fewer times than merging every two writes' (issue 41: the
# writes' checkpoints were 42 % of the writer's CPU at 200k synth requests, about half of it the
# vacuum; benchmarks/README.md, session 29 h41m1h and session 30 h41m1i). A quiet 1M replay's writes
# carry ~5 s of rows each, a row group's worth and more: they vacuum every VACUUM_EVERY-th write as
# before; a loaded machine's carry a few thousand rows and vacuum less often (24 writes of ~20k
# evictions each into a 400k-request store, benchmarks/write_memory.py: the writes' CPU 7.49 -> 5.82
# s, medians; the writer's peak ~50-65 MB higher on a 1M run, lead session 30). A run whose tables
# stay short of a row group (the conversation trace, a few thousand synth requests) is written as
# before: every VACUUM_EVERY-th write vacuums.
VACUUM_ROWS = 122_880
VACUUM_MOST_WRITES = 8
# The writer process holds DuckDB's buffer-managed memory at this through the run's writes
# (store/duckdb_core.py `hold_memory`: what passes it spills into a folder of its own in the
# system's temporary directory, removed as the process exits), the close's last write included,
# lifted for the close's queries (RunWriter.finish: the evidence's sections run as before). A
# 1M-request replay's vacuuming checkpoints held DuckDB's merged row groups (IN_MEMORY_TABLE, up
# to ~260 MB: 3 row groups of its widest table, `requests`, 69 columns) and the tables' cached
# blocks (~75 MB) on top of the process's ~500-850 MB: the run's peak (issue 41's 1M row;
# benchmarks/README.md, session 34 h44peak: DuckDB's 327-338 MiB in a run held at 127 MiB). A
# checkpoint whose pinned memory alone passes the limit fails and invalidates the database:
# measured on 30k-request writes into a 1M-request store, 100 MB checkpointed, 32 MB failed.
# Held from the first write of a trace of VACUUM_ROWS requests or more, or from the first at which
# one of the run's tables has as many rows (where writes merge whole row groups); a smaller run's
# writes run without it: held from the open, the
# conversation trace's probed replay paid ~0.14 s of wall and ~0.2 s of CPU for no lower peak (its
# largest table 60k rows; session 34's lead section, 4 of 4 interleaved pairs).
WRITE_MEMORY_LIMIT = 128 << 20
BATCH_ROWS = 8_192  # the recorder hands rows over this often with a writer process (inline: 250k)
CHILD_ENTRY = "from tierdiag.store.writer_serve import main; main()"
PIPE_BYTES = 1 << 20  # the request pipe's buffer (Linux caps it at /proc/sys/fs/pipe-max-size)
# The most bytes of requests the writer holds read from the pipe and not yet taken
# (writer_serve.Inbox): past it the pipe fills and the engine's hand-overs wait for the writer.
# On a quiet machine the writer keeps up and the inbox stays far below it (benchmarks/README.md,
# session 23 h41m1c); on a loaded one the writer's memory is bounded instead of the engine's wall.
INBOX_BYTES = 64 << 20
SPARE_CORE_LOAD = 1.5  # auto: a writer process when the other runnable work is at most CPUs - this
REAP_WAIT_S = 60.0  # how long the engine's process waits for the writer to exit after the close
# After a STOP (a second signal once an interrupted run's status is committed), how long the
# engine's process waits for the writer to leave before it kills it: the writer leaves at once
# from its reader thread, or, past the evidence, once its answer and the file's let-go are done.
STOP_WAIT_S = 5.0


def exits_within(proc: subprocess.Popen, timeout_s: float) -> bool:
    """Whether the child `proc` has exited or exits within `timeout_s` (it is not reaped here).
    Woken by the exit itself, through a pidfd (Linux 5.3+): `Popen.wait(timeout=...)` polls
    instead, sleeping 0.5, 1, 2, ... up to 50 ms between looks, so a writer that exited ~30 ms
    after the close was seen ~20 ms late (median of 20, a 30 ms child), on the replay's exit
    tail (issue 41). Where no pidfd can be opened, that polling wait as before."""
    if proc.returncode is not None:
        return True
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfd_open (not Linux, an older kernel), or refused
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True
    try:
        watch = select.poll()  # not select.select: a descriptor past FD_SETSIZE (1024) is refused there
        watch.register(fd, select.POLLIN)
        ready = watch.poll(max(timeout_s, 0.0) * 1000.0)
    finally:
        os.close(fd)
    return bool(ready)


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _in_a_worker() -> bool:
    """A multiprocessing child (the sweep's and advise's process workers) or a Ray worker: each
    runs one replay per core already, so a writer process would only take a core from another."""
    mp = sys.modules.get("multiprocessing")
    if mp is not None and mp.parent_process() is not None:
        return True
    ray = sys.modules.get("ray")
    return bool(ray is not None and getattr(ray, "is_initialized", lambda: False)())


def _busy_elsewhere() -> float:
    """Work competing for the cores as the replay starts: the tasks runnable now other than this
    one (/proc/loadavg's running count less one), else the 1-minute load average. Not the load
    average where the count is there: a script's or a benchmark's previous replay, already
    finished, keeps it near 1 for a minute, and would have every later replay written inline."""
    try:
        with open("/proc/loadavg", encoding="ascii") as fh:
            return max(0, int(fh.read().split()[3].split("/")[0]) - 1)
    except (OSError, ValueError, IndexError):
        try:
            return os.getloadavg()[0]
        except OSError:
            return 0.0


def writer_mode() -> str:
    """'process' or 'inline', by TIERDIAG_WRITER (process | inline | auto) or the rule above."""
    raw = os.environ.get(ENV, "").strip().lower()
    if raw in MODES:
        return raw
    if raw not in ("", "auto"):
        raise ConfigError(f"{ENV}={os.environ[ENV]!r} must be process, inline or auto")
    cpus = _usable_cpus()
    # A core must be idle for the writer: on a machine already running other work the two
    # processes share the engine's core, and the replay is slower than inline (measured on the
    # 2-core box under load average ~2-3: 6.3 s against 5.8 s for the conversation trace).
    spare = cpus >= 2 and _busy_elsewhere() <= cpus - SPARE_CORE_LOAD
    return "process" if spare and not _in_a_worker() else "inline"


# --------------------------------------------------------------------------- the engine's side


def child_argv(entry: str | None = None) -> list[str]:
    return [sys.executable, "-c", entry or CHILD_ENTRY]


class WriterProcess:
    """The engine's handle on a writer process; the same surface as RunWriter where the replay
    uses it (`append`, `finish`, `recorded`, `closed_as`, `run_id`, `name`), plus `has_run`
    (the runs row is known written) and `numbers` (writer.closing_numbers, after a complete close).

    `start()` launches the process (nothing of the store is touched), `open(...)` hands it the
    run to create and returns at once; `close()` reaps the process (always call it)."""

    def __init__(self) -> None:
        self.run_id: str | None = None
        self.name: str | None = None
        self.db_path: Path | None = None
        self.recorded = 0
        self.closed_as: str | None = None
        self.has_run = False
        self.numbers: dict | None = None
        self.numbers_error: BaseException | None = None
        # An interrupted close: its status committed (the writer's "status_committed"), and
        # whether a second signal then stopped the close before its evidence was stored.
        self.committed_as: str | None = None
        self.stopped_again = False
        self._open_error: BaseException | None = None
        self._dead: StoreError | None = None
        self._how = "stopped"  # how the writer died (`_died`), for the line
        # The store file was not there (or empty) when the run was asked for: a file the writer
        # made and died before putting a run in is this command's to remove (`_after_death`).
        self._made_file = False
        self._no_run_found = False  # the writer died, and the file holds no run of it (`_after_death`)
        self._proc: subprocess.Popen | None = None

    @classmethod
    def start(cls, entry: str | None = None) -> "WriterProcess":
        """`entry`: the child's `python -c` code, CHILD_ENTRY by default (a writer whose close
        computes nothing beyond the status); the replay's (app/writer_child.py) calls `main`
        with its close hook."""
        self = cls()
        # Its own process group: a Ctrl-C of the terminal, or a signal to the replay's group,
        # reaches the engine's process only. And it starts with SIGINT and SIGTERM blocked (a
        # signal mask survives exec), until `main` has them ignored: one sent to it alone while
        # its interpreter starts is dropped, never a KeyboardInterrupt there. Blocked here only
        # for the spawn: what arrives meanwhile is delivered to this process right after.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, signals.HANDLED)
        try:
            self._proc = subprocess.Popen(child_argv(entry), stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0,
                                          close_fds=True, process_group=0)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        self._out = self._proc.stdin.fileno()
        self._in = self._proc.stdout.fileno()
        try:
            import fcntl

            fcntl.fcntl(self._out, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        except (ImportError, AttributeError, OSError):
            pass  # the default 64 KiB buffer: hand-overs may wait a little more for the reader
        return self

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def open(self, db_path, *, run_id: str, name: str | None, trace_path: str, write_every_s: float,
             **kwargs: Any) -> None:
        """Ask the writer to create (or check and open) the store and write the runs row, as
        RunWriter(...) does; its answer is read at the next hand-over or at the close."""
        self.db_path = Path(db_path)
        self.run_id = run_id
        self.name = name or Path(trace_path).stem
        try:
            self._made_file = not (self.db_path.is_file() and self.db_path.stat().st_size > 0)
        except OSError:  # a name the system refuses: the writer says so (open_failed)
            self._made_file = False
        if kwargs.get("command_line") is None:
            kwargs["command_line"] = list(sys.argv)  # this process's, not the writer's
        kwargs.setdefault("pid", os.getpid())
        for key in ("config", "hardware", "data_plane"):
            # As RunWriter stores them (JSON, str() for the rest), and as plain values: a str
            # subclass such as torch's version would make the writer import torch to unpickle it.
            kwargs[key] = json.loads(json.dumps(dict(kwargs.get(key) or {}), sort_keys=True, default=str))
        args = {"db_path": str(db_path), "run_id": run_id, "name": name, "trace_path": trace_path, **kwargs}
        with signals.deferred():
            self._send(("open", {"writer": args, "write_every_s": min(write_every_s, WRITE_EVERY_S),
                                 "flush_every_s": write_every_s}))

    def append(self, tables: Mapping[str, Mapping[str, Any]]) -> None:
        """Hand the columns over (they are the writer's from the call on, as with RunWriter);
        first raise whatever the writer reported since the last hand-over."""
        self._check()
        self._send(("rows", tables))

    def append_rows(self, tables: Mapping[str, tuple[tuple[str, ...], Any]]) -> None:
        """Hand rows over as the recorder buffered them, {table: (field names, rows)}: a list of
        row tuples, or the bytes its compiled buffer encoded them into as they came
        (writer.table_columns reads either), pickled before this returns (the caller may clear
        its buffers then); the writer makes the columns, on its own core. On the conversation
        trace the engine's flushes cost ~0.38 s of its CPU zipping and pickling columns, ~0.28 s
        pickling the row tuples (benchmarks/README.md). Not marshal, though faster than pickle:
        it writes a numpy integer as its bytes, silently."""
        self._check()
        self._send(("row_tuples", out_of_band(tables)))

    def _check(self) -> None:
        """Raise whatever the writer reported since the last hand-over."""
        self._poll()
        if self._open_error is not None:
            raise self._open_error
        if self._dead is not None:
            raise self._dead

    def finish(self, status: str, *, error: str | None = None, write_pending: bool = True,
               trace_sha256: str | None = None, num_requests: int | None = None) -> None:
        """RunWriter.finish in the writer; waits for it (and for the evidence and, when complete,
        the closing numbers). A writer that died: the run is closed as failed from here."""
        del num_requests
        if self._open_error is not None:
            return  # no run was created: nothing to close
        with signals.deferred():
            if self._dead is None:
                try:
                    self._send(("finish", {"status": status, "error": error, "write_pending": write_pending,
                                           "trace_sha256": trace_sha256}))
                    self._wait_finished()
                except _Died:
                    pass
                if self._dead is None:
                    return
            if self.closed_as is not None:
                return  # the writer had closed the run before it died (`_after_death`): kept as it is
            if status != "failed" or write_pending:
                raise self._dead
            self._after_death(status, error)

    def _after_death(self, status: str, error: str | None) -> None:
        """The writer died before it answered the close: close its run as `status` from here,
        with the request rows committed, unless it had closed the run already (its status
        committed, then it died computing the evidence or answering): then the run is kept as it
        closed it, every row with it, and the line says so. No run in the file: where this
        command made the file, it is removed (only DuckDB's header or the schema are in it)."""
        from tierdiag.store.writer import close_unclosed_run_row, remove_runless_store

        where = self.db_path
        held = close_unclosed_run_row(self.db_path, self.run_id, status, error)
        if held is None:
            self._no_run_found = True
            said = "nothing was recorded"
            if self._made_file:
                removed = remove_runless_store(self.db_path)
                if removed:
                    said += f"; {where}, which it had begun, was removed"
                elif removed is False:
                    said += f"; {where}, which it had begun, was left with no run in it"
            self._dead.hint = said
            return
        self.has_run = True
        self.recorded = held.requests
        self.closed_as = held.status
        if held.status != status:
            self._dead.message = (f"the writer process of {where} (pid {self.pid}) {self._how} after it had closed the run"
                                  + ("" if held.evidence else
                                     ", before its evidence was stored: the first reader that can write the store computes and stores it"))

    @property
    def no_run(self) -> bool:
        """Known to have recorded no run: the writer refused the store, or died and the file
        holds no run of it (not merely not told yet: `has_run`)."""
        return self._open_error is not None or self._no_run_found

    def _answered(self) -> bool:
        return self.closed_as is not None or self._dead is not None or self._open_error is not None

    def _wait_finished(self) -> None:
        """Read the writer's answers to `finish` until it has closed the run. Once it says an
        interrupted run's status is committed, a second SIGINT/SIGTERM stops the close there
        (signals.second_stops): the writer is told to leave (STOP) and reaped, the run stays
        interrupted with its rows, its evidence not stored; StoppedAgain goes on up."""
        while not self._answered():
            if self.committed_as is None:
                self._take_reply(read_frame(self._in))
                continue
            try:
                with signals.second_stops():
                    while not self._answered():
                        self._take_reply(read_frame(self._in))
            except signals.StoppedAgain:
                self._stop_after_commit()
                raise
            return

    def _stop_after_commit(self) -> None:
        """A second signal after the status was committed: STOP the writer, reap it (killed past
        STOP_WAIT_S), and keep the run as committed. Where the writer had answered already, its
        answer stands (the evidence was stored)."""
        proc = self._proc
        if self.closed_as is None:
            self.closed_as = self.committed_as
            self.stopped_again = True
        if proc is None:
            return
        try:
            send_stop(self._out)
        except OSError:
            pass  # the writer is gone already
        self._proc = None
        _close_pipes(proc)
        self._reap(proc, STOP_WAIT_S)

    def close(self, *, wait: bool = True) -> None:
        """End the pipe and reap the process (it exits once it has read to the end); kill it
        only if it is still there after REAP_WAIT_S (a reader holding the file all that time).
        `wait` False, once the run is closed (the writer answered once everything was committed:
        only the file's checkpoint and let-go and its exit are left): reaped at this process's
        exit instead (atexit), for a caller that ends right after and prints its result first
        (the CLI's replay; issue 41). Reaped either way before the process ends: a command after
        it finds the file let go of."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        _close_pipes(proc)
        if not wait and self.closed_as is not None and self._dead is None:
            import atexit

            atexit.register(self._reap, proc)
            return
        self._reap(proc)

    @staticmethod
    def _reap(proc: subprocess.Popen, wait_s: float | None = None) -> None:
        """Wait for `proc` to exit (REAP_WAIT_S unless told), killing it past that."""
        if not exits_within(proc, REAP_WAIT_S if wait_s is None else wait_s):
            proc.kill()
        proc.wait()

    # -- the pipe

    def _send(self, msg) -> None:
        try:
            send_frame(self._out, msg)
        except (BrokenPipeError, OSError):
            self._died()
            raise self._dead from None

    def _poll(self) -> None:
        """Take every reply waiting, without blocking."""
        while self._dead is None and self._open_error is None:
            try:
                ready, _, _ = select.select([self._in], [], [], 0)
            except (OSError, ValueError):
                ready = [self._in]
            if not ready:
                return
            try:
                self._take_reply(read_frame(self._in))
            except _Died:
                return

    def _take_reply(self, msg) -> None:
        if msg is EOF:
            self._died()
            raise _Died
        kind, arg = msg
        if kind == "opened":
            self.has_run = True
        elif kind == "open_failed":
            self._open_error = arg
            raise arg
        elif kind == "error":
            raise arg
        elif kind == "status_committed":
            self.recorded = arg["recorded"]
            self.committed_as = arg["status"]
        elif kind == "finished":
            self.recorded = arg["recorded"]
            self.closed_as = arg["closed_as"]
            self.numbers = arg["numbers"]
            self.numbers_error = arg["numbers_error"]
        else:
            raise RuntimeError(f"the store's writer process answered {kind!r}")

    def _died(self) -> None:
        if self._dead is not None:
            return
        how = "stopped"
        if self._proc is not None:
            try:
                code = self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
            if code is not None and code < 0:
                try:
                    how = f"was killed by {signal.Signals(-code).name}"
                except ValueError:
                    how = f"was killed by signal {-code}"
            elif code is not None:
                how = f"exited with status {code}"
        where = self.db_path if self.db_path is not None else "the store"
        self._how = how
        self._dead = StoreError(f"the writer process of {where} (pid {self.pid}) {how} before the run was closed")


def _close_pipes(proc: subprocess.Popen) -> None:
    """End the request pipe (the writer reads to its end) and let the replies' go."""
    for stream in (proc.stdin, proc.stdout):
        try:
            stream.close()
        except OSError:
            pass


class _Died(Exception):
    """The writer process is gone (its pipe ended); `_dead` says how."""
