"""The one place errors become exits, and the stdout every command writes through.

Every TierdiagError becomes one line on stderr and its exit code; anything else is a bug and
says so in one line (the traceback with --debug). Ctrl-C and SIGTERM are interrupts wherever
they land (while the CLI starts, in our code, in DuckDB, in Typer, which turns a
KeyboardInterrupt into a silent Exit(130)): one "interrupted" line, exit 130 (143 for SIGTERM).
A stdout or stderr that cannot take every character (`LC_ALL=C`) gets the others escaped
(`\xb7`), never a crash.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys

from tierdiag import signals
from tierdiag.errors import ExitCode, OutputError, RunInterrupted, TierdiagError


# --- stdout -------------------------------------------------------------------------------------

class StdoutClosed(Exception):
    """The reader of our stdout went away (`tierdiag runs --json | head`): stop, silently."""


class _GuardedStdout:
    """sys.stdout, with a failed write or flush turned into one error: a closed pipe is
    StdoutClosed (silent, exit 0), anything else (a full disk behind `> file`, /dev/full, EIO)
    an OutputError, exit 6. Rich and print() both write through sys.stdout."""

    def __init__(self, stream):
        self._stream = stream

    def _guard(self, op, *args):
        try:
            return op(*args)
        except OSError as exc:
            if isinstance(exc, BrokenPipeError) or exc.errno == errno.EPIPE:
                raise StdoutClosed() from None
            raise OutputError(f"cannot write to standard output: {exc.strerror or exc}") from None

    def write(self, text):
        return self._guard(self._stream.write, text)

    def writelines(self, lines):
        return self._guard(self._stream.writelines, lines)

    def flush(self):
        return self._guard(self._stream.flush)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail (again)."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.__stdout__.fileno())
    except (OSError, ValueError, AttributeError):
        pass  # no stdout to speak of: nothing will be flushed into it either


# --- the one place errors become exits ----------------------------------------------------------

def _say(line: str) -> None:
    """One line on stderr; what came from data (a path, an id) shown with controls escaped and,
    where it is very long (a hostile value), by its ends (report/text.py `abbreviated`)."""
    from tierdiag.report.text import abbreviated, visible

    print(f"tierdiag: {abbreviated(visible(line, lines=False))}", file=sys.stderr)


def leave_now(line: str) -> None:
    """Say `line` as an interrupt's and end the process here, unwinding nothing: called from the
    signal handler by a second signal while an inline replay computes an interrupted run's
    evidence (app/replay.py `leave_stopped_again`), where what is committed is all there is to
    keep and the threads computing it on the store's connection could not be stopped safely
    (the process's end stops them; DuckDB's log holds the commits, replayed by the next open).
    Written straight to the descriptor: the handler may have interrupted a write to stderr."""
    from tierdiag.report.text import abbreviated, visible

    signals.ignore()
    code = signals.exit_code(signals.received())
    with contextlib.suppress(OSError):
        os.write(2, f"tierdiag: {abbreviated(visible(line, lines=False))}\n".encode("utf-8", "backslashreplace"))
    os._exit(code)


def _interrupted(line: str = "interrupted") -> None:
    signals.ignore()  # a second Ctrl-C while we say so must not cut the line short
    _say(line)
    _quiet_stdout()
    sys.exit(signals.exit_code(signals.received()))


def _is_no_args_help(exc: Exception) -> bool:
    # `tierdiag` alone prints the help and raises this; it lives in Typer's vendored click.
    return type(exc).__name__ == "NoArgsIsHelpError"


def _damaged_store(exc: Exception) -> TierdiagError | None:
    """A DuckDB error that says the file's blocks are damaged (a checksum, a short read), seen
    while a command read the store it opened: exit 4 naming the file, not a bug."""
    if "duckdb" not in sys.modules:
        return None
    from tierdiag.store.reader import damage_error, last_opened

    path = last_opened()
    return damage_error(path, exc) if path is not None else None


def _other(exc: Exception, debug: bool) -> None:
    """Typer's own exceptions, then interrupts DuckDB turned into its errors, then damaged
    stores and closed pipes; what is left is a bug."""
    typer = sys.modules.get("typer")
    if typer is not None and isinstance(exc, typer.Exit):
        if signals.received() is not None:
            _interrupted()
        sys.exit(exc.exit_code)
    if typer is not None and isinstance(exc, typer.Abort):
        if signals.received() is not None:
            _interrupted()
        _say("aborted")
        sys.exit(int(ExitCode.INTERRUPTED))
    if typer is not None and isinstance(exc, typer.TyperException):
        # usage: unknown command/option, a value Typer could not parse
        if _is_no_args_help(exc):  # `tierdiag` alone: the help, on stdout, and success
            print(exc.format_message())
            sys.exit(int(ExitCode.OK))
        # "Value error, " is pydantic's prefix on a choice Typer refused: noise in a one-line error.
        first = exc.format_message().replace("Value error, ", "").strip().splitlines()
        ctx = getattr(exc, "ctx", None)
        where = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        _say(f"error: {first[0] if first else type(exc).__name__}{where}")
        sys.exit(int(getattr(exc, "exit_code", ExitCode.USAGE)))
    if signals.received() is not None:
        # DuckDB turns a signal that lands inside `execute` into an error of its own.
        _interrupted()
    if isinstance(exc, OSError) and exc.errno == errno.EPIPE:
        _quiet_stdout()
        sys.exit(int(ExitCode.OK))
    damaged = _damaged_store(exc)
    if damaged is not None and not debug:
        _say(f"error: {damaged.one_line()}")
        sys.exit(int(damaged.exit_code))
    if debug:
        raise exc
    first = str(exc).splitlines()[0] if str(exc) else ""
    _say(f"internal error: {type(exc).__name__}: {first} (re-run with --debug and report it)")
    sys.exit(int(ExitCode.BUG))


def run(build_app) -> None:
    """Build the Typer app (`build_app()`) and run it on sys.argv, every way it can end sorted
    out here."""
    signals.install()
    try:
        _run(build_app)
    finally:
        # Done, one way or another (what is said is said): a signal while the interpreter shuts
        # down (it resets handlers to the default, which kills) must not change the exit.
        signals.ignore()


def run_and_leave(build_app) -> None:
    """`run`, then, after a command that asked for it (`leave_without_teardown`), the end of
    the process without the interpreter's teardown (`_leave`). `run` itself returns or raises
    SystemExit as ever, for whoever calls it."""
    the_process_ends_after(by_leave=True)
    try:
        run(build_app)
    except SystemExit as exc:
        if not _LEAVE_FAST:
            raise
        _leave(exc.code)
    if _LEAVE_FAST:
        _leave(0)


# Set by a command whose process ends holding many objects that nothing needs freed (replay:
# the engine's tree, page lists and pools, ~10^6 objects on the conversation trace, which the
# interpreter's teardown frees one by one: 45-80 ms measured, after the last line is printed).
_LEAVE_FAST: list[bool] = []


# How this process ends once the command returns, where it does (`the_process_ends_after`):
# "exits" (cli/main.py `main`: the interpreter's own exit) or "leaves" (`run_and_leave`, the
# console script and `python -m tierdiag`: `_leave` where the command asked for it). Empty under
# Typer's test runner, which runs commands inside a longer process.
_PROCESS_ENDS: list[str] = []


def the_process_ends_after(*, by_leave: bool = False) -> None:
    """Say that this process ends once the command returns (cli/main.py `main`; `run_and_leave`
    with `by_leave`; not a test's in-process call): a command may then end it itself where it
    must (`leave_now`)."""
    _PROCESS_ENDS.append("leaves" if by_leave else "exits")


def process_ends_after() -> bool:
    """Whether this process ends once the command returns (`the_process_ends_after`)."""
    return bool(_PROCESS_ENDS)


def leave_without_teardown() -> None:
    """Ask `entry` to end this process by `_leave` (the command has closed what it opened)."""
    _LEAVE_FAST.append(True)


def process_ends_unfreed() -> bool:
    """Whether this process ends by `_leave` once the command returns (`entry` runs it and the
    command asked for it): what it holds then is never freed, so a command may leave the
    collector's passes off its objects (`gc.freeze`)."""
    return "leaves" in _PROCESS_ENDS and bool(_LEAVE_FAST)


def _leave(code: object) -> None:
    """End the process as the interpreter would, less the teardown of its objects: the atexit
    functions run (weakref finalizers, any library's), the standard streams are flushed, then
    os._exit with the code SystemExit would give. Only with this thread alone: another one
    still running is waited for by the ordinary exit, so that one is taken instead."""
    import atexit
    import threading

    if threading.active_count() > 1:
        sys.exit(code)
    atexit._run_exitfuncs()
    if isinstance(code, str):  # as the interpreter does with sys.exit("text")
        sys.stderr.write(code + "\n")
        code = 1
    for stream in (sys.__stdout__, sys.__stderr__):
        if stream is not None:
            with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more can reach it
                stream.flush()
    os._exit(0 if code is None else code if isinstance(code, int) else 1)


def _escape_what_cannot_be_encoded() -> None:
    """A stream whose encoding cannot take a character (`LC_ALL=C PYTHONUTF8=0`: ASCII; our
    own "·", a name in another script, the stand-ins for a file name's non-UTF-8 bytes) writes
    it escaped (`\xb7`) instead of raising UnicodeEncodeError in the middle of a view."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError, OSError):  # not a TextIOWrapper: as it is
            stream.reconfigure(errors="backslashreplace")


def _store_what_readers_computed() -> None:
    """Run evidence a command's reader computed because none was stored (diagnose/run/backfill.py),
    stored now that the answer is out and the command has closed its store: the next reader
    reads it. A command that computed none never imports the module."""
    backfill = sys.modules.get("tierdiag.diagnose.run.backfill")
    if backfill is not None and backfill.pending():
        backfill.store_pending()


def _run(build_app) -> None:
    debug = "--debug" in sys.argv[1:]
    _escape_what_cannot_be_encoded()
    if sys.stdout is not None and not isinstance(sys.stdout, _GuardedStdout):
        sys.stdout = _GuardedStdout(sys.stdout)
    try:
        with signals.deferred():  # C extensions (duckdb, pyarrow) load here: let them finish
            app = build_app()
            # Rich imports it later (fractions), often as a signal lands. An interrupted
            # _decimal init, run again by the next import, prints a libmpdec warning to stderr
            # ("mpd_setminalloc: ignoring request ... a second time"): a second line beside
            # "tierdiag: interrupted". Loaded here, where a signal waits (~2 ms).
            import decimal  # noqa: F401
        result = app(prog_name="tierdiag", standalone_mode=False)
        sys.stdout.flush()
        # Outside standalone mode Typer catches `typer.Exit(code)` itself and returns the code;
        # it also turns a KeyboardInterrupt it sees into Exit(130), silently.
        if signals.received() is not None:
            _interrupted()
        _store_what_readers_computed()
        if isinstance(result, int) and not isinstance(result, bool) and result:
            sys.exit(result)
    except RunInterrupted as exc:  # the command said what it kept
        _interrupted(exc.one_line())
    except StdoutClosed:
        # `tierdiag runs --json | head`: the reader went away; that is not an error of ours.
        _quiet_stdout()
        sys.exit(int(ExitCode.OK))
    except TierdiagError as exc:
        if signals.received() is not None:
            _interrupted()
        if debug:
            raise
        _say(f"error: {exc.one_line()}")
        if isinstance(exc, OutputError):
            _quiet_stdout()
        sys.exit(int(exc.exit_code))
    except KeyboardInterrupt:
        _interrupted()
    except SystemExit:
        raise
    except Exception as exc:  # noqa: BLE001 - sorted out in _other
        _other(exc, debug)
