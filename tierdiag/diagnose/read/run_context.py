"""The run context's queries (diagnose/run/runcontext.py, story.py, capacity.py, totals.py): the
run-wide sums and the per-batch and per-request columns the run's evidence is computed from.

Each is filtered on the run's id first and aggregates in DuckDB; the column sets that the
evidence integrates along the clock come back as numpy arrays (`fetchnumpy`), one NamedTuple
field per column, so a million-request run never becomes a million Python objects.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import duckdb

from tierdiag.diagnose.request.causes import CAUSES, cause_sql, excess_sql
from tierdiag.diagnose.read.rows import has_column, has_miss_columns
from tierdiag.diagnose.read.waiting import lost_while_waiting_sql, waiting_removals_sql
from tierdiag.diagnose.read.sql import FINISHED_SQL, finished_sql, span_columns_sql


def batch_recompute_sql(con: duckdb.DuckDBPyConnection) -> str | None:
    """`recompute_ns` of a batch, or None for stores written before batches recorded it."""
    return "recompute_ns" if has_column(con, "batches", "recompute_ns") else None


class BatchArrays(NamedTuple):
    """A run's batches in clock order (numpy arrays): recompute is at most compute, NULL as 0."""
    start_ns: Any
    end_ns: Any
    compute_ns: Any
    recompute_ns: Any
    loadback_exposed_ns: Any
    dp_rank: Any


def sorted_by(columns: dict, *keys: str) -> dict:
    """`columns` (name -> numpy array, one row per index) in the order of `keys` (the last the
    first key, as np.lexsort's), stable: rows of equal keys keep their order. The columns are
    reordered one at a time (each old one freed as its copy replaces it) and only where they are
    not in order already (a scan of a table written in that order, as the writer writes batches
    and requests). Here rather than an ORDER BY: DuckDB's sort of the columns held ~60-70 MB more
    than the arrays at 1M rows (issue 41)."""
    import numpy as np

    by = [columns[k] for k in keys]
    n = len(by[0]) if by else 0
    if n > 1:
        ordered = np.zeros(n - 1, dtype=bool)  # row i+1 after row i, by the keys from the first
        undecided = np.ones(n - 1, dtype=bool)
        for key in reversed(by):
            nxt, cur = key[1:], key[:-1]
            ordered |= undecided & (nxt > cur)
            undecided &= nxt == cur
        if not (ordered | undecided).all():
            order = np.lexsort(by)
            for k in columns:
                columns[k] = columns[k][order]
    return columns


def batch_arrays(con: duckdb.DuckDBPyConnection, run_id: str, rec: str) -> BatchArrays:
    """Every batch of the run ordered by (start, end); `rec` the batch recompute column (batch_recompute_sql)."""
    b = con.execute(
        f"""SELECT t_start_ns, t_end_ns, coalesce(compute_ns, 0),
                   least(coalesce({rec}, 0), coalesce(compute_ns, 0)), coalesce(loadback_exposed_ns, 0),
                   coalesce(dp_rank, 0)
            FROM batches WHERE run_id = $r""", {"r": run_id}).fetchnumpy()
    return BatchArrays(*sorted_by(b, "t_end_ns", "t_start_ns").values())


class WaitWindows(NamedTuple):
    """Per finished, scheduled request (numpy arrays): its wait window [start, first token] and rank."""
    start_ns: Any  # arrival + storage wait
    first_token_ns: Any
    dp_rank: Any


def wait_windows(con: duckdb.DuckDBPyConnection, run_id: str) -> WaitWindows:
    r = con.execute(
        f"""SELECT arrival_ns + coalesce(storage_wait_ns, 0), first_token_ns, coalesce(dp_rank, 0) FROM requests
            WHERE run_id = $r AND {FINISHED_SQL} AND prefill_ns IS NOT NULL""", {"r": run_id}).fetchnumpy()
    return WaitWindows(*r.values())


class OwnParts(NamedTuple):
    """Sums over the run's finished requests of their own TTFT parts (None: no row says)."""
    recompute_ns: int | None
    compute_ns: int | None
    loadback_exposed_ns: int | None
    decode_wait_ns: int | None


