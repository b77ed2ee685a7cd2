"""The `tierdiag` command: a table of commands. Each is one module under tierdiag/cli/ whose
function of the same name parses, makes one call and renders; cli/exits.py is the one place
errors become exits, cli/params.py what every parameter goes through.

Start-up: a command's module is imported when that command runs (`tierdiag explain` loads
cli/explain.py and nothing of replay, sweep or report), and `tierdiag --help` lists the table
without importing any. Typer loads in `main()`, after the signal handlers are in place, unless
the command line is a plain `summary`, `explain` or `replay` (called without Typer: below);
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


# --- plain forms, without Typer --------------------------------------------------------------
# `tierdiag summary` and `tierdiag explain REQ` are read commands whose whole run is ~0.3 s, and
# importing Typer (and the click it vendors, inspect, ast, subprocess...) was ~45 ms of it; a
# `replay` reached its engine ~0.25 s after its start, ~25 ms of it Typer's import and the
# building of its 39-parameter command. Their plain forms are parsed here and the command's
# function called as Typer calls it (its arguments checked by params.checked, the same exits);
# anything else (--help, --no-json, `--db=X`, an option twice, a value that starts with "-" or is
# empty or not UTF-8, a number Python's int() or float() does not read as it is, a missing or
# extra argument, shell completion, a path that is there but not readable) goes to Typer, which
# parses it or says what is wrong with it as it always has. tests/cli/test_direct_commands.py
# holds the two paths to the same parameters (each command's table to Typer's own command) and
# to the same outputs.
# A parameter's kind: "str" (the text), "path" (a Path; one that is there but not readable is
# Typer's: "Path ... is not readable."), "int"/"float" (the text as int()/float() read it, as
# params.py's coercion reads it first).
_DIRECT: dict[str, tuple[tuple[tuple[str, str], ...], dict[str, tuple[str, str]], dict[str, tuple[str, bool]]]] = {
    # name -> (its positional parameters and kinds, its options that take a value: option ->
    # (parameter, kind), its flags: option -> (parameter, value))
    "summary": ((), {"--db": ("db", "path"), "--run": ("run", "str")}, {"--json": ("json_", True)}),
    "explain": ((("req_id", "str"),), {"--db": ("db", "path"), "--run": ("run", "str")},
                {"--json": ("json_", True)}),
    "replay": ((("trace", "path"),), {
        "--db": ("db", "path"), "--run-name": ("run_name", "str"), "--config": ("config", "path"),
        "--model": ("model", "str"), "--gpu": ("gpu", "str"), "--device-tokens": ("device_tokens", "int"),
        "--host-tokens": ("host_tokens", "int"), "--storage-tokens": ("storage_tokens", "int"),
        "--storage-dir": ("storage_dir", "path"), "--page-size": ("page_size", "int"),
        "--block-size": ("block_size", "int"), "--write-policy": ("write_policy", "str"),
        "--eviction-policy": ("eviction_policy", "str"), "--tlru-threshold": ("tlru_threshold", "int"),
        "--tlru-next-prompt-estimate": ("tlru_next_prompt_estimate", "int"),
        "--load-back-threshold": ("load_back_threshold", "int"), "--prefetch-policy": ("prefetch_policy", "str"),
        "--schedule-policy": ("schedule_policy", "str"), "--prefetch-threshold": ("prefetch_threshold", "int"),
        "--max-prefill-tokens": ("max_prefill_tokens", "int"), "--timing": ("timing", "str"),
        "--profile": ("profile", "path"), "--time-scale": ("time_scale", "float"), "--arrivals": ("arrivals", "str"),
        "--max-context": ("max_context", "int"), "--max-running-requests": ("max_running_requests", "int"),
        "--seed": ("seed", "int"), "--verify": ("verify", "str"), "--data-plane-mib": ("data_plane_mib", "int"),
        "--dp": ("dp", "int"), "--router": ("router", "str"), "--sglang": ("sglang", "str"), "--jobs": ("jobs", "int"),
    }, {"--overlap": ("overlap", True), "--no-overlap": ("overlap", False),
        "--enable-mixed-chunk": ("enable_mixed_chunk", True), "--skip-bad": ("skip_bad", True),
        "--no-probes": ("no_probes", True), "--json": ("json_", True)}),
}


def _plain_token(token: str) -> bool:
    if not token or token.startswith("-"):
        return False
    try:
        token.encode("utf-8")  # a byte that was not UTF-8 is a surrogate here: Typer's path names it
    except UnicodeEncodeError:
        return False
    return True


_DECLINE = object()  # a value the direct path leaves to Typer


def _plain_value(token: str, kind: str):
    """`token` as Typer hands it to the command for a parameter of `kind`, or _DECLINE."""
    if kind == "str":
        return token
    if kind == "int" or kind == "float":
        try:
            return int(token) if kind == "int" else float(token)
        except ValueError:
            return _DECLINE
    import os
    from pathlib import Path

    try:  # as Typer's path check (typer._param_types.coerce_cli_path): stat, then readable
        os.stat(token)
    except OSError:
        return Path(token)
    return Path(token) if os.access(token, os.R_OK) else _DECLINE


# The read commands' parameters in their functions' order, with their defaults: known here, so
# that deciding does not import their modules (their classes are made after the table of
# dataclass methods is installed, their DuckDB after duckdb_core's).
_READ_DEFAULTS = {"req_id": None, "db": None, "run": None, "json_": False}


def _defaults(name: str) -> dict:
    """Every parameter of command `name` in the function's order, with what Typer passes where the
    command line does not give it: the function's own default (db: the default store)."""
    if name in ("summary", "explain"):
        return {k: v for k, v in _READ_DEFAULTS.items() if k != "req_id" or name == "explain"}
    import importlib
    import inspect

    fn = getattr(importlib.import_module(f"tierdiag.cli.{COMMANDS[name][0]}"), name)
    return {p.name: p.default for p in inspect.signature(fn).parameters.values()}


