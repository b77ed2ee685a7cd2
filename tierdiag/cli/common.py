"""Options shared by several commands (declared once) and the one place errors become exits.

stdout is data, stderr is diagnostics.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from tierdiag.paths import DEFAULT_DB

DbOpt = Annotated[Path, typer.Option("--db", help="Run-store file (DuckDB).")]
RunOpt = Annotated[Optional[str], typer.Option("--run", help="Run id, id prefix or name; default: newest.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")]
DEFAULT_DB_PATH = Path(DEFAULT_DB)


def db_option(db: str | Path) -> str:
    """' --db PATH' for a "next:" hint (nothing for the default store), quoted for a shell, so
    the hint can be pasted as it is whatever the path holds (spaces, quotes). Print it through
    report.terminal.plain: a path is data (no markup, controls escaped)."""
    import shlex

    return "" if Path(db) == DEFAULT_DB_PATH else f" --db {shlex.quote(str(db))}"

def _styling() -> dict:
    """NO_COLOR (https://no-color.org, any non-empty value) turns off all styling, bold and dim
    included: Rich's own NO_COLOR support drops only the colours."""
    return {"color_system": None} if os.environ.get("NO_COLOR") else {}


@functools.cache
def _console_class():
    """SafeConsole, defined (and Rich imported) on first use."""
    from rich.console import Console
    from rich.segment import Segment

    class SafeConsole(Console):
        """A Console that never sends a control character from data to the terminal: whatever a
        view renders (a table cell, a title, a panel), text segments are shown with control
        characters escaped (`\x1b`), while Rich's own styling still works. Views also pass data
        as Text built with `report.terminal.visible` (no markup, escaped before layout so columns
        line up); this is the net under every view, including ones added later."""

        def _render_buffer(self, buffer):
            from tierdiag.report.terminal import visible

            return super()._render_buffer(
                seg if seg.control else Segment(visible(seg.text), seg.style, seg.control) for seg in buffer)

    return SafeConsole


class _LazyConsole:
    """`out` and `err`: a SafeConsole, made on first use, so that a command printing --json (or
    nothing) never imports Rich (~40 ms of start-up). Options are taken when this is made, as the
    console's own would be."""

    def __init__(self, **options):
        object.__setattr__(self, "_options", options)
        object.__setattr__(self, "_console", None)

    def _get(self):
        if self._console is None:
            object.__setattr__(self, "_console", _console_class()(**self._options))
        return self._console

    def __getattr__(self, name):
        return getattr(self._get(), name)

    def __setattr__(self, name, value):
        setattr(self._get(), name, value)

    # Dunder methods are looked up on the type, never through __getattr__: the console's own
    # context manager (Rich's Live, under the replay's progress bar, enters it at every refresh).
    def __enter__(self):
        return self._get().__enter__()

    def __exit__(self, *exc_info):
        return self._get().__exit__(*exc_info)


def __getattr__(name: str):
    if name == "SafeConsole":  # the class, for whoever needs one of their own
        return _console_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


out = _LazyConsole(soft_wrap=True, **_styling())
err = _LazyConsole(stderr=True, soft_wrap=True, **_styling())


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
    sys.stdout.flush()

