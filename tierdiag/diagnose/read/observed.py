"""The queries over an imported (observed) run and its twin replay (diagnose/twin/observed.py,
observed_twin.py, twin_error.py, observed_explain.py): the server's own numbers summed, and the
two runs' rows paired by request id. Filtered on the run ids first, aggregated in DuckDB.
"""

from __future__ import annotations

from typing import NamedTuple

import duckdb

from tierdiag.diagnose.request.causes import server_cause_sql
from tierdiag.diagnose.read.quantile import quantile_sql


class ObservedTotals(NamedTuple):
    """Over every request of an observed run (sums None where no row says)."""
    requests: int
    finished: int
    aborted: int
    split_unknown: int  # no device hit reported
    with_ttft: int
    input_tokens: int | None  # of the requests with a known split
    device_tokens: int | None
    host_tokens: int | None
    storage_tokens: int | None
    computed_tokens: int | None
    hit_requests: int  # reused any tokens
    split_known: int
    first_arrival_ns: int | None
    last_event_ns: int | None
    ttft_ns: int | None
    queue_ns: int | None  # of the requests with a TTFT
    storage_wait_ns: int | None
    mostly_queueing: int  # the server's own cause: queueing


def observed_totals(con: duckdb.DuckDBPyConnection, run_id: str) -> ObservedTotals:
    return ObservedTotals(*con.execute(f"""
        SELECT count(*) AS n, count(*) FILTER (WHERE status = 'finished') AS finished,
               count(*) FILTER (WHERE status = 'aborted') AS aborted,
               count(*) FILTER (WHERE device_hit_tokens IS NULL) AS unknown,
               count(ttft_ns) AS with_ttft,
               sum(input_tokens) FILTER (WHERE device_hit_tokens IS NOT NULL) AS input_tokens,
               sum(device_hit_tokens) AS d, sum(host_hit_tokens) AS h, sum(storage_hit_tokens) AS s,
               sum(computed_tokens) FILTER (WHERE device_hit_tokens IS NOT NULL) AS c,
               count(*) FILTER (WHERE device_hit_tokens + host_hit_tokens + storage_hit_tokens > 0) AS hits,
               count(device_hit_tokens) AS known,
               min(arrival_ns) AS t0, max(coalesce(finish_ns, first_token_ns, arrival_ns)) AS t1,
               sum(ttft_ns) AS ttft, sum(queue_ns) FILTER (WHERE ttft_ns IS NOT NULL) AS queue,
               sum(storage_wait_ns) AS wait,
               count(*) FILTER (WHERE ({server_cause_sql()}) = 'queueing') AS mostly_queueing
        FROM requests WHERE run_id = ?""", [run_id]).fetchall()[0])


class ObservedClassRow(NamedTuple):
    """The finished requests of one hit class (`is_total`: of all of them) with their TTFT quantiles."""
    hit_class: str | None
    is_total: int
    requests: int
    input_tokens: int | None
    ttft_p50_ns: int | None
    ttft_p90_ns: int | None
    ttft_p99_ns: int | None
    queue_p50_ns: int | None


def observed_classes(con: duckdb.DuckDBPyConnection, run_id: str) -> list[ObservedClassRow]:
    """One row per hit class and one for all (unordered)."""
    return [ObservedClassRow(*r) for r in con.execute("""
        SELECT hit_class, grouping(hit_class) AS is_total, count(*) AS n, sum(input_tokens) AS input_tokens,
               quantile_disc(ttft_ns, 0.5) AS p50, quantile_disc(ttft_ns, 0.9) AS p90,
               quantile_disc(ttft_ns, 0.99) AS p99, quantile_disc(queue_ns, 0.5) AS q50
        FROM requests WHERE run_id = ? AND status = 'finished' GROUP BY GROUPING SETS ((hit_class), ())""",
                                                       [run_id]).fetchall()]


def request_count(con: duckdb.DuckDBPyConnection, run_id: str) -> int:
    return int(con.execute("SELECT count(*) FROM requests WHERE run_id = ?", [run_id]).fetchall()[0][0])


