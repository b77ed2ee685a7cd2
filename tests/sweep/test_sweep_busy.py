"""A sweep whose --db stays busy (a notebook's read-only connection) keeps every finished run.

Issue 32: past the merge wait the sweep exited 4 "busy" and its clean-up deleted the workers'
stores: 6 of 6 replayed runs lost. Now the runs go to a store beside --db, the error names it
and the command that merges it, and `sweep --resume` merges them once --db is free.

    sweep of 3 combinations, one worker:  run 0 -> --db
                                          (a reader takes --db and keeps it)
                                          run 1, run 2 -> DB.SWEEP.duckdb (kept)
    exit 4 naming the kept store;  reader gone;  sweep --resume KEPT --db DB -> all 3 in --db
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from tests.sweep.sweep_helpers import cli_here
from tierdiag.app import sweep as sweep_mod
from tierdiag.app import sweep_kept
from tierdiag.app.sweep import Processes, SweepNotMerged, run_configs
from tierdiag.config.engine import EngineConfig
from tierdiag.config.sweep_spec import plan_sweep
from tierdiag.errors import ExitCode


def _runs(db: Path) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("SELECT name, status, sweep_id, num_requests FROM runs ORDER BY name").fetchall()
    finally:
        con.close()


class Holder:
    """Another program holding the store (read-only, as a notebook would), until `release`."""

    def __init__(self, db: Path):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import duckdb, sys, time; c = duckdb.connect(sys.argv[1], read_only=True); "
             "print('held', flush=True); sys.stdin.read()", str(db)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "held"

    def release(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def test_finished_runs_survive_a_busy_db_and_resume_merges_them(tmp_path, trace, monkeypatch):
    monkeypatch.setattr(sweep_kept, "MERGE_WAIT_S", 0.5)
    monkeypatch.setattr(sweep_kept, "LAST_MERGE_WAIT_S", 0.2)
    db = tmp_path / "sweep.duckdb"
    plan = plan_sweep(EngineConfig(model="tiny", gpu="cpu", device_tokens=16 * 1024), ["seed=1,2,3"])
    holder: list[Holder] = []

    def progress(outcome):
        if not holder:  # the first run is in --db: now another program takes it
            holder.append(Holder(db))

    try:
        with pytest.raises(SweepNotMerged) as exc:
            run_configs(trace, plan.configs, db, backend=Processes(jobs=1), sweep_id="sweep-test-1",
                        progress=progress)
        kept = exc.value.kept
        assert kept == tmp_path / "sweep.sweep-test-1.duckdb"
        line = exc.value.one_line()
        assert "busy" in line and f"2 runs of the sweep kept in {kept}" in line
        assert f"tierdiag sweep --resume {kept} --db {db}" in line
        assert exc.value.exit_code == ExitCode.STORE
        assert [o.kept_in for o in exc.value.outcomes] == [None, str(kept), str(kept)]
        assert [r[:3] for r in _runs(kept)] == [("seed=2", "complete", "sweep-test-1"),
                                               ("seed=3", "complete", "sweep-test-1")]
        assert not list(Path(sweep_mod.tempfile.gettempdir()).glob(f"{sweep_mod._UNMERGED_PREFIX}*"))
    finally:
        for h in holder:
            h.release()
    assert [r[0] for r in _runs(db)] == ["seed=1"]

    proc = cli_here("sweep", "--resume", kept, "--db", db, "--json")
    assert proc.returncode == 0, proc.stderr
    assert f"merged 2 runs from {kept} into {db}" in proc.stderr
    assert len(json.loads(proc.stdout)["runs"]) == 3
    got = _runs(db)
    assert [r[:3] for r in got] == [(f"seed={i}", "complete", "sweep-test-1") for i in (1, 2, 3)]
    assert len({r[3] for r in got}) == 1 and got[0][3] > 0
    assert not kept.exists(), "the kept store goes once merged"


def test_resume_twice_copies_nothing_twice(tmp_path, trace):
    """A resume cut short (--db busy half-way) is resumed again: runs already in --db are skipped."""
    from tierdiag.store.copy_run import merge_store, read_run_tables, write_run_tables

    src = tmp_path / "src.duckdb"
    run_configs(trace, plan_sweep(EngineConfig(model="tiny", gpu="cpu", device_tokens=16 * 1024),
                                  ["seed=1,2"]).configs, src, backend=Processes(jobs=1), sweep_id="s")
    ids = [r[0] for r in duckdb.connect(str(src), read_only=True).execute(
        "SELECT run_id FROM runs ORDER BY name").fetchall()]
    db = tmp_path / "db.duckdb"
    write_run_tables(db, read_run_tables(src, ids[0]))  # the first merged before --db went busy
    copied, there = merge_store(src, db)
    assert (copied, there) == ([ids[1]], [ids[0]])
    assert sorted(r[0] for r in _runs(db)) == ["seed=1", "seed=2"] and not src.exists()


def test_resume_of_a_missing_store_is_one_line(tmp_path):
    proc = cli_here("sweep", "--resume", tmp_path / "none.duckdb", "--db", tmp_path / "db.duckdb")
    assert proc.returncode == 4 and proc.stderr.count("\n") == 1 and "no database at" in proc.stderr
    proc = cli_here("sweep", "--resume", tmp_path / "none.duckdb", "--set", "seed=1,2")
    assert proc.returncode == 2 and "--resume merges a kept store" in proc.stderr
