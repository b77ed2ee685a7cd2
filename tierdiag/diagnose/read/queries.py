"""The named queries over a run's rows: a caller asks for what it wants by name
(`queries.request(con, run, req_id)`, `queries.slowest(con, run, top=20)`) and gets typed rows
back, instead of writing the SQL at its own site.

Each query is filtered on the run's id first (every table's leading column), reads only the
columns its answer needs, and leaves the ranking, the filters and the limit to DuckDB, so
a million-request run answers in the time of its top rows, not of its rows.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import duckdb

from tierdiag.diagnose.request.causes import cause_sql, excess_sql, server_cause_sql
from tierdiag.diagnose.read.requests import SELECT_COLUMNS, RequestRow
from tierdiag.diagnose.read.sql import FINISHED_SQL, SpanOver, span_columns_sql
from tierdiag.store.evidence import TABLE as EVIDENCE_TABLE  # one row per closed replay (store/evidence.py writes it)


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any]) -> list[dict[str, Any]]:
    cur = con.execute(sql, params)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, values)) for values in cur.fetchall()]


def request(con: duckdb.DuckDBPyConnection, run, req_id: str) -> RequestRow:
    """One request's whole `requests` row; NotFoundError (with the closest ids) if it is not there."""
    from tierdiag.store.lookup import lookup_seq

    # By its seq where the run's request_lookup has it (the zone maps skip the rest of a big run),
    # else by comparing every id (issue 41).
    seq, found = lookup_seq(con, run.run_id, req_id), []
    if seq is not None:
        found = con.execute(f"SELECT {SELECT_COLUMNS} FROM requests WHERE run_id = ? AND seq = ? AND req_id = ?",
                            [run.run_id, seq, req_id]).fetchall()
    if not found:
        found = con.execute(f"SELECT {SELECT_COLUMNS} FROM requests WHERE run_id = ? AND req_id = ?",
                            [run.run_id, req_id]).fetchall()
    if found:
        return RequestRow.from_tuple(found[0])
    from tierdiag.errors import NotFoundError

    close = close_ids(con, run.run_id, req_id)
    hint = f"did you mean {', '.join(close)}?" if close else "list requests with `tierdiag slow`"
    raise NotFoundError(f"no request {req_id!r} in run {run.run_id} ({run.name})", hint=hint)


def close_ids(con: duckdb.DuckDBPyConnection, run_id: str, req_id: str) -> list[str]:
    """Up to three request ids of the run close to `req_id` (a typo, a case or whitespace slip)."""
    import difflib  # only on an error path: keep explain's start-up lean

    ids = [r[0] for r in con.execute("SELECT req_id FROM requests WHERE run_id = ?", [run_id]).fetchall()]
    close = difflib.get_close_matches(req_id, ids, n=3, cutoff=0.6)
    if not close:
        # Ids are often numbers (trace line numbers): a case or whitespace slip still matches.
        wanted = req_id.strip().lower()
        close = [i for i in ids if i.lower() == wanted][:3]
    return close


# The columns `slowest` reads: what SlowRequest shows and TtftParts splits (causes.py), the
# routing columns included (without them no routing part was split out of a request's recompute,
# and a request slow by routing showed a 0 ms cause in `slow`).
_SLOW_COLUMNS = ("req_id, seq, hit_class, arrival_ns, ttft_ns, ideal_ttft_ns, input_tokens, device_hit_tokens, "
                 "host_hit_tokens, storage_hit_tokens, computed_tokens, recomputed_tokens, loadback_skipped_reason, "
                 "queue_ns, storage_wait_ns, loadback_exposed_ns, recompute_ns, compute_ns, dp_rank, best_rank, "
                 "best_rank_device_tokens, best_rank_host_tokens, arrival_device_tokens, arrival_host_tokens, "
                 "storage_match_tokens")


def slowest(con: duckdb.DuckDBPyConnection, run, *, top: int, hit_class: str | None = None,
            cause: str | None = None, by_rank: bool = False,
            dp_rank: int | None = None) -> list[tuple[RequestRow, str]]:
    """(row, primary cause) of the `top` finished requests of a replay with the largest excess
    TTFT over their ideal (ties: trace order); a request at or under its ideal is not slow.
    `by_rank`: only rank `dp_rank`'s (None: no rank recorded). The rows hold the columns
    SlowRequest and TtftParts read, the rest None."""
    found = _rows(con, f"""
        SELECT * FROM (
            SELECT {_SLOW_COLUMNS}, {excess_sql()} AS _excess_ns, {cause_sql()} AS _primary_cause
            FROM requests
            WHERE run_id = ? AND {FINISHED_SQL}
        )
        WHERE _excess_ns > 0
          AND (CAST(? AS VARCHAR) IS NULL OR hit_class = ?)
          AND (CAST(? AS VARCHAR) IS NULL OR _primary_cause = ?)
          AND (NOT ? OR dp_rank IS NOT DISTINCT FROM CAST(? AS INTEGER))
        ORDER BY _excess_ns DESC, seq, req_id
        LIMIT ?
        """, [run.run_id, hit_class, hit_class, cause, cause, by_rank, dp_rank, top])
    out = []
    for r in found:
        primary = r.pop("_primary_cause")
        r.pop("_excess_ns")
        out.append((RequestRow(**r), primary))
    return out


