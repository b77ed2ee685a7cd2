"""Decode steps on the clock, the Scheduler's mixin: a running batch that decodes when no
prefill batch is formed (or beside one, with mixed chunk), its memory taken step by step, a
retraction when a step does not fit, and the finish (cache_finished_req: insert, unlock, free).
SGLang: scheduler.py's update_running_batch, schedule_batch.py's check_decode_mem /
retract_decode, scheduler_output_processor_mixin.py; each function names the one it restates."""

from __future__ import annotations

from heapq import heappop, heappush
from typing import Any, Callable, Final

from tierdiag.engine.costmodel import CostModel
from tierdiag.engine.prefetch import StoragePrefetch
from tierdiag.engine.request import FIRST_PASS_FIELDS, Req
from tierdiag.engine.schedule_common import (_APPEND_C, CLIP_MAX_NEW_TOKENS, INT64_MAX, MIN_NEW_TOKEN_RATIO,
                                             NEW_TOKEN_RATIO_DECAY, RETRACT_DECODE_STEPS,
                                             append_output_keys_c)
from tierdiag.trace.pages import append_output_keys_py, extend_output_keys
from tierdiag.engine.tree_node import empty_run
from tierdiag.native import cplane


# Final: a C static the compiled module reads, where an imported name is a look-up in the module's
# dict at every use (~130 instructions; issue 41, session 24)
_HEAPPUSH: Final = heappush
_HEAPPOP: Final = heappop


def _in_batch_order(due: list[Req], running: list[Req]) -> list[Req]:
    """`due` in the running batch's order (one not in it first, as its place were 0). A function
    of its own: compiled, the sort key's closure was an environment object made at every call of
    the method that held it, a decode step's, though only a step with two finishes sorts."""
    where = {id(r): i for i, r in enumerate(running)}
    return sorted(due, key=lambda r: where.get(id(r), 0))


def _drop(items: list[Any], req: object) -> None:
    """`items.remove(req)` by identity, which is what `remove` compares a Req by (it has no
    __eq__): compiled, a native scan of the list. `remove` compared each request before it
    through PyObject_RichCompare's fallbacks (~100 instructions a request, the running batch
    ~55 long at a finish in the conversation trace: ~2.7k instructions a finish; issue 41)."""
    for i in range(len(items)):
        if items[i] is req:
            del items[i]
            return
    raise ValueError("list.remove(x): x not in list")


def decode_steps_py(ring: list[list[Req]], ps: int, k: int, end: int, limit: int | None, fin_step: int, base: int,
                    n: int, ratio: float, cost: CostModel, wakes: list[int] | None, give: Callable[[int], int],
                    emit: Any = None, running: list[Req] | None = None, rank: int = 0) -> tuple[int, int, int, float, bool]:
    """_decode_ahead's steps k + 1, ... from `end`: `_decode`'s and `_decode_step`'s (`give(k)` where the
    ring slot has pages due: the free pages after), until the end reaches `limit`, the free pages fall
    below the `n` running or step fin_step - 1 ran: (k, end, steps, ratio, True). decode_steps_c's reference."""
    decay, floor = NEW_TOKEN_RATIO_DECAY, MIN_NEW_TOKEN_RATIO
    bounded, until = limit is not None, limit if limit is not None else 0
    free = n  # (the caller saw at least n free: only a give changes it)
    steps = 0
    while True:
        ratio -= decay
        if ratio < floor:
            ratio = floor
        k += 1
        if ring[k % ps]:
            free = give(k)
        now = end
        end = now + cost.decode_step_ns(base + n * k)
        steps += 1
        if wakes is not None:
            wakes.append(now)
        if emit is not None and running is not None:
            emit((now, end, k, tuple(r.req_id for r in running), (), None, rank))
        if (bounded and end >= until) or free < n or fin_step == k + 1:
            return k, end, steps, ratio, True


_decode_steps_native: Final = cplane.compiled("decode_steps")
# decode_steps_c's last cost model and its clock's terms, one tuple (a run's ranks share the model)
_CLOCK: Final[list[Any]] = [None, ()]


