"""Storage prefetch: at arrival, a request's pages past its cached prefix are read from the storage
tier into host slots (Scheduler._prefetch_kvcache, prefetch_from_storage and
check_prefetch_progress; where 0.5.9 and 0.5.23 differ, the rule set's `prefetch_*` fields say
which), under the prefetch policy (best_effort, wait_complete, timeout).
A mixin of the Scheduler, whose state (tree, controller, clock) it works on.
"""

from __future__ import annotations

from typing import Any

from tierdiag.config.names import PrefetchPolicy
from tierdiag.engine.records import RequestRecords
from tierdiag.engine.request import Req
from tierdiag.engine.rules import RuleSet
from tierdiag.engine.tree import RadixTree, _child
from tierdiag.engine.tree_node import KeyRun, TreeMatch, TreeNode
from tierdiag.native import cplane


def prefetch_limit_tokens(rules: RuleSet, host_pages: int, device_pages: int, page_size: int) -> int:
    """Tokens prefetches in flight may hold: 0.8 x (host - device) in 0.5.9
    (HiCacheController.prefetch_rate_limited), 0.5 x host in 0.5.23."""
    return rules.prefetch_room_tokens(host_pages * page_size, device_pages * page_size)


# `prefetch_timeout_base` and `prefetch_timeout_per_ki_token` (both releases' defaults,
# unified_radix_cache.py / hiradix_cache.py `_parse_storage_backend_extra_config`).
PREFETCH_TIMEOUT_BASE_S = 1.0
PREFETCH_TIMEOUT_PER_KI_TOKEN_S = 0.25


def prefetch_timeout_ns(tokens: int) -> int:
    """The `timeout` policy's budget for a prefetch of `tokens`: 1 s + 0.25 s per 1024 tokens."""
    return int((PREFETCH_TIMEOUT_BASE_S + PREFETCH_TIMEOUT_PER_KI_TOKEN_S * tokens / 1024) * 1e9)


