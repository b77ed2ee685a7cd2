"""Parquet export: every table, partitioned by run, readable back with the same rows."""

from __future__ import annotations

import duckdb

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