def own_parts(con: duckdb.DuckDBPyConnection, run_id: str) -> OwnParts:
    return OwnParts(*con.execute(
        f"SELECT sum(recompute_ns), sum(compute_ns), sum(loadback_exposed_ns), sum(decode_wait_ns) FROM requests "
        f"WHERE run_id = ? AND {FINISHED_SQL}", [run_id]).fetchall()[0])


class TokenTotals(NamedTuple):
    input_tokens: int | None
    recomputed_tokens: int | None  # None: no finished row says (unknown, not 0)


def finished_token_totals(con: duckdb.DuckDBPyConnection, run_id: str) -> TokenTotals:
    return TokenTotals(*con.execute(
        f"""SELECT sum(input_tokens), sum(recomputed_tokens) FROM requests WHERE run_id = ? AND {FINISHED_SQL}""",
        [run_id]).fetchall()[0])


def loadback_skipped_by_reason(con: duckdb.DuckDBPyConnection, run_id: str) -> list[tuple[str, int | None]]:
    """(reason, tokens) of the host load-backs skipped over the run's finished requests, by reason."""
    return con.execute(
        f"SELECT loadback_skipped_reason, sum(loadback_skipped_tokens) FROM requests WHERE run_id = ? "
        f"AND {FINISHED_SQL} AND loadback_skipped_reason IS NOT NULL GROUP BY 1 ORDER BY 1", [run_id]).fetchall()


def storage_unused_by_reason(con: duckdb.DuckDBPyConnection, run_id: str) -> list[tuple[str, int | None]]:
    """(reason, tokens) of storage matches not used (and recomputed) over the finished requests, by reason;
    not the part its prefetch read and host lost before scheduling (miss reason prefetch_lost, NULL
    before schema v7): that was read, whatever the reason for the rest."""
    return con.execute(
        f"SELECT storage_skipped_reason, sum(least(greatest(storage_match_tokens - storage_hit_tokens "
        f"- coalesce(miss_prefetch_lost_tokens, 0), 0), recomputed_tokens)) "
        f"FROM requests WHERE run_id = ? AND {FINISHED_SQL} AND storage_skipped_reason IS NOT NULL "
        f"GROUP BY 1 ORDER BY 1", [run_id]).fetchall()


class Allocations(NamedTuple):
    """The device pool's running allocation (numpy arrays): per schedule instant, the tokens
    allocated for the finished requests scheduled up to it."""
    sched_ns: Any
    cum_tokens: Any


def allocations(con: duckdb.DuckDBPyConnection, run_id: str) -> Allocations:
    alloc = con.execute(
        f"""SELECT sched, max(cum) FROM (
                SELECT first_token_ns - prefill_ns AS sched,
                       sum(input_tokens - coalesce(device_hit_tokens, 0) + output_tokens)
                           OVER (ORDER BY first_token_ns - prefill_ns, seq ROWS UNBOUNDED PRECEDING) AS cum
                FROM requests WHERE run_id = $r AND {FINISHED_SQL} AND prefill_ns IS NOT NULL)
            GROUP BY sched ORDER BY sched""", {"r": run_id}).fetchnumpy()
    return Allocations(alloc["sched"], alloc[next(k for k in alloc if k != "sched")])


class RemovedRereferences(NamedTuple):
    """Per re-reference of pages a removal (delete / drop) had taken, by a request that then
    recomputed (numpy arrays): its tokens scaled to what the request recomputed."""
    tokens: Any
    deleted: Any
    dropped: Any
    hits: Any
    no_t0: Any
    t0_ns: Any  # the pages' last use (0 where unknown: no_t0)
    t1_ns: Any  # when the request came back for them (its schedule)


