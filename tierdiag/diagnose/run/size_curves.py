"""Size curves: the reuse each tier would have found at every size, from one pass over the run's
page references (LRU stack distances, Mattson's algorithm), stored with the run evidence when the
run is closed (`size_curves` section, evidence.py) and read through RunFacts.

What is referenced. The rows carry no page identities, so the run's trace is read again at close
(its recorded path, checked against its recorded sha256; each finished row matched to its trace
line by seq, req_id and input length): each finished request's page keys (trace/pages.py, the
engine's own keys) in the replay's order, two touches per request:

    scheduled  (arrival_ns + queue_ns)  its input pages: the full pages before its last input token
               are looked up (a hit when their depth fits), then all its input pages are touched
    finished   (finish_ns)              its input pages and its output pages (synthetic keys no
                                        request looks up again, as the engine's) are touched

Within a touch the pages are touched deepest first, so a prefix is always more recent than what
hangs below it: the LRU page is then always a leaf of the tree of prefixes, and an LRU pool of C
pages holds a page's whole prefix whenever it holds the page. That is the radix tree's
leaf-first LRU (SGLang `RadixCache.evict`: the least recently used leaf) over whole pages.

    depth of a lookup = distinct pages touched since that page was last touched, itself included
    an LRU pool of C tokens finds it  <=>  depth x page_size <= C

Per tier, at size S (per rank), the tiers above held at the run's own sizes:

    device    reused(S) = pages whose depth on their rank <= S
    host      the device and host pools together: write_through keeps a host copy of device's
              pages, so they hold max(device, S); otherwise host holds what device evicted and they
              add up, device + S (write_back and write_through_selective alike)
    storage   one tier shared by every rank: a page is found where its rank's device + host held
              it (at the run's sizes, as above), or where its depth over all ranks' touches <= S

reused_tokens counts the looked-up pages found (tokens), reused_share divides it by the finished
requests' input tokens. The knee (`knee_tokens`) of a curve is the smallest size, in whole pages,
at which the tier adds at least KNEE_SHARE (90 %) of what an unbounded pool of that tier would add
to what the tiers above it find at size 0:

    knee = min S such that reused(S) - reused(0) >= KNEE_SHARE x (reused(inf) - reused(0))

where reused(inf), the plateau, is every looked-up page touched before (None where the tier can
add nothing). For device reused(0) is 0; for host it is what device finds alone; for storage what
device and host find at the run's sizes. `advise` proposes host and storage sizes from it, with
slack: the knee plus the median request's looked-up prefix (`slack_tokens`, whole pages), since
the engine evicts a whole tree node at a time (a request's private pages go together, not page by
page from the leaf end) and holds a running request's pages locked. On a planted cycle of six
17-page prefixes (tests/diagnose/test_advise_cli.py) the page-level model finds every prefix at
6,464 host tokens; the engine finds none there, 6,144 tokens at 6,528 and all of them from ~7,040:
the knee alone (6,400) would fall short, the knee plus one prefix (7,424) does not.

The pass holds every touch in memory (~70 bytes a touch): a run of more than MAX_TOUCHES page
touches (about a million requests) is sampled to that budget (SHARDS-style spatial sampling: a
page key is kept when its hash falls below the rate, so every touch of a kept page is kept; the
depths of the sample, divided by the rate, stand for the run's, and each sampled lookup for
1/rate of them). Its curves are then approximate and say so (`model`, `sample_rate`); at or
under the budget nothing is sampled and the curves are exact. Limits, stated with the curves (`model`): pages are kept in LRU order at every instant, where the
engine evicts only when an allocation needs room, never a page locked by a running request, and
inserts computed pages at the end of prefill, not at scheduling; a load-back or a prefetch is
counted as found whatever the link, the prefetch thresholds and rate limits decide; other eviction
policies (lfu, priority, tlru) are not modelled (the curve is LRU's); write_through_selective's
second-hit rule is not modelled (counted as exclusive, like write_back). The depths are exact for
this model (tests/diagnose/test_size_curves.py checks them against an LRU simulation).

One pass: the touches get positions; a Fenwick tree over the positions marks each key's latest
touch, so a depth is one prefix count (O(log n)); compiled (tierdiag/native/stackdist/) with a
Python reference that gives the same depths. The close walks it over an index of the requests'
keys as dense ids (live_curves.py: the read-ahead's, fed while the run was recorded, or one made
of the run's rows where the close reads the trace itself, `_rows_index`), a walk of a bounded
number of events at a time; the pass over an array of every touch (`_touches`, `_pass_depths`:
~70 bytes a touch, the close's own until issue 41's session 37) is the reference it is tested
against.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass

import duckdb

from tierdiag.config.names import WritePolicy
from tierdiag.diagnose.read.curves import CurveColumns, curve_columns, found_tokens, req_hashes
from tierdiag.units import share

TIERS = ("device", "host", "storage")
KNEE_SHARE = 0.9
CURVE_POINTS = 2048  # steps kept of each curve's step function (session_pool.py's rule)
# From this many finished rows on, the close hands the heap its pass freed back to the system
# once the curves are made (live_curves.py `release_freed_heap`: the sections after them compute
# on top of it; the evidence's large runs, evidence.py LARGE_RUN_REQUESTS). Below, a smaller run's
# freed heap is a few MB and malloc_trim's walk of the arenas (~2 ms) was on the close's longest
# thread, the replay waiting for it (issue 41, session 25).
TRIM_FROM_ROWS = 100_000
# The one pass holds every page touch in memory (~70 bytes each, keys, order and depths): the
# budget, in touches, of a close that must not need gigabytes. A run with more (counted from the
# rows before the trace is read; about a million requests) is sampled down to it (module doc).
MAX_TOUCHES = 20_000_000


def _over_budget(touches: int) -> bool:
    """A pass of `touches` page touches is sampled: more than MAX_TOUCHES, and any at all (a
    budget patched under 1 is taken as 1 by the rate, `max(MAX_TOUCHES, 1) / touches`; a pass of
    none has nothing to sample, and its rate would divide by zero)."""
    return touches > MAX_TOUCHES and touches > 0
_MIX = 0x9E3779B97F4A7C15  # a page key's hash for sampling: key x the golden ratio, modulo 2**64
MODEL = ("LRU stack distances over the run's page references (pages touched deepest first, so a prefix outlives "
         "its leaves); exact for that model, not for the engine: it evicts only when it needs room, never a locked "
         "page, inserts at the end of prefill; load-backs and prefetches count as found whatever the link and the "
         "prefetch rules decide; LRU only (lfu, priority, tlru not modelled); write_through_selective counted as "
         "exclusive like write_back")


@dataclass(frozen=True)
class SizeCurve:
    """One tier's curve: reused tokens against the tier's size (per rank; storage: the one tier)."""

    tier: str  # device | host | storage
    run_size_tokens: int  # the run's own size of this tier
    held: str  # what the tiers above it were held at, in words
    steps: tuple[tuple[int, int], ...]  # (size tokens, reused tokens at that size and above), ascending
    unbounded_reused_tokens: int  # the plateau: every looked-up page touched before
    knee_tokens: int | None  # smallest size (whole pages) adding >= KNEE_SHARE of what the tier can add; None: nothing
    found_tokens: int  # what the run's rows found in this tier or above (device; + host; + storage)

    def reused_at(self, size_tokens: int) -> int:
        """Reused tokens the model predicts at `size_tokens` (errs low by under 1/CURVE_POINTS)."""
        i = bisect_right([s for s, _ in self.steps], size_tokens)
        return self.steps[i - 1][1] if i else 0

    def points(self, page: int, *more: int | None) -> tuple[tuple[int, int], ...]:
        """(size, reused) at 0, each power of two pages up to the plateau's first size, the run's
        size, the knee and `more` (the size advise proposes): what summary and the report show."""
        top = self.steps[-1][0] if self.steps else 0
        sizes = {0, self.run_size_tokens} | {m for m in more if m is not None}
        s = page
        while True:
            sizes.add(s)
            if s >= top:
                break
            s *= 2
        if self.knee_tokens is not None:
            sizes.add(self.knee_tokens)
        return tuple((x, self.reused_at(x)) for x in sorted(sizes))


@dataclass(frozen=True)
class SizeCurves:
    """A run's size curves (module doc); None in its place where the trace could not be read again."""

    write_policy: str
    page_size: int
    num_ranks: int
    input_tokens: int  # of the finished requests: what reused_share divides by
    looked_up_tokens: int  # the full pages before the last input token of each finished request
    slack_tokens: int  # the median request's looked-up prefix (whole pages): what a proposal adds to a knee
    curves: tuple[SizeCurve, ...]  # device, host, storage
    model: str
    sample_rate: float = 1.0  # share of the pages the pass kept (1: every touch, exact; module doc)

    def curve(self, tier: str) -> SizeCurve | None:
        return next((c for c in self.curves if c.tier == tier), None)

    def proposed_size(self, tier: str) -> int | None:
        """The size `advise` proposes for `tier`: its knee plus `slack_tokens` (module doc); None
        where the tier adds nothing."""
        c = self.curve(tier)
        if c is None or c.knee_tokens is None:
            return None
        return -(-(c.knee_tokens + self.slack_tokens) // self.page_size) * self.page_size

    def to_json(self) -> dict:
        """`summary --json` `size_curves` (docs/contract.md)."""
        return {"write_policy": self.write_policy, "page_size": self.page_size, "num_ranks": self.num_ranks,
                "input_tokens": self.input_tokens, "looked_up_tokens": self.looked_up_tokens,
                "slack_tokens": self.slack_tokens,
                "knee_share": KNEE_SHARE, "model": self.model, "sample_rate": self.sample_rate,
                "tiers": {c.tier: {
                    "run_size_tokens": c.run_size_tokens, "held": c.held, "knee_tokens": c.knee_tokens,
                    "unbounded_reused_tokens": c.unbounded_reused_tokens,
                    "predicted_at_run_size_tokens": c.reused_at(c.run_size_tokens), "found_tokens": c.found_tokens,
                    "points": [{"size_tokens": s, "reused_tokens": r, "reused_share": share(r, self.input_tokens)}
                               for s, r in c.points(self.page_size, self.proposed_size(c.tier))]}
                          for c in self.curves}}


# --------------------------------------------------------------------------- the one pass


def _depths_python(prev: np.ndarray, starts: np.ndarray, query: np.ndarray) -> int:
    """The reference of the compiled `depths` (tierdiag/native/stackdist/stackdist.c says what
    each argument is): writes the looked-up touches' answers, in order, over prev[:k] and returns
    k; an answer is -1 never touched before, else the LRU stack depth."""
    n = len(prev)
    tree = [0] * (n + 1)
    live = 0
    bounds = list(starts.tolist()) + [n]
    pv = prev.tolist()
    q = query.tolist()
    answers = []
    for k in range(len(starts)):
        a, b = bounds[k], bounds[k + 1]
        for t in range(a, b):
            if not q[t]:
                continue
            p = pv[t]
            if p < 0:
                answers.append(-1)
                continue
            below, i = 0, p
            while i > 0:
                below += tree[i]
                i -= i & -i
            answers.append(live - below)
        for t in range(a, b):
            p = pv[t]
            if p >= 0:
                i = p + 1
                while i <= n:
                    tree[i] -= 1
                    i += i & -i
            else:
                live += 1
            i = t + 1
            while i <= n:
                tree[i] += 1
                i += i & -i
    prev[:len(answers)] = answers
    return len(answers)


def _depths_c(prev: np.ndarray, starts: np.ndarray, query: np.ndarray) -> int:
    import numpy as np

    from tierdiag.native import _stackdist

    # prev's own buffer, written over (a run's pass holds several arrays of its touches).
    if prev.dtype != np.int64 or not prev.flags.c_contiguous or not prev.flags.writeable:
        raise ValueError("depths: prev must be a writable contiguous int64 array")
    return _stackdist.depths(prev, np.ascontiguousarray(starts, dtype=np.int64),
                             np.ascontiguousarray(query, dtype=np.uint8))


def _previous_python(keys: np.ndarray) -> None:
    """The reference of the compiled `previous` (stackdist.c): each touch's key written over with
    the position of the previous touch of the same key (-1: none)."""
    last: dict[int, int] = {}
    prev = []
    for t, key in enumerate(keys.tolist()):
        prev.append(last.get(key, -1))
        last[key] = t
    keys[:] = prev


def _previous_c(keys: np.ndarray) -> None:
    import numpy as np

    from tierdiag.native import _stackdist

    if keys.dtype != np.int64 or not keys.flags.c_contiguous or not keys.flags.writeable:
        raise ValueError("previous: keys must be a writable contiguous int64 array")
    _stackdist.previous(keys)


def _choose_depths():
    """(depths, previous): the compiled passes, or their Python twins where the module is absent
    or TIERDIAG_CPLANE=numpy asks for them."""
    import os

    if os.environ.get("TIERDIAG_CPLANE", "").strip().lower() == "numpy":
        return _depths_python, _previous_python
    try:
        from tierdiag.native import _stackdist  # noqa: F401 - built by setup.py (optional)
    except ImportError:
        return _depths_python, _previous_python
    return _depths_c, _previous_c


depths_of, previous_of = _choose_depths()


def stack_depths(groups: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """LRU stack depths of grouped touches, in one pass. `groups`: in time order, (keys, looked):
    the group's keys (distinct), those where `looked` (bools) looked up against the stack as it
    was before the group, then all of them touched in the order given (the last given ends the
    most recent). Returns the depth of every looked-up key, groups and keys in order (-1: never
    touched before)."""
    import numpy as np

    if not groups:
        return np.zeros(0, dtype=np.int64)
    sizes = np.array([len(k) for k, _ in groups], dtype=np.int64)
    keys = np.concatenate([np.asarray(k, dtype=np.int64) for k, _ in groups])
    query = np.concatenate([np.asarray(m, dtype=np.uint8) for _, m in groups])
    return _flat_depths(keys, query, sizes, consume=True)


def _flat_depths(keys: np.ndarray, query: np.ndarray, sizes: np.ndarray, *, consume: bool = False) -> np.ndarray:
    """`stack_depths` of the groups laid end to end: `keys` (int64) and `query` (bools), group g
    the next `sizes[g]` of them. Every touch's previous touch of the same key is found in one pass
    over a table of the distinct keys (`previous_of`), then the Fenwick pass over those positions
    (`depths_of`); both write over one array of the touches, so the pass holds ~13 bytes a touch
    (the array, its query byte, the tree) where a stable sort of the keys held ~25 (issue 41: the
    writer's close at 1M requests). `consume`: `keys` (a contiguous int64 array the caller lets go)
    is that array, written over; else a copy is. Keys of any value; a pass whose keys are dense ids
    fed as they come is live_curves.py's `new_stack`."""
    import numpy as np

    query = query.view(np.uint8) if query.dtype == bool and query.flags.c_contiguous else query.astype(np.uint8, copy=False)
    n = len(keys)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    usable = consume and keys.dtype == np.int64 and keys.flags.c_contiguous and keys.flags.writeable
    prev = keys if usable else np.array(keys, dtype=np.int64)
    del keys
    previous_of(prev)
    # The pass writes the looked-up depths over prev's front; the rest of its buffer is let go.
    k = depths_of(prev, starts, query)
    if prev.flags.owndata:  # ours, or handed over (no views of it are kept): its tail let go
        prev.resize(k, refcheck=False)
        return prev
    return prev[:k].copy()


# --------------------------------------------------------------------------- from a run


class CurvesUnavailable(Exception):
    """The trace cannot be read again as it was replayed: no curves (the message says why)."""


def _sampler(rate: float):
    """The sample of a pass over budget: keeps a page key when its hash (key x _MIX, modulo
    2**64) falls in the lowest `rate` of the range, so a kept page keeps every touch."""
    import numpy as np

    bound = np.uint64(min(int(rate * 2.0**64), 2**64 - 1))
    mix = np.uint64(_MIX)

    def keep(keys: np.ndarray) -> np.ndarray:
        # int64 keys read as uint64 in place (what astype makes, without its copy: issue 41, the
        # read-ahead filters every kept key again each time the rate falls).
        hashed = keys.view(np.uint64) if keys.dtype == np.int64 else keys.astype(np.uint64)
        with np.errstate(over="ignore"):
            return hashed * mix < bound

    return keep


def _first_distinct(keys: np.ndarray) -> np.ndarray:
    """keys without repeats, each at its first place (a hostile trace may repeat a hash id)."""
    import numpy as np

    if len(set(keys.tolist())) == len(keys):  # the common case, ~10x cheaper than the sort below
        return keys
    _, idx = np.unique(keys, return_index=True)
    return keys[np.sort(idx)]


def _sizes(config: dict) -> tuple[int, int, int, int]:
    """(page, device, host, storage) tokens per rank, as the replay resolved them."""
    from tierdiag.config.engine import CONFIG_KEYS, EngineConfig

    cfg = EngineConfig(**{k: v for k, v in config.items() if k in CONFIG_KEYS and k != "storage_dir"})
    return (cfg.page_size, cfg.resolved_device_tokens(), cfg.resolved_host_tokens(),
            int(config.get("storage_tokens") or 0))


def size_curves(con: duckdb.DuckDBPyConnection, run) -> SizeCurves | None:
    """The run's size curves; None where its trace is gone, changed or does not match its rows."""
    try:
        return compute_size_curves(con, run)
    except CurvesUnavailable:
        return None


def compute_size_curves(con: duckdb.DuckDBPyConnection, run) -> SizeCurves:
    """The run's size curves (module doc); CurvesUnavailable where the trace cannot be read again."""
    import numpy as np

    import os

    from tierdiag.diagnose.run.run_claims import held_capacity
    from tierdiag.errors import TierdiagError
    from tierdiag.store.duckdb_core import purge_freed_memory
    from tierdiag.trace.reader import trace_sha256

    path = run.trace_path
    if not path or not os.path.isfile(path):
        raise CurvesUnavailable(f"trace file {path} is gone")
    try:
        page, device, host, storage = _sizes(run.config)
    except (TierdiagError, TypeError, ValueError) as exc:  # a hand-edited config the replay would not take
        if run.trace_sha256 and trace_sha256(path) != run.trace_sha256:  # what was said first, before
            raise CurvesUnavailable(f"trace file {path} changed since the run was recorded") from None
        raise CurvesUnavailable(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
    block = int(run.config.get("block_size") or 512)
    # The trace read while the run was recorded (`read_ahead`, the writer process), where it is
    # the same file, unchanged since, read with the same page and block sizes; else read now.
    ahead = _taken_ahead(path, run.trace_sha256, page, block)
    if ahead is None and run.trace_sha256 and trace_sha256(path) != run.trace_sha256:
        raise CurvesUnavailable(f"trace file {path} changed since the run was recorded")
    if ahead is not None and ahead.changed:
        raise CurvesUnavailable(f"trace file {path} changed since the run was recorded")
    policy = str(run.config.get("write_policy") or "write_through")
    # What this close's queries free (the rows' sort and result buffers below, the sections' on
    # the other threads) handed back by DuckDB's allocator as it goes, not kept resident to the
    # writer's exit (store/duckdb_core.py; issue 41: ~90 MB of a 1M-request close).
    purge_freed_memory(con)
    cols = curve_columns(con, run.run_id)
    n = len(cols.seq)
    inp_pages = cols.input_tokens // page
    per_row = 2 * inp_pages + np.maximum((cols.input_tokens + cols.output_tokens) // page - inp_pages, 0)
    del inp_pages
    touches = _exact_sum(per_row)
    del per_row
    rate, keep = 1.0, None
    if _over_budget(touches):
        rate = max(MAX_TOUCHES, 1) / touches
        keep = _sampler(rate)
    # Each finished row's keys, in seq order, laid end to end as they are read (the trace's
    # lines come in seq order: a walk along the rows, not a dict of a million arrays; issue 41).
    kept = _Flat(np.int64)
    marks = _Flat(np.bool_) if keep is not None else None  # sampled: which of its kept pages it looked up
    lens = np.zeros(n, dtype=np.int64)  # each row's keys (kept ones, sampled)
    lengths = np.zeros(n, dtype=np.int64)  # each row's distinct pages (before sampling)
    # What was read ahead: the index the pass was fed over (unsampled, or sampled at this very
    # rate), else the lines it kept (unsampled), else nothing this close can use (a sample at
    # another rate, or lines given to an index): the trace is read again (its digest and file
    # were checked above, as the read-ahead's).
    index = ahead.usable_index(touches) if ahead is not None else None
    ahead_lines = ahead.lines() if ahead is not None and index is None else None
    if index is None and ahead_lines is None:
        ahead = None
    # The rows' seqs as a list only for the loop over trace lines below (issue 41: a million
    # Python ints held through a 1M-request close where the index answers without it).
    seqs = cols.seq.tolist() if index is None else []
    wanted = _SeqSet(seqs) if ahead is None else None
    if index is not None:  # the pass was fed while recording: the keys are its index's, not kept here
        kept = marks = None
    lines = ahead_lines if ahead is not None else _trace_pages(path, page, block, wanted=wanted)
    hashed = ahead is not None  # the lines read ahead carry each req_id's hash (`_Pages`), not the string
    at = matched = 0
    last = None
    if index is not None:  # the loop below's checks at once, over the index's lines (in seq order)
        lines = ()
        matched, lengths = _matched(index, cols, run.run_id)
        lens = lengths
    try:
        for line, seq, req_id, input_len, k, *_ in lines:
            if last is not None and seq <= last:  # the reader numbers its requests in order
                raise CurvesUnavailable(f"trace line {line} is out of order (seq {seq} after {last})")
            last = seq
            while at < n and seqs[at] < seq:
                at += 1
            if at == n or seqs[at] != seq:
                continue
            i = at
            inp = int(cols.input_tokens[i])
            if cols.req_id[i] != (req_id if hashed else hash(req_id)) or inp != input_len:  # ids hashed (curve_columns)
                raise CurvesUnavailable(f"trace line {line} is not the request run {run.run_id} replayed as seq {seq}")
            lengths[i] = len(k)
            if keep is not None:
                sel = keep(k)
                marks.add((np.arange(len(k)) < min(max((inp - 1) // page, 0), len(k)))[sel])
                k = k[sel]
            lens[i] = len(k)
            if kept is not None:
                kept.add(k)
            matched += 1
            if i == n - 1:
                # Every row is matched: no later line is one of the run's (lines and rows ascend
                # together). An interrupted run's rows end part-way through the trace: the rest is
                # not read (a 1M-request run stopped half-way: ~half the read of its close).
                break
    except TierdiagError as exc:
        raise CurvesUnavailable(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
    if ahead is not None and ahead.error is not None:
        raise ahead.error
    if matched != n:
        raise CurvesUnavailable(f"trace file {path} has {matched} of the run's {n} finished requests")
    live = ahead.live if index is not None else None
    read_here = ahead is None  # the trace read again by this close (nothing read ahead it could use)
    del seqs, wanted, lines, ahead
    if read_here and n >= TRIM_FROM_ROWS:
        # The read's parse state (read_trace's ids, their set and lines, the hash ids' links: ~140
        # MiB at 1M requests) is freed: handed back before the pass's arrays are made beside what
        # the read kept (an interrupted large run's close, whose sample is not the read-ahead's:
        # its peak -28 to -39 MB at 1M; issue 41).
        from tierdiag.diagnose.run.live_curves import release_freed_heap

        release_freed_heap()
    cols = cols._replace(req_id=None)  # matched: the ids' hashes let go before the pass
    ranks = np.unique(cols.rank).tolist()
    tallied = None  # (distinct depths, counts) of a pass of one rank tallied while walked
    if index is None:
        # Read here (or the lines read ahead): the pass is walked over an index of the run's own
        # rows, their kept keys as dense ids, as the read-ahead's pass is (live_curves.py), not
        # over an array of every touch (`_touches`: ~70 bytes a touch, ~430 MB of the close of a
        # 1M-request run interrupted half-way, which passed 1 GB; issue 41). The same depths.
        index = _rows_index(cols, kept, lens, marks, lengths, keep, rate, touches)
        kept = marks = None
    passed = _pass(cols, index, live, page, len(ranks) > 1)
    del kept, marks, index, live
    if isinstance(passed[0], int):
        lookups, *tallied = passed
        lookup_rank = d_rank = d_all = None
    else:
        lookup_rank, d_rank, d_all = passed
    del passed
    # Each array let go once what comes of it is made (one rank: d_all is d_rank, computed once):
    # after the pass, a sampled 1M-request close held ~8 arrays of every lookup at once (issue 41).
    if tallied is None:
        lookups = len(lookup_rank)
    del lookup_rank
    one_rank = len(ranks) <= 1  # d_all is d_rank's touches: the same depths
    never = np.iinfo(np.int64).max
    # The sample's depths stand for the run's (divided by the rate), then a depth never found
    # (not positive) is `never`: in place, a chunk at a time (issue 41: at 200k requests the
    # float temporaries of ~10M sampled lookups were ~300 MB of the writer's close).
    scale = rate if keep is not None else None
    pages_rank = _depth_pages(d_rank, scale, never) if tallied is None else None
    del d_rank
    pages_all = pages_rank if one_rank else _depth_pages(d_all, scale, never)
    del d_all
    inclusive = policy == WritePolicy.WRITE_THROUGH
    held, held_words = held_capacity(run.config, device, host)

    def found_held(depth_pages: np.ndarray) -> np.ndarray:
        """Found where its rank's device and host held it, at the run's sizes."""
        hit = depth_pages != never
        hit &= depth_pages * page <= held
        return hit

    # Each curve's sizes are a non-decreasing function of the depth on the lookup's rank (with one
    # rank, storage's too): the depths found at some size counted once (`_tally`), each curve's
    # sizes are that function of the distinct depths, equal ones merged (issue 41: the lookups
    # sorted for every curve were ~0.3 s of the conversation trace's close, then one sort and
    # arrays of every lookup for each curve). `never` is where no size finds it: left out; at size
    # 0 beside nothing a depth needs depth x page tokens, exactly.
    if tallied is not None:  # one rank, unsampled: what _tally_sorted would make of its depths
        del pages_all, pages_rank
        depth_pages, counts = tallied
    elif one_rank:  # nothing else reads the lookups' order: sorted in place, not copied (issue 41)
        del pages_all
        depth_pages, counts = _tally_sorted(pages_rank, never)
        del pages_rank
    else:
        depth_pages, counts = _tally(pages_rank[pages_rank != never])
    tokens = depth_pages * page
    del depth_pages
    dev_found, host_found, sto_found, input_tokens = found_tokens(con, run.run_id)
    weight = 1 / rate  # lookups each sampled one stands for
    device_curve = _curve_of("device", device, "device alone", tokens, counts, page, dev_found, weight)
    host_need = (np.where(tokens <= device, 0, tokens) if inclusive
                 else np.maximum(-(-(tokens - device) // page) * page, 0))
    host_curve = _curve_of("host", host, (f"device at the run's {device:_} tokens; write_through keeps a host copy "
                                          "of device's pages, so device and host hold max(device, host)" if inclusive
                                          else f"device at the run's {device:_} tokens; host holds what device "
                                          "evicted (device + host)"), *_merged(host_need, counts), page,
                           dev_found + host_found, weight)
    del host_need
    if one_rank:
        sto_sizes, sto_counts = _merged(np.where(tokens <= held, 0, tokens), counts)
    else:  # storage: the lookup's depth over all ranks, beside what its own rank held (whole pages)
        del tokens
        # The storage size a lookup needs, whole pages: 0 where its own rank held it, else its
        # depth over all ranks (beside nothing, a depth of d pages needs exactly d pages; the
        # lookups found nowhere, `never`, left out): the depths themselves, no tokens and back
        # (issue 41's dp row: the multiply, ceiling division and two passes of `never` over
        # every lookup were ~0.1 s of a --dp 8 conversation close's curves).
        sto_need = np.where(found_held(pages_rank), 0, pages_all)
        del pages_rank, pages_all
        sto_pages, sto_counts = _tally(sto_need[sto_need != never])
        sto_sizes = sto_pages * page
        del sto_need, sto_pages
    curves = (device_curve, host_curve,
              _curve_of("storage", storage, f"device and host at the run's sizes ({held_words}); storage is one "
                                            "tier shared by every rank", sto_sizes, sto_counts, page,
                        dev_found + host_found + sto_found, weight))
    looks = np.sort(np.minimum(np.maximum((cols.input_tokens - 1) // page, 0), lengths))
    looks = looks[looks != 0]
    slack = int(looks[max(math.ceil(0.5 * len(looks)) - 1, 0)]) * page if len(looks) else 0  # nearest rank
    model = MODEL
    if keep is not None:
        model += (f"; SAMPLED: {touches:,} page touches are more than the pass's budget of {MAX_TOUCHES:,} "
                  f"(memory), so {rate:.3g} of the pages (by key hash) were kept and the curves are scaled "
                  "back from them: approximate")
    del looks
    if n >= TRIM_FROM_ROWS:  # the pass's arrays freed on this thread: handed back to the sections beside
        from tierdiag.diagnose.run.live_curves import release_freed_heap

        release_freed_heap()
    return SizeCurves(policy, page, len(ranks), input_tokens, int(round(lookups * weight)) * page, slack,
                      curves, model, rate)


_DEPTH_CHUNK = 1 << 20  # lookups a chunk of `_depth_pages`


def _depth_pages(depths: np.ndarray, rate: float | None, never: int) -> np.ndarray:
    """Each lookup's depth as the pages it needs: a positive depth divided by `rate` (a sampled
    pass; rounded, at least 1) where given, and `never` where it was not found (not positive):
    `np.where(d > 0, np.maximum(np.rint(d / rate), 1), d)`, then `np.where(d > 0, d, never)`,
    written over `depths` (copied first where it is not an int64 array of its own) a chunk at a
    time."""
    import numpy as np

    d = np.require(depths, dtype=np.int64, requirements=["C", "W", "O"])
    step = _DEPTH_CHUNK
    for a in range(0, len(d), step):
        x = d[a:a + step]
        if rate is not None:
            x[:] = np.where(x > 0, np.maximum(np.rint(x / rate), 1), x)
        x[x <= 0] = never
    return d


def _exact_sum(values: np.ndarray) -> int:
    """The sum of an int64 array as a Python int, exactly: numpy's where no partial sum can pass
    int64 (every row's touches fit many times over), else Python's over the values (issue 41: a
    list of a million Python ints made for every close)."""
    if len(values) == 0:
        return 0
    top = max(abs(int(values.max())), abs(int(values.min())))
    if top <= (2**63 - 1) // len(values):
        return int(values.sum())
    return sum(values.tolist())


def _matched(index, cols, run_id: str) -> tuple[int, np.ndarray]:
    """(rows matched, each row's distinct pages) of the rows `cols` against the trace lines of
    `index` (live_curves.TraceIndex: its seqs ascend), with compute_size_curves' loop's check:
    the first line (in trace order) whose row has another req_id or input length is refused."""
    import numpy as np

    n = len(index.seq)
    pos = np.minimum(np.searchsorted(index.seq, cols.seq), max(n - 1, 0))
    found = index.seq[pos] == cols.seq if n else np.zeros(len(cols.seq), dtype=bool)
    bad = found & ((index.req_hash[pos] != cols.req_id) | (index.input_len[pos] != cols.input_tokens))  # hashes
    if bad.any():
        first = int(np.flatnonzero(bad)[0])  # rows and lines ascend together: the first bad row is the first line
        raise CurvesUnavailable(f"trace line {int(index.line[pos[first]])} is not the request run {run_id} replayed "
                                f"as seq {int(cols.seq[first])}")
    return int(found.sum()), np.where(found, index.full_lens[pos], 0).astype(np.int64)


def _rows_index(cols, kept, lens, marks, lengths, keep, rate: float, touches: int):
    """live_curves.TraceIndex of the run's rows (`cols`, one position a row) from the keys the
    close read for them (`kept`: each row's kept keys end to end, `lens` of each; `marks`: which
    of them it looked up, where sampled by `keep` at `rate`, made from `touches`; `lengths`: its
    distinct pages before sampling): what the read-ahead's `_Pages.index` makes of the trace's
    lines, so that `whole_pass` walks it as it walks the read-ahead's."""
    from tierdiag.diagnose.run import live_curves

    flat = [kept.array()]  # handed over: written over with the ids
    index = live_curves.TraceIndex.of_flat(cols.seq, flat.pop(), lens, consume=True)
    if keep is not None:  # a row's looked-up keys are its first kept ones: how many
        index.sampled(_segment_sums(marks.array(), lens), lengths, keep, rate, touches)
    return index


def _pass(cols, index, live, page: int, several: bool):
    """(rank of each lookup, its depth on its rank, its depth over all ranks) of the pass over
    `index` (sampled or not): the one fed while the run was recorded (`live`: live_curves.py)
    where its walk is the rows' own, else walked whole here. Where the fed pass is of one rank
    and tallied its depths as it walked (live_curves.LivePass `depth_tally`): (lookups, their
    distinct positive depths, how many of each) instead, what the close makes of the depths
    (`_tally_sorted` of `_depth_pages`), made while the run was recorded."""
    import numpy as np

    from tierdiag.diagnose.run import live_curves

    pos = np.searchsorted(index.seq, cols.seq)
    if live is not None and (live.all_ranks or not several) and live.verify(pos, cols):
        del pos
        live.let_walk_go()  # only its results are read from here on
        tally = live.depth_tally() if not several else None
        if tally is not None:  # one rank, tallied while walked: no lookup's depth read here
            return tally
        lookup_rank, d_rank, d_all = live.results()
    else:
        lookup_rank, d_rank, d_all = live_curves.whole_pass(index, pos, cols, page, all_ranks=several)
    return lookup_rank, d_rank, d_rank if not several else d_all


def _trace_pages(path: str, page: int, block: int, wanted=None):
    """(line, seq, req_id, input tokens, distinct page keys, arrival ns, session) of each request
    of the trace, in its order (bad lines skipped, as the replay may have); keys only for the seqs
    in `wanted` (all when None): the others are passed over with empty keys."""
    import numpy as np

    from tierdiag.trace.pages import page_keys_array
    from tierdiag.trace.reader import read_trace

    none = np.zeros(0, dtype=np.int64)
    for req in read_trace(path, block_size=block, skip_bad=True):
        if wanted is not None and req.seq not in wanted:
            yield req.line, req.seq, req.req_id, req.input_len, none, req.arrival_ns, req.session, req.output_len
            continue
        keys = page_keys_array(req, page_size=page, block_size=block)
        if req.hash_ids is None:
            # A hash_ids line read is never an id twice (read_trace's chain check refuses, or skips,
            # one: its second place follows another id than its first), and its pages' keys
            # (id x pages a block + page) are then distinct: only tokens' keys are checked here
            # (issue 41: ~1 s of the writer's read-ahead at 200k synth requests).
            keys = _first_distinct(keys)
        yield req.line, req.seq, req.req_id, req.input_len, keys, req.arrival_ns, req.session, req.output_len


def _request_keys(req, page: int, block: int):
    """One request's distinct page keys, as `_trace_pages` yields them."""
    from tierdiag.trace.pages import page_keys_array

    keys = page_keys_array(req, page_size=page, block_size=block)
    # A hash_ids line read is never an id twice (`_trace_pages`): only tokens' keys are checked.
    return _first_distinct(keys) if req.hash_ids is None else keys


def _chunk_keys(reqs, page: int, block: int):
    """(keys end to end, keys a request, each key's place in its request) of requests read by
    read_trace, made at once where every one is a plain hash_ids line (no tokens, no extra_key):
    page j of block b is hash_ids[b] x (block // page) + j, a request's first input_len // page
    of them (`pages._block_page_keys_numpy`, a request at a time; tests hold the two equal), and
    distinct (`_trace_pages`). None where a request is another kind, or the sizes are ones
    `page_keys_array` refuses (it then says why, a request at a time)."""
    made = _chunk_hids(reqs, page, block)
    return None if made is None else _hid_keys(*made)


def _chunk_hids(reqs, page: int, block: int):
    """(hash ids end to end, hash ids a request, pages a request, pages a block) of requests read
    by read_trace where every one is a plain hash_ids line (`_chunk_keys`, whose keys these make:
    `_hid_keys`), else None."""
    import numpy as np
    from itertools import chain

    if page < 1 or block % page:
        return None
    hids = []
    for r in reqs:
        if r.hash_ids is None or r.extra_key is not None:
            return None
        hids.append(r.hash_ids)
    per_block = block // page
    n = len(reqs)
    blocks = np.fromiter(map(len, hids), dtype=np.int64, count=n)
    ids = np.fromiter(chain.from_iterable(hids), dtype=np.int64, count=int(blocks.sum()))
    del hids
    want = np.fromiter((r.input_len for r in reqs), dtype=np.int64, count=n) // page
    lens = np.minimum(want, blocks * per_block)  # the keys a request has: its blocks' pages, at most
    return ids, blocks, lens, per_block


def _hid_keys(hids, blocks, lens, per_block: int):
    """(keys end to end, keys a request, each key's place in its request) of `_chunk_hids`' hash
    ids: page j of a request's block b is its hash id x per_block + j, its first `lens` kept."""
    import numpy as np

    ids = hids
    if per_block > 1:
        ids = ((hids * per_block)[:, None] + np.arange(per_block, dtype=np.int64)).reshape(-1)
        blocks = blocks * per_block
    # Each id's (page's) place in its request, then only the first `lens` of each kept.
    starts = np.cumsum(blocks) - blocks
    at = np.arange(len(ids), dtype=np.int64) - np.repeat(starts, blocks)
    sel = at < np.repeat(lens, blocks)
    if not sel.all():
        ids, at = ids[sel], at[sel]
    elif ids is hids:
        ids = hids.copy()  # the caller's hash ids are not the keys handed out
    return ids, lens, at


class _HashIds:
    """A chunk of plain hash_ids requests as `_Pages` keeps it while unsampled: their hash ids
    (`_chunk_hids`), not their page keys, which the index never needs (live_curves.TraceIndex
    `of_blocks`: a page's id from its hash id's; issue 41: the writer's keys, ~per_block x the
    hash ids, never made); `key_chunk` makes what `_Pages` keeps of a chunk otherwise."""

    __slots__ = ("hids", "blocks", "lens", "look", "per_block")

    def __init__(self, hids, blocks, lens, look, per_block: int):
        self.hids, self.blocks, self.lens, self.look, self.per_block = hids, blocks, lens, look, per_block

    def key_chunk(self):
        """(keys, looked up, keys a request), as `_Pages._close_chunk` keeps a chunk of keys."""
        import numpy as np

        keys, lens, at = _hid_keys(self.hids, self.blocks, self.lens, self.per_block)
        return keys, at < np.repeat(self.look, lens), lens


def _touches_of(input_len, output_len, page: int):
    """Finished requests' page touches in the pass (compute_size_curves' count, which decides
    whether and at what rate the pass is sampled): each one's input pages twice, its output pages
    once (int64 arrays of the requests' lengths: an array of their touches)."""
    import numpy as np

    inp = input_len // page
    return 2 * inp + np.maximum((input_len + output_len) // page - inp, 0)


def _segment_sums(flags, lens):
    """How many of `flags` are set in each run of `lens` of them (runs end to end; empty ones 0)."""
    import numpy as np

    # The set flags' places counted below each run's bounds: a search of the bounds among them,
    # not a cumulative sum of every flag (~3x cheaper a read-ahead chunk; issue 41).
    bounds = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=bounds[1:])
    return np.diff(np.searchsorted(np.flatnonzero(flags), bounds))


class _Pages:
    """The trace's pages as the read-ahead keeps them (issue 41: the writer's memory at 1M
    requests): a few columns a request and the keys laid end to end, in chunks of whole requests,
    not a tuple and an array a line. Within the pass's budget every key is kept; past it (the
    touches the trace's requests would make if all finished: more than MAX_TOUCHES) only the keys
    a sample at the budget's rate keeps. That rate falls as the trace is read (budget / touches so
    far), and a lower rate's sample is a subset of a higher one's (`_sampler`: a key is kept when
    its hash is under the rate's bound), so the kept keys are filtered down whenever the rate has
    fallen by a quarter and at the end: they stay within ~1.25 x what the budget's sample holds,
    whatever the trace's length, and end as the close's own sample of the same touches."""

    _CHUNK = 4096  # requests a chunk

    def __init__(self, page: int):
        from array import array

        self.page = page
        # Counts and line numbers 4 bytes a request (issue 41: the 1M-request read); one past
        # int32 raises here, in the read-ahead, and the close reads the trace itself.
        self.line, self.seq, self.input_len, self.arrival = array("i"), array("q"), array("i"), array("q")
        self.full = array("i")  # each request's distinct pages
        self.pred = array("i")  # its session's previous turn's position, -1
        # Each req_id's hash (read/curves.req_hashes: this process's), not the string: a million
        # strings held through the read were ~70 MB of the writer at 1M requests (issue 41).
        self.req_hash = array("q")
        self.sessions = False
        self._last: dict = {}
        self.touches = 0  # of every request, as if all finish
        self.rate = 1.0  # the stored keys are the sample at this rate (1: all of them)
        self.keep = None
        self.chunks: list = []  # (keys, looked up, keys a request) of _CHUNK requests each
        self._keys: list = []  # the keys of the requests added since the last chunk
        self._rows: list = []  # and their columns, a tuple a request (`add`)
        self._reqs: list = []  # or the requests read (`add_request`): their keys made a chunk at a time
        self.block = 0  # the block size the requests' hash_ids name (`add_request`)

    def add(self, line, seq, req_id, input_len, keys, arrival, session, output_len) -> None:
        """One request read: kept as it came until its chunk is closed (`_close_chunk`: the
        columns, the touches and the sample made a chunk at a time, not a request at a time;
        issue 41: ~1 s of the writer's read-ahead at 200k synth requests)."""
        if self._reqs:
            self._close_chunk()  # the requests before, in their order
        self._rows.append((line, seq, req_id, input_len, arrival, session, output_len))
        self._keys.append(keys)
        if len(self._keys) >= self._CHUNK:
            self._close_chunk()

    def add_request(self, req, block: int) -> None:
        """One request as read_trace yields it (the read-ahead's): kept as it is until its chunk
        is closed, where the keys of a chunk of plain hash_ids lines are made at once
        (`_chunk_keys`), not a C call, an array and a tuple a line (issue 41: ~40 % of the
        read-ahead's CPU at 200k synth requests); what `add` is given is the same."""
        if self._keys:
            self._close_chunk()
        self.block = block
        self._reqs.append(req)
        if len(self._reqs) >= self._CHUNK:
            self._close_chunk()

    def _close_chunk(self) -> None:
        """The requests added since the last chunk as one: their columns appended, their touches
        counted, the sample's rate lowered where they take the trace past the budget (then the
        chunks before filtered down: `_resample`), and their keys sampled at the rate now. The
        rate is looked at once a chunk, not once a request: the keys kept at the end are the same
        (a lower rate's sample is a subset of a higher one's, and `finish` samples at the final
        rate), only the chunks held before a filter are up to one chunk larger."""
        from array import array

        import numpy as np

        at = None  # each kept key's place in its request's keys, where the chunk's keys made it
        made = None  # the chunk's hash ids (`_chunk_hids`), where its requests are plain hash_ids lines
        if self._reqs:
            reqs, self._reqs = self._reqs, []
            line = [r.line for r in reqs]
            seq = [r.seq for r in reqs]
            req_id = [r.req_id for r in reqs]
            input_len = [r.input_len for r in reqs]
            arrival = [r.arrival_ns for r in reqs]
            session = [r.session for r in reqs]
            output_len = [r.output_len for r in reqs]
            made = _chunk_hids(reqs, self.page, self.block)
            if made is None:
                key_parts = [_request_keys(r, self.page, self.block) for r in reqs]
            else:
                key_parts = None
                hids, blocks, lens, per_block = made
            del reqs
        elif self._keys:
            rows, key_parts = self._rows, self._keys
            self._rows, self._keys = [], []
            line, seq, req_id, input_len, arrival, session, output_len = zip(*rows)
            del rows
        else:
            return
        if key_parts is not None:
            lens = np.fromiter(map(len, key_parts), dtype=np.int64, count=len(key_parts))
        first = len(self.seq)
        # Counts and line numbers 4 bytes a request: one past int32 raises OverflowError here, in
        # the read-ahead (the close then reads the trace itself), as a request's append did.
        self.line.extend(array("i", line))
        self.seq.extend(array("q", seq))
        self.req_hash.extend(array("q", map(hash, req_id)))
        self.input_len.extend(array("i", input_len))
        self.arrival.extend(array("q", arrival))
        self.full.extend(array("i", lens.tolist()))
        if any(x is not None for x in session):
            self.sessions = True
            last = self._last
            pred = array("i")
            for i, sess in enumerate(session, first):
                if sess is None:
                    pred.append(-1)
                else:
                    pred.append(last.get(sess, -1))
                    last[sess] = i
            self.pred.extend(pred)
        else:
            self.pred.extend(array("i", [-1]) * len(session))
        inp = np.array(input_len, dtype=np.int64)
        out = np.array(output_len, dtype=np.int64)
        self.touches += int(_touches_of(inp, out, self.page).sum())
        if _over_budget(self.touches):
            rate = max(MAX_TOUCHES, 1) / self.touches
            if self.keep is None or rate < 0.8 * self.rate:
                self._resample(rate)
        # Each request's first pages looked up (those before its last input token).
        look = np.minimum(np.maximum((inp - 1) // self.page, 0), lens)
        if made is not None:
            if self.keep is None:  # unsampled: the hash ids kept, their keys made only if needed
                self.chunks.append(_HashIds(hids, blocks, lens, look, per_block))
                return
            keys, lens, at = _hid_keys(hids, blocks, lens, per_block)
            del hids, blocks
        if key_parts is not None:
            keys = np.concatenate(key_parts).astype(np.int64, copy=False) if key_parts else np.zeros(0, np.int64)
            del key_parts
            off = np.cumsum(lens) - lens
            at = np.arange(len(keys), dtype=np.int64) - np.repeat(off, lens)
        if self.keep is not None:  # sampled first: only the kept keys' places compared below
            sel = self.keep(keys)
            keys, at, lens = keys[sel], at[sel], _segment_sums(sel, lens)
            del sel
        looked = at < np.repeat(look, lens)
        del at
        self.chunks.append((keys, looked, lens))

    def key_chunks(self) -> list:
        """The chunks as (keys, looked up, keys a request) each, the hash ids kept of any
        (`_HashIds`) made into their keys now (a sample, or the close's lines, need the keys)."""
        self.chunks = [c.key_chunk() if isinstance(c, _HashIds) else c for c in self.chunks]
        return self.chunks

    def _resample(self, rate: float) -> None:
        self.key_chunks()
        self.rate, self.keep = rate, _sampler(rate)
        for c, (keys, looked, lens) in enumerate(self.chunks):
            sel = self.keep(keys)
            self.chunks[c] = (keys[sel], looked[sel], _segment_sums(sel, lens))

    def finish(self) -> None:
        """Every line read: the sample at the rate of the trace's own touches."""
        self._close_chunk()
        self._last = {}  # the sessions' latest turns: read, `pred` holds them
        if _over_budget(self.touches):
            self._resample(max(MAX_TOUCHES, 1) / self.touches)

    @property
    def sampled(self) -> bool:
        return self.keep is not None

    def lines(self):
        """(line, seq, req_id's hash, input length, distinct page keys) of each request, in order
        (an unsampled read only: every key kept)."""
        i = 0
        for keys, _, lens in self.key_chunks():
            at = 0
            for ln in lens.tolist():
                yield self.line[i], self.seq[i], self.req_hash[i], self.input_len[i], keys[at:at + ln]
                at += ln
                i += 1

    def index(self):
        """live_curves.TraceIndex of the requests (sampled: of the kept keys, marked so)."""
        import numpy as np

        from tierdiag.diagnose.run import live_curves

        chunks = self.chunks
        if (chunks and not self.sampled and all(isinstance(c, _HashIds) for c in chunks)
                and len({c.per_block for c in chunks}) == 1):
            # Every chunk plain hash_ids lines, unsampled: the pages' ids from the hash ids
            # (live_curves.block_ids), the keys never made (issue 41: ~1/3 of the read-ahead and
            # index's CPU on the conversation trace).
            self.chunks = []
            cat = np.concatenate
            index = live_curves.TraceIndex.of_blocks(np.frombuffer(self.seq, dtype=np.int64),
                                                     cat([c.hids for c in chunks]), cat([c.blocks for c in chunks]),
                                                     cat([c.lens for c in chunks]), chunks[0].per_block,
                                                     np.frombuffer(self.arrival, dtype=np.int64),
                                                     np.frombuffer(self.pred, dtype=np.int32))
            del chunks
            index.lines_are(np.frombuffer(self.line, dtype=np.int32), (),
                            np.frombuffer(self.input_len, dtype=np.int32),
                            hashes=np.frombuffer(self.req_hash, dtype=np.int64))
            return index
        del chunks
        self.key_chunks()
        lens = np.concatenate([c[2] for c in self.chunks]) if self.chunks else np.zeros(0, dtype=np.int64)
        looks = None
        if self.sampled:  # a request's looked-up keys are its first kept ones: how many
            looks = (np.concatenate([_segment_sums(c[1], c[2]) for c in self.chunks]) if self.chunks
                     else np.zeros(0, dtype=np.int64))
        keys = [c[0] for c in self.chunks]
        self.chunks = []  # handed over: the index holds the keys from here on
        # Their dense ids made in one pass over them (live_curves.dense_ids: a hash table in C, not a
        # sort of the distinct keys and a search of every key in them; issue 41).
        flat = np.empty(sum(len(k) for k in keys), dtype=np.int64)
        at = 0
        keys.reverse()
        while keys:  # each chunk let go once copied: the keys are held once, not twice
            k = keys.pop()
            flat[at:at + len(k)] = k
            at += len(k)
        del keys
        index = live_curves.TraceIndex.of_flat(np.frombuffer(self.seq, dtype=np.int64), flat, lens,
                                               np.frombuffer(self.arrival, dtype=np.int64),
                                               np.frombuffer(self.pred, dtype=np.int32), consume=True)
        index.lines_are(np.frombuffer(self.line, dtype=np.int32), (),
                        np.frombuffer(self.input_len, dtype=np.int32),
                        hashes=np.frombuffer(self.req_hash, dtype=np.int64))
        if looks is not None:
            index.sampled(looks, np.frombuffer(self.full, dtype=np.int32), self.keep, self.rate, self.touches)
        return index


class _ReadAhead:
    """The trace's pages read on a thread of their own while the run is recorded: the writer
    process (app/writer_child.py) starts it once the store is open, so that the close, which the
    replay waits for, does not read the trace again (~35 % of the curves' time on the
    conversation trace, issue 41). Used by compute_size_curves only where it is the file the run
    names, unchanged since it was read (size, mtime, inode), at the same page and block sizes;
    else that reads the trace itself, as it always did. A trace whose touches are more than a
    pass keeps unsampled (MAX_TOUCHES: ~78k synth requests) keeps only the sample of its keys
    (`_Pages`), and its pass is fed sampled; the close uses it where the run's rate is the
    trace's (every request finished), else samples the trace itself, reading it again (issue 41:
    at 200k requests the close walked the whole sampled pass, 11.9 s)."""

    def __init__(self, path: str, sha: str | None, page: int, block: int, config: dict | None = None):
        import queue
        import threading

        self.key = (path, sha or "", page, block)
        self.config = dict(config or {})
        self.pages: _Pages | None = _Pages(page)  # the trace's pages as read (None: given up)
        self.index = None  # the trace's requests and keys as the pass needs them, once read (live_curves.TraceIndex)
        self.live = None  # the pass fed the run's rows as they come (live_curves.py), once the trace is read
        self.live_error: BaseException | None = None  # what stopped it: the close walks the pass itself
        self._rows: queue.SimpleQueue = queue.SimpleQueue()  # the requests' columns handed to `rows`; None: the end
        self._live_thread: threading.Thread | None = None
        self._feeding = True  # False once no pass will take the rows: `rows` keeps none of them
        self.changed = False  # the file's digest is not the run's
        self.error: CurvesUnavailable | None = None  # what reading it said (the lines before it are kept)
        self.stat = None
        # What the two threads import, imported here on the caller's thread (an import on them
        # raced the main thread's for CPython's module locks: tests/reliability/test_thread_imports.py)
        import tierdiag.diagnose.run.live_curves  # noqa: F401
        import tierdiag.trace.reader  # noqa: F401

        self._thread = threading.Thread(target=self._read, name="tierdiag-trace-pages", daemon=True)
        self._thread.start()

    @staticmethod
    def _stat(path: str):
        import os

        st = os.stat(path)
        return st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev

    def _read(self) -> None:
        from tierdiag.errors import TierdiagError
        from tierdiag.trace.reader import trace_sha256

        path, sha, page, block = self.key
        try:
            self.stat = self._stat(path)
            if sha and trace_sha256(path) != sha:
                self.changed = True
                self._stop_feeding()
                return
            pages = self.pages
            try:
                import time

                from tierdiag.diagnose.run.live_curves import release_freed_heap
                from tierdiag.trace.reader import read_trace

                # The requests as read, their keys made a chunk at a time (`_Pages.add_request`):
                # what `_trace_pages` yields them one at a time for the close. The heap freed
                # meanwhile (each chunk's requests, the keys a resample drops, the other threads')
                # handed back at most every TRIM_EVERY_S, looked at once a chunk (`_trim_due`).
                trimmed = time.monotonic()
                n = 0
                for req in read_trace(path, block_size=block, skip_bad=True):
                    pages.add_request(req, block)
                    n += 1
                    if n % _TRIM_LOOK == 0 and _trim_due(n, trimmed):  # (the look's test first: no call a request)
                        release_freed_heap()
                        trimmed = time.monotonic()
            finally:
                pages.finish()  # the lines before a failure are kept (unsampled: the close reads them)
        except TierdiagError as exc:
            self.error = CurvesUnavailable(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        except Exception:  # noqa: BLE001 - not usable: the close reads the trace itself, and says what fails there
            self.stat = None
        if self.stat is None or self.error is not None or self.changed:
            self._stop_feeding()
            return
        import threading

        # Its own thread: this one has read the trace and ends (what `result` waits for first).
        self._live_thread = threading.Thread(target=self._feed_live, args=(page,), name="tierdiag-live-curves",
                                             daemon=True)
        self._live_thread.start()

    def _feed_live(self, page: int) -> None:
        """The pass fed the rows handed to `rows` as they come, up to each watermark, until the
        end (None) is handed: then the rest (live_curves.py). A failure stops it, said nowhere:
        the close then walks the whole pass itself, as where nothing was fed."""
        import time

        from tierdiag.diagnose.run import live_curves

        try:
            import numpy as np

            pages = self.pages
            seqs = np.frombuffer(pages.seq, dtype=np.int64)
            if (seqs[1:] <= seqs[:-1]).any():
                raise ValueError("the trace's lines are out of order")  # the close says which
            scale = float(self.config.get("time_scale") or 1.0)
            arrivals = self.config.get("arrivals")
            closed = arrivals == "closed" or (arrivals is None and pages.sessions)
            # The keys handed to the index (what the close reads from here on), none kept twice.
            self.pages = None
            # The trace's read is done and its parse state freed (the ids seen, their lines, the
            # hash ids' links: ~130 MB at 1M synth requests): handed back before the index's build,
            # whose temporaries glibc would otherwise put on top of it (issue 41's 1M row: the
            # writer's early peak; measured on the read alone, the build's peak 520 -> 421 MiB).
            live_curves.release_freed_heap()
            index = pages.index()
            index.arrival_ns = live_curves.scaled_arrivals(pages.arrival, scale)
            del pages
            self.index = index
            live = live_curves.LivePass(index, page, all_ranks=int(self.config.get("dp") or 1) > 1, closed=closed)
            self.live = live
            # The heap freed since (the trace's read, the index's temporaries, each walk's and the
            # writes' on other threads) handed back, then again at most every TRIM_EVERY_S.
            live_curves.release_freed_heap()
            trimmed = time.monotonic()
            while True:
                got = self._rows.get()
                if got is None:
                    live.advance(None)
                    live.done()
                    live_curves.release_freed_heap()  # before the close computes beside what is kept
                    return
                live.add_rows(*live_curves.rows_of(index, got))
                live.advance(live.watermark())
                if time.monotonic() - trimmed >= TRIM_EVERY_S:
                    live_curves.release_freed_heap()
                    trimmed = time.monotonic()
        except Exception as exc:  # noqa: BLE001 - the close walks the pass itself (module doc of live_curves)
            self.live, self.live_error = None, exc
            self._stop_feeding()

    def usable_index(self, touches: int):
        """The index read ahead, where it is the one the close's pass needs: unsampled where the
        run's `touches` are within the budget, else sampled at the rate of exactly those touches
        (every request of the trace finished); None otherwise."""
        index = self.index
        if index is None:
            return None
        if _over_budget(touches):
            return index if index.keep is not None and index.touches == touches else None
        return index if index.keep is None else None

    def lines(self):
        """(line, seq, req_id, input length, keys) of each line read, where every key was kept
        and no index took them; else None (the close reads the trace itself)."""
        pages = self.pages
        if pages is None or pages.sampled:
            return None
        return pages.lines()

    def _stop_feeding(self) -> None:
        """No pass takes the rows: what was handed is let go, and nothing more is kept."""
        import queue

        self._feeding = False
        while True:
            try:
                self._rows.get_nowait()
            except queue.Empty:
                return

    def rows(self, taken: dict | None) -> None:
        """The rows the store's writer took (RunWriter.take's Arrow columns by table): the
        requests' go to the pass fed while recording. None: the run is being closed and no row
        comes after: the pass walks the rest now, while the writer commits the last rows, rather
        than once the close asks for the curves (`result`; issue 41)."""
        if taken is None:
            if self._feeding:
                self._rows.put(None)
            return
        requests = taken.get("requests")
        if requests and self._feeding:
            self._rows.put(_pass_columns(requests))

    def result(self, path: str, sha: str | None, page: int, block: int) -> "_ReadAhead | None":
        self._rows.put(None)  # every row is committed: the pass walks the rest (if not told already)
        self._thread.join()
        if self._live_thread is not None:
            self._live_thread.join()
        if self.key != (path, sha or "", page, block) or self.stat is None:
            return None
        try:
            return self if self._stat(path) == self.stat else None
        except OSError:
            return None


def _pass_columns(requests: dict) -> dict:
    """What the read-ahead keeps of a batch of request rows for its pass (`_ReadAhead.rows`): the
    columns live_curves.rows_of reads (ROWS_OF_COLUMNS), each a copy of its own. Not the batch:
    the batches handed over while the trace is still read wait for the pass (it starts once the
    read is done), and each column the writer took is a view into its hand-over, an int column
    into the block of all the table's ints, a text column into the frame the engine sent (every
    table's rows: store/frames.py `loads`), so one column kept held all of them: the writer's
    early climb at 1M requests, ~250-300 MiB of rows held until the read was done (issue 41).
    Where the batch has none of those columns, its first (rows_of counts the rows by it)."""
    from tierdiag.diagnose.run.live_curves import ROWS_OF_COLUMNS

    kept = {name: _own(requests[name]) for name in ROWS_OF_COLUMNS if name in requests}
    if not kept:
        name = next(iter(requests))
        kept[name] = _own(requests[name])
    return kept


def _own(values):
    """`values` (a column RunWriter.take made) in memory of its own: an Arrow array (chunked or
    not) or a numpy array copied, anything else (Python values) as it is."""
    import numpy as np
    import pyarrow as pa

    if isinstance(values, pa.Array):
        return pa.concat_arrays([values])
    if isinstance(values, pa.ChunkedArray):
        return pa.chunked_array([pa.concat_arrays([c]) for c in values.chunks], type=values.type)
    if isinstance(values, np.ndarray):
        return values.copy()
    return values


# The live pass hands the writer process's freed heap back (live_curves.release_freed_heap) at
# most this often: each call walks glibc's free lists (~1-10 ms), the rows come every ~0.1-1 s.
TRIM_EVERY_S = 1.0
# ... and the trace's read (`_ReadAhead._read`) looks whether one is due every this many requests.
_TRIM_LOOK = 4096


def _trim_due(read: int, trimmed: float) -> bool:
    """Whether the read-ahead hands the freed heap back now: `read` requests read so far, the
    last hand-back at `trimmed` (time.monotonic); looked at every _TRIM_LOOK requests."""
    import time

    return read % _TRIM_LOOK == 0 and time.monotonic() - trimmed >= TRIM_EVERY_S

_READ_AHEAD: list[_ReadAhead] = []  # at most one: the run this process is recording


def read_ahead(trace_path: str, trace_sha256: str | None, config: dict):
    """Start reading the trace's pages for the curves of the run being recorded (the writer
    process calls this once the store is open, module doc of _ReadAhead), then the pass fed the
    run's rows as they come: returns what to hand each batch of rows the writer takes
    (`_ReadAhead.rows`, through `_rows_to_read_ahead`), or None. A config the pass could not use
    starts nothing: the close then reads the trace, and says why not there."""
    import os

    try:
        page = _sizes(config)[0]
        block = int(config.get("block_size") or 512)
    except Exception:  # noqa: BLE001 - compute_size_curves decides what the config means, at the close
        return None
    if trace_path and os.path.isfile(trace_path):
        from tierdiag.store.duckdb_core import purge_from_now

        purge_from_now()  # the writes' freed DuckDB memory handed back through the run, not at its close
        ahead = _ReadAhead(trace_path, trace_sha256, page, block, config)
        _READ_AHEAD[:] = [ahead]
        return _rows_to_read_ahead
    return None


def _rows_to_read_ahead(taken: dict | None) -> None:
    """`_ReadAhead.rows` of the read-ahead being recorded, while it is there: what the writer
    hands each batch of rows (store/writer_serve.py keeps it to the process's exit). Not the
    bound method, which would hold the read-ahead, its index and its pass's results through the
    close's sections after the curves took them (`_taken_ahead`; issue 41: ~100 MB of a
    1M-request close's sections, the index's per-request columns and the walk's depths); once
    taken there is nothing to hand (the close told it the end itself: `result`)."""
    for ahead in _READ_AHEAD:
        ahead.rows(taken)


def _taken_ahead(path: str, sha: str | None, page: int, block: int) -> _ReadAhead | None:
    """The read-ahead of this trace, once (its memory goes with the close), if it can be used."""
    if not _READ_AHEAD:
        return None
    ahead = _READ_AHEAD.pop()
    return ahead.result(path, sha, page, block)


# Touches built a bounded number at a time: the temporaries of a chunk (~10 arrays of its touches)
# stay small beside the pass's own arrays.
_CHUNK_TOUCHES = 1 << 21


class _Flat:
    """Arrays appended one after another, held as a few large ones: a million requests' keys
    without a million small arrays (~100 bytes of header each; issue 41)."""

    _BATCH = 4096  # small arrays joined into one at a time

    def __init__(self, dtype):
        self.dtype = dtype
        self.parts: list = []
        self.pending: list = []

    def add(self, a) -> None:
        self.pending.append(a)
        if len(self.pending) >= self._BATCH:
            self._join()

    def _join(self) -> None:
        import numpy as np

        if self.pending:
            self.parts.append(np.concatenate(self.pending).astype(self.dtype, copy=False))
            self.pending = []

    def array(self):
        import numpy as np

        self._join()
        out = np.concatenate(self.parts).astype(self.dtype, copy=False) if self.parts else np.zeros(0, self.dtype)
        self.parts = []
        return out


class _SeqSet:
    """`seq in wanted` over the rows' seqs (ascending): a bisect of their list, not a set of them."""

    def __init__(self, seqs: list[int]):
        self.seqs = seqs

    def __contains__(self, seq: int) -> bool:
        i = bisect_right(self.seqs, seq)
        return i > 0 and self.seqs[i - 1] == seq


def _replay_touches(rows, keys: dict, looked: dict | None, page: int, keep):
    """`_touches` of CurveRequest rows (by seq) and their keys (and marks) by seq: the tests'
    form of it."""
    import numpy as np

    n = len(rows)
    columns = list(zip(*rows)) if n else [()] * len(CurveColumns._fields)
    cols = CurveColumns(*(req_hashes(columns[i]) if i == 1 else np.array(columns[i], dtype=np.int64) for i in range(7)))
    lens = np.array([len(keys[r.seq]) for r in rows], dtype=np.int64)
    flat = np.concatenate([keys[r.seq] for r in rows]).astype(np.int64, copy=False) if n else np.zeros(0, np.int64)
    marks = None
    if looked is not None:
        marks = (np.concatenate([looked[r.seq] for r in rows]).astype(bool, copy=False) if n
                 else np.zeros(0, dtype=bool))
    return _touches(cols, flat, lens, marks, page, keep)


def _touches(cols: CurveColumns, flat, lens, marks, page: int, keep):
    """The pass's touches, flat, in the replay's order: two groups a finished request (module
    doc), events ordered by (time, finish before a schedule at the same time, seq). With
    `_pass_depths`, the reference of the close's pass over an index (live_curves `whole_pass`):
    the close no longer makes these arrays (~70 bytes a touch; issue 41, session 37).

    A schedule group is the request's keys deepest first, those it looks up marked; a finish
    group its fresh output keys (negative, numbered in event order from -1 down, each group's
    in ascending order) then its keys deepest first, none marked. `flat`: every row's keys end
    to end, rows in order (`lens` of each). With `marks` (a sampled pass) the keys are the kept
    ones, `marks` marks them, and only the kept output keys stay
    (`keep`). Returns (keys, looked up, touches an event, rank an event).

    Built with array operations, as copies of contiguous runs: each request's keys (and marks)
    reversed once, the output keys laid out in event order, and every group one or two runs of
    those (a group at a time in Python was ~30 % of the conversation trace's curves, and a touch
    at a time in numpy half of what remained; issue 41). tests/diagnose/test_size_curves.py
    checks them against the group-at-a-time reference and an LRU simulation."""
    import numpy as np

    n = len(cols.seq)
    seq, rank, inp, out = cols.seq, cols.rank, cols.input_tokens, cols.output_tokens
    sampled = marks is not None
    total = len(flat)
    off = np.zeros(n, dtype=np.int64)
    np.cumsum(lens[:-1], out=off[1:])
    if not sampled:
        look = np.minimum(np.maximum((inp - 1) // page, 0), lens)
        # reversed, a request's first `look` keys are its last `look`
        marks = np.arange(total, dtype=np.int64) >= np.repeat(off + lens - look, lens)
    rev = np.repeat(2 * off + lens - 1, lens) - np.arange(total, dtype=np.int64)  # each request's keys backwards
    flat = flat[rev]
    if sampled:
        marks = marks[rev]
    del rev
    outp = np.maximum((inp + out) // page - inp // page, 0)
    t = np.concatenate([cols.sched_ns, cols.fin_ns])  # schedules, then finishes
    sched = np.r_[np.ones(n, dtype=np.int64), np.zeros(n, dtype=np.int64)]
    order = np.lexsort((np.r_[seq, seq], sched, t))  # by time, then finish (0) first, then seq
    del t, seq
    req = np.r_[np.arange(n, dtype=np.int64), np.arange(n, dtype=np.int64)][order]
    is_sched = sched[order] == 1
    del order, sched
    events = len(req)
    outs = np.where(is_sched, 0, outp[req])  # fresh output keys of each event
    before = np.cumsum(outs) - outs
    # Every fresh key in event order, each event's ascending: -(before + outs) ... -(before + 1).
    fresh = np.arange(int(outs.sum()), dtype=np.int64) - np.repeat(2 * before + outs, outs)
    if keep is not None and len(fresh):
        kept = keep(fresh)
        outs = np.bincount(np.repeat(np.arange(events, dtype=np.int64), outs)[kept], minlength=events).astype(np.int64)
        fresh = fresh[kept]
        del kept
        before = np.cumsum(outs) - outs
    del outp
    source = np.concatenate([flat, fresh])
    marks = np.concatenate([marks, np.zeros(len(fresh), dtype=bool)])
    del flat, fresh
    # Two runs an event: its fresh keys (none for a schedule), then its request's keys.
    run_from = np.stack([total + before, off[req]], axis=1).ravel()
    run_len = np.stack([outs, lens[req]], axis=1).ravel()
    run_looks = np.stack([np.zeros(events, dtype=bool), is_sched], axis=1).ravel()
    run_to = np.cumsum(run_len) - run_len
    count = outs + lens[req]
    touches = int(count.sum())
    event_rank = rank[req]
    # The per-event columns the runs were made of, let go before the touches' arrays (the pass's
    # largest: ~180 MB at the budget's 20M touches) are made beside the runs (issue 41: a close
    # that walks the whole sampled pass itself, an interrupted 1M-request run's).
    del req, is_sched, outs, before, off
    tk = np.empty(touches, dtype=np.int64)
    tq = np.empty(touches, dtype=bool)
    r0, ends = 0, run_to + run_len
    while r0 < len(run_len):
        lo = int(run_to[r0])
        r1 = max(int(np.searchsorted(ends, lo + _CHUNK_TOUCHES, side="right")), r0 + 1)
        hi = int(ends[r1 - 1])
        ln = run_len[r0:r1]
        at = np.repeat(run_from[r0:r1] - run_to[r0:r1], ln)
        at += np.arange(lo, hi, dtype=np.int64)
        tk[lo:hi] = source[at]
        np.logical_and(marks[at], np.repeat(run_looks[r0:r1], ln), out=tq[lo:hi])
        r0 = r1
    return tk, tq, count, event_rank


def _pass_depths(tk, tq, per_event, event_rank):
    """(rank of each lookup, its depth on its rank, its depth over all ranks), lookups in order."""
    import numpy as np

    ranks = np.unique(event_rank).tolist()
    if len(ranks) <= 1:
        lookup_rank = np.full(int(np.count_nonzero(tq)), ranks[0] if ranks else 0, dtype=np.int64)
        # The keys handed over (this frame lets go of them): _flat_depths writes over them.
        keys = [tk]
        del tk
        d_rank = _flat_depths(keys.pop(), tq, per_event, consume=True).astype(np.int64, copy=False)
        return lookup_rank, d_rank, d_rank  # one rank: the same touches
    touch_rank = np.repeat(event_rank, per_event)
    lookup_rank = touch_rank[tq]
    d_rank = np.zeros(len(lookup_rank), dtype=np.int64)
    for r in ranks:
        sel = touch_rank == r
        d_rank[lookup_rank == r] = _flat_depths(tk[sel], tq[sel], per_event[event_rank == r], consume=True)
    keys = [tk]  # the last use: handed over, written over
    del tk
    return lookup_rank, d_rank, _flat_depths(keys.pop(), tq, per_event, consume=True)


def _curve(tier: str, run_size: int, held: str, need: np.ndarray, page: int, found: int,
           weight: float = 1.0, *, presorted: bool = False) -> SizeCurve:
    """The step function of the sizes at which each looked-up page is found (never: not at all);
    each found page counts `weight` pages (a sampled pass: 1 / its rate, rounded to pages).
    `presorted`: `need` is in ascending order already. `_curve_of` of their distinct sizes."""
    import numpy as np

    never = np.iinfo(np.int64).max
    sizes = need[need != never]
    if not presorted:
        sizes = np.sort(sizes)
    # Each distinct size at its first place (np.unique of the sorted sizes, without sorting again).
    idx = np.flatnonzero(np.r_[True, sizes[1:] != sizes[:-1]]) if len(sizes) else np.zeros(0, dtype=np.int64)
    return _curve_of(tier, run_size, held, sizes[idx], np.diff(np.r_[idx, len(sizes)]), page, found, weight)


def _curve_of(tier: str, run_size: int, held: str, sizes: np.ndarray, counts: np.ndarray, page: int, found: int,
              weight: float = 1.0) -> SizeCurve:
    """`_curve` of the looked-up pages found at some size, given as their distinct sizes
    (ascending) and how many are found from each: the lookups' depths counted once
    (`_tally`), not an array of every lookup sorted for each curve (issue 41: the close)."""
    import numpy as np

    n = int(counts.sum())
    total = int(round(n * weight)) * page
    steps: list[tuple[int, int]] = []
    ends = np.cumsum(counts)  # lookups found at each size and below
    if len(sizes):
        uniq = sizes
        cum = ends * page if weight == 1.0 else np.rint(ends * weight).astype(np.int64) * page
        if len(uniq) > CURVE_POINTS:
            # The first step into each 1/CURVE_POINTS of the plateau, and the last.
            b = cum * CURVE_POINTS // total
            keep = np.r_[True, b[1:] > b[:-1]]
            keep[-1] = True
            uniq, cum = uniq[keep], cum[keep]
        steps = list(zip(uniq.astype(np.int64, copy=False).tolist(), cum.astype(np.int64, copy=False).tolist()))
    knee = None
    # What the tier adds beyond its size 0 (the tiers above it find the rest): the lookups found
    # at a positive size, in order; the knee is the KNEE_SHARE-th of them (nearest rank).
    zero = int(counts[0]) if len(sizes) and sizes[0] == 0 else 0
    grows = n - zero
    if grows:
        k = zero + max(math.ceil(KNEE_SHARE * grows) - 1, 0)
        knee = int(sizes[int(np.searchsorted(ends, k, side="right"))])
    # `steps` are Python ints already (`tolist` of int64 arrays, as int() made them): the tuple of
    # them as they are, not each pair made again (~0.8 ms of the close's serial tail on the
    # conversation trace's 5,269 steps; issue 41, session 37).
    return SizeCurve(tier, run_size, held, tuple(steps), total, knee, int(found))


def _tally(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct values ascending, how many of each) of non-negative integers: a count array
    where their range is not much more than their number, else a sort."""
    import numpy as np

    if len(values) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    top = int(values.max())
    if top < 4 * len(values) + 1024:
        counts = np.bincount(values, minlength=top + 1)
        at = np.flatnonzero(counts)
        return at.astype(np.int64), counts[at].astype(np.int64)
    uniq, counts = np.unique(values, return_counts=True)
    return uniq.astype(np.int64), counts.astype(np.int64)


def _tally_sorted(values: np.ndarray, never: int) -> tuple[np.ndarray, np.ndarray]:
    """`_tally` of the `values` other than `never` (non-negative integers), sorting `values` in
    place (the caller's, let go after): no filtered copy nor np.unique's sorted one beside it."""
    import numpy as np

    values.sort()
    n = int(np.searchsorted(values, never, side="left"))
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    head = values[:n]
    at = np.flatnonzero(head[1:] != head[:-1]) + 1
    starts = np.r_[0, at]
    return head[starts].astype(np.int64), np.diff(np.r_[starts, n]).astype(np.int64)


def _merged(values: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`values` (non-decreasing: a monotone size of ascending depths) with `counts`, equal ones
    made one."""
    import numpy as np

    if len(values) == 0:
        return values, counts
    at = np.flatnonzero(np.r_[True, values[1:] != values[:-1]])
    return values[at], np.add.reduceat(counts, at)


def knee_words(c: SizeCurve, input_tokens: int) -> str:
    """"host: knee at 40_960 tokens (90 % of the 1.2 M an unbounded pool finds)", numbers named."""
    from tierdiag.units import fmt_pct, fmt_tokens

    if c.knee_tokens is None:
        return f"{c.tier}: no page was looked up again, at any size"
    return (f"{c.tier}: knee at {c.knee_tokens:_} tokens, finding {fmt_tokens(c.reused_at(c.knee_tokens))} "
            f"({fmt_pct(share(c.reused_at(c.knee_tokens), input_tokens))} of input; an unbounded one finds "
            f"{fmt_tokens(c.unbounded_reused_tokens)})")


__all__ = ["SizeCurve", "SizeCurves", "KNEE_SHARE", "TIERS", "stack_depths", "size_curves",
           "compute_size_curves", "CurvesUnavailable", "knee_words", "MODEL"]
