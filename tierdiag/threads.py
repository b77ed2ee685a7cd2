"""A call started on a thread of its own whose result the caller collects later (`OnThread`):
the start-up overlaps of the read commands (the store opened while their modules import) and of
the replay (the trace's digest taken while the engine imports)."""

from __future__ import annotations

import threading
from typing import Any, Callable


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
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value
