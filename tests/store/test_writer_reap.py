"""writer_process.exits_within: the replay's reap of its writer process, woken by the exit (a
pidfd) rather than by Popen.wait's polling, with the polling wait where no pidfd opens."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tierdiag.store import writer_process


def _child(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-S", "-c", code])


@pytest.fixture(params=["pidfd", "polling"])
def way(request, monkeypatch):
    if request.param == "polling":
        def refused(pid):
            raise OSError(38, "pidfd_open refused")

        monkeypatch.setattr(os, "pidfd_open", refused)
    elif not hasattr(os, "pidfd_open"):
        pytest.skip("no os.pidfd_open here")
    return request.param


def test_a_child_that_exits_is_seen_and_left_to_reap(way):
    proc = _child("import sys; sys.exit(3)")
    assert writer_process.exits_within(proc, 30.0)
    assert proc.returncode is None or way == "polling"  # the pidfd only watches: wait() reaps
    assert proc.wait(timeout=5) == 3


def test_a_child_still_running_past_the_limit_is_not(way):
    proc = _child("import time; time.sleep(60)")
    try:
        assert not writer_process.exits_within(proc, 0.05)
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
    assert writer_process.exits_within(proc, 0.0)  # reaped already: returncode set


def test_reap_kills_a_writer_that_outlives_the_limit(monkeypatch):
    monkeypatch.setattr(writer_process, "REAP_WAIT_S", 0.05)
    proc = _child("import time; time.sleep(60)")
    writer_process.WriterProcess._reap(proc)
    assert proc.returncode == -9


def test_reap_of_a_child_that_exits_gives_its_status():
    proc = _child("import sys; sys.exit(0)")
    writer_process.WriterProcess._reap(proc)
    assert proc.returncode == 0
