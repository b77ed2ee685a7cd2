"""Issue 42 item 7: every `next:` line a command prints runs as printed. Each case runs a command that
ends with hints, in a fresh folder, then each hint in turn, exactly as printed (split by the shell's
rules), with the same folder and environment: each must exit 0.

The replay, import-with-trace-out, sweep and upgrade cases are README.md's own commands (the
upgrade is 26 replays): each runs once per suite for both files (tests/support/shared_commands.py), in a fresh
folder as here, and what it wrote is copied in."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.support.cli import cli_env, tierdiag_in_process
from tests.support.shared_commands import (IMPORT_PROD, README_SHARED, REPLAY_DEMO, SWEEP_WHAT_IF, UPGRADE_DEMO,
                                          copy_outputs, shared_command)

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = "tierdiag/trace/samples"
HINT_SEPARATOR = "   ·   "

CASES = [
    pytest.param(list(REPLAY_DEMO), id="replay"),
    pytest.param(["replay", f"{SAMPLES}/demo.jsonl", "--device-tokens", "98304", "--db", "my runs/it's.duckdb"],
                 id="replay-odd-db"),
    pytest.param(["convert", "kv-cache-tester", f"{SAMPLES}/kv-cache-tester", "-o", "coding.jsonl"], id="convert"),
    pytest.param(["convert", "kv-cache-tester", f"{SAMPLES}/kv-cache-tester", "-o", "coding.jsonl", "--block-size", "64"],
                 id="convert-block-64"),
    pytest.param(["convert", "bailian", f"{SAMPLES}/bailian.jsonl", "-o", "chat.jsonl", "--block-size", "16"],
                 id="convert-block-16"),  # issue 39 bug 24: the hint carries --page-size 16
    pytest.param(list(IMPORT_PROD), id="import-with-trace-out"),
    pytest.param(["import", "sglang", f"{SAMPLES}/sglang", "--db", "prod.duckdb", "--run-name", "prod"], id="import"),
    pytest.param(list(UPGRADE_DEMO), id="upgrade", marks=pytest.mark.slow),
    pytest.param(list(SWEEP_WHAT_IF), id="sweep"),
]


def hints(stdout: str) -> list[list[str]]:
    """Every command of every `next:` line, as argv."""
    found = []
    for line in stdout.splitlines():
        text = line.strip()
        if text.startswith("next: "):
            found += [shlex.split(part) for part in text.removeprefix("next: ").split(HINT_SEPARATOR)]
    return found


def _tierdiag(folder: Path, argv: list[str]) -> subprocess.CompletedProcess:
    """`tierdiag ARGV` in `folder` (HOME there too), in this process: the hints' own parsing and
    runs are what is tested, as a shell would hand them over (the test splits them)."""
    env = cli_env(columns=100)
    env["HOME"] = str(folder)
    r = tierdiag_in_process(*argv, env=env, cwd=folder)
    return subprocess.CompletedProcess(["tierdiag", *argv], r.code, r.out, r.err)


@pytest.mark.parametrize("argv", CASES)
def test_every_next_hint_runs_as_printed(tmp_path, tmp_path_factory, argv):
    (tmp_path / "tierdiag").symlink_to(ROOT / "tierdiag", target_is_directory=True)
    (tmp_path / "my runs").mkdir()
    if tuple(argv) in README_SHARED:  # run once for this file and the README's (same folder, same environment)
        shared, first = shared_command(tmp_path_factory, argv)
        copy_outputs(shared, tmp_path)
    else:
        first = _tierdiag(tmp_path, argv)
    assert first.returncode == 0, first.stderr
    commands = hints(first.stdout)
    assert commands, f"no next: line in\n{first.stdout}"
    for command in commands:
        assert command[0] == "tierdiag", command
        r = _tierdiag(tmp_path, command[1:])
        assert r.returncode == 0, f"next: {shlex.join(command)}\nexit {r.returncode}: {r.stderr}"
        assert "Traceback" not in r.stderr


def test_hints_parse_the_separator_and_quotes():
    out = "x\nnext: tierdiag slow --db 'my runs/a b.duckdb'   ·   tierdiag explain 'a#1'\n  next: tierdiag report\n"
    assert hints(out) == [["tierdiag", "slow", "--db", "my runs/a b.duckdb"], ["tierdiag", "explain", "a#1"],
                          ["tierdiag", "report"]]
