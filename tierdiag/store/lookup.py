"""`request_lookup`: where one request of a big run is, without comparing every request id.

`explain REQ_ID` starts by finding the request's row. The `requests` table is in the order its
writer appended (finish order), so `WHERE req_id = ?` compares every id of the run: ~0.1 s of a
1M-request run, each time (issue 41). At the run's close the writer also stores each request's
(bucket, req_id, seq), sorted by bucket, where the bucket is DuckDB's `hash(req_id) % BUCKETS`;
a lookup then reads one row group's buckets (the zone maps skip the rest) and compares the few
ids of its bucket, and the row itself is found by `seq` (the zone maps again).

The table is an index, never the truth: a reader that finds nothing in it (a store written before
it, a run still being recorded, a DuckDB whose `hash` differs from the writer's) reads `requests`
the old way, so the answer is the same either way; only the time differs.
"""

from __future__ import annotations

import duckdb

TABLE = "request_lookup"
BUCKETS = 4096  # ~250 ids a bucket on a 1M-request run; ~500 buckets a row group
_BUCKET_SQL = f"CAST(hash(req_id) % {BUCKETS} AS INTEGER)"


def write_request_lookup(con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    """Replace run `run_id`'s rows of the table (created where the store lacks it), inside the
    caller's transaction."""
    from tierdiag.store.schema import OPTIONAL_TABLES, create_table_sql

    con.execute(create_table_sql(TABLE, OPTIONAL_TABLES[TABLE]))
    con.execute(f"DELETE FROM {TABLE} WHERE run_id = ?", [run_id])
    con.execute(f"INSERT INTO {TABLE} (run_id, bucket, req_id, seq) "
                f"SELECT run_id, {_BUCKET_SQL}, req_id, seq FROM requests "
                f"WHERE run_id = ? AND req_id IS NOT NULL AND seq IS NOT NULL ORDER BY 2, 4", [run_id])


def lookup_seq(con: duckdb.DuckDBPyConnection, run_id: str, req_id: str) -> int | None:
    """The request's `seq` as the lookup has it; None where the lookup does not (module doc)."""
    # The bucket computed in the same query (a query of its own was ~1 ms of explain's start):
    # a constant once the parameter is bound, so the zone maps still skip the other buckets.
    try:
        rows = con.execute(f"SELECT seq FROM {TABLE} WHERE run_id = $r AND bucket = CAST(hash($q::VARCHAR) % {BUCKETS} "
                           f"AS INTEGER) AND req_id = $q", {"r": run_id, "q": req_id}).fetchall()
    except duckdb.CatalogException:  # a store written before the table
        return None
    return int(rows[0][0]) if len(rows) == 1 and rows[0][0] is not None else None
