"""The report's time series and distributions, read from one run (report/series.py draws them).

Each function is one question of the page; the aggregation (time bins, group-bys, quantiles,
the sample of a large run's scatter) happens in DuckDB, filtered on the run's id first, so a run
of a million requests costs the report no more memory than a small one. Column sets come back
as DuckDB's `fetchnumpy()` dict (column name -> array); single rows as named tuples.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import duckdb
import numpy as np

from tierdiag.diagnose.request.causes import cause_sql, excess_sql
from tierdiag.diagnose.read.quantile import quantile_sql
from tierdiag.diagnose.read.sql import FINISHED_SQL

Columns = dict[str, Any]  # fetchnumpy(): column name -> numpy array

# The same rows `summary` counts as finished (diagnose/read/sql.py: one definition every view uses).
FINISHED_WHERE = "run_id = $run AND " + FINISHED_SQL
_DECOMPOSED = FINISHED_WHERE + " AND compute_ns IS NOT NULL"  # observed runs have no split of TTFT

# Input tokens by where they came from; computed ones split into new and recomputed (cached once).
TOKEN_EXPR = {"device": "device_hit_tokens", "host": "host_hit_tokens", "storage": "storage_hit_tokens",
              "new": "computed_tokens - coalesce(recomputed_tokens, 0)",
              "recomputed": "coalesce(recomputed_tokens, 0)"}


def _p(run_id: str) -> dict[str, Any]:
    return {"run": run_id}


class ClassTokens(NamedTuple):
    hit_class: str
    device_tokens: int | None
    host_tokens: int | None
    storage_tokens: int | None
    new_tokens: int | None
    recomputed_tokens: int | None


def tokens_by_class(con: duckdb.DuckDBPyConnection, run_id: str) -> list[ClassTokens]:
    """The finished requests' input tokens by source, per hit class (sums; None: no value)."""
    rows = con.execute(
        f"""
        SELECT hit_class, sum(device_hit_tokens), sum(host_hit_tokens), sum(storage_hit_tokens),
               sum(computed_tokens - coalesce(recomputed_tokens, 0)), sum(coalesce(recomputed_tokens, 0))
        FROM requests WHERE {FINISHED_WHERE} GROUP BY hit_class
        """, _p(run_id)).fetchall()
    return [ClassTokens(*r) for r in rows]


def ttft_quantiles_by_class(con: duckdb.DuckDBPyConnection, run_id: str,
                            qs: tuple[float, ...]) -> dict[str, tuple]:
    """hit class ("all" for the run) -> the finished requests' TTFT at quantiles `qs` (nearest rank)."""
    q = ", ".join(quantile_sql("ttft_ns", x) for x in qs)
    rows = con.execute(
        f"""
        SELECT coalesce(hit_class, 'all') AS cls, {q}
        FROM requests WHERE {FINISHED_WHERE}
        GROUP BY GROUPING SETS ((hit_class), ())
        """, _p(run_id)).fetchall()
    return {r[0]: r[1:] for r in rows}


def last_event_ns(con: duckdb.DuckDBPyConnection, run_id: str) -> int | None:
    """The run's last recorded time: a pool sample, an arrival, a finish or a load-back's end."""
    (hi,) = con.execute(
        """
        SELECT max(t) FROM (
            SELECT t_ns AS t FROM pool_samples WHERE run_id = $run
            UNION ALL SELECT arrival_ns FROM requests WHERE run_id = $run
            UNION ALL SELECT finish_ns FROM requests WHERE run_id = $run
            UNION ALL SELECT t_end_ns FROM transfers WHERE run_id = $run AND kind = 'load_back')
        """, _p(run_id)).fetchall()[0]
    return hi


class TimeBins(NamedTuple):
    """`bins` bins of `width_ns` from `lo_ns`; the last bin is closed on the right."""

    lo_ns: int
    width_ns: float
    bins: int

    def params(self, run_id: str) -> dict[str, Any]:
        return {"run": run_id, "lo": self.lo_ns, "w": self.width_ns, "last": self.bins - 1}


