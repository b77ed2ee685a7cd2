"""The store's side of the folds' check at a run's close (diagnose/run/story_rows.py, its story's,
run context's and eviction queries' rows made while the run was recorded): what the committed
rows must be for the folded ones to be theirs, in one statement."""

from __future__ import annotations

import duckdb

from tierdiag.diagnose.read.sql import finished_sql


def folded_rows_check(con: duckdb.DuckDBPyConnection, run_id: str) -> tuple[int, ...]:
    """`story_rows_check`'s two numbers, then the run's request rows, its evictions and the sum
    of their ids, its re-references and the sum of theirs, its transfers and the sum of theirs, in
    one statement: what rows folded while recording, the eviction queries' and the run's scan's
    too (diagnose/run/eviction_rows.py, scan_rows.py), must have been."""
    row = con.execute(
        f"""SELECT * FROM
                (SELECT count(*) FILTER (WHERE {finished_sql('q')}),
                        coalesce(sum(q.seq) FILTER (WHERE {finished_sql('q')}), 0), count(*)
                 FROM requests q WHERE q.run_id = $r),
                (SELECT count(*), coalesce(sum(eviction_id), 0) FROM evictions WHERE run_id = $r),
                (SELECT count(*), coalesce(sum(eviction_id), 0) FROM request_evictions WHERE run_id = $r),
                (SELECT count(*), coalesce(sum(transfer_id), 0) FROM transfers WHERE run_id = $r)""",
        {"r": run_id}).fetchall()[0]
    return tuple(int(x) for x in row)