def request_counts(con: duckdb.DuckDBPyConnection, *run_ids: str) -> dict[str, int]:
    """run id -> its requests (a run with none left out)."""
    marks = ", ".join("?" for _ in run_ids)
    return dict(con.execute(f"SELECT run_id, count(*) FROM requests WHERE run_id IN ({marks}) GROUP BY run_id",
                            list(run_ids)).fetchall())


def shared_requests(con: duckdb.DuckDBPyConnection, a: str, b: str) -> int:
    """Requests of run `a` that run `b` has too (same id, same input length)."""
    return int(con.execute(
        "SELECT count(*) FROM requests o JOIN requests r ON r.run_id = ? AND r.req_id = o.req_id "
        "AND r.input_tokens = o.input_tokens WHERE o.run_id = ?", [b, a]).fetchall()[0][0])


def request_rank(con: duckdb.DuckDBPyConnection, run_id: str, req_id: str) -> int | None:
    """The data-parallel rank that served `req_id` in the run (None: not there, or no rank)."""
    found = next(iter(con.execute("SELECT dp_rank FROM requests WHERE run_id = ? AND req_id = ?",
                                  [run_id, req_id]).fetchall()), None)
    return found[0] if found else None


# The observed run's requests ($a) paired with the replay's ($b) by id: each side's split and
# TTFT, whether the splits agree within a page ($page) and the replay's TTFT error.
_PAIRS = """
    WITH p AS (
        SELECT o.req_id, o.input_tokens,
               o.device_hit_tokens AS od, o.host_hit_tokens AS oh, o.storage_hit_tokens AS os,
               o.computed_tokens AS oc,
               r.device_hit_tokens AS rd, r.host_hit_tokens AS rh, r.storage_hit_tokens AS rs,
               r.computed_tokens AS rc,
               o.ttft_ns AS ot, r.ttft_ns AS rt, o.seq
        FROM requests o JOIN requests r ON r.run_id = $b AND r.req_id = o.req_id
        WHERE o.run_id = $a),
    q AS (
        SELECT *, CASE WHEN od IS NULL OR rd IS NULL THEN NULL
                       ELSE abs(od - rd) <= $page AND abs(coalesce(oh, 0) - coalesce(rh, 0)) <= $page
                            AND abs(coalesce(os, 0) - coalesce(rs, 0)) <= $page END AS split_match,
               CASE WHEN ot IS NOT NULL AND rt IS NOT NULL THEN rt - ot END AS err
        FROM p)
"""


class PairTotals(NamedTuple):
    """Over the paired requests; the token sums over the pairs whose splits are both known."""
    matched: int
    split_known: int
    split_match: int
    observed_device_tokens: int
    observed_host_tokens: int
    observed_storage_tokens: int
    observed_computed_tokens: int
    replayed_device_tokens: int
    replayed_host_tokens: int
    replayed_storage_tokens: int
    replayed_computed_tokens: int
    ttft_pairs: int
    ttft_abs_error_p50_ns: int | None
    ttft_abs_error_p90_ns: int | None
    ttft_rel_error_p50: float | None
    ttft_rel_error_p90: float | None
    ttft_bias_p50_ns: int | None


def pair_totals(con: duckdb.DuckDBPyConnection, observed_id: str, replayed_id: str, page_tokens: int) -> PairTotals:
    # Percentiles by nearest rank (quantile.py), as every view: each is one request's error.
    return PairTotals(*con.execute(_PAIRS + f"""
        SELECT count(*) AS matched,
               count(split_match) AS split_known, count(*) FILTER (WHERE split_match) AS split_match,
               coalesce(sum(od) FILTER (WHERE split_match IS NOT NULL), 0) AS od,
               coalesce(sum(oh) FILTER (WHERE split_match IS NOT NULL), 0) AS oh,
               coalesce(sum(os) FILTER (WHERE split_match IS NOT NULL), 0) AS os,
               coalesce(sum(oc) FILTER (WHERE split_match IS NOT NULL), 0) AS oc,
               coalesce(sum(rd) FILTER (WHERE split_match IS NOT NULL), 0) AS rd,
               coalesce(sum(rh) FILTER (WHERE split_match IS NOT NULL), 0) AS rh,
               coalesce(sum(rs) FILTER (WHERE split_match IS NOT NULL), 0) AS rs,
               coalesce(sum(rc) FILTER (WHERE split_match IS NOT NULL), 0) AS rc,
               count(err) AS ttft_pairs,
               {quantile_sql("abs(err)", 0.5)} AS abs50, {quantile_sql("abs(err)", 0.9)} AS abs90,
               {quantile_sql("abs(err) / ot", 0.5)} FILTER (WHERE ot > 0) AS rel50,
               {quantile_sql("abs(err) / ot", 0.9)} FILTER (WHERE ot > 0) AS rel90,
               {quantile_sql("err", 0.5)} AS bias50
        FROM q""", {"a": observed_id, "b": replayed_id, "page": page_tokens}).fetchall()[0])


