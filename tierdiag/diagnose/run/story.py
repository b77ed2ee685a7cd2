"""The run's story told by its requests: every finished request's own verdict (its primary cause,
and for a queued one whether its queue was the cache's doing), weighted by its excess TTFT.

Why not run-wide averages: a run with hours of idle between bursts has a prefill GPU "8 % busy"
over its span while every request that waited did so behind a GPU busy all the time it waited.
The run's verdict has to be what its slow requests' verdicts say, so each number here is a sum
over requests of that request's own numbers (the ones `explain` gives it), weighted by the
excess TTFT it carries::

    request i:  excess_i = ttft_i - ideal_i,  cause_i = causes.cause_sql()  (explain's rule)
                busy_i   = prefill batch time in [max(arrival_i - CONTEXT_LOOKBACK, run start),
                           first token_i] / that window                     (explain's context)
                recompute_i = other requests' recompute in its wait window  (explain's attribution)
                cache_i  = claims.queue_is_the_caches_doing(recompute_i / queue_i, busy_i)
    run:        by verdict: sum of excess_i per (cause_i, cache_i)
                around the queued ones: sum(excess_i * busy_i) / sum(excess_i)  ...

The batch integrals run along the clock once (the same prefix-sum trick as runcontext's run
attribution): O((R + B) log B), no request x batch join. In a data-parallel run each request is
set against its own rank's batches (`dp_rank`): one rank's GPU is the one it waited for. Requests whose queue was split by
`explain` over exactly the same batches get the same share, up to the ns rounding of its parts.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from tierdiag.config.names import Cause
from tierdiag.diagnose.request.causes import CAUSES
from tierdiag.diagnose.request import running
from tierdiag.diagnose.request.context import ATTRIBUTION_KEYS, CONTEXT_LOOKBACK_NS, WaitPart
from tierdiag.diagnose.read import run_context as read_ctx
from tierdiag.diagnose.run.arrays import sorted_unique
from tierdiag.units import share

# The rule explain's verdict uses (claims.py): a queue is the cache's doing when recompute took
# at least this share of a request's wait (other requests' recompute), on a GPU at least BUSY_SHARE busy
# around it. Kept here (claims imports the run context, which imports this) and tested equal.
RECOMPUTE_QUEUE_SHARE = 0.2
BUSY_SHARE = 0.7
# The cap held a queue when, for at least this share of its wait, its rank ran max_running_requests
# requests (cap_wait): no prefill batch could be formed then, whatever the GPU's load.
CAP_SHARE = 0.5
# The wait's parts, as batches make them; the gaps between batches split, as explain splits them,
# into `decode` (the GPU ran decode steps: the engine's decode_wait_ns of the request), `memory_wait`
# (the rest of the time some request of its rank was decoding: its KV held the device memory the
# queue needed) and `idle` (the rest: held for a storage prefetch, or nothing to run; explain tells
# those two apart, the run's story does not).
WAIT_KEYS = tuple(k for k in ATTRIBUTION_KEYS if k != WaitPart.STORAGE_WAIT)


@dataclass(frozen=True)
class VerdictShare:
    """The requests with one verdict: how many, and the excess TTFT they carry."""

    cause: str  # causes.CAUSES
    caches_doing: bool  # queueing only: the requests' own attribution says the cache made the queue
    num_requests: int
    excess_ns: int
    excess_share: float | None  # of the run's excess

    @property
    def label(self) -> str:
        if self.cause != Cause.QUEUEING:
            return self.cause
        return "queueing (the cache's doing)" if self.caches_doing else "queueing (not the cache's doing)"


@dataclass(frozen=True)
class RunStory:
    """The run's verdict from its requests' verdicts (module doc). Shares of excess are of
    `excess_total_ns`, the sum of the finished requests' positive excess."""

    excess_total_ns: int
    verdicts: tuple[VerdictShare, ...]  # largest excess first
    # The requests whose verdict is queueing, excess-weighted:
    queued_excess_ns: int
    queued_busy_share: float | None  # prefill busy around them (explain's window)
    queued_wait_ns: int  # their queue time, summed
    queued_wait_parts_ns: dict  # WAIT_KEYS -> ns of their wait (others' batches, gaps as idle)
    caches_doing_excess_ns: int  # of queued_excess_ns: requests whose queue was the cache's doing
    # Requests whose prefix left every tier after they arrived, while they waited, and was
    # recomputed (read/waiting.py: their recompute is then the queue's doing, not only the
    # cache's size): how many, and their excess.
    evicted_while_waiting_requests: int
    evicted_while_waiting_excess_ns: int
    # The queued requests whose queue was NOT the cache's doing, on their own (the reason the run
    # gives for them is theirs, not diluted by the others): busy around them, excess-weighted,
    # and recompute's share of their wait.
    other_busy_share: float | None = None
    other_recompute_share: float | None = None
    # ... and their wait by WAIT_KEYS, summed (the largest part is named as their reason).
    other_wait_parts_ns: dict | None = None
    other_wait_ns: int = 0
    # The tokens those requests lost while they waited (of their prefix; read/waiting.py).
    evicted_while_waiting_tokens: int = 0
    # The run's max_running_requests (per rank; None: not recorded) and whether it was given, and
    # of the wait of the queued requests / of those not the cache's doing, the share (each its
    # own, weighted by its excess) during which `max_running` requests of its rank were running
    # (cap_wait): the cap held them, not the GPU.
    max_running: int | None = None
    max_running_given: bool = False
    queued_cap_share: float | None = None
    other_cap_share: float | None = None

    @property
    def top(self) -> VerdictShare | None:
        return self.verdicts[0] if self.verdicts else None

    def wait_share(self, key: str) -> float | None:
        return share(self.queued_wait_parts_ns.get(key, 0), self.queued_wait_ns)

    @property
    def caches_doing_share(self) -> float | None:
        """Of the excess queued requests carry, the share whose queue was the cache's doing."""
        return share(self.caches_doing_excess_ns, self.queued_excess_ns)


