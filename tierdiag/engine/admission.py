"""Admission and completion, the Scheduler's mixin (scheduler.py builds the state it reads):
a request admitted into a prefill batch under PrefillAdder's budget (match_prefix, load-back,
its extend's allocation, chunking), the batch run on the clock, and its pages inserted into the
tree (cache_unfinished_req / cache_finished_req's insert). SGLang: schedule_policy.py's
PrefillAdder, schedule_batch.py's prepare_for_extend, mem_cache/; each function names the one it
restates."""

from __future__ import annotations

from typing import Any, Final

from tierdiag.config.names import Tier
from tierdiag.engine import pagemap as _pagemap
from tierdiag.engine.decode import DecodeSteps
from tierdiag.engine.pagemap import blame, blame_py
from tierdiag.engine.request import Req
from tierdiag.engine.schedule_common import CLIP_MAX_NEW_TOKENS, NO_TOKEN, OTHER, EngineError
from tierdiag.engine.tree import TreeNode
from tierdiag.engine.tree_node import TreeMatch, empty_run

_HOST: Final[str] = Tier.HOST  # read once: compiled, a `Tier.HOST` read is ~880 instructions (3.11)
# _cplane.blame where pagemap chose the compiled data plane (None on numpy): `_count_recomputed`
# calls it as pagemap.blame_c would, with no interpreted frame between (blame_c's frame was ~2.5k
# instructions a request; issue 41, session 26)
_C_BLAME: Final[Any] = _pagemap._c_blame if _pagemap.blame is _pagemap.blame_c else None


def blame_keys(cached: Any, demoted: Any, keys: Any, lost: dict[int, int] | None, ps: int) -> int:
    """pagemap.blame (its count of once-cached pages, and the evictions that took them added to
    `lost`), what pagemap.blame_c does where the compiled data plane runs: the C straight from
    the compiled core (blame_c's interpreted frame was ~2.5k instructions a request; issue 41,
    session 26) where both maps are arrays only; what the C declines, having changed nothing,
    goes to the reference, which answers or raises."""
    if _C_BLAME is None:
        return blame(cached, demoted, keys, lost, ps)
    if not cached._sparse and not demoted._sparse:
        found: int = _C_BLAME(cached, demoted, keys, lost, ps)
        if found >= 0:
            return found
    return blame_py(cached, demoted, keys, lost, ps)


def _fsum(xs: list[float]) -> float:
    """`sum` of floats as CPython 3.11's builtin adds them (0 + x0, then each in turn, in double
    precision): compiled, a native loop, where `sum` was a builtins look-up and a generic call
    (four a batch; issue 41, session 26). tests/engine/test_typed_core.py holds the two equal."""
    total = 0.0
    for x in xs:
        total += x
    return total


