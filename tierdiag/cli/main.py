"""The `tierdiag` command: a table of commands. Each is one module under tierdiag/cli/ whose
function of the same name parses, makes one call and renders; cli/exits.py is the one place
errors become exits, cli/params.py what every parameter goes through.

Start-up: a command's module is imported when that command runs (`tierdiag explain` loads
cli/explain.py and nothing of replay, sweep or report), and `tierdiag --help` lists the table
without importing any. Typer loads in `main()`, after the signal handlers are in place;
`from tierdiag.cli.main import app` builds the app on first use.
"""

from __future__ import annotations

import functools

# name -> (module under tierdiag.cli, its line in `tierdiag --help`), in the order of `--help`:
# record, then read. The module's function `name` is the command; its docstring the full help.
COMMANDS: dict[str, tuple[str, str]] = {
    "replay": ("replay", "Replay a trace through the tiered cache engine and record every request."),
    "import": ("import_sglang", "Record a server's own per-request export as an observed run."),
    "sweep": ("sweep", "Replay a trace once per combination of option values, then compare the runs."),
    "runs": ("runs", "List the runs in the database (or delete one)."),
    "summary": ("summary", "One run at a glance: tokens by tier, TTFT percentiles, load-backs, evictions."),
    "slow": ("slow", "Requests ranked by how much slower they were than their ideal."),
    "explain": ("explain", "Why was this request slow? The troubleshooting order, then the verdict."),
    "advise": ("advise", "Propose cache changes from a run's diagnosis and replay each to check it."),
    "compare": ("compare", "Compare runs side by side, or one request in two runs."),
    "report": ("report", "Write an HTML report of a run (or a comparison of runs)."),
    "export": ("export", "Export runs to Parquet partitioned by run_id."),
    "synth": ("synth", "Write a synthetic workload trace."),
    "convert": ("convert", "Convert a public session trace (kv-cache-tester, bailian) to a tierdiag trace."),
    "calibrate": ("calibrate", "Measure the copy kernels here and save a profile for `replay --profile`."),
    "doctor": ("doctor", "Check this machine: versions, GPUs and PCIe links, pinned memory."),
}
# `import` is a Python keyword and a command group (`tierdiag import sglang ...`): its module
# holds a Typer app under this name instead of a function.
GROUP_APPS = {"import": "import_app"}

_app = []


def _command(name: str):
    """The click command of `name`, its module imported now."""
    import importlib

    import typer.main
    from typer.models import CommandInfo, TyperInfo

    from tierdiag.cli.params import checked

    module, short_help = COMMANDS[name]
    mod = importlib.import_module(f"tierdiag.cli.{module}")
    if name in GROUP_APPS:
        group = getattr(mod, GROUP_APPS[name])
        for info in group.registered_commands:  # its commands checked and coerced as every other
            info.callback, info.cls = checked(info.callback), info.cls or _plain_command_class()
        return typer.main.get_group_from_info(TyperInfo(group), rich_markup_mode=None,
                                              pretty_exceptions_short=True, suggest_commands=True)
    info = CommandInfo(name=name, callback=checked(getattr(mod, name)), short_help=short_help, cls=_plain_command_class())
    return typer.main.get_command_from_info(info, pretty_exceptions_short=True, rich_markup_mode=None)


@functools.cache
def _plain_command_class():
    from typer.core import TyperCommand

    from tierdiag.cli.params import plain_coercion

    class PlainCommand(TyperCommand):
        def get_params(self, ctx):  # here, not when built: click adds --help when asked
            params = super().get_params(ctx)
            plain_coercion(params)
            return params

    return PlainCommand


def _group_class():
    """click's lazy group (list_commands/get_command) over the table."""
    from typer.core import TyperGroup

    from tierdiag.cli.params import plain_coercion

    class Commands(TyperGroup):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.suggest_commands = False  # Typer's suggests from the commands built so far: the table's here

        def resolve_command(self, ctx, args):
            from difflib import get_close_matches

            from typer._click.exceptions import UsageError

            try:
                return super().resolve_command(ctx, args)
            except UsageError as exc:
                matches = get_close_matches(args[0], list(COMMANDS)) if args else []
                if matches:
                    exc.message = f"{exc.message.rstrip('.')}. Did you mean {', '.join(map(repr, matches))}?"
                raise

        def list_commands(self, ctx):
            return list(COMMANDS)

        def get_command(self, ctx, name):
            if name not in COMMANDS:
                return None
            if name not in self.commands:
                self.commands[name] = _command(name)
            return self.commands[name]

        def format_commands(self, ctx, formatter):  # the table's lines: no command imported
            with formatter.section("Commands"):
                formatter.write_dl([(name, line) for name, (_, line) in COMMANDS.items()])

        def shell_complete(self, ctx, incomplete):  # the table's lines: no command imported
            from typer._click.core import Command
            from typer.core import CompletionItem

            return ([CompletionItem(name, help=line) for name, (_, line) in COMMANDS.items()
                     if name.startswith(incomplete)] + Command.shell_complete(self, ctx, incomplete))

        def get_params(self, ctx):
            params = super().get_params(ctx)
            plain_coercion(params)
            return params

    return Commands


def _print_version(value: bool) -> None:
    if value:
        import typer

        from tierdiag import __version__

        print(f"tierdiag {__version__}")
        raise typer.Exit()


def _build_app():
    if _app:
        return _app[0]
    import typer

    app = typer.Typer(name="tierdiag", no_args_is_help=True, pretty_exceptions_enable=False, add_completion=True,
                      help="Why was a cached prefix still slow? Replay a trace through a tiered KV cache, then explain it.",
                      rich_markup_mode=None, context_settings={"help_option_names": ["-h", "--help"]},
                      cls=_group_class())

    @app.callback()
    def _root(debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
              version: bool = typer.Option(False, "--version", "-V", callback=_print_version, is_eager=True,
                                           help="Show the version and exit.")) -> None:
        pass  # --debug is read from sys.argv by cli/exits.py, before Typer parses anything

    _app.append(app)
    return app