def _integral(s, e, values):
    """F(t) = sum over batches of value x (part of the batch before t) / duration: a window's
    sum is F(end) - F(start) (batches do not overlap: one prefill GPU). `locate(t)` finds each
    instant's batch once, `value(where, row)` is one row of F there: a row at a time, the
    temporaries are one request column each, not one a row (issue 41: the 1M close's story held
    ~970 MB at its peak, most of it these (5, requests) matrices)."""
    import numpy as np

    d = np.maximum(e - s, 1).astype(np.float64)
    full = (e - s) / d  # 1, or 0 for a batch of no duration
    cum = np.concatenate([np.zeros((values.shape[0], 1)), np.cumsum(values * full, axis=1)], axis=1)

    def locate(t):
        k = np.searchsorted(s, t, side="right") - 1
        kk = np.maximum(k, 0)
        return k < 0, kk, np.clip(np.minimum(t, e[kk]) - s[kk], 0, None) / d[kk]

    def value(where, row: int):
        before, kk, part = where
        out = cum[row, kk] + values[row, kk] * part
        out[before] = 0.0
        return out

    return locate, value


def _merge(intervals):
    """Sorted, merged [(a, b)] of the non-empty intervals."""
    out: list[list[int]] = []
    for a, b in sorted((int(a), int(b)) for a, b in intervals if b > a):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _minus(xs, ys):
    """The parts of merged intervals `xs` outside merged intervals `ys`."""
    out, j = [], 0
    for a, b in xs:
        cur = a
        while j < len(ys) and ys[j][1] <= cur:
            j += 1
        k = j
        while k < len(ys) and ys[k][0] < b:
            if ys[k][0] > cur:
                out.append((cur, ys[k][0]))
            cur = max(cur, ys[k][1])
            k += 1
        if cur < b:
            out.append((cur, b))
    return out


def _measure(intervals):
    """t -> the measure of the union of disjoint sorted `intervals` before t (vectorized)."""
    import numpy as np

    a = np.array([x for x, _ in intervals], dtype=np.int64)
    b = np.array([y for _, y in intervals], dtype=np.int64)
    return _measure_arrays(a, b)


def _merge_arrays(a, b):
    """`_merge` over arrays: (starts, ends) of the sorted, merged non-empty intervals [a, b)."""
    import numpy as np

    a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    keep = b > a
    a, b = a[keep], b[keep]
    if not len(a):
        return a, b
    order = np.lexsort((b, a))
    a, b = a[order], b[order]
    reach = np.maximum.accumulate(b)  # the furthest end so far
    first = np.r_[True, a[1:] > reach[:-1]]  # starts a new interval: past all before it (touching merges)
    last = np.r_[first[1:], True]
    return a[first], reach[last]


