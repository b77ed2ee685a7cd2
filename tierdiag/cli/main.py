"""The `tierdiag` command. Commands are thin: parse, call one library function, render.

Every TierdiagError becomes one line on stderr and its exit code; anything else is a bug and
says so in one line (the traceback with --debug). Ctrl-C and SIGTERM are interrupts wherever
they land (while the CLI starts, in our code, in DuckDB, in Typer, which turns a
KeyboardInterrupt into a silent Exit(130)): one "interrupted" line, exit 130 (143 for SIGTERM).

Importing this module is cheap and has no side effects: Typer loads in `main()`, after the
signal handlers are in place and inside its error handling (`app` is built on first use, so
`from tierdiag.cli.main import app` still works). Command modules load lazily: `tierdiag
explain ...` imports tierdiag/cli/explain.py and nothing of replay, sweep or report. The list in
`tierdiag --help` and shell completion of command names read each command's first docstring
sentence from its source file (ast), without importing it; `tierdiag CMD --help` imports CMD.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import sys
from pathlib import Path

from tierdiag import signals
from tierdiag.errors import ConfigError, ExitCode, OutputError, RunInterrupted, TierdiagError

# The order of `tierdiag --help`: record, then read. Each module imports only what its
# command needs at call time (torch only inside replay/calibrate), so read-only commands start fast.
COMMANDS = ("replay", "sweep", "runs", "summary", "slow", "explain", "advise", "compare", "report", "export", "synth", "convert", "calibrate", "doctor")
# Command groups: name -> (module under tierdiag.cli, its Typer app). `import` is a Python
# keyword, and a command group (`tierdiag import sglang ...`).
GROUPS = {"import": ("import_sglang", "import_app")}

_INT64_MAX = 2**63 - 1
_app = []


def _ints_fit_int64(fn):
    """Every integer option and argument must fit int64 (what DuckDB and the engine hold): a
    larger one is an option value out of range (exit 2) naming the option, never a crash later.
    Typer passes values by name; the flag is the name with dashes (what --help shows)."""
    @functools.wraps(fn)
    def checked(**kwargs):
        for name, value in kwargs.items():
            if type(value) is int and not -_INT64_MAX - 1 <= value <= _INT64_MAX:
                flag = "--" + name.rstrip("_").replace("_", "-")
                raise ConfigError(f"{flag} {value} is out of range (at most {_INT64_MAX:,})")
        return fn(**kwargs)

    return checked


def _first_sentence(doc: str | None) -> str | None:
    """A command's line in `tierdiag --help`: its docstring's first sentence, whole (click would
    cut it at the terminal width with "...", and wrapping is better than cutting)."""
    if not doc:
        return None
    text = " ".join(doc.split())
    end = text.find(". ")
    return text if end < 0 else text[:end + 1]


def _print_version(value: bool) -> None:
    if value:
        from tierdiag import __version__

        print(f"tierdiag {__version__}")
        import typer

        raise typer.Exit()


def _source_help(module: str, attr: str) -> str | None:
    """The first sentence of command `attr`'s help in tierdiag/cli/<module>.py, read from the
    source (the function's docstring, or a Typer(help=...) assigned to `attr`), not imported."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec(f"tierdiag.cli.{module}")
    if spec is None or not spec.origin:
        return None
    with open(spec.origin, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), spec.origin)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == attr:
            return _first_sentence(ast.get_docstring(node))
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == attr for t in node.targets)
                and isinstance(node.value, ast.Call)):
            for kw in node.value.keywords:
                if kw.arg == "help" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                    return _first_sentence(kw.value.value)
    return None


_PLAIN = (str, bool, int, float)


