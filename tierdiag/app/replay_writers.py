"""How a replay's rows reach the store, one small strategy a writer kind behind one interface:
`Unrecorded` (nothing recorded: `--no-probes`, or no store), `InlineWriter` (store.writer.RunWriter
on the engine's thread) and `WriterInProcess` (store.writer_process.WriterProcess: a process of its
own beside the engine). app/replay.py drives any of them the same way: `start` before the engine's
import, `open` the run, hand the recorder's rows, `close` with the run's status; the rows, errors
and statuses are the same whichever writes them (tierdiag/store/writer_process.py)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable

from tierdiag import signals
from tierdiag.errors import TierdiagError


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


class Unrecorded:
    """Nothing written: the replay's numbers come from the engine's own counts."""

    kind: str | None = None  # ReplayResult.writer: how the store was written (None: nothing recorded)
    writer = None
    recorder = None

    def start(self, cleanup: contextlib.ExitStack) -> "Unrecorded":
        """Begin what can overlap the engine's import; the strategy to go on with (a writer
        process that cannot be had falls back to writing inline)."""
        return self

    def open(self, db: Path, run: dict, *, flush_every_s: float) -> None:
        raise AssertionError("an unrecorded replay opens no run")

    def close(self, status: str | Callable[[], str], error: str | None, *,
              trace_sha256: str | None = None) -> TierdiagError | None:
        return None

    def finished(self, *, reap_at_exit: bool = False) -> None:
        """After the run's close: nothing left to wait for. `reap_at_exit`: this process ends
        right after the replay (the CLI), so what is left to wait for once the store is let go
        of may be waited for at its exit, after the result is printed."""

    def numbers(self) -> dict | None:
        """The closing numbers `summary` reads back from the store (None: none were recorded)."""
        return None


class InlineWriter(Unrecorded):
    """store.writer.RunWriter on the engine's thread; the close hook runs on its connection."""

    kind = "inline"
    # Set by a caller whose process ends after the replay (the CLI): called, from the signal
    # handler, by a second SIGINT/SIGTERM once an interrupted run's rows and status are
    # committed, while its evidence is computed; it says so and ends the process (`_close_hooks`).
    leave_when_stopped_again: Callable[[], None] | None = None

    def open(self, db: Path, run: dict, *, flush_every_s: float) -> None:
        from tierdiag.probes.recorder import Recorder
        from tierdiag.store.writer import RunWriter

        self.writer = RunWriter(db, **run)
        self.recorder = Recorder(rows_sink=self.writer.append_rows)

    def _close_hooks(self, status: str) -> dict:
        """The close hook: the run evidence (diagnose.run.close.after_commit). An interrupted
        run's, with `leave_when_stopped_again` set, runs where a second signal ends the process
        (signals.second_stops): the evidence is computed here and on threads of its own, on this
        connection, and a process that ends there leaves the store as a writer process's STOP
        does (h47sig): the rows and status committed (the next open replays DuckDB's log), the
        evidence's transaction never committed. Nothing is unwound in between: stopping the
        threads' queries and closing their cursors under them is what could go wrong."""
        from tierdiag.diagnose.run.close import after_commit

        leave = self.leave_when_stopped_again
        if status != "interrupted" or leave is None:
            return {"after_commit": after_commit}

        def stoppable(con, db_path, run_id: str, status: str):
            with signals.second_stops(leave=lambda signum: leave()):
                return after_commit(con, db_path, run_id, status)

        return {"after_commit": stoppable}

    def close(self, status: str | Callable[[], str], error: str | None, *,
              trace_sha256: str | None = None) -> TierdiagError | None:
        """Flush what is buffered and write the final status, SIGINT/SIGTERM held meanwhile by the
        caller. On any failure (disk full, a value that cannot be stored) the run is marked failed,
        keeping every row already written, if anything can still be written, and the failure is
        returned."""
        writer, bug = self.writer, None
        try:
            self.recorder.flush()
            status = status if isinstance(status, str) else status()
            writer.finish(status, error=error, trace_sha256=trace_sha256, **self._close_hooks(status))
            return None
        except TierdiagError as exc:
            problem = exc
        except Exception as exc:  # a bug: the run must still not be left `running`; raised below
            bug = exc
            problem = TierdiagError(f"{type(exc).__name__}: {_first_line(exc)}")
        try:
            writer.finish("failed", error=problem.one_line(), write_pending=False)
        except Exception:  # noqa: BLE001 - nothing more can be written; what to say is below
            # The row still says running; once this process is gone readers show it as
            # interrupted (they check the pid).
            problem.hint = (problem.hint + "; " if problem.hint else "") + "the run could not be marked failed"
        if bug is not None:
            raise bug
        return problem

    def numbers(self) -> dict | None:
        # Read back by the writer's close, after the run evidence it stored: one definition per metric.
        if self.writer.numbers_error is not None:
            raise self.writer.numbers_error
        return self.writer.numbers


class WriterInProcess(InlineWriter):
    """store.writer_process.WriterProcess: started before the engine's import so that its interpreter
    and imports (duckdb, pyarrow) overlap the engine's; it runs the close hook itself (writer_child)."""

    kind = "process"

    def start(self, cleanup: contextlib.ExitStack) -> Unrecorded:
        from tierdiag.app import writer_child
        from tierdiag.store.writer_process import WriterProcess

        # It touches no store until `open` tells it to open one.
        with signals.deferred():
            try:
                self.process = WriterProcess.start(entry=writer_child.ENTRY)
            except OSError:  # no process to be had (out of processes or memory): write inline
                return InlineWriter()
        cleanup.callback(self.process.close)
        return self

    def open(self, db: Path, run: dict, *, flush_every_s: float) -> None:
        from tierdiag.probes.recorder import Recorder
        from tierdiag.store.writer_process import BATCH_ROWS

        # Returns at once: the writer creates the store and the runs row while the engine starts;
        # what it says back is read at the first hand-over.
        self.process.open(db, write_every_s=flush_every_s, **run)
        self.writer = self.process
        self.recorder = Recorder(rows_sink=self.writer.append_rows, flush_rows=BATCH_ROWS)

    def _close_hooks(self, status: str) -> dict:
        return {}

    def finished(self, *, reap_at_exit: bool = False) -> None:
        # The writer has answered once the store is committed: what is left of it is the file's
        # checkpoint and let-go (~20 ms on the conversation trace) and its exit (~17 ms; issue 41),
        # waited for at this process's exit where that comes right after the result is printed.
        self.process.close(wait=not reap_at_exit)


def for_mode(mode: str | None) -> Unrecorded:
    """The strategy of a writer kind: store.writer_process.writer_mode's, None for nothing recorded."""
    return {None: Unrecorded, "inline": InlineWriter, "process": WriterInProcess}[mode]()
