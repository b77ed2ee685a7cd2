"""Folders a test needs the kernel's help for: a small tmpfs (a real full disk), and a folder this
process cannot write (tests/reliability/test_store_cli.py, tests/diagnose/test_evidence_backfill.py).

The suite runs as root in CI's container, where a mode bit does not stop a write: there a
read-only folder is a tmpfs remounted read-only. Each skips (one line) where it cannot be made."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(path: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted at `path` (made here) with mount's `options` (`size=512k`, `ro,size=1m`)
    until the block ends; skips without root or where none can be mounted."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("needs root to mount a tmpfs")
    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@contextlib.contextmanager
def read_only_folder(tmp_path: Path, *files: Path) -> Iterator[Path]:
    """`tmp_path/ro`, holding a copy of each of `files` (by name), that this process cannot
    write: its mode (and the files') for a normal user; for root, a tmpfs the files are copied
    into and that is then remounted read-only."""
    folder = tmp_path / "ro"
    folder.mkdir()
    copies = [Path(shutil.copy(f, folder / f.name)) for f in files]
    for copy in copies:
        copy.chmod(0o444)
    folder.chmod(0o555)
    try:
        if not os.access(folder, os.W_OK):
            yield folder
            return
        folder.chmod(0o755)
        shutil.rmtree(folder)
        with tmpfs(folder, "size=64m"):
            for f in files:
                shutil.copy(f, folder / f.name)
            r = subprocess.run(["mount", "-o", "remount,ro", str(folder)], capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            assert not os.access(folder, os.W_OK) and not any(os.access(c, os.W_OK) for c in copies)
            yield folder
    finally:
        if folder.exists():
            folder.chmod(0o755)
