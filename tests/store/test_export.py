"""Parquet export: every table, partitioned by run, readable back with the same rows."""

from __future__ import annotations

import duckdb
import pytest

from tests.store.test_store import SAMPLE, writer
from tierdiag.store.export import EXPORTED, export_parquet
from tierdiag.store.reader import list_runs, open_store
from tierdiag.store.schema import EVENT_TABLES, TABLES


def test_export_partitions_by_run_and_round_trips(tmp_path):
    db = tmp_path / "s.duckdb"
    ids = []
    for name in ("a", "b"):
        w = writer(db, name)
        w.append({t: {c: [SAMPLE[typ]] * 3 for c, typ in TABLES[t].items() if c != "run_id"} for t in EVENT_TABLES})
        w.finish("complete", num_requests=3)
        ids.append(w.run_id)
    with open_store(db) as con:
        result = export_parquet(con, list_runs(con), tmp_path / "pq")
    assert result.rows["requests"] == 6 and result.rows["runs"] == 2
    for run_id in ids:
        assert (tmp_path / "pq" / "requests" / f"run_id={run_id}").is_dir()
    con = duckdb.connect()
    got = con.execute(f"SELECT run_id, count(*) FROM read_parquet('{tmp_path}/pq/evictions/*/*.parquet', "
                      "hive_partitioning = true) GROUP BY 1 ORDER BY 1").fetchall()
    assert got == sorted((i, 3) for i in ids)
    assert set(EXPORTED) == set(TABLES) - {"meta"}


def _rows_read_back(folder, table: str) -> list[tuple]:
    con = duckdb.connect()
    return con.execute(f"SELECT run_id, count(*) FROM read_parquet('{folder}/{table}/*/*.parquet', "
                       "hive_partitioning = true) GROUP BY 1 ORDER BY 1").fetchall()


def _store_with_runs(db, names):
    ids = []
    for name in names:
        w = writer(db, name)
        w.append({t: {c: [SAMPLE[typ]] * 3 for c, typ in TABLES[t].items() if c != "run_id"} for t in EVENT_TABLES})
        w.finish("complete", num_requests=3)
        ids.append(w.run_id)
    return ids


def test_export_all_again_drops_the_partitions_of_runs_deleted_since(tmp_path):
    """Issue 32: `export --all` into a folder holding an earlier export kept the partitions of runs
    deleted since, and reading the folder back doubled rows."""
    from tierdiag.store.delete import delete_run

    db = tmp_path / "s.duckdb"
    a, b = _store_with_runs(db, ("a", "b"))
    out = tmp_path / "pq"
    with open_store(db) as con:
        export_parquet(con, list_runs(con), out, replace_all=True)
    assert _rows_read_back(out, "requests") == sorted([(a, 3), (b, 3)])
    delete_run(db, a, keep_storage=True)
    with open_store(db) as con:
        export_parquet(con, list_runs(con), out, replace_all=True)
    for table in EVENT_TABLES:
        assert _rows_read_back(out, table) == [(b, 3)], table
    assert not (out / "requests" / f"run_id={a}").exists()
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == [], "no staging folder left"


def test_exporting_one_run_replaces_its_partitions_and_keeps_the_others(tmp_path):
    db = tmp_path / "s.duckdb"
    a, b = _store_with_runs(db, ("a", "b"))
    out = tmp_path / "pq"
    with open_store(db) as con:
        runs = {r.run_id: r for r in list_runs(con)}
        export_parquet(con, [runs[a]], out)
        export_parquet(con, [runs[b]], out)
        export_parquet(con, [runs[a]], out)  # again: replaced, not added
    assert _rows_read_back(out, "requests") == sorted([(a, 3), (b, 3)])


def test_a_folder_holding_files_export_did_not_write_is_refused_untouched(tmp_path):
    from tierdiag.errors import OutputError

    db = tmp_path / "s.duckdb"
    _store_with_runs(db, ("a",))
    out = tmp_path / "pq"
    (out / "requests").mkdir(parents=True)
    mine = out / "requests" / "notes.txt"
    mine.write_text("keep me")
    with open_store(db) as con:
        with pytest.raises(OutputError, match="notes.txt was not written by tierdiag export"):
            export_parquet(con, list_runs(con), out, replace_all=True)
    assert mine.read_text() == "keep me" and sorted(p.name for p in out.iterdir()) == ["requests"]