def _parse_number(text: str, kind: type, param, ctx):
    """An int or float option's text as pydantic's lax mode reads it ('1_000', ' 12 ', '12.0'
    for an int; 'inf' for a float, which the config's own range checks then refuse)."""
    from decimal import Decimal, InvalidOperation

    try:
        if kind is float:
            return float(text)
        try:
            return int(text)
        except ValueError:
            d = Decimal(text.strip().replace("_", ""))
            if d.is_finite() and d == d.to_integral_value() and "e" not in text.lower():
                return int(d)
    except (ValueError, InvalidOperation):
        pass
    from typer._click.exceptions import BadParameter

    raise BadParameter(f"{text!r} is not {'an integer' if kind is int else 'a number'}", ctx=ctx, param=param)


def _plain_coercion(params) -> None:
    """Typer 0.29 turns every parameter value into its annotated type through a pydantic
    TypeAdapter, and importing pydantic for that (and its plugin scan, importlib.metadata) was
    about a third of `explain`'s import time (0.15 s of every `replay`). A `str` parameter (click
    already parsed a str), a `bool` flag (click gives a bool; unset, None needs no coercion), an
    `int` or `float` (click's INT/FLOAT types, and their ranges, parsed and checked it already)
    and a `Path` (Path(str) cannot fail; Typer's own path checks still run) need none of it. Every
    other parameter (lists, enums, custom parsers) keeps Typer's coercion, and so does everything
    where this Typer's internals differ."""
    try:
        from typer._coercion import RuntimeParam, build_runtime_param
        from typer._param_types import coerce_cli_path
        from typer.core import _TyperParameter
    except ImportError:
        return
    plain = _plain_runtime_param_class(RuntimeParam, build_runtime_param, coerce_cli_path)
    for param in params:
        desc = getattr(param, "type_descriptor", None)
        if (not isinstance(param, _TyperParameter) or getattr(param, "_runtime_param", False) is not None
                or desc is None or getattr(desc, "file_annotation", True) is not None):
            continue
        info = desc.parameter_info
        if getattr(info, "parser", True) is not None:
            continue
        annotation = desc.annotation
        path_type = getattr(info, "path_type", None) or annotation
        if annotation in _PLAIN or (isinstance(annotation, type) and issubclass(annotation, Path)
                                         and isinstance(path_type, type) and issubclass(path_type, Path)):
            param._runtime_param = plain(parameter_info=info, annotation=annotation)


@functools.cache
def _plain_runtime_param_class(RuntimeParam, build_runtime_param, coerce_cli_path):
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class PlainRuntimeParam(RuntimeParam):
        def _coerce_value(self, value, param, ctx):
            if self.annotation in _PLAIN:
                if type(value) is self.annotation:  # exact: a bool is an int, and is not one here
                    return value
                if isinstance(value, str) and self.annotation in (int, float):
                    return _parse_number(value, self.annotation, param, ctx)
            else:
                path_type = self.parameter_info.path_type or self.annotation
                if isinstance(value, str):
                    value = path_type(value)
                if isinstance(value, path_type):
                    return coerce_cli_path(value, self.parameter_info, path_type=path_type, param=param, ctx=ctx)
            # Anything unexpected (bytes, another type): Typer's own coercion decides.
            return build_runtime_param(param.type_descriptor)._coerce_value(value, param=param, ctx=ctx)

    return PlainRuntimeParam


