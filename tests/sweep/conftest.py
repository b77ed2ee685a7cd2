"""Fixtures: one small trace, its 4-combination sweep replayed one config at a time (in-process,
through the same `replay` the CLI calls), shared by the tests of this folder."""

from __future__ import annotations

from pathlib import Path

import pytest


from tests.sweep.sweep_helpers import small_trace


@pytest.fixture(scope="session")
def trace(tmp_path_factory) -> Path:
    return small_trace(tmp_path_factory.mktemp("trace"))


@pytest.fixture(scope="session")
def singles(tmp_path_factory, trace) -> Path:
    """The sweep's 4 configs, each replayed on its own, into one store."""
    from tierdiag.config.engine import EngineConfig
    from tierdiag.app.replay import replay
    from tierdiag.config.sweep_spec import plan_sweep

    db = tmp_path_factory.mktemp("singles") / "singles.duckdb"
    base = EngineConfig(model="tiny", gpu="cpu", device_tokens=16 * 1024)
    plan = plan_sweep(base, ["host_tokens=16k,64k", "write_policy=write_through,write_back"])
    for name, cfg in plan.configs:
        replay(trace, cfg, db=db, run_name=name, probes=True, skip_bad=False)
    return db


@pytest.fixture(scope="session")
def swept(tmp_path_factory, trace) -> Path:
    """`tierdiag sweep` of the same 4 combinations, 2 worker processes."""
    from tests.sweep.sweep_helpers import BASE, SETS, cli_here

    db = tmp_path_factory.mktemp("swept") / "sweep.duckdb"
    proc = cli_here("sweep", trace, *BASE, *SETS, "--jobs", "2", "--db", db)
    assert proc.returncode == 0, proc.stderr
    return db
