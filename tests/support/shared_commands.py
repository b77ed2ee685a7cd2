"""One run per suite of a `tierdiag` command line that tests in different files run exactly as a
user types it in a fresh folder (issue 41's suite time: four of README.md's commands are also
`next:` hint cases; the upgrade of the demo trace is 26 replays each time; the `--ray` sweep,
checked by tests/sweep/test_sweep_ray.py too, starts a local Ray cluster).

`shared_command(tmp_path_factory, argv)` runs `tierdiag ARGV...` once per suite run, in a fresh
folder holding only a link `tierdiag` to this checkout's package (so the README's and the hints'
paths `tierdiag/trace/samples/...` resolve) with HOME set to that folder, as tests/test_readme_blocks.py
and tests/cli/test_next_hints.py run their commands (test_sweep_ray.py reads the `--ray` line's store); a later call with the same argv, in this
process or another pytest-xdist worker, waits on the folder's lock and gets the same result.
`copy_outputs(folder, into)` copies what the command wrote into a test's own folder (refusing to
overwrite anything there): the shared folder is only read.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import cli_env
from tests.support.replays import _shared_root

ROOT = Path(__file__).resolve().parents[2]
LINK = "tierdiag"
# README.md's commands that are also `next:` hint cases (tests/cli/test_next_hints.py), each as
# the README writes it: the tour's first replay, the SGLang import, the what-if sweep, the upgrade
# of the demo trace.
REPLAY_DEMO = ("replay", "tierdiag/trace/samples/demo.jsonl", "--device-tokens", "98304", "--run-name", "demo")
IMPORT_PROD = ("import", "sglang", "tierdiag/trace/samples/sglang", "--db", "prod.duckdb", "--run-name", "prod",
               "--trace-out", "prod-twin.jsonl")
SWEEP_WHAT_IF = ("sweep", "tierdiag/trace/samples/demo.jsonl", "--db", "what-if.duckdb", "--set", "device_tokens=98304",
                 "--set", "host_tokens=128k,512k", "--set", "write_policy=write_through,write_back", "--jobs", "2")
UPGRADE_DEMO = ("replay", "tierdiag/trace/samples/demo.jsonl", "--device-tokens", "98304", "--sglang", "0.5.9,0.5.23",
                "--jobs", "2", "--db", "upgrade.duckdb")
# README.md's `--ray` line, which tests/sweep/test_sweep_ray.py checks too: a local Ray cluster
# started once a suite, not twice (~6-7 s of CPU each start and sweep, its daemons included).
RAY_SWEEP = ("sweep", "tierdiag/trace/samples/demo.jsonl", "--db", "ray.duckdb", "--set", "device_tokens=98304",
             "--set", "host_tokens=128k,512k", "--ray")
README_SHARED = (REPLAY_DEMO, IMPORT_PROD, SWEEP_WHAT_IF, UPGRADE_DEMO, RAY_SWEEP)


def command_env(folder: Path) -> dict[str, str]:
    env = cli_env(columns=100)
    env["HOME"] = str(folder)
    return env


def shared_command(tmp_path_factory: pytest.TempPathFactory, argv: tuple[str, ...] | list[str],
                   timeout: float = 900) -> tuple[Path, subprocess.CompletedProcess]:
    argv = [str(a) for a in argv]
    key = json.dumps(argv)
    base = _shared_root(tmp_path_factory) / "shared-commands" / hashlib.sha256(key.encode()).hexdigest()[:16]
    base.mkdir(parents=True, exist_ok=True)
    folder, done = base / "folder", base / "result.json"
    with open(base / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not done.exists():
            if folder.exists():  # a run killed half-way: start again from a fresh folder
                shutil.rmtree(folder)
            folder.mkdir()
            (folder / LINK).symlink_to(ROOT / LINK, target_is_directory=True)
            proc = subprocess.run([sys.executable, "-c", "from tierdiag.cli.main import main; main()", *argv],
                                  cwd=folder, env=command_env(folder), capture_output=True, text=True,
                                  timeout=timeout)
            done.write_text(json.dumps({"key": key, "args": proc.args, "returncode": proc.returncode,
                                        "stdout": proc.stdout, "stderr": proc.stderr}))
        saved = json.loads(done.read_text())
    assert saved["key"] == key, (saved["key"], key)
    return folder, subprocess.CompletedProcess(saved["args"], saved["returncode"], saved["stdout"], saved["stderr"])


def copy_outputs(folder: Path, into: Path) -> list[str]:
    """Copy what the shared command wrote (everything in its folder but the link) into `into`;
    the names copied. A name already in `into` is an error: the copy would not be what running
    the command there gives."""
    names = sorted(p.name for p in folder.iterdir() if p.name != LINK)
    clash = [n for n in names if (into / n).exists() or (into / n).is_symlink()]
    assert not clash, f"{clash} already in {into}: run the command there instead"
    for name in names:
        src = folder / name
        if src.is_dir() and not src.is_symlink():
            shutil.copytree(src, into / name, symlinks=True)
        else:
            shutil.copy2(src, into / name, follow_symlinks=False)
    return names
