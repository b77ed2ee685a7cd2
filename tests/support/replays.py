"""One `tierdiag replay TRACE OPTIONS...` per suite run for tests in different files that check
the same run (a whole Mooncake trace is seconds to a minute of replay each time).

`shared_replay(tmp_path_factory, trace, *options)` replays in a subprocess, as a user runs it, into
a folder keyed by (trace, options) under the run's base temporary folder, and returns the store
and the CompletedProcess (exit code, stdout, stderr) of that one replay; a later call with the same
key, in this process or in another pytest-xdist worker of the same run, waits on the folder's lock
and gets the same two. The store is shared: a test only reads it (read-only connections,
`build_report`); a test that writes copies it into its own tmp_path first.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.cli import run


def _shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run's base temporary folder: under xdist each worker's basetemp is a `popen-gwN` folder
    of the controller's, so the parent is what the workers share."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shared_replay(tmp_path_factory: pytest.TempPathFactory, trace: Path, *options: object,
                  timeout: float = 1800) -> tuple[Path, subprocess.CompletedProcess]:
    trace = Path(trace).resolve()
    key = json.dumps([str(trace), trace.stat().st_size, [str(o) for o in options]])
    folder = _shared_root(tmp_path_factory) / "shared-replays" / hashlib.sha256(key.encode()).hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    db, done = folder / "run.duckdb", folder / "replay.json"
    with open(folder / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not done.exists():
            proc = run("replay", trace, "--db", db, *options, timeout=timeout)
            done.write_text(json.dumps({"key": key, "args": proc.args, "returncode": proc.returncode,
                                        "stdout": proc.stdout, "stderr": proc.stderr}))
        saved = json.loads(done.read_text())
    assert saved["key"] == key, (saved["key"], key)
    return db, subprocess.CompletedProcess(saved["args"], saved["returncode"], saved["stdout"], saved["stderr"])