def _held_arrays(xa, xb, ya, yb):
    """`_minus` over arrays: the parts of the merged intervals (xa, xb) outside the merged
    (ya, yb), as (starts, ends), sorted and disjoint (touching pieces may stay apart: every
    measure of them is the same). Each piece between two consecutive boundaries of either set
    is kept where x covers it and y does not."""
    import numpy as np

    pts = sorted_unique(np.concatenate([xa, xb, ya, yb]))
    if len(pts) < 2:
        return pts[:0], pts[:0]
    lo, hi = pts[:-1], pts[1:]

    def covers(sa, sb):
        k = np.searchsorted(sa, lo, side="right") - 1  # the last interval starting at or before lo
        return (k >= 0) & (sb[np.maximum(k, 0)] > lo) if len(sa) else np.zeros(len(lo), dtype=bool)

    held = covers(xa, xb) & ~covers(ya, yb)
    return lo[held], hi[held]


def _measure_arrays(a, b):
    """`_measure` of disjoint sorted intervals given as (starts, ends) arrays."""
    import numpy as np

    if not len(a):
        return lambda t: np.zeros(len(t))
    cum = np.concatenate([[0], np.cumsum(b - a)])

    def at(t):
        t = np.asarray(t, dtype=np.int64)
        k = np.searchsorted(a, t, side="right")  # intervals starting at or before t
        kk = np.maximum(k - 1, 0)
        inside = np.where(k > 0, np.clip(np.minimum(t, b[kk]) - a[kk], 0, None), 0)
        return (cum[kk] + inside).astype(np.float64) * (k > 0)

    return at


def _memory_wait(con, rid: str, r_rank, w0, w1, b_rank, s, e, spans=None):
    """Per request: the GPU-idle time in [w0, w1] while some request of its rank was decoding
    (explain's memory_wait: the queue waited for the device memory their KV held).

    In arrays: as tuples of Python ints (`_merge`, `_minus`, kept as the reference,
    tests/diagnose/test_story_intervals.py) a million requests' spans and batches held ~1 GB
    of the close of a 1M-request replay (issue 41). The measures are integers either way."""

    def held(rank, a, b):
        theirs = b_rank == rank
        return _held_arrays(*_merge_arrays(a, b), *_merge_arrays(s[theirs], e[theirs]))

    return _per_rank_time(con, rid, r_rank, w0, w1, held, spans)


def _per_rank_time(con: duckdb.DuckDBPyConnection, rid: str, r_rank, w0, w1, held, spans=None):
    """Per request: the time in [w0, w1] inside `held(rank, starts, ends)` (sorted disjoint
    intervals, as arrays) of its rank's decoding spans (`spans`, read_ctx.decoding_span_arrays's:
    queried here where not given)."""
    import numpy as np

    out = np.zeros(len(w0))
    d_rank, d_a, d_b = read_ctx.decoding_span_arrays(con, rid) if spans is None else spans
    for rank in sorted_unique(d_rank).tolist():
        mine = r_rank == rank
        if not mine.any():
            continue
        spans = d_rank == rank
        at = _measure_arrays(*held(rank, d_a[spans], d_b[spans]))
        out[mine] = at(w1[mine]) - at(w0[mine])
    return out


def cap_wait(con: duckdb.DuckDBPyConnection, rid: str, r_rank, w0, w1, queue, cap: int | None, spans=None):
    """Per request: the time in its wait [w0, w1] while `cap` requests of its rank were running
    (SGLang's running batch: a request joins it at its first token and leaves at its finish;
    read_ctx.decoding_span_arrays), at most its queue_ns. While its rank runs `cap` requests
    `get_num_allocatable_reqs` is 0 and no prefill batch is formed (docs/engine.md "Running
    requests"): the cap, not the GPU, holds the queue. Zeros where the run records no cap."""
    import numpy as np

    if cap is None:
        return np.zeros(len(w0))
    out = _per_rank_time(con, rid, r_rank, w0, w1, lambda rank, a, b: running.at_cap_arrays(a, b, cap), spans)
    return np.minimum(out, np.maximum(np.asarray(queue, dtype=np.float64), 0.0))


def counts_by_cause(codes) -> dict[str, int]:
    """{cause: requests} of cause codes (read/run_context.py `cause_code_sql`: CAUSES' index, -1
    where the cause is NULL, which `requests_by_cause`'s GROUP BY keys as None and `summary`
    never reads): only the causes with requests, as that query's rows."""
    import numpy as np

    codes = np.asarray(codes, dtype=np.int64)
    n = np.bincount(codes[codes >= 0], minlength=len(CAUSES))
    return {CAUSES[k]: int(v) for k, v in enumerate(n.tolist()) if v}