def __getattr__(name: str):
    if name == "app":
        return _build_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --- the read commands' plain forms, without Typer ------------------------------------------------
# `tierdiag summary` and `tierdiag explain REQ` are read commands whose whole run is ~0.3 s, and
# importing Typer (and the click it vendors, inspect, ast, subprocess...) was ~45 ms of it. Their
# plain forms are parsed here and the command's function called as Typer calls it (its arguments
# checked by params.checked, the same exits); anything else (--help, --no-json, `--db=X`, an
# option twice, a value that starts with "-" or is empty or not UTF-8, a missing or extra
# argument, shell completion, a --db that is there but not readable) goes to Typer, which parses
# it or says what is wrong with it as it always has. tests/cli/test_direct_commands.py holds the
# two paths to the same outputs.
# name -> (its positional parameters, its options that take a value, its flags): option -> parameter
_DIRECT: dict[str, tuple[tuple[str, ...], dict[str, str], dict[str, str]]] = {
    "summary": ((), {"--db": "db", "--run": "run"}, {"--json": "json_"}),
    "explain": (("req_id",), {"--db": "db", "--run": "run"}, {"--json": "json_"}),
}
_DIRECT_ORDER = ("req_id", "db", "run", "json_")  # the parameters in the functions' order
_DIRECT_DEFAULTS = {"run": None, "json_": False}


def _plain_token(token: str) -> bool:
    if not token or token.startswith("-"):
        return False
    try:
        token.encode("utf-8")  # a byte that was not UTF-8 is a surrogate here: Typer's path names it
    except UnicodeEncodeError:
        return False
    return True


def direct_arguments(argv: list[str], environ) -> tuple[str, dict] | None:
    """(command, the keyword arguments Typer would call it with) for `argv` (sys.argv[1:]) in a
    plain form of a read command; None where Typer must parse it."""
    if not argv or argv[0] not in _DIRECT or "_TIERDIAG_COMPLETE" in environ:
        return None
    positional, options, flags = _DIRECT[argv[0]]
    given: dict = {}
    args: list[str] = []
    i = 1
    while i < len(argv):
        token = argv[i]
        name = options.get(token) or flags.get(token)
        if name is not None:
            if name in given:
                return None
            if token in flags:
                given[name] = True
                i += 1
                continue
            if i + 1 >= len(argv) or not _plain_token(argv[i + 1]):
                return None
            given[name] = argv[i + 1]
            i += 2
            continue
        if not _plain_token(token):
            return None
        args.append(token)
        i += 1
    if len(args) != len(positional):
        return None
    import os
    from pathlib import Path

    from tierdiag.cli.common import DEFAULT_DB_PATH

    db = Path(given["db"]) if "db" in given else DEFAULT_DB_PATH
    # A --db that is not there (yet) is the command's to report, as through Typer; one that is
    # there but not readable is Typer's ("Path ... is not readable.").
    if os.path.exists(db) and not os.access(db, os.R_OK):
        return None
    values = {**_DIRECT_DEFAULTS, **given, **dict(zip(positional, args)), "db": db}
    return argv[0], {k: values[k] for k in _DIRECT_ORDER if k in values}


class _Direct:
    """What `exits.run` calls in place of the Typer app for a plain read command: the command's
    function, its arguments checked, ending as Typer's app ends outside standalone mode (a
    KeyboardInterrupt returns 130, an EOFError is an Abort after an empty line, a broken pipe
    exit 1)."""

    def __init__(self, name: str, kwargs: dict):
        self.name, self.kwargs = name, kwargs

    def __call__(self, *, prog_name: str, standalone_mode: bool):
        import errno
        import importlib
        import sys

        from tierdiag.cli.params import checked

        fn = checked(getattr(importlib.import_module(f"tierdiag.cli.{COMMANDS[self.name][0]}"), self.name))
        try:
            return fn(**self.kwargs)
        except KeyboardInterrupt:
            return 130
        except EOFError as exc:
            import typer

            print(file=sys.stderr)
            raise typer.Abort() from exc
        except OSError as exc:
            if exc.errno != errno.EPIPE:
                raise
            from typer._click.utils import PacifyFlushWrapper

            sys.stdout, sys.stderr = PacifyFlushWrapper(sys.stdout), PacifyFlushWrapper(sys.stderr)
            sys.exit(1)


def _app_for_argv():
    """The plain read command's direct call where sys.argv is one (above), else the Typer app."""
    import os
    import sys

    found = direct_arguments(sys.argv[1:], os.environ)
    if found is None:
        return _build_app()
    # The methods `dataclasses` writes for each class, compiled once and kept with the bytecode
    # (cli/dataclass_code.py): ~15-20 % of these commands' instructions, before any is created.
    from tierdiag.cli import dataclass_code

    dataclass_code.install()
    # DuckDB's C extension without its Python package, which loads if anything asks for it
    # (store/duckdb_core.py): ~90 ms of a ~0.3 s command's CPU.
    from tierdiag.store import duckdb_core

    duckdb_core.install()
    return _Direct(*found)


def main() -> None:
    from tierdiag.cli.exits import run

    run(_app_for_argv)


def entry() -> None:
    """The `tierdiag` console script: `main`, ending the process without the interpreter's
    teardown after a command that asked for it (cli/exits.py `leave_without_teardown`)."""
    from tierdiag.cli.exits import run_and_leave

    run_and_leave(_app_for_argv)
