"""One request's surroundings (diagnose/request/context.py): the batches and requests of its rank around
its wait, each query filtered on the run's id first and bounded by the window it asks about.

A data-parallel run: a request waited for its own rank's GPU and memory, so its surroundings
are that rank's batches and requests (one rank, or rows without a rank: rank 0, all of them).
"""

from __future__ import annotations

from typing import NamedTuple

import duckdb

SAME_RANK = "coalesce(dp_rank, 0) = $rank"


class WindowLoad(NamedTuple):
    """The batches of a window, each counted by its part inside it."""
    num_batches: int
    busy_ns: int | None
    compute_ns: float | None
    recompute_ns: float | None


def window_load(con: duckdb.DuckDBPyConnection, run_id: str, start_ns: int, end_ns: int, rank: int,
                rec: str) -> WindowLoad:
    """The batches of `rank` overlapping [start, end]; `rec` the batch recompute column (or '0')."""
    return WindowLoad(*con.execute(
        f"""SELECT count(*),
                   coalesce(sum(least(t_end_ns, $e) - greatest(t_start_ns, $s)), 0),
                   coalesce(sum(compute_ns::DOUBLE * (least(t_end_ns, $e) - greatest(t_start_ns, $s))
                                / greatest(t_end_ns - t_start_ns, 1)), 0),
                   coalesce(sum({rec}::DOUBLE * (least(t_end_ns, $e) - greatest(t_start_ns, $s))
                                / greatest(t_end_ns - t_start_ns, 1)), 0)
            FROM batches WHERE run_id = $r AND t_end_ns > $s AND t_start_ns < $e AND {SAME_RANK}""",
        {"r": run_id, "s": start_ns, "e": end_ns, "rank": rank}).fetchall()[0])


def queue_depth_at_arrival(con: duckdb.DuckDBPyConnection, run_id: str, req_id: str, arrival_ns: int, seq: int,
                           rank: int) -> int:
    """Requests of `rank` that had arrived before this one (at the same instant, the earlier trace
    line first) and were scheduled after it arrived: the replay's own queue at its arrival.

    `finish_ns > arrival` changes no count (a finished request finishes after its first token,
    which comes after it was scheduled: prefill_ns >= 0) but lets DuckDB skip every row group
    that finished before this arrival: rows are appended as requests finish, so with
    `arrival_ns <` it reads the row groups around the arrival, not the whole run (a fresh
    process's scan of a 1M-request run: 45 -> 8 ms of CPU; issue 41)."""
    return int(con.execute(
        "SELECT count(*) FROM requests WHERE run_id = ? AND req_id <> ? "
        "AND (arrival_ns < ? OR (arrival_ns = ? AND seq < ?)) "
        "AND status = 'finished' AND first_token_ns - prefill_ns > ? AND coalesce(dp_rank, 0) = ? "
        "AND (finish_ns > ? OR finish_ns IS NULL)",
        [run_id, req_id, arrival_ns, arrival_ns, seq, arrival_ns, rank, arrival_ns]).fetchall()[0][0])


class WindowBatch(NamedTuple):
    t_start_ns: int
    t_end_ns: int
    compute_ns: int | None
    loadback_exposed_ns: int | None
    recompute_ns: int | None


def window_batches(con: duckdb.DuckDBPyConnection, run_id: str, start_ns: int, end_ns: int, rank: int,
                   rec: str) -> list[WindowBatch]:
    """The batches of `rank` overlapping (start, end) in clock order; `rec` the batch recompute column."""
    return [WindowBatch(*b) for b in con.execute(
        f"SELECT t_start_ns, t_end_ns, compute_ns, loadback_exposed_ns, {rec} AS recompute_ns FROM batches "
        "WHERE run_id = ? AND t_end_ns > ? AND t_start_ns < ? AND coalesce(dp_rank, 0) = ? "
        "ORDER BY t_start_ns, batch_id",
        [run_id, start_ns, end_ns, rank]).fetchall()]


def others_decoding(con: duckdb.DuckDBPyConnection, run_id: str, req_id: str, lo_ns: int, hi_ns: int,
                    rank: int) -> list[tuple[int, int]]:
    """(first token, finish) of the other requests of `rank` decoding at some time in (lo, hi)."""
    return [(int(a), int(b)) for a, b in con.execute(
        "SELECT first_token_ns, finish_ns FROM requests WHERE run_id = ? AND req_id <> ? "
        "AND first_token_ns < ? AND finish_ns > ? AND coalesce(dp_rank, 0) = ?",
        [run_id, req_id, hi_ns, lo_ns, rank]).fetchall()]


def others_held(con: duckdb.DuckDBPyConnection, run_id: str, req_id: str, lo_ns: int, hi_ns: int,
                rank: int) -> list[tuple[int, int]]:
    """(arrival, end of its storage hold) of the other requests of `rank` held for storage at some time in (lo, hi)."""
    return [(int(a), int(a) + int(w)) for a, w in con.execute(
        "SELECT arrival_ns, storage_wait_ns FROM requests WHERE run_id = ? AND req_id <> ? "
        "AND storage_wait_ns > 0 AND arrival_ns < ? AND arrival_ns + storage_wait_ns > ? "
        "AND coalesce(dp_rank, 0) = ?", [run_id, req_id, hi_ns, lo_ns, rank]).fetchall()]


def running_spans(con: duckdb.DuckDBPyConnection, run_id: str, rank: int, lo: int, hi: int) -> list[tuple[int, int]]:
    """(first token, finish) of the requests of `rank` that were running (decoding: SGLang's
    running batch) at some time in [lo, hi): the spans that count toward max_running_requests
    there (run_context.decoding_span_arrays, cut to one request's wait)."""
    return [(int(a), int(b)) for a, b in con.execute(
        "SELECT first_token_ns, finish_ns FROM requests WHERE run_id = ? AND coalesce(dp_rank, 0) = ? "
        "AND first_token_ns IS NOT NULL AND finish_ns > first_token_ns AND first_token_ns < ? AND finish_ns > ?",
        [run_id, rank, hi, lo]).fetchall()]
