"""The scheduler on a virtual clock: arrivals, a waiting queue (FCFS), prefill batches under a
token budget with chunked prefill, admission gated on device memory, modelled decode, and
`cache_finished_req` / `cache_unfinished_req` into the tree.

A request's life (times on the virtual clock):

    arrival ──queue──► admitted (match_prefix, load-back, alloc) ──prefill chunk(s)──► first token
            ──decode (output_len steps)──► finish: insert KV into the tree, unlock, free the rest

Token split at admission (`prefix_indices` = device original + what load-back restored):

    input  |-- device --|-- host --|-- storage --|------------ computed ------------|x|
           |<------ prefix_indices (usable) ---->|<------ extend_input_len ---------->|
    (the last input token is always computed; only full pages are matched)
"""

from __future__ import annotations

import heapq
from typing import Callable, Iterable

from tierdiag.engine.config import EngineConfig
from tierdiag.engine.controller import CacheController, EngineStats
from tierdiag.engine.costmodel import CostModel
from tierdiag.engine.tree import RadixTree, TreeNode
from tierdiag.errors import TierdiagError
from tierdiag.probes import events as ev
from tierdiag.trace.pages import page_keys as trace_page_keys, storage_key_chain
from tierdiag.trace.reader import TraceRequest


# Like SGLang, LPM falls back to FCFS when the queue is long: matching every waiting request
# before every batch would cost more than it saves.
LPM_MAX_WAITING = 128


class EngineError(TierdiagError):
    """The engine cannot make progress (a bug or an impossible configuration)."""


class Req:
    __slots__ = (
        "seq", "req_id", "arrival_ns", "input_len", "output_len", "keys", "total_pages", "max_match_pages",
        "skeys", "prefetch", "prefetch_node", "hold_until_ns", "held",
        "lock_node", "dev_pages", "prefix_pages", "host_loaded_pages", "storage_loaded_pages",
        "host_match_pages", "storage_match_pages", "lb_skip_reason", "lb_skip_pages", "storage_skip_reason",
        "own_slots", "own_from", "done_tokens", "extend_total", "recomputed_pages",
        "sched_ns", "first_batch_id", "num_chunks", "lb_ns", "lb_exposed", "lb_queued", "lb_pages", "lb_runs",
        "storage_bytes", "storage_fetch_ns", "recompute_ns", "compute_ns", "first_token_ns", "lost",
        "lb_wall", "lb_verified", "protected_pages",
    )

    def __init__(self, t: TraceRequest, arrival_ns: int):
        self.seq = t.seq
        self.req_id = t.req_id
        self.arrival_ns = arrival_ns
        self.input_len = t.input_len
        self.output_len = t.output_len
        self.keys: list[int] = []
        self.skeys: list[str] | None = None
        self.prefetch = None  # (first page, pages, host slots, start ns, end ns)
        self.prefetch_node: TreeNode | None = None
        self.hold_until_ns = 0
        self.held = False
        self.lock_node: TreeNode | None = None
        self.dev_pages = self.prefix_pages = self.host_loaded_pages = self.storage_loaded_pages = 0
        self.host_match_pages = self.storage_match_pages = 0
        self.lb_skip_reason: str | None = None
        self.lb_skip_pages = 0
        self.storage_skip_reason: str | None = None
        self.own_slots: list[int] = []
        self.own_from = 0  # page index of own_slots[0]
        self.done_tokens = 0  # input tokens whose KV exists (prefix + computed chunks)
        self.extend_total = 0
        self.recomputed_pages = 0
        self.sched_ns: int | None = None
        self.first_batch_id: int | None = None
        self.num_chunks = 0
        self.lb_ns = self.lb_queued = self.lb_pages = self.lb_runs = 0
        self.lb_exposed = 0.0
        self.storage_bytes = self.storage_fetch_ns = 0
        self.recompute_ns = self.compute_ns = 0.0
        self.first_token_ns: int | None = None
        self.lost: dict[int, int] = {}  # eviction id -> tokens of this request's prefix it took
        self.lb_wall = 0
        self.protected_pages = 0  # cache_protected_len in pages: the matched path the tree locks for us
        self.lb_verified: bool | None = None