def removed_rereferences(con: duckdb.DuckDBPyConnection, run_id: str) -> RemovedRereferences:
    raw = con.execute(
        """SELECT coalesce(re.tokens * least(1.0, greatest(q.recomputed_tokens
                      - CASE WHEN q.loadback_skipped_reason IS NULL THEN 0 ELSE q.loadback_skipped_tokens END
                      - CASE WHEN q.storage_skipped_reason IS NULL THEN 0
                             ELSE greatest(q.storage_match_tokens - q.storage_hit_tokens, 0) END, 0)
                      / sum(re.tokens) OVER (PARTITION BY re.req_id)), 0)::DOUBLE AS tokens,
                  e.action = 'delete' AS deleted, e.action = 'drop' AS dropped,
                  coalesce(e.node_hit_count, 0) AS hits, e.node_last_access_ns IS NULL AS no_t0,
                  coalesce(e.node_last_access_ns, 0) AS t0, q.first_token_ns - q.prefill_ns AS t1
           FROM request_evictions re
           JOIN evictions e ON e.run_id = re.run_id AND e.eviction_id = re.eviction_id
           JOIN requests q ON q.run_id = re.run_id AND q.req_id = re.req_id
           WHERE re.run_id = $r AND e.action IN ('delete', 'drop') AND q.prefill_ns IS NOT NULL
             AND q.recomputed_tokens > 0""", {"r": run_id}).fetchnumpy()
    return RemovedRereferences(*raw.values())


def lost_request_sizes(con: duckdb.DuckDBPyConnection, run_id: str):
    """Per finished request that recomputed (numpy array): its recomputed tokens neither skipped
    nor matched in storage (gone from every tier)."""
    return con.execute(
        f"""SELECT greatest(recomputed_tokens
                    - CASE WHEN loadback_skipped_reason IS NULL THEN 0 ELSE least(loadback_skipped_tokens, recomputed_tokens) END
                    - CASE WHEN storage_skipped_reason IS NULL THEN 0
                           ELSE greatest(storage_match_tokens - storage_hit_tokens, 0) END, 0) AS lost
            FROM requests WHERE run_id = ? AND {FINISHED_SQL} AND recomputed_tokens > 0""", [run_id]).fetchnumpy()["lost"]


def trace_arrival_spread_ns(con: duckdb.DuckDBPyConnection, run_id: str) -> int | None:
    """Last minus first trace arrival of the run's requests (the replayed arrival where none); None for none."""
    row = con.execute("SELECT max(coalesce(trace_arrival_ns, arrival_ns)) - min(coalesce(trace_arrival_ns, arrival_ns)) "
                      "FROM requests WHERE run_id = ?", [run_id]).fetchall()[0]
    return None if row[0] is None else int(row[0])


class LoadbackTransfers(NamedTuple):
    transfers: int | None
    bytes: int | None
    busy_ns: int | None
    pages: int | None
    runs: int | None


def loadback_transfers(con: duckdb.DuckDBPyConnection, run_id: str) -> LoadbackTransfers:
    """The run's load-back transfers summed (0 for none)."""
    return LoadbackTransfers(*con.execute(
        "SELECT count(*), coalesce(sum(bytes), 0), coalesce(sum(t_end_ns - t_start_ns), 0), coalesce(sum(pages), 0), "
        "coalesce(sum(runs), 0) FROM transfers WHERE run_id = ? AND kind = 'load_back'", [run_id]).fetchall()[0])


class LoadbackRequests(NamedTuple):
    """Sums over the finished requests (0 for none); `tiered` = those with a host or storage hit."""
    tiered_loadback_ns: int
    tiered_recompute_instead_extra_ns: int
    loadback_exposed_ns: int
    ttft_ns: int
    tiered_ttft_ns: int


def loadback_requests(con: duckdb.DuckDBPyConnection, run_id: str) -> LoadbackRequests:
    return LoadbackRequests(*con.execute(
        f"""SELECT coalesce(sum(loadback_ns) FILTER (WHERE host_hit_tokens + storage_hit_tokens > 0), 0),
                   coalesce(sum(recompute_instead_ns - ttft_if_device_resident_ns)
                            FILTER (WHERE host_hit_tokens + storage_hit_tokens > 0), 0),
                   coalesce(sum(loadback_exposed_ns), 0), coalesce(sum(ttft_ns), 0),
                   coalesce(sum(ttft_ns) FILTER (WHERE host_hit_tokens + storage_hit_tokens > 0), 0)
            FROM requests WHERE run_id = ? AND {FINISHED_SQL}""", [run_id]).fetchall()[0])


