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
def _reused_sql(alias: str = "") -> str:
    p = f"{alias}." if alias else ""
    return " + ".join(f"coalesce({p}{c}, 0)" for c in
                      ("device_hit_tokens", "host_hit_tokens", "storage_hit_tokens", "recomputed_tokens"))


_REUSED = _reused_sql()


def session_count(con: duckdb.DuckDBPyConnection, run_id: str) -> int:
    """Distinct sessions of the run's requests (0: a trace without sessions)."""
    return int(con.execute("SELECT count(DISTINCT session_id) AS sessions FROM requests "
                           "WHERE run_id = ? AND session_id IS NOT NULL", [run_id]).fetchall()[0][0] or 0)


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


# The run's sessions (run `$1`), numbered in session-id order (sid: 0 .. sessions - 1), with what
# each one's first turn found cached (shared: a prefix shared with others): the CTE `s`, the same
# numbering in every query it is in. A request without a session is its own owner, numbered
# sessions + seq (`finished_by_owner`). Numbers, not the strings of a million owners: the owners'
# query held ~450 MB of DuckDB's memory on a 1M-request run when every request's owner was a
# string ('#' + its id without a session) ranked and joined on, ~200 MB now.
_SESSIONS_CTE = f"""
    s AS (
        SELECT session_id, arg_min({_REUSED}, seq) AS shared, row_number() OVER (ORDER BY session_id) - 1 AS sid
        FROM requests WHERE run_id = $1 AND session_id IS NOT NULL GROUP BY session_id)"""


def later_turns(con: duckdb.DuckDBPyConnection, run_id: str) -> Columns:
    """The finished later turns whose predecessor finished, in trace order: seq, who_id (its
    session's number, as `finished_by_owner` numbers it), own_shared (what its session's first
    turn found cached), think_ms, pause_start_ns (the predecessor's finish), match_ns (its
    schedule), prev_context (the predecessor's input + output tokens), input, device, host,
    storage, recomputed (tokens). No strings: a million session ids as Python objects cost more
    than every other column together."""
    return con.execute(f"""
        WITH {_SESSIONS_CTE},
        ordered AS (  -- each session turn beside its predecessor's (lag), partitioned by number
            SELECT r.seq, r.think_ms, r.arrival_ns, r.queue_ns, r.status, r.ttft_ns, r.input_tokens,
                   r.device_hit_tokens, r.host_hit_tokens, r.storage_hit_tokens, r.recomputed_tokens,
                   s.sid, s.shared AS own_shared,
                   lag(r.req_id IS NOT NULL) OVER w AS has_prev,
                   lag(coalesce(r.status, 'finished') = 'finished') OVER w AS prev_finished,
                   lag(r.finish_ns) OVER w AS prev_finish_ns,
                   lag(coalesce(r.input_tokens, 0) + coalesce(r.output_tokens, 0)) OVER w AS prev_context
            FROM requests r JOIN s USING (session_id) WHERE r.run_id = $1
            WINDOW w AS (PARTITION BY s.sid ORDER BY r.seq))
        SELECT o.seq, o.sid AS who_id, o.own_shared, o.think_ms, o.prev_finish_ns AS pause_start_ns,
               o.arrival_ns + coalesce(o.queue_ns, 0) AS match_ns, o.prev_context,
               coalesce(o.input_tokens, 0) AS input, coalesce(o.device_hit_tokens, 0) AS device,
               coalesce(o.host_hit_tokens, 0) AS host, coalesce(o.storage_hit_tokens, 0) AS storage,
               coalesce(o.recomputed_tokens, 0) AS recomputed
        FROM ordered o
        WHERE o.think_ms IS NOT NULL AND o.has_prev AND o.prev_finished
          AND o.prev_finish_ns IS NOT NULL AND o.arrival_ns IS NOT NULL AND {finished_sql('o')}
        ORDER BY o.seq""", [run_id]).fetchnumpy()


def finished_by_owner(con: duckdb.DuckDBPyConnection, run_id: str) -> Columns:
    """Every finished request with its owner ("who": its session, or itself without one),
    numbered (who_id: its session's number, or sessions + its seq), shared (what the owner's first
    request found cached), has_session, arrival_ns, finish_ns, tokens (input + output)."""
    return con.execute(f"""
        WITH {_SESSIONS_CTE},
        n AS (SELECT count(*) AS sessions FROM s)
        SELECT coalesce(s.sid, n.sessions + w.seq) AS who_id, coalesce(s.shared, {_reused_sql('w')}) AS shared,
               (w.session_id IS NOT NULL) AS has_session, w.arrival_ns, w.finish_ns,
               coalesce(w.input_tokens, 0) + coalesce(w.output_tokens, 0) AS tokens
        FROM requests w LEFT JOIN s USING (session_id) CROSS JOIN n
        WHERE w.run_id = $1 AND {finished_sql('w')} AND w.finish_ns IS NOT NULL AND w.arrival_ns IS NOT NULL""",
                       [run_id]).fetchnumpy()
