"""What the session views read of a run (diagnose/session/sessions.py: `summary`'s survival by pause and
explain's session step; diagnose/session/session_pool.py: the host pool the pauses need).

Grouping and windowing (turns by pause bucket, each turn's predecessor, the sessions a run
dropped) happen in DuckDB over the run's rows; the per-turn columns come back as DuckDB's
`fetchnumpy()` dict for session_pool's vectorised stack distances.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import duckdb

from tierdiag.diagnose.read.quantile import quantile_sql
from tierdiag.diagnose.read.sql import FINISHED_SQL, finished_sql
from tierdiag.diagnose.read.waiting import lost_while_waiting_sql, waiting_removals_sql

Columns = dict[str, Any]  # fetchnumpy(): column name -> numpy array

# What a turn found of an earlier context: hit on any tier, or recomputed (cached once).
_REUSED = ("coalesce(device_hit_tokens, 0) + coalesce(host_hit_tokens, 0) + coalesce(storage_hit_tokens, 0) "
           "+ coalesce(recomputed_tokens, 0)")


def session_count(con: duckdb.DuckDBPyConnection, run_id: str) -> int:
    """Distinct sessions of the run's requests (0: a trace without sessions)."""
    return int(con.execute("SELECT count(DISTINCT session_id) AS sessions FROM requests "
                           "WHERE run_id = ? AND session_id IS NOT NULL", [run_id]).fetchone()[0] or 0)


class PauseTotals(NamedTuple):
    bucket: int  # index into the bounds given
    turns: int
    device_tokens: int | None
    host_tokens: int | None
    storage_tokens: int | None
    recomputed_tokens: int | None
    queued_lost_tokens: int | None  # recomputed because they left every tier while the turn queued
    ttft_p50_ns: int | None
    ttft_p99_ns: int | None


def pause_totals(con: duckdb.DuckDBPyConnection, run_id: str,
                 upper_ms: tuple[float | None, ...]) -> dict[int, PauseTotals]:
    """Bucket -> the finished later turns (think_ms set) whose pause falls in it: bucket i holds
    pauses under upper_ms[i] and at or over the buckets before (None: no upper bound; the last
    bucket takes the rest). Buckets without turns are absent."""
    cases = " ".join(f"WHEN think_ms < {hi!r} THEN {i}" for i, hi in enumerate(upper_ms) if hi is not None)
    bucket = f"CASE {cases} ELSE {len(upper_ms) - 1} END"
    rows = con.execute(f"""
        WITH w AS ({waiting_removals_sql('?')})
        SELECT {bucket} AS bucket, count(*) AS n,
               sum(coalesce(device_hit_tokens, 0)) AS device, sum(coalesce(host_hit_tokens, 0)) AS host,
               sum(coalesce(storage_hit_tokens, 0)) AS storage, sum(coalesce(recomputed_tokens, 0)) AS recomputed,
               sum({lost_while_waiting_sql('q', 'w.removed', con)}) AS queued_lost,
               {quantile_sql('ttft_ns', 0.5)} AS p50, {quantile_sql('ttft_ns', 0.99)} AS p99
        FROM requests q LEFT JOIN w ON w.req_id = q.req_id
        WHERE q.run_id = ? AND think_ms IS NOT NULL AND {FINISHED_SQL}
        GROUP BY bucket""", [run_id, run_id]).fetchall()
    return {int(r[0]): PauseTotals(int(r[0]), *r[1:]) for r in rows}


class EndedSessionRow(NamedTuple):
    session_id: str
    turns_not_served: int  # its turns dropped after it ended
    first_seq: int  # the first dropped turn's
    req_id: str | None  # the last rejected turn before them: it ended the session
    reason: str | None  # that turn's reject reason


def ended_sessions(con: duckdb.DuckDBPyConnection, run_id: str, ended_reason: str) -> list[EndedSessionRow]:
    """The sessions whose later turns were dropped (reject reasons starting `ended_reason`), by
    their first dropped turn."""
    like = f"{ended_reason}%"
    return [EndedSessionRow(*r) for r in con.execute("""
        WITH dropped AS (
            SELECT session_id, count(*) AS n, min(seq) AS first_seq FROM requests
            WHERE run_id = ? AND status = 'rejected' AND reject_reason LIKE ?
            GROUP BY session_id),
        ends AS (  -- the last rejected turn before the first dropped one: it ended the session
            SELECT d.session_id, d.n, d.first_seq, arg_max(r.req_id, r.seq) AS req_id,
                   arg_max(r.reject_reason, r.seq) AS reason
            FROM dropped d LEFT JOIN requests r
              ON r.run_id = ? AND r.session_id = d.session_id AND r.seq < d.first_seq AND r.status = 'rejected'
                 AND r.reject_reason NOT LIKE ?
            GROUP BY d.session_id, d.n, d.first_seq)
        SELECT * FROM ends ORDER BY first_seq""", [run_id, like, run_id, like]).fetchall()]


