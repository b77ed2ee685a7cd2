"""The writer process's side (store/writer_process.py is the engine's): `python -c CHILD_ENTRY`
(or app/writer_child.py's entry, which passes the close hook), the request pipe on stdin, the
replies on stdout. It owns the ordinary RunWriter and commits what it is handed at most every
WRITE_EVERY_S (FIRST_WRITE_S at first, doubling), more often as the run nears its end (the
trace's lines counted: LATE_FROM), and closes the run when told."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from tierdiag import signals
from tierdiag.store.frames import EOF, STOP, loads, portable, read_raw, send_frame
from tierdiag.store import writer_process
from tierdiag.store.writer_process import (FIRST_WRITE_S, INBOX_BYTES, SMALL_PENDING_ROWS, VACUUM_EVERY,
                                           VACUUM_MOST_WRITES, VACUUM_ROWS, STRETCH_MOST_S, WRITE_COST_SHARE,
                                           WRITE_EVERY_S)

# The late writes: once LATE_FROM of the trace's requests have been handed over (their request
# rows taken), the rows pending are written whatever the interval says when they are as many as
# those still to come, while at least LATE_LEAST of the trace's are (`late_write_due`). What is
# pending at the engine's end is written by the close, on the path the replay waits for; by the
# interval alone that was anything from none to a whole interval's rows (the conversation
# trace's, quiet: 2 writes in the run, the 2nd began just before the engine's end, which waited
# for it and for a last write of ~30 % of the rows; issue 41, benchmarks/README.md, session 23
# h41close5). Where the interval's writes already leave less, they add none; a long run's (200k
# synth requests: ~17 writes 5 s apart) gets at most one more near its end.
LATE_FROM = 0.5
LATE_LEAST = 0.05


def main(after_commit=None, preload: tuple[str, ...] = (), while_recording=None) -> None:
    """The writer process: `python -c CHILD_ENTRY` (or the caller's entry, which passes
    `after_commit`, RunWriter.finish's hook, the modules it needs, imported once the store is
    open, while the engine runs rather than in the close, and `while_recording(run)`, called then
    with the run's arguments (RunWriter's: trace_path, trace_sha256, config, ...), to start on a
    thread what the hook can prepare before the rows are all there; what it returns, if not None,
    is handed every batch of rows taken, as RunWriter.take made them, and None once the run is
    being closed: no row comes after), the request pipe on stdin, replies on stdout."""
    for sig in signals.HANDLED:
        signal.signal(sig, signal.SIG_IGN)  # the engine's process decides (see the module docstring)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, signals.HANDLED)  # blocked since the spawn; now ignored
    reply_fd = os.dup(1)
    os.dup2(2, 1)  # a stray print must not corrupt the replies
    import gc

    # Many short-lived objects (the unpickled columns), few long-lived ones: as in the replay.
    gc.set_threshold(50_000, 20, 100)
    # The reader thread drains the pipe while this one converts and inserts: hand it the GIL
    # sooner than the default 5 ms, so that the engine never waits on a full pipe for long.
    sys.setswitchinterval(0.001)
    inbox = Inbox(INBOX_BYTES)
    serve = _Serve(inbox, reply_fd, after_commit=after_commit, preload=preload, while_recording=while_recording,
                   opened=_settle)
    threading.Thread(target=_read_requests, args=(0, inbox, serve.stop), name="requests", daemon=True).start()
    code = 0
    try:
        serve.run()
    except BaseException as exc:  # noqa: BLE001 - a bug here: raised in the engine's process, as one
        serve.reply(("error", portable(exc)))  # line there (the traceback in a note, for --debug)
        code = 1
    if serve.writer is not None:
        serve.writer.remove_spill()  # the spill folder of the writes' memory limit (os._exit closes nothing)
    # Everything is committed and answered: leave without the interpreter's teardown of duckdb,
    # pyarrow and the heap (half a second the engine's process would wait for, reaping this one).
    sys.stderr.flush()
    os._exit(code)


def _settle() -> None:
    """Once the store is open and what runs while recording has started: everything the process
    made so far (its modules, the close's preloads, the store's writer) lives to its exit, so it
    is left out of every collector pass from now on (`gc.freeze`), and the collector runs again
    where the entry held it off through its imports (app/writer_child.py)."""
    import gc

    gc.freeze()
    gc.enable()


def _read_requests(fd: int, inbox, stop=None) -> None:
    """The reader thread: each frame's bytes into the inbox as they come, EOF at the pipe's end.
    A full inbox (`Inbox.put`) holds this thread, so the pipe fills and the engine's next
    hand-over waits: a writer behind the engine holds at most INBOX_BYTES of requests. STOP is
    not queued: `stop()` is called here (`_Serve.stop`: it ends the process where the close
    allows it, else the STOP is dropped)."""
    while True:
        body = read_raw(fd)
        if body == STOP:
            if stop is not None:
                stop()
            continue
        inbox.put(EOF if body is None else body)
        if body is None:
            return


def trace_lines(path: str | None) -> int | None:
    """The lines of the trace file at `path` (its requests, near enough: a blank line or one the
    reader skips counts too; the last line counts without its newline); None where `path` is not
    a regular file that can be read (a pipe the engine read: no late writes). ~1.5 ms on the
    conversation trace, ~0.13 s for 1M synth requests (250 MB, in the page cache). The same
    file's count the writer process is making (`_Serve._count_trace`) is waited for and taken,
    not made again (diagnose/run/story_rows.py's `start` asks it a moment after: issue 41)."""
    for shared in list(_SHARED):
        if path and shared.path == path:
            shared.done.wait()
            if shared.identity is not None and shared.identity == _identity(path):
                return shared.lines
    return _count_lines(path)[1]


class _SharedCount:
    """A count of a trace's lines the writer process makes once (`_Serve._count_trace`, on a
    thread): what `trace_lines` hands whoever else asks that file's, once `done`; `identity` is
    the file's as counted (None: not one it could count)."""

    def __init__(self, path: str | None):
        self.path = path
        self.done = threading.Event()
        self.identity: tuple | None = None
        self.lines: int | None = None


_SHARED: list[_SharedCount] = []  # at most one: the run's trace, in the writer process


def _identity(path: str) -> tuple | None:
    """A file as a count knows it: a changed or another file counts anew."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _count_lines(path: str | None) -> tuple[tuple | None, int | None]:
    """(the file's identity, its lines) as `trace_lines` says them; (None, None) where it cannot
    count them."""
    import stat

    if not path:
        return None, None
    try:
        # Non-blocking: a named pipe's open would wait for a writer (the engine read it already).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except (OSError, ValueError):
        return None, None
    try:
        with open(fd, "rb", closefd=True) as fh:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None, None
            buf = bytearray(1 << 20)
            lines = 0
            last = 10  # an empty file: no line
            while True:
                n = fh.readinto(buf)
                if not n:
                    break
                lines += buf.count(b"\n", 0, n)
                last = buf[n - 1]
    except (OSError, ValueError):
        return None, None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns), lines + (last != 10)


def late_write_due(taken: int, expected: int | None, taken_at_write: int) -> bool:
    """Whether a late write is due: of the `expected` requests (the trace's lines; None: unknown,
    never), `taken` request rows have been taken, at least LATE_FROM of them, at least LATE_LEAST
    of them still to come, and what is pending (taken since the last write began:
    `taken_at_write`) is at least what is to come. With no other write, at 50, 75, 87.5 and
    93.75 %: each write halves the rest, so the close writes a sixteenth, and each late write is
    done long before the engine's end (it carries what came since the last, not most of the
    run); past them, what is left is the close's (a write has a fixed cost: ~25 ms of CPU on the
    conversation trace, about what ~5 % of its rows cost)."""
    if not expected or expected <= 0:
        return False
    rest = expected - taken
    return LATE_FROM * expected <= taken and rest >= LATE_LEAST * expected and taken - taken_at_write >= rest


class Inbox:
    """The requests read from the pipe, waiting for the writer's main thread: a queue bounded in
    bytes (issue 41: a writer that falls behind the engine, on a loaded machine, held every frame
    handed to it: a 1M run at load ~3-4 peaked at 1,627-1,728 MB against 1,137 MB quiet). `put`
    waits while the frames held and this one would pass `limit`, so the reader thread stops
    draining the pipe and the engine's hand-overs wait on it (back-pressure); a frame is always
    taken into an empty inbox whatever its size, and EOF at once (it weighs nothing), so nothing
    waits forever. The `get`, `put` and `empty` of the queue.SimpleQueue it replaces (`get`
    raises queue.Empty at its timeout). `most` (bytes held at once), `waits` and `waited_s` (the
    reader's time held) say what the bound did."""

    def __init__(self, limit: int):
        import collections
        import threading

        self.limit = limit
        self._items: collections.deque = collections.deque()
        self._bytes = 0
        self._cond = threading.Condition(threading.Lock())
        self.most = 0
        self.waits = 0
        self.waited_s = 0.0

    @staticmethod
    def _size(item) -> int:
        return 0 if item is EOF else len(item)

    def put(self, item) -> None:
        size = self._size(item)
        with self._cond:
            if self._items and self._bytes + size > self.limit:
                self.waits += 1
                t0 = time.monotonic()
                while self._items and self._bytes + size > self.limit:
                    self._cond.wait()
                self.waited_s += time.monotonic() - t0
            self._items.append(item)
            self._bytes += size
            self.most = max(self.most, self._bytes)
            self._cond.notify_all()

    def get(self, timeout: float | None = None):
        import queue

        with self._cond:
            if not self._items and not self._cond.wait_for(lambda: self._items, timeout):
                raise queue.Empty
            item = self._items.popleft()
            self._bytes -= self._size(item)
            self._cond.notify_all()
            return item

    def empty(self) -> bool:
        return not self._items

    def held(self) -> int:
        """Bytes held now."""
        return self._bytes


def vacuum_due(writes: int, rows: int, total: int) -> bool:
    """Whether a write's checkpoint vacuums: `writes` the writes since the last vacuuming one (this
    one counted), `rows` the most rows of one table they carry, `total` the most rows of one table
    in the run with this write's (writer_process.VACUUM_ROWS). A run whose tables are all short of
    a row group vacuums every VACUUM_EVERY-th write as before (its file is a few row groups a
    table: merging fewer of them grew the conversation trace's file 10.2 -> 16.3 MB)."""
    if writes < VACUUM_EVERY:
        return False
    return total < VACUUM_ROWS or rows >= VACUUM_ROWS or writes >= VACUUM_MOST_WRITES


def next_interval(every: float, every_max: float, most: float, took: float) -> float:
    """The interval before the next write, after one that took `took` seconds: doubled up to
    `every_max`, or `took / WRITE_COST_SHARE` where that is longer, up to `most` (and never
    shorter than the doubled interval: `most` >= `every_max`)."""
    doubled = min(2 * every, every_max)
    return max(doubled, min(took / WRITE_COST_SHARE, most))


class _Serve:
    def __init__(self, inbox, reply_fd: int, *, after_commit=None, preload: tuple[str, ...] = (),
                 while_recording=None, opened=None):
        self.inbox = inbox
        self.opened = opened  # called once the store is open and the preparation started (`main`: _settle)
        self.reply_fd = reply_fd
        self.after_commit = after_commit
        self.preload = preload
        self.while_recording = while_recording
        self.on_rows = None  # what while_recording returned: handed each batch of rows taken
        self.writer = None
        self.failed = False  # a write failed and was reported: later rows are given up
        self.every = WRITE_EVERY_S  # the interval now: FIRST_WRITE_S at open, doubling to every_max
        self.every_max = WRITE_EVERY_S
        # The longest interval a costly write stretches it to (`write`): the replay's flush
        # interval (TIERDIAG_FLUSH_EVERY_S, "at least this often"), never under every_max.
        self.most = WRITE_EVERY_S
        self.last_write = time.monotonic()
        self.writes = 0  # asked for, the close's aside
        # Since the last vacuuming write (`vacuum_due`): the writes, and the rows taken by table.
        self.writes_since_vacuum = 0
        self.rows_since_vacuum: dict[str, int] = {}
        self.rows_taken: dict[str, int] = {}  # by table, the run's
        # The late writes (LATE_FROM): the trace's lines once counted (a thread of `open`;
        # None: unknown), the request rows taken, and how many of them the last write began with.
        self.expected: int | None = None
        self.taken = 0
        self.taken_at_write = 0
        self.rows_pending = 0  # of every table, taken since the last write (`interval`)
        # An interrupted run's status is committed and its evidence is being computed: a STOP
        # from the engine (a second signal) ends the process now (`stop`).
        self.stoppable = False
        self._stop_lock = threading.Lock()

    def reply(self, msg) -> bool:
        try:
            send_frame(self.reply_fd, msg)
            return True
        except OSError:
            return False  # the engine's process is gone: the end of the pipe says so too

    def run(self) -> None:
        import queue

        while True:
            timeout = None
            if self.writer is not None and not self.failed and self.writer.pending:
                timeout = max(0.0, self.last_write + self.interval() - time.monotonic())
            try:
                raw = self.inbox.get(timeout=timeout)
            except queue.Empty:
                self.write()
                continue
            if raw is EOF:
                self.engine_gone()
                return
            kind, arg = loads(raw)
            if kind == "open":
                if not self.open(arg):
                    return
            elif kind == "rows":
                self.rows(arg)
            elif kind == "row_tuples":  # WriterProcess.append_rows: rows to make columns of here
                from tierdiag.store.writer import table_columns

                self.rows({table: table_columns(table, fields, rows) for table, (fields, rows) in arg.items()})
            elif kind == "finish":
                if self.finish(arg):
                    return
            else:
                raise RuntimeError(f"the writer process was asked {kind!r}")

    def open(self, arg) -> bool:
        from tierdiag.store.writer import RunWriter

        try:
            # Every row after a failed write is given up (here `fail`, and RunWriter._give_up, as
            # inline), so a write may let its rows go as it inserts them (RunWriter.let_rows_go:
            # the rows held once through a write).
            self.writer = RunWriter(**arg["writer"], let_rows_go=True)
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the engine, as raised
            self.reply(("open_failed", portable(exc)))
            return False
        # What asks DuckDB's allocator to purge for the whole process (size_curves.read_ahead's
        # purge_from_now) asks on this writer's instance, open for the process's life, instead of
        # opening a second one (duckdb_core.purge_on).
        from tierdiag.store.duckdb_core import purge_on

        purge_on(self.writer.host)
        self.every_max = arg["write_every_s"]
        # a costly write stretches the interval up to the flush interval, at most STRETCH_MOST_S
        self.most = max(self.every_max, min(float(arg.get("flush_every_s", self.every_max)), STRETCH_MOST_S))
        self.every = min(FIRST_WRITE_S, self.every_max)
        self.last_write = time.monotonic()
        if not self.reply(("opened", None)):
            return False
        self._count_trace(arg["writer"].get("trace_path"))
        # What the close hook needs, imported now while the engine runs rather than in the
        # serial tail after it.
        import importlib

        for name in self.preload:
            importlib.import_module(name)
        if self.while_recording is not None:
            # Never in the way of the rows: what it cannot start, the close does itself.
            try:
                self.on_rows = self.while_recording(dict(arg["writer"]))
            except Exception as exc:  # noqa: BLE001 - said once on stderr; the close computes it all as before
                self._unprepared(exc)
        if self.opened is not None:
            self.opened()
        return True

    def _count_trace(self, path) -> None:
        """`expected`, the trace's lines, counted on a thread of its own (the trace is in the
        page cache: the engine has just read its first lines; a million requests' take ~0.13 s
        of CPU), so that the late writes know how far the run is."""
        shared = _SharedCount(path)
        _SHARED[:] = [shared]  # what else asks this file's lines meanwhile waits for this count

        def count() -> None:
            try:
                shared.identity, shared.lines = _count_lines(path)
            finally:
                shared.done.set()
            self.expected = shared.lines

        threading.Thread(target=count, name="tierdiag-trace-lines", daemon=True).start()

    def _unprepared(self, exc: BaseException) -> None:
        self.on_rows = None
        text = str(exc).strip()
        line = "".join(c if c.isprintable() else repr(c)[1:-1] for c in (text.splitlines()[0] if text else ""))
        sys.stderr.write(f"tierdiag: warning: run {self.writer.run_id}: nothing prepared while recording "
                         f"({type(exc).__name__}: {line[:200]})\n")

    def rows(self, tables) -> None:
        if self.writer is None or self.failed:
            return  # given up: the engine is told (or was) and closes the run as failed
        try:
            taken = self.writer.take(tables)
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)
            return
        if self.on_rows is not None:
            try:
                self.on_rows(taken)
            except Exception as exc:  # noqa: BLE001 - said once; the close computes it all as before
                self._unprepared(exc)
        for table, columns in taken.items():
            if columns:
                n = len(next(iter(columns.values())))
                self.rows_since_vacuum[table] = self.rows_since_vacuum.get(table, 0) + n
                self.rows_taken[table] = self.rows_taken.get(table, 0) + n
                self.rows_pending += n
        requests = taken.get("requests")
        if requests:
            self.taken += len(next(iter(requests.values())))
        since = time.monotonic() - self.last_write
        # Coalesced: with more handed over already (the engine's last rows and the close come
        # together), one transaction takes it all: each write's close is a checkpoint (0.05-0.2 s).
        # A late write waits for an empty inbox too (more rows there, or the close, are nearer
        # the end than this batch: it is due again at the next one).
        due = since >= self.interval() or late_write_due(self.taken, self.expected, self.taken_at_write)
        if due and (self.inbox.empty() or since >= 4 * self.every):
            self.write()

    def write(self) -> None:
        """Commit what is pending; its checkpoint merges the row groups where `vacuum_due` says
        (every VACUUM_EVERY-th write at most often, once a row group's worth of rows is there).
        The next comes after the interval (doubling from FIRST_WRITE_S to every_max), or, where
        this write took longer than WRITE_COST_SHARE of that, after this write's time over the
        share (never past `most`, the replay's flush interval): writer_process.WRITE_COST_SHARE."""
        self.writes += 1
        self.writes_since_vacuum += 1
        self.taken_at_write = self.taken
        most = max(self.rows_taken.values(), default=0)
        vacuum = vacuum_due(self.writes_since_vacuum, max(self.rows_since_vacuum.values(), default=0), most)
        if self.large():
            # A large run (a table with a row group's rows, or a trace of as many requests: held
            # from its first write, whose cached blocks met the trace's read-ahead's index build
            # otherwise): DuckDB's memory bounded from this write on (lifted for the close:
            # RunWriter.finish; writer_process.WRITE_MEMORY_LIMIT). Held already: nothing done.
            self.writer.hold_memory(writer_process.WRITE_MEMORY_LIMIT)
        t0 = time.monotonic()
        try:
            self.writer.write(vacuum=vacuum)
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)
        else:
            if not self.writer.pending:  # written (a reader holding the file keeps the rows pending)
                self.rows_pending = 0
                if vacuum:
                    self.writes_since_vacuum = 0
                    self.rows_since_vacuum.clear()
        self.last_write = time.monotonic()
        self.every = next_interval(self.every, self.every_max, self.most, self.last_write - t0)

    def large(self) -> bool:
        """A large run: a table with a row group's rows (VACUUM_ROWS), or a trace of as many
        requests (its memory held from its first write: `write`)."""
        return max(self.rows_taken.values(), default=0) >= VACUUM_ROWS or (self.expected or 0) >= VACUUM_ROWS

    def interval(self) -> float:
        """How long after the last write the next is due: `every`; or `most`, the longest, in a
        small run whose late writes will come (the trace's lines counted, under LATE_FROM of them
        handed over, not `large`) while the rows pending are under SMALL_PENDING_ROWS: each
        write costs ~20-25 ms of CPU whatever its rows, and the late writes leave the close as
        little as before (writer_process.SMALL_PENDING_ROWS). A trace read through a pipe
        (no count) is written as before."""
        expected = self.expected
        if (expected is not None and expected > 0 and self.taken < LATE_FROM * expected
                and self.rows_pending < SMALL_PENDING_ROWS and not self.large()):
            return max(self.every, self.most)
        return self.every

    def fail(self, exc: BaseException) -> None:
        self.failed = True
        self.reply(("error", portable(exc)))

    def finish(self, arg) -> bool:
        """Close the run; True once closed (the process then exits), False when it failed and
        the engine may ask again (as failed, giving up what is pending)."""
        if self.failed and arg["status"] != "failed":
            # A write failed and the engine was told, after it had asked for this close: it
            # reads that error first and asks again, as failed (as inline, where the failed
            # write stops the engine). Never a run closed as complete short of its rows.
            return False
        if self.on_rows is not None:
            # No row comes after this: what was prepared from them can be finished now, beside
            # the last rows' write, instead of in the close after it.
            try:
                self.on_rows(None)
            except Exception as exc:  # noqa: BLE001 - said once; the close computes it all as before
                self._unprepared(exc)
        after_commit = self.after_commit
        if arg["status"] == "interrupted":
            after_commit = self._stoppable_after(after_commit)
        try:
            # The in-memory connection is left to the process's exit (os._exit, after the answer).
            # The file left attached once all is committed: its checkpoint comes after the answer.
            self.writer.finish(arg["status"], error=arg["error"], write_pending=arg["write_pending"],
                               trace_sha256=arg["trace_sha256"], release=False, after_commit=after_commit,
                               let_go_later=True)
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)
            return False
        finally:
            with self._stop_lock:  # from here a STOP waits for the answer and the let-go
                self.stoppable = False
        numbers = numbers_error = None
        if self.writer.closed_as == "complete":  # read back by the close, on its connection
            numbers = self.writer.numbers
            if self.writer.numbers_error is not None:  # raised in the engine's process, where inline would
                numbers_error = portable(self.writer.numbers_error)
        self.reply(("finished", {"recorded": self.writer.recorded, "closed_as": self.writer.closed_as,
                                 "numbers": numbers, "numbers_error": numbers_error}))
        self.let_go()
        return True

    def _stoppable_after(self, after_commit):
        """`after_commit` for an interrupted run's close: once the rows and the status are
        committed, say so to the engine ("status_committed") and allow a STOP meanwhile: the
        evidence that comes next (one transaction of its own) is the only thing a STOP gives up."""
        def hook(con, db_path, run_id, status):
            with self._stop_lock:
                self.stoppable = True
            self.reply(("status_committed", {"status": status, "recorded": self.writer.recorded}))
            return None if after_commit is None else after_commit(con, db_path, run_id, status)

        return hook

    def stop(self) -> None:
        """The engine's STOP (the reader thread's: this one's main thread is busy in the close):
        a second SIGINT/SIGTERM after an interrupted run's status was committed. While `stoppable`,
        the process leaves at once (os._exit: the evidence's transaction, if begun, never
        commits; what was committed is in the file or DuckDB's log, which the next open replays),
        its spill folder removed; otherwise it is dropped (the close goes on as it was)."""
        with self._stop_lock:
            if not self.stoppable:
                return
            if self.writer is not None:
                self.writer.remove_spill()
            sys.stderr.flush()
            os._exit(0)

    def let_go(self) -> None:
        """After the answer: the file's checkpoint and detach (~20 ms of the conversation trace's
        close; issue 41). The run's rows, status and evidence are committed by then (a reader
        that opened the file now would replay them from DuckDB's log), so the replay prints its
        result meanwhile; the engine's process reaps this one before it exits (writer_process.py
        `close`), so a command after the replay finds the file checkpointed and let go of. A
        failure here (a full disk) is one warning line: the run stays as it was closed, DuckDB's
        log holds what the checkpoint did not write."""
        try:
            self.writer.let_go()
        except Exception as exc:  # noqa: BLE001 - answered already: nobody is left to raise it to
            text = str(exc).strip()
            line = "".join(c if c.isprintable() else repr(c)[1:-1] for c in (text.splitlines()[0] if text else ""))
            sys.stderr.write(f"tierdiag: warning: run {self.writer.run_id} is closed, but its store was not "
                             f"checkpointed ({type(exc).__name__}: {line[:200]}); the next open replays its log\n")
            sys.stderr.flush()

    def engine_gone(self) -> None:
        """The pipe ended before the run was closed (the engine's process was killed, or closed
        without finishing after an error it reports itself): commit what was handed over, and
        leave the run as a kill -9 of an inline replay would."""
        if self.writer is None or self.failed or not self.writer.pending:
            return
        from tierdiag.store.writer import FINAL_WAIT_S

        try:
            self.writer.write(wait_s=FINAL_WAIT_S)
        except Exception as exc:  # noqa: BLE001 - nobody is left to raise it to; say it once
            text = str(exc).strip()
            sys.stderr.write(f"tierdiag: warning: run {self.writer.run_id}: the last rows handed to the writer "
                             f"were not committed ({text.splitlines()[0] if text else type(exc).__name__})\n")
