"""The sweep's merge copies a worker's run file to file inside DuckDB (store.copy_run.RunFileCopier,
issue 41: half the driver's CPU a merge). It must write exactly what the Arrow path wrote
(`write_run_tables(db, read_run_tables(src), overrides)`): every table, every column, the
overrides the sweep sets on the runs row included, whatever text they hold."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierdiag.errors import TierdiagError
from tierdiag.store.copy_run import RUN_TABLES, RunFileCopier, read_run_tables, write_run_tables
from tierdiag.store.schema import OPTIONAL_TABLES, TABLES


@pytest.fixture(scope="module")
def worker_store(tmp_path_factory, trace) -> Path:
    """One replayed run in a store of its own, as a sweep worker leaves it."""
    from tierdiag.app.replay import replay
    from tierdiag.config.engine import EngineConfig

    db = tmp_path_factory.mktemp("worker") / "run-0.duckdb"
    replay(trace, EngineConfig(model="tiny", gpu="cpu", device_tokens=16 * 1024, host_tokens=16 * 1024),
           db=db, run_name="w", probes=True, skip_bad=False)
    return db


def every_row(db: Path, tables: tuple[str, ...] | None = None) -> dict[str, list[tuple]]:
    """Every row of every table a run has (of `tables` where given), in a canonical order, all
    columns (run_id too)."""
    out = {}
    with duckdb.connect(str(db), read_only=True) as con:
        present = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
        for table in RUN_TABLES + tuple(OPTIONAL_TABLES):
            if table not in present or (tables is not None and table not in tables):
                continue
            cols = list(TABLES.get(table) or OPTIONAL_TABLES[table])
            order = ", ".join(f"{c} NULLS FIRST" for c in cols)
            out[table] = con.execute(f"SELECT {', '.join(cols)} FROM {table} ORDER BY {order}").fetchall()
    return out


SWEEP_OVERRIDES = {"sweep_id": "sweep-20261205-000000-abcdef", "kind": "replay",
                   "trace_path": "/traces/conversation.jsonl", "command_line": "tierdiag sweep t --set x=1,2",
                   "status": "complete"}


def test_the_copy_holds_exactly_the_rows_the_arrow_path_wrote(tmp_path, worker_store):
    arrow, direct = tmp_path / "arrow.duckdb", tmp_path / "direct.duckdb"
    id_arrow = write_run_tables(arrow, read_run_tables(worker_store), SWEEP_OVERRIDES)
    copier = RunFileCopier()
    try:
        row = copier.source(worker_store)
        assert row is not None and row["status"] == "complete" and row["error"] is None
        id_direct = copier.copy(direct, SWEEP_OVERRIDES)
    finally:
        copier.close()
    assert id_arrow == id_direct == row["run_id"]
    a, b = every_row(arrow), every_row(direct)
    assert a.keys() == b.keys() and "run_evidence" in a and a["requests"], sorted(a)
    for table in a:
        assert a[table] == b[table], table
    assert worker_store.exists(), "the source is only read"


def test_a_second_run_goes_in_beside_the_first_through_one_connection(tmp_path, worker_store):
    """The driver keeps one copier for the whole sweep: each copy its own transaction."""
    other = tmp_path / "run-1.duckdb"
    shutil.copy(worker_store, other)
    db = tmp_path / "db.duckdb"
    copier = RunFileCopier()
    try:
        copier.source(worker_store)
        copier.copy(db, {"name": "first"} if "name" in TABLES["runs"] else {})
        copier.release_source()
        # The same run id twice would break nothing here: a sweep's workers make distinct ones.
        copier.source(other)
        copier.copy(db, {"sweep_id": "s2"})
    finally:
        copier.close()
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 2
        n = con.execute("SELECT count(*) FROM requests").fetchone()[0]
    with duckdb.connect(str(worker_store), read_only=True) as con:
        assert n == 2 * con.execute("SELECT count(*) FROM requests").fetchone()[0]


def test_a_store_without_a_run_is_none(tmp_path):
    empty = tmp_path / "empty.duckdb"
    duckdb.connect(str(empty)).close()
    copier = RunFileCopier()
    try:
        assert copier.source(empty) is None
    finally:
        copier.close()


def test_a_busy_destination_is_the_one_line_busy_error_and_the_next_copy_still_works(tmp_path, worker_store):
    """Keeper's fallback: --db busy -> the same run into the kept store, with the same copier."""
    db = tmp_path / "busy.duckdb"
    write_run_tables(db, read_run_tables(worker_store), {"sweep_id": "before"})
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); "
                               "print('held', flush=True); time.sleep(60)", str(db)], stdout=subprocess.PIPE, text=True)
    copier = RunFileCopier()
    try:
        assert holder.stdout.readline().strip() == "held"
        copier.source(worker_store)
        with pytest.raises(TierdiagError) as busy:
            copier.copy(db, SWEEP_OVERRIDES, wait_s=0.2)
        assert "busy" in busy.value.message and "\n" not in busy.value.message
        kept = tmp_path / "kept.duckdb"
        run_id = copier.copy(kept, SWEEP_OVERRIDES)
    finally:
        copier.close()
        holder.kill()
        holder.wait()
    assert every_row(kept, ("runs",))["runs"][0][0] == run_id
    assert len(every_row(db, ("runs",))["runs"]) == 1, "the busy store is as it was"


def test_copy_before_a_source_is_refused(tmp_path):
    with pytest.raises(ValueError):
        RunFileCopier().copy(tmp_path / "db.duckdb", {})


_hostile = st.one_of(st.none(), st.text(max_size=40), st.sampled_from(
    ["'; DROP TABLE runs; --", "a'b\"c", "\x00nul", "\x1b[31mred\x1b[0m", "[bold]x[/]", "é漢字🙂", " " * 3, "\\"]))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sweep_id=_hostile, trace_path=_hostile, command_line=_hostile,
       status=st.sampled_from(["complete", "interrupted", "failed"]))
def test_hostile_override_text_lands_as_the_arrow_path_writes_it(tmp_path_factory, worker_store, sweep_id,
                                                                  trace_path, command_line, status):
    overrides = {"sweep_id": sweep_id, "trace_path": trace_path, "command_line": command_line, "status": status}
    tmp = tmp_path_factory.mktemp("hostile")
    arrow, direct = tmp / "arrow.duckdb", tmp / "direct.duckdb"
    copier = RunFileCopier()
    outcomes = []
    try:
        for put in (lambda: write_run_tables(arrow, read_run_tables(worker_store), overrides),
                    lambda: (copier.source(worker_store), copier.copy(direct, overrides))):
            try:
                put()
                outcomes.append("ok")
            except (TierdiagError, duckdb.Error, ValueError) as exc:
                outcomes.append(type(exc).__name__)
    finally:
        copier.close()
    assert outcomes[1] == "ok" or outcomes[0] != "ok", outcomes
    if outcomes == ["ok", "ok"]:  # the runs row is where the overrides land: only it is read back
        assert every_row(arrow, ("runs",))["runs"] == every_row(direct, ("runs",))["runs"]


