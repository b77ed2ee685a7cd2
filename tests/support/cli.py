"""The real `tierdiag` entry point in a subprocess, as a user runs it, and how a clean failure
looks (one stderr line, a named exit code, no traceback). Every test folder runs the CLI
through this: `run` (a CompletedProcess), `tierdiag` (a Result with `.fails` and `.json`); where
the process is not what a test is about, `tierdiag_in_process` / `completed_in_process` (the same
entry point's error handling in the test's process: no interpreter start, ~0.45 s of CPU a call)."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENTRY = "from tierdiag.cli.main import main; main()"


def cli_env(*, columns: int | None = 200, keep_width: bool = True, **extra: str) -> dict[str, str]:
    """This checkout first on the path (also for what the CLI starts); no TIERDIAG_* setting
    inherited but TIERDIAG_CPLANE (a suite run on numpy replays on numpy throughout), and
    TIERDIAG_PROGRESS_EVERY_S=0 unless given; COLUMNS as given (None: no width, nor
    LINES/NO_COLOR/FORCE_COLOR, inherited)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERDIAG_") or k == "TIERDIAG_CPLANE"}
    if not keep_width or columns is None:
        for k in ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR"):
            env.pop(k, None)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    if columns is not None:
        env["COLUMNS"] = str(columns)
    # No piped progress lines (tierdiag/cli/progress.py) unless a test asks: a slow machine must
    # not add lines to the stderr a test reads. tests/cli/test_progress.py sets it.
    env["TIERDIAG_PROGRESS_EVERY_S"] = "0"
    env.update(extra)
    return env


def cli_argv(*args: object) -> list[str]:
    return [sys.executable, "-c", ENTRY, *map(str, args)]


def run(*args: object, env: dict[str, str] | None = None, timeout: float = 300, cwd: Path | None = None,
        **popen) -> subprocess.CompletedProcess:
    """`tierdiag ARGS...` to its end; stdout and stderr captured as text."""
    return subprocess.run(cli_argv(*args), capture_output=True, text=True, env=env or cli_env(), timeout=timeout,
                          cwd=cwd, **popen)


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str

    def fails(self, code: int, *fragments: str) -> str:
        """Assert a clean failure: this exit code, one stderr line holding every fragment."""
        return one_line_error(self.code, self.err, code, *fragments)

    def json(self):
        assert self.code == 0, self.err
        return json.loads(self.out)

    def __iter__(self):
        """`code, out, err = tierdiag_in_process(...)`."""
        return iter((self.code, self.out, self.err))


def tierdiag(*args: object, env: dict[str, str] | None = None, timeout: float = 300,
             cwd: Path | None = None) -> Result:
    proc = run(*args, env=env, timeout=timeout, cwd=cwd)
    return Result(proc.returncode, proc.stdout, proc.stderr)


def one_line_error(got_code: int, err: str, code: int, *fragments: str) -> str:
    """Every error a user can cause: one `tierdiag: ` line on stderr holding every fragment, no
    traceback, exit `code`. Returns the line."""
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one stderr line, got {len(lines)}:\n{err}"
    line = lines[0]
    assert line.startswith("tierdiag: "), line
    for fragment in fragments:
        assert fragment in line, f"{fragment!r} not in {line!r}"
    assert got_code == code, f"exit code {got_code}, expected {code}: {line}"
    return line


def invoke(*args: object) -> str:
    """The CLI in this process (Typer's runner), for tests that replay and read many times where
    a process each would cost seconds: exit 0 asserted, stdout returned. Its click commands
    built once for the test process, as `tierdiag_in_process`'s."""
    from typer.testing import CliRunner

    from tierdiag.cli.main import app

    with _commands_built_once():
        result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, (result.output, result.exception)
    return result.output


def invoke_json(*args: object):
    """`invoke(*args, "--json")`, parsed (anything printed before the object skipped)."""
    out = invoke(*args, "--json")
    return json.loads(out[out.index("{"):])


