"""test_fast_paths.py patches the engine's classes (monkeypatch), which a compiled core's are not
open to (mypyc's native classes): where the core is compiled, that file runs here on the Python
twin (TIERDIAG_PURE_ENGINE=1), in a subprocess; where it is not, it runs in the suite itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tierdiag.engine import compiled

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not compiled.is_compiled(), reason="the engine here is the Python twin: test_fast_paths.py "
                                                       "runs in the suite itself")
def test_the_fast_paths_on_the_python_twin():
    proc = subprocess.run([sys.executable, "-m", "pytest", str(REPO / "tests" / "engine" / "test_fast_paths.py"),
                           "-q", "-p", "no:cacheprovider"], capture_output=True, text=True,
                          timeout=1200, cwd=REPO, env={**os.environ, compiled.ENV: "1"})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout.splitlines()[-1], proc.stdout[-500:]
