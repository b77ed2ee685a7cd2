"""Shared by the sweep tests: a small trace, the CLI in a subprocess, and row-by-row run equality."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import duckdb

from tests.support.cli import ENTRY, cli_env, run  # noqa: F401 - ENTRY: the sweep tests start the CLI with it
from tests.support.cli import completed_in_process
from tests.support.cli import one_line_error as support_one_line_error
from tierdiag.store.schema import EVENT_TABLES, TABLES

REPO = Path(__file__).resolve().parents[2]
SHARED_TRACES = Path(os.environ.get("TIERDIAG_SHARED_TRACES", REPO / ".." / "shared" / "traces"))
DEMO = REPO / "tierdiag" / "trace" / "samples" / "demo.jsonl"
# Tiny model on the CPU preset with a device pool that fills: evictions, load-backs, rejections.
BASE = ("--set", "model=tiny", "--set", "gpu=cpu", "--set", "device_tokens=16k")
SETS = ("--set", "host_tokens=16k,64k", "--set", "write_policy=write_through,write_back")
NAMES = {"host_tokens=16k,write_policy=write_through", "host_tokens=16k,write_policy=write_back",
         "host_tokens=64k,write_policy=write_through", "host_tokens=64k,write_policy=write_back"}
# Columns of a runs row that must match between a sweep's run and the same config replayed alone.
RUN_IDENTITY = ("name", "status", "schema_version", "tierdiag_version", "trace_sha256", "config_json",
                "hardware_json", "data_plane_json", "timing", "num_requests", "error")


def small_trace(folder: Path, lines: int = 200) -> Path:
    path = folder / "small.jsonl"
    path.write_text("".join(DEMO.read_text().splitlines(keepends=True)[:lines]))
    return path


def env(**extra: str) -> dict[str, str]:
    return cli_env(**extra)


def cli(*args: object, cwd: Path | None = None, timeout: float = 240, **extra_env: str) -> subprocess.CompletedProcess:
    return run(*args, env=cli_env(**extra_env), cwd=cwd, timeout=timeout)


def cli_here(*args: object, cwd: Path | None = None, **extra_env: str) -> subprocess.CompletedProcess:
    """`cli` in this process (tests/support/cli.py `tierdiag_in_process`): what a command says
    and records, where its process is not what is tested."""
    return completed_in_process(*args, env=cli_env(**extra_env), cwd=cwd)


def one_line_error(proc: subprocess.CompletedProcess, code: int, *fragments: str) -> str:
    return support_one_line_error(proc.returncode, proc.stderr, code, *fragments)


def runs_by_name(db: Path) -> dict[str, dict]:
    with duckdb.connect(str(db), read_only=True) as con:
        cur = con.execute("SELECT * FROM runs ORDER BY created_at")
        cols = [d[0] for d in cur.description]
        return {r["name"]: r for r in (dict(zip(cols, row)) for row in cur.fetchall())}


# Measured wall-clock time of the real copies: no two replays of anything share it.
WALL_CLOCK = {("transfers", "wall_ns")}


def run_rows(db: Path, run_id: str) -> dict[str, list[tuple]]:
    """Every event row of a run, without run_id and wall-clock columns, in a canonical order."""
    out = {}
    with duckdb.connect(str(db), read_only=True) as con:
        for table in EVENT_TABLES:
            cols = [c for c in TABLES[table] if c != "run_id" and (table, c) not in WALL_CLOCK]
            order = ", ".join(f"{c} NULLS FIRST" for c in cols)
            out[table] = con.execute(f"SELECT {', '.join(cols)} FROM {table} WHERE run_id = ? ORDER BY {order}",
                                     [run_id]).fetchall()
    return out


def assert_same_runs(sweep_db: Path, single_db: Path, names) -> None:
    """Each named run of the sweep has exactly the rows of the same config replayed on its own."""
    swept, single = runs_by_name(sweep_db), runs_by_name(single_db)
    for name in names:
        a, b = swept[name], single[name]
        for col in RUN_IDENTITY:
            assert a[col] == b[col], (name, col, a[col], b[col])
        rows_a, rows_b = run_rows(sweep_db, a["run_id"]), run_rows(single_db, b["run_id"])
        assert rows_a["requests"], name
        for table in EVENT_TABLES:
            assert rows_a[table] == rows_b[table], (name, table, len(rows_a[table]), len(rows_b[table]))
