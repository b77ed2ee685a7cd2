"""The writer process's start (store/writer_serve.py `_Serve.open`, app/writer_child.py; issue 41,
session 36): one DuckDB instance in the process (the allocator's purge asked on the writer's own),
the run's trace counted once (the late writes' count, which the story's fold asks too), and the
collector held off through the imports and settled once the store is open."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from tierdiag.store import duckdb_core, writer_serve
from tierdiag.store.frames import read_frame
from tierdiag.store.reader import open_store

_ENV = {**os.environ, "PYTHONPATH": str(Path(writer_serve.__file__).resolve().parents[2])}


def test_the_settle_freezes_the_start_and_runs_the_collector_again():
    """`_settle` (called once the store is open, in the writer process only: `main`): what the
    start made is out of the collector's passes, and the collector runs again where the entry
    (app/writer_child.py) held it off. In a process of its own: a freeze here would hold the test
    process's objects."""
    code = ("import gc\ngc.disable()\nfrom tierdiag.store.writer_serve import _settle\n"
            "before = gc.get_freeze_count()\n_settle()\n"
            "print(before, gc.get_freeze_count() > 1000, gc.isenabled())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=_ENV).stdout.split()
    assert out == ["0", "True", "True"]


def test_the_writer_entry_holds_the_collector_off_through_its_imports():
    """app/writer_child.py `main` disables the collector before its imports (duckdb, pyarrow,
    numpy, the close's modules); the serving loop's `main` settles it once the store is open
    (here: the entry run up to the serving loop, which is replaced by a probe)."""
    code = ("import gc, sys\nimport tierdiag.store.writer_serve as W\n"
            "def probe(after_commit=None, preload=(), while_recording=None):\n"
            "    print(gc.isenabled(), 'duckdb' in sys.modules, callable(after_commit), len(preload) > 0)\n"
            "W.main = probe\nfrom tierdiag.app.writer_child import main\nmain()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=_ENV).stdout.split()
    assert out == ["False", "True", "True", "True"]
