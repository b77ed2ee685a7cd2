"""Errors a user can act on. Each carries a one-line message and a named exit code.

Anything that is not a TierdiagError is a bug: the CLI prints one line asking for a report
(and the traceback with --debug).
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    BUG = 1
    USAGE = 2  # bad option values (Typer uses 2 for its own usage errors too)
    BAD_INPUT = 3  # malformed trace, bad config file
    STORE = 4  # missing / foreign / wrong-version / busy database, unknown run
    NOT_FOUND = 5  # unknown request id
    IO = 6  # cannot write output (disk full, permissions)
    INTERRUPTED = 130


class TierdiagError(Exception):
    exit_code: ExitCode = ExitCode.BUG

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def one_line(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class ConfigError(TierdiagError):
    exit_code = ExitCode.USAGE


class ConfigFileError(ConfigError):
    """A --config file that cannot be read, is not TOML, or holds an unknown key or a wrong type:
    bad input, like a bad trace, rather than a bad option value."""

    exit_code = ExitCode.BAD_INPUT


class EngineError(TierdiagError):
    """The engine cannot make progress (a bug or an impossible configuration). Raised by the
    compiled engine core (engine/schedule_common.py re-exports it); defined here, in an
    interpreted module, because mypyc cannot lay out a compiled subclass of TierdiagError."""


class TraceError(TierdiagError):
    exit_code = ExitCode.BAD_INPUT


class StoreError(TierdiagError):
    exit_code = ExitCode.STORE


class NoRunsError(StoreError):
    """A store that holds no run (yet): a 0-byte file, DuckDB's header alone, a schema begun or
    complete with no runs row (docs/contract.md §7: left by a replay killed as it made the store,
    or every run deleted). `runs` lists it as empty; every command that needs a run is exit 4."""


class NotFoundError(TierdiagError):
    exit_code = ExitCode.NOT_FOUND


class OutputError(TierdiagError):
    exit_code = ExitCode.IO


class RunInterrupted(TierdiagError):
    """Ctrl-C or SIGTERM, after the command closed what it was writing: the message says what was
    kept. Exit 130 for SIGINT, 143 for SIGTERM (the CLI reads which signal it was)."""

    exit_code = ExitCode.INTERRUPTED


def unknown_name(kind: str, name: str, known) -> ConfigError:
    """The one error for every registry lookup: name the kind and list what exists."""
    return ConfigError(f"unknown {kind} {name!r}; known: {', '.join(sorted(known))}")