def direct_arguments(argv: list[str], environ) -> tuple[str, dict] | None:
    """(command, the keyword arguments Typer would call it with) for `argv` (sys.argv[1:]) in a
    plain form of a command of _DIRECT; None where Typer must parse it."""
    if not argv or argv[0] not in _DIRECT or "_TIERDIAG_COMPLETE" in environ:
        return None
    positional, options, flags = _DIRECT[argv[0]]
    given: dict = {}
    args: list = []
    i = 1
    while i < len(argv):
        token = argv[i]
        if token in flags:
            name, value = flags[token]
            if name in given:
                return None
            given[name] = value
            i += 1
            continue
        if token in options:
            name, kind = options[token]
            if name in given or i + 1 >= len(argv) or not _plain_token(argv[i + 1]):
                return None
            value = _plain_value(argv[i + 1], kind)
            if value is _DECLINE:
                return None
            given[name] = value
            i += 2
            continue
        if not _plain_token(token) or len(args) >= len(positional):
            return None
        value = _plain_value(token, positional[len(args)][1])
        if value is _DECLINE:
            return None
        args.append(value)
        i += 1
    if len(args) != len(positional):
        return None
    values = {**given, **dict(zip((p for p, _ in positional), args))}
    if "db" not in values:
        from tierdiag.cli.common import DEFAULT_DB_PATH

        values["db"] = _plain_value(str(DEFAULT_DB_PATH), "path")  # the default store, checked as a given one
        if values["db"] is _DECLINE:
            return None
    return argv[0], {k: values.get(k, default) for k, default in _defaults(argv[0]).items()}


class _Direct:
    """What `exits.run` calls in place of the Typer app for a plain command line (_DIRECT): the
    command's function, its arguments checked, ending as Typer's app ends outside standalone mode
    (a KeyboardInterrupt returns 130, an EOFError is an Abort after an empty line, a broken pipe
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
    """The plain command's direct call where sys.argv is one (above), else the Typer app."""
    import os
    import sys

    from tierdiag import dataclass_code

    argv = sys.argv[1:]
    if argv[:1] == ["replay"]:
        # A replay, either path: the methods `dataclasses` writes for each class, compiled once
        # and kept with the bytecode (tierdiag/dataclass_code.py; the replay's own table): ~14 % of
        # its instructions before `Engine.run`, before any class is created.
        dataclass_code.install(table="replay")
    found = direct_arguments(argv, os.environ)
    if found is None:
        return _build_app()
    if found[0] == "replay":
        return _Direct(*found)
    # The same for the read commands (~15-20 % of their instructions), their own table.
    dataclass_code.install()
    # DuckDB's C extension without its Python package, which loads if anything asks for it
    # (store/duckdb_core.py): ~90 ms of a ~0.3 s command's CPU.
    from tierdiag.store import duckdb_core

    duckdb_core.install()
    return _Direct(*found)


def main() -> None:
    from tierdiag.cli.exits import run, the_process_ends_after

    the_process_ends_after()
    run(_app_for_argv)


def entry() -> None:
    """The `tierdiag` console script: `main`, ending the process without the interpreter's
    teardown after a command that asked for it (cli/exits.py `leave_without_teardown`)."""
    import sys

    if sys.argv[1:2] == ["replay"]:
        # The collector's thresholds a replay runs under (app/replay.py `_fewer_gc_passes`) from
        # the process's start: the ~10^5 objects its imports make (modules, classes, the config's
        # types) live as long as the process, and at the default thresholds the collector's full
        # passes walked them again and again before the replay raised them (~2 % of the start's
        # instructions, issue 41). This process ends after the command.
        import gc

        gc.set_threshold(50_000, 20, 100)
    elif sys.argv[1:2] == ["sweep"] and not any(a.startswith(("--ray", "--resume", "--help", "-h"))
                                                 for a in sys.argv[2:]):
        # A local sweep: its workers' fork server boots and imports the replay from now, beside
        # this process's own start (Typer, the command's modules, the plan: ~0.17 s of CPU before
        # the command itself would start it, a core idle meanwhile: app/sweep_fork.py). The
        # command's own call then finds it running; a command line that fails to parse leaves
        # a server that ends with this process.
        from tierdiag.app.sweep_fork import warm_up_workers

        warm_up_workers()
        # The driver's imports (Typer, duckdb, pyarrow, numpy, Rich: ~10^5 objects that live to
        # its exit) under the collector's thresholds a replay starts with, not walked again and
        # again by default-threshold passes while the fork server boots beside them; the driver
        # allocates little after them (a run merged at a time) and ends after the command.
        import gc

        gc.set_threshold(50_000, 20, 100)
        # Its dataclass methods from its own table (tierdiag/dataclass_code.py), as a replay's.
        from tierdiag import dataclass_code

        dataclass_code.install(table="sweep_driver")
    from tierdiag.cli.exits import run_and_leave

    run_and_leave(_app_for_argv)
