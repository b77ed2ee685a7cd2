"""What the size curves (diagnose/run/size_curves.py) read of a run: its finished requests in trace
order with the times the replay matched and released them, and the tokens they found by tier."""

from __future__ import annotations

from typing import NamedTuple

import duckdb

from tierdiag.diagnose.read.sql import finished_sql


class CurveRequest(NamedTuple):
    seq: int
    req_id: str
    rank: int  # dp_rank, 0 where none is recorded
    sched_ns: int  # its match: arrival + queueing
    fin_ns: int  # its finish (else first token, else its match)
    input_tokens: int  # 0 where NULL, as the counts below
    output_tokens: int
    device_tokens: int
    host_tokens: int
    storage_tokens: int


def curve_requests(con: duckdb.DuckDBPyConnection, run_id: str) -> list[CurveRequest]:
    """The run's finished requests with a seq and an arrival, by seq."""
    return [CurveRequest(*r) for r in con.execute(f"""
        SELECT seq, req_id, coalesce(dp_rank, 0) AS rank, arrival_ns + coalesce(queue_ns, 0) AS sched_ns,
               coalesce(finish_ns, first_token_ns, arrival_ns + coalesce(queue_ns, 0)) AS fin_ns,
               coalesce(input_tokens, 0) AS input, coalesce(output_tokens, 0) AS output,
               coalesce(device_hit_tokens, 0) AS device, coalesce(host_hit_tokens, 0) AS host,
               coalesce(storage_hit_tokens, 0) AS storage
        FROM requests WHERE run_id = ? AND {finished_sql()} AND seq IS NOT NULL AND arrival_ns IS NOT NULL
        ORDER BY seq""", [run_id]).fetchall()]


class CurveColumns(NamedTuple):
    """`curve_requests` as columns: one numpy array a field (int64; req_id: objects, None where
    NULL), rows by seq. A million finished requests are ~70 MB here against ~400 MB as named
    tuples (issue 41: the close of a 1M-request replay)."""

    seq: object
    req_id: object
    rank: object
    sched_ns: object
    fin_ns: object
    input_tokens: object
    output_tokens: object


def curve_columns(con: duckdb.DuckDBPyConnection, run_id: str) -> CurveColumns:
    """The run's finished requests with a seq and an arrival, by seq (curve_requests's rows and
    order, without the hit counts), fetched as columns."""
    import numpy as np

    got = con.execute(f"""
        SELECT seq, req_id, coalesce(dp_rank, 0) AS rank, arrival_ns + coalesce(queue_ns, 0) AS sched_ns,
               coalesce(finish_ns, first_token_ns, arrival_ns + coalesce(queue_ns, 0)) AS fin_ns,
               coalesce(input_tokens, 0) AS input, coalesce(output_tokens, 0) AS output
        FROM requests WHERE run_id = ? AND {finished_sql()} AND seq IS NOT NULL AND arrival_ns IS NOT NULL
        ORDER BY seq""", [run_id]).fetchnumpy()
    ids = got["req_id"]
    if isinstance(ids, np.ma.MaskedArray):  # a NULL req_id: None, as fetchall gives it
        ids = np.where(np.ma.getmaskarray(ids), None, np.ma.getdata(ids)).astype(object)
    ints = [np.ascontiguousarray(np.asarray(got[k]), dtype=np.int64)
            for k in ("seq", "rank", "sched_ns", "fin_ns", "input", "output")]
    return CurveColumns(ints[0], np.asarray(ids, dtype=object), *ints[1:])


class FoundTokens(NamedTuple):
    device_tokens: int
    host_tokens: int
    storage_tokens: int
    input_tokens: int


def found_tokens(con: duckdb.DuckDBPyConnection, run_id: str) -> FoundTokens:
    """The finished requests' hit tokens by tier and input tokens (0 for a run with none finished)."""
    row = con.execute(
        f"SELECT sum(coalesce(device_hit_tokens, 0)), sum(coalesce(host_hit_tokens, 0)), "
        f"sum(coalesce(storage_hit_tokens, 0)), sum(coalesce(input_tokens, 0)) FROM requests "
        f"WHERE run_id = ? AND {finished_sql()}", [run_id]).fetchone()
    return FoundTokens(*(int(x or 0) for x in row))  # sum() of no rows is NULL
