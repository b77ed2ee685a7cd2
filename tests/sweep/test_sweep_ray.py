"""`sweep --ray` on a local Ray (CI installs the `ray` extra): the same 4 runs as the process pool,
every row that of a single replay. One test: a local Ray takes seconds to start."""

from __future__ import annotations

import importlib.util

import pytest

from tests.sweep.sweep_helpers import BASE, NAMES, SETS, assert_same_runs, cli, runs_by_name

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                                reason="needs the ray extra (pip install 'tierdiag[ray]')")


@pytest.mark.slow
def test_ray_sweep_rows_are_those_of_single_replays(tmp_path, trace, singles):
    db = tmp_path / "ray.duckdb"
    proc = cli("sweep", trace, *BASE, *SETS, "--ray", "--jobs", "2", "--db", db, "--json",
               RAY_ENABLE_UV_RUN_RUNTIME_ENV="0", RAY_USAGE_STATS_ENABLED="0")
    assert proc.returncode == 0, proc.stderr
    assert "as Ray tasks" in proc.stderr
    runs = runs_by_name(db)
    assert set(runs) == NAMES and {r["status"] for r in runs.values()} == {"complete"}
    assert len({r["sweep_id"] for r in runs.values()}) == 1
    # The driver records the trace the user named, not the copy a Ray worker replayed.
    assert {r["trace_path"] for r in runs.values()} == {str(trace)}
    assert_same_runs(db, singles, NAMES)