class Admission(DecodeSteps):
    """Scheduler's admission, batch run and completion into the tree (a mixin: its state is
    Scheduler's, set up in Scheduler.__init__)."""

    def _admit(self, req: Req, budget: int, now: int, *, first: bool, may_chunk: bool = True):
        """PrefillAdder.add_one_req (SGLang 0.5.9; 0.5.23's `_select_prefill_admission` where the
        rule set says), with init_load_back inside it.

        1. match_prefix: a device part and a host part (`host_hit_length`), the storage pages
           this request's prefetch brought in being host pages by now;
        2. the chunk shape, assuming the host part loads: under 0.5.9 a request after the first
           whose input (less the host part) does not fit what is left of the batch budget waits
           for the next batch (OTHER); under 0.5.23 (`chunk_later_requests`) it is chunked into
           what is left, unless a chunked request goes on beside it (`has_chunked_req`: OTHER),
           and this step comes after step 3 (`check_prefill` before the shape); either way a
           chunk of 0 tokens (a budget under a page) is OTHER;
        3. lock the device path, then NO_TOKEN: the whole request (input beyond the device part,
           host part included, plus its output, plus the rule set's page of overhead) must be
           less than the pass's memory budget (`_rem_total`: free + evictable device memory less
           the running requests' and this pass's reservations), or it waits;
        4. load-back of the host part, all or nothing (a partial load is an error in 0.5.23;
           here one allocation takes the whole host part or none): declined below
           load_back_threshold, or when eviction cannot make room for the host part
           (`device_full`). Declined, the prefix is the device part and the shape is selected
           again as recompute (step 2 with no host part); cache_protected_len = device part,
           and only the device path stays locked;
        5. allocate the first chunk (its input tokens: output pages come with decode steps).
        Returns (chunk tokens, load-back ns, load-back pages), or NO_TOKEN / OTHER when the
        request waits. A retracted request prefills its input and the output it had generated
        (`fill_len`).
        """
        ps = self.ps
        tree, ctrl = self.tree, self.ctrl
        if req.prefetch is not None:  # check_prefetch_progress: the policy lets it end now
            self._finish_prefetch(req, now)
        # the keys as they are where the bound leaves them whole (the walk only reads them): most
        # requests, whose input does not end on a page boundary; a slice copied them a match
        keys = req.keys
        limit = req.max_match_pages
        if limit >= len(keys):
            # the whole run: through the request's walk memo (RadixTree.touch_walk), which its
            # refreshes while waiting and its earlier tries keep (the same path where nothing
            # on it changed; issue 41, session 28)
            memo = tree.touch_walk(keys, now, req.walk_memo, req.req_id)
            req.walk_memo = memo
            match = tree.match_of(memo.path)
        else:
            match = tree.match(keys[:limit], now, req.req_id)
        dev_pages = match.device_pages
        host_nodes = match.host_nodes
        storage_pages = 0  # (a loop: compiled, `sum` of a generator was a generator object and a builtin call)
        for n in host_nodes:
            if n.prefetched_for == req.seq:
                storage_pages += len(n.keys)
        host_pages = match.host_pages - storage_pages
        tiered = host_pages + storage_pages
        # 0.5.9 add_one_req: OTHER before the lock; 0.5.23 `_select_prefill_admission`: NO_TOKEN
        # (`check_prefill`) first, then the shape
        shape_first = not self.r_chunk_later
        if shape_first and self._waits_for_next_batch(req, (dev_pages + tiered) * ps, budget, first, may_chunk):
            return OTHER  # the shape chosen assuming the host part loads
        dev_node = match.last_device_node or tree.root
        tree.inc_lock(dev_node)
        # add_one_req: total_tokens = extend beyond the device prefix + max_new (less what was
        # generated, clipped) + 0.5.23's per_req_token_overhead, against rem_total_tokens
        max_new = min(max(req.output_len - req.generated_tokens, 0), CLIP_MAX_NEW_TOKENS)
        total_tokens = req.fill_len - dev_pages * ps + max_new + self.r_overhead_pages * ps
        if total_tokens >= self._rem_total():
            tree.dec_lock(dev_node)
            return NO_TOKEN
        if (not shape_first and self._waits_for_next_batch(req, (dev_pages + tiered) * ps, budget, first, may_chunk)) \
                or self._take(req.fill_len - (dev_pages + tiered) * ps, budget) <= 0:
            # the shape assuming the host part loads; a budget under a page (mixed chunk's
            # budget is off a page boundary) gives a chunk of 0 tokens: "if extend_len <= 0:
            # return OTHER" (0.5.23 `_select_prefill_admission`; 0.5.9 `trunc_len <= 0`, which
            # comes after its load-back: a difference only for a batch's first request)
            tree.dec_lock(dev_node)
            return OTHER
        load = tiered > 0
        skip = None
        if load and tiered * ps < self.load_back_threshold:
            load, skip = False, "below_threshold"
        if load:
            # Room for the host part first (HiCacheController.load, else evict and retry). Its
            # host copies are protected until allocation is done: a write-back during eviction
            # needs host room and must not take the very pages about to be loaded.
            tree.protect_host(host_nodes[-1])
            if ctrl.evict_device(tiered, req.req_id, now):
                lb_slots = ctrl.dev_alloc(tiered)  # HiCacheController.load: the load's slots first
            else:
                tree.release_host(host_nodes[-1])
                load, skip = False, "device_full"
        prefix_pages = dev_pages + tiered if load else dev_pages
        if not load and self._waits_for_next_batch(req, prefix_pages * ps, budget, first, may_chunk):
            tree.dec_lock(dev_node)
            return OTHER  # re-selected as recompute: the declined host part counted as input
        take = self._take(req.fill_len - prefix_pages * ps, budget)
        need = self._pages_through(req, prefix_pages * ps + take) - prefix_pages
        if self.r_batch_alloc_page:
            # 0.5.23: the extend is allocated with the batch (prepare_for_extend ->
            # alloc_paged_token_slots_extend, one eviction for every member: _alloc_batch), after
            # every member's prefix is locked; until then PrefillBudget.reserve holds its
            # page-ceiled extend against the pass's budget.
            if load:
                tree.release_host(host_nodes[-1])
            self._defer_alloc(req, need, take)
            slots = empty_run()
        else:
            # alloc_paged_token_slots_extend: the extend's eviction (with the rule set's page a request)
            if not ctrl.evict_device(need, req.req_id, now, reserve_pages=self.alloc_page):
                raise EngineError(f"request {req.req_id}: admitted with {need} device pages needed, but eviction "
                                  f"could not free them ({ctrl.device.free_pages} free, "
                                  f"{tree.evictable_device_pages} evictable)")
            if load:
                tree.release_host(host_nodes[-1])
            slots = ctrl.dev_alloc(need)
            assert slots is not None, "evict_device reported room that alloc could not find"
        lb_ns = 0
        lock_node = dev_node
        if load:
            first_page = dev_pages
            lb_ns, runs, wall, verified = ctrl.load_back(host_nodes, lb_slots, req.req_id, now,
                                                         req.keys[first_page:first_page + tiered])
            req.loadback_pages, req.loadback_runs, req.loadback_ns = tiered, runs, lb_ns
            req.host_loaded_pages, req.storage_loaded_pages = host_pages, storage_pages
            req.loadback_wall_ns, req.loadback_verified = wall, verified
            lock_node = host_nodes[-1]  # the request now holds the loaded path
            tree.inc_lock(lock_node)
            tree.dec_lock(dev_node)
        req.prefix_pages = prefix_pages
        req.lock_node = lock_node
        # cache_protected_len: reset to the new prefix after a load-back; the device part when
        # the load-back was declined (host nodes stay unlocked then, free to be evicted).
        req.protected_pages = prefix_pages
        req.device_prefix_pages = dev_pages
        req.host_match_pages = host_pages
        if storage_pages:
            req.storage_match_pages = max(req.storage_match_pages, storage_pages)
        req.loadback_skip_reason = skip
        req.loadback_skip_pages = tiered if skip else 0
        req.own_slots = slots
        req.own_from_page = prefix_pages
        req.done_tokens = prefix_pages * ps
        req.extend_total_tokens = req.fill_len - req.done_tokens
        req.scheduled_ns = now
        self._count_recomputed(req, match, skip is not None)
        if self.miss is not None:  # the pages this chunk computes, against its batch's (miss.py)
            self.miss.scheduled(req, now, prefix_pages, min((prefix_pages * ps + take) // ps, len(req.keys)))
            self.miss.matched(req, dev_pages + match.host_pages)
        if self.emit.matched is not None:
            self.emit.matched((now, req.req_id, dev_pages * ps, req.host_loaded_pages * ps,
                              req.storage_loaded_pages * ps, prefix_pages * ps, req.protected_pages * ps))
        if skip and self.emit.skipped is not None:
            self.emit.skipped((now, req.req_id, _HOST, tiered * ps, skip))
        if load:
            return take, lb_ns, tiered
        return take, 0, 0

    def _waits_for_next_batch(self, req: Req, prefix_tokens: int, budget: int, first: bool, may_chunk: bool) -> bool:
        """OTHER from the chunk shape: whether a request with `prefix_tokens` cached cannot join
        this batch. 0.5.9 `add_one_req`: a request after the first whose page-ceiled input is at
        least what is left of the budget. 0.5.23 `_select_prefill_admission` (chunked prefill on):
        such a request is chunked into what is left; only one that needs chunking while another
        chunked request goes on beside it waits (the budget always holds a page here)."""
        extend = -(-(req.fill_len - prefix_tokens) // self.ps) * self.ps
        if self.r_chunk_later:
            return not may_chunk and extend > budget
        return not first and extend >= budget

    def _count_recomputed(self, req: Req, match: TreeMatch, skipped: bool) -> None:
        """Computed pages that had been cached once, and the evictions that took this request's
        prefix off the device (demotions of its host part; demotions and deletions of pages it
        had to recompute or fetch back from storage). Which eviction took what is only for a probe
        that records it (request_evictions); the count of once-cached pages is always kept."""
        attribute = self.emit.lost is not None
        lost = req.lost if attribute else None
        ps = self.ps
        cached = self.ctrl.cached_once
        demoted = self.ctrl.demoted_by
        for node in match.host_nodes:
            if node.prefetched_for == req.seq:  # back from storage: who pushed it out
                blame(cached, demoted, node.keys, lost, ps)
            elif node.evicted_by is not None and attribute:
                lost[node.evicted_by] = lost.get(node.evicted_by, 0) + len(node.keys) * ps
        recomputed = req.loadback_skip_pages if skipped else 0
        path_pages = req.device_prefix_pages + match.host_pages
        # the key run's slice (the C reads it in place; blame_py takes a run as it takes an array),
        # not a numpy slice of keys_np (~1.5k instructions: its index parsing and buffer export)
        once = blame_keys(cached, demoted, req.keys[path_pages:req.input_len // ps], lost, ps)
        route = req.route
        if route.best_rank is not None and route.best_rank != self.rank:
            # In a deployment the cache is every rank's: pages another rank held at arrival (its
            # device + host prefix, deployment.py) were cached once too, though never here. Both
            # sets lead the part past the match (prefix closure), so together they are the longer.
            elsewhere = min((route.best_rank_device_tokens + route.best_rank_host_tokens) // ps,
                            req.input_len // ps) - path_pages
            once = max(once, elsewhere)
        req.recomputed_pages = recomputed + once

    def _continue_chunk(self, req: Req, budget: int, now: int) -> int | None:
        """PrefillAdder.add_chunked_req: the next chunk, at most the budget and, where memory is
        short, at most `rem_total_tokens` (`available_chunk_tokens`; none left: the budget, so
        the chunk goes on). Never page-floored: `_rem_tokens = min(rem_chunk_tokens,
        rem_total_tokens)` and the extend is min(what is left, `_rem_tokens`) in 0.5.9 and 0.5.23
        alike (only a new request's first chunk is floored, `_select_prefill_admission`); under
        mixed chunk the budget is `chunked_prefill_size` less the running requests' decode
        tokens, so a continuing chunk ends off a page boundary. None when eviction cannot free
        its pages."""
        remaining = req.fill_len - req.done_tokens
        mem = int(self._rem_total())
        take = min(remaining, budget if mem <= 0 or mem >= budget else mem)
        need = self._pages_through(req, req.done_tokens + take) - req.own_from_page - len(req.own_slots)
        if self.r_batch_alloc_page:
            if need > self.ctrl.device.free_pages + self.tree.evictable_device_pages:
                # available_chunk_tokens gave the whole budget (remaining_total spent), but free and
                # evictable memory cannot hold the chunk: alloc_paged_token_slots_extend would
                # raise "Prefill out of memory" and SGLang's scheduler would die. Reached when
                # shortest_prefill_chunk_limit let shorter requests in beside earlier chunks (their
                # add_one_req does not count this request's later chunks). The engine departs:
                # the chunk waits (decode steps free memory), as its 0.5.9 path does below.
                return None
            self._defer_alloc(req, max(need, 0), take)  # with the batch (0.5.23: _alloc_batch)
        elif need > 0:
            if not self.ctrl.evict_device(need, req.req_id, now, reserve_pages=self.alloc_page):
                return None
            req.own_slots.extend(self.ctrl.dev_alloc(need))
        return take

    def _defer_alloc(self, req: Req, pages: int, take: int) -> None:
        """0.5.23: a member's extend waits for the batch's allocation (`_alloc_batch`); the pass's
        budget holds its page-ceiled extend meanwhile (PrefillBudget.reserve: `immediate`)."""
        self._pending_alloc.append((req, pages, take))
        held = -(-take // self.ps) * self.ps
        self._total_offset += held
        self._cur_offset += held

    def _alloc_batch(self, items, now: int) -> None:
        """ScheduleBatch.prepare_for_extend -> alloc_for_extend -> alloc_paged_token_slots_extend
        (0.5.23): once every member is admitted (their prefixes locked), one eviction for the
        batch's `conservative_num_tokens` = its extend tokens (not page-ceiled) + a page a member
        (`evict_to_free_tokens`: the shortfall against the free tokens; at page 1
        `alloc_token_slots`, the extend alone), then each member's pages
        in batch order. The engine allocated each extend at its admission before (evicting a
        page-ceiled extend and a page each, then a page a member for the batch): more evicted
        when extends end mid-page, and victims chosen before later members had matched and
        locked their prefixes."""
        pending, self._pending_alloc = self._pending_alloc, []
        if not pending:
            return
        ps, ctrl = self.ps, self.ctrl
        conservative = len(items) * self.alloc_page * ps
        for entry in pending:
            conservative += entry[2]
        ctrl.evict_device(-(-conservative // ps), items[-1][0].req_id, now)
        for req, pages, _ in pending:
            if pages <= 0:
                continue
            slots = ctrl.dev_alloc(pages)
            if slots is None:
                raise EngineError(f"request {req.req_id}: admitted with {pages} device pages needed, but eviction "
                                  f"could not free them ({ctrl.device.free_pages} free, "
                                  f"{self.tree.evictable_device_pages} evictable)")
            req.own_slots += slots  # (extended in place: compiled, no method look-up and bound call)

    def _run_batch(self, items: list[tuple[Req, int, int, int]], now: int) -> int:
        """A prefill batch on the GPU; with `enable_mixed_chunk` it carries a decode step of the
        running requests (`mix_with_running`) when their next step fits (`check_decode_mem`;
        else they sit it out, nothing retracted), the batch then also taking that step's time."""
        cost, ctrl, ps = self.cost, self.ctrl, self.ps
        mixed_ns = 0
        if not self.running:
            self._admission_reopens = True  # (b) in schedule_pass: its members start the running batch
        if self.mixed_chunk and self.running and self._decode_fits(self.running, now):
            mixed_ns = self._decode_step(now)
            # mix_with_running moved the running requests into this batch and left the running
            # batch empty ("running_batch = ScheduleBatch(reqs=[], ...)"): at the next pass
            # get_next_batch_to_run makes this batch the running batch ("running_batch =
            # last_batch"), whose batch_is_full was never set, as (b) in schedule_pass
            self._admission_reopens = True
        self._batch_id += self.id_step
        bid = self._batch_id
        if self.emit.pool_sample is not None:
            self._sample_pools(now)
        # Load-backs queue on the host->device link in batch order.
        link = max(now, ctrl.h2d_free_ns)
        flops = []
        lb_bytes_total = 0
        for req, take, lb_ns, lb_pages in items:
            if lb_pages:
                start = link
                link = start + lb_ns
                req.loadback_queued_ns = start - now
                lb_bytes_total += lb_pages * ctrl.page_bytes
                ctrl.emit_load_back(start, link, req.req_id, lb_pages, req.loadback_runs, start - now,
                                    req.loadback_wall_ns, req.loadback_verified)
            flops.append(cost.prefill_flops(take, req.done_tokens))
        ctrl.h2d_free_ns = link
        # HRRN's clock: Scheduler.run_batch's `processed_tokens_counter += batch.extend_num_tokens`,
        # to which mix_with_running adds a token a running request. The batch becomes the running
        # batch when that was empty (get_next_batch_to_run: "running_batch = last_batch"; after a
        # mixed batch it always is), and each later decode step adds its count again (_decode).
        # (the batch's sums as loops: compiled, `sum` of a generator is a generator object and a
        # call into the builtin, ~1k instructions each, four a batch)
        taken = 0
        total_lb = 0
        for _, take, _, lb_pages in items:
            taken += take
            total_lb += lb_pages
        extend_num_tokens = taken + (len(self.running) if mixed_ns else 0)
        self.processed_tokens += extend_num_tokens
        if mixed_ns or not self.running:
            self._running_extend = extend_num_tokens
        load_ns = link - now
        flops_sum = _fsum(flops)
        compute_ns = cost.prefill_ns(flops_sum)
        blocking = ctrl.blocking_ns
        duration = cost.overlapped_ns(load_ns, compute_ns) + blocking
        exposed = duration - compute_ns - blocking
        duration += mixed_ns
        end = now + duration
        if mixed_ns and self.emit.decode_step is not None:
            self.emit.decode_step((now, end, self.dstep, tuple(r.req_id for r in self.running), (), bid,
                                   self.rank))
        total_flops = flops_sum or 1.0
        total_lb = total_lb or 1
        decoding = len(self.running)  # requests decoding (holding memory; in a mixed batch, decoding in it)
        batch_recompute_ns = 0.0  # of compute_ns: recomputing once-cached tokens (queue attribution)
        self.stats.batches += 1
        self.stats.busy_ns += duration
        # Recompute's part of the batch: what the batch would have taken less without it (its
        # marginal cost: the batch overhead and the weights-read floor are paid with or without
        # it), shared by each request's recomputed FLOPs. A request's once-cached tokens lead its
        # extend (prefix closure: what was lost follows what matched), so a chunk's part of them
        # is priced at their own positions: prefill_flops(r, p) + prefill_flops(t - r, p + r)
        # == prefill_flops(t, p). The request's new tokens get the rest of its share.
        rec_flops = []
        for req, take, _, _ in items:
            rec_end = req.fill_len - req.extend_total_tokens + min(req.recomputed_pages * ps, req.extend_total_tokens)
            r = min(take, rec_end - req.done_tokens)
            rec_flops.append(cost.prefill_flops(r, req.done_tokens) if r > 0 else 0.0)
        all_rec = _fsum(rec_flops)
        rec_per_flop = (compute_ns - cost.prefill_ns(flops_sum - all_rec)) / all_rec if all_rec else 0.0
        stash: Req | None = None
        for (req, take, lb_ns, lb_pages), f, rf in zip(items, flops, rec_flops):
            share = compute_ns * f / total_flops
            rec = rf * rec_per_flop
            req.recompute_ns += rec
            batch_recompute_ns += rec
            req.compute_ns += share - rec
            if lb_pages:
                req.loadback_exposed_ns += exposed * lb_pages / total_lb
            if req.first_batch_id is None:
                req.first_batch_id = bid
            req.num_chunks += 1
            self._write_chunk(req, take)
            req.done_tokens += take
            if req.done_tokens >= req.fill_len:
                if self.chunked is req:
                    self.chunked = None
                self.clock.at(end, self._prefill_done_fn, req)
            else:
                self.chunked = stash = req
            if self.emit.prefill_done is not None:
                self.emit.prefill_done((end, req.req_id, bid, req.num_chunks, take))
        self._join_front = 0 if mixed_ns else None
        if mixed_ns:
            # process_batch_result_prefill walks the mixed batch in its order, the new requests
            # first (mix_with_running appends the running ones): their inserts come before the
            # finishing decoders' (cache_finished_req), which LRU then sees as the more recent
            self._finish_step(end)
        if stash is not None:
            # the chunk goes into the tree at the next pass's start (get_next_batch_to_run ->
            # stash_chunked_request), after every insert and finish of process_batch_result:
            # its nodes are made, and stamped, after theirs (fifo / filo read the creation order)
            self.clock.at(end, self._cache_unfinished_fn, stash)
        cols = self.emit.batch_columns
        if cols is not None:  # a recorder's columns: the values unboxed (emitters.py)
            cols.add(bid, now, end, len(items), taken, lb_bytes_total, compute_ns + mixed_ns, exposed, decoding,
                     int(batch_recompute_ns), self.rank)
        elif self.emit.batch is not None:
            # A mixed batch's decode step is part of its compute (the rows' new compute)
            self.emit.batch((bid, now, end, len(items), taken, lb_bytes_total,
                            compute_ns + mixed_ns, exposed, decoding, int(batch_recompute_ns), self.rank))
        return end

    def _write_chunk(self, req: Req, take: int) -> None:
        """The prefill output of this chunk: KV content for the pages it completes (a chunk that
        ended mid-page, memory-limited, left that page for this one to finish)."""
        if not self.ctrl.writes_content:  # --verify off: nothing reads the content (controller.py)
            return
        ps = self.ps
        first = req.done_tokens // ps
        last = min((req.done_tokens + take) // ps, len(req.keys))
        if last > first:
            off = first - req.own_from_page
            # the key run's slice (the C writer reads it in place), not the numpy view's: a
            # numpy slice and its buffer export were ~700 instructions more a chunk (issue 41)
            self.ctrl.write_computed(req.own_slots[off:off + last - first], req.keys[first:last])

    # --- completion ----------------------------------------------------------------------
    def _cache_unfinished(self, req: Req) -> None:
        """A chunk that is not the last: Scheduler.stash_chunked_request ->
        cache_unfinished_req(chunked=True). The full pages computed so far enter the tree and stay
        locked; under 0.5.9 no hit is counted and nothing is backed up (_inc_hit_count skips
        chunked); under 0.5.23 the chunk's new pages count a hit and may be backed up at once."""
        ctrl = self.ctrl
        if self.rules.storage_acks_per_pass and ctrl.storage is not None:
            # the stash runs in the next pass, after that pass's arrivals are queried
            # (`_add_request_to_queue` -> `_prefetch_kvcache`: they match the tree without this
            # chunk), after its drain (the hits' host memory, the reads' inserts, then
            # `_drain_backup`: the storage writes it takes are done and their host copies free
            # before the chunk's backup makes host room) and after its re-queries
            # (`_process_storage_prefetch_retries`: they match without this chunk too); that
            # pass skips them (storage_pass_start)
            self.storage_pass_start(self.event_ns)
            self.storage_pass_done_ns = self.event_ns
        ctrl.stash_backups = True  # 0.5.23: its backups go with the next batch's (flush_backups)
        try:
            self._insert(req, min(req.done_tokens // self.ps, len(req.keys)), self.event_ns, chunk=True)
        finally:
            ctrl.stash_backups = False
        self._admission_reopens = True  # the batch's chunked_req leaves it at the next pass

    def _prefill_done(self, req: Req) -> None:
        """process_batch_result_prefill: the last chunk samples a token. A request that goes on
        decoding is inserted (cache_unfinished_req), so a request arriving now matches it on
        device while it decodes (the insert counts hits and starts write-through), and joins
        the running batch; one whose output is complete (a single output token) finishes now
        (release_kv_cache -> cache_finished_req)."""
        req.generated_tokens += 1
        req.kv_len = req.fill_len
        done = req.generated_tokens >= req.output_len
        if not done:
            self._insert(req, len(req.keys), self.event_ns, chunk=False)
        if req.first_token_ns is None:
            self._first_token(req)
        if done:
            self._admission_reopens = True  # finished in its prefill batch: filtered out of it
            self._finish(req)
        else:
            self._join(req)

    def _insert(self, req: Req, upto: int, now: int, *, chunk: bool) -> list[TreeNode]:
        """cache_unfinished_req / cache_finished_req: insert pages [0, upto) of req.keys; our
        slots for pages already on device are freed; the lock moves to the new end of the path.
        Which nodes gain a hit is the rule set's (`hits_past_inserted`): 0.5.9 counts every device
        node on the path outside chunk inserts (HiRadixCache._inc_hit_count(node, chunked)); 0.5.23
        counts, in every insert a chunk's included, the nodes ending past what this request's
        earlier inserts covered (`cache_inserted_len`). A node not backed up whose hits reach the
        write policy's threshold is backed up now (every counted insert retries a missing backup)."""
        if upto == 0:
            return []
        n = upto - req.own_from_page
        tree = self.tree
        if self.r_hits_past_inserted:
            count, inserted = self.count_hits, req.inserted_pages
        else:
            count, inserted = self.count_hits and not chunk, 0
        # The whole of a list or array goes in as it is, not as a copy (a finish inserts them
        # all): RadixTree.insert only reads what it is handed (what a node keeps it slices), so
        # the copies were one list of ints and one array view an insert more (issue 41)
        keys = req.keys
        own = req.own_slots
        if n == len(own):
            slots = own
            req.own_slots = empty_run()  # (what `del own_slots[:n]` below leaves of it)
        else:
            slots = own[:n]
        done = tree.insert(keys if upto == len(keys) else keys[:upto], req.own_from_page, slots, now, req.req_id,
                           count_hits=count, priority=req.priority, inserted=inserted)
        last, fresh = done.last, done.fresh
        req.inserted_pages = max(req.inserted_pages, upto)  # cache_inserted_len = max(.., page_aligned_len)
        if done.duplicate_slots:
            self.ctrl.dev_free(done.duplicate_slots)
        if slots is not own:
            del own[:n]
        req.own_from_page = upto
        if last is not req.lock_node:
            tree.inc_lock(last)
            tree.dec_lock(req.lock_node)
            req.lock_node = last
        if fresh:
            once_set = self.ctrl.once_set
            for node in fresh:
                once_set(node.keys, 0, outputs_last=True)
        threshold = self.backup_threshold
        if threshold is not None:
            chain = self.r_backup_chains
            for node in done.hit:
                if node.host is None and node.device is not None and node.hit_count >= threshold:
                    if chain:
                        self.ctrl.backup_chain(node, req.req_id, now)
                    else:
                        self.ctrl.backup(node, req.req_id, now)
        return fresh

    def _first_token(self, req: Req) -> None:
        now = self.event_ns
        req.first_token_ns = now
        ttft = now - req.arrival_ns
        self.stats.ttft_ns.append(ttft)
        if self.emit.first_token is not None:
            self.emit.first_token((now, req.req_id, ttft))
