"""`request_lookup` (store/lookup.py): explain's index of a run's request ids. It finds every
request by its id whatever the id holds, finds nothing that is not there, and is never the truth:
without it (a store written before it, a run still being recorded) `explain` says the same."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.sql_rows import insert_rows
from tierdiag.store import lookup as L
from tierdiag.store.writer import init_store

# Ids as hostile as a trace line or an import can make them: any Unicode (NUL, controls, quotes,
# SQL and Rich markup, surrogate-free), empty, long; distinct within a run as the readers require.
IDS = st.lists(st.text(st.characters(exclude_categories=("Cs",)), max_size=80)
               | st.sampled_from(["'; DROP TABLE requests; --", "[bold]x[/]", "\x1b[31mred", "%", "_", "\\", "🙂" * 30]),
               min_size=1, max_size=60, unique=True)


def _store(path: Path, runs: dict[str, list[str]]) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(str(path))
    init_store(con)
    for run_id, ids in runs.items():
        # executemany's rows in one statement (a statement a row: ~2 ms of CPU a row)
        insert_rows(con, "INSERT INTO requests (run_id, req_id, seq)", [(run_id, rid, seq) for seq, rid in enumerate(ids)])
    return con


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=IDS, other=IDS, missing=st.text(max_size=40))
def test_every_id_is_found_by_the_lookup_and_only_those(tmp_path_factory, ids, other, missing):
    db = tmp_path_factory.mktemp("lookup") / "run.duckdb"
    con = _store(db, {"run-a": ids, "run-b": other})
    try:
        con.execute("BEGIN")
        L.write_request_lookup(con, "run-a")
        con.execute("COMMIT")
        for seq, rid in enumerate(ids):
            assert L.lookup_seq(con, "run-a", rid) == seq
        assert all(L.lookup_seq(con, "run-b", rid) is None for rid in other)  # its run has no lookup yet
        if missing not in ids:
            assert L.lookup_seq(con, "run-a", missing) is None
        # Written again (a run closed twice: interrupted, then its evidence redone): replaced, not doubled.
        con.execute("BEGIN")
        L.write_request_lookup(con, "run-a")
        con.execute("COMMIT")
        assert con.execute("SELECT count(*) FROM request_lookup").fetchone()[0] == len(ids)
        buckets = [b for (b,) in con.execute("SELECT bucket FROM request_lookup").fetchall()]
        assert buckets == sorted(buckets) and all(0 <= b < L.BUCKETS for b in buckets)
    finally:
        con.close()


def test_a_store_without_the_table_answers_none(tmp_path):
    con = _store(tmp_path / "old.duckdb", {"run-a": ["1", "2"]})
    con.execute("DROP TABLE IF EXISTS request_lookup")  # a store written before the table
    try:
        assert L.lookup_seq(con, "run-a", "1") is None
    finally:
        con.close()


@pytest.fixture(scope="module")
def replayed(tmp_path_factory) -> Path:
    """A real replay (sessions included): its close writes the lookup beside the run evidence."""
    from typer.testing import CliRunner

    from tierdiag.cli.main import app

    folder = tmp_path_factory.mktemp("lookup-replay")
    trace = folder / "mixed.jsonl"
    assert CliRunner().invoke(app, ["synth", str(trace), "--requests", "150", "--rate", "8"]).exit_code == 0
    db = folder / "run.duckdb"
    result = CliRunner().invoke(app, ["replay", str(trace), "--db", str(db), "--device-tokens", "65536",
                                      "--host-tokens", "98304"])
    assert result.exit_code == 0, (result.output, result.exception)
    return db


def _explain_all(db: Path) -> dict:
    from tierdiag.diagnose.request.explain import explain_request
    from tierdiag.store.reader import open_store, resolve_run

    with open_store(db) as con:
        run = resolve_run(con, None)
        ids = [r[0] for r in con.execute("SELECT req_id FROM requests WHERE run_id = ? ORDER BY seq", [run.run_id]).fetchall()]
        return {rid: json.dumps(explain_request(con, run, rid).to_json(), sort_keys=True) for rid in ids[::7]}


def test_the_close_writes_it_and_explain_says_the_same_without_it(replayed, tmp_path):
    with duckdb.connect(str(replayed), read_only=True) as con:
        (run_id,) = con.execute("SELECT run_id FROM runs").fetchone()
        rows = con.execute("SELECT req_id, seq FROM request_lookup WHERE run_id = ? ORDER BY seq", [run_id]).fetchall()
        assert rows == con.execute("SELECT req_id, seq FROM requests WHERE run_id = ? ORDER BY seq", [run_id]).fetchall()
    with_lookup = _explain_all(replayed)
    for spoil in ("DROP TABLE request_lookup", "DELETE FROM request_lookup",
                  # a lookup that points elsewhere (another DuckDB's hash, a hand edit): read the old way
                  "UPDATE request_lookup SET seq = seq + 1"):
        db = tmp_path / "spoiled.duckdb"
        shutil.copy(replayed, db)
        with duckdb.connect(str(db)) as con:
            con.execute(spoil)
        assert _explain_all(db) == with_lookup, spoil
        db.unlink()


def test_runs_delete_takes_its_rows(replayed, tmp_path):
    from tierdiag.store.delete import delete_run

    db = tmp_path / "copy.duckdb"
    shutil.copy(replayed, db)
    with duckdb.connect(str(db), read_only=True) as con:
        (run_id,) = con.execute("SELECT run_id FROM runs").fetchone()
    gone = delete_run(db, run_id)
    assert gone.rows["request_lookup"] == gone.rows["requests"] > 0
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM request_lookup").fetchone()[0] == 0