def decode_steps_c(ring: list[list[Req]], ps: int, k: int, end: int, limit: int | None, fin_step: int, base: int,
                   n: int, ratio: float, cost: CostModel, wakes: list[int] | None, give: Callable[[int], int],
                   emit: Any = None, running: list[Req] | None = None, rank: int = 0) -> tuple[int, int, int, float, bool]:
    """decode_steps_py by the data plane's C (csrc/router.c; issue 41: ~2.7 M steps a --dp 8 conversation
    replay). Where a step's values leave int64 the reference runs on; other types, or a probe: the reference."""
    if emit is not None:
        return decode_steps_py(ring, ps, k, end, limit, fin_step, base, n, ratio, cost, wakes, give, emit, running, rank)
    if _CLOCK[0] is not cost:
        _CLOCK[0] = cost
        _CLOCK[1] = (cost._decode_fitted, cost._decode_base, cost._decode_per_token, cost.kv_bytes_per_token,
                     float(cost.hbm_bytes_per_s), cost._decode_overhead_ns, NEW_TOKEN_RATIO_DECAY, MIN_NEW_TOKEN_RATIO)
    got = _decode_steps_native(ring, ps, k, end, limit, fin_step, base, n, ratio, _CLOCK[1], wakes, give)
    if isinstance(got, int):
        return decode_steps_py(ring, ps, k, end, limit, fin_step, base, n, ratio, cost, wakes, give)
    res: tuple[int, int, float, bool] = got  # (k, end, ratio, done: the steps are k's)
    if res[3]:
        return res[0], res[1], res[0] - k, res[2], True
    more = decode_steps_py(ring, ps, res[0], res[1], limit, fin_step, base, n, res[2], cost, wakes, give)
    return more[0], more[1], more[0] - k, more[3], True


decode_steps = cplane.choose("decode.decode_steps", decode_steps_c, decode_steps_py)
_STEPS_C: Final = decode_steps is decode_steps_c  # (each called by name below: a native call, compiled)


