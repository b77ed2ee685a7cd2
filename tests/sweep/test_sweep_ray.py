"""`sweep --ray` on a local Ray (CI installs the `ray` extra): README.md's `--ray` line, as a user
types it, every run's rows those of the same config replayed alone. One run of that line a suite,
for this test and the README's (tests/support/shared_commands.py): a local Ray takes seconds of
CPU to start, its daemons included."""

from __future__ import annotations

import importlib.util

import pytest

from tests.support.shared_commands import RAY_SWEEP, shared_command
from tests.sweep.sweep_helpers import DEMO, assert_same_runs, runs_by_name

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                                reason="needs the ray extra (pip install 'tierdiag[ray]')")


@pytest.mark.slow
def test_ray_sweep_rows_are_those_of_single_replays(tmp_path_factory):
    from tierdiag.app.replay import replay
    from tierdiag.config.engine import EngineConfig
    from tierdiag.config.sweep_spec import plan_sweep

    folder, proc = shared_command(tmp_path_factory, RAY_SWEEP)
    assert proc.returncode == 0, proc.stderr
    assert "as Ray tasks" in proc.stderr
    db = folder / RAY_SWEEP[RAY_SWEEP.index("--db") + 1]
    plan = plan_sweep(EngineConfig(), [RAY_SWEEP[i + 1] for i, a in enumerate(RAY_SWEEP) if a == "--set"])
    names = {name for name, _ in plan.configs}
    runs = runs_by_name(db)
    assert set(runs) == names and len(names) == 2 and {r["status"] for r in runs.values()} == {"complete"}
    assert len({r["sweep_id"] for r in runs.values()}) == 1
    # The driver records the trace the user named (made absolute in the user's folder), not the copy
    # a Ray worker replayed.
    assert {r["trace_path"] for r in runs.values()} == {str(folder / RAY_SWEEP[1])}
    singles = tmp_path_factory.mktemp("ray_singles") / "singles.duckdb"
    for name, cfg in plan.configs:
        replay(DEMO, cfg, db=singles, run_name=name, probes=True, skip_bad=False)
    assert_same_runs(db, singles, names)