class Scheduler:
    def __init__(self, cfg: EngineConfig, cost: CostModel, tree: RadixTree, ctrl: CacheController,
                 probe, stats: EngineStats, progress: Callable[[int, int, EngineStats], None] | None = None):
        self.cfg = cfg
        self.cost = cost
        self.tree = tree
        self.ctrl = ctrl
        self.probe = probe
        self.stats = stats
        self.progress = progress
        self.ps = cfg.page_size
        self.waiting: list[Req] = []
        self.chunked: Req | None = None
        self.running_context_tokens = 0
        self._events: list = []
        self._order = 0
        self._batch_id = 0
        self._current = 0  # virtual time of the event being handled
        ctrl.at = self.at

    def at(self, t_ns: int, fn, arg) -> None:
        self._order += 1
        heapq.heappush(self._events, (t_ns, self._order, fn, arg))

    # --- main loop -----------------------------------------------------------------------
    def run(self, requests: Iterable[TraceRequest]) -> EngineStats:
        it = iter(requests)
        scale = self.cfg.time_scale
        nxt = next(it, None)
        now = 0
        gpu_free = 0
        events = self._events
        while True:
            while nxt is not None and int(nxt.arrival_ns * scale) <= now:
                self._arrive(nxt, int(nxt.arrival_ns * scale))
                nxt = next(it, None)
            while events and events[0][0] <= now:
                self._current, _, fn, arg = heapq.heappop(events)
                fn(arg)
            if now >= gpu_free and (self.waiting or self.chunked is not None):
                end = self._batch(now)
                if end is not None:
                    gpu_free = end
            candidates = []
            if nxt is not None:
                candidates.append(int(nxt.arrival_ns * scale))
            if events:
                candidates.append(events[0][0])
            if gpu_free > now:
                candidates.append(gpu_free)
            if not candidates:
                if (self.waiting or self.chunked is not None) and self._release_prefetch_locks():
                    continue
                if self.waiting or self.chunked is not None:
                    head = self.chunked or self.waiting[0]
                    raise EngineError(
                        f"no progress possible: request {head.req_id} waits for device memory that no "
                        f"event will free ({self.ctrl.device.free_pages} pages free, "
                        f"{self.tree.locked_device_pages} locked)")
                break
            now = max(now, min(candidates))
        self.stats.virtual_end_ns = now
        return self.stats

    def _release_prefetch_locks(self) -> bool:
        """A waiting request's prefetched pages are locked in the tree, and the lock pins their
        device-resident ancestors too. When nothing else can free memory for the request ahead
        of it, waiting would be forever: give those locks up (the pages stay in the tree, on host,
        for whoever matches them before they are evicted)."""
        released = False
        for req in self.waiting:
            if req.prefetch_node is not None:
                self.tree.dec_lock(req.prefetch_node)
                req.prefetch_node = None
                released = True
        return released

    # --- arrival -------------------------------------------------------------------------
    def _arrive(self, t: TraceRequest, now: int) -> None:
        req = Req(t, now)
        ps = self.ps
        if self.probe is not None:
            self.probe.emit(ev.RequestArrived(now, req.req_id, req.seq, req.input_len, req.output_len))
        req.total_pages = -(-(req.input_len + req.output_len) // ps)
        if req.total_pages > self.ctrl.device.capacity:
            self._reject(req, f"needs {req.total_pages * ps} tokens of device memory; the pool holds "
                              f"{self.ctrl.device.capacity * ps}")
            return
        req.keys = trace_page_keys(t, page_size=ps, block_size=self.cfg.block_size)
        req.max_match_pages = min(len(req.keys), (req.input_len - 1) // ps)
        if self.ctrl.storage is not None:
            self._start_prefetch(req, now)
        self.waiting.append(req)

    def _reject(self, req: Req, reason: str) -> None:
        self.stats.requests_rejected += 1
        if self.probe is not None:
            self.probe.emit(ev.RequestFinished(ev.RequestRecord(
                req.req_id, req.seq, req.arrival_ns, req.input_len, req.output_len, "rejected", reason, None,
                0, 0, 0, 0, 0, 0, 0, None, 0, None, 0, 0, 0,
                None, None, None, None, None, 0, 0, 0, 0, None, None, None, None, None, None, None, None,
                None, 0, None, None)))

    # --- storage prefetch ----------------------------------------------------------------
    def _start_prefetch(self, req: Req, now: int) -> None:
        # Every full page may be inserted (and so backed up to storage) at finish: key them all.
        req.skeys = storage_key_chain(req.keys)
        self.ctrl.storage_key_of.update(zip(req.keys, req.skeys))
        keys = req.keys[:req.max_match_pages]
        _, in_tree = self.tree.locate(keys)
        storage = self.ctrl.storage
        end = in_tree
        while end < len(keys) and req.skeys[end] in storage:
            end += 1
        pages = end - in_tree
        req.storage_match_pages = pages
        if pages == 0:
            return
        if pages * self.ps < self.cfg.prefetch_threshold:
            req.storage_skip_reason = "below_threshold"
            return
        got = self.ctrl.prefetch(req.skeys[in_tree:end], req.req_id, now)
        if got is None:
            req.storage_skip_reason = "host_full"
            return
        slots, start, done = got
        req.prefetch = (in_tree, pages, slots, start, done)
        req.storage_fetch_ns = done - start
        req.storage_bytes = pages * self.ctrl.page_bytes
        self.at(done, self._prefetch_done, req)
        policy = self.cfg.prefetch_policy
        if policy == "wait_complete":
            req.hold_until_ns = done
        elif policy == "timeout":
            timeout_ns = int((1.0 + 0.25 * pages * self.ps / 1024) * 1e9)
            req.hold_until_ns = min(done, now + timeout_ns)
        if req.hold_until_ns > now:
            self.at(req.hold_until_ns, _noop, None)

    def _prefetch_done(self, req: Req) -> None:
        if req.prefetch is not None and req.sched_ns is None:
            self._attach_prefetch(req, req.prefetch[1])

    def _attach_prefetch(self, req: Req, pages_done: int) -> None:
        """Put the prefetched pages into the tree as host-only nodes, locked for this request."""
        first, pages, slots, _, _ = req.prefetch
        req.prefetch = None
        node, matched = self.tree.locate(req.keys[:first])
        usable = 0
        if matched == first and pages_done and req.keys[first] not in node.children:
            usable = pages_done
            new = self.tree.insert_host(node, req.keys[first:first + usable], slots[:usable],
                                        req.arrival_ns, req.req_id)
            new.prefetched_for = req.seq
            self.tree.inc_lock(new)
            req.prefetch_node = new
        self.ctrl.host.free(slots[usable:])
        if usable < pages and req.storage_skip_reason is None:
            req.storage_skip_reason = "prefetch_incomplete"

    # --- batches -------------------------------------------------------------------------
    def _batch(self, now: int) -> int | None:
        ps = self.ps
        budget = self.cfg.max_prefill_tokens
        items: list[tuple[Req, int, int, int]] = []  # (req, chunk tokens, load-back ns, load-back pages)
        self.ctrl.blocking_ns = 0
        if self.chunked is not None:
            req = self.chunked
            take = self._continue_chunk(req, budget, now)
            if take is None:
                return None  # the chunked request needs memory first; it goes before everyone
            items.append((req, take, 0, 0))
            budget -= take
        if self.cfg.schedule_policy == "lpm" and 1 < len(self.waiting) <= LPM_MAX_WAITING:
            self._sort_by_cached_prefix()
        i = 0
        while self.chunked is None and budget >= ps and i < len(self.waiting):
            req = self.waiting[i]
            if req.hold_until_ns > now:
                req.held = True
                i += 1
                continue
            admitted = self._admit(req, budget, now)
            if admitted is None:
                break  # FCFS: the head waits for memory, and so does everyone behind it
            del self.waiting[i]
            take, lb_ns, lb_pages = admitted
            items.append((req, take, lb_ns, lb_pages))
            budget -= take
        if not items:
            return None
        return self._run_batch(items, now)

    def _sort_by_cached_prefix(self) -> None:
        """Longest cached prefix (any tier) first; ties keep arrival order (the sort is stable)."""
        locate = self.tree.locate
        self.waiting.sort(key=lambda r: -locate(r.keys[:r.max_match_pages])[1])

    def _pages_through(self, req: Req, end_tokens: int) -> int:
        if end_tokens >= req.input_len:
            return req.total_pages  # the last chunk also holds the output
        return -(-end_tokens // self.ps)

    def _take(self, remaining: int, budget: int) -> int:
        return remaining if remaining <= budget else (budget // self.ps) * self.ps

    def _admit(self, req: Req, budget: int, now: int):
        """match_prefix, decide load-back, allocate. None when device memory can't be had."""
        ps = self.ps
        tree, ctrl = self.tree, self.ctrl
        if req.prefetch is not None:  # best effort (or timed out): take what has arrived
            first, pages, _, start, end = req.prefetch
            done = pages if now >= end else max(0, (pages * (now - start)) // max(end - start, 1))
            self._attach_prefetch(req, done)
        match = tree.match(req.keys[:req.max_match_pages], now, req.req_id)
        lock_node = match.last_node or tree.root
        tree.inc_lock(lock_node)
        dev_pages = match.device_pages
        host_nodes = match.host_nodes
        storage_pages = sum(len(n.keys) for n in host_nodes if n.prefetched_for == req.seq)
        host_pages = match.host_pages - storage_pages
        tiered = host_pages + storage_pages
        load = tiered > 0
        skip = None
        if load and tiered * ps < self.cfg.load_back_threshold:
            load, skip = False, "below_threshold"
        if load:
            take = self._take(req.input_len - (dev_pages + tiered) * ps, budget)
            need = self._pages_through(req, (dev_pages + tiered) * ps + take) - dev_pages
            if not ctrl.evict_device(need, req.req_id, now):
                load, skip = False, "device_full"
        if not load:
            take = self._take(req.input_len - dev_pages * ps, budget)
            need = self._pages_through(req, dev_pages * ps + take) - dev_pages
            if not ctrl.evict_device(need, req.req_id, now):
                tree.dec_lock(lock_node)
                return None
        slots = ctrl.device.alloc(need)
        assert slots is not None, "evict_device reported room that alloc could not find"
        if req.prefetch_node is not None:  # our own lock now protects the prefetched pages
            tree.dec_lock(req.prefetch_node)
            req.prefetch_node = None
        lb_ns = 0
        if load:
            lb_slots, slots = slots[:tiered], slots[tiered:]
            first = dev_pages
            lb_ns, runs, wall, verified = ctrl.load_back(host_nodes, lb_slots, req.req_id, now,
                                                         req.keys[first:first + tiered])
            req.lb_pages, req.lb_runs, req.lb_ns = tiered, runs, lb_ns
            req.host_loaded_pages, req.storage_loaded_pages = host_pages, storage_pages
            req.prefix_pages = dev_pages + tiered
            req.lb_wall, req.lb_verified = wall, verified
        else:
            req.prefix_pages = dev_pages
        req.lock_node = lock_node
        # The tree protects the whole matched path (device and host nodes) for this request,
        # whether or not the host part was loaded back: cache_protected_len may exceed the
        # usable prefix_indices when a load-back was skipped.
        req.protected_pages = dev_pages + tiered
        req.dev_pages = dev_pages
        req.host_match_pages = host_pages
        if storage_pages:
            req.storage_match_pages = max(req.storage_match_pages, storage_pages)
        req.lb_skip_reason = skip
        req.lb_skip_pages = tiered if skip else 0
        req.own_slots = slots
        req.own_from = req.prefix_pages
        req.done_tokens = req.prefix_pages * ps
        req.extend_total = req.input_len - req.done_tokens
        req.sched_ns = now
        self._count_recomputed(req, match, skip is not None)
        if self.cfg.write_policy == "write_through_selective":
            for node in match.device_nodes:
                if node.host is None and node.hit_count >= 2:
                    ctrl.backup(node, req.req_id, now)
        if self.probe is not None:
            prefix = req.prefix_pages * ps
            self.probe.emit(ev.PrefixMatched(now, req.req_id, dev_pages * ps, req.host_loaded_pages * ps,
                                             req.storage_loaded_pages * ps, prefix, req.protected_pages * ps))
            if skip:
                self.probe.emit(ev.LoadBackSkipped(now, req.req_id, "host", tiered * ps, skip))
        if load:
            return take, lb_ns, tiered
        return take, 0, 0

    def _count_recomputed(self, req: Req, match, skipped: bool) -> None:
        """Computed pages that had been cached once, and the evictions that took this request's
        prefix off the device (demotions of its host part; demotions and deletions of pages it
        had to recompute or fetch back from storage)."""
        lost = req.lost
        ps = self.ps
        cached = self.ctrl.cached_once
        demoted = self.ctrl.demoted_by

        def blame(keys) -> int:
            found = 0
            for k in keys:
                eid = cached.get(k)
                if eid is None:
                    continue
                found += 1
                if eid:
                    lost[eid] = lost.get(eid, 0) + ps
                first = demoted.get(k)
                if first:
                    lost[first] = lost.get(first, 0) + ps
            return found

        for node in match.host_nodes:
            if node.prefetched_for == req.seq:
                blame(node.keys)  # came back from storage: who pushed it out of device and host
            elif node.evicted_by is not None:
                lost[node.evicted_by] = lost.get(node.evicted_by, 0) + len(node.keys) * ps
        recomputed = req.lb_skip_pages if skipped else 0
        path_pages = req.dev_pages + match.host_pages
        recomputed += blame(req.keys[path_pages:req.input_len // ps])
        req.recomputed_pages = recomputed

    def _continue_chunk(self, req: Req, budget: int, now: int) -> int | None:
        take = self._take(req.input_len - req.done_tokens, budget)
        need = self._pages_through(req, req.done_tokens + take) - req.own_from - len(req.own_slots)
        if need > 0:
            if not self.ctrl.evict_device(need, req.req_id, now):
                return None
            req.own_slots.extend(self.ctrl.device.alloc(need))
        return take

    def _run_batch(self, items, now: int) -> int:
        cost, ctrl, ps = self.cost, self.ctrl, self.ps
        self._batch_id += 1
        bid = self._batch_id
        if self.probe is not None:
            self._sample_pools(now)
        # Load-backs queue on the host->device link in batch order.
        link = max(now, ctrl.h2d_free_ns)
        flops = []
        lb_bytes_total = 0
        for req, take, lb_ns, lb_pages in items:
            if lb_pages:
                start = link
                link = start + lb_ns
                req.lb_queued = start - now
                lb_bytes_total += lb_pages * ctrl.page_bytes
                ctrl.emit_load_back(start, link, req.req_id, lb_pages, req.lb_runs, start - now,
                                    req.lb_wall, req.lb_verified)
            flops.append(cost.prefill_flops(take, req.done_tokens))
        ctrl.h2d_free_ns = link
        load_ns = link - now
        compute_ns = cost.prefill_ns(sum(flops))
        blocking = ctrl.blocking_ns
        duration = cost.overlapped_ns(load_ns, compute_ns) + blocking
        exposed = duration - compute_ns - blocking
        end = now + duration
        total_flops = sum(flops) or 1.0
        total_lb = sum(p for _, _, _, p in items) or 1
        decoding = self.running_context_tokens
        self.stats.batches += 1
        self.stats.busy_ns += duration
        for (req, take, lb_ns, lb_pages), f in zip(items, flops):
            share = compute_ns * f / total_flops
            extend = max(req.extend_total, 1)
            recomputed_tokens = min(req.recomputed_pages * ps, req.extend_total)
            req.recompute_ns += share * recomputed_tokens / extend
            req.compute_ns += share * (1 - recomputed_tokens / extend)
            if lb_pages:
                req.lb_exposed += exposed * lb_pages / total_lb
            if req.first_batch_id is None:
                req.first_batch_id = bid
            req.num_chunks += 1
            self._write_chunk(req, take)
            req.done_tokens += take
            if req.done_tokens >= req.input_len:
                if self.chunked is req:
                    self.chunked = None
                self.at(end, self._first_token, req)
            else:
                self.chunked = req
                self.at(end, self._cache_unfinished, req)
            if self.probe is not None:
                self.probe.emit(ev.PrefillDone(end, req.req_id, bid, req.num_chunks, take))
        if self.probe is not None:
            self.probe.emit(ev.BatchScheduled(bid, now, end, len(items), sum(t for _, t, _, _ in items),
                                              lb_bytes_total, compute_ns, exposed, decoding))
        return end

    def _write_chunk(self, req: Req, take: int) -> None:
        """The prefill output of this chunk: KV content for its full pages."""
        ps = self.ps
        first = -(-req.done_tokens // ps)
        last = min((req.done_tokens + take) // ps, len(req.keys))
        if last > first:
            off = first - req.own_from
            self.ctrl.write_computed(req.own_slots[off:off + last - first], req.keys[first:last])

    # --- completion ----------------------------------------------------------------------
    def _cache_unfinished(self, req: Req) -> None:
        """Chunked prefill: give the tree the full pages computed so far, keep them locked."""
        self._insert(req, min(req.done_tokens // self.ps, len(req.keys)), self._current)

    def _insert(self, req: Req, upto: int, now: int) -> list[TreeNode]:
        if upto <= req.own_from:
            return []
        n = upto - req.own_from
        last, dups, fresh = self.tree.insert(req.keys[:upto], req.own_from, req.own_slots[:n], now, req.req_id)
        self.ctrl.device.free(dups)
        del req.own_slots[:n]
        req.own_from = upto
        self.tree.inc_lock(last)
        self.tree.dec_lock(req.lock_node)
        req.lock_node = last
        for node in fresh:
            self.ctrl.cached_once.update(dict.fromkeys(node.keys, 0))
        if self.cfg.write_policy == "write_through":
            for node in fresh:
                if node.host is None:
                    self.ctrl.backup(node, req.req_id, now)
        return fresh

    def _first_token(self, req: Req) -> None:
        now = self._current
        req.first_token_ns = now
        ttft = now - req.arrival_ns
        self.stats.ttft_ns.append(ttft)
        if self.probe is not None:
            self.probe.emit(ev.FirstToken(now, req.req_id, ttft))
        context = req.input_len + req.output_len
        step = self.cost.decode_step_ns(self.running_context_tokens + context)
        self.running_context_tokens += context
        self.at(now + req.output_len * step, self._finish, req)

    def _finish(self, req: Req) -> None:
        now = self._current
        ps = self.ps
        self.running_context_tokens -= req.input_len + req.output_len
        n_full = min(req.input_len // ps, len(req.keys))
        self._insert(req, n_full, now)
        self.ctrl.device.free(req.own_slots)
        req.own_slots = []
        self.tree.dec_lock(req.lock_node)
        req.lock_node = None
        self._record(req, now)

    def _record(self, req: Req, now: int) -> None:
        ps, cost, st = self.ps, self.cost, self.stats
        device = req.dev_pages * ps
        host = req.host_loaded_pages * ps
        storage = req.storage_loaded_pages * ps
        computed = req.input_len - device - host - storage
        recomputed = min(req.recomputed_pages * ps, computed)
        ttft = req.first_token_ns - req.arrival_ns
        storage_wait = 0
        if req.held:
            storage_wait = max(0, min(req.hold_until_ns, req.sched_ns) - req.arrival_ns)
        lb_exposed = int(req.lb_exposed)
        recompute_ns = int(req.recompute_ns)
        compute_ns = int(req.compute_ns)
        queue = ttft - storage_wait - lb_exposed - recompute_ns - compute_ns
        assert queue >= -2, f"request {req.req_id}: TTFT parts exceed TTFT by {-queue} ns"
        if queue < 0:
            compute_ns += queue
            queue = 0
        new_tokens = computed - recomputed
        prefix = device + host + storage
        ideal = cost.prefill_alone_ns(new_tokens, req.input_len - max(new_tokens, 1))
        if_resident = ttft - lb_exposed - storage_wait
        tiered = host + storage
        recompute_instead = if_resident + (cost.prefill_alone_ns(computed + tiered, device)
                                           - cost.prefill_alone_ns(computed, prefix)) if tiered else if_resident
        if tiered:
            hit_class = "tiered_hit"
        elif device:
            hit_class = "device_hit"
        else:
            hit_class = "miss"
        st.requests_finished += 1
        st.input_tokens += req.input_len
        st.device_tokens += device
        st.host_tokens += host
        st.storage_tokens += storage
        st.computed_tokens += computed
        st.recomputed_tokens += recomputed
        if req.lb_pages:
            st.load_backs += 1
            st.load_back_bytes += req.lb_pages * self.ctrl.page_bytes
            st.load_back_ns.append(req.lb_ns)
        for reason in (req.lb_skip_reason, req.storage_skip_reason):
            if reason:
                st.skipped[reason] = st.skipped.get(reason, 0) + 1
        if self.probe is not None:
            for eid, tokens in req.lost.items():
                self.probe.emit(ev.PrefixLostPages(req.req_id, eid, tokens))
            self.probe.emit(ev.RequestFinished(ev.RequestRecord(
                req.req_id, req.seq, req.arrival_ns, req.input_len, req.output_len, "finished", None, hit_class,
                device, host, storage, computed, recomputed, req.host_match_pages * ps,
                req.storage_match_pages * ps, req.lb_skip_reason, req.lb_skip_pages * ps, req.storage_skip_reason,
                prefix, req.protected_pages * ps, req.input_len - prefix,
                queue, storage_wait, req.lb_ns, lb_exposed, req.lb_queued, req.lb_pages * self.ctrl.page_bytes,
                req.lb_pages, req.lb_runs, req.storage_bytes, req.storage_fetch_ns, recompute_ns, compute_ns,
                req.first_token_ns - req.sched_ns, ttft, ideal, if_resident, recompute_instead,
                req.first_batch_id, req.num_chunks, req.first_token_ns, now)))
        if self.progress is not None and st.requests_finished % 256 == 0:
            self.progress(st.requests_finished, now, st)

    def _sample_pools(self, now: int) -> None:
        ps, tree, ctrl = self.ps, self.tree, self.ctrl
        emit = self.probe.emit
        emit(ev.PoolSample(now, "device", ctrl.device.used_pages * ps, ctrl.device.capacity * ps,
                           tree.locked_device_pages * ps))
        emit(ev.PoolSample(now, "host", ctrl.host.used_pages * ps, ctrl.host.capacity * ps,
                           tree.locked_host_pages * ps))
        if ctrl.storage is not None:
            emit(ev.PoolSample(now, "storage", ctrl.storage.used_pages * ps, ctrl.storage.capacity * ps, 0))


def _noop(_arg) -> None:
    """An event that only wakes the scheduler (a prefetch hold ends)."""
