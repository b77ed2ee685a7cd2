"""How many tokens the pools must hold to keep a session's context across its pause: the
evidence of the `session` advice rule (advice/rules/session.py: "keep sessions alive for the p90
pause: host pool of N tokens"), from the run's own rows.

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

Linear in the run: the requests that ran during a pause are those whose arrival falls in it (a
range of the arrivals, sorted) or that were in flight when it began (a range of the pauses,
sorted by start, for each request): two sorted searches, then a group-by over the (turn, other
session) pairs found, all vectorised (numpy). A long session costs its turns, not their square
(benchmarks/session_pauses.py). Where it is built, one native sweep over the turns by pause
start does the same with no pair stored (tierdiag/native/sessions; numpy's is its reference). The result is stored with the run evidence
when the run is closed (`sessions` section, evidence.py), so `summary` and `explain` read it.

`kept_curve` is the distance -> kept reused tokens step function, at most CURVE_POINTS steps:
exact where the turns have at most that many distinct distances, else the steps where the kept
tokens cross each 1/CURVE_POINTS of the reused prefix (and the last), so `kept_share` errs low
by less than 1/CURVE_POINTS of it plus one turn's prefix.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any

import duckdb

from tierdiag.diagnose.read import sessions as read
from tierdiag.units import share

PAUSE_QUANTILE = 0.9
CURVE_POINTS = 2048
# (turn, request ran during its pause) pairs the distances hold at once (_turns): ~180 bytes a
# pair over the arrays of one chunk (measured: 221 MB traced at 2M, 44 MB at 250k, on a 100k-request
# synth run), so ~45 MB at most beside the columns, whatever the run. Smaller chunks are no slower
# (the same run: 1.8 s at 250k, 5.3 s at 2M: the chunk's arrays stay in cache).
PAIR_BUDGET = 250_000
# (turn, who, tokens) are packed in one int64 for the pairs' sort where their bits (the turns',
# the whos', the tokens' span's) fit in this many (_largest_per_pair); a run past it takes the
# argsort, with the same result.
PACK_BITS = 63


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
    # (distance, reused tokens of the turns whose distance is at most it), ascending (module doc)
    kept_curve: tuple[tuple[int, int], ...]

    @property
    def lost_tokens(self) -> int:
        """Reused prefix not found on device: recomputed or loaded back (host, storage)."""
        return self.recomputed_tokens + self.host_tokens + self.storage_tokens

    def kept_share(self, capacity_tokens: int) -> float | None:
        """Share of the later turns' reused prefix an LRU pool of `capacity_tokens` keeps."""
        i = bisect_right([d for d, _ in self.kept_curve], capacity_tokens)
        return share(self.kept_curve[i - 1][1] if i else 0, self.reused_tokens)


def _nearest_rank(sorted_values: list[float], q: float) -> float:
    """quantile_disc's value: the smallest with at least q of the values at or below it."""
    return sorted_values[max(math.ceil(q * len(sorted_values)) - 1, 0)]


def session_pauses(con: duckdb.DuckDBPyConnection, run) -> SessionPauses | None:
    """The run's later session turns and their stack distances; None for a run without any."""
    import numpy as np

    turns = _turns(con, run)
    if turns is None:
        return None
    think, distance, reused = turns.think_ms, turns.distance, turns.reused
    p90 = float(_nearest_rank(np.sort(think), PAUSE_QUANTILE))
    return SessionPauses(
        num_turns=len(think), input_tokens=turns.sums["input"], reused_tokens=int(reused.sum()),
        device_tokens=turns.sums["device"], host_tokens=turns.sums["host"], storage_tokens=turns.sums["storage"],
        recomputed_tokens=turns.sums["recomputed"], pause_p90_ms=p90,
        pool_p90_tokens=int(distance[think <= p90].max()), kept_curve=_curve(distance, reused))


def session_turns(con: duckdb.DuckDBPyConnection, run) -> tuple[SessionTurn, ...]:
    """The run's finished later turns, each with its stack distance, in trace order."""
    turns = _turns(con, run)
    if turns is None:
        return ()
    return tuple(SessionTurn(float(k), int(d), int(r)) for k, d, r in
                 zip(turns.think_ms.tolist(), turns.distance.tolist(), turns.reused.tolist()))