# Bin any time column t_ns into TimeBins' buckets.
_BIN_OF = "least(CAST(floor((t_ns - $lo) / $w) AS BIGINT), $last)"


def pool_tiers(con: duckdb.DuckDBPyConnection, run_id: str) -> list[str]:
    """The tiers with pool samples, the device's before the host's."""
    return [r[0] for r in con.execute(
        "SELECT DISTINCT tier FROM pool_samples WHERE run_id = $run ORDER BY tier = 'host', tier",
        _p(run_id)).fetchall()]


def pool_sample_count(con: duckdb.DuckDBPyConnection, run_id: str, tier: str) -> tuple[int, int | None]:
    """(samples, capacity in tokens) of one tier's pool."""
    (count, cap), = con.execute(
        "SELECT count(*), max(capacity_tokens) FROM pool_samples WHERE run_id = $run AND tier = $tier",
        {"run": run_id, "tier": tier}).fetchall()
    return count, cap


def pool_samples(con: duckdb.DuckDBPyConnection, run_id: str, tier: str, bins: TimeBins | None) -> Columns:
    """One tier's occupancy (t, used, locked): every sample (`bins` None), or the max per time bin
    at the bin's centre."""
    if bins is not None:
        return con.execute(
            f"SELECT $lo + ({_BIN_OF} + 0.5) * $w AS t, max(used_tokens) AS used, max(locked_tokens) AS locked "
            f"FROM pool_samples WHERE run_id = $run AND tier = $tier GROUP BY {_BIN_OF} ORDER BY 1",
            {**bins.params(run_id), "tier": tier}).fetchnumpy()
    return con.execute(
        "SELECT t_ns AS t, used_tokens AS used, coalesce(locked_tokens, 0) AS locked "
        "FROM pool_samples WHERE run_id = $run AND tier = $tier ORDER BY t_ns",
        {"run": run_id, "tier": tier}).fetchnumpy()


def eviction_bins(con: duckdb.DuckDBPyConnection, run_id: str, bins: TimeBins) -> Columns:
    """Evictions per tier and time bin with any (tier, t bin centre, n events, tok, used: max pool)."""
    return con.execute(
        f"SELECT tier, $lo + ({_BIN_OF} + 0.5) * $w AS t, count(*) AS n, sum(tokens) AS tok, "
        f"max(pool_used_tokens) AS used FROM evictions WHERE run_id = $run GROUP BY ALL ORDER BY 1, 2",
        bins.params(run_id)).fetchnumpy()


def loadback_bytes_bins(con: duckdb.DuckDBPyConnection, run_id: str, bins: TimeBins) -> Columns:
    """Load-back bytes per time bin (b, total), every bin; a transfer counts where its midpoint falls."""
    return con.execute(
        f"""
        WITH lb AS (SELECT (t_start_ns + t_end_ns) // 2 AS t_ns, bytes FROM transfers
                    WHERE run_id = $run AND kind = 'load_back')
        SELECT b, coalesce(total, 0) AS total FROM range(0, $last + 1) r(b)
        LEFT JOIN (SELECT {_BIN_OF} AS bin, sum(bytes) AS total FROM lb GROUP BY ALL) ON bin = b
        ORDER BY b
        """, bins.params(run_id)).fetchnumpy()


def finished_count(con: duckdb.DuckDBPyConnection, run_id: str) -> int:
    return con.execute(f"SELECT count(*) FROM requests WHERE {FINISHED_WHERE}", _p(run_id)).fetchall()[0][0]


_POINT_COLS = (f"req_id, hit_class, ttft_ns, {excess_sql()} AS excess_ns, input_tokens, "
               f"device_hit_tokens, host_hit_tokens, storage_hit_tokens, computed_tokens, {cause_sql()} AS cause")


