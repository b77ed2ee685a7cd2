"""A call started on a thread of its own whose result the caller collects later (`OnThread`):
the start-up overlaps of the read commands (the store opened while their modules import) and of
the replay (the trace's digest taken while the engine imports).

`idle_work(fn)`: work the calling thread will do anyway later (a read command's text view: Rich's
import), done instead where that thread would first block on another one (`idle()`: an
OnThread's `result()` before it is there, explain's reads, diagnose/read/request_reads.py), so
that it fills a wait rather than adding to the command's wall where a second core is free. Never
run on another thread (worker threads do not import: tests/reliability/test_thread_imports.py).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

# thread ident -> the work it left for its first wait (idle_work), in the order it was left
_IDLE: dict[int, list[Callable[[], None]]] = {}


@contextmanager
def idle_work(fn: Callable[[], None]) -> Iterator[None]:
    """Within the block, the calling thread's first wait on another thread (`idle()`) runs `fn`
    first; where it never waits, `fn` is not run (the caller does that work itself when it needs
    it: what it leaves here must be safe to do twice or not at all, e.g. an import)."""
    key = threading.get_ident()
    tasks = _IDLE.setdefault(key, [])
    tasks.append(fn)
    try:
        yield
    finally:
        if fn in tasks:
            tasks.remove(fn)
        if not tasks:
            _IDLE.pop(key, None)


def idle() -> None:
    """Run the work the calling thread left (idle_work), once each, before it blocks. What that
    work raises is raised here: the same error the caller would have met doing it later."""
    tasks = _IDLE.get(threading.get_ident())
    while tasks:
        tasks.pop(0)()


class OnThread:
    """`fn(*args)` on a daemon thread named `name`, started at once. `result()` waits for it and
    returns what it returned, or raises what it raised, on the caller's thread. A daemon thread:
    a caller that stops before `result()` does not wait for it to end."""

    def __init__(self, fn: Callable[..., Any], *args: Any, name: str):
        self._fn = fn
        self._args = args
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._fn(*self._args)
        except BaseException as exc:  # noqa: BLE001 - handed to result(), raised on the caller's thread
            self._error = exc

    def join(self) -> None:
        """Wait for it to end; what it raised is kept for result(), not raised here."""
        self._thread.join()

    def result(self) -> Any:
        if self._thread.is_alive():
            idle()
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value
