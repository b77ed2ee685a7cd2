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
    """`curve_requests` as columns: one int64 numpy array a field, rows by seq; `req_id` holds each
    req_id's hash (`req_hashes`), not the string (issue 41: a million strings held through the
    close of a 1M-request replay; the close compares ids only, against the trace's, hashed).
    A million finished requests are ~56 MB here against ~400 MB as named tuples."""

    seq: object
    req_id: object
    rank: object
    sched_ns: object
    fin_ns: object
    input_tokens: object
    output_tokens: object


def req_hashes(req_ids) -> "np.ndarray":
    """Each req_id's hash (Python's: SipHash, stable within this process; None's for a NULL), as
    int64: what the close compares of a row's id against its trace line's."""
    import numpy as np

    ids = list(req_ids)
    return np.fromiter((hash(r) for r in ids), dtype=np.int64, count=len(ids))


CURVE_CHUNK_ROWS = 131_072  # rows fetched (and their req_ids hashed) at a time by `curve_columns`


def curve_columns(con: duckdb.DuckDBPyConnection, run_id: str, chunk_rows: int = CURVE_CHUNK_ROWS) -> CurveColumns:
    """The run's finished requests with a seq and an arrival, by seq (curve_requests's rows and
    order, without the hit counts; req_ids hashed), fetched as columns a range of seqs of about
    `chunk_rows` rows at a time, each sorted by seq here: no `ORDER BY` of them all (DuckDB's sort
    of a million rows and their strings: a 1M-request close's peak, issue 41), and only a chunk's
    req_id strings alive at once. A run's seqs are distinct (one a trace line), so the order is
    ORDER BY seq's. Through the C extension's fetchnumpy: no Arrow, no relational API loaded
    (a reader computing the evidence: store/duckdb_core.py)."""
    import numpy as np

    where = f"run_id = ? AND {finished_sql()} AND seq IS NOT NULL AND arrival_ns IS NOT NULL"
    lo, hi, n = con.execute(f"SELECT min(seq), max(seq), count(*) FROM requests WHERE {where}", [run_id]).fetchall()[0]
    names = ("seq", "req_id", "rank", "sched_ns", "fin_ns", "input", "output")
    parts: list[list] = [[] for _ in names]
    if n:
        width = -(-(hi - lo + 1) // -(-n // max(int(chunk_rows), 1)))  # ceil(span / ceil(n / chunk_rows))
        for start in range(lo, hi + 1, width):
            got = con.execute(f"""
                SELECT seq, req_id, coalesce(dp_rank, 0) AS rank, arrival_ns + coalesce(queue_ns, 0) AS sched_ns,
                       coalesce(finish_ns, first_token_ns, arrival_ns + coalesce(queue_ns, 0)) AS fin_ns,
                       coalesce(input_tokens, 0) AS input, coalesce(output_tokens, 0) AS output
                FROM requests WHERE {where} AND seq >= ? AND seq < ?""", [run_id, start, start + width]).fetchnumpy()
            order = np.argsort(np.asarray(got["seq"]), kind="stable")
            for i, name in enumerate(names):
                col = got.pop(name)
                if name == "req_id":
                    if isinstance(col, np.ma.MaskedArray):  # a NULL req_id: None's hash
                        col = np.where(np.ma.getmaskarray(col), None, np.ma.getdata(col)).astype(object)
                    parts[i].append(req_hashes(np.asarray(col, dtype=object)[order]))
                else:
                    parts[i].append(np.asarray(col, dtype=np.int64)[order])
            del got, order
    cols = []
    for i in range(len(names)):  # a column joined, its chunks let go, then the next: one copy at a time
        cols.append(np.concatenate(parts[i]) if parts[i] else np.zeros(0, dtype=np.int64))
        parts[i] = []
    return CurveColumns(*cols)


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
        f"WHERE run_id = ? AND {finished_sql()}", [run_id]).fetchall()[0]
    return FoundTokens(*(int(x or 0) for x in row))  # sum() of no rows is NULL