def request_points(con: duckdb.DuckDBPyConnection, run_id: str, *, sample: int | None = None,
                   keep_slowest: int = 0) -> Columns:
    """The finished requests' scatter columns (req_id, hit_class, ttft_ns, excess_ns, input_tokens,
    the hit tokens by tier, computed_tokens, cause), in trace order. `sample`: at most that many,
    the `keep_slowest` slowest by excess TTFT always, the rest an even sample by a hash of the id
    (same run, same sample), ordered by id."""
    p = _p(run_id)
    if sample is None:
        return con.execute(f"SELECT {_POINT_COLS} FROM requests WHERE {FINISHED_WHERE} ORDER BY seq", p).fetchnumpy()
    return con.execute(
        f"""
        WITH r AS (SELECT {_POINT_COLS} FROM requests WHERE {FINISHED_WHERE}),
             slow AS (SELECT req_id FROM r ORDER BY excess_ns DESC, req_id LIMIT {int(keep_slowest)})
        SELECT * FROM (SELECT * FROM r WHERE req_id IN (SELECT req_id FROM slow)
                       UNION ALL
                       (SELECT * FROM r WHERE req_id NOT IN (SELECT req_id FROM slow)
                        ORDER BY hash(req_id), req_id LIMIT {int(sample) - int(keep_slowest)}))
        ORDER BY req_id
        """, p).fetchnumpy()


class TransferQuantiles(NamedTuple):
    p50_ns: float | None
    p99_ns: float | None
    bw_p50_bytes_per_s: float | None


def loadback_transfers(con: duckdb.DuckDBPyConnection, run_id: str) -> Columns:
    """Every load-back transfer: dur (link time, ns), queued (ns), bytes."""
    return con.execute(
        "SELECT t_end_ns - t_start_ns AS dur, coalesce(queued_ns, 0) AS queued, bytes FROM transfers "
        "WHERE run_id = $run AND kind = 'load_back'", _p(run_id)).fetchnumpy()


def loadback_quantiles(con: duckdb.DuckDBPyConnection, run_id: str) -> TransferQuantiles:
    """The load-backs' link time p50/p99 and median achieved bandwidth (nearest rank; None: none)."""
    return TransferQuantiles(*con.execute(
        f"SELECT {quantile_sql('t_end_ns - t_start_ns', 0.5)}, {quantile_sql('t_end_ns - t_start_ns', 0.99)}, "
        f"{quantile_sql('bytes * 1e9 / (t_end_ns - t_start_ns)', 0.5)} FROM transfers "
        "WHERE run_id = $run AND kind = 'load_back' AND t_end_ns > t_start_ns", _p(run_id)).fetchall()[0])


def last_decomposed_arrival_ns(con: duckdb.DuckDBPyConnection, run_id: str) -> int | None:
    """The last arrival of a finished request with a TTFT split."""
    (hi,) = con.execute(f"SELECT max(arrival_ns) FROM requests WHERE {_DECOMPOSED}", _p(run_id)).fetchall()[0]
    return hi


def decomposition_bins(con: duckdb.DuckDBPyConnection, run_id: str, components: tuple[str, ...],
                       lo_ns: int, width_ns: float, bins: int) -> Columns:
    """Per arrival-time bin with requests (b, n, avg of each component, tok_<part> of TOKEN_EXPR,
    p50, p99 TTFT) over the finished requests with a TTFT split."""
    means = ", ".join(f"avg({c}) AS {c}" for c in components)
    tokens = ", ".join(f"sum({expr}) AS tok_{part}" for part, expr in TOKEN_EXPR.items())
    return con.execute(
        f"SELECT least(CAST(floor((arrival_ns - $lo) / $w) AS BIGINT), {int(bins) - 1}) AS b, count(*) AS n, "
        f"{means}, {tokens}, {quantile_sql('ttft_ns', 0.5)} AS p50, {quantile_sql('ttft_ns', 0.99)} AS p99 "
        f"FROM requests WHERE {_DECOMPOSED} GROUP BY b ORDER BY b",
        {"run": run_id, "lo": lo_ns, "w": width_ns}).fetchnumpy()