def named_ranks(con: duckdb.DuckDBPyConnection, run_id: str) -> int:
    """How many distinct data-parallel ranks the run's requests name."""
    return int(con.execute("SELECT count(DISTINCT dp_rank) FROM requests WHERE run_id=?", [run_id]).fetchall()[0][0] or 0)


class FinishedTotals(NamedTuple):
    """Over the run's finished requests: their count, span (the work done), sums and TTFT quantiles."""
    finished: int
    start_ns: int | None
    end_ns: int | None
    ttft_ns: int | None
    queue_ns: int | None
    excess_ns: int | None
    ttft_p50_ns: int | None
    ttft_p99_ns: int | None


def finished_totals(con: duckdb.DuckDBPyConnection, run_id: str) -> FinishedTotals:
    start, end = span_columns_sql("finished")  # the span of the work done: rejected requests did none
    return FinishedTotals(*con.execute(
        f"""SELECT count(*), {start}, {end},
                   sum(ttft_ns), sum(queue_ns), sum({excess_sql()}),
                   quantile_disc(ttft_ns, 0.5), quantile_disc(ttft_ns, 0.99)
            FROM requests WHERE run_id = ? AND {FINISHED_SQL}""", [run_id]).fetchall()[0])


class BatchTotals(NamedTuple):
    busy_ns: int
    compute_ns: int
    recompute_ns: int


def batch_totals(con: duckdb.DuckDBPyConnection, run_id: str, rec: str | None) -> BatchTotals:
    """The run's batches summed (0 for none; recompute 0 where the store has no batch recompute, `rec` None)."""
    return BatchTotals(*con.execute(
        f"SELECT coalesce(sum(t_end_ns - t_start_ns), 0), coalesce(sum(compute_ns), 0), "
        f"coalesce(sum({rec or '0'}), 0) FROM batches WHERE run_id = ?", [run_id]).fetchall()[0])


def miss_reason_sums(con: duckdb.DuckDBPyConnection, run_id: str) -> tuple | None:
    """(rows with reasons, then the tokens of each reason in MISS_COLUMNS' order) over the run's
    finished requests; None where the store has no miss reasons (written before them)."""
    from tierdiag.store.schema import MISS_COLUMNS

    if not has_miss_columns(con):
        return None
    sums = ", ".join(f"sum({c})" for c in MISS_COLUMNS)
    return con.execute(f"SELECT count({MISS_COLUMNS[0]}), {sums} FROM requests WHERE run_id = ? AND {FINISHED_SQL}",
                       [run_id]).fetchall()[0]


def decoding_span_arrays(con: duckdb.DuckDBPyConnection, run_id: str):
    """(rank, first token, finish) of every request of the run that decoded (finish after its
    first token), as int64 arrays: a million requests' spans without a million tuples (issue 41)."""
    import numpy as np

    got = con.execute("SELECT coalesce(dp_rank, 0) AS rank, first_token_ns AS a, finish_ns AS b FROM requests "
                      "WHERE run_id = ? AND first_token_ns IS NOT NULL AND finish_ns > first_token_ns",
                      [run_id]).fetchnumpy()
    return tuple(np.asarray(got[k], dtype=np.int64) for k in ("rank", "a", "b"))


def running_cap(con: duckdb.DuckDBPyConnection, run_id: str) -> tuple[int | None, bool]:
    """The run's `max_running_requests` (per scheduler: per rank) and whether it was given (not derived
    from the device pool), as its stored config records them; (None, False) where it is not (older runs, imports)."""
    import json
    row = next(iter(con.execute("SELECT config_json FROM runs WHERE run_id = ?", [run_id]).fetchall()), None)
    try:
        return running_cap_of(json.loads(row[0]) if row and row[0] else {})
    except ValueError:
        return None, False


def running_cap_of(config: Any) -> tuple[int | None, bool]:
    """`running_cap` of the run's config as parsed already (RunInfo.config: explain, ~1 ms less)."""
    cap = config.get("max_running_requests") if isinstance(config, dict) else None
    ok = isinstance(cap, int) and not isinstance(cap, bool) and cap >= 1
    return (cap, config.get("max_running_requests_given") is not None) if ok else (None, False)


