"""The run-wide sums of the run's evidence in one query: what `summary`'s numbers, the run
context and the run totals each asked of the run's `requests` and `transfers` rows in a query of
their own (read/totals.py `request_totals`, `transfer_totals`; read/run_context.py
`finished_totals`, `own_parts`, `finished_token_totals`, `loadback_requests`,
`trace_arrival_spread_ns`, `named_ranks`, `loadback_transfers`, `loadback_count_bytes`, and
`miss_reason_sums`; read/queries.py `run_span_ns`), as one scan of each table.

Why: at a replay's close these were twelve queries on two threads, ~48 ms of CPU together on
the conversation trace (load ~12, one thread), where one does the same sums in ~31: each query's
own cost (binding, planning, the run's filter: ~1 ms) and, most of it, `request_totals`' 25
`FILTER (WHERE {finished})`s, the filter evaluated again for every aggregate and every row
(~0.3-0.7 ms an aggregate there). Here the finished rows are one subquery's `WHERE` (the filter
once a row), the counts and spans over every row another, the transfers a third (issue 41,
session 26). The same aggregates over the same rows, so each value is what its own query returns
(its type too); tests/diagnose/test_run_scan.py holds them equal on a replay's rows and on hostile
ones. The queries stay, for every reader but the close.

    run_scan(con, run_id, miss=)   -> RunScan: each query's result, typed as that query's
"""

from __future__ import annotations

from typing import NamedTuple

import duckdb

from tierdiag.diagnose.read.run_context import (FinishedTotals, LoadbackRequests, LoadbackTransfers, OwnParts,
                                                TokenTotals)
from tierdiag.diagnose.read.quantile import quantile_sql
from tierdiag.diagnose.read.sql import FINISHED_SQL, span_columns_sql
from tierdiag.diagnose.read.totals import TRANSFER_TOTALS_SQL, RequestTotals, TransferTotals
from tierdiag.diagnose.request.causes import excess_sql, routing_ns_sql


class RunScan(NamedTuple):
    """Each query's result, as that query returns it (see the module's docstring)."""

    totals: RequestTotals  # read/totals.py request_totals
    transfers: TransferTotals  # read/totals.py transfer_totals
    finished: FinishedTotals  # read/run_context.py finished_totals
    own: OwnParts  # own_parts
    tokens: TokenTotals  # finished_token_totals
    loadback: LoadbackRequests  # loadback_requests
    loadback_transfers: LoadbackTransfers  # loadback_transfers
    loadback_count_bytes: tuple[int, int]  # loadback_count_bytes
    arrival_spread_ns: int | None  # trace_arrival_spread_ns
    named_ranks: int  # named_ranks
    span_ns: tuple[int, int]  # read/queries.py run_span_ns(over="all")
    miss_sums: tuple | None  # miss_reason_sums (None: not asked, or the store has no miss reasons)


_TIERED = "host_hit_tokens + storage_hit_tokens > 0"
_HIT = "device_hit_tokens + host_hit_tokens + storage_hit_tokens > 0"
_A_START, _A_END = span_columns_sql("all")

# Over every row of the run: request_totals' count and span (its t0, t1: run_span_ns("all")'s
# too), trace_arrival_spread_ns, named_ranks.
_ALL_SQL = ", ".join([
    "count(*)", _A_START, _A_END,
    "max(coalesce(trace_arrival_ns, arrival_ns)) - min(coalesce(trace_arrival_ns, arrival_ns))",
    "count(DISTINCT dp_rank)"])

# Over the finished rows (`WHERE {FINISHED_SQL}`, once a row, not a FILTER an aggregate: ~0.3-0.7
# ms an aggregate on the conversation trace), in this order: request_totals' other columns (its
# t0, t1 from _ALL_SQL), finished_totals, own_parts, finished_token_totals, loadback_requests.
_FINISHED_SQL = ", ".join([
    # request_totals
    "count(*)", "sum(input_tokens)", "sum(device_hit_tokens)", "sum(host_hit_tokens)", "sum(storage_hit_tokens)",
    "sum(computed_tokens)", "sum(recomputed_tokens)", "sum(loadback_skipped_tokens)",
    f"count(*) FILTER (WHERE {_HIT})",
    f"{quantile_sql('device_hit_tokens + host_hit_tokens + storage_hit_tokens', 0.5)} FILTER (WHERE {_HIT})",
    f"count(*) FILTER (WHERE {_TIERED})", "sum(host_hit_tokens + storage_hit_tokens)",
    "sum(loadback_exposed_ns)", "sum(loadback_queued_ns)", "sum(storage_wait_ns)", "sum(queue_ns)",
    # recompute_rest_ns: sum(recompute_ns - routing) as sum(recompute_ns) - sum(routing), routing's
    # HUGEINT expression once a row, not twice (~1.3 ms): routing is 0 wherever recompute_ns is
    # NULL (it multiplies coalesce(recompute_ns, 0)) and never NULL itself, so both skip the same
    # rows and are NULL together.
    "sum(recompute_ns)", f"sum({routing_ns_sql()})", f"sum(recompute_ns) - sum({routing_ns_sql()})",
    "sum(compute_ns)",
    "sum(greatest(coalesce(compute_ns, 0) - coalesce(ideal_ttft_ns, 0), 0))", "sum(ttft_ns)", f"sum({excess_sql()})",
    # finished_totals (its span: the finished rows' own, span_columns_sql("finished"))
    "count(*)", "min(arrival_ns)", "coalesce(max(coalesce(finish_ns, first_token_ns)), max(arrival_ns))",
    "sum(ttft_ns)", "sum(queue_ns)", f"sum({excess_sql()})", "quantile_disc(ttft_ns, 0.5)",
    "quantile_disc(ttft_ns, 0.99)",
    # own_parts, finished_token_totals
    "sum(recompute_ns)", "sum(compute_ns)", "sum(loadback_exposed_ns)", "sum(decode_wait_ns)",
    "sum(input_tokens)", "sum(recomputed_tokens)",
    # loadback_requests
    f"coalesce(sum(loadback_ns) FILTER (WHERE {_TIERED}), 0)",
    f"coalesce(sum(recompute_instead_ns - ttft_if_device_resident_ns) FILTER (WHERE {_TIERED}), 0)",
    "coalesce(sum(loadback_exposed_ns), 0)", "coalesce(sum(ttft_ns), 0)",
    f"coalesce(sum(ttft_ns) FILTER (WHERE {_TIERED}), 0)"])

