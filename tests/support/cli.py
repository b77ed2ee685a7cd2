"""The real `tierdiag` entry point in a subprocess, as a user runs it, and how a clean failure
looks (one stderr line, a named exit code, no traceback). Every test folder runs the CLI
through this: `run` (a CompletedProcess), `tierdiag` (a Result with `.fails` and `.json`)."""

from __future__ import annotations

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
    a process each would cost seconds: exit 0 asserted, stdout returned."""
    from typer.testing import CliRunner

    from tierdiag.cli.main import app

    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, (result.output, result.exception)
    return result.output


def invoke_json(*args: object):
    """`invoke(*args, "--json")`, parsed (anything printed before the object skipped)."""
    out = invoke(*args, "--json")
    return json.loads(out[out.index("{"):])
