"""Every thread tierdiag starts imports nothing: what it needs is imported on the caller's thread
before it starts (h41safe item 2).

Why: under CPython 3.11 an import takes the module's lock; a thread importing while the main thread
imports (a replay's engine, a command's views) can wait on it for ever. Session 24 found a real
hang of this kind (the trace digest's thread importing hashlib while the engine imported it: 2
replays in 3) and fixed that one thread (app/replay.py `_Digest`).

How: each command runs as a user runs it, in a subprocess, with import_audit/ first on
PYTHONPATH; its sitecustomize.py (loaded by every Python process, the store's writer process
and sweep/advise workers included) snapshots sys.modules on the caller's thread at each
`Thread.start` and logs every module the thread then names in an import (a Python `import` or C
code's PyImport_Import, DuckDB's `datetime`) that was not in that snapshot. The snapshot makes the
check deterministic: a thread whose import the main thread happened to finish first still fails.

What it found (before -> after), every one now imported on the caller's thread:

| thread (command) | imported on the thread | now |
|---|---|---|
| tierdiag-progress-advise (`advise`, piped stderr) | all of Rich (rich.console, ~50 modules), tierdiag.report.console, pickle: the stderr console made at its first line | the ticker writes its lines itself (escaped by report.text.visible, imported in `start`), never through Rich; no Rich import moved to start-up |
| tierdiag-progress-report (`report`, piped) | tierdiag.report.console | the same |
| tierdiag-open-store (`summary`, `explain`) | datetime, _datetime, math (DuckDB's first TIMESTAMP) | store/reader.py `PendingStore` imports datetime |
| tierdiag-trace-pages (writer process at a replay) | tierdiag.trace.reader, .lines, .fields | diagnose/run/size_curves.py `_TraceRead.__init__` |
| tierdiag-live-curves (writer process) | tierdiag.diagnose.run.live_curves (and dateutil, once); pyarrow.compute (live_curves.rows_of, seen on the compiled build) | the same |

Not found importing: the trace digest (fixed in session 24), the evidence sections' threads, the
writer process's request reader and trace-line counter (`store/writer_serve.py`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.reliability.harness import ROOMY, real_trace_head, tierdiag, tierdiag_in_process
from tests.support.cli import cli_env

AUDIT = Path(__file__).resolve().parent / "import_audit"
REPO = Path(__file__).resolve().parents[2]


def audited(tmp_path: Path, *args: object, **env: str) -> tuple[list[str], int]:
    """`tierdiag ARGS` with the audit loaded in every process it starts; returns the late imports
    logged (one `thread<TAB>module<TAB>where` each) and how many processes ran the audit."""
    log = tmp_path / "audit" / "imports"
    log.parent.mkdir(exist_ok=True)
    for old in log.parent.iterdir():
        old.unlink()
    run_env = cli_env(TIERDIAG_IMPORT_AUDIT=str(log), TIERDIAG_PROGRESS_EVERY_S="0.02", **env)
    run_env["PYTHONPATH"] = os.pathsep.join([str(AUDIT), str(REPO), run_env.get("PYTHONPATH", "")])
    result = tierdiag(*args, env=run_env, timeout=600)
    assert result.code == 0, result.err
    files = sorted(log.parent.iterdir())
    lines = [line for f in files for line in f.read_text().splitlines() if line]
    return lines, len(files)


def late(lines: list[str]) -> str:
    return "\n".join(lines[:20])


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    return real_trace_head(tmp_path_factory.mktemp("threads") / "t.jsonl", 150, fallback=60)


def test_the_audit_sees_an_import_on_a_thread(tmp_path):
    """The audit itself: a thread that imports a module nobody imported before is logged, one
    whose module was imported before it started is not (else every test here would pass empty)."""
    code = ("import threading\n"
            "import json\n"
            "def work():\n"
            "    import json\n"  # imported before the start: fine
            "    import colorsys\n"  # not: logged
            "t = threading.Thread(target=work, name='probe'); t.start(); t.join()\n")
    log = tmp_path / "imports"
    env = {**os.environ, "TIERDIAG_IMPORT_AUDIT": str(log), "PYTHONPATH": str(AUDIT)}
    import subprocess

    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    logged = [line.split("\t")[:2] for f in tmp_path.glob("imports.*") for line in f.read_text().splitlines()]
    assert logged == [["probe", "colorsys"]]


@pytest.mark.parametrize("writer", ["process", "inline"])
def test_a_replay_and_the_read_commands_threads_import_nothing(tmp_path, trace, writer):
    """A piped replay (progress lines every 0.02 s, the trace digest, the store's writer process
    or the inline writer with its size-curve and evidence threads), then summary and explain
    (the store opened on a thread), report (its progress line), each audited."""
    db = tmp_path / "s.duckdb"
    lines, processes = audited(tmp_path, "replay", trace, "--db", db, *ROOMY, TIERDIAG_WRITER=writer)
    assert not lines, late(lines)
    assert processes == (2 if writer == "process" else 1), "the writer process ran the audit too"
    for command in (("summary",), ("explain", "5"), ("slow",), ("report", "-o", tmp_path / "r.html")):
        lines, _ = audited(tmp_path, *command, "--db", db)
        assert not lines, f"{command[0]}:\n{late(lines)}"


def test_advise_and_sweep_threads_import_nothing(tmp_path, trace):
    """advise's piped progress thread imported all of Rich at its first line (before the fix);
    a sweep's workers and progress likewise audited."""
    db = tmp_path / "s.duckdb"
    assert tierdiag_in_process("replay", trace, "--db", db, *ROOMY).code == 0  # the input: not audited
    lines, _ = audited(tmp_path, "advise", "--db", db)
    assert not lines, late(lines)
    lines, _ = audited(tmp_path, "sweep", trace, "--db", tmp_path / "sw.duckdb", "--set", "device_tokens=32768,65536",
                       "--set", "model=tiny", "--set", "gpu=cpu", "--jobs", "2")
    assert not lines, late(lines)
