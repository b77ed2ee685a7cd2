"""How many tokens the pools must hold to keep a session's context across its pause: the
evidence of advice.py's `session` rule ("keep sessions alive for the p90 pause: host pool of N
tokens"), from the run's own rows.

The engine evicts least-recently-used first (the tree's LRU over unlocked leaves, device then
host). Under LRU a turn's context survives its pause exactly when the pool holds everything
touched since the context was last used, the context included: its LRU stack distance. For a
later turn that is

    own context      the predecessor's input + output, inserted when it finished
    + every other request that ran during the pause (its match or its insert falls between the
      predecessor's finish and this turn's schedule, or it held its pages locked across it):
      its input + output, a session counted once at its largest context (its turns are nested
      prefixes of one another, so a newer turn re-touches the older one's tokens)

    predecessor finish                       this turn scheduled (arrival + queue)
          |<------------------ pause + queue ------------------>|
     other requests:   [==== a ====]   [== b ==]      [=== c ===========]

The rows carry no page identities, so a prefix shared across sessions (a tool prompt) is told
by what each session's first turn found cached (someone else's prefix): each other session counts
its context less that, and the shared prefixes count once, the largest of them beyond the turn's
own. Eviction takes leaves first, so a context is eaten from its tail and part of it often
survives a pool smaller than its distance: the prediction counts a turn's prefix kept only when
all of it fits, and so errs low (on the synth agent workload of tests/diagnose/
test_session_advice.py: 12 % predicted at the run's pools where the run found 45 %). The p90 pause is over
turns (each turn's think_ms, not token-weighted): the pool that keeps every turn whose pause is at
most p90 is the largest stack distance among them. `kept_share(capacity)` predicts, with the same
distances, the share of the later turns' reused prefix an LRU pool of `capacity` tokens keeps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import duckdb

from tierdiag.diagnose.query import fetch_dicts
from tierdiag.diagnose.sql import finished_sql
from tierdiag.units import share

PAUSE_QUANTILE = 0.9
_REUSED = ("coalesce(device_hit_tokens, 0) + coalesce(host_hit_tokens, 0) + coalesce(storage_hit_tokens, 0) "
           "+ coalesce(recomputed_tokens, 0)")


@dataclass(frozen=True)
class SessionTurn:
    think_ms: float
    distance_tokens: int  # LRU stack distance of its context over the pause (module doc)
    reused_tokens: int  # device + host + storage hits + recomputed


@dataclass(frozen=True)
class SessionPauses:
    """The finished later turns (a predecessor in their session that finished) of a run."""

    num_turns: int
    input_tokens: int
    reused_tokens: int
    device_tokens: int  # of the reused prefix, where this run's match found it
    host_tokens: int
    storage_tokens: int
    recomputed_tokens: int
    pause_p90_ms: float
    pool_p90_tokens: int  # the largest stack distance among turns paused at most pause_p90_ms
    turns: tuple[SessionTurn, ...]

    @property
    def lost_tokens(self) -> int:
        """Reused prefix not found on device: recomputed or loaded back (host, storage)."""
        return self.recomputed_tokens + self.host_tokens + self.storage_tokens

    def kept_share(self, capacity_tokens: int) -> float | None:
        """Share of the later turns' reused prefix an LRU pool of `capacity_tokens` keeps."""
        kept = sum(t.reused_tokens for t in self.turns if t.distance_tokens <= capacity_tokens)
        return share(kept, self.reused_tokens)


def _nearest_rank(sorted_values: list[float], q: float) -> float:
    """quantile_disc's value: the smallest with at least q of the values at or below it."""
    return sorted_values[max(math.ceil(q * len(sorted_values)) - 1, 0)]


def session_pauses(con: duckdb.DuckDBPyConnection, run) -> SessionPauses | None:
    """The run's later session turns and their stack distances; None for a run without any."""
    rid = run.run_id
    rows = fetch_dicts(con, f"""
        WITH ordered AS (
            SELECT *, lag(req_id) OVER w AS prev_id, lag(status) OVER w AS prev_status,
                   lag(finish_ns) OVER w AS prev_finish_ns,
                   lag(coalesce(input_tokens, 0) + coalesce(output_tokens, 0)) OVER w AS prev_context
            FROM requests WHERE run_id = ? AND session_id IS NOT NULL
            WINDOW w AS (PARTITION BY session_id ORDER BY seq)),
        turns AS (
            SELECT seq, session_id, think_ms, prev_finish_ns AS pause_start_ns,
                   arrival_ns + coalesce(queue_ns, 0) AS match_ns, prev_context, input_tokens,
                   coalesce(device_hit_tokens, 0) AS device, coalesce(host_hit_tokens, 0) AS host,
                   coalesce(storage_hit_tokens, 0) AS storage, coalesce(recomputed_tokens, 0) AS recomputed
            FROM ordered
            WHERE think_ms IS NOT NULL AND prev_id IS NOT NULL AND coalesce(prev_status, 'finished') = 'finished'
              AND prev_finish_ns IS NOT NULL AND {finished_sql()}),
        firsts AS (  -- what a session's first turn found cached: a prefix shared with others
            SELECT coalesce(session_id, '#' || req_id) AS who, arg_min({_REUSED}, seq) AS shared
            FROM requests WHERE run_id = ? GROUP BY who),
        others AS (
            SELECT o.*, coalesce(o.session_id, '#' || o.req_id) AS who FROM requests o
            WHERE o.run_id = ? AND {finished_sql('o')} AND o.finish_ns IS NOT NULL),
        touched AS (  -- per turn, each other session (or sessionless request) once, at its largest
            SELECT t.seq, o.who, max(coalesce(o.input_tokens, 0) + coalesce(o.output_tokens, 0)) AS tokens
            FROM turns t JOIN others o
              ON o.arrival_ns <= t.match_ns AND o.finish_ns >= t.pause_start_ns
             AND o.session_id IS DISTINCT FROM t.session_id
            GROUP BY t.seq, o.who),
        spread AS (
            SELECT x.seq, sum(greatest(x.tokens - f.shared, 0)) AS own_tokens, max(f.shared) AS shared
            FROM touched x JOIN firsts f USING (who) GROUP BY x.seq)
        SELECT t.seq, t.think_ms, t.input_tokens, t.device, t.host, t.storage, t.recomputed,
               t.prev_context + coalesce(s.own_tokens, 0) + greatest(coalesce(s.shared, 0) - f.shared, 0) AS distance
        FROM turns t LEFT JOIN spread s USING (seq) JOIN firsts f ON f.who = t.session_id
        ORDER BY t.seq""", [rid, rid, rid])
    if not rows:
        return None
    turns = tuple(SessionTurn(float(r["think_ms"]), int(r["distance"]),
                              int(r["device"] + r["host"] + r["storage"] + r["recomputed"])) for r in rows)
    p90 = _nearest_rank(sorted(t.think_ms for t in turns), PAUSE_QUANTILE)
    return SessionPauses(
        num_turns=len(turns), input_tokens=sum(int(r["input_tokens"] or 0) for r in rows),
        reused_tokens=sum(t.reused_tokens for t in turns),
        device_tokens=sum(int(r["device"]) for r in rows), host_tokens=sum(int(r["host"]) for r in rows),
        storage_tokens=sum(int(r["storage"]) for r in rows),
        recomputed_tokens=sum(int(r["recomputed"]) for r in rows), pause_p90_ms=p90,
        pool_p90_tokens=max(t.distance_tokens for t in turns if t.think_ms <= p90), turns=turns)


__all__ = ["SessionPauses", "SessionTurn", "session_pauses", "PAUSE_QUANTILE"]
