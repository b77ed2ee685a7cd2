"""Issue 42: every command of the README runs as written, in a fresh folder, with only what the
repository ships (tierdiag/trace/samples/). Each ```bash block of README.md is one test; the
blocks run in README order in one folder, as a reader following the README would (the tour's run
is what `summary` reads, the import's store is what the twin replays into). A command line is a
line of its block, with its `\\` continuations; comments are the shell's.

Four README lines are also `next:` hint cases of tests/cli/test_next_hints.py (the tour's first
replay, the SGLang import, the what-if sweep, the upgrade of the demo trace: 26 replays): each runs once per suite for
both, as written, in a fresh folder like this one (tests/support/shared_commands.py), and what it
wrote is copied here; none of them reads what an earlier block wrote. The `--ray` sweep's line is
shared so with tests/sweep/test_sweep_ray.py, which checks its runs' rows (one local Ray a suite).

`tierdiag` is this checkout's CLI (a script on PATH), the folder holds a link to this checkout's
`tierdiag/` (so `tierdiag/trace/samples/...` is the path the README gives), and HOME is the
folder (nothing written beside the user's files).

Where a line goes (issue 41's suite time: a child is ~0.45 s of CPU to start, ~2 s more where
the command imports torch): bash reads every line (the arguments it hands `tierdiag`, a shell
function here that prints them: quotes, comments, `#` inside a word as bash has them), and a
line whose command takes the Typer path in a child too (`tierdiag.cli.main.direct_arguments`
declines it) runs with those arguments in this process, through the console script's own error
handling (tests/support/cli.py `tierdiag_in_process`: the environment, folder and streams a child
would have). The direct path's lines (`replay` and the plain read commands: what that path
imports and installs is the process's), `replay`, `sweep` and `advise` (IN_A_CHILD), the lines
of an optional extra (`--ray`: a cluster of processes), and any line bash does not read as one
`tierdiag` call run in a child as before.

Left out, each for the reason named in NOT_RUN: the setup targets (`make demo`, `make test`,
`make test-fast`: the suite itself; `make demo` runs the tour's commands), the SGLang server's launch and the benchmarks.
A block is left out only when it is listed there, whole, so a new block is run or listed.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import cli_env, completed_in_process
from tests.support.shared_commands import README_SHARED, copy_outputs, shared_command

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")

# The first command of a block that is not run, and why.
NOT_RUN = {
    "make demo": "the setup targets: `make test` is this suite; `make demo` builds .venv, then runs the tour below",
    "python -m sglang.launch_server": "starts an SGLang server (a GPU, the model's weights); the export it writes "
                                      "ships as tierdiag/trace/samples/sglang",
    "make bench": "benchmarks: minutes each (benchmarks/README.md), never in the test suite",
    "make test-fast": "the test suite itself (less its slow tier): this test is part of it",
}
# A line that needs an optional extra, run only where it is installed.
NEEDS = {"--ray": "ray"}
# Commands whose lines always run in a child: replay (its start installs process-wide what the
# replay path reads, either path) and those that start worker processes (their stderr is the
# process's, which a child's pipe holds and this process's would not).
IN_A_CHILD = ("", "replay", "sweep", "advise")


def bash_blocks(text: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"^```bash\n(.*?)^```", text, re.S | re.M)]


def commands(block: str) -> list[str]:
    """The block's command lines: continuations joined, comment-only lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [line for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


BLOCKS = bash_blocks(README)


def _skipped(block: str) -> str | None:
    first = commands(block)[0]
    return next((why for start, why in NOT_RUN.items() if first.startswith(start)), None)


def test_the_readme_has_its_blocks_and_every_left_out_one_is_named():
    assert len(BLOCKS) >= 10
    left_out = [commands(b)[0] for b in BLOCKS if _skipped(b)]
    assert len(left_out) == len(NOT_RUN), left_out  # each reason used once: nothing else is left out
    for block in BLOCKS:
        if _skipped(block):
            continue
        for line in commands(block):
            assert line.startswith("tierdiag "), f"README command is not a tierdiag command: {line!r}"
            # a placeholder would not run as written
            assert not re.search(r"\b(TRACE|REQ_ID|RUN_A|RUN_B|SWEEP_ID|ADDRESS)\b|\[--", line.split("#")[0]), line
    # the lines run once for this test and test_next_hints are README's lines, as written
    lines = {tuple(shlex.split(line, comments=True))[1:] for b in BLOCKS if not _skipped(b) for line in commands(b)}
    assert set(README_SHARED) <= lines, set(README_SHARED) - lines


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    where = tmp_path_factory.mktemp("readme")
    (where / "tierdiag").symlink_to(ROOT / "tierdiag", target_is_directory=True)
    bin_dir = where / ".bin"
    bin_dir.mkdir()
    script = bin_dir / "tierdiag"
    script.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -c 'from tierdiag.cli.main import main; main()' "
                      '"$@"\n')
    script.chmod(0o755)
    return where


