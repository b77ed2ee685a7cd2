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

from typing import NamedTuple

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


class MissTracker:
    """A scheduler's three facts per request (module doc). One per rank: a rank's batches are its own."""

    def __init__(self, ps: int) -> None:
        self.ps = ps  # page size: a request's keys are its input's full pages (then, at finish, output's)
        self._at_arrival: dict[int, int] = {}
        self._shared: dict[int, int] = {}
        self._batch_ns: int | None = None
        self._batch_keys: set = set()
        self._read: dict[int, list[tuple[int, int]]] = {}  # seq -> page ranges its prefetches inserted
        self._prefetch_lost: dict[int, int] = {}

    def prefetched(self, seq: int, first_page: int, end_page: int) -> None:
        """Its own prefetch inserted input pages [first_page, end_page) into the tree (host)."""
        if end_page > first_page:
            self._read.setdefault(seq, []).append((first_page, end_page))

    def matched(self, seq: int, matched_pages: int) -> None:
        """At its (first) scheduling its prefix matched `matched_pages` pages on device and host:
        every page its prefetches inserted past them left the tree before it was scheduled (a
        radix path: nothing past the first page missing is matched)."""
        ranges = self._read.pop(seq, ())
        if seq in self._prefetch_lost:
            return  # a retracted request admitted again keeps its first admission's fact
        lost, end = 0, max(matched_pages, 0)
        for lo, hi in sorted(ranges):
            lo = max(lo, end)
            if hi > lo:
                lost += hi - lo
                end = hi
        self._prefetch_lost[seq] = lost

    def arrived(self, req, tree) -> None:
        device, host = tree.peek(req.keys[:req.max_match_pages])
        self._at_arrival[req.seq] = device + host

    def scheduled(self, req, now: int, first_page: int, end_page: int) -> None:
        """`req` joins the batch formed at `now`, its first chunk computing pages [first_page,
        end_page). Every page it will compute (its later chunks too: a chunked request does not
        match again) that a request ahead of it in this batch computes is shared in the batch."""
        if now != self._batch_ns:
            self._batch_ns, self._batch_keys = now, set()
        batch = self._batch_keys
        if batch:  # the batch's first request shares nothing; the others count in C (a page a key)
            shared = sum(map(batch.__contains__, req.keys[first_page:req.input_len // self.ps]))
            if shared:
                self._shared[req.seq] = shared
        batch.update(req.keys[first_page:end_page])

    def take(self, seq: int) -> MissFacts:
        self._read.pop(seq, None)
        return MissFacts(self._at_arrival.pop(seq, 0), self._shared.pop(seq, 0), self._prefetch_lost.pop(seq, 0))


def _routing_tokens(r: dict) -> int:
    """causes.routing_tokens, over the record's columns (the engine does not import diagnose)."""
    rank, best = r.get("dp_rank"), r.get("best_rank")
    if rank is None or best is None or best == rank:
        return 0
    gap = sum(int(r.get(k) or 0) for k in ("best_rank_device_tokens", "best_rank_host_tokens")) - sum(
        int(r.get(k) or 0) for k in ("arrival_device_tokens", "arrival_host_tokens", "storage_match_tokens"))
    return min(int(r.get("recomputed_tokens") or 0), max(gap, 0))


def miss_split(r: dict, facts: MissFacts, ps: int, storage_tier: bool) -> dict[str, int]:
    """reason -> tokens for one finished record `r` (a dict of its columns); sums to computed_tokens."""
    out = dict.fromkeys(MISS_REASONS, 0)
    computed = max(int(r.get("computed_tokens") or 0), 0)
    left = computed
    recomputed = min(int(r.get("recomputed_tokens") or 0), computed)

    def give(reason: str, tokens: int, cap: int) -> int:
        nonlocal left
        n = max(min(tokens, cap, left), 0)
        out[reason] += n
        left -= n
        return n

    rec_left = recomputed
    if r.get("loadback_skipped_reason"):
        rec_left -= give("loadback_skipped", int(r.get("loadback_skipped_tokens") or 0), rec_left)
    # Read by its own prefetch, then evicted from host while it queued (not a skipped prefetch:
    # storage held them and the read happened)
    lost = give("prefetch_lost", max(facts.prefetch_lost_pages, 0) * ps, rec_left)
    rec_left -= lost
    if r.get("storage_skipped_reason"):
        # the storage match neither used nor read-then-lost: what the skip itself cost
        unused = int(r.get("storage_match_tokens") or 0) - int(r.get("storage_hit_tokens") or 0) - lost
        reason = _STORAGE_REASON.get(r["storage_skipped_reason"], "prefetch_declined")
        rec_left -= give(reason, unused, rec_left)
    rec_left -= give("routed_elsewhere", _routing_tokens(r), rec_left)
    # Lost while queued: its own tree held it at arrival, the match at scheduling did not find it.
    at_sched = int(r.get("device_hit_tokens") or 0) + int(r.get("host_match_tokens") or 0)
    rec_left -= give("lost_while_queued", facts.arrival_pages * ps - at_sched, rec_left)
    give("beyond_storage" if storage_tier else "evicted_before_reuse", rec_left, rec_left)
    give("shared_in_batch", facts.shared_pages * ps, left)
    give("never_cached", left, left)
    return out
