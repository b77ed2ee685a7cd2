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
    add_completion=False,
)

_state = {"debug": False}


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors.")) -> None:
    _state["debug"] = debug


# The order of `tierdiag --help`: record, then read. Each module imports only what its
# command needs at call time (torch only inside replay/calibrate), so read-only commands start fast.
COMMANDS = ("replay", "sweep", "runs", "summary", "slow", "explain", "compare", "report", "export", "synth", "calibrate", "doctor")


def _register() -> None:
    import importlib

    for name in COMMANDS:
        module = importlib.import_module(f"tierdiag.cli.{name}")
        app.command(name)(getattr(module, name))


_register()
app.add_typer(__import__("tierdiag.cli.import_sglang", fromlist=["x"]).import_app)  # `import` is a keyword: a group


def _is_no_args_help(exc: Exception) -> bool:
    # `tierdiag` alone prints the help and raises this; it lives in Typer's vendored click.
    return type(exc).__name__ == "NoArgsIsHelpError"


def main() -> None:
    debug = "--debug" in sys.argv[1:]
    try:
        result = app(standalone_mode=False)
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
        if _is_no_args_help(exc):  # the help is already printed
            sys.exit(int(ExitCode.OK))
        first = exc.format_message().strip().splitlines()
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
