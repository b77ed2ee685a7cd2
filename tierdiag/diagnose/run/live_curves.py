"""The size curves' pass (size_curves.py) fed as the run's rows come, so that a replay's close,
which the replay waits for, finds it done (issue 41, probe overhead).

The pass is one walk over the run's page touches in event order: two events a finished request,
its schedule (arrival + queue) and its finish, ordered by (time, finish before schedule, seq)
(size_curves.py `_touches`). Its rows reach the store's writer process as the requests finish,
not in that order: a request still running was scheduled before the rows that come ahead of it.
So the events are walked up to a watermark, a time before which no event of a request not
recorded yet is expected to fall: every event of a request is at or after its arrival, and a request not
recorded yet arrives at

    its trace timestamp x time_scale       open loop (`arrivals = "trace"`), and in closed loop
                                           a session's first turn or a request without a session
    its predecessor's finish (+ think)     closed loop, a later turn whose predecessor finished
    never                                  closed loop: a later turn whose predecessor was rejected
                                           (dropped, no event), or is not recorded yet (then the
                                           predecessor's own bound is the earlier one)

(engine/arrivals.py). A request already scheduled and still running is the one these bounds
say little of: it arrived long before (on an overloaded replay, the conversation trace's, by half
an hour of its two hours: the arrival bound alone left half the events to the close). So once
WARM finished rows are in, the watermark is also no earlier than the latest finish recorded less
SLACK x the longest schedule -> finish seen: a request still queued is scheduled after the
latest finish, one running was scheduled within about its service time before it. That part is
a guess. The watermark is the least bound over the trace's requests not recorded yet; the events
before it are walked (`advance`). When the writer closes the run every row is there: the rest is
walked then. What the close uses is checked, not trusted: the events walked must be, in order,
the run's full event order computed from the committed rows, with the same times, ranks and
token counts (`verify`); anything else (a guess that was wrong: a request running longer than
SLACK x any seen before it, a row the writer did not commit) and the close walks the whole pass
itself (`whole_pass` over every row at once), as it does where no writer process recorded the
run. Both give the same depths (tests/diagnose/test_live_curves.py).

The keys are dense ids (`TraceIndex`: the trace's distinct page keys numbered once, while the run
is recorded; for an unsampled trace of plain hash_ids lines, numbered from its hash ids without
the keys being made: `block_ids`), so a key's previous touch is one array read (`new_stack`: compiled, or its Python
twin `StackPython`) instead of a sort of every touch at the close; a request's output pages are
touched once and never looked up again: id -1. A run over the touch budget (size_curves.py
MAX_TOUCHES) is fed so too, sampled: the index holds only the keys the sample keeps (at the rate
of the trace's touches, as if every request finished: the close uses the pass only where its own
rate is that one), `looks` of each request's looked up, and the output pages are numbered in
event order as the close's pass numbers them and touched where the sample keeps them.
"""

from __future__ import annotations

import numpy as np

from tierdiag.diagnose.read.curves import req_hashes
# The writer process's freed C heap handed back: the store's writer does too (its rows let go).
from tierdiag.store.duckdb_core import _TRIM, release_freed_heap  # noqa: F401 - _TRIM: looked up once

# --------------------------------------------------------------------------- the stack


class StackPython:
    """The reference of the compiled `_stackdist.Stack` (tierdiag/native/stackdist/stackdist.c says
    what it answers): an LRU stack of keys named by dense ids (0 .. ids - 1; -1: a key touched once
    only), fed groups as they come. The answers are size_curves `_flat_depths`' over everything fed so far, in
    one feed or many: a key's previous touch is `last[id]`, and the Fenwick tree over the
    positions doubles as they grow (the new top node holds every mark, the others none)."""

    def __init__(self, ids: int) -> None:
        if not isinstance(ids, int) or ids < 0:
            raise ValueError("Stack: ids must be >= 0")
        self.ids = ids
        self.last = [-1] * ids
        self.tree = [0] * (4096 + 1)
        self.touches = 0
        self.live = 0

    def feed(self, keys, query, sizes) -> list[int]:
        ks, q, sz = list(keys), list(query), list(sizes)
        if len(q) != len(ks):
            raise ValueError("feed: ids and sizes are int64, query one byte a key")
        if any(x < 0 for x in sz) or sum(sz) != len(ks):
            raise ValueError("feed: sizes must be >= 0 and add up to the ids")
        if any(k < -1 or k >= self.ids for k in ks):
            raise ValueError("feed: an id must be -1 or in [0, ids)")
        n0 = self.touches
        while len(self.tree) - 1 < n0 + len(ks):
            cap = len(self.tree) - 1
            self.tree.extend([0] * cap)
            self.tree[2 * cap] = self.live
        tree, cap, last = self.tree, len(self.tree) - 1, self.last
        out: list[int] = []
        at = 0
        for size in sz:
            a, b = at, at + size
            start = n0 + a
            prevs = []
            for t in range(a, b):
                p = -1
                if ks[t] >= 0:
                    p = last[ks[t]]
                    last[ks[t]] = n0 + t
                prevs.append(p)
                if not q[t]:
                    continue
                if p < 0:
                    out.append(-1)
                elif p >= start:
                    out.append(0)
                else:
                    below, i = 0, p
                    while i > 0:
                        below += tree[i]
                        i -= i & -i
                    out.append(self.live - below)
            for t, p in zip(range(a, b), prevs):
                if p >= 0:
                    i = p + 1
                    while i <= cap:
                        tree[i] -= 1
                        i += i & -i
                else:
                    self.live += 1
                i = n0 + t + 1
                while i <= cap:
                    tree[i] += 1
                    i += i & -i
            at = b
        self.touches = n0 + len(ks)
        return out


