"""SGLang's wheels, fetched `pip download --no-deps` into $TMPDIR/tierdiag-sglang-<v>/wheel and
unzipped into $TMPDIR/tierdiag-sglang-<v>/root once (reused between runs; TIERDIAG_SGLANG_CACHE
moves them). tests/sglang runs them in worker processes; a test that reads one SGLang module
(tests/engine/test_tlru.py) asks here too, so it never depends on tests/sglang having run first.

The fetch and the unzip hold a lock file beside them ($TMPDIR/tierdiag-sglang-<v>.lock): the
suite's worker processes (pytest -n 2) and a second suite run at the same time each ask for the
same folder, and only one of them may download or unzip while the others wait and then reuse it.
No network, no wheel: the asking test skips with one line (pip asked once a session);
`wheel_root` raises `WheelUnavailable` instead, for a caller outside pytest (tests/sglang/drive.py).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest


_UNAVAILABLE: dict[str, str] = {}  # version -> why: asked pip once a session


class WheelUnavailable(Exception):
    """SGLang's wheel could not be fetched (no network, no such release): one line saying why."""


def unpacked_wheel(version: str) -> Path:
    """The unzipped wheel's folder; the calling test skips without it."""
    try:
        return wheel_root(version)
    except WheelUnavailable as exc:
        pytest.skip(str(exc))


def wheel_root(version: str) -> Path:
    """The unzipped wheel's folder, fetched and unzipped the first time; WheelUnavailable without it."""
    if version in _UNAVAILABLE:
        raise WheelUnavailable(_UNAVAILABLE[version])
    base = Path(os.environ.get("TIERDIAG_SGLANG_CACHE", tempfile.gettempdir())) / f"tierdiag-sglang-{version}"
    root = base / "root"
    if (root / "sglang" / "srt").is_dir():
        return root
    base.parent.mkdir(parents=True, exist_ok=True)
    with open(base.parent / f"{base.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if (root / "sglang" / "srt").is_dir():  # unpacked by another process while this one waited
            return root
        return _fetch_and_unpack(version, base, root)


def _fetch_and_unpack(version: str, base: Path, root: Path) -> Path:
    wheels = base / "wheel"
    wheels.mkdir(parents=True, exist_ok=True)
    if not list(wheels.glob("sglang-*.whl")):
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(wheels),
                               f"sglang=={version}"], capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            _UNAVAILABLE[version] = f"SGLang {version}'s wheel could not be downloaded (pip download --no-deps): {last}"
            raise WheelUnavailable(_UNAVAILABLE[version])
    wheel = next(wheels.glob("sglang-*.whl"))
    tmp = base / "root.partial"
    shutil.rmtree(tmp, ignore_errors=True)  # left by a run killed while unzipping (the lock is held)
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(tmp, [n for n in zf.namelist() if n.startswith("sglang/")])
    tmp.rename(root)
    return root
