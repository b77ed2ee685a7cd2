"""A file that cannot be read, tested where the suite runs as root (CI's container): root reads a
mode-0 file, so a test of "there but not readable" used to skip there (3 of the suite's 43 skips,
issue 41 session 35). `as_a_reader` runs a few lines of Python in a child whose capability
bounding set lacks CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH (util-linux's `setpriv`): still uid 0,
so it reaches the test's folders (pytest's are the owner's only), but a file's mode bits hold for it
as for any user. Not root: the child is plain Python, no capability to drop."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

DROP = "-dac_override,-dac_read_search"


def as_a_reader(code: str, *args: str) -> str:
    """`code` run by `python -c` (sys.argv[1:] = `args`) where mode bits are not overridden; its
    stdout, stripped. Skips (one line) where no such child can be made: no `setpriv`, or a
    container that refuses it the capability to drop from its bounding set."""
    argv = [sys.executable, "-c", code, *args]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("root reads any file, and no setpriv here to run a reader that does not")
        argv = [setpriv, f"--bounding-set={DROP}", *argv]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO)
    if proc.returncode and "setpriv:" in proc.stderr:
        pytest.skip(f"root reads any file, and setpriv could not drop that here: {proc.stderr.strip()[:200]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


def unreadable(path) -> None:
    """Mode 0 on `path`, and that it holds for `as_a_reader`'s child (checked there)."""
    os.chmod(path, 0)
    assert as_a_reader("import os, sys; print(os.access(sys.argv[1], os.R_OK))", str(path)) == "False"