def _compiled(name: str):
    """`_stackdist`'s `name` (native/stackdist/stackdist.c), or None where the module is absent,
    was built before it had `name` (not rebuilt), or TIERDIAG_CPLANE is `numpy`: the caller's
    Python twin then."""
    import os

    if os.environ.get("TIERDIAG_CPLANE", "").strip().lower() == "numpy":
        return None
    try:
        from tierdiag.native import _stackdist
    except ImportError:
        return None
    return getattr(_stackdist, name, None)


def new_stack(ids: int):
    """An empty LRU stack of `ids` keys to `feed`: the compiled one where it is built (and
    TIERDIAG_CPLANE is not `numpy`), else its Python twin, `StackPython`."""
    made = _compiled("Stack")
    return StackPython(int(ids)) if made is None else made(int(ids))


def feed(stack, keys: np.ndarray, query: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The depths of the queried keys of groups fed to `stack` (`new_stack`), as int64."""
    import numpy as np

    keys = np.ascontiguousarray(keys, dtype=np.int64)
    query = np.ascontiguousarray(query, dtype=np.uint8)
    sizes = np.ascontiguousarray(sizes, dtype=np.int64)
    if isinstance(stack, StackPython):
        return np.array(stack.feed(keys.tolist(), query.tolist(), sizes.tolist()), dtype=np.int64)
    return np.frombuffer(stack.feed(keys, query, sizes), dtype=np.int64)


def walk(stack, rev_ids: np.ndarray, start, lens, looks, outs) -> np.ndarray:
    """`feed` of a walk's events, one group each: `outs` fresh output pages (id -1, touched once),
    then its request's keys `rev_ids[start:start + lens]` (deepest first), the last `looks` of
    them looked up (a schedule's; a finish looks up none). The compiled stack lays the groups out
    itself (stackdist.c `walk`: issue 41, the numpy layout a touch at a time was ~0.1 s of the
    conversation trace's pass); this numpy layout is its reference, and StackPython's way."""
    start, lens, looks, outs = (np.ascontiguousarray(a, dtype=np.int64) for a in (start, lens, looks, outs))
    if (not isinstance(stack, StackPython) and hasattr(stack, "walk") and rev_ids.dtype == np.int32
            and rev_ids.flags.c_contiguous):
        return np.frombuffer(stack.walk(rev_ids, start, lens, looks, outs), dtype=np.int64)
    if ((lens < 0).any() or (looks < 0).any() or (looks > lens).any() or (outs < 0).any() or (start < 0).any()
            or (start + lens > len(rev_ids)).any()):
        raise ValueError("walk: an event's keys must lie in the ids, 0 <= looks <= lens, outs >= 0")
    count = outs + lens
    first = np.cumsum(count) - count
    j = np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens)
    dest = np.repeat(first + outs, lens) + j
    tk = np.full(int(count.sum()), -1, dtype=np.int64)
    tk[dest] = rev_ids[np.repeat(start, lens) + j]
    tq = np.zeros(len(tk), dtype=bool)
    tq[dest] = j >= np.repeat(lens - looks, lens)
    return feed(stack, tk, tq, count)


# --------------------------------------------------------------------------- the pass

_NEVER = np.iinfo(np.int64).max
# The watermark's guess for a request still running (module doc): from WARM finished rows on, its
# schedule is taken to be no earlier than the latest finish less SLACK x the longest service seen.
# 2 was wrong on conversation[:2000] with a storage tier (a request served for 710 s where the
# longest before it was 238 s: the close walked it all); 4 held on the whole conversation trace,
# --dp 4, the storage run and an agent trace (rows handed 700 at a time), leaving the close 7-15 %
# of the events (benchmarks/README.md, h41close).
WARM = 64
SLACK = 4
# LivePass.tally's most entries (the deepest depth tallied + 1): 8 MB of counts; a deeper pass is
# tallied by the close from its depths, as before.
_TALLY_MOST = 1 << 21
# `LivePass._tally`'s count: numpy's `ufunc.at` has had a fast path for a plain array indexed by
# one integer array since 1.25 (before, ~10x slower than a sort of the depths).
_FAST_ADD_AT = np.lib.NumpyVersion(np.__version__) >= "1.25.0"
_ONE32 = np.int32(1)
# Events a walk of `LivePass.advance` takes at most (a pass fed while recording walks a few
# thousand at a time; the close's `whole_pass`, every event of the run).
_WALK_EVENTS = 1 << 16


class TraceIndex:
    """A trace's requests as the pass needs them, one position a request (its lines in seq order):
    `seq`, `off` and `lens` (its distinct page keys are `ids[off:off + lens]`, deepest first: each
    request's keys reversed), `n_ids` (distinct keys in the trace), and for the watermark the
    scaled arrival `arrival_ns` and `pred` (the position of its session's previous turn, -1)."""

    def __init__(self, seq, off, lens, rev_ids, n_ids: int, arrival_ns=None, pred=None):
        self.seq = np.asarray(seq, dtype=np.int64)
        self.off = np.asarray(off, dtype=np.int64)
        # A request's counts and positions int32 where they fit (`narrow`: issue 41, 4 bytes a
        # request each through a 1M-request run); times, offsets and hashes int64.
        self.lens = narrow(lens)
        self.n_ids = int(n_ids)
        # The keys' ids, each request's backwards: int32 where they fit (half of a sampled
        # 1M-request index's keys, issue 41), read as they are by the compiled `walk`.
        self.rev_ids = np.asarray(rev_ids, dtype=np.int32 if self.n_ids < 2**31 else np.int64)
        n = len(self.seq)
        self.arrival_ns = np.zeros(n, dtype=np.int64) if arrival_ns is None else np.asarray(arrival_ns, dtype=np.int64)
        self.pred = np.full(n, -1, dtype=np.int32) if pred is None else narrow(pred)
        self.line = self.req_hash = self.input_len = None  # `lines_are`: what the close checks the rows against
        # A sampled index (`sampled`): only the keys a sample keeps are here, `looks` of each
        # request's are looked up (its first ones, in trace order), `full_lens` its distinct pages
        # before sampling, `keep` the sample's rule (its output pages too), `touches` what its rate
        # was made from. Unsampled: every key, looks from the rows' input lengths.
        self.looks = None
        self.full_lens = self.lens
        self.keep = None
        self.rate = 1.0
        self.touches = None

    def let_keys_go(self) -> None:
        """The pass over the keys is walked (LivePass.let_walk_go): the keys, their offsets and what
        the watermark read let go; the lines' columns the close matches the rows by stay."""
        self.rev_ids = self.off = self.arrival_ns = self.pred = None

    def sampled(self, looks, full_lens, keep, rate: float, touches: int) -> "TraceIndex":
        """Mark this index a sample (size_curves.py `_sampler` at `rate`, made from `touches`)."""
        self.looks = narrow(looks)
        self.full_lens = narrow(full_lens)
        self.keep, self.rate, self.touches = keep, float(rate), int(touches)
        return self

    def lines_are(self, line, req_id, input_len, *, hashes=None) -> None:
        """Each request's line number, req_id and input length (size_curves.py `_matched`). The
        req_ids are kept as their hashes (`req_hashes`: this process's, where the close compares
        them), not a million strings held through the run (issue 41: ~65 MB at 1M requests);
        `hashes`: those hashes already made (req_id then unused)."""
        self.line = narrow(line)
        self.req_hash = req_hashes(req_id) if hashes is None else np.asarray(hashes, dtype=np.int64)
        self.input_len = narrow(input_len)

    @classmethod
    def of_keys(cls, seq, keys: list, arrival_ns=None, pred=None) -> "TraceIndex":
        """From each request's distinct page keys (int64 arrays, in trace order)."""
        lens = np.array([len(k) for k in keys], dtype=np.int64)
        off = np.zeros(len(keys), dtype=np.int64)
        np.cumsum(lens[:-1], out=off[1:])
        flat = np.concatenate(keys).astype(np.int64, copy=False) if keys else np.zeros(0, dtype=np.int64)
        return cls.of_flat(seq, flat, lens, arrival_ns, pred)

    @classmethod
    def of_flat(cls, seq, flat, lens, arrival_ns=None, pred=None, *, consume: bool = False) -> "TraceIndex":
        """From every request's keys laid end to end (`lens` of each), in trace order. `consume`:
        `flat` (int64, contiguous, the caller's to let go) is written over with the ids; else a
        copy is. The ids: `dense_ids` (each key's number in the order the keys first come)."""
        lens = np.asarray(lens, dtype=np.int64)
        off = np.zeros(len(lens), dtype=np.int64)
        np.cumsum(lens[:-1], out=off[1:])
        usable = (consume and isinstance(flat, np.ndarray) and flat.dtype == np.int64 and flat.flags.c_contiguous
                  and flat.flags.writeable)
        flat = flat if usable else np.array(flat, dtype=np.int64)  # written over with the ids, reversed in place
        n_ids = dense_ids(flat, lens)
        return cls(seq, off, lens, flat, n_ids, arrival_ns, pred)

    @classmethod
    def of_blocks(cls, seq, hids, blocks, lens, per_block: int, arrival_ns=None, pred=None) -> "TraceIndex":
        """From every request's hash ids (`blocks` of each, end to end, in trace order) and how
        many of its pages it has (`lens`), `per_block` pages a block: `block_ids`, the page keys
        never made; the same pass as `of_flat` of those pages' keys (other ids, the same answers)."""
        lens = np.asarray(lens, dtype=np.int64)
        off = np.zeros(len(lens), dtype=np.int64)
        np.cumsum(lens[:-1], out=off[1:])
        rev, n_ids = block_ids(hids, blocks, lens, per_block)
        return cls(seq, off, lens, rev, n_ids, arrival_ns, pred)


def _dense_ids_numpy(flat: np.ndarray, lens: np.ndarray) -> int:
    """The reference of the compiled `dense_ids` (stackdist.c says what it writes): each key
    written over with its number in the order the distinct keys first come, then each request's
    ids reversed; returns how many distinct keys. By a stable sort (the first of equal keys is
    their first), not a dict: numpy's speed where the module is absent."""
    n = len(flat)
    lens = np.asarray(lens, dtype=np.int64)
    if (lens < 0).any() or int(lens.sum()) != n:
        raise ValueError("dense_ids: keys and lens are int64, lens >= 0 adding up to the keys")
    if n == 0:
        return 0
    order = np.argsort(flat, kind="stable")
    ordered = flat[order]
    new = np.r_[True, ordered[1:] != ordered[:-1]]
    group = np.cumsum(new) - 1  # each sorted key's distinct key, by value
    first = order[new]  # each distinct key's first place
    number = np.empty(len(first), dtype=np.int64)
    number[np.argsort(first, kind="stable")] = np.arange(len(first), dtype=np.int64)
    flat[order] = number[group]
    del order, ordered, new, group
    off = np.cumsum(lens) - lens
    flat[:] = flat[np.repeat(2 * off + lens - 1, lens) - np.arange(n, dtype=np.int64)]  # each request's backwards
    return len(first)


def dense_ids(flat: np.ndarray, lens: np.ndarray) -> int:
    """Every key of `flat` (int64, writable, contiguous: the requests' keys end to end, `lens` of
    each) written over with its dense id, each request's ids reversed (deepest first); returns how
    many distinct keys. Compiled (stackdist.c: one pass of a hash table, issue 41), or
    `_dense_ids_numpy` where the module is absent or TIERDIAG_CPLANE is `numpy`."""
    made = _compiled("dense_ids")
    if made is not None:
        return int(made(flat, np.ascontiguousarray(lens, dtype=np.int64)))
    return _dense_ids_numpy(flat, lens)


def _block_ids_numpy(hids, blocks, lens, per_block: int) -> tuple[np.ndarray, int]:
    """The reference of the compiled `block_ids` (stackdist.c says what it writes, the same
    numbers): the hash ids numbered in the order they first come (a stable sort, as
    `_dense_ids_numpy`), each page's id its block's number x per_block + its place in the block,
    each request's pages reversed."""
    hids = np.asarray(hids, dtype=np.int64)
    blocks = np.asarray(blocks, dtype=np.int64)
    lens = np.asarray(lens, dtype=np.int64)
    per = int(per_block)
    if (not 1 <= per < 2**31 or len(blocks) != len(lens) or (blocks < 0).any() or int(blocks.sum()) != len(hids)
            or (lens < 0).any() or (lens > blocks * per).any()):
        raise ValueError("block_ids: hids, blocks, lens and out are int64, blocks >= 0 adding up to the hids, "
                         "0 <= lens <= blocks x per_block adding up to out, 1 <= per_block < 2**31")
    num = hids.copy()
    d = _dense_ids_numpy(num, np.array([len(num)], dtype=np.int64))
    num = num[::-1]  # one request of every hash id: its numbers came back reversed
    total = int(lens.sum())
    off = np.cumsum(lens) - lens
    p = np.arange(total, dtype=np.int64) - np.repeat(off, lens)  # each page's place in its request
    first = np.cumsum(blocks) - blocks  # each request's first hash id
    ids = num[np.repeat(first, lens) + p // per] * per + p % per
    out = np.empty(total, dtype=np.int64)
    out[np.repeat(2 * off + lens - 1, lens) - np.arange(total, dtype=np.int64)] = ids  # each request's backwards
    return out, d * per


def block_ids(hids, blocks, lens, per_block: int) -> tuple[np.ndarray, int]:
    """(each request's page ids end to end, each request's reversed; how many ids) of requests of
    `blocks` hash ids each (`hids` end to end) and their first `lens` pages, `per_block` pages a
    block: a page's id is its hash id's dense number x per_block + its place in the block (a
    plain hash_ids trace's page keys are hash id x per_block + that place: trace/pages.py), so
    the index is made from the hash ids, 1 / per_block of the keys, the keys never made (issue
    41: the writer's read-ahead). Compiled (stackdist.c), or `_block_ids_numpy` (the same numbers)
    where the module is absent or TIERDIAG_CPLANE is `numpy`."""
    made = _compiled("block_ids")
    if made is not None:
        lens = np.ascontiguousarray(lens, dtype=np.int64)
        out = np.empty(int(lens.sum()) if len(lens) else 0, dtype=np.int64)
        n = made(np.ascontiguousarray(hids, dtype=np.int64), np.ascontiguousarray(blocks, dtype=np.int64),
                 lens, int(per_block), out)
        return out, int(n)
    return _block_ids_numpy(hids, blocks, lens, per_block)


def narrow(values) -> np.ndarray:
    """`values` (integers) as int32 where every one fits, else int64: the same numbers."""
    a = np.asarray(values)
    if a.dtype == np.int32:
        return a
    if a.dtype.kind not in "iub":
        a = np.asarray(a, dtype=np.int64)  # as the int64 columns were made: a float or object array too
    if len(a) == 0 or (int(a.min()) >= -2**31 and int(a.max()) < 2**31):
        return a.astype(np.int32)
    return a.astype(np.int64, copy=False)


def scaled_arrivals(arrival_ns, time_scale: float) -> np.ndarray:
    """Each arrival as engine/arrivals.py `ArrivalSource` times it: `int(arrival_ns * time_scale)`.
    For a float scale that is numpy's float64 product truncated (an int64 rounded to the nearest
    double as Python's int * float rounds it, the same IEEE product, truncated toward zero as
    `int` does), where every product is finite and under 2**62; else, and for a scale of another
    type (an int's product is exact), the Python expression a request at a time (issue 41: ~0.15
    s of the writer's live-pass thread at 1M requests, ~4 ms in numpy)."""
    if type(time_scale) is float and len(arrival_ns):
        with np.errstate(over="ignore", invalid="ignore"):  # such a product takes the expression below
            product = np.asarray(arrival_ns, dtype=np.int64).astype(np.float64) * time_scale
        if np.isfinite(product).all() and float(np.abs(product).max()) < 2.0**62:
            return product.astype(np.int64)
    return np.array([int(a * time_scale) for a in arrival_ns], dtype=np.int64)


def _arrival_bounds(arrival_ns, sessions: list, time_scale: float, arrivals) -> tuple[np.ndarray, np.ndarray, bool]:
    """(scaled arrival of each request, its session's previous turn's position or -1, closed loop?)
    as engine/arrivals.py `ArrivalSource` times them (`int(arrival_ns * time_scale)`)."""
    scaled = scaled_arrivals(arrival_ns, time_scale)
    pred = np.full(len(sessions), -1, dtype=np.int64)
    last: dict = {}
    for i, s in enumerate(sessions):
        if s is not None:
            pred[i] = last.get(s, -1)
            last[s] = i
    closed = arrivals == "closed" or (arrivals is None and bool(last))
    return scaled, pred, closed


class LivePass:
    """The pass over the requests of `index`, fed their rows as they come (module doc).

    `add_rows(pos, rank, sched_ns, fin_ns, input_tokens, output_tokens, finished)`: rows of the
    requests at positions `pos` of the index (a row with finished False is recorded, not walked);
    `advance(until_ns)` walks every event known before `until_ns` (None: all of them);
    `watermark()` is the time before which every event is known (module doc). The lookups' ranks
    and depths come out in event order: `results()`."""

    def __init__(self, index: TraceIndex, page: int, *, all_ranks: bool, closed: bool = False):
        n = len(index.seq)
        self.index = index
        self.page = page
        self.all_ranks = all_ranks  # a run of several ranks: the depths over every rank's touches too
        self.closed = closed
        self.recorded = np.zeros(n, dtype=bool)
        self.now = 0  # the latest finish recorded: the engine's clock is past it
        self.service = 0  # the longest schedule -> finish recorded
        self.seen = 0  # finished rows recorded
        self.finished = np.zeros(n, dtype=bool)
        self.values = np.zeros((n, 5), dtype=np.int64)  # rank, sched, fin, input, output
        self.stacks: dict = {}
        self.every = new_stack(index.n_ids) if all_ranks else None
        self.fresh = 0  # output pages numbered so far (a sampled index keeps those its rule keeps)
        self._done = False  # `done`: the stacks let go, nothing more is walked
        self._pending: list[np.ndarray] = []  # (time, is_sched, seq, pos) of events not walked
        # The events walked, in order: 2 x pos + is_sched each, int32 where the positions fit
        # (issue 41: two int64 an event were 32 MB through a 1M-request run).
        self.walked: list[np.ndarray] = []
        self._code = np.int32 if 2 * n + 1 < 2**31 else np.int64
        # The lookups' ranks and depths walked, a part a walk, held compactly until `results`
        # (issue 41: ~9M sampled lookups at 200k requests were 8 + 8 bytes each): a walk of one
        # rank is (rank, count), of several an int16 a lookup; the depths int32 (a depth counts
        # positions of the stack, which stay under 2**30).
        self.lookup_rank: list = []
        self.d_rank: list[np.ndarray] = []
        self.d_all: list[np.ndarray] = []
        self._results = None  # `results`, once handed over
        self._bounds: _Bounds | None = None  # the watermark's state, made at its first call
        # The positive depths walked, tallied as they come (`depth_tally`): how many lookups at
        # each depth, what the close's curves are made of, so that it need not join, convert and
        # sort every lookup's depth (~35 ms of the conversation trace's close, issue 41 session
        # 24). Kept for a pass of one rank, unsampled, while the deepest stays under _TALLY_MOST;
        # else None (the close makes it from `results`, as before).
        # int32 counts: a depth's lookups are at most the pass's, which an unsampled pass keeps
        # under size_curves.MAX_TOUCHES (20M).
        self.tally: np.ndarray | None = (np.zeros(0, dtype=np.int32) if not all_ranks and index.keep is None
                                         else None)
        # (the tally they were made of, its distinct depths, their counts): `depth_tally`'s answer,
        # made once the walk is done (`_tally_now`); remade where the tally is another array.
        self._tallied: tuple | None = None

    def add_rows(self, pos, rank, sched_ns, fin_ns, input_tokens, output_tokens, finished) -> None:
        pos = np.asarray(pos, dtype=np.int64)
        if len(pos) == 0:
            return
        if self.recorded[pos].any() or len(np.unique(pos)) != len(pos):
            raise ValueError("a request's row came twice")
        finished = np.asarray(finished, dtype=bool)
        self.recorded[pos] = True
        self.finished[pos] = finished
        self.values[pos] = np.stack([np.asarray(c, dtype=np.int64) for c in
                                     (rank, sched_ns, fin_ns, input_tokens, output_tokens)], axis=1)
        f = pos[finished]
        v = self.values[f]
        if self._bounds is not None:
            self._bounds.finished(f)
        if len(f):
            self.now = max(self.now, int(v[:, 2].max()))
            self.service = max(self.service, int((v[:, 2] - v[:, 1]).max()))
            self.seen += len(f)
        seq = self.index.seq[f]
        self._pending.append(np.stack([np.r_[v[:, 1], v[:, 2]], np.r_[np.ones(len(f), dtype=np.int64),
                                       np.zeros(len(f), dtype=np.int64)], np.r_[seq, seq], np.r_[f, f]], axis=1))

    def watermark(self) -> int:
        """The time before which no request not recorded yet is expected to have an event (module
        doc): its arrival bound, or, once WARM rows are in, no earlier than the latest finish
        less SLACK times the longest schedule -> finish seen (a request still queued is
        scheduled after the latest finish; one running, within its service time before it).
        `_watermark_scan` is its reference: the least bound found by a scan of every request;
        here `_Bounds` keeps what that scan would find as the rows come (issue 41: a scan a
        hand-over was quadratic in the requests, ~1.3 s of the writer's CPU at 200k and ~25x that
        at 1M)."""
        if self._bounds is None:
            self._bounds = _Bounds(self)
        least = self._bounds.least()
        if self.seen >= WARM:
            least = max(least, min(self.now - SLACK * self.service, self.now))
        return least

    def _watermark_scan(self) -> int:
        """`watermark` by a scan of every request's bound (its reference, in tests)."""
        todo = ~self.recorded
        if not todo.any():
            return _NEVER
        bound = self.index.arrival_ns.copy()
        if self.closed:
            pred = self.index.pred
            later = pred >= 0
            p = pred[later]
            bound[later] = np.where(self.finished[p], self.values[p, 2], _NEVER)
        least = int(bound[todo].min())
        if self.seen >= WARM:
            least = max(least, min(self.now - SLACK * self.service, self.now))
        return least

    def advance(self, until_ns: int | None = None) -> int:
        """Walk the known events before `until_ns` (all: None), in order; returns how many."""
        if not self._pending:
            return 0
        ev = np.concatenate(self._pending)
        if until_ns is not None:
            now = ev[:, 0] < until_ns
            later = ev[~now]
            ev = ev[now]
            self._pending = [later] if len(later) else []
        else:
            self._pending = []
        if len(ev) == 0:
            return 0
        ev = ev[np.lexsort((ev[:, 2], ev[:, 1], ev[:, 0]))]  # by time, then finish (0) first, then seq
        # Walked _WALK_EVENTS at a time: a walk's temporaries (each event's row values, a sampled
        # pass's output pages and their hashes, its depths) stay small beside the pass, where one
        # walk of every event (`whole_pass`) made them for the whole run at once (issue 41). The
        # stack answers the same fed in any cuts.
        for a in range(0, len(ev), _WALK_EVENTS):
            part = ev[a:a + _WALK_EVENTS]
            self._walk(part[:, 3], part[:, 1] == 1)
            self.walked.append((2 * part[:, 3] + part[:, 1]).astype(self._code))
        return len(ev)

    def _walk(self, req: np.ndarray, is_sched: np.ndarray) -> None:
        if self._done:
            raise ValueError("the pass is done: its stacks are let go")
        ix, page = self.index, self.page
        v = self.values[req]
        rank, inp, out = v[:, 0], v[:, 3], v[:, 4]
        ln = ix.lens[req]
        look = np.minimum(np.maximum((inp - 1) // page, 0), ln) if ix.looks is None else ix.looks[req]
        outs = np.where(is_sched, 0, np.maximum((inp + out) // page - inp // page, 0))
        if ix.keep is not None:
            # Sampled: the output pages are numbered in event order from -1 down, each event's
            # ascending (size_curves.py `_touches`), and only those the sample keeps are touched.
            every = int(outs.sum())
            before = self.fresh + np.cumsum(outs) - outs
            fresh = self.fresh + np.arange(every, dtype=np.int64) - np.repeat(2 * before + outs, outs)
            self.fresh += every
            kept = ix.keep(fresh)
            outs = np.bincount(np.repeat(np.arange(len(req), dtype=np.int64), outs)[kept],
                               minlength=len(req)).astype(np.int64)
            del fresh, kept, before
        start = ix.off[req]
        looks = np.where(is_sched, look, 0)  # an event's lookups: the last `looks` of its keys
        ranks = np.unique(rank).tolist()
        if len(ranks) == 1:
            r = ranks[0]
            stack = self.stacks.get(r)
            if stack is None:
                stack = self.stacks[r] = new_stack(ix.n_ids)
            d_rank = walk(stack, ix.rev_ids, start, ln, looks, outs)
            self.lookup_rank.append((r, len(d_rank)))
            if self.tally is not None:
                self._tally(d_rank)
        else:
            self.tally = None  # several ranks: the close's own tally, of each lookup's rank
            lookup_rank = np.repeat(rank, looks)
            d_rank = np.zeros(len(lookup_rank), dtype=np.int64)
            for r in ranks:
                stack = self.stacks.get(r)
                if stack is None:
                    stack = self.stacks[r] = new_stack(ix.n_ids)
                sel = rank == r
                d_rank[lookup_rank == r] = walk(stack, ix.rev_ids, start[sel], ln[sel], looks[sel], outs[sel])
            self.lookup_rank.append(lookup_rank.astype(np.int16) if -2**15 <= min(ranks) and max(ranks) < 2**15
                                    else lookup_rank)
        self.d_rank.append(d_rank.astype(np.int32))
        if self.every is not None:
            self.d_all.append(walk(self.every, ix.rev_ids, start, ln, looks, outs).astype(np.int32))

    def _tally(self, depths: np.ndarray) -> None:
        self._tallied = None  # counted on: made again when asked
        d = depths[depths > 0]
        if not len(d):
            return
        top = int(d.max())
        tally = self.tally
        if top >= len(tally):
            if top >= _TALLY_MOST:
                self.tally = None
                return
            grown = np.zeros(min(max(top + 1, 2 * len(tally)), _TALLY_MOST), dtype=np.int32)
            grown[:len(tally)] = tally
            self.tally = tally = grown
        # A walk's depths counted in place by numpy's `add.at` of an int32 one (its fast path
        # since numpy 1.25: the conversation trace's 18 walks, 2.26M lookups, 3.6 ms against
        # 38 ms by a sort of each walk's depths; with an int64 one it takes the slow path, 48 ms;
        # issue 41, session 36). Before 1.25: a count array as long as the tally where they are
        # many beside it, else a sort of them.
        if _FAST_ADD_AT:
            np.add.at(tally, d, _ONE32)
        elif 8 * len(d) >= len(tally):
            tally += np.bincount(d, minlength=len(tally)).astype(np.int32)
        else:
            uniq, n = np.unique(d, return_counts=True)
            tally[uniq] += n

    def depth_tally(self) -> tuple[int, np.ndarray, np.ndarray] | None:
        """(lookups walked, their distinct positive depths ascending, how many of each): what
        size_curves.py `_tally_sorted(_depth_pages(d_rank, None, never), never)` makes of
        `results()`' depths of a pass of one rank, unsampled; None where it was not kept."""
        parts = self.lookup_rank
        if self.tally is None or any(not isinstance(p, tuple) for p in parts) or len({p[0] for p in parts}) > 1:
            return None
        made = self._tallied
        if made is None or made[0] is not self.tally:
            at = np.flatnonzero(self.tally)
            made = (self.tally, at.astype(np.int64), self.tally[at].astype(np.int64))
        return sum(p[1] for p in parts), made[1], made[2]

    def _tally_now(self) -> None:
        """`depth_tally`'s arrays made now, from the tally of a pass walked to its end (`done`: on
        the thread that walked it, while the writer's close writes its last rows, where the
        close's curves made them after: a scan of the tally, ~2M counts at most; issue 41)."""
        if self.tally is not None:
            at = np.flatnonzero(self.tally)
            self._tallied = (self.tally, at.astype(np.int64), self.tally[at].astype(np.int64))

    def done(self) -> None:
        """Every event is walked (`advance(None)`): the stacks are let go (each id's latest position,
        4 bytes an id, and the positions left, a bit a position), before the close computes beside
        what is kept."""
        if self._pending:
            raise ValueError("done: events are left to walk")
        self.stacks = {}
        self.every = None
        self._done = True
        self._tally_now()

    def let_walk_go(self) -> None:
        """The walk is verified and only its results are read from here on (the close, size_curves
        `_pass`): what it was walked from is let go before they are joined, each row's
        values and the events walked here, the keys and their offsets in the index (issue 41:
        ~110 MB at a 1M-request close's peak). Nothing can be walked or verified after."""
        self.values = self.recorded = self.finished = None
        self.walked = []
        self._pending = []
        self._done = True
        self.index.let_keys_go()

    def results(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(rank of each lookup walked, its depth on its rank, its depth over every rank or None
        where only one rank was fed), in event order. The depths are handed over: each walk's part
        is let go as it is copied into the int64 result (issue 41: the parts and the result were
        held together, 12 bytes a lookup at the close's peak), and a later call answers the same
        arrays."""
        if self._results is not None:
            return self._results
        ranks = {p[0] if isinstance(p, tuple) else None for p in self.lookup_rank}
        if len(ranks) == 1 and None not in ranks:  # one rank throughout: a view, no array of every lookup
            lookup_rank = np.broadcast_to(np.int64(ranks.pop()), (sum(p[1] for p in self.lookup_rank),))
        else:
            lookup_rank = _joined([np.full(p[1], p[0], dtype=np.int64) if isinstance(p, tuple) else p
                                   for p in self.lookup_rank])
        self.lookup_rank = []
        d_rank = _joined(self.d_rank)
        d_all = _joined(self.d_all) if self.all_ranks else None
        self._results = (lookup_rank, d_rank, d_all)
        return self._results

    def verify(self, pos: np.ndarray, cols) -> bool:
        """The events walked are the run's whole event order, with the rows' values (`cols`: the
        committed finished rows, CurveColumns by seq; `pos`: their positions here), and no other
        request was walked."""
        n = len(cols.seq)
        if int(self.finished.sum()) != n or not self.finished[pos].all():
            return False
        # A column at a time (issue 41: the two (rows, 5) int64 copies were ~80 MB of a 1M-request close).
        for k, theirs in enumerate((cols.rank, cols.sched_ns, cols.fin_ns, cols.input_tokens, cols.output_tokens)):
            if not np.array_equal(self.values[pos, k], theirs):
                return False
        walked = np.concatenate(self.walked) if self.walked else np.zeros(0, dtype=self._code)
        if len(walked) != 2 * n:  # every event walked (the close hands the end first: `advance(None)`)
            return False
        t = np.concatenate([cols.sched_ns, cols.fin_ns])
        sched = np.r_[np.ones(n, dtype=np.int8), np.zeros(n, dtype=np.int8)]
        order = np.lexsort((np.r_[cols.seq, cols.seq], sched, t))
        del t
        want = (2 * np.r_[pos, pos] + sched)[order]  # the walked events' code (`advance`), in order
        return bool(np.array_equal(walked, want))


class _Bounds:
    """The least arrival bound of the requests of a `LivePass` not recorded yet (its module doc's
    table), kept as its rows come rather than found by a scan of every request each time:

    - a request bounded by its own arrival (every one in open loop; in closed loop a session's
      first turn or a request without a session): the requests in order of arrival, and a cursor
      past the recorded ones at the front (each request passed once over the run);
    - a later turn in closed loop: bounded by its predecessor's finish once that one finished
      (never before): the turns whose predecessor finished are `waiting` until recorded, and
      their least bound is read over those only.

    The least of the two is the scan's `bound[todo].min()` (`LivePass._watermark_scan`; a test
    holds them equal after every batch of rows)."""

    _STEP = 4096  # the cursor's look-ahead: recorded requests skipped a slice at a time

    def __init__(self, live: LivePass) -> None:
        ix = live.index
        self.live = live
        pred = np.asarray(ix.pred, dtype=np.int64)
        own = np.ones(len(pred), dtype=bool) if not live.closed else pred < 0
        mine = np.flatnonzero(own)
        self.order = mine[np.argsort(ix.arrival_ns[mine], kind="stable")]
        self.at = 0
        self.pred = pred
        self.waiting = np.zeros(0, dtype=np.int64)
        if live.closed:
            later = np.flatnonzero(pred >= 0)
            self.later = later[np.argsort(pred[later], kind="stable")]  # the later turns by predecessor
            self.their_pred = pred[self.later]
            self.finished(np.flatnonzero(live.finished))  # what finished before the first call

    def finished(self, pos: np.ndarray) -> None:
        """Requests at `pos` finished (their rows recorded): their next turns now wait on a bound."""
        if not self.live.closed or len(pos) == 0:
            return
        lo = np.searchsorted(self.their_pred, pos, side="left")
        hi = np.searchsorted(self.their_pred, pos, side="right")
        n = hi - lo
        if not n.any():
            return
        at = np.repeat(lo - (np.cumsum(n) - n), n) + np.arange(int(n.sum()), dtype=np.int64)
        self.waiting = np.concatenate([self.waiting, self.later[at]])

    def least(self) -> int:
        live = self.live
        recorded = live.recorded
        order, at = self.order, self.at
        while at < len(order):
            ahead = recorded[order[at:at + self._STEP]]
            k = int(np.argmin(ahead))
            if not ahead[k]:
                at += k
                break
            at += len(ahead)
        self.at = at
        least = int(live.index.arrival_ns[order[at]]) if at < len(order) else _NEVER
        if len(self.waiting):
            self.waiting = w = self.waiting[~recorded[self.waiting]]
            if len(w):
                least = min(least, int(live.values[self.pred[w], 2].min()))
        return least


_JOIN_PARTS = 512  # parts copied by one np.concatenate in `_joined`


def _joined(parts: list) -> np.ndarray:
    """The parts end to end as one int64 array, let go (taken out of `parts`) a few hundred at a
    time once copied: one numpy call a batch, not a Python step a part (a walk's part is a few
    hundred lookups; the close's other threads wait on the GIL for each step)."""
    out = np.empty(sum(len(p) for p in parts), dtype=np.int64)
    at = 0
    for a in range(0, len(parts), _JOIN_PARTS):
        batch = parts[a:a + _JOIN_PARTS]
        parts[a:a + _JOIN_PARTS] = [None] * len(batch)  # the list's hold on them: let go
        k = sum(len(p) for p in batch)
        np.concatenate(batch, out=out[at:at + k], casting="same_kind")
        at += k
        del batch
    parts.clear()
    return out


def whole_pass(index: TraceIndex, pos: np.ndarray, cols, page: int, *, all_ranks: bool):
    """The pass over every finished row at once (`cols` at positions `pos` of `index`): what the
    close walks where nothing was fed while recording. (lookup ranks, depths on the rank, over all)."""
    live = LivePass(index, page, all_ranks=all_ranks)
    live.add_rows(pos, cols.rank, cols.sched_ns, cols.fin_ns, cols.input_tokens, cols.output_tokens,
                  np.ones(len(pos), dtype=bool))
    live.advance(None)
    return live.results()


# The requests' columns `rows_of` reads (what the read-ahead keeps of each batch handed to it:
# diagnose/run/size_curves.py `_pass_columns`).
ROWS_OF_COLUMNS = ("seq", "arrival_ns", "queue_ns", "finish_ns", "first_token_ns", "status", "ttft_ns", "dp_rank",
                   "input_tokens", "output_tokens")


def rows_of(index: TraceIndex, columns: dict):
    """`LivePass.add_rows`' arguments from the requests' columns the store's writer took (Arrow
    arrays by column; a column absent is NULL), as diagnose/read/curves.py `curve_columns` reads
    the committed rows: sched = arrival + queue, fin = finish, else first token, else sched; a
    finished row (status finished or NULL, and a TTFT) with a seq and an arrival is walked."""
    from tierdiag.store.columns import arrow_ints, arrow_is, arrow_valid

    n = len(next(iter(columns.values())))

    def ints(name: str, default: int = 0) -> np.ndarray:
        got = columns.get(name)
        if got is None:
            return np.full(n, default, dtype=np.int64)
        return arrow_ints(got, default)

    def present(name: str) -> np.ndarray:
        got = columns.get(name)
        if got is None:
            return np.zeros(n, dtype=bool)
        return arrow_valid(got)

    seq_ok = present("seq")
    seq = ints("seq")
    arrival_ok = present("arrival_ns")
    sched = ints("arrival_ns") + ints("queue_ns")
    fin = np.where(present("finish_ns"), ints("finish_ns"), np.where(present("first_token_ns"), ints("first_token_ns"), sched))
    status = columns.get("status")
    is_done = np.ones(n, dtype=bool) if status is None else arrow_is(status, "finished", null=True)
    finished = is_done & present("ttft_ns") & arrival_ok
    pos = np.searchsorted(index.seq, seq)
    pos = np.minimum(pos, max(len(index.seq) - 1, 0))
    known = seq_ok & (len(index.seq) > 0)
    known &= index.seq[pos] == seq if len(index.seq) else known
    if (finished & seq_ok & ~known).any():
        raise ValueError("a finished row whose seq is not a line of the trace")
    keep = known
    return (pos[keep], ints("dp_rank")[keep], sched[keep], fin[keep], ints("input_tokens")[keep],
            ints("output_tokens")[keep], finished[keep])