def first_arrival_ns(con: duckdb.DuckDBPyConnection, run_id: str) -> int | None:
    return con.execute("SELECT min(arrival_ns) FROM requests WHERE run_id = ?", [run_id]).fetchall()[0][0]


class StoryRequests(NamedTuple):
    """Per finished request in trace order (numpy arrays) what the run story weighs: its wait
    window, queue, excess TTFT and primary cause, its own TTFT parts, what it lost while it waited."""
    arrival_ns: Any
    wait_start_ns: Any
    first_token_ns: Any
    queue_ns: Any
    excess_ns: Any
    cause: Any  # the primary cause as a code (int8): its index in causes.CAUSES, -1 for none (`cause_names`)
    own_recompute_ns: Any
    own_compute_ns: Any
    own_loadback_ns: Any
    own_decode_ns: Any
    lost_waiting_tokens: Any
    dp_rank: Any


def cause_code_sql(alias: str = "") -> str:
    """SQL: `cause_sql(alias)` as a TINYINT, its index in CAUSES (-1 where it is NULL): one byte a
    request, not a string (issue 41: a million Python strings in the 1M close's story)."""
    names = ", ".join(f"'{c}'" for c in CAUSES)  # (a `CASE cause WHEN ...` evaluates the cause once a WHEN)
    return f"(coalesce(list_position([{names}], {cause_sql(alias)}), 0) - 1)::TINYINT"


def cause_names(codes) -> list[str | None]:
    """The cause of each code `cause_code_sql` gives (None for -1)."""
    return [CAUSES[int(k)] if k >= 0 else None for k in codes]


# The story's per-request columns (`story_requests`), `lost` the SQL of what each request lost
# while it waited; over the table (or rows) aliased `q`. One text for the store's rows and for
# the rows a writer takes while recording (`taken_story_rows`): the same expressions, the same types.
def _story_columns_sql(lost: str) -> str:
    return f"""q.arrival_ns AS arrival_ns, q.arrival_ns + coalesce(q.storage_wait_ns, 0) AS wait_start,
               q.first_token_ns AS first_token_ns,
               coalesce(q.queue_ns, 0) AS queue, greatest({excess_sql('q')}, 0) AS excess,
               {cause_code_sql('q')} AS cause,
               coalesce(q.recompute_ns, 0) AS own_rec, coalesce(q.compute_ns, 0) AS own_comp,
               coalesce(q.loadback_exposed_ns, 0) AS own_lb, coalesce(q.decode_wait_ns, 0) AS own_decode,
               {lost} AS lost_waiting,
               coalesce(q.dp_rank, 0) AS rank, q.seq AS seq"""


# `lost` where every finished row carries the engine's own count (schema v5).
_LOST_OWN = "q.miss_lost_while_queued_tokens"


def story_requests(con: duckdb.DuckDBPyConnection, run_id: str) -> StoryRequests:
    """In trace order (`seq`), sorted here (`sorted_by`), not by DuckDB. The join of what left each
    request's prefix while it waited (read/waiting.py) is made only where a finished row lacks the
    engine's own count (`miss_lost_while_queued_tokens`, schema v5: then `coalesce` takes that count
    and never the join's, which held ~70 MB more at 1M requests)."""
    lost = lost_while_waiting_sql("q", "w.removed", con)
    join = f"LEFT JOIN ({waiting_removals_sql('$r')}) w ON w.req_id = q.req_id"
    if has_miss_columns(con) and not con.execute(
            f"SELECT count(*) FROM requests q WHERE q.run_id = $r AND {finished_sql('q')} "
            f"AND q.miss_lost_while_queued_tokens IS NULL", {"r": run_id}).fetchall()[0][0]:
        lost, join = _LOST_OWN, ""
    r = con.execute(
        f"""SELECT {_story_columns_sql(lost)}
            FROM requests q {join}
            WHERE q.run_id = $r AND {finished_sql('q')}""", {"r": run_id}).fetchnumpy()
    return story_requests_of(r)