class RequestEviction(NamedTuple):
    eviction_id: int
    t_ns: int  # virtual time of the eviction (not since the run's start)
    tier: str
    action: str
    tokens: int | None  # of the request's prefix
    cause_req_id: str | None  # whose allocation forced it


def request_evictions(con: duckdb.DuckDBPyConnection, run_id: str, req_id: str, start_ns: int,
                      end_ns: int) -> list[RequestEviction]:
    """The evictions that took `req_id`'s pages in [start_ns, end_ns], in time order."""
    return [RequestEviction(*r) for r in con.execute("""
        SELECT e.eviction_id, e.t_ns, e.tier, e.action, re.tokens, e.cause_req_id
        FROM request_evictions re JOIN evictions e ON e.run_id = re.run_id AND e.eviction_id = re.eviction_id
        WHERE re.run_id = ? AND re.req_id = ? AND e.t_ns >= ? AND e.t_ns <= ?
        ORDER BY e.t_ns, e.eviction_id""", [run_id, req_id, int(start_ns), int(end_ns)]).fetchall()]


# Who each request is (its session, or itself without one: "#" + its id), numbered in `who`
# order (who_id), with what the who's first request found cached (shared: a prefix shared with
# others); the CTEs `who` and `firsts`, over run `?`. The same numbering in every query it is in.
_OWNERS_CTE = f"""
    who AS (
        SELECT *, coalesce(session_id, '#' || req_id) AS who FROM requests WHERE run_id = ?),
    firsts AS (
        SELECT who, arg_min({_REUSED}, seq) AS shared, dense_rank() OVER (ORDER BY who) - 1 AS who_id
        FROM who GROUP BY who)"""


def later_turns(con: duckdb.DuckDBPyConnection, run_id: str) -> Columns:
    """The finished later turns whose predecessor finished, in trace order: seq, who_id (its
    session's, numbered as `finished_by_owner` numbers them), own_shared (what its session's
    first turn found cached), think_ms, pause_start_ns (the predecessor's finish), match_ns (its
    schedule), prev_context (the predecessor's input + output tokens), input, device, host,
    storage, recomputed (tokens). No strings: a million session ids as Python objects cost more
    than every other column together."""
    return con.execute(f"""
        WITH {_OWNERS_CTE},
        ordered AS (
            SELECT *, lag(req_id) OVER w AS prev_id, lag(status) OVER w AS prev_status,
                   lag(finish_ns) OVER w AS prev_finish_ns,
                   lag(coalesce(input_tokens, 0) + coalesce(output_tokens, 0)) OVER w AS prev_context
            FROM requests WHERE run_id = ? AND session_id IS NOT NULL
            WINDOW w AS (PARTITION BY session_id ORDER BY seq))
        SELECT o.seq, f.who_id, f.shared AS own_shared, o.think_ms, o.prev_finish_ns AS pause_start_ns,
               o.arrival_ns + coalesce(o.queue_ns, 0) AS match_ns, o.prev_context,
               coalesce(o.input_tokens, 0) AS input, coalesce(o.device_hit_tokens, 0) AS device,
               coalesce(o.host_hit_tokens, 0) AS host, coalesce(o.storage_hit_tokens, 0) AS storage,
               coalesce(o.recomputed_tokens, 0) AS recomputed
        FROM ordered o JOIN firsts f ON f.who = o.session_id
        WHERE o.think_ms IS NOT NULL AND o.prev_id IS NOT NULL AND coalesce(o.prev_status, 'finished') = 'finished'
          AND o.prev_finish_ns IS NOT NULL AND o.arrival_ns IS NOT NULL AND {finished_sql('o')}
        ORDER BY o.seq""", [run_id, run_id]).fetchnumpy()


def finished_by_owner(con: duckdb.DuckDBPyConnection, run_id: str) -> Columns:
    """Every finished request with its owner ("who": its session, or itself without one),
    numbered: who_id, shared (what the owner's first request found cached), has_session,
    arrival_ns, finish_ns, tokens (input + output)."""
    return con.execute(f"""
        WITH {_OWNERS_CTE}
        SELECT f.who_id, f.shared, (w.session_id IS NOT NULL) AS has_session, w.arrival_ns, w.finish_ns,
               coalesce(w.input_tokens, 0) + coalesce(w.output_tokens, 0) AS tokens
        FROM who w JOIN firsts f USING (who)
        WHERE {finished_sql('w')} AND w.finish_ns IS NOT NULL AND w.arrival_ns IS NOT NULL""",
                       [run_id]).fetchnumpy()