# transfer_totals, then loadback_transfers (its first two: loadback_count_bytes).
_TRANSFER_MORE_SQL = ", ".join([
    "count(*) FILTER (WHERE kind = 'load_back')", "coalesce(sum(bytes) FILTER (WHERE kind = 'load_back'), 0)",
    "coalesce(sum(t_end_ns - t_start_ns) FILTER (WHERE kind = 'load_back'), 0)",
    "coalesce(sum(pages) FILTER (WHERE kind = 'load_back'), 0)",
    "coalesce(sum(runs) FILTER (WHERE kind = 'load_back'), 0)"])


def run_scan(con: duckdb.DuckDBPyConnection, run_id: str, *, miss: bool = False) -> RunScan:
    """The run's sums (`RunScan`) in one query; `miss`: with the miss reasons' sums where the
    store has them (`miss_reason_sums`)."""
    from tierdiag.diagnose.read.rows import has_miss_columns
    from tierdiag.store.schema import MISS_COLUMNS

    with_miss = miss and has_miss_columns(con)
    miss_sql = (f", count({MISS_COLUMNS[0]})" + "".join(f", sum({c})" for c in MISS_COLUMNS) if with_miss else "")
    row = con.execute(
        f"""SELECT * FROM
                (SELECT {_ALL_SQL} FROM requests WHERE run_id = $r),
                (SELECT {_FINISHED_SQL}{miss_sql} FROM requests WHERE run_id = $r AND {FINISHED_SQL}),
                (SELECT {TRANSFER_TOTALS_SQL}, {_TRANSFER_MORE_SQL} FROM transfers WHERE run_id = $r)""",
        {"r": run_id}).fetchall()[0]
    return scan_of_row(row, with_miss)


def scan_of_row(row: tuple, with_miss: bool) -> RunScan:
    """The RunScan of `row`, the values of `run_scan`'s one statement in its order (with the miss
    reasons' sums where `with_miss`): also how the scan folded while recording is made
    (diagnose/run/scan_rows.py), so both are typed alike."""
    from tierdiag.store.schema import MISS_COLUMNS

    at = 0

    def take(n: int) -> tuple:
        nonlocal at
        at += n
        return row[at - n:at]

    n, start, end, spread, ranks = take(5)
    fin = take(len(RequestTotals._fields) - 3)
    totals = RequestTotals(n, *fin[:10], start, end, *fin[10:])
    finished = FinishedTotals(*take(len(FinishedTotals._fields)))
    own = OwnParts(*take(len(OwnParts._fields)))
    tokens = TokenTotals(*take(len(TokenTotals._fields)))
    loadback = LoadbackRequests(*take(len(LoadbackRequests._fields)))
    miss_sums = take(1 + len(MISS_COLUMNS)) if with_miss else None
    transfers = TransferTotals(*take(len(TransferTotals._fields)))
    lb = LoadbackTransfers(*take(len(LoadbackTransfers._fields)))
    if at != len(row):
        raise RuntimeError(f"the run's scan returned {len(row)} columns, {at} read")
    return RunScan(
        totals=totals, transfers=transfers, finished=finished, own=own, tokens=tokens, loadback=loadback,
        loadback_transfers=lb, loadback_count_bytes=(int(lb.transfers or 0), int(lb.bytes or 0)),
        arrival_spread_ns=None if spread is None else int(spread), named_ranks=int(ranks or 0),
        span_ns=(0, 0) if start is None else (int(start), max(int(end), int(start))), miss_sums=miss_sums)