class StoragePrefetch(RequestRecords):
    """The Scheduler's storage prefetch (its `tree`, `ctrl`, `cfg`, `rules`, `ps`, `at` and the
    prefetch accounting set up in Scheduler.__init__)."""

    def use_requeries(self, index: Any) -> None:
        """The re-query index (`new_requeries()`: C's RequeryIndex or RequeryIndexPy) and its
        `arm` and `fire` bound once: a call of a method looked up by name at each arm (~101k)
        and pass (~72k on a whole conversation replay with a 50M-token tier) was ~130
        instructions more than a call of the bound one (issue 41, session 39). Set the index
        only here, never `requeries` alone (its bound methods would stay the old index's)."""
        self.requeries = index
        self.rq_arm = index.arm
        self.rq_fire = index.fire

    def _start_prefetch(self, req: Req, now: int) -> None:
        """Scheduler._prefetch_kvcache + prefetch_from_storage, under the rule set's prefetch rules.

        At arrival (and, under 0.5.23, at each re-query): match_prefix; only if the gate node is
        backed up (the root counts; rules.prefetch_gate_on_best_match), protect the host-backed
        anchor (protect_host: no device page is pinned) and query storage for the requested span.

        0.5.9: host room for the whole span first, the non-hits released after the query, revoked
        below prefetch_threshold:

            input pages |-- device --|-- host --|----- requested span (host room reserved) -----|
                                                |-- storage hits --|  (read into host) | released |

        0.5.23 (`_try_alloc_storage_hit`): the query first, host only for the hit (what fits, if
        at least the threshold); a miss, a rate-limited decline or a hit the host cannot take arms
        a re-query (`StoragePrefetchRetries.poll_miss`, run by `_retry_prefetches`).
        """
        tree, ctrl, ps = self.tree, self.ctrl, self.ps
        req.storage_skip_reason = None  # this query's verdict (a re-query replaces the last one)
        # init_next_round_input (match_prefix); a re-query's on an unchanged path from its memo
        # (the interval as SchedulerState keeps it typed: the controller's copy is Any, a
        # generic compare a query)
        match, matched = query_match(tree, req, now, self.retry_interval != 0)
        req.storage_last_match = matched  # storage_prefetch_last_match_len, whatever the query decides
        storage = ctrl.storage
        assert storage is not None  # (typed: the hit's arithmetic below is plain ints compiled)
        hits: int = storage.hits(req.keys, matched)  # consecutive hits past the match, not touched
        end = matched + hits
        # What storage could have given this request (its last input token is always computed).
        req.storage_match_pages = max(0, min(end, req.max_match_pages) - matched)
        last_dev = match.last_device_node or tree.root
        anchor = match.host_nodes[-1] if match.host_nodes else last_dev
        # (the rule set's flags as the controller keeps them typed; storage_per_pass is
        # rules.storage_acks_per_pass where a storage tier is)
        gate = anchor if ctrl.prefetch_gate_on_best_match else last_dev
        hit_only = ctrl.prefetch_alloc_hit_only
        span = (req.max_match_pages if hit_only else len(req.keys)) - matched
        # 0.5.23 `prefetch_from_storage(storage_hit_end)`: a re-query after a hit the host could
        # not take asks for the span up to where that hit ended, if it still lies past the match,
        # and skips the existence query (`assume_stored`). Each query consumes the end it was
        # given; a rate-limited decline passes it on, a hit the host cannot take sets a new one.
        known_end, req.storage_hit_end = req.storage_hit_end, None
        if known_end is not None and matched < known_end <= matched + span:
            span = known_end - matched
        else:
            known_end = None
        if hit_only:
            hits = min(hits, span)  # the query asks for the requested span only
        reason = None
        if gate is not tree.root and gate.host is None:
            reason = "not_backed_up"  # "otherwise, the allocated GPU memory must be locked for integrity"
        elif span * ps < self.prefetch_threshold:
            reason = "below_threshold"  # no lookup issued: nothing to retry
        elif self.prefetch_tokens_occupied >= self.prefetch_limit_tokens:
            reason = "rate_limited"  # HiCacheController.prefetch_rate_limited
            self._arm_prefetch_retry(req, known_end)
        elif hit_only and hits * ps < self.prefetch_threshold:
            reason = "below_threshold"  # a miss, or a hit not worth the transfer: poll_miss
            self._arm_prefetch_retry(req)
            if ctrl.storage_per_pass:
                # issued: it holds its requested span until the drain revokes it
                self.prefetch_tokens_occupied += span * ps
                self.query_occupied += span * ps
                req.prefetch_query_pass = self.prefetch_pass
                if req.query_anchor is None:  # (not in flight already)
                    # and its anchor: `prefetch_from_storage` host-locks `last_host_node` before
                    # the lookup, and only the drain that finds the miss unlocks it
                    # (`revoke_pending_prefetch`), in query order among the hits it allocates
                    # (`_drain_and_alloc_storage_hit`): a host leaf that anchors a miss is not
                    # evictable meanwhile (`UnifiedTreeCore._is_host_leaf`: host_lock_ref)
                    tree.protect_host(anchor)
                    _queue_query(self.unallocated, req, anchor, matched, 0, span)
        if reason is not None:
            if req.storage_match_pages:
                req.storage_skip_reason = reason
            return
        tree.protect_host(anchor)
        if ctrl.storage_per_pass:
            req.prefetch_query_pass = self.prefetch_pass  # issued
            # 0.5.23: the span is reserved at the query (`prefetch_tokens_occupied`), the hit's
            # host memory allocated and its read started by the next drain
            # (`_drain_and_alloc_storage_hit`): Scheduler.drain_prefetch_queries
            req.prefetch_tokens = span * ps
            self.prefetch_tokens_occupied += req.prefetch_tokens
            _queue_query(self.unallocated, req, anchor, matched, hits, span)
            return
        self._alloc_prefetch(req, anchor, matched, hits, span, now)

    def storage_pass_start(self, now: int) -> None:
        """The storage half of a pass's `_process_hicache_events`, before its batch is formed:
        the arrivals' queries (answered before this pass's drain allocates the hits), the drain
        (rule `storage_acks_per_pass`: the hits' host memory and reads, the reads' acks, then the
        storage writes' acks, `_drain_backup`, whose host copies free only after), then
        `_process_storage_prefetch_retries` (the re-queries due). A chunk's stash runs this
        early (`_cache_unfinished`), as SGLang's next pass runs it before
        `get_next_batch_to_run` -> `stash_chunked_request`; that pass then skips it."""
        if self.storage_pass_done_ns == now:
            self.storage_pass_done_ns = -1
            return
        if not self.has_storage:
            # No tier: no query, write, read, tail or re-query can exist (each starts at a
            # storage query or write), so the pass only counts, as _retry_prefetches would
            if self.retry_interval or self.storage_acks:
                self.prefetch_pass += 1
            return
        acks = self.storage_acks
        # the pass this is (the controller's `pass_now() + 1`, handed to it: the count is only
        # moved by `_retry_prefetches`, at the end)
        step = self.prefetch_pass + 1
        ctrl = self.ctrl
        if acks:
            # the writes acknowledged since the last pass start; those ended are in the tier
            # before this pass's queries
            ctrl.start_storage_writes(now, step)
        if self.unqueried:
            arrived, self.unqueried = self.unqueried, []
            for req in arrived:
                self._start_prefetch(req, now)
        if acks:
            self.drain_prefetch_queries(now)
            ctrl.release_storage_writes(now, step=step)
            ctrl.free_prefetch_tails(now, step=step)
            self._drain_held_releases()
        self._retry_prefetches(now)  # _process_hicache_events, every pass

    def drain_prefetch_queries(self, now: int) -> None:
        """0.5.23 `_drain_storage_control_queues_impl` -> `_drain_and_alloc_storage_hit`, in the
        order the queries were made: misses give their span back (`revoke_pending_prefetch`),
        hits get their host memory and start their read."""
        self.prefetch_tokens_occupied -= self.query_occupied
        self.query_occupied = 0
        if self.unallocated:
            queued, self.unallocated = self.unallocated, []
            for req in queued:
                anchor = req.query_anchor
                assert anchor is not None  # (on the list: in flight)
                req.query_anchor = None
                found = req.query_hits
                if found == 0:  # a miss (or a hit under the threshold): revoke_pending_prefetch
                    self.tree.release_host(anchor)
                    continue
                self._alloc_prefetch(req, anchor, req.query_matched, found, req.query_span, now)
        # `_drain_ack_prefetch`: a read whose acks this drain takes is inserted into the tree now
        # (`_handle_prefetch_result`, "check_prefetch_progress() is not called for this rid
        # yet"), whether or not its request is polled in this pass
        if self.reading:
            step = self.prefetch_pass + 1  # the pass this drain belongs to
            for seq, req in list(self.reading.items()):
                if req.prefetch is None:
                    del self.reading[seq]
                elif req.prefetch_ack_pass <= step and now >= req.prefetch[4]:
                    # its read done on the clock too (the last ack comes when the read ends)
                    del self.reading[seq]
                    self._finish_prefetch(req, now, acked=True)

    def _revoke_query(self, req: Req) -> None:
        """best_effort at an admission poll while the request's query is in flight
        (`check_prefetch_progress` -> terminate with no host memory): `poll_miss`, revoked."""
        anchor = req.query_anchor
        assert anchor is not None  # (its query in flight: the caller asks)
        hits = req.query_hits
        req.query_anchor = None
        self.unallocated.remove(req)  # (identity: a Req has no __eq__)
        self.tree.release_host(anchor)
        if hits == 0:  # a miss's query: its span and re-query are the drain's and the query's
            return
        self.prefetch_tokens_occupied -= req.prefetch_tokens
        req.prefetch_tokens = 0
        self._arm_prefetch_retry(req)

    def _alloc_prefetch(self, req: Req, anchor, matched: int, hits: int, span: int, now: int) -> None:
        """The hit's host memory and its read (the rest of `_start_prefetch`)."""
        rules, tree, ctrl, ps = self.rules, self.tree, self.ctrl, self.ps
        hit_only = ctrl.prefetch_alloc_hit_only
        reserved = ctrl.storage_per_pass  # the span is held since the query

        def give_back():
            if reserved:
                self.prefetch_tokens_occupied -= req.prefetch_tokens
                req.prefetch_tokens = 0
        if reserved:
            # the tier is bounded and LRU: a write that landed since the query may have evicted
            # pages it counted; the read gets the run still there (a backend whose get fails
            # mid-read stops there too, `_page_transfer`), none left is a miss
            present = ctrl.storage.hits(req.keys[matched:matched + hits], 0)
            if present < hits:
                hits = present
                if hits == 0:
                    tree.release_host(anchor)
                    give_back()
                    return
        if hit_only:  # allocate_storage_hit(allow_partial=True, min_tokens=prefetch_threshold)
            slots = ctrl.alloc_storage_hit(hits, req.req_id, now)
            if slots is None:
                fit = min(hits, ctrl.host.free_pages)
                if fit * ps >= self.prefetch_threshold:
                    slots = ctrl.alloc_host(fit, req.req_id, now)
            if slots is None:
                tree.release_host(anchor)
                give_back()
                req.storage_skip_reason = "host_full"
                # poll_miss(rid, storage_start + storage_hit_count): the re-query knows the hit's end
                self._arm_prefetch_retry(req, matched + hits)
                return
            if len(slots) < hits:
                req.storage_skip_reason = "host_full"  # the rest of the hit: _resolve_storage_prefetch_tokens
            hits = len(slots)
        else:
            slots = ctrl.alloc_host(span, req.req_id, now)
            if slots is None:
                tree.release_host(anchor)
                give_back()
                if req.storage_match_pages:
                    req.storage_skip_reason = "host_full"
                return
            if hits * ps < self.prefetch_threshold:  # prefetch_thread_func: revoke, not enough benefit
                ctrl.host.free(slots)
                tree.release_host(anchor)
                give_back()
                if req.storage_match_pages:
                    req.storage_skip_reason = "below_threshold"
                return
            ctrl.host.free(slots[hits:])
            slots = slots[:hits]
        start, done = ctrl.prefetch(req.keys[matched:matched + hits], slots, req.req_id, now)
        req.prefetch = (matched, hits, slots, start, done)
        if reserved:
            # its hit allocated by this drain, its read's acks drained by the next pass's
            # (the drain runs before prefetch_pass counts the pass it belongs to)
            req.prefetch_ack_pass = self.prefetch_pass + 2
            self.reading[req.seq] = req
        else:
            req.prefetch_tokens = span * ps  # the requested span is what counts against the limit
            self.prefetch_tokens_occupied += req.prefetch_tokens
        req.anchor = anchor
        req.storage_fetch_ns = done - start
        req.storage_bytes = hits * ctrl.page_bytes
        match PrefetchPolicy(self.cfg.resolved_prefetch_policy()):
            case PrefetchPolicy.WAIT_COMPLETE:
                req.hold_until_ns = done
            case PrefetchPolicy.TIMEOUT if rules.prefetch_timer_at_first_poll:
                # armed by _prefetch_holds; a re-query keeps it
                deadline = req.prefetch_deadline_ns
                req.hold_until_ns = done if deadline is None else min(done, deadline)
                if deadline is None:
                    req.prefetch_wait_ns = prefetch_timeout_ns(span * ps)
            case PrefetchPolicy.TIMEOUT:
                req.hold_until_ns = min(done, now + prefetch_timeout_ns(hits * ps))
            case PrefetchPolicy.BEST_EFFORT:
                pass  # the prefetch never holds the request (SGLang: best_effort terminates at once)
        if req.hold_until_ns > now:
            self.clock.at(req.hold_until_ns, _noop, None)

    def _prefetch_holds(self, req: Req, now: int) -> bool:
        """An admission poll of a request whose prefetch may still hold it (check_prefetch_progress):
        whether it must wait. Under 0.5.23's `timeout` the first such poll starts the budget
        (`_start_storage_prefetch_wait`); the prefetch ends at its read or the budget's end."""
        wait = req.prefetch_wait_ns
        if wait is not None:
            req.prefetch_wait_ns = None
            # the first nanosecond past the budget: `_prefetch_deadline_expired` asks
            # `elapsed() > timeout_s`
            req.prefetch_deadline_ns = deadline = now + wait + 1
            if deadline < req.hold_until_ns:
                req.hold_until_ns = deadline
                self.clock.at(deadline, _noop, None)
        if req.hold_until_ns > now:
            return True
        if self._prefetch_unacked(req, now):
            self.clock.at(now, _noop, None)  # the event loop's next pass drains the read's acks
            return True
        return False

    def _prefetch_unacked(self, req: Req, now: int) -> bool:
        """A prefetch whose read is not seen yet, or a query not answered yet (rule
        `storage_acks_per_pass`), holds its request under a policy that waits
        (`_can_terminate_prefetch`: wait_complete, or timeout before its deadline); best_effort
        never holds."""
        if not self.storage_acks:
            return False
        step = self.prefetch_pass
        # a read not seen yet; or a query made in this pass (a re-query), in flight until the
        # next pass answers it, a miss included (`ongoing_prefetch` keeps it until the drain
        # revokes it)
        if not ((req.prefetch is not None and req.prefetch_ack_pass > step) or req.prefetch_query_pass == step):
            return False
        policy = PrefetchPolicy(self.cfg.resolved_prefetch_policy())
        if policy == PrefetchPolicy.BEST_EFFORT:
            return False
        deadline = req.prefetch_deadline_ns
        return not (policy == PrefetchPolicy.TIMEOUT and deadline is not None and deadline <= now)

    def _drain_held_releases(self, *, every: bool = False) -> None:
        """0.5.23 `_drain_storage_control_queues_impl` -> `_drain_release`, the drain's last
        step: the host slots of prefetches that ended before their read's ack
        (`_finish_prefetch`), queued by an earlier drain's ack, go back to the host pool now.
        `every`: the replay's end (the passes after it would free them all)."""
        if not self.held_releases:
            return
        step = self.prefetch_pass + 1  # the pass this drain belongs to
        if every:
            step = max(due for due, _ in self.held_releases)
        kept: list[tuple[int, list[int]]] = []
        for due, slots in self.held_releases:
            if due <= step:
                self.ctrl.host.free(slots)
            else:
                kept.append((due, slots))
        self.held_releases = kept

    def _pop_loaded_span(self, req: Req) -> None:
        """An admission poll that finds the prefetch ended (`get_new_batch_prefill`, after
        `check_prefetch_progress`): `pop_prefetch_loaded_span` takes what the last finished
        prefetch put into the tree; a span of at least a page becomes the request's storage hit
        (`req.storage_hit_length`, `storage_hit_start`), which the tier split counts by position
        (rules.RuleSet.split_cached_prefix); none leaves the one before."""
        if req.loaded_span_pages > 0:
            req.storage_span_pages, req.storage_span_start = req.loaded_span_pages, req.loaded_span_start
            req.loaded_span_pages = req.loaded_span_start = 0

    def _prefetch_after_hit_loss(self, req: Req, now: int) -> bool:
        """0.5.23 `Scheduler._prefetch_after_device_hit_loss`, at admission once the prefetch has
        ended (`check_prefetch_progress`) and the request is matched (`init_next_round_input`):
        when its device + host match is shorter than at its last storage query (eviction took
        part of its prefix while it waited), storage is queried again for the range that opened
        (`_retry_storage_prefetch`: one more re-query, `prefetch_from_storage` without a known
        end, which cancels an armed one) and the request is skipped this pass. Past the re-query
        cap the shorter match is taken as it is. Returns whether the request is skipped.
        The rule set's re-queries (`prefetch_retry_*`) gate it: 0.5.9 has neither."""
        last = req.storage_last_match
        if not last or not self.retry_interval:
            return False
        tree = self.tree
        memo: StorageQueryMemo | None = req.storage_memo
        if memo is not None and _memo_holds(memo, tree, req):
            # the walk `locate` would make is the memo's path: no node of it changed since the
            # match that made it (so none is split now) and none follows it on the keys' way;
            # its pages are the memo's (issue 41: ~2.1k instructions a walk, ~7.6k admission
            # polls on conversation[:4000] with storage, nearly all on an unchanged path)
            current = memo.matched
        else:
            _, current = tree.locate(_matchable(req))  # no stamp: _admit's match stamps
        if current >= last:
            return False
        if req.prefetch_retries >= self.retry_cap:
            req.storage_last_match = current
            return False
        self.tree.match(_matchable(req), now)  # the admission's match, before the skip
        self.requeries.cancel(req)  # prefetch_from_storage: retries.cancel(rid)
        req.prefetch_retries += 1
        req.storage_hit_end = None
        self._start_prefetch(req, now)
        self.clock.at(now, _noop, None)  # skipped: the event loop passes again at once
        return True

    def _arm_prefetch_retry(self, req: Req, storage_hit_end: int | None = None) -> None:
        """StoragePrefetchRetries.poll_miss: query storage again in a few scheduling passes, with
        the end of a known hit (pages) where the rule set assumes it stored (`assume_stored`).
        The existence query costs no virtual time here (the engine knows the hit at once), so
        assuming changes the requested span, not the clock; a page the tier deleted meanwhile is
        not read (the hit stops before it, as SGLang's read would come back short there)."""
        interval = self.retry_interval  # (the rule field, typed: Scheduler.__init__)
        if interval:
            if req.prefetch_retries < self.retry_cap:
                # due `interval` passes after the first pass that sees it, which is the next
                # `_retry_prefetches`: the pass count moves only there while an entry is armed
                # (the decode run-ahead, decode.py `_decode_ahead`, stops for any), so that
                # pass is `prefetch_pass + 1` and the due pass is set here, on the index's due
                # list (its passes never decrease: the count only grows), not by a look at the
                # next pass
                self.rq_arm(req, self.prefetch_pass + 1 + interval)
            else:
                # past max_attempts: armed (due -1), dropped by the first pass that sees it
                self.requeries.arm_capped(req)
            if self.ctrl.prefetch_assume_stored:
                req.storage_hit_end = storage_hit_end

    def _retry_prefetches(self, now: int) -> None:
        """Scheduler._process_storage_prefetch_retries -> StoragePrefetchRetries.pop_ready, once a
        scheduling pass: a queued request's armed re-query is due `interval` passes after the
        first pass that sees it, in waiting-queue order; the queue head's is dropped ("a
        speculative miss must never delay the queue head"); past max_attempts re-queries, none."""
        interval = self.retry_interval
        if not interval:
            if self.storage_acks:
                self.prefetch_pass += 1  # the clock of the prefetch acks
            return
        self.prefetch_pass += 1
        # One call a pass (the index's `fire`, csrc/requery.c, its reference RequeryIndexPy
        # below): the queue head's entry dropped, those armed past max_attempts since the last
        # pass dropped, the entries due taken off, in waiting-queue order. Every entry is a
        # queued request's (armed at arrival or requeue, cancelled at admission:
        # Engine.check_invariants), so pop_ready's walk of the queue reaches each of these; the
        # walk's order matters only to the re-queries fired, which the index sorts by queue
        # position (issue 41: the walk was 27 % of a storage replay's CPU, ~800 requests
        # waiting and ~5 entries to act on a pass). `_retry_prefetches_walk` is the walk, kept
        # as the reference. In Python this pass and the arm were ~2.6 k instructions a
        # re-query (dict gets, sets and deletions of boxed seqs, appends, the walk: 234 M of a
        # whole conversation replay's 5.26 G with a 50M-token tier, session 38).
        ready = self.rq_fire(self.prefetch_pass, self.waiting)
        if ready is None:
            return
        cap = self.retry_cap
        for req in ready:  # _retry_storage_prefetch
            # (never past the cap: an entry is armed only under it, and a request's count moves
            # only as its entry fires or is cancelled first: the index does not look)
            if req.prefetch_retries >= cap:
                continue
            req.prefetch_retries += 1
            self._start_prefetch(req, now)

    def _retry_prefetches_walk(self, now: int) -> None:
        """`_retry_prefetches` as pop_ready writes it, a walk of the whole waiting queue every
        pass: the reference the indexed one is tested against (tests/engine/test_fast_paths.py)."""
        interval = self.rules.prefetch_retry_interval_passes
        if not interval:
            if self.rules.storage_acks_per_pass:
                self.prefetch_pass += 1  # the clock of the prefetch acks
            return
        self.prefetch_pass += 1
        pending, waiting = self.requeries, self.waiting
        if not len(pending) or not waiting:
            return
        pending.cancel(waiting[0])
        step = self.prefetch_pass
        if not any(due <= step for _, due in pending.items()):
            return
        ready = []
        cap = self.rules.prefetch_retry_max_attempts
        for req in waiting:
            due = pending.due(req)
            if due is None:
                continue
            if req.prefetch_retries >= cap:
                pending.cancel(req)
                continue
            if due < 0:
                due = step + interval
                pending.set_due(req, due)
            if due > step:
                continue
            pending.cancel(req)
            ready.append(req)
        for req in ready:  # _retry_storage_prefetch
            req.prefetch_retries += 1
            self._start_prefetch(req, now)

    def _finish_prefetch(self, req: Req, now: int, *, acked: bool = False) -> None:
        """HiRadixCache.check_prefetch_progress, once the policy lets the prefetch end: the pages
        read so far go into the tree as host-only nodes below the anchor (pages someone else put
        there meanwhile are duplicates and freed), the rest is released, the anchor unprotected.
        The new nodes are not locked: admission follows at once and loads them back."""
        first, pages, slots, start, end = req.prefetch
        if now >= end:
            done = pages
        elif self.storage_acks:  # the batches acknowledged (storage_pages_done)
            done = self.cost.storage_pages_done(pages, self.ctrl.page_bytes, now - start)
        else:
            done = max(0, (pages * (now - start)) // max(end - start, 1))
        held_until = 0  # the drain that frees the unread slots (0: now)
        if req.prefetch_ack_pass > self.prefetch_pass and not acked:
            done = 0  # no ack drained yet: `operation.completed_tokens` is 0 (storage_acks_per_pass)
            # 0.5.23: the read is the IO thread's until it acks (`prefetch_io_aux_func`'s
            # `completed_req`); the drain that takes that ack (pass `prefetch_ack_pass`) queues
            # the host slots (`_drain_ack_prefetch` -> `append_host_mem_release`), and the next
            # drain frees them (`_drain_release`, its queue length counted at the drain's start)
            held_until = req.prefetch_ack_pass + 1
        req.prefetch = None
        tree = self.tree
        node, matched = tree.locate(req.keys[:first + done])
        kept = 0
        # `prefetch_loaded_tokens_by_reqid` / `_storage_start_`: the pages read less those the
        # tree had, where they start (0: none), for the next admission poll to take
        req.loaded_span_pages = req.loaded_span_start = 0
        if matched >= first:  # else the anchor's path left the tree: nothing to hang the pages on
            dup = matched - first  # pages the tree holds past the anchor
            had = dup  # of them, those not counted as loaded, their read copy freed
            if self.refill_host_on_read and dup:
                had = self._refill_host_copies(req.keys[:matched], first, slots)
            self.ctrl.host.free(slots[:had])
            if done > had:
                req.loaded_span_pages, req.loaded_span_start = done - had, first + had
            if done > dup:
                new = tree.insert_host(node, req.keys[matched:first + done], slots[dup:done], now, req.req_id)
                new.prefetched_for = req.seq
                if self.miss is not None:  # which pages its own prefetch brought in (miss.py)
                    self.miss.prefetched(req.seq, matched, first + done)
            kept = done
        else:
            self.ctrl.host.free(slots[:done])
        if now < end and self.storage_acks:
            # cut short in flight: the read stops at the end of its batch in progress (at its
            # start, not started yet), and its unread slots are freed after its last ack
            ends = self.cost.storage_batch_ends(pages, self.ctrl.page_bytes)
            stop = start if now < start else start + next(e for e in ends if start + e > now)
            self.ctrl.hold_prefetch_tail(slots[done:], stop)
            storage = self.ctrl.storage
            if storage.free_ns == end:  # the last read queued: the tier's reads are free then
                storage.free_ns = stop
        elif held_until:
            self.held_releases.append((held_until, slots[done:]))
        else:
            self.ctrl.host.free(slots[done:])
        tree.release_host(req.anchor)
        req.anchor = None
        self.prefetch_tokens_occupied -= req.prefetch_tokens
        req.prefetch_tokens = 0
        if kept < pages and req.storage_skip_reason is None:
            req.storage_skip_reason = "prefetch_incomplete"


    def _refill_host_copies(self, keys: KeyRun, first: int, slots: list[int]) -> int:
        """UnifiedTreeCore.insert_host (0.5.23, not write_back): the read's path below the anchor
        (pages `first` on, all in the tree: `keys` ends where the tree's match does) keeps the
        read's pages as the host copy of each node on device without one
        (`full_data.host_value = matched_host_value`, a duplicate tracked as such); the pages of
        nodes that had a host copy come first on the path (SGLang asserts it) and are the
        `host_prefix_len` returned, which the caller frees. The refilled pages count as loaded
        (`loaded_from_storage = completed_tokens - prefix_len`)."""
        tree = self.tree
        host_prefix = 0
        refilled = False
        at = 0
        for node in tree.walk(keys):
            pages = len(node.keys)
            if at >= first:
                if node.host is None:
                    tree.set_host(node, slots[at - first:at - first + pages])
                    tree.track_duplicate(node)
                    refilled = True
                else:
                    assert not refilled, f"{node}: backed node below a refilled host copy"
                    host_prefix += pages
            at += pages
        return host_prefix


class RequeryIndexPy:
    """The storage re-queries armed (SGLang 0.5.23 `StoragePrefetchRetries`), the reference of
    the C data plane's `RequeryIndex` (csrc/requery.c, whose doc says why it is C): each armed
    request's due pass (-1: armed past max_attempts), keyed by the request itself (one object an
    arrival); the due list, (due pass, request) in arming order from `head` on, whose passes
    the engine never lets decrease, so the entries due are a prefix of it; the requests armed
    past the cap since the last pass. An index entry the map no longer agrees with (cancelled at
    admission, re-armed since, fired) is stale and skipped. Every method does what the C one
    does on any input (tests/engine/test_requery_index.py); neither checks the re-query cap,
    which the caller does."""

    def __init__(self) -> None:
        self.due_by_req: dict[object, int] = {}
        self.armed: list[object] = []
        self.due_pass: list[int] = []
        self.due_req: list[object] = []
        self.head = 0
        self.fired = 0  # requests handed back by `fire`, all passes

    def __len__(self) -> int:
        return len(self.due_by_req)

    def arm(self, req: object, due: int) -> None:
        """poll_miss under the cap: due at pass `due`."""
        self.due_by_req[req] = due
        self.due_pass.append(due)
        self.due_req.append(req)

    def arm_capped(self, req: object) -> None:
        """poll_miss past max_attempts: due -1, dropped by the next pass's `fire`."""
        self.due_by_req[req] = -1
        self.armed.append(req)

    def cancel(self, req: object) -> None:
        """Its armed re-query, if any, dropped (admission; `retries.cancel(rid)`)."""
        self.due_by_req.pop(req, None)

    def due(self, req: object) -> int | None:
        return self.due_by_req.get(req)

    def set_due(self, req: object, due: int) -> None:
        """The map alone (the reference walk, `_retry_prefetches_walk`, sets a due pass there)."""
        self.due_by_req[req] = due

    def items(self) -> list[tuple[object, int]]:
        return list(self.due_by_req.items())

    def fire(self, step: int, waiting: list) -> list | None:
        """One pass's pop_ready at pass `step`: the queue head's entry dropped ("a speculative
        miss must never delay the queue head"), the capped ones dropped, the due ones taken off
        and returned in waiting-queue order; None if none is due."""
        pending = self.due_by_req
        if not pending:  # every index entry is stale now
            self.armed, self.due_pass, self.due_req, self.head = [], [], [], 0
            return None
        if not waiting:
            return None
        pending.pop(waiting[0], None)
        if self.armed:
            armed, self.armed = self.armed, []
            for req in armed:
                if pending.get(req) == -1:  # (set again since: not this entry's)
                    del pending[req]
        due_pass, due_req = self.due_pass, self.due_req
        at, n = self.head, len(due_pass)
        if at == n or due_pass[at] > step:
            return None
        ready: list[object] = []
        while at < n and due_pass[at] <= step:
            req = due_req[at]
            due = due_pass[at]
            at += 1
            if pending.get(req) != due:
                continue  # stale
            del pending[req]
            ready.append(req)
        if at == n:
            self.due_pass, self.due_req, self.head = [], [], 0
        elif at > 256 and at * 2 > n:  # the spent prefix goes now and then
            self.due_pass, self.due_req, self.head = due_pass[at:], due_req[at:], 0
        else:
            self.head = at
        if not ready:
            return None
        if len(ready) > 1:  # in waiting-queue order
            # Walked from the tail, stopping once all are found: re-queries are armed at arrival
            # or requeue, so their requests sit near the queue's end (whole conversation trace
            # with a 50M-token tier: ~3,200 waiting, the ready ones within ~20 of the tail).
            # Identity against the few ready ones; a request queued twice is found twice.
            left = len(ready)
            found: list[object] = []
            for j in range(len(waiting) - 1, -1, -1):
                r = waiting[j]
                for x in ready:
                    if x is r:
                        found.append(r)
                        left -= 1
                        break
                if not left:
                    break
            found.reverse()
            ready = found
        self.fired += len(ready)
        return ready


# The index the scheduler keeps (Scheduler.__init__): the C one where the data plane is built.
new_requeries = cplane.choose("prefetch.requeries", cplane.compiled("RequeryIndex"), RequeryIndexPy)


class StorageQueryMemo:
    """A storage query's tree match, kept for the request's re-queries: the tree, the request's
    key run and match bound it was made for, the match, its pages, the tree's change count
    (RadixTree.mod_seq) just after it, and the key past the match (`keys[matched]`, None where
    the match took every key it could): `_memo_holds` asks the path's end for that key's child
    at every re-query, where an index of the run (Any: a list or an array) was a generic
    `__getitem__` and an int boxed each time (issue 41: ~29k re-queries on conversation[:4000])."""

    def __init__(self, tree: RadixTree, keys: Any, bound: int, match: TreeMatch, matched: int, seq: int) -> None:
        self.tree = tree
        self.keys = keys
        self.bound = bound
        self.match = match
        self.matched = matched
        self.seq = seq
        self.next_key: Any = keys[matched] if matched < min(len(keys), bound) else None


def query_match(tree: RadixTree, req: Req, now: int, memo_it: bool) -> tuple[TreeMatch, int]:
    """A storage query's match_prefix of `req` (`tree.match` of its matchable pages) and the
    pages matched. A re-query whose path nothing has changed since its last query's match (the
    request's memo, `_memo_holds`) gets that match again with its access stamps made anew
    (`RadixTree.touch_path`): what the walk would do, without the walk (issue 41: 14,149
    re-queries on conversation[:2000], 14,131 of them on an unchanged path, ~1 node long).
    `memo_it`: keep a fresh match as the request's memo (where re-queries exist)."""
    # (typed here: Req keeps it as Any, whose `match` and `matched` were generic look-ups,
    # three a re-query)
    memo: StorageQueryMemo | None = req.storage_memo
    if memo is not None and _memo_holds(memo, tree, req):
        tree.touch_path(memo.match, now)
        return memo.match, memo.matched
    match = tree.match(_matchable(req), now)
    matched = match.device_pages + match.host_pages
    if memo_it:
        req.storage_memo = StorageQueryMemo(tree, req.keys, req.max_match_pages, match, matched, tree.mod_seq)
    return match, matched


def _memo_holds(memo: StorageQueryMemo, tree: RadixTree, req: Req) -> bool:
    """Whether a match of `req` now would walk the memo's path: the same tree, key run and match
    bound; no node of the path changed since (split, deleted, a copy gained or lost: each moves
    the node's `mod_seq` past the memo's count); and the path's end has no child on the keys'
    way (a child added there since would extend the walk; any other child cannot be taken)."""
    if memo.tree is not tree or memo.keys is not req.keys or memo.bound != req.max_match_pages:
        return False
    seq = memo.seq
    match = memo.match
    for node in match.device_nodes:
        if node.mod_seq > seq:
            return False
    for node in match.host_nodes:
        if node.mod_seq > seq:
            return False
    matched = memo.matched
    if matched < min(len(req.keys), req.max_match_pages):
        last = match.last_node
        end = tree.root if last is None else last
        # (the key run is the memo's and the bound too, checked above; a run only grows at its
        # end (a requeue's output keys), so the memo's key is still the one at `matched`, and
        # one past a run the memo saw end there is read now)
        key = memo.next_key
        if _child(end, req.keys[matched] if key is None else key) is not None:
            return False
    return True


def _matchable(req: Req) -> Any:
    """The pages of `req` a match may take (`max_match_pages`): its keys themselves when that is
    all of them (the tree's walk only reads them), where a slice copied ~180 keys at each of the
    ~100k storage queries of a conversation replay."""
    keys = req.keys
    return keys if req.max_match_pages >= len(keys) else keys[:req.max_match_pages]


def _queue_query(queued: list[Req], req: Req, anchor: TreeNode, matched: int, hits: int, span: int) -> None:
    """A storage query in flight until the next drain (`drain_prefetch_queries`): its entry on
    the request (Req.query_*), the request on the list in query order. A request whose query is
    in flight already keeps its place and takes the new entry (what the dict by seq it replaced
    did; a request queries once a pass and the drain comes between). A dict entry of a tuple of
    boxed ints was ~540 instructions a query (issue 41: ~102k queries on a whole conversation
    replay with a 50M-token tier, session 39)."""
    if req.query_anchor is None:
        queued.append(req)
    req.query_anchor = anchor
    req.query_matched = matched
    req.query_hits = hits
    req.query_span = span


def _noop(_arg) -> None:
    """An event that only wakes the scheduler (a prefetch hold ends)."""
