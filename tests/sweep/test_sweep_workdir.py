"""The sweep's worker folder: named after its process, and left-overs of a killed sweep removed."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from tierdiag.app import sweep as runner


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_new_sweep_removes_the_folders_of_sweeps_killed_with_kill_9_and_nothing_else(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = _dead_pid()
    stale = tmp_path / f"tierdiag-sweep-{dead}-abc"
    stale.mkdir()
    (stale / "run-0.duckdb").write_bytes(b"x" * 100)
    (stale / "run-0.duckdb.wal").write_bytes(b"x")
    live = tmp_path / f"tierdiag-sweep-{os.getpid()}-def"  # a sweep still running (this process)
    live.mkdir()
    (live / "run-1.duckdb").write_bytes(b"x")
    foreign = tmp_path / f"tierdiag-sweep-{dead}-ghi"  # holds something a worker never writes
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    old_style = tmp_path / "tierdiag-sweep-k2j3h4"  # no pid in the name: whose it is is unknown
    old_style.mkdir()

    made = runner._sweep_workdir()

    assert made.parent == tmp_path and made.name.startswith(f"tierdiag-sweep-{os.getpid()}-")
    assert not stale.exists()
    assert live.exists() and foreign.exists() and old_style.exists()