def slowest_observed(con: duckdb.DuckDBPyConnection, run, *, top: int, hit_class: str | None = None,
                     cause: str | None = None) -> list[tuple[RequestRow, str | None]]:
    """(row, server cause) of the `top` finished requests of an imported run by their
    server-reported TTFT (no ideal is known there; ties: trace order)."""
    found = _rows(con, f"""
        SELECT * FROM (SELECT {SELECT_COLUMNS}, {server_cause_sql()} AS _server_cause FROM requests
                       WHERE run_id = ? AND status = 'finished' AND ttft_ns IS NOT NULL)
        WHERE (CAST(? AS VARCHAR) IS NULL OR hit_class = ?) AND (CAST(? AS VARCHAR) IS NULL OR _server_cause = ?)
        ORDER BY ttft_ns DESC, seq, req_id LIMIT ?""", [run.run_id, hit_class, hit_class, cause, cause, top])
    out = []
    for r in found:
        server = r.pop("_server_cause")
        out.append((RequestRow(**r), server))
    return out


def previous_turn(con: duckdb.DuckDBPyConnection, run, row: RequestRow) -> RequestRow | None:
    """The turn before `row` in its session (the latest of a lower seq), or None. The row holds
    req_id, status, finish_ns, input_tokens and output_tokens, the rest None."""
    found = _rows(con, "SELECT req_id, status, finish_ns, input_tokens, output_tokens FROM requests "
                       "WHERE run_id = ? AND session_id = ? AND seq < ? ORDER BY seq DESC LIMIT 1",
                  [run.run_id, row.session_id, row.seq])
    return RequestRow(**found[0]) if found else None


def span_ns(con: duckdb.DuckDBPyConnection, run, over: SpanOver = "all") -> tuple[int, int]:
    """(first arrival, last finish) of the run's `over` requests (sql.py), virtual ns; (0, 0) for none."""
    return run_span_ns(con, run.run_id, over)


def run_span_ns(con: duckdb.DuckDBPyConnection, run_id: str, over: SpanOver = "all") -> tuple[int, int]:
    """(first arrival, last finish) of the run's `over` requests, virtual ns; (0, 0) for none.
    The end is never before the start."""
    start, end = span_columns_sql(over)
    row = con.execute(f"SELECT {start}, {end} FROM requests WHERE run_id = ?", [run_id]).fetchall()[0]
    if row[0] is None:
        return 0, 0
    return int(row[0]), max(int(row[1]), int(row[0]))


def stored_evidence(con: duckdb.DuckDBPyConnection, run) -> tuple[int, str] | None:
    """(evidence_version, evidence_json) of the evidence stored with the run at its close
    (diagnose/run/stored.py is its format); None where the store has no such table or the run no
    single row."""
    try:
        found = con.execute(f"SELECT evidence_version, evidence_json FROM {EVIDENCE_TABLE} WHERE run_id = ?",
                            [run.run_id]).fetchall()
    except duckdb.CatalogException:
        return None
    return (found[0][0], found[0][1]) if len(found) == 1 else None


class StoreState(NamedTuple):
    """What a reader asks before it stores the evidence it computed (diagnose/run/backfill.py):
    the file `con` reads (None: in memory), whether `con` opened it read-only (a reader's; the
    writer's close reads through a read-write one), its schema version (None: not a number), and
    the run's status as stored (not RunInfo's effective one: a dead replay's `running` row reads
    `interrupted` there)."""
    path: str | None
    read_only: bool
    schema_version: int | None
    stored_status: str | None


def store_state(con: duckdb.DuckDBPyConnection, run_id: str) -> StoreState:
    """The StoreState of `con`'s store and run `run_id`."""
    path = con.execute("SELECT path, readonly FROM duckdb_databases() WHERE database_name = current_database()"
                       ).fetchall()
    version = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchall()
    status = con.execute("SELECT status FROM runs WHERE run_id = ?", [run_id]).fetchall()
    try:
        number = int(version[0][0]) if len(version) == 1 else None
    except (TypeError, ValueError):
        number = None
    return StoreState(path=path[0][0] if path and path[0][0] else None, read_only=bool(path and path[0][1]),
                      schema_version=number,
                      stored_status=status[0][0] if len(status) == 1 else None)


class OutcomeRow(NamedTuple):
    """What a request got in one run (diagnose/comparison/upgrade.py): its split (NULL as 0), its TTFT where
    it finished, its input."""
    run_id: str
    req_id: str
    device_hit_tokens: int
    host_hit_tokens: int
    storage_hit_tokens: int
    computed_tokens: int
    ttft_ns: int | None
    input_tokens: int


def outcome_rows(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str], req_id: str | None = None) -> list[tuple]:
    """Every request of `run_ids` (only `req_id` where given), by run, in request order; each a
    plain tuple in OutcomeRow's field order (a million-request run's rows: a named tuple each
    would cost more than the query)."""
    marks = ", ".join("?" * len(run_ids))
    extra = " AND req_id = ?" if req_id else ""
    return con.execute(
        "SELECT run_id, req_id, coalesce(device_hit_tokens, 0), coalesce(host_hit_tokens, 0), "
        "coalesce(storage_hit_tokens, 0), coalesce(computed_tokens, 0), "
        "CASE WHEN coalesce(status, 'finished') = 'finished' THEN ttft_ns END, coalesce(input_tokens, 0) "
        f"FROM requests WHERE run_id IN ({marks}){extra} ORDER BY run_id, seq NULLS LAST, req_id",
        [*run_ids, *([req_id] if req_id else [])]).fetchall()