def tierdiag_in_process(*args: object, env: dict[str, str] | None = None, cwd: Path | None = None,
                        direct: bool = False) -> Result:
    """`tierdiag(*args)` without the process: the console script's own error handling
    (`tierdiag.cli.exits.run`: a TierdiagError's one stderr line and exit code, usage errors,
    `internal error` lines) run in this process on the Typer app, as `tierdiag` would in a child,
    for tests of what a command says and writes, not of the process (~0.45 s of CPU a start:
    interpreter, imports). What a child would start with is set for the call and put back
    after it: sys.argv, the environment (`env`, default `cli_env()`: what the CLI starts gets it), the
    working folder, stdout and stderr (UTF-8 text streams over bytes, not terminals, as a pipe
    is), the signal handlers and tierdiag's consoles (made afresh, so COLUMNS is read again).
    Each command's click command is built once for the test process (`_built_once`), as a
    process builds it once. Not for what only a process shows: signals, exit without teardown, what a command imports,
    variables read at import, non-UTF-8 argv or streams.

    `direct`: the app the console script takes for this command line (cli/main.py
    `_app_for_argv`): a plain `runs`/`summary`/`slow`/`explain`/`replay` line calls its command
    without Typer (the direct path), anything else is Typer's. Less the two process-wide installs
    made there for speed (the dataclass table, DuckDB without its Python package): they change
    no output, and here they would outlive the call. Default: Typer's app for every line."""
    import signal

    from tierdiag import signals
    from tierdiag.cli import common, exits
    from tierdiag.cli.main import _build_app

    child_env = dict(env if env is not None else cli_env())
    saved_env, saved_argv, saved_cwd = dict(os.environ), sys.argv, os.getcwd()
    saved_streams = sys.stdout, sys.stderr
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    leave_fast, quiet_stdout = list(exits._LEAVE_FAST), exits._quiet_stdout
    out, err = (io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True) for _ in range(2))
    code = 0
    try:
        os.environ.clear()
        os.environ.update(child_env)
        if cwd is not None:
            os.chdir(cwd)
        sys.argv = ["tierdiag", *map(str, args)]
        _fresh_consoles(common)
        sys.stdout, sys.stderr = out, err
        # After an output error or a closed pipe the CLI points the process's stdout (fd 1) at
        # /dev/null, so the interpreter's last flush cannot fail: here fd 1 is pytest's.
        exits._quiet_stdout = _no_stdout_to_quiet
        try:
            with _commands_built_once():
                exits.run(_direct_app if direct else _build_app)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        out.flush()
        err.flush()
    finally:
        sys.stdout, sys.stderr = saved_streams
        _fresh_consoles(common)
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        for s, h in handlers.items():
            signal.signal(s, h)
        signals.reset()
        exits._LEAVE_FAST[:] = leave_fast
        exits._quiet_stdout = quiet_stdout
    return Result(code, out.buffer.getvalue().decode("utf-8"), err.buffer.getvalue().decode("utf-8"))


_BUILT: dict = {}


@contextlib.contextmanager
def _commands_built_once():
    """cli/main.py `_command` answering from `_built_once` for the block, then put back."""
    from tierdiag.cli import main

    build = main._command
    main._command = functools.partial(_built_once, build)
    try:
        yield
    finally:
        main._command = build


def _built_once(build, name: str):
    """cli/main.py `_command(name)` (`build`) for `tierdiag_in_process`: the click command of
    `name` built once per command function (or group app) for this process, not at every call.
    A process builds it once, at its start; here every call did (Typer's app makes its group
    afresh at each call): ~20 ms of CPU a call, most of a refusal's. Keyed by the function
    itself, so a command function replaced (a test's monkeypatch) is built again."""
    import importlib

    from tierdiag.cli import main

    module, _ = main.COMMANDS[name]
    key = (name, getattr(importlib.import_module(f"tierdiag.cli.{module}"), main.GROUP_APPS.get(name, name)))
    if key not in _BUILT:
        _BUILT[key] = build(name)
    return _BUILT[key]


def completed_in_process(*args: object, env: dict[str, str] | None = None, cwd: Path | None = None,
                         direct: bool = False) -> subprocess.CompletedProcess:
    """`tierdiag_in_process` as `run` answers: a CompletedProcess (returncode, stdout, stderr)."""
    r = tierdiag_in_process(*args, env=env, cwd=cwd, direct=direct)
    return subprocess.CompletedProcess(["tierdiag", *map(str, args)], r.code, r.out, r.err)


def _direct_app():
    """cli/main.py `_app_for_argv` for sys.argv, less its process-wide installs: the command's
    direct call for a plain command line, else the Typer app."""
    from tierdiag.cli.main import _Direct, _build_app, direct_arguments

    found = direct_arguments(sys.argv[1:], os.environ)
    return _build_app() if found is None else _Direct(*found)


def _no_stdout_to_quiet() -> None:
    """`tierdiag_in_process`'s stand-in for cli/exits.py `_quiet_stdout`: nothing to do (the
    command's stdout is a buffer this process reads, not a file descriptor it ends with)."""


def _fresh_consoles(common) -> None:
    """tierdiag's stdout/stderr consoles made again on next use (cli/common.py `_LazyConsole`:
    the width, colour and stream a console reads when it is made)."""
    for console in (common.out, common.err):
        object.__setattr__(console, "_console", None)