def component_means_by_class(con: duckdb.DuckDBPyConnection, run_id: str,
                             components: tuple[str, ...]) -> list[tuple]:
    """(hit_class, requests, mean of each component) over the finished requests with a TTFT split."""
    means = ", ".join(f"avg({c}) AS {c}" for c in components)
    return con.execute(
        f"SELECT hit_class, count(*), {means} FROM requests WHERE {_DECOMPOSED} GROUP BY ALL", _p(run_id)).fetchall()


def component_sums(con: duckdb.DuckDBPyConnection, run_id: str, components: tuple[str, ...]) -> tuple:
    """(sum of TTFT, sum of each component) over the finished requests with a TTFT split."""
    return con.execute(
        f"SELECT sum(ttft_ns), {', '.join(f'sum({c})' for c in components)} FROM requests WHERE {_DECOMPOSED}",
        _p(run_id)).fetchall()[0]


def has_column(con: duckdb.DuckDBPyConnection, table: str, column: str) -> bool:
    """Whether the store's `table` has `column` (an older store may lack a newer column)."""
    return bool(con.execute(
        "SELECT count(*) FROM information_schema.columns WHERE table_name = ? AND column_name = ?",
        [table, column]).fetchall()[0][0])


def _binned_overlaps(con: duckdb.DuckDBPyConnection, intervals_sql: str, p: dict,
                     kinds: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Σ over intervals [t0, t1) of weight x times the interval's overlap with each of the $n
    time bins [$lo + b·$w, $lo + (b+1)·$w), divided by $w, per kind k of interval.

    Without a range join: the overlap integral up to an edge e is Σ_{t0<e} x·(e - t0) -
    Σ_{t1<e} x·(e - t1), so each end point only needs its bin's count and sum, then running
    totals over the bins (O(n) in the intervals, however many bins each one spans). A point a
    rounding error away from an edge lands in the neighbouring bin with a weight of ~0."""
    n, w = p["n"], p["w"]
    rows = con.execute(
        f"""WITH iv AS ({intervals_sql}), ends AS (
                SELECT k, x, t0 - $lo AS t, 1 AS side FROM iv WHERE t1 > t0
                UNION ALL SELECT k, x, t1 - $lo, -1 FROM iv WHERE t1 > t0)
            SELECT k, least(greatest(CAST(floor(t / $w) AS BIGINT), 0), $n) AS b,
                   sum(side * x), sum(side * x * t::DOUBLE)
            FROM ends GROUP BY ALL""", p).fetchall()
    out = {}
    edges = np.arange(n + 1, dtype=float) * w  # e_k - lo
    for kind in kinds:
        wsum = np.zeros(n + 2)
        tsum = np.zeros(n + 2)
        for k, b, xs, ts in rows:
            if k == kind:
                wsum[b + 1] += float(xs or 0.0)
                tsum[b + 1] += float(ts or 0.0)
        # running totals of the ends strictly before edge k: bins 0..k-1
        before_w, before_t = np.cumsum(wsum)[:n + 1], np.cumsum(tsum)[:n + 1]
        integral = before_w * edges - before_t
        out[kind] = np.maximum(np.diff(integral) / w, 0.0)  # never below 0 but by rounding
    return out


def _overlap_params(run_id: str, lo_ns: int, width_ns: float, bins: int) -> dict[str, Any]:
    return {"run": run_id, "lo": lo_ns, "w": width_ns, "n": bins}


def request_phases(con: duckdb.DuckDBPyConnection, run_id: str, lo_ns: int, width_ns: float,
                   bins: int) -> dict[str, np.ndarray]:
    """Time-weighted means per bin of the finished requests' phases: "t" waiting (arrived, no
    prefill batch started), "w" their input tokens, "p" prefilling (batch started, no first
    token), "d" decoding (first token out, not finished)."""
    # first_token_ns - prefill_ns is the request's first batch's start.
    return _binned_overlaps(con, f"""
        WITH r AS (SELECT arrival_ns, first_token_ns - prefill_ns AS started, first_token_ns, finish_ns,
                          input_tokens FROM requests WHERE {FINISHED_WHERE} AND prefill_ns IS NOT NULL)
        SELECT 'w' AS k, arrival_ns AS t0, started AS t1, input_tokens::DOUBLE AS x FROM r
        UNION ALL SELECT 't', arrival_ns, started, 1.0 FROM r
        UNION ALL SELECT 'p', started, first_token_ns, 1.0 FROM r
        UNION ALL SELECT 'd', first_token_ns, finish_ns, 1.0 FROM r""",
        _overlap_params(run_id, lo_ns, width_ns, bins), ("w", "t", "p", "d"))


def batch_busy(con: duckdb.DuckDBPyConnection, run_id: str, lo_ns: int, width_ns: float, bins: int, *,
               recompute_recorded: bool) -> dict[str, np.ndarray]:
    """Share of each bin the GPU spent in prefill batches: "new" computing new tokens, "rec"
    recomputing once-cached ones (0 where the run did not record the split), "lb" stalled on
    load-backs the batch could not hide, "other" the rest of the batch."""
    recompute = "coalesce(recompute_ns, 0)" if recompute_recorded else "0"
    return _binned_overlaps(con, f"""
        WITH iv AS (SELECT t_start_ns AS t0, t_end_ns AS t1, (t_end_ns - t_start_ns)::DOUBLE AS dur,
                           compute_ns - {recompute} AS new_ns, {recompute} AS rec_ns,
                           coalesce(loadback_exposed_ns, 0) AS lb_ns
                    FROM batches WHERE run_id = $run AND t_end_ns > t_start_ns)
        SELECT 'new' AS k, t0, t1, new_ns / dur AS x FROM iv
        UNION ALL SELECT 'rec', t0, t1, rec_ns / dur FROM iv
        UNION ALL SELECT 'lb', t0, t1, lb_ns / dur FROM iv
        UNION ALL SELECT 'other', t0, t1, greatest(dur - new_ns - rec_ns - lb_ns, 0) / dur FROM iv""",
        _overlap_params(run_id, lo_ns, width_ns, bins), ("new", "rec", "lb", "other"))


def decode_busy(con: duckdb.DuckDBPyConnection, run_id: str, lo_ns: int, width_ns: float,
                bins: int) -> np.ndarray:
    """Share of each bin with at least one request decoding: the union of the decode intervals
    (first token -> finish), as islands of overlapping intervals, binned like the rest (no join)."""
    return _binned_overlaps(con, f"""
        WITH d AS (SELECT first_token_ns AS t0, finish_ns AS t1 FROM requests
                   WHERE {FINISHED_WHERE} AND finish_ns > first_token_ns),
             m AS (SELECT t0, t1, max(t1) OVER (ORDER BY t0, t1 ROWS BETWEEN UNBOUNDED PRECEDING
                                                 AND 1 PRECEDING) AS reach FROM d),
             g AS (SELECT t0, t1, sum(CASE WHEN reach IS NULL OR t0 > reach THEN 1 ELSE 0 END)
                                  OVER (ORDER BY t0, t1 ROWS UNBOUNDED PRECEDING) AS island FROM m)
        SELECT 'u' AS k, min(t0) AS t0, max(t1) AS t1, 1.0::DOUBLE AS x FROM g GROUP BY island""",
        _overlap_params(run_id, lo_ns, width_ns, bins), ("u",))["u"]


def batch_totals(con: duckdb.DuckDBPyConnection, run_id: str) -> tuple[int, int]:
    """(summed batch time in ns, batches) of the run."""
    busy, num = con.execute(
        "SELECT sum(t_end_ns - t_start_ns), count(*) FROM batches WHERE run_id = $run", _p(run_id)).fetchall()[0]
    return int(busy or 0), int(num or 0)
