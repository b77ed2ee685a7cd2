"""The `tierdiag` command. Commands are thin: parse, call one library function, render.

Every TierdiagError becomes one line on stderr and its exit code; anything else is a bug and
says so in one line (the traceback with --debug).
"""

from __future__ import annotations

import os
import sys

import typer

from tierdiag.errors import ExitCode, TierdiagError

app = typer.Typer(
    name="tierdiag",
    help="Why was a cached prefix still slow? Replay a trace through a tiered KV cache, then explain it.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)

_state = {"debug": False}


def _print_version(value: bool) -> None:
    if value:
        from tierdiag import __version__

        print(f"tierdiag {__version__}")
        raise typer.Exit()


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
          version: bool = typer.Option(False, "--version", "-V", callback=_print_version, is_eager=True,
                                       help="Show the version and exit.")) -> None:
    _state["debug"] = debug


# The order of `tierdiag --help`: record, then read. Each module imports only what its
# command needs at call time (torch only inside replay/calibrate), so read-only commands start fast.
COMMANDS = ("replay", "runs", "summary", "slow", "explain", "report", "export", "synth", "calibrate", "doctor")


def _first_sentence(doc: str | None) -> str | None:
    """A command's line in `tierdiag --help`: its docstring's first sentence, whole (click would
    cut it at the terminal width with "...", and wrapping is better than cutting)."""
    if not doc:
        return None
    text = " ".join(doc.split())
    end = text.find(". ")
    return text if end < 0 else text[:end + 1]


def _register() -> None:
    import importlib

    for name in COMMANDS:
        module = importlib.import_module(f"tierdiag.cli.{name}")
        fn = getattr(module, name)
        app.command(name, short_help=_first_sentence(fn.__doc__))(fn)


_register()


def _is_no_args_help(exc: Exception) -> bool:
    # `tierdiag` alone prints the help and raises this; it lives in Typer's vendored click.
    return type(exc).__name__ == "NoArgsIsHelpError"


def main() -> None:
    debug = "--debug" in sys.argv[1:]
    try:
        result = app(prog_name="tierdiag", standalone_mode=False)
        # Outside standalone mode Typer catches `typer.Exit(code)` itself and returns the code.
        if isinstance(result, int) and not isinstance(result, bool) and result:
            sys.exit(result)
    except TierdiagError as exc:
        if debug:
            raise
        print(f"tierdiag: error: {exc.one_line()}", file=sys.stderr)
        sys.exit(int(exc.exit_code))
    except KeyboardInterrupt:
        print("tierdiag: interrupted", file=sys.stderr)
        sys.exit(int(ExitCode.INTERRUPTED))
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.TyperException as exc:  # usage: unknown command/option, a value Typer could not parse
        if _is_no_args_help(exc):  # `tierdiag` alone: the help, on stdout, and success
            print(exc.format_message())
            sys.exit(int(ExitCode.OK))
        # "Value error, " is pydantic's prefix on a choice Typer refused: noise in a one-line error.
        first = exc.format_message().replace("Value error, ", "").strip().splitlines()
        ctx = getattr(exc, "ctx", None)
        where = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        print(f"tierdiag: error: {first[0] if first else type(exc).__name__}{where}", file=sys.stderr)
        sys.exit(int(getattr(exc, "exit_code", ExitCode.USAGE)))
    except BrokenPipeError:
        # `tierdiag runs --json | head`: the reader went away; that is not an error of ours.
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(int(ExitCode.OK))
    except typer.Abort:
        print("tierdiag: aborted", file=sys.stderr)
        sys.exit(int(ExitCode.INTERRUPTED))
    except SystemExit:
        raise
    except Exception as exc:  # a bug: one line, and the way to see more
        if debug:
            raise
        first = str(exc).splitlines()[0] if str(exc) else ""
        print(f"tierdiag: internal error: {type(exc).__name__}: {first} (re-run with --debug and report it)",
              file=sys.stderr)
        sys.exit(int(ExitCode.BUG))