class DecodeSteps(StoragePrefetch):
    """Scheduler's decode steps, retraction and finish (a mixin: its state is Scheduler's)."""

    # The loops run the passes that can only be plain decode steps at once (`run_decode_ahead`);
    # False: every pass goes round the loop, the reference the fast path is tested against
    # (tests/engine/test_fast_paths.py: every event identical).
    decode_ahead: bool = True

    def _generated(self, req: Req) -> int:
        """Output tokens a running request has (len(output_ids)), after `dstep` decode steps."""
        return req.generated_tokens + self.dstep - req.join_step

    def _join(self, req: Req) -> None:
        """The request joins the running batch (get_next_batch_to_run merges the last prefill
        batch into it). Its next page and its finish are due on the decode clock: each decode
        step allocates the slot of the token it reads (kv_len before the step), a page when
        that slot starts one (`new_tokens_required_next_decode`: kv_committed_len % page == 0)."""
        k0 = self.dstep
        req.join_step = k0
        req.in_running = True
        self._kv_base += req.kv_len - k0
        req.finish_step = k0 + req.output_len - req.generated_tokens
        due = self._finish_due.get(req.finish_step)
        if due is None:
            self._finish_due[req.finish_step] = [req]
            _HEAPPUSH(self._finish_steps, req.finish_step)
        else:
            due.append(req)
        if req.output_len - req.generated_tokens > CLIP_MAX_NEW_TOKENS:
            self._long.append(req)
        else:
            self._fin_sum += req.finish_step
            self._n_short += 1
        nxt = k0 + 1 + (-req.kv_len) % self.ps
        req.next_page = nxt
        if nxt <= req.finish_step:
            self._page_ring[nxt % self.ps].append(req)
        if self._join_front is None:
            self.running.append(req)
        else:
            # after a mixed batch the running batch is that batch (`running_batch = last_batch`),
            # its new requests first (`mix_with_running` appended the running ones after them)
            self.running.insert(self._join_front, req)
            self._join_front += 1

    def _leave(self, req: Req) -> None:
        """Out of the running batch (finished or retracted): `filter_batch`, which also lets
        admission try again (`batch_is_full = False`)."""
        if not req.in_running:
            return
        req.in_running = False
        if req in self._long:
            self._long.remove(req)
        else:
            self._fin_sum -= req.finish_step
            self._n_short -= 1
        steps = self.dstep - req.join_step
        self._kv_base -= req.kv_len - req.join_step
        req.kv_len += steps
        req.generated_tokens += steps
        req.join_step = self.dstep
        _drop(self.running, req)
        slot = self._page_ring[req.next_page % self.ps]  # (it is there only for its next page)
        if req in slot:
            slot.remove(req)
        due = self._finish_due.get(req.finish_step)
        if due is not None and req in due:
            due.remove(req)
        self.batch_is_full = False

    def _decode_fits(self, reqs, now: int) -> bool:
        """ScheduleBatch.check_decode_mem: the pages the next step of `reqs` needs, after
        evicting for them (`check_decode_capacity` -> `evict_to_free_tokens`)."""
        k = self.dstep + 1
        due = self._page_ring[k % self.ps]
        if not due:
            return True
        if reqs is self.running:
            need = due
        else:
            chosen = set(map(id, reqs))
            need = [r for r in due if id(r) in chosen]
        if not need or len(need) <= self.ctrl.device.free_pages:
            return True  # (evict_to_free_tokens evicts nothing when the pages are free)
        return self.ctrl.evict_device(len(need), need[0].req_id, now)

    def _give_pages(self, due: list[Req], k: int) -> None:
        """Decode step `k`'s pages: each request in `due` (its slot starts a page at this step)
        gets one, and is due again a page later while its output lasts. The caller checked the
        room (check_decode_mem / free_pages), so the allocation cannot fail."""
        alloc = self.ctrl.dev_alloc
        ps = self.ps
        ring = self._page_ring
        for r in due:
            slots = alloc(1)
            assert slots is not None, "the step's room was checked, yet alloc found no page"
            r.own_slots += slots  # (extended in place: compiled, no method look-up and bound call)
            nxt = k + ps
            r.next_page = nxt
            if nxt <= r.finish_step:
                ring[nxt % ps].append(r)

    def _give_step(self, k: int) -> int:
        """decode_steps' step k, its ring slot not empty: its pages given; the free pages after."""
        ring = self._page_ring
        due = ring[k % self.ps]
        ring[k % self.ps] = []
        self._give_pages(due, k)
        return self.ctrl.device.free_pages

    def _decode_step(self, now: int) -> int:
        """prepare_for_decode + the step's time: `alloc_for_decode` evicts for a page a running
        request, then gives each request whose slot starts a page that page; the step reads the weights and every running request's
        KV (`decode_step_ns` of the seq_lens after the step's slot). The decode clock advances;
        requests whose output is then complete finish when the step ends."""
        k = self.dstep + 1
        # alloc_paged_token_slots_decode (both releases; alloc_token_slots at page 1): "Over
        # estimate the number of tokens: assume each request needs a new page", evicting for a
        # page a running request whatever the step needs
        n = len(self.running)
        if self.ctrl.device.free_pages < n:
            self.ctrl.evict_device(n, self.running[0].req_id, now)
        ring = self._page_ring
        due = ring[k % self.ps]
        if due:
            ring[k % self.ps] = []  # (the slot of their next pages, a page later)
            self._give_pages(due, k)
        ctx = self._kv_base + len(self.running) * k
        self.dstep = k
        self.stats.decode_steps += 1
        return self.cost.decode_step_ns(ctx)

    def _finish_step(self, end: int) -> None:
        """The step's end: requests whose output is complete finish then (the event loop runs
        them before the next pass), in the running batch's order (process_batch_result walks
        the batch: the order their finish inserts stamp the tree)."""
        finish_due = self._finish_due
        k = self.dstep
        due = finish_due.get(k)  # (get and del: compiled, `dict.pop` is a generic method call)
        if due is None:
            return
        del finish_due[k]
        if len(due) > 1:
            due = _in_batch_order(due, self.running)
        for r in due:
            self.clock.at(end, self._finish_fn, r)

    def _decode(self, now: int) -> int | None:
        """Scheduler.update_running_batch: `check_decode_mem`; when the step does not fit,
        `retract_decode`, else `new_token_ratio` decays; then the step (`prepare_for_decode`)."""
        retracted: tuple | list[Req] = ()
        if not self._decode_fits(self.running, now):
            retracted = self._retract(now)
            if not self.running:
                # The last request was aborted and its memory freed: the event loop polls again
                # at once (get_next_batch_to_run finds no batch, the next iteration tries the
                # waiting queue and the chunked request), not at the next arrival.
                return now if (self.waiting or self.chunked is not None) else None
        else:
            self.new_token_ratio = max(self.new_token_ratio - NEW_TOKEN_RATIO_DECAY, MIN_NEW_TOKEN_RATIO)
        # the step, after any write-back its eviction waited for (write_back: blocking copies)
        end = now + self._decode_step(now) + self.ctrl.blocking_ns
        self.processed_tokens += self._running_extend  # Scheduler.run_batch: the running batch's stale count
        if self.emit.decode_step is not None:
            self.emit.decode_step((now, end, self.dstep, tuple(r.req_id for r in self.running),
                                   tuple(r.req_id for r in retracted), None, self.rank))
        self._finish_step(end)
        self._note_decode(now, end)
        return end

    def run_decode_ahead(self, end: int, limit: int | None, wakes: list[int] | None = None,
                         fold: Callable[[int], int | None] | None = None) -> int:
        """`_decode_ahead`, and where the loop gives `fold` (its wakes at or before a time, run
        as the loop runs them: arrivals, then events; the next wake after it returned), the
        wakes that stopped it run here too, and the plain decode steps go on after them while
        they leave the next pass a plain decode step: an arrival while admission is shut
        (`batch_is_full`), a copy's ack. The loop then meets what it would have met at that
        pass's time, with the same things done before it (issue 41: the conversation trace's
        65k decode steps were each a trip round the loop, its queue never empty)."""
        while True:
            nxt = self._decode_ahead(end, limit, wakes)
            if fold is None or limit is None or nxt < limit:
                return nxt  # stopped by what the next pass is, not by a wake before it
            limit = fold(nxt)  # the wakes up to the next pass (inclusive: they go before it)
            if limit is not None and limit < 0:
                return nxt  # the loop goes on from there (a closed loop met a session)
            end = nxt

    def _decode_ahead(self, end: int, limit: int | None, wakes: list[int] | None) -> int:
        """The scheduling passes after the one that just ended at `end`, run here at once while
        each can only be a plain decode step that touches nothing outside this scheduler: a pass
        at time t < `limit` (the loop's next arrival or event: nothing from outside reaches
        this scheduler before it), no chunked request and nobody waiting, or admission shut
        (`batch_is_full`: so `schedule_pass` forms no prefill batch), room for the step's pages without eviction (`free_pages` >= running:
        no eviction, no retraction, no write-back, no event), no backup queued for the next
        pass's flush (0.5.23 `flush_pending_backups`, at `schedule_pass`'s head), and no request
        finishing at the step (its finish is an event the loop runs in order). Each pass is `schedule_pass`'s, inline,
        in that case: ack_loads, the prefetch re-query clock, admission reopened, `_decode`.
        Returns when the GPU is free again: the loop's next pass for this scheduler; `wakes`
        gets the time of each pass run here (a deployment's loop still wakes then for a rank
        whose pass ran nothing: such a rank passes at every wake). The rows
        and the clock are the ones the loop would make pass by pass (issue 41: a `--dp 8`
        replay ran ~37x the passes of `--dp 1`, each one a trip round the deployment's loop)."""
        running = self.running
        if not running or self.chunked is not None:
            return end
        if self.waiting and (not self.batch_is_full or self._admission_reopens or self.unqueried
                             or len(self.requeries)):
            # requests wait: the pass forms no prefill batch only while admission stays shut
            # (`batch_is_full`, which only a request leaving the running batch clears: a finish
            # is an event, a retraction a step that does not fit) and the pass's storage half
            # has nobody's query or re-query to run
            return end
        if limit is not None and end >= limit:
            return end
        ctrl = self.ctrl
        k = self.dstep
        # the first step with a finish due after k: the least key above k. A key leaves
        # _finish_due only at its own step (`_finish_step`, k == the key) and the decode clock
        # never goes back, so a heap entry at or below k is spent and every one above k is a
        # key of _finish_due (its list may be empty: a request left, a finish the steps stop
        # before all the same); a test of each head's key there was a dict look-up a call
        # (~123k calls on a --dp 8 conversation replay, issue 41 session 34)
        due_steps = self._finish_steps
        while due_steps and due_steps[0] <= k:
            _HEAPPOP(due_steps)
        fin = due_steps[0] if due_steps else None
        if fin == k + 1:
            return end
        if ctrl.backup_queue or ctrl.backup_later:  # the next pass's `schedule_pass` flushes them first
            return end
        if ctrl.storage_writes or self.unallocated or self.query_occupied or self.reading or ctrl.prefetch_tails \
                or self.held_releases:  # (a held release: `_drain_release` frees it at a pass's drain)
            return end  # a pass's drain has storage work (storage_acks_per_pass): schedule_pass's
        # (read after the tests above: the device pool's count is a property of the data plane's
        # class, a generic attribute read from here, ~350 instructions; most calls that run
        # nothing stop above, issue 41 session 34)
        n = len(running)
        free: int = ctrl.device.free_pages  # (typed: compared natively)
        if free < n:
            return end
        # schedule_pass's head, once: nothing waits, so no prefill batch is formed
        ctrl.blocking_ns = 0
        if ctrl.loads_pending:
            ctrl.ack_loads()
        if self._admission_reopens:
            self._admission_reopens = False
            self.batch_is_full = False
        ratio: float = self.new_token_ratio  # (an unboxed float: the declared attribute is Any)
        start = end
        fin_step = fin if fin is not None else -1  # k + 1 >= 1: never met where nobody finishes
        if _STEPS_C:
            k, end, steps, ratio, _ = decode_steps_c(self._page_ring, self.ps, k, end, limit, fin_step, self._kv_base, n,
                                                     ratio, self.cost, wakes, self._give_step_fn, self.emit.decode_step,
                                                     running, self.rank)
        else:
            k, end, steps, ratio, _ = decode_steps_py(self._page_ring, self.ps, k, end, limit, fin_step, self._kv_base, n,
                                                      ratio, self.cost, wakes, self._give_step_fn, self.emit.decode_step,
                                                      running, self.rank)
        self.dstep = k
        self.stats.decode_steps += steps
        self.processed_tokens += steps * self._running_extend  # as _decode, a step at a time
        if self.retry_interval:  # (the rule field, typed: Scheduler.__init__)
            self.prefetch_pass += steps  # _retry_prefetches: nobody waits, nothing else to do
        self.new_token_ratio = ratio
        self._note_decode(start, end)  # the steps back to back: one run on the clock
        return end

    def _retract(self, now: int) -> list[Req]:
        """ScheduleBatch.retract_decode: requests ordered by (output so far, -input) descending
        (`_get_decode_retraction_order`), the last retracted first, at least one and until the
        rest's next step fits (`check_decode_mem(selected_indices)`), one always kept; each
        released without a checkpoint (`release_req` -> `release_kv_cache(checkpoint=False)`:
        its own KV freed, its lock dropped, what it had inserted stays cached) and the tree
        evicted for 20 decode steps of each request left (`evict_from_tree_cache`,
        SGLANG_RETRACT_DECODE_STEPS); back at the end of the waiting queue
        (`_add_request_to_queue`), to prefill its input and its output so far again. The last
        one, if even it does not fit, is aborted. `new_token_ratio` becomes
        (generated + 20 x kept) / (max_new of the kept + 1), at most 1."""
        running = self.running
        order = sorted(range(len(running)), key=lambda i: (self._generated(running[i]), -running[i].input_len),
                       reverse=True)
        retracted: list[Req] = []
        first = True
        while first or not self._decode_fits([running[i] for i in order], now):
            if len(order) == 1:
                break
            first = False
            req = running[order.pop()]
            self._release(req)
            pages = -(-len(order) * RETRACT_DECODE_STEPS // self.ps)
            if pages:
                self.ctrl.evict_device(pages, req.req_id, now)
            retracted.append(req)
        aborted = None
        if len(order) <= 1 and not self._decode_fits([running[i] for i in order], now):
            aborted = running[order.pop()]
            self._release(aborted)
        kept = [running[i] for i in order]  # filter_batch(keep_indices=sorted_indices)
        keep = set(map(id, kept))
        for r in list(running):
            if id(r) not in keep:
                self._leave(r)
        self.running = kept
        self.new_token_ratio = min(1.0, (sum(self._generated(r) for r in kept) + RETRACT_DECODE_STEPS * len(kept))
                                   / (sum(r.output_len for r in kept) + 1))
        self.stats.retractions += len(retracted)
        for i, req in enumerate(retracted):
            self._requeue(req, now, i)
        if aborted is not None:
            self._abort(aborted, now)
        return retracted

    def _release(self, req: Req) -> None:
        """release_kv_cache(checkpoint=False): the request's own pages are freed (what it
        inserted stays in the tree, unlocked), its lock dropped."""
        self.ctrl.dev_free(req.own_slots)
        req.own_slots = empty_run()
        self.tree.dec_lock(req.lock_node)
        req.lock_node = None

    def _requeue(self, req: Req, now: int, order: int = 0) -> None:
        """Req.reset_for_retract + _add_request_to_queue(is_retracted=True): prefix, protected
        and inserted lengths back to 0, the output so far kept (its next prefill is input +
        output: `fill_len`); at the end of the waiting queue, its storage prefetch started again.
        The record keeps what its first admission found (`first_pass`)."""
        if req.first_pass is None:
            req.first_pass = tuple(getattr(req, f) for f in FIRST_PASS_FIELDS)
        req.retractions += 1
        req.kv_len = 0
        req.fill_len = req.input_len + req.generated_tokens
        ps = self.ps
        n_in = req.input_len // ps
        n_fill = req.fill_len // ps
        if n_fill > len(req.keys):
            req.keys_np = extend_output_keys(req.req_id, req.keys, req.keys_np, n_in, n_fill)
        req.max_match_pages = min(len(req.keys), (req.fill_len - 1) // ps)
        req.inserted_pages = req.protected_pages = req.prefix_pages = req.device_prefix_pages = 0
        req.done_tokens = 0
        req.own_from_page = 0
        req.prefetch_retries = 0
        req.storage_hit_end = None
        req.storage_last_match = 0  # _add_request_to_queue(is_retracted=True)
        self.waiting.append(req)
        req.queue_entry = (now, order, req.seq)  # set_wait_queue_entry_time at the retraction
        self.arrived_at[req.seq] = self.processed_tokens
        if self.ctrl.storage is not None and req.prefetch is None:
            self._start_prefetch(req, now)

    def _abort(self, req: Req, now: int) -> None:
        """retract_decode's last request, out of memory even alone: aborted (FINISH_ABORT)."""
        self._leave(req)
        said = "" if self.rules.decode_oom_aborts else f" (SGLang {self.rules.version} raises here and stops)"
        self._reject(req, "aborted: out of device memory for its next decode step even after retracting every "
                          f"other running request{said}")

    def _finish(self, req: Req) -> None:
        """cache_finished_req: the committed KV, input and output (all but the last output token,
        which never went through the model), page-aligned, is inserted; the unaligned tail is freed.
        Output pages get synthetic keys (trace.pages.output_page_keys): no later trace request
        carries the same tokens, so they take device (and host) room without ever being hit."""
        now = self.event_ns
        ps = self.ps
        self._leave(req)
        n_full = (req.input_len + max(req.output_len - 1, 0)) // ps
        n_in = req.input_len // ps
        have = len(req.keys)
        if n_full > have:
            # No content is written for output pages: their keys are this request's own, so no
            # request ever matches them and no load-back reads (or verifies) them back. Their
            # copies to host and storage still run, as the real ones would.
            # The keys alone: `keys_np` (the prefill's writes, the arrival's blame) is read by no
            # one after the finish, so it is not made again with them (a copy of every key and an
            # allocation a finish, ~2 % of Engine.run; issue 41, session 24) but let go below.
            if _APPEND_C:
                append_output_keys_c(req.req_id, req.keys, n_in, n_full)
            else:
                append_output_keys_py(req.req_id, req.keys, n_in, n_full)
        req.keys_np = None
        self._insert(req, n_full, now, chunk=False)
        if self.rules.finish_reinserts_prompt and 0 < n_in < n_full:
            # checkpoint_into_tree's second insert: the prompt again at priority + 1, on device
            # (our lock covers it), nothing to free, no node past `inserted_len` (no hit).
            self.tree.insert(req.keys[:n_in], n_in, [], now, req.req_id, count_hits=self.count_hits,
                             priority=min(req.priority + 1, INT64_MAX), inserted=n_in)
        self.ctrl.dev_free(req.own_slots)
        req.own_slots = empty_run()
        self.tree.dec_lock(req.lock_node)
        req.lock_node = None
        self._record(req, now)
        if self.on_leave is not None:
            self.on_leave(req, now)
        if req.session is not None and self.arrivals.closed:
            self.arrivals.finished(req.session, now)