def story_requests_of(columns: dict) -> StoryRequests:
    """StoryRequests of the story's columns (`_story_columns_sql`'s, by name, `seq` last), in any
    row order: sorted by seq here."""
    sorted_by(columns, "seq").pop("seq")
    return StoryRequests(*columns.values())


# Inputs past this magnitude are left to the SQL (`taken_story_rows` answers None): below it no
# sum, difference or x100 of them can leave int64, where DuckDB would raise and numpy wrap.
_NP_SAFE = 1 << 55


def taken_story_rows(columns: dict) -> dict | None:
    """The story's columns (`_story_columns_sql(_LOST_OWN)`'s names, values and types, unsorted)
    of the finished rows among `columns`, request rows as a writer took them (column -> Arrow
    array, the schema's types), computed here in numpy, not by DuckDB: the cause expression
    (causes.py `cause_sql`) costs DuckDB ~12 ms to plan whatever the rows, more than evaluating it
    over the whole conversation trace, so a query a batch of rows was ~16 ms of the writer's CPU
    (issue 41, session 24). `coalesce(x, 0)` is a NULL filled with 0; the cause is `cause_sql`'s
    CASE: 'none' where the excess x 100 is at most the ideal TTFT x NONE_TOLERANCE_PCT, else the
    first part (in `_PART_SQL`'s order) equal to the largest, routing's `recompute_ns x r //
    recomputed_tokens` exact. None (the caller queries the store instead) where a column is
    missing, a finished row has a NULL the story does not coalesce (its arrival, first token,
    seq, the engine's lost-while-queued count), or a value is negative where the SQL divides, or
    past _NP_SAFE: what the SQL would compute differently or refuse. Held equal to the SQL on
    hostile rows by tests/diagnose/test_story_rows.py."""
    import numpy as np

    from tierdiag.diagnose.request.causes import _PART_SQL, NONE_TOLERANCE_PCT
    from tierdiag.store.columns import arrow_ints, arrow_is, arrow_valid

    need = ("status", "ttft_ns", "arrival_ns", "storage_wait_ns", "first_token_ns", "queue_ns", "ideal_ttft_ns",
            "loadback_exposed_ns", "recompute_ns", "compute_ns", "decode_wait_ns", "miss_lost_while_queued_tokens",
            "dp_rank", "seq", "recomputed_tokens", "best_rank", "best_rank_device_tokens", "best_rank_host_tokens",
            "arrival_device_tokens", "arrival_host_tokens", "storage_match_tokens")
    if any(name not in columns for name in need):
        return None
    # The finished rows (status finished or NULL, with a TTFT), read from the columns' buffers
    # (store/columns.py: no pyarrow.compute in the writer process).
    done = arrow_is(columns["status"], "finished", null=True) & arrow_valid(columns["ttft_ns"])
    cols = [name for name in need if name != "status"]

    def ints(name: str, dtype=np.int64) -> np.ndarray:  # coalesce(name, 0)
        return arrow_ints(columns[name], 0)[done].astype(dtype)

    def present(name: str) -> np.ndarray:
        return arrow_valid(columns[name])[done]

    if not all(present(name).all() for name in ("arrival_ns", "first_token_ns", "seq", "miss_lost_while_queued_tokens")):
        return None
    v = {name: ints(name) for name in cols}
    if any(len(a) and int(np.abs(a).max()) >= _NP_SAFE for a in v.values()):
        return None
    ideal, rec_ns, rec_tok = v["ideal_ttft_ns"], v["recompute_ns"], v["recomputed_tokens"]
    gap = (v["best_rank_device_tokens"] + v["best_rank_host_tokens"] - v["arrival_device_tokens"]
           - v["arrival_host_tokens"] - v["storage_match_tokens"])
    routed = present("dp_rank") & present("best_rank") & (v["best_rank"] != v["dp_rank"])
    r = np.where(routed, np.minimum(rec_tok, np.maximum(gap, 0)), 0)  # causes.py routing_tokens_sql
    divided = rec_tok > 0
    if (divided & ((rec_ns < 0) | (r < 0))).any():
        return None  # the SQL's `//` of a negative: left to it
    if len(r) and int(np.abs(rec_ns).max()) * int(np.abs(r).max()) >= 1 << 62:
        return None
    routing = np.where(divided, (rec_ns * r) // np.where(divided, rec_tok, 1), 0)  # routing_ns_sql
    parts = {"queueing": v["queue_ns"], "load_back": v["loadback_exposed_ns"], "storage_fetch": v["storage_wait_ns"],
             "routing": routing, "recompute": rec_ns - routing,
             "compute": np.maximum(v["compute_ns"] - ideal, 0)}
    if list(parts) != [str(c) for c in _PART_SQL]:
        return None  # a cause added or reordered there and not here: the SQL decides
    biggest = np.maximum.reduce(list(parts.values()))
    code = np.full(len(biggest), -1, dtype=np.int8)
    for cause, part in reversed(list(parts.items())):  # the first equal to the largest wins
        code[part == biggest] = CAUSES.index(cause)
    excess = v["ttft_ns"] - ideal
    code[excess * 100 <= ideal * NONE_TOLERANCE_PCT] = CAUSES.index("none")
    return {"arrival_ns": v["arrival_ns"], "wait_start": v["arrival_ns"] + v["storage_wait_ns"],
            "first_token_ns": v["first_token_ns"], "queue": v["queue_ns"], "excess": np.maximum(excess, 0),
            "cause": code, "own_rec": rec_ns, "own_comp": v["compute_ns"], "own_lb": v["loadback_exposed_ns"],
            "own_decode": v["decode_wait_ns"], "lost_waiting": v["miss_lost_while_queued_tokens"],
            "rank": ints("dp_rank", np.int32), "seq": v["seq"]}


def story_rows_check(con: duckdb.DuckDBPyConnection, run_id: str) -> tuple[int, int]:
    """(finished rows, the sum of their seqs) of the run in the store: what rows folded while
    recording must have been (diagnose/run/story_rows.py)."""
    n, s = con.execute(f"SELECT count(*), coalesce(sum(q.seq), 0) FROM requests q "
                       f"WHERE q.run_id = $r AND {finished_sql('q')}", {"r": run_id}).fetchall()[0]
    return int(n), int(s)


class IdealArrivals(NamedTuple):
    """The finished requests with an ideal TTFT in arrival order (numpy arrays)."""
    arrival_ns: Any
    ideal_ttft_ns: Any


def ideal_arrivals(con: duckdb.DuckDBPyConnection, run_id: str) -> IdealArrivals:
    r = con.execute(
        f"SELECT arrival_ns, ideal_ttft_ns FROM requests WHERE run_id = ? AND {FINISHED_SQL} "
        f"AND ideal_ttft_ns IS NOT NULL ORDER BY arrival_ns", [run_id]).fetchnumpy()
    return IdealArrivals(r["arrival_ns"], r["ideal_ttft_ns"])


class DeviceEvictions(NamedTuple):
    evictions: int
    tokens: int
    rereferenced_tokens: int  # of those, tokens some request later came back for


def loadback_count_bytes(con: duckdb.DuckDBPyConnection, run_id: str) -> tuple[int, int]:
    """(load-back transfers, their bytes) of the run."""
    lb = con.execute("SELECT count(*), coalesce(sum(bytes), 0) FROM transfers WHERE run_id = ? AND kind = 'load_back'",
                     [run_id]).fetchall()[0]
    return int(lb[0] or 0), int(lb[1] or 0)


def device_evictions(con: duckdb.DuckDBPyConnection, run_id: str) -> DeviceEvictions:
    dev = con.execute(
        "SELECT count(*), coalesce(sum(tokens), 0), "
        "       coalesce(sum(tokens) FILTER (WHERE eviction_id IN "
        "           (SELECT eviction_id FROM request_evictions WHERE run_id = ?)), 0) "
        "FROM evictions WHERE run_id = ? AND tier = 'device'", [run_id, run_id]).fetchall()[0]
    return DeviceEvictions(int(dev[0] or 0), int(dev[1] or 0), int(dev[2] or 0))
