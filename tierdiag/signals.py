"""Ctrl-C and SIGTERM, the same way wherever they land.

The CLI installs `install()` first thing: both signals raise `Interrupted` (a KeyboardInterrupt,
so every `except KeyboardInterrupt` treats SIGTERM like Ctrl-C) and are remembered, so that an
interrupt DuckDB turned into one of its own errors ("Query interrupted", an InvalidInputException
around the KeyboardInterrupt, "Current transaction is aborted") is still known to be one.

A write to the store must be all or nothing: inside `deferred()` a signal is only recorded, and
raised when the outermost deferred block ends (the transaction committed or rolled back by then).
`checkpoint()` raises a recorded signal early at a point where nothing is half-done (a wait).

A signal that lands while a module is being imported is held too: raised inside a native
extension's initialisation (DuckDB's nanobind enums, found by a SIGTERM in CI) it aborts the
process (nanobind's "Critical error", exit -6) instead of unwinding. It is handed back to this
process a moment later (`_REDELIVER_S`), again and again until no import is running.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

HANDLED = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM, raised by our handler (or later, at the end of a deferred block)."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signum)
        self.signum = signum


class StoppedAgain(Interrupted):
    """A second SIGINT/SIGTERM inside `second_stops()`: what the close had left to do is given up."""


_state = {"depth": 0, "pending": None, "first": None, "closing": 0, "raised": False, "second": 0}
# `second_stops(leave=...)`: what a second signal calls instead of raising (innermost last).
_leaves: list = []
_REDELIVER_S = 0.02


def _importing(frame) -> bool:
    """Whether `frame` runs (somewhere below) the import machinery."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _redeliver(signum: int) -> None:
    """Send `signum` to this process's main thread again (after an import held it)."""
    try:
        signal.pthread_kill(threading.main_thread().ident, signum)
    except (ProcessLookupError, OSError):
        return  # the main thread is gone: the process is exiting, which is what the signal asked


def _start(timer: threading.Timer) -> bool:
    """Start `timer`; False where no thread can start (the interpreter is shutting down)."""
    try:
        timer.start()
    except RuntimeError:
        return False
    return True


def _handler(signum, frame) -> None:
    if _state["depth"] == 0 and not _state["raised"] and _importing(frame):
        timer = threading.Timer(_REDELIVER_S, _redeliver, (signum,))
        timer.daemon = True
        if _start(timer):
            return
        # no new thread at interpreter shutdown: the signal is raised here, as before
    if _state["second"] and _state["first"] is not None:
        # A second one where the caller allows it (`second_stops`), deferred block or not: the
        # exit code stays the first's (`received`).
        _state["pending"] = None
        _state["raised"] = True
        if _leaves and _leaves[-1] is not None:
            _leaves[-1](signum)  # ends the process (it returns only where it could not)
        raise StoppedAgain(signum)
    if _state["first"] is None:
        _state["first"] = signum
    if _state["depth"] > 0:
        if _state["pending"] is None:
            _state["pending"] = signum
        return
    if _state["raised"]:
        return  # the first one is on its way out (a second Ctrl-C must not interrupt that)
    _state["raised"] = True
    raise Interrupted(signum)


def interrupt(signum: int = signal.SIGINT) -> None:
    """As if `signum` had arrived through our handler: recorded inside a deferred block, else
    raised (`Interrupted`). For a signal handler of another's (the sweep worker's) that hands the
    stop on to this one path."""
    _handler(signum, None)


def install() -> None:
    """Route SIGINT and SIGTERM through `_handler` (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in HANDLED:
        signal.signal(sig, _handler)


def received() -> int | None:
    """The first signal this process got through our handler, or None."""
    return _state["first"]


def exit_code(signum: int | None) -> int:
    """130 for Ctrl-C, 143 for SIGTERM: the shell's 128 + signal number."""
    return 128 + int(signum or signal.SIGINT)


def pending() -> int | None:
    """A signal recorded inside the current deferred block and not raised yet."""
    return _state["pending"]


@contextlib.contextmanager
def deferred(*, reraise: bool = True) -> Iterator[None]:
    """Hold SIGINT/SIGTERM until the block ends, then raise the first one (if `reraise`; else
    drop it: used while closing a run that is already being interrupted)."""
    _state["depth"] += 1
    _state["closing"] += not reraise
    try:
        yield
    finally:
        _state["depth"] -= 1
        _state["closing"] -= not reraise
        if _state["depth"] == 0:
            signum, _state["pending"] = _state["pending"], None
            if signum is not None and reraise and not _state["raised"]:
                _state["raised"] = True
                raise Interrupted(signum)


@contextlib.contextmanager
def second_stops(leave=None) -> Iterator[None]:
    """Within the block, a signal that comes after a first one (`received()` set) raises
    StoppedAgain at once, even inside a deferred block: for the part of an interrupted run's close
    after its rows and status are committed (a writer process computing the evidence), so that a
    second Ctrl-C, `docker stop` or `timeout -k` ends the command there, not only a SIGKILL.
    Everywhere else a second signal is dropped, as before: the close goes on.

    `leave(signum)`: called by the handler instead, where the caller's process may end right
    there (the inline writer's close, whose evidence runs on this thread and on threads of its
    own that nothing could unwind safely: app/replay.py); if it returns, StoppedAgain as above."""
    _state["second"] += 1
    _leaves.append(leave)
    try:
        yield
    finally:
        _leaves.pop()
        _state["second"] -= 1


def checkpoint() -> None:
    """Raise a signal recorded in a deferred block now: the caller is at a point where stopping
    leaves nothing half-written (waiting for a lock, before a transaction). Not while closing a run
    that is already being interrupted: that close is what the first signal asked for."""
    signum = _state["pending"]
    if signum is not None and not _state["closing"] and not _state["raised"]:
        _state["pending"] = None
        _state["raised"] = True
        raise Interrupted(signum)


def ignore() -> None:
    """From now on SIGINT and SIGTERM do nothing (the process is saying it was interrupted)."""
    if threading.current_thread() is threading.main_thread():
        for sig in HANDLED:
            signal.signal(sig, signal.SIG_IGN)


def reset() -> None:
    """Forget every signal seen (tests that run several interrupted replays in one process)."""
    _state.update(depth=0, pending=None, first=None, closing=0, raised=False, second=0)
    _leaves.clear()
