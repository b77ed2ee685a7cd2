"""Options shared by several commands (declared once) and the one place errors become exits.

stdout is data, stderr is diagnostics.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tierdiag.paths import DEFAULT_DB

DEFAULT_DB_PATH = Path(DEFAULT_DB)


def _options() -> dict:
    from typing import Annotated, Optional

    import typer

    return {"DbOpt": Annotated[Path, typer.Option("--db", help="Run-store file (DuckDB).")],
            "RunOpt": Annotated[Optional[str], typer.Option("--run", metavar="RUN",
                                                            help="Run id, id prefix or name; default: newest.")],
            "JsonOpt": Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")]}


def __getattr__(name: str):
    """DbOpt, RunOpt, JsonOpt: made with Typer when first asked for (`from ... import DbOpt`, or
    Typer reading a command's annotation `common.DbOpt`), so that a command run without Typer
    (cli/main.py's direct path: `summary`, `explain`) never imports it (~45 ms of start-up)."""
    if name in ("DbOpt", "RunOpt", "JsonOpt"):
        made = _options()
        globals().update(made)
        return made[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _TyperWhenRead:
    """`typer` as a command module's annotations name it (`typer.Argument(...)`): imported when
    Typer evaluates them, not when the module is imported (the direct path never does)."""

    def __getattr__(self, name: str):
        import typer

        return getattr(typer, name)


typer_when_read = _TyperWhenRead()


def db_option(db: str | Path) -> str:
    """' --db PATH' for a "next:" hint (nothing for the default store), quoted for a shell, so
    the hint can be pasted as it is whatever the path holds (spaces, quotes). Print it through
    report.terminal.plain: a path is data (no markup, controls escaped)."""
    import shlex

    return "" if Path(db) == DEFAULT_DB_PATH else f" --db {shlex.quote(str(db))}"

def command_line() -> list[str]:
    """This command's line as the store records it: text, with bytes that were not UTF-8 escaped."""
    from tierdiag.report.text import as_text

    return ["tierdiag"] + [as_text(a) for a in sys.argv[1:]]


class _LazyConsole:
    """`out` and `err`: report.console's SafeConsole (no markup, controls escaped, piped output
    complete), made on first use, so that a command printing --json (or nothing) never imports
    Rich (~40 ms of start-up), and one that prints a line never imports the views."""

    def __init__(self, *, stderr: bool):
        object.__setattr__(self, "_stderr", stderr)
        object.__setattr__(self, "_console", None)

    def _get(self):
        if self._console is None:
            from tierdiag.report.console import new_console

            object.__setattr__(self, "_console", new_console(stderr=self._stderr))
        return self._console

    def made(self) -> bool:
        """Whether the console exists yet (cli/progress.py `stderr_is_terminal`)."""
        return self._console is not None

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


out = _LazyConsole(stderr=False)
err = _LazyConsole(stderr=True)