def _env(folder: Path) -> dict[str, str]:
    env = cli_env(columns=100)
    env["PATH"] = f"{folder / '.bin'}{os.pathsep}{env.get('PATH', '')}"
    env["HOME"] = str(folder)
    return env


def _bash_argv(line: str, folder: Path, env: dict[str, str]) -> list[str] | None:
    """The arguments bash hands `tierdiag` for `line` (run by bash in the folder, with `tierdiag`
    a shell function that prints them); None where the line is not one `tierdiag` call (nothing
    printed, or more than once) or bash says anything on stderr."""
    script = 'tierdiag() { printf "%s\\0" "$@"; printf "\\1"; }\n' + line
    r = subprocess.run(["bash", "-c", script], cwd=folder, env=env, capture_output=True, timeout=60)
    if r.returncode or r.stderr or r.stdout.count(b"\1") != 1 or not r.stdout.endswith(b"\0\1"):
        return None
    return [a.decode("utf-8", "surrogateescape") for a in r.stdout[:-2].split(b"\0")]


def _typer_path_argv(line: str, folder: Path, env: dict[str, str]) -> list[str] | None:
    """`line`'s arguments where its command takes the Typer path in a child too (the console
    script's `_app_for_argv` builds the Typer app: `direct_arguments` declines them), so this
    process runs the same code a child would; None for the direct path or a line that is not one
    plain call."""
    from tierdiag.cli.main import direct_arguments

    argv = _bash_argv(line, folder, env)
    if not argv or argv[0] in IN_A_CHILD or direct_arguments(argv, env) is not None:
        return None
    return argv


@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=[f"block{i + 1}" for i in range(len(BLOCKS))])
def test_readme_block_runs_as_written(folder, tmp_path_factory, index):
    block = BLOCKS[index]
    why = _skipped(block)
    if why:
        pytest.skip(why)
    env = _env(folder)
    for line in commands(block):
        needed = next((mod for flag, mod in NEEDS.items() if flag in shlex.split(line, comments=True)), None)
        if needed is not None:
            try:
                __import__(needed)
            except ImportError:
                continue  # an optional extra this environment has not installed
        argv = tuple(shlex.split(line, comments=True))[1:]
        here = None if needed is not None or argv in README_SHARED else _typer_path_argv(line, folder, env)
        if argv in README_SHARED:  # each reads only the repository's samples
            shared, r = shared_command(tmp_path_factory, argv)
            copy_outputs(shared, folder)
        elif here is not None:
            r = completed_in_process(*here, env=env, cwd=folder)
        else:
            r = subprocess.run(["bash", "-c", line], cwd=folder, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"README: {line}\nexit {r.returncode}\n{r.stderr[-3000:]}\n{r.stdout[-2000:]}"
        assert "Traceback" not in r.stderr, r.stderr


def test_the_upgrade_sections_rule_count_is_the_engines():
    """README's "What changes if I upgrade SGLang" says how many rules differ between 0.5.9 and 0.5.23
    and how many replays that makes (one per release, one per rule switched back): kept true as rules
    join the rule sets (it said 29/31 after the day a thirtieth joined)."""
    import re

    from tierdiag.engine.rules import differing_rules

    n = len(differing_rules("0.5.9", "0.5.23"))
    text = " ".join(README.split())
    said = re.search(r"(\d+) rules differ between 0\.5\.9 and 0\.5\.23: (\d+) replays", text)
    assert said, "the upgrade section no longer says how many rules differ"
    assert (int(said.group(1)), int(said.group(2))) == (n, n + 2)


def test_a_line_runs_here_with_the_arguments_bash_gives_only_on_the_typer_path(tmp_path):
    """The in-process lines get bash's own reading of the line (a `#` inside a word is no comment,
    quotes join words); a line that is not one plain `tierdiag` call, and the direct path's
    commands, are left to a child."""
    env = _env(tmp_path)
    assert _bash_argv("tierdiag explain coding-a#4   # a comment", tmp_path, env) == ["explain", "coding-a#4"]
    assert _bash_argv('tierdiag compare "demo sglang 0.5.9" x --top 5', tmp_path, env) == [
        "compare", "demo sglang 0.5.9", "x", "--top", "5"]
    assert _bash_argv("tierdiag runs; tierdiag runs", tmp_path, env) is None
    assert _bash_argv("tierdiag runs > out.txt", tmp_path, env) is None
    assert _typer_path_argv("tierdiag runs --db run.duckdb", tmp_path, env) == ["runs", "--db", "run.duckdb"]
    assert _typer_path_argv("tierdiag summary --db run.duckdb", tmp_path, env) is None  # the direct path
    assert _typer_path_argv("tierdiag replay t.jsonl --dp 2 --run-name x y", tmp_path, env) is None
    assert _typer_path_argv("tierdiag advise --run demo --budget 2 --jobs 2", tmp_path, env) is None  # processes