def _curve(distance, reused) -> tuple[tuple[int, int], ...]:
    """The kept curve (module doc) of the turns' distances and reused tokens (int64 arrays)."""
    import numpy as np

    order = np.argsort(distance, kind="stable")
    d_sorted = distance[order]
    starts = np.flatnonzero(np.r_[True, d_sorted[1:] != d_sorted[:-1]])
    cum = np.cumsum(np.add.reduceat(reused[order], starts))  # kept tokens at each distinct distance
    dist = d_sorted[starts]
    if len(dist) > CURVE_POINTS:
        total = int(cum[-1])
        # The bucket each step's kept tokens reach; the curve keeps the first step of each bucket
        # and the last. Python ints where total * CURVE_POINTS could pass int64.
        if total < (2**63 - 1) // CURVE_POINTS:
            bucket = cum * CURVE_POINTS // total if total else np.zeros(len(cum), dtype=np.int64)
        else:
            bucket = np.array([c * CURVE_POINTS // total for c in cum.tolist()], dtype=object)
        keep = np.r_[True, bucket[1:] > bucket[:-1]]
        keep[-1] = True
        dist, cum = dist[keep], cum[keep]
    return tuple(zip(dist.tolist(), cum.tolist()))


@dataclass(frozen=True)
class _Turns:
    """The finished later turns, in trace order, as columns (int64 but think_ms)."""

    think_ms: Any
    distance: Any  # LRU stack distance of its context over the pause (module doc)
    reused: Any  # device + host + storage hits + recomputed
    sums: dict  # input, device, host, storage, recomputed: totals over the turns


def _turns(con: duckdb.DuckDBPyConnection, run) -> _Turns | None:
    import numpy as np

    rid = run.run_id
    t = read.later_turns(con, rid)
    if len(t["seq"]) == 0:
        return None
    # Every finished request with its who (its session, or itself when it has none), numbered,
    # and what each who's first request found cached (a prefix shared with others).
    o = read.finished_by_owner(con, rid)
    n = len(t["seq"])
    own = np.zeros(n, dtype=np.int64)
    shared_max = np.zeros(n, dtype=np.int64)
    if len(o["who_id"]):
        ps = np.asarray(t["pause_start_ns"], dtype=np.int64)
        m = np.asarray(t["match_ns"], dtype=np.int64)
        arr = np.asarray(o["arrival_ns"], dtype=np.int64)
        fin = np.asarray(o["finish_ns"], dtype=np.int64)
        who_id = np.asarray(o["who_id"], dtype=np.int64)
        o_shared = np.asarray(o["shared"], dtype=np.int64)
        o_tokens = np.asarray(o["tokens"], dtype=np.int64)
        # A request's own session (-1: none), and each turn's: a turn never counts its own session.
        o_session = np.where(np.asarray(o["has_session"], dtype=bool), who_id, -1)
        t_session = np.asarray(t["who_id"], dtype=np.int64)
        del o
        sh = np.zeros(int(who_id.max()) + 1, dtype=np.int64)
        sh[who_id] = o_shared
        _pairs(arr, fin, who_id, o_session, o_tokens, sh, ps, m, t_session, own, shared_max)
    own_shared = np.asarray(t["own_shared"], dtype=np.int64)
    distance = np.asarray(t["prev_context"], dtype=np.int64) + own + np.maximum(shared_max - own_shared, 0)
    reused = (np.asarray(t["device"], dtype=np.int64) + np.asarray(t["host"], dtype=np.int64)
              + np.asarray(t["storage"], dtype=np.int64) + np.asarray(t["recomputed"], dtype=np.int64))
    sums = {k: int(np.asarray(t[k], dtype=np.int64).sum()) for k in ("input", "device", "host", "storage", "recomputed")}
    return _Turns(np.asarray(t["think_ms"], dtype=np.float64), distance, reused, sums)


def _pairs(arr, fin, who_id, o_session, o_tokens, sh, ps, m, t_session, own, shared_max) -> None:
    """Per later turn (ps: its pause's start, m: its schedule, t_session: its session's number),
    over the finished requests (arrival, finish, who, own session or -1, tokens) that ran during
    its pause [ps, m] of another session: each other who once at its largest tokens, `own` the
    sum of that less what the who's first request found cached (`sh`, by who), `shared_max`
    the largest of those (both written; 0 where none). The native pass where it is built
    (tierdiag/native/sessions/sessions.c: one sweep, no pair stored; issue 41), else numpy's
    (_pairs_numpy, the reference): the same integers."""
    import numpy as np

    by_arrival = np.argsort(arr, kind="stable")
    by_start = np.argsort(ps, kind="stable")
    native = _native() if NATIVE and int(who_id.min()) >= 0 else None  # (numbers from 0: always, from SQL)
    if native is not None:
        c = [np.ascontiguousarray(x, dtype=np.int64) for x in (arr, fin, who_id, o_session, o_tokens, sh, ps, m,
                                                               t_session, by_arrival, by_start)]
        native.pauses(*c, own, shared_max)
        return
    _pairs_numpy(arr, fin, who_id, o_session, o_tokens, sh, ps, m, t_session, by_arrival, by_start, own, shared_max)


# The native pass, where built (setup.py; optional); False: numpy's (tests set it to run both).
NATIVE = True


def _native():
    try:
        from tierdiag.native import _sessions
    except ImportError:
        return None
    return _sessions


def _pairs_numpy(arr, fin, who_id, o_session, o_tokens, sh, ps, m, t_session, by_arrival, by_start,
                 own, shared_max) -> None:
    """_pairs in numpy (the native pass's reference), a chunk of turns' pairs at a time."""
    import numpy as np

    n = len(ps)
    width = len(sh)
    # Ran during the pause [ps, m]: arrived in it (a range of the sorted arrivals) ...
    a_sorted = arr[by_arrival]
    lo = np.searchsorted(a_sorted, ps, side="left")
    hi = np.searchsorted(a_sorted, m, side="right")
    # ... or arrived before it and was in flight when it began: arrival < ps <= finish, a
    # range of the pause starts, sorted, for each request.
    s_sorted = ps[by_start]
    lo2 = np.searchsorted(s_sorted, arr, side="right")
    hi2 = np.searchsorted(s_sorted, fin, side="right")
    # The (turn, request) pairs, a chunk of turns at a time (in pause-start order, each
    # chunk every pair of its turns: both ranges cut to it), at most PAIR_BUDGET pairs a
    # chunk but one turn's: a million turns in long overlapping pauses make 10^8 pairs,
    # 8 bytes each in a handful of arrays at once. Each turn is in one chunk, so the sums
    # are the whole join's.
    per_pos = np.maximum(hi - lo, 0)[by_start]
    inflight = np.zeros(n + 1, dtype=np.int64)
    np.add.at(inflight, lo2, 1)
    np.add.at(inflight, hi2, -1)
    per_pos += np.maximum(np.cumsum(inflight[:n]), 0)
    cum = np.cumsum(per_pos)
    # The requests whose in-flight range reaches a chunk: those carried from the chunks before
    # (their range goes on past them) and those whose range starts in it (in lo2 order), not
    # every request clipped to every chunk (~40 % of this at 1M requests, 286 chunks).
    by_lo2 = np.argsort(lo2, kind="stable")
    lo2_sorted = lo2[by_lo2]
    # (turn, who, tokens) packed in one int64 where they fit (_largest_per_pair).
    low = int(o_tokens.min())
    wbits, tbits = (width - 1).bit_length(), (int(o_tokens.max()) - low).bit_length()
    fits = int(who_id.min()) >= 0 and (n - 1).bit_length() + wbits + tbits <= PACK_BITS
    packed = (low, wbits, tbits) if fits else None
    # The ranges' pairs arrived in [ps, m] or arrived before ps and finished at or after it;
    # where every request finishes after it arrives and every turn is scheduled after its
    # pause starts, each such pair is in [ps, m] <= its span by that alone (a trace's open-loop
    # turns may arrive before their predecessor finished: then each pair is checked).
    in_order = _in_order(arr, fin, ps, m)
    carry = np.empty(0, dtype=np.int64)
    met = 0
    p = 0
    while p < n:
        q = max(int(np.searchsorted(cum, (cum[p - 1] if p else 0) + PAIR_BUDGET, side="right")), p + 1)
        turns_c = by_start[p:q]
        ti1, pos1 = _ranges(lo[turns_c], hi[turns_c])
        ti1 = turns_c[ti1]
        oj1 = by_arrival[pos1]
        upto = int(np.searchsorted(lo2_sorted, q, side="left"))
        reach = np.concatenate([carry, by_lo2[met:upto]])
        met = upto
        reach = reach[hi2[reach] > p]
        carry = reach[hi2[reach] > q]
        local, pos2 = _ranges(np.clip(lo2[reach], p, q), np.clip(hi2[reach], p, q))
        oj2 = reach[local]
        ti2 = by_start[pos2]
        ti = np.concatenate([ti1, ti2])
        oj = np.concatenate([oj1, oj2])
        del ti1, pos1, oj1, oj2, pos2, ti2, local, reach
        if in_order:  # every pair found ran during its turn's pause (above): only the session to check
            keep = o_session[oj] != t_session[ti]
        else:
            keep = (arr[oj] <= m[ti]) & (fin[oj] >= ps[ti]) & (o_session[oj] != t_session[ti])
        ti, oj = ti[keep], oj[keep]
        if len(ti):
            # Each (turn, other who) once, at its largest context.
            t_u, w_u, top = _largest_per_pair(ti, who_id[oj], o_tokens[oj], width, packed)
            # Summed per turn: t_u ascends, so each turn's run of pairs reduces at once
            # (np.add.at / np.maximum.at took ~10 % of this at 200k requests).
            sh_u = sh[w_u]
            runs = np.flatnonzero(np.r_[True, t_u[1:] != t_u[:-1]])
            turn = t_u[runs]
            own[turn] += np.add.reduceat(np.maximum(top - sh_u, 0), runs)
            shared_max[turn] = np.maximum(shared_max[turn], np.maximum.reduceat(sh_u, runs))
        p = q


def _in_order(arrival, finish, pause_start, match) -> bool:
    """Every request finishes at or after its arrival and every turn is matched at or after its
    pause starts (_pairs_numpy: the pairs then need no check of their spans)."""
    return bool((finish >= arrival).all() and (match >= pause_start).all())


def _largest_per_pair(ti, w, tok, width: int, packed: tuple[int, int, int] | None):
    """The distinct (turn, who) of the pairs (ti[i], w[i]) (0 <= who < width), each with the
    largest of its pairs' `tok`: (turns, whos, largest), by (turn, who) ascending. `packed`
    (lowest token, bits of a who, bits of a token less the lowest), where the turn's bits fit
    beside them in an int64: the three are packed in one int64 by shifts and sorted as one (no
    argsort, no gathers through it, no division: ~3x less of this section's time at 200k
    requests, issue 41); None: an argsort of the (turn, who) keys and a max over each group. The
    two give the same (tests/diagnose/test_session_pauses_linear.py)."""
    import numpy as np

    if packed is not None:
        low, wbits, tbits = packed
        both = np.sort((((ti << wbits) | w) << tbits) | (tok - low))
        key_s = both >> tbits
        starts = np.flatnonzero(np.r_[True, key_s[1:] != key_s[:-1]])
        ends = np.r_[starts[1:], len(both)] - 1  # a group's largest token sorts last
        top = (both[ends] & ((1 << tbits) - 1)) + low
        k_u = key_s[starts]
        return k_u >> wbits, k_u & ((1 << wbits) - 1), top
    key = ti * width + w
    order = np.argsort(key)  # any sort groups them: a group's max and key are the same in any order
    key_s, tok_s = key[order], tok[order]
    starts = np.flatnonzero(np.r_[True, key_s[1:] != key_s[:-1]])
    k_u = key_s[starts]
    return k_u // width, k_u % width, np.maximum.reduceat(tok_s, starts)


def _ranges(lo, hi):
    """For rows i with [lo[i], hi[i]) (empty where hi <= lo): (row index, position) of every member."""
    import numpy as np

    count = np.maximum(hi - lo, 0)
    rows = np.repeat(np.arange(len(lo), dtype=np.int64), count)
    offsets = np.arange(int(count.sum()), dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
    return rows, np.repeat(lo, count) + offsets


__all__ = ["SessionPauses", "SessionTurn", "session_pauses", "session_turns", "PAUSE_QUANTILE", "CURVE_POINTS"]
