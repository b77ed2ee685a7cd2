"""What a request's prefix lost while it waited: after its arrival, before its schedule.

A queued request's prefix can move while it waits: other requests' allocations demote it to host,
drop it from device, or delete its host copy. Only a move that took it out of every tier costs a
recompute; a demotion device -> host does not (the tokens load back from host, write_through
keeps a host copy of every inserted prefix). So "lost while it waited" is::

    removed_while_waiting = tokens of its prefix taken by a `drop` (device, no host copy) or a
                            `delete` (host) eviction at t in [arrival, schedule]
                            (request_evictions joined with evictions)
    gone                  = its recomputed tokens that were in no tier at its schedule
                            (claims.recomputed_split's last part: not a skipped load-back, not an
                            unused storage match, not another rank's)
    lost_while_waiting    = min(removed_while_waiting, gone)     (a store before schema v5)
                          = miss_lost_while_queued_tokens         (schema v5: engine/miss.py, on
                            device or host at its arrival, in no tier at its schedule)

A request lost its prefix while it waited when `lost_while_waiting > 0`. An eviction at the very
instant of the schedule still counts: request_evictions only names evictions that took pages the
request came back for, found when it was matched, so they happened before the match.

The other moves of the wait (a demotion, a deletion of a page storage still held) are reported
beside it by the session step (`wait_moves`, over the request's evictions explain has read once),
never as a loss.
"""

from __future__ import annotations

import duckdb

from typing import TYPE_CHECKING

from tierdiag.diagnose.request.causes import routing_tokens_sql
from tierdiag.diagnose.read.rows import has_miss_columns

if TYPE_CHECKING:
    from tierdiag.diagnose.read.request_steps import EvictionRecord
    from tierdiag.diagnose.read.requests import RequestRow

# Eviction actions that take a page out of the last tier that held it (the storage tier aside:
# `gone` already leaves out what storage matched).
LEFT_EVERY_TIER = ("drop", "delete")


def gone_tokens_sql(alias: str = "") -> str:
    """SQL: a `requests` row's recomputed tokens that were in no tier (claims.recomputed_split's `lost`;
    the prefetch's loss, `miss_prefetch_lost_tokens`, is NULL in a run recorded before it)."""
    p = f"{alias}." if alias else ""
    rec = f"coalesce({p}recomputed_tokens, 0)"
    skipped = (f"(CASE WHEN {p}loadback_skipped_reason IS NOT NULL "
               f"THEN least(coalesce({p}loadback_skipped_tokens, 0), {rec}) ELSE 0 END)")
    read = f"least(greatest(coalesce({p}miss_prefetch_lost_tokens, 0), 0), {rec} - {skipped})"
    unused = (f"(CASE WHEN {p}storage_skipped_reason IS NOT NULL THEN least(greatest(coalesce({p}storage_match_tokens, 0)"
              f" - coalesce({p}storage_hit_tokens, 0) - {read}, 0), {rec} - {skipped} - {read}) ELSE 0 END)")
    routed = f"least({routing_tokens_sql(alias)}, {rec} - {skipped} - {read} - {unused})"
    return f"({rec} - {skipped} - {read} - {unused} - {routed})"


def waiting_removals_sql(run_param: str = "$r", req_param: str | None = None, *, seq_param: str | None = None) -> str:
    """SQL of a relation (req_id, removed): per request, the tokens of its prefix that a drop or
    delete eviction took at t in [arrival, schedule] (finished requests only: they have a schedule).
    `req_param`: only that request's (one request's question need not join the whole run's), and
    `seq_param` its trace order (found by the zone maps, not by every id)."""
    actions = ", ".join(f"'{a}'" for a in LEFT_EVERY_TIER)
    one = (f" AND re.req_id = {req_param}" if req_param else "") + (f" AND q.seq = {seq_param}" if seq_param else "")
    return f"""SELECT re.req_id, sum(re.tokens) AS removed
               FROM request_evictions re
               JOIN evictions e ON e.run_id = re.run_id AND e.eviction_id = re.eviction_id
               JOIN requests q ON q.run_id = re.run_id AND q.req_id = re.req_id
               WHERE re.run_id = {run_param}{one} AND e.action IN ({actions})
                 AND e.t_ns >= q.arrival_ns AND e.t_ns <= q.first_token_ns - coalesce(q.prefill_ns, 0)
               GROUP BY 1"""


def lost_while_waiting_sql(alias: str, removed: str, con: duckdb.DuckDBPyConnection | None = None) -> str:
    """SQL: the row's tokens lost while it waited. Where the store has the engine's miss reasons
    (schema v5), its `miss_lost_while_queued_tokens`: on device or host at its arrival, in no tier
    at its schedule (engine/miss.py), so summary, the session views and the miss reasons say one
    number. Else (an older store) `min(removed_while_waiting, gone)` from the eviction records,
    `removed` its removed tokens (may be NULL): that also counts a page cached anew during the wait
    and removed again, so it can only be larger."""
    fallback = f"least(coalesce({removed}, 0), greatest({gone_tokens_sql(alias)}, 0))"
    if con is not None and has_miss_columns(con):
        return f"coalesce({alias}.miss_lost_while_queued_tokens, {fallback})"
    return fallback


def lost_while_waiting(con: duckdb.DuckDBPyConnection, run_id: str, req_id: str, seq: int | None = None) -> int:
    """One request's tokens lost while it waited (module doc). `seq`: its trace order, where the
    caller has its row: the row is then found by it (the zone maps skip the rest of a big run)
    rather than by comparing every request's id."""
    one = " AND q.seq = $s" if seq is not None else ""
    row = next(iter(con.execute(
        f"""WITH w AS ({waiting_removals_sql('$r', '$q', seq_param='$s' if seq is not None else None)})
            SELECT {lost_while_waiting_sql('q', 'w.removed', con)} FROM requests q LEFT JOIN w ON w.req_id = q.req_id
            WHERE q.run_id = $r AND q.req_id = $q{one} AND q.first_token_ns IS NOT NULL""",
        {"r": run_id, "q": req_id, **({"s": int(seq)} if seq is not None else {})}).fetchall()), None)
    return int(row[0] or 0) if row else 0


def row_lost_while_waiting(con: duckdb.DuckDBPyConnection, run_id: str, row: RequestRow) -> int:
    """`lost_while_waiting` of a request whose whole row the caller has read (a finished one):
    its `miss_lost_while_queued_tokens` where the row holds one (the value the query's coalesce
    gives first: a store without the column reads it as None), else the query."""
    if row.miss_lost_while_queued_tokens is not None:
        return int(row.miss_lost_while_queued_tokens)
    return lost_while_waiting(con, run_id, str(row.req_id), row.seq)


def wait_moves(evictions: list[EvictionRecord], row: RequestRow) -> dict[tuple[str, str], int]:
    """(tier, action) -> tokens of its prefix each kind of eviction moved while it waited: of the
    request's evictions (request_steps.request_evictions, read once by explain), those at t in
    [arrival, first_token_ns - prefill_ns], their prefix tokens summed by kind (NULL as 0)."""
    from tierdiag.diagnose.read.request_steps import evictions_between  # explain's: `summary` reads this module

    if row.arrival_ns is None or row.first_token_ns is None:
        return {}
    moves: dict[tuple[str, str], int] = {}
    for e in evictions_between(evictions, int(row.arrival_ns), int(row.first_token_ns) - int(row.prefill_ns or 0)):
        moves[(e.tier, e.action)] = moves.get((e.tier, e.action), 0) + int(e.prefix_tokens or 0)
    return moves