class PairRow(NamedTuple):
    """One request in both runs."""
    req_id: str
    input_tokens: int | None
    observed_device_tokens: int | None
    observed_host_tokens: int | None
    observed_storage_tokens: int | None
    observed_computed_tokens: int | None
    replayed_device_tokens: int | None
    replayed_host_tokens: int | None
    replayed_storage_tokens: int | None
    replayed_computed_tokens: int | None
    observed_ttft_ns: int | None
    replayed_ttft_ns: int | None
    seq: int | None
    split_match: bool | None
    ttft_error_ns: int | None


def worst_pairs(con: duckdb.DuckDBPyConnection, observed_id: str, replayed_id: str, page_tokens: int,
                top: int) -> list[PairRow]:
    """The `top` pairs that agree least: split mismatches first, then by |TTFT error| (ties: trace order)."""
    return [PairRow(*r) for r in con.execute(_PAIRS + """
            SELECT req_id, input_tokens, od, oh, os, oc, rd, rh, rs, rc, ot, rt, seq, split_match, err FROM q
            ORDER BY split_match NULLS LAST, abs(err) DESC NULLS LAST, seq, req_id LIMIT $top""",
                                          {"a": observed_id, "b": replayed_id, "page": page_tokens,
                                           "top": int(top)}).fetchall()]


class TwinPair(NamedTuple):
    """A finished request of the observed run with a TTFT, and the twin's (None: not finished there)."""
    hit_class: str | None
    observed_ttft_ns: int
    twin_ttft_ns: int | None
    observed_rank: int | None
    twin_rank: int | None


def twin_pairs(con: duckdb.DuckDBPyConnection, observed_id: str, twin_id: str) -> list[tuple]:
    """Every such request, each a plain tuple in TwinPair's field order: one row per request of a
    possibly million-request run, where a named tuple each would cost more than the query."""
    return con.execute(
        "SELECT o.hit_class, o.ttft_ns, t.ttft_ns, o.dp_rank, t.dp_rank FROM requests o LEFT JOIN requests t "
        "ON t.run_id = ? AND t.req_id = o.req_id AND t.status = 'finished' AND t.ttft_ns IS NOT NULL "
        "WHERE o.run_id = ? AND o.status = 'finished' AND o.ttft_ns > 0", [twin_id, observed_id]).fetchall()


class CalibrationColumns(NamedTuple):
    """Per finished request with an arrival, a first token and its computed tokens, in
    first-token order (numpy arrays; a column the server did not report: masked)."""
    arrival_ns: object
    queue_ns: object
    prefill_ns: object
    first_token_ns: object
    finish_ns: object
    input_tokens: object
    output_tokens: object
    device_hit_tokens: object
    host_hit_tokens: object
    storage_hit_tokens: object
    computed_tokens: object
    dp_rank: object


def calibration_columns(con: duckdb.DuckDBPyConnection, run_id: str) -> CalibrationColumns:
    """What `calibrate --from-run` fits the cost model to (diagnose/twin/calibrate.py)."""
    return CalibrationColumns(**con.execute(
        "SELECT arrival_ns, queue_ns, prefill_ns, first_token_ns, finish_ns, input_tokens, output_tokens, "
        "device_hit_tokens, host_hit_tokens, storage_hit_tokens, computed_tokens, dp_rank FROM requests "
        "WHERE run_id = ? AND status = 'finished' AND arrival_ns IS NOT NULL AND first_token_ns IS NOT NULL "
        "AND computed_tokens IS NOT NULL ORDER BY first_token_ns, arrival_ns", [run_id]).fetchnumpy())
