"""Miss reasons: why each token a request computed was not reused (DESIGN §7).

Every computed token of a finished request gets exactly one reason from a fixed list, so the
reasons sum to `computed_tokens`. The scheduler knows three facts only it can see, all taken here:

  - at arrival, how much of the prefix its own tree held on device and host (`RadixTree.peek`, no
    side effect: the match that decides is the one at scheduling, after the wait);
  - at scheduling, which of the pages it will compute another request admitted into the same
    prefill batch computes too. The first request's pages enter the tree only when the batch ends
    (cache_unfinished_req / cache_finished_req), so under fcfs every request of a batch that shares
    a prefix computes it, exactly as SGLang does (`Scheduler.get_new_batch_prefill`: the prefix
    match is taken before the batch runs; lpm's in-batch prefix caching is what avoids it);
  - at scheduling, which of the pages its own storage prefetch read into host (the pages
    `_finish_prefetch` inserted) are gone from the tree: evicted from host before it was
    scheduled. SGLang 0.5.23 inserts a finished prefetch's pages unprotected
    (`UnifiedRadixCache._handle_prefetch_result` -> `insert_host`, from the storage drain of the
    pass after the read), so host pressure while the request still queues deletes them; its
    re-query (`Scheduler._prefetch_after_device_hit_loss`) compares the match with the one at
    its last query, taken before those pages, so it does not fire and they are computed again.

The rest comes from the record's own columns, in this order (each reason takes at most what is
left, so none is counted twice)::

    computed = recomputed (once cached) + new (never cached here)
    recomputed: loadback_skipped    a host hit whose load-back was skipped (below_threshold, device_full)
                prefetch_lost       matched in storage and read into host by its own prefetch, then
                                    evicted from host before the request was scheduled
                prefetch_revoked    matched in storage, the prefetch started and was cut short
                                    (prefetch_incomplete: SGLang's revoke/terminate), not read
                prefetch_declined   matched in storage, no prefetch taken (below_threshold, host_full,
                                    rate_limited, not_backed_up), not read
                routed_elsewhere    another data-parallel rank held it at arrival (causes.routing_tokens)
                lost_while_queued   on device or host at arrival, in no tier at scheduling
                beyond_storage      left every tier before arrival, a storage tier existed but did not hold it
                evicted_before_reuse  left every tier before arrival, no storage tier
    new:        shared_in_batch     computed by another request of the same prefill batch
                never_cached        first sight of these pages (here)

A demotion device -> host is never a miss: those tokens load back.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from tierdiag.engine.request import Req
from tierdiag.engine.tree import RadixTree
from tierdiag.native import cplane

# The reasons, in the order of the columns (`miss_<reason>_tokens` on `requests`).
MISS_REASONS: tuple[str, ...] = (
    "never_cached", "evicted_before_reuse", "lost_while_queued", "loadback_skipped", "prefetch_declined",
    "prefetch_revoked", "shared_in_batch", "routed_elsewhere", "beyond_storage", "prefetch_lost")
MISS_COLUMNS: tuple[str, ...] = tuple(f"miss_{r}_tokens" for r in MISS_REASONS)
NO_MISSES: tuple = (None,) * len(MISS_COLUMNS)  # a rejected request's columns

# storage_skipped_reason -> its miss reason (a prefetch cut short is revoked; one never taken, declined).
_STORAGE_REASON = {"prefetch_incomplete": "prefetch_revoked"}


class MissFacts(NamedTuple):
    arrival_pages: int  # device + host pages of its prefix its own tree held at arrival
    shared_pages: int  # pages it computes that another request of its batch computes too
    prefetch_lost_pages: int = 0  # pages its own prefetch read into host, gone from the tree at scheduling


class _BatchPagesPy:
    """A prefill batch's members, each a window of its page keys (the reference of
    _cplane.BatchPages, native/csrc/batch_pages.c, step for step). `keys` a list, a tuple or a
    key run of ints, 0 <= lo, hi <= len(keys) (`_span`).

    Page keys chain (trace/pages.py; the radix tree's `common_pages` reads them so): two
    requests hold the same key only at the same page, with every page before it the same. A
    page is counted when a member's window holds it with the same key; within the pages a
    member and the counted range both cover, the matching ones are a prefix, found by the first
    page, the last, then halving. On chained keys that is exactly what a set of the batch's
    keys counted (the engine's until session 36: a hash and a probe a key of every member,
    ~25 M instructions of a probed conversation replay, issue 41); here a member is a compare
    or two."""

    def __init__(self) -> None:
        self._members: list[tuple[list, int, int]] = []  # (keys[lo:hi], lo, hi)

    def add(self, keys: Any, lo: int, hi: int) -> None:
        """keys[lo:hi] kept as a member computing pages lo..hi-1."""
        if hi > lo:
            self._members.append((list(keys[lo:hi]), lo, hi))

    def count_add(self, keys: Any, lo: int, count_hi: int, add_hi: int) -> int:
        """The pages lo..count_hi-1 of `keys` an earlier member holds with the same key, then
        keys[lo:add_hi] kept as a member."""
        spans = []
        for window, m_lo, m_hi in self._members:
            s = m_lo if m_lo > lo else lo
            e = m_hi if m_hi < count_hi else count_hi
            if s >= e or window[s - m_lo] != keys[s]:
                continue
            if window[e - 1 - m_lo] != keys[e - 1]:  # s matches, e - 1 does not: the last that matches
                yes, no = s, e - 1
                while no - yes > 1:
                    mid = yes + (no - yes) // 2
                    if window[mid - m_lo] == keys[mid]:
                        yes = mid
                    else:
                        no = mid
                e = yes + 1
            spans.append((s, e))
        found = end = 0
        for s, e in sorted(spans):  # their union, by first page
            s = s if s > end else end
            if e > s:
                found += e - s
                end = e
        self.add(keys, lo, add_hi)
        return found

    def clear(self) -> None:
        self._members.clear()

    def __len__(self) -> int:
        """The pages the members hold, together."""
        return sum(hi - lo for _, lo, hi in self._members)


def _batch_pages_c() -> Any:
    return cplane.compiled("BatchPages")()


def _batch_pages_py() -> Any:
    return _BatchPagesPy()


# A batch's members' page keys: the compiled data plane's int64 windows, else the Python
# reference (pair "miss.batch_pages", tests/engine/test_batch_pages.py holds them to the same counts).
new_batch_pages = cplane.choose("miss.batch_pages", _batch_pages_c, _batch_pages_py)


def _span(n: int, lo: int, hi: int) -> tuple[int, int]:
    """[lo, hi) as a slice of a sequence of `n` reads it (negative from the end, clamped to
    0..n), as (lo, hi) with 0 <= lo <= hi <= n."""
    if lo < 0:
        lo = lo + n if lo + n > 0 else 0
    elif lo > n:
        lo = n
    if hi < 0:
        hi = hi + n if hi + n > 0 else 0
    elif hi > n:
        hi = n
    return lo, (hi if hi > lo else lo)


class MissTracker:
    """A scheduler's three facts per request (module doc). One per rank: a rank's batches are its
    own. The facts are kept on the request itself (`Req.miss_*`, native attributes), not in dicts
    by seq: compiled, a dict's set and pop box the seq and call by name (~4k instructions a
    record in all, issue 41 session 22); only the pages a prefetch read wait by seq (`_read`,
    with a storage tier), until the request's first scheduling."""

    def __init__(self, ps: int) -> None:
        self.ps = ps  # page size: a request's keys are its input's full pages (then, at finish, output's)
        # the batch's time (-1: none yet; the engine's times are >= 0). An int and the first
        # request's fields each their own, not Optional and a tuple: compiled, a native compare
        # and stores, where the Optional's compare was generic and the tuple boxed both ints
        # (~2 M instructions of a probed conversation replay, issue 41 session 36)
        self._batch_ns: int = -1
        self._batch_keys: Any = new_batch_pages()  # the batch's members, once a second request joins it
        self._first_keys: Any = None  # the batch's first request's keys (its key run), until a second joins
        self._first_lo = self._first_hi = 0  # its first_page, end_page
        self._read: dict[int, list[tuple[int, int]]] = {}  # seq -> page ranges its prefetches inserted

    def prefetched(self, seq: int, first_page: int, end_page: int) -> None:
        """Its own prefetch inserted input pages [first_page, end_page) into the tree (host)."""
        if end_page > first_page:
            self._read.setdefault(seq, []).append((first_page, end_page))

    def matched(self, req: Req, matched_pages: int) -> None:
        """At its (first) scheduling its prefix matched `matched_pages` pages on device and host:
        every page its prefetches inserted past them left the tree before it was scheduled (a
        radix path: nothing past the first page missing is matched)."""
        ranges = self._read.pop(req.seq, None) if self._read else None
        if req.miss_prefetch_lost >= 0:
            return  # a retracted request admitted again keeps its first admission's fact
        lost = 0
        if ranges:
            end = matched_pages if matched_pages > 0 else 0
            for lo, hi in sorted(ranges):
                lo = max(lo, end)
                if hi > lo:
                    lost += hi - lo
                    end = hi
        req.miss_prefetch_lost = lost

    def arrived(self, req: Req, tree: RadixTree) -> None:
        """Its own tree's prefix on device and host at arrival (a Req and the RadixTree, typed:
        compiled, their attributes and `peek` are native reads and calls, issue 41)."""
        keys: Any = req.keys  # a key run (array("q")) or a list
        limit: int = req.max_match_pages
        # the keys as they are where the bound leaves them whole (peek only reads them): no copy
        device, host = tree.peek(keys if len(keys) <= limit else keys[:limit])
        req.miss_arrival_pages = device + host

    def scheduled(self, req: Req, now: int, first_page: int, end_page: int) -> None:
        """`req` joins the batch formed at `now`, its first chunk computing pages [first_page,
        end_page). Every page it will compute (its later chunks too: a chunked request does not
        match again) that a request ahead of it in this batch computes is shared in the batch.

        The batch's first request shares nothing, and most batches have one request: its pages
        are kept as (keys, first, end) and made a member only when a second request joins (a set
        a batch was ~6 % of a probed Engine.run, issue 41)."""
        if now != self._batch_ns:
            self._batch_ns, self._first_keys = now, req.keys
            self._first_lo, self._first_hi = first_page, end_page
            return
        batch = self._batch_keys
        first_keys: Any = self._first_keys
        if first_keys is not None:
            batch.clear()
            lo, hi = _span(len(first_keys), self._first_lo, self._first_hi)
            batch.add(first_keys, lo, hi)
            self._first_keys = None
        # the others count their pages that a member ahead of them computes (by the key chains:
        # a compare or two a member, new_batch_pages), then join the members: one call
        keys: Any = req.keys  # a key run (array("q")) or a list
        n = len(keys)
        lo, count_hi = _span(n, first_page, req.input_len // self.ps)
        add_hi = _span(n, first_page, end_page)[1]
        shared: int = batch.count_add(keys, lo, count_hi, add_hi)
        if shared:
            req.miss_shared_pages = shared

    def take(self, req: Req) -> MissFacts:
        return MissFacts(*self.take_pages(req))

    def take_pages(self, req: Req) -> tuple[int, int, int]:
        """`take`'s MissFacts as a plain tuple (the record's: a NamedTuple is built by a Python
        function, a frame a request); the request's facts are taken once (reset)."""
        if self._read:
            self._read.pop(req.seq, None)
        lost = req.miss_prefetch_lost
        facts = (req.miss_arrival_pages, req.miss_shared_pages, lost if lost > 0 else 0)
        req.miss_arrival_pages = req.miss_shared_pages = 0
        req.miss_prefetch_lost = -1
        return facts


def _routing_tokens(r: dict) -> int:
    """causes.routing_tokens, over the record's columns (the engine does not import diagnose)."""
    return routing_tokens(r.get("dp_rank"), r.get("best_rank"), _int(r.get("best_rank_device_tokens")),
                          _int(r.get("best_rank_host_tokens")), _int(r.get("arrival_device_tokens")),
                          _int(r.get("arrival_host_tokens")), _int(r.get("storage_match_tokens")),
                          _int(r.get("recomputed_tokens")))


def _int(v: object) -> int:
    return int(v or 0)  # type: ignore[call-overload]


def routing_tokens(rank: int | None, best: int | None, best_device: int, best_host: int, arrival_device: int,
                   arrival_host: int, storage_match: int, recomputed: int) -> int:
    """Recomputed tokens another rank held at arrival beyond what this one found (causes.routing_tokens)."""
    if rank is None or best is None or best == rank:
        return 0
    gap = best_device + best_host - (arrival_device + arrival_host + storage_match)
    gap = gap if gap > 0 else 0
    return recomputed if recomputed < gap else gap


def miss_split(r: dict, facts: MissFacts, ps: int, storage_tier: bool) -> dict[str, int]:
    """reason -> tokens for one finished record `r` (a dict of its columns); sums to computed_tokens."""
    return dict(zip(MISS_REASONS, miss_tokens(
        _int(r.get("computed_tokens")), _int(r.get("recomputed_tokens")), r.get("loadback_skipped_reason"),
        _int(r.get("loadback_skipped_tokens")), r.get("storage_skipped_reason"), _int(r.get("storage_match_tokens")),
        _int(r.get("storage_hit_tokens")), _int(r.get("device_hit_tokens")), _int(r.get("host_match_tokens")),
        _routing_tokens(r), facts.arrival_pages, facts.shared_pages, facts.prefetch_lost_pages, ps, storage_tier)))


def _share(tokens: int, cap: int, left: int) -> int:
    """max(min(tokens, cap, left), 0)."""
    n = tokens if tokens < cap else cap
    n = n if n < left else left
    return n if n > 0 else 0


def miss_tokens(computed_tokens: int, recomputed_tokens: int, loadback_skipped_reason: object,
                loadback_skipped_tokens: int, storage_skipped_reason: object, storage_match_tokens: int,
                storage_hit_tokens: int, device_hit_tokens: int, host_match_tokens: int, routing: int,
                arrival_pages: int, shared_pages: int, prefetch_lost_pages: int, ps: int,
                storage_tier: bool) -> tuple[int, int, int, int, int, int, int, int, int, int]:
    """The miss reasons' tokens in MISS_REASONS' order (module doc; `miss_split` by name), from the
    record's columns as ints (None as 0) and `routing` (routing_tokens). Integers and no dict:
    the record calls it once a finished request, compiled (issue 41)."""
    computed = computed_tokens if computed_tokens > 0 else 0
    left = computed
    rec_left = recomputed_tokens if recomputed_tokens < computed else computed
    # Each reason takes max(min(its tokens, its cap, what is left), 0), in this order (`_share`:
    # the builtins min and max are generic calls from compiled code, ~1k instructions each).
    lb_skipped = 0
    if loadback_skipped_reason:
        lb_skipped = _share(loadback_skipped_tokens, rec_left, left)
        left -= lb_skipped
        rec_left -= lb_skipped
    # Read by its own prefetch, then evicted from host while it queued (not a skipped prefetch:
    # storage held them and the read happened)
    lost = _share(prefetch_lost_pages * ps if prefetch_lost_pages > 0 else 0, rec_left, left)
    left -= lost
    rec_left -= lost
    declined = revoked = 0
    if storage_skipped_reason:
        # the storage match neither used nor read-then-lost: what the skip itself cost
        n = _share(storage_match_tokens - storage_hit_tokens - lost, rec_left, left)
        left -= n
        rec_left -= n
        if storage_skipped_reason in _STORAGE_REASON:  # a prefetch cut short is revoked
            revoked = n
        else:
            declined = n
    routed = _share(routing, rec_left, left)
    left -= routed
    rec_left -= routed
    # Lost while queued: its own tree held it at arrival, the match at scheduling did not find it.
    queued = _share(arrival_pages * ps - (device_hit_tokens + host_match_tokens), rec_left, left)
    left -= queued
    rec_left -= queued
    gone = _share(rec_left, rec_left, left)
    left -= gone
    shared = _share(shared_pages * ps, left, left)
    left -= shared
    never = left if left > 0 else 0
    return (never, 0 if storage_tier else gone, queued, lb_skipped, declined, revoked, shared, routed,
            gone if storage_tier else 0, lost)