def run_story(con: duckdb.DuckDBPyConnection, rid: str, rec: str | None, *,
              cause_counts: dict[str, int] | None = None, requests=None, batches=None) -> RunStory | None:
    """None for a store without per-batch recompute (`rec` None) or without batch rows.
    `cause_counts`, if given, is filled with the finished requests per primary cause (what
    read/totals.py `requests_by_cause` gives, its keys the causes with requests) from the cause
    codes the story's own query reads, once it has read them: the run's close hands them to the
    summary (numbers.py) instead of its running the same expression over the same rows again
    (issue 41). Left empty where the story reads no requests (`rec` None). `requests`: the
    run's read_ctx.story_requests when the caller has them (folded while the run was recorded:
    story_rows.py), else queried here. `batches`, if given, gives the run's read_ctx.batch_arrays
    (the close's: queried once for the story and the run context's attribution, issue 41)."""
    import numpy as np

    if rec is None:
        return None
    b = read_ctx.batch_arrays(con, rid, rec) if batches is None else batches()
    start = read_ctx.first_arrival_ns(con, rid)
    r = read_ctx.story_requests(con, rid) if requests is None else requests
    if cause_counts is not None:
        cause_counts.update(counts_by_cause(r.cause))
    if not len(b.start_ns) or not len(r.arrival_ns):
        return None
    # Each array is dropped once its last use is behind (`del`): at 1M requests and 1M batches a
    # column is 8 MB, and the memory wait's intervals come on top of what is still held (issue 41).
    s, e = (np.asarray(v, dtype=np.int64) for v in (b.start_ns, b.end_ns))
    comp, rc, lb = (np.asarray(v, dtype=np.float64) for v in (b.compute_ns, b.recompute_ns, b.loadback_exposed_ns))
    b_rank = np.asarray(b.dp_rank, dtype=np.int64)
    del b
    d = np.maximum(e - s, 1).astype(np.float64)
    values = np.stack([rc, comp - rc, lb, np.maximum(d - comp - lb, 0.0), d])  # ..., write-back, busy
    del comp, rc, lb, d
    arrival, w0, ft = (np.asarray(v, dtype=np.int64) for v in (r.arrival_ns, r.wait_start_ns, r.first_token_ns))
    queue, excess = (np.asarray(v, dtype=np.int64) for v in (r.queue_ns, r.excess_ns))
    cause = np.asarray(r.cause, dtype=np.int8)  # read_ctx.cause_code_sql: CAUSES' index, -1 for none
    own = [np.asarray(v, dtype=np.float64) for v in (r.own_recompute_ns, r.own_compute_ns, r.own_loadback_ns)]
    own_decode, lost_waiting = r.own_decode_ns, r.lost_waiting_tokens
    # Each request against its own GPU: in a data-parallel run, the batches of the rank that served
    # it (a rank's batches do not overlap; all ranks' do). One rank: every batch, as before.
    r_rank = np.asarray(r.dp_rank, dtype=np.int64)
    del r
    wend = np.maximum(ft, w0)
    c0 = np.maximum(arrival - CONTEXT_LOOKBACK_NS, int(start))  # its context window, explain's
    c1 = np.maximum(ft, c0)
    del arrival, ft
    # The wait's first four parts (recompute, compute, load-back, write-back; the busy row is the
    # context's, `around`), turned into `parts` in place below.
    work = np.zeros((4, len(w0)))
    around = np.zeros(len(w0))
    for rank in sorted_unique(r_rank):
        mine, theirs = r_rank == rank, b_rank == rank
        if not theirs.any():
            continue
        # One rank (most runs): every request and batch, not copies of them.
        every_batch, every_request = bool(theirs.all()), bool(mine.all())
        locate, value = (_integral(s, e, values) if every_batch else
                         _integral(s[theirs], e[theirs], values[:, theirs]))
        ours = (lambda x: x) if every_request else (lambda x: x[mine])
        # Its wait: what its GPU did in [wait start, first token] (less its own parts, below).
        hi, lo = locate(ours(wend)), locate(ours(w0))
        for row in range(4):
            if every_request:
                work[row] = value(hi, row) - value(lo, row)
            else:
                work[row, mine] = value(hi, row) - value(lo, row)
        del hi, lo
        around[mine] = value(locate(ours(c1)), 4) - value(locate(ours(c0)), 4)
        del locate, value, mine, theirs  # the integral's prefix sums
    del values
    busy = np.where(c1 > c0, around / np.maximum(c1 - c0, 1), 0.0)
    del c0, c1, around
    for row in range(3):
        work[row] -= own[row]
    del own
    parts = np.maximum(work, 0.0, out=work)
    gaps = np.maximum(queue - parts.sum(axis=0), 0.0)
    # Of the gaps, those while a request of its rank decoded: waiting for device memory. A request's
    # own decode comes after its first token, so never inside its own wait.
    # The decoding spans queried once for the memory wait and the cap's (issue 41, session 26:
    # ~1.5 ms of the close's CPU); where no cap is recorded the cap's wait reads none.
    cap, given = read_ctx.running_cap(con, rid)
    spans = read_ctx.decoding_span_arrays(con, rid) if cap is not None else None
    memory = np.minimum(_memory_wait(con, rid, r_rank, w0, wend, b_rank, s, e, spans), gaps)
    idle = gaps - memory
    # Of that, the GPU running decode steps (decode on the clock; context.queue_attribution's rule).
    decode = np.minimum(np.asarray(own_decode, dtype=np.float64), memory)
    memory = memory - decode
    rec_share = np.where(queue > 0, parts[0] / np.maximum(queue, 1), 0.0)
    capped = cap_wait(con, rid, r_rank, w0, wend, queue, cap, spans)
    del spans
    cap_share = np.where(queue > 0, capped / np.maximum(queue, 1), 0.0)
    cache = (queue > 0) & (rec_share >= RECOMPUTE_QUEUE_SHARE) & (busy >= BUSY_SHARE)
    total = int(excess.sum())
    verdicts = []
    queueing = CAUSES.index(Cause.QUEUEING)
    codes, first = np.unique(cause, return_index=True)  # (sorts)
    codes = codes[np.argsort(first)]  # the causes in the order they first appear, as before
    for k, c in zip(codes.tolist(), read_ctx.cause_names(codes)):
        for flag in ((True, False) if k == queueing else (False,)):
            m = (cause == k) & ((cache == flag) if k == queueing else True)
            if m.any():
                verdicts.append(VerdictShare(c, flag, int(m.sum()), int(excess[m].sum()),
                                             share(int(excess[m].sum()), total)))
    verdicts.sort(key=lambda v: (-v.excess_ns, v.label))
    q = cause == queueing
    qx = excess[q].astype(np.float64)
    wait_parts = dict(zip(WAIT_KEYS, (int(round(float(x))) for x in
                                      list(parts[:, q].sum(axis=1)) + [float(decode[q].sum()), float(memory[q].sum()),
                                                                       float(idle[q].sum())])))
    # Lost while it waited: tokens of its prefix that left every tier after it arrived, before it
    # was scheduled, and were recomputed (read/waiting.py; a demotion to host is no loss).
    lost_waiting = np.asarray(lost_waiting, dtype=np.int64)
    waited_out = lost_waiting > 0
    other = q & ~cache
    ox = excess[other].astype(np.float64)
    return RunStory(
        excess_total_ns=total, verdicts=tuple(verdicts), queued_excess_ns=int(qx.sum()),
        queued_busy_share=float((busy[q] * qx).sum() / qx.sum()) if qx.sum() > 0 else None,
        queued_wait_ns=int(queue[q].sum()), queued_wait_parts_ns=wait_parts,
        caches_doing_excess_ns=int(excess[q & cache].sum()),
        evicted_while_waiting_requests=int(waited_out.sum()),
        evicted_while_waiting_excess_ns=int(excess[waited_out].sum()),
        evicted_while_waiting_tokens=int(lost_waiting[waited_out].sum()),
        other_busy_share=float((busy[other] * ox).sum() / ox.sum()) if ox.sum() > 0 else None,
        other_recompute_share=share(float(parts[0, other].sum()), float(queue[other].sum())),
        other_wait_parts_ns=dict(zip(WAIT_KEYS, (int(round(float(x))) for x in
                                                 list(parts[:, other].sum(axis=1)) + [float(decode[other].sum()),
                                                                                      float(memory[other].sum()),
                                                                                      float(idle[other].sum())]))),
        other_wait_ns=int(queue[other].sum()),
        max_running=cap, max_running_given=given,
        queued_cap_share=float((cap_share[q] * qx).sum() / qx.sum()) if cap is not None and qx.sum() > 0 else None,
        other_cap_share=float((cap_share[other] * ox).sum() / ox.sum()) if cap is not None and ox.sum() > 0 else None)
