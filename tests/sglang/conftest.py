"""SGLang's own wheels at test time, for the `sglang` marker's tests (never committed, never
installed with their dependencies).

Each version is fetched with `pip download --no-deps sglang==<v>` into
$TMPDIR/tierdiag-sglang-<v>/wheel (reused between runs), unzipped into
$TMPDIR/tierdiag-sglang-<v>/root, and run in a worker process of its own (worker.py): the two
versions' `sglang` packages never share a namespace, and the GPU stubs they need never reach
this process, where tierdiag's own Triton tests import the real triton. No network, no wheel:
the tests skip with one line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

from tests.sglang.differential import Worker


_UNAVAILABLE: dict[str, str] = {}  # version -> why: asked pip once a session


def unpacked_wheel(version: str) -> Path:
    if version in _UNAVAILABLE:
        pytest.skip(_UNAVAILABLE[version])
    base = Path(os.environ.get("TIERDIAG_SGLANG_CACHE", tempfile.gettempdir())) / f"tierdiag-sglang-{version}"
    root = base / "root"
    if (root / "sglang" / "srt").is_dir():
        return root
    wheels = base / "wheel"
    wheels.mkdir(parents=True, exist_ok=True)
    if not list(wheels.glob("sglang-*.whl")):
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(wheels),
                               f"sglang=={version}"], capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            _UNAVAILABLE[version] = f"SGLang {version}'s wheel could not be downloaded (pip download --no-deps): {last}"
            pytest.skip(_UNAVAILABLE[version])
    wheel = next(wheels.glob("sglang-*.whl"))
    tmp = base / "root.partial"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(tmp, [n for n in zf.namelist() if n.startswith("sglang/")])
    tmp.rename(root)
    return root


@pytest.fixture(scope="session")
def sglang_059():
    worker = Worker("0.5.9", unpacked_wheel("0.5.9"))
    yield worker
    worker.close()


@pytest.fixture(scope="session")
def sglang_0523():
    worker = Worker("0.5.23", unpacked_wheel("0.5.23"))
    yield worker
    worker.close()


@pytest.fixture(scope="session")
def sglang_0523_scheduler():
    """A worker of its own for the Scheduler harness (test_scheduler_0523.py): each workload
    publishes its server args process-wide, which the cache-only scenarios must not see."""
    worker = Worker("0.5.23", unpacked_wheel("0.5.23"))
    yield worker
    worker.close()
