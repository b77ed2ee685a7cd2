"""Storage prefetch: at arrival, a request's pages past its cached prefix are read from the storage
tier into host slots (SGLang 0.5.9 Scheduler._prefetch_kvcache, HiRadixCache.prefetch_from_storage
and check_prefetch_progress), under the prefetch policy (best_effort, wait_complete, timeout).
A mixin of the Scheduler, whose state (tree, controller, clock) it works on.
"""

from __future__ import annotations

from tierdiag.engine.request import Req
from tierdiag.engine.rules import RuleSet


def prefetch_limit_tokens(rules: RuleSet, host_pages: int, device_pages: int, page_size: int) -> int:
    """Tokens prefetches in flight may hold: 0.8 x (host - device) in 0.5.9
    (HiCacheController.prefetch_rate_limited), 0.5 x host in 0.5.23."""
    pool = host_pages - device_pages if rules.prefetch_capacity_of_host_minus_device else host_pages
    return max(0, int(rules.prefetch_capacity_share * pool * page_size))


class StoragePrefetch:
    """The Scheduler's storage prefetch (its `tree`, `ctrl`, `cfg`, `ps`, `at` and the prefetch
    accounting set up in Scheduler.__init__)."""

    def _start_prefetch(self, req: Req, now: int) -> None:
        """Scheduler._prefetch_kvcache + HiRadixCache.prefetch_from_storage (SGLang 0.5.9).

        At arrival: match_prefix; only if the last device node is backed up (the root counts),
        reserve host room for the whole remaining input (page-aligned) and protect the last
        host-backed node's host copy (protect_host: no device page is pinned); then the storage
        hit query keeps the host pages of the consecutive hits and releases the rest, or revokes
        the prefetch below prefetch_threshold.

            input pages |-- device --|-- host --|----- remaining input (host room reserved) -----|
                                                |-- storage hits --|  (read into host) | released |
        """
        tree, ctrl, ps = self.tree, self.ctrl, self.ps
        match = tree.match(req.keys[:req.max_match_pages], now)  # init_next_round_input
        matched = match.device_pages + match.host_pages
        storage = ctrl.storage
        hits = storage.hits(req.keys, matched)  # consecutive hits past the match, not touched
        end = matched + hits
        # What storage could have given this request (its last input token is always computed).
        req.storage_match_pages = max(0, min(end, req.max_match_pages) - matched)
        last_dev = match.last_device_node or tree.root
        remaining = len(req.keys) - matched
        reason = None
        if last_dev is not tree.root and last_dev.host is None:
            reason = "not_backed_up"  # "otherwise, the allocated GPU memory must be locked for integrity"
        elif remaining * ps < self.prefetch_threshold:
            reason = "below_threshold"
        elif self.prefetch_tokens_occupied >= self.prefetch_limit_tokens:
            reason = "rate_limited"  # HiCacheController.prefetch_rate_limited
        if reason is not None:
            if req.storage_match_pages:
                req.storage_skip_reason = reason
            return
        anchor = match.host_nodes[-1] if match.host_nodes else last_dev
        tree.protect_host(anchor)
        slots = ctrl.alloc_host(remaining, req.req_id, now)
        if slots is None:
            tree.release_host(anchor)
            if req.storage_match_pages:
                req.storage_skip_reason = "host_full"
            return
        if hits * ps < self.prefetch_threshold:  # prefetch_thread_func: revoke, not enough benefit
            ctrl.host.free(slots)
            tree.release_host(anchor)
            if req.storage_match_pages:
                req.storage_skip_reason = "below_threshold"
            return
        ctrl.host.free(slots[hits:])
        slots = slots[:hits]
        start, done = ctrl.prefetch(req.keys[matched:end], slots, req.req_id, now)
        req.prefetch = (matched, hits, slots, start, done)
        req.anchor = anchor
        req.prefetch_tokens = remaining * ps
        self.prefetch_tokens_occupied += req.prefetch_tokens
        req.storage_fetch_ns = done - start
        req.storage_bytes = hits * ctrl.page_bytes
        policy = self.cfg.prefetch_policy
        if policy == "wait_complete":
            req.hold_until_ns = done
        elif policy == "timeout":
            timeout_ns = int((1.0 + 0.25 * hits * ps / 1024) * 1e9)
            req.hold_until_ns = min(done, now + timeout_ns)
        if req.hold_until_ns > now:
            self.at(req.hold_until_ns, _noop, None)

    def _finish_prefetch(self, req: Req, now: int) -> None:
        """HiRadixCache.check_prefetch_progress, once the policy lets the prefetch end: the pages
        read so far go into the tree as host-only nodes below the anchor (pages someone else put
        there meanwhile are duplicates and freed), the rest is released, the anchor unprotected.
        The new nodes are not locked: admission follows at once and loads them back."""
        first, pages, slots, start, end = req.prefetch
        done = pages if now >= end else max(0, (pages * (now - start)) // max(end - start, 1))
        req.prefetch = None
        tree = self.tree
        node, matched = tree.locate(req.keys[:first + done])
        kept = 0
        if matched >= first:  # else the anchor's path left the tree: nothing to hang the pages on
            dup = matched - first
            self.ctrl.host.free(slots[:dup])
            if done > dup:
                new = tree.insert_host(node, req.keys[matched:first + done], slots[dup:done], now, req.req_id,
                                       req.keys_np[matched:first + done])
                new.prefetched_for = req.seq
            kept = done
        else:
            self.ctrl.host.free(slots[:done])
        self.ctrl.host.free(slots[done:])
        tree.release_host(req.anchor)
        req.anchor = None
        self.prefetch_tokens_occupied -= req.prefetch_tokens
        req.prefetch_tokens = 0
        if kept < pages and req.storage_skip_reason is None:
            req.storage_skip_reason = "prefetch_incomplete"


def _noop(_arg) -> None:
    """An event that only wakes the scheduler (a prefetch hold ends)."""
