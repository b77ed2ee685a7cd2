"""Where a long command is (replay, convert, report, advise, sweep): one display for all, on stderr only.

- On a terminal: a Rich bar, `what`, the bar, done/total, the time left and elapsed, and what the
  command adds (`info`) only where it fits: the whole line fits 80 columns.
- Not on a terminal (a log, a pipe): one line every TIERDIAG_PROGRESS_EVERY_S seconds (default 10;
  0: none), `tierdiag: replay: 26,880/43,012 requests, 1m02s elapsed, about 38s left`, from a
  background thread, so a step that calls back rarely (a sweep's runs, a report's figures) still
  shows the command is alive. A command that ends within the interval prints no line.

stdout is never written: the data stays what it is without progress.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tierdiag import signals
from tierdiag.errors import ConfigError

ENV = "TIERDIAG_PROGRESS_EVERY_S"
DEFAULT_EVERY_S = 10.0
MAX_EVERY_S = 86_400.0
NARROW = 80  # the bar's line fits this many columns without `info`


def every_s() -> float:
    """TIERDIAG_PROGRESS_EVERY_S: seconds between piped progress lines (0: none). Bad value: exit 2."""
    raw = os.environ.get(ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_EVERY_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 <= value <= MAX_EVERY_S:  # NaN fails too
        raise ConfigError(f"{ENV}={raw[:40]!r} must be a number of seconds from 0 to {MAX_EVERY_S:g}")
    return value


def stderr_is_terminal() -> bool:
    """`err.is_terminal` (cli/common.py's stderr console, Rich's answer), without making the
    console where the answer is plainly no: Rich's `Console.is_terminal` is its stream's `isatty()`
    unless TTY_COMPATIBLE (0 or 1) or FORCE_COLOR says otherwise or it runs under IDLE or Jupyter,
    which only ever turn a tty's yes into no. So where neither variable is set and stderr is no
    tty, the answer is no, and a piped replay (its progress line every ~10 s) loads Rich only when
    it first prints one (~15-25 ms of start-up, issue 41). Anything else asks the console."""
    import sys

    from tierdiag.cli.common import err

    if err.made() or os.environ.get("TTY_COMPATIBLE", "") in ("0", "1") or "FORCE_COLOR" in os.environ:
        return bool(err.is_terminal)
    stream = sys.stderr
    stream = getattr(stream, "rich_proxied_file", stream)  # as Rich's Console.file reads it
    isatty = getattr(stream, "isatty", None)
    try:
        tty = False if isatty is None else isatty()
    except ValueError:  # a closed stream: Rich says no too
        tty = False
    return bool(err.is_terminal) if tty else False


def fmt_duration(seconds: float) -> str:
    """'42s', '3m07s', '1h02m': short, for a progress line."""
    s = max(int(seconds + 0.5), 0)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def progress_line(what: str, done: int, total: int | None, unit: str, elapsed_s: float, *,
                  stopping: bool = False) -> str:
    """The piped line: what, done/total, elapsed, and the time left once there is a rate.
    `stopping`: a Ctrl-C or SIGTERM came (tierdiag/signals.py) and the command is closing what it
    was writing: no time left is estimated from a count that no longer moves (a 1M-request replay
    interrupted half-way closes its run for ~30 s, each line's "about ... left" growing), the line
    says what is being done instead."""
    count = f"{done:,}/{total:,}" if total is not None else f"{done:,}"
    line = f"tierdiag: {what}: {count}{' ' + unit if unit else ''}, {fmt_duration(elapsed_s)} elapsed"
    if stopping:
        line += ", interrupted: closing what was recorded"
    elif total is not None and 0 < done < total and elapsed_s > 0:
        line += f", about {fmt_duration(elapsed_s * (total - done) / done)} left"
    return line


class Progress:
    """`with Progress("replay", total, "requests") as p: ... p.update(done, info=...)`.

    `show=False` (e.g. `--json` on a terminal): the bar is not drawn; piped lines still are, on
    stderr. `total` None: counts without a total (and no time left); a function: called for it
    where it is first needed (the bar's start, the first piped line), so a total that takes a
    read of a file (a replay's trace lines) costs nothing to a command that ends before its
    first line."""

    def __init__(self, what: str, total: int | None | Callable[[], int | None] = None, unit: str = "", *,
                 show_bar: bool = True):
        from tierdiag.cli.common import err

        self.what, self._total, self.unit = what, total, unit
        self.done = 0
        self._info = ""
        self._console = err
        self._terminal = stderr_is_terminal()  # piped: the console is made at the first line
        self._bar = None
        self._task = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._show_bar = show_bar and self._terminal
        self._every = 0.0 if self._terminal else every_s()

    @property
    def total(self) -> int | None:
        if callable(self._total):
            self._total = self._total()
        return self._total

    @total.setter
    def total(self, value: int | None) -> None:
        self._total = value

    # --- the two displays ------------------------------------------------------------------
    def start(self) -> "Progress":
        self._t0 = time.monotonic()
        if self._show_bar:
            from rich.progress import BarColumn, Progress as Bar, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self._bar = Bar(TextColumn("{task.fields[what]}", style="bold", markup=False), BarColumn(bar_width=20),
                            TextColumn("{task.fields[count]}", markup=False), TextColumn("ETA", style="dim"),
                            TimeRemainingColumn(), TimeElapsedColumn(), TextColumn("{task.fields[info]}", markup=False),
                            console=self._console, transient=True)
            self._task = self._bar.add_task(self.what, total=self.total, what=self.what, count=self._count(), info="")
            self._bar.start()
        elif self._every > 0:
            # What the ticker needs, imported here on the caller's thread: it writes its lines
            # itself, not through the console (Rich: made at its first line, an import on the
            # ticker that raced the main thread's for CPython's module locks, as the trace
            # digest's did; tests/reliability/test_thread_imports.py), and nothing is imported
            # at start-up that a piped replay done before its first line never needed.
            from tierdiag.report.text import visible

            self._visible = visible
            self._thread = threading.Thread(target=self._tick, name=f"tierdiag-progress-{self.what}", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=2)
            self._thread = None

    def __enter__(self) -> "Progress":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def _count(self) -> str:
        count = f"{self.done:,}/{self.total:,}" if self.total is not None else f"{self.done:,}"
        return f"{count} {self.unit}".rstrip()

    def _tick(self) -> None:
        while not self._stop.wait(self._every):
            line = progress_line(self.what, self.done, self.total, self.unit, time.monotonic() - self._t0,
                                 stopping=signals.received() is not None)
            # stderr, one whole line at a time; data, never markup, its control characters
            # escaped as the console would (a stream that cannot take a character escapes it:
            # cli/exits.py sets its errors to backslashreplace)
            try:
                sys.stderr.write(self._visible(line + (f" ({self._info})" if self._info else ""), lines=False) + "\n")
                sys.stderr.flush()
            except (OSError, ValueError):  # stderr closed or gone (its reader left): no more lines to say
                return

    # --- the command's side ----------------------------------------------------------------
    def update(self, done: int, *, total: int | None = None, info: str = "", what: str | None = None) -> None:
        """`done` of `total` (None: unchanged); `info`: shown on a terminal where it fits, piped in
        brackets; `what`: a new name for the step (e.g. "convert: writing")."""
        if what is not None:
            self.what = what
        self.done = done
        if total is not None:
            self.total = total
        self._info = info
        if self._bar is not None:
            fixed = len(self.what) + 1 + 20 + 1 + len(self._count()) + 1 + 3 + 1 + 7 + 1 + 7 + 1
            room = self._console.width - fixed
            self._bar.update(self._task, completed=done, total=self.total, what=self.what, count=self._count(),
                             info=info if len(info) <= room else "")

    def advance(self, n: int = 1, *, info: str = "") -> None:
        self.update(self.done + n, info=info)

    def print(self, text: str) -> None:
        """A line of its own on stderr (above the bar, on a terminal)."""
        console = self._bar.console if self._bar is not None else self._console
        console.print(text, markup=False, highlight=False)


@contextmanager
def progress(what: str, total: int | None = None, unit: str = "", *, show_bar: bool = True) -> Iterator[Progress]:
    p = Progress(what, total, unit, show_bar=show_bar)
    p.start()
    try:
        yield p
    finally:
        p.stop()