def _lazy_group_class():
    """A TyperGroup whose commands are built on first use (typer is imported by the caller)."""
    from collections.abc import Mapping

    import typer.main
    from typer.core import TyperCommand, TyperGroup
    from typer.models import CommandInfo, TyperInfo

    class PlainCommand(TyperCommand):
        def get_params(self, ctx):
            params = super().get_params(ctx)
            _plain_coercion(params)
            return params

    class LazyCommands(Mapping):
        """name -> click command, importing the command's module on first access only."""

        def __init__(self):
            self._built = {}

        def __iter__(self):
            return iter(COMMANDS + tuple(GROUPS))

        def __len__(self):
            return len(COMMANDS) + len(GROUPS)

        def __getitem__(self, name):
            if name not in self._built:
                self._built[name] = self._build(name)
            return self._built[name]

        @staticmethod
        def _build(name):
            import importlib

            if name in GROUPS:
                module, attr = GROUPS[name]
                sub = getattr(importlib.import_module(f"tierdiag.cli.{module}"), attr)
                return typer.main.get_group_from_info(TyperInfo(sub), pretty_exceptions_short=True,
                                                      rich_markup_mode=None, suggest_commands=True)
            if name not in COMMANDS:
                raise KeyError(name)
            fn = getattr(importlib.import_module(f"tierdiag.cli.{name}"), name)
            info = CommandInfo(name=name, callback=_ints_fit_int64(fn), short_help=_first_sentence(fn.__doc__),
                               cls=PlainCommand)
            return typer.main.get_command_from_info(info, pretty_exceptions_short=True, rich_markup_mode=None)

    class LazyGroup(TyperGroup):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.commands = LazyCommands()

        def list_commands(self, ctx):
            return list(self.commands)

        def get_params(self, ctx):
            # Here, not when built: Typer adds --install-completion after, click --help when asked.
            params = super().get_params(ctx)
            _plain_coercion(params)
            return params

        def _short_helps(self, names):
            return [(n, _source_help(*(GROUPS.get(n) or (n, n))) or "") for n in names]

        def format_commands(self, ctx, formatter):
            # The list without importing a single command module (their help comes from source).
            rows = self._short_helps(self.list_commands(ctx))
            if rows:
                with formatter.section("Commands"):
                    formatter.write_dl(rows)

        def shell_complete(self, ctx, incomplete):
            from typer.core import CompletionItem  # click's (typer vendors it)

            names = [n for n in self.list_commands(ctx) if n.startswith(incomplete)]
            results = [CompletionItem(n, help=h) for n, h in self._short_helps(names)]
            results.extend(super(TyperGroup, self).shell_complete(ctx, incomplete))
            return results

    return LazyGroup


def _build_app():
    if _app:
        return _app[0]
    import typer

    app = typer.Typer(
        name="tierdiag",
        help="Why was a cached prefix still slow? Replay a trace through a tiered KV cache, then explain it.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=True,
        rich_markup_mode=None,
        context_settings={"help_option_names": ["-h", "--help"]},
        cls=_lazy_group_class(),
    )

    @app.callback()
    def _root(debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
              version: bool = typer.Option(False, "--version", "-V", callback=_print_version, is_eager=True,
                                           help="Show the version and exit.")) -> None:
        pass  # --debug is read from sys.argv by main(), before Typer parses anything

    _app.append(app)
    return app


def __getattr__(name: str):
    if name == "app":
        return _build_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    """One line on stderr; what came from data (a path, an id) shown with controls escaped."""
    from tierdiag.report.terminal import visible

    print(f"tierdiag: {visible(line, lines=False)}", file=sys.stderr)


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


def main() -> None:
    signals.install()
    try:
        _main()
    finally:
        # Done, one way or another (what is said is said): a signal while the interpreter shuts
        # down (it resets handlers to the default, which kills) must not change the exit.
        signals.ignore()


def entry() -> None:
    """The `tierdiag` console script: `main`, then, after a command that asked for it
    (`leave_without_teardown`), the end of the process without the interpreter's teardown
    (`_leave`). `main` itself returns or raises SystemExit as ever, for whoever calls it."""
    try:
        main()
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


def leave_without_teardown() -> None:
    """Ask `entry` to end this process by `_leave` (the command has closed what it opened)."""
    _LEAVE_FAST.append(True)


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


def _main() -> None:
    debug = "--debug" in sys.argv[1:]
    if sys.stdout is not None and not isinstance(sys.stdout, _GuardedStdout):
        sys.stdout = _GuardedStdout(sys.stdout)
    try:
        with signals.deferred():  # C extensions (duckdb, pyarrow) load here: let them finish
            app = _build_app()
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
