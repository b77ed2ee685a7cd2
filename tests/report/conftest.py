"""Fixtures for the report tests: a small fake run (see fake_run.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fake_run import write_fake_run


@pytest.fixture
def fake_db(tmp_path: Path) -> Path:
    db = tmp_path / "run.duckdb"
    write_fake_run(db)
    return db
