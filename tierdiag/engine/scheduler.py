"""The scheduler on a virtual clock: arrivals, a waiting queue (FCFS or LPM), prefill batches
under a token budget with chunked prefill, admission gated on PrefillAdder's memory budget,
decode steps on the same clock (with their memory and retraction), and `cache_unfinished_req` /
`cache_finished_req` into the tree. The rules mirror SGLang (managers/scheduler.py,
schedule_policy.py, schedule_batch.py, scheduler_output_processor_mixin.py, mem_cache/), the
release's where they differ (rules.py); each function names the one it restates.

A request's life (times on the virtual clock):

    arrival (storage prefetch starts) ──queue──► admitted: match_prefix, whole request within
        the memory budget? (else it waits), load-back, alloc its extend ──prefill chunk(s)
        (chunk insert after each)──► last chunk: insert input pages (cache_unfinished_req),
        first token, joins the running batch ──decode steps (output_len - 1, each when no
        prefill batch is formed; a page when a step's slot starts one; retracted to the queue
        when a step does not fit)──► finish: insert input + output pages (cache_finished_req),
        unlock, free the rest

Token split at admission (`prefix_indices` = device original + what load-back restored):

    input  |-- device --|-- host --|-- storage --|------------ computed ------------|x|
           |<------ prefix_indices (usable) ---->|<------ extend_input_len ---------->|
    (the last input token is always computed; only full pages are matched)
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from typing import Callable, Iterable

import numpy as np

from tierdiag.config.names import Tier, WritePolicy
from tierdiag.config.engine import EngineConfig
from tierdiag.engine.arrivals import ArrivalSource, pause_ms
from tierdiag.engine.controller import CacheController, EngineStats
from tierdiag.engine.costmodel import CostModel
from tierdiag.engine.miss import MissTracker
from tierdiag.engine.pagemap import blame
from tierdiag.engine.prefetch import StoragePrefetch, prefetch_limit_tokens
from tierdiag.engine.queue_policy import queue_policy
from tierdiag.engine.request import FIRST_PASS_FIELDS, Req, RequestRecords
from tierdiag.engine.rules import config_rules
from tierdiag.engine.tree import RadixTree, TreeNode
from tierdiag.errors import TierdiagError
from tierdiag.probes import events as ev
from tierdiag.trace.pages import output_page_keys, page_keys_array
from tierdiag.trace.reader import TraceRequest

# Decode memory (both releases, environ.py): new_token_ratio starts at SGLANG_INIT_NEW_TOKEN_RATIO
# (0.7) x schedule_conservativeness (1), decays by (init - init x SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
# (0.14)) / SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS (600) every decode step that retracts nothing, is
# reset when the scheduler idles; a running request reserves min(max_new - out, CLIP) x ratio.
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = INIT_NEW_TOKEN_RATIO * 0.14
NEW_TOKEN_RATIO_DECAY = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / 600
RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS
CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
NO_TOKEN, OTHER = "no_token", "other"  # AddReqResult: memory, or anything else (the shape, the budget)
INT64_MAX = 2**63 - 1  # checkpoint_into_tree: min(priority + 1, torch.iinfo(torch.int64).max)
# HiRadixCache.write_through_threshold: insert hits that trigger a device->host backup.
WRITE_THROUGH_THRESHOLD = {WritePolicy.WRITE_THROUGH: 1, WritePolicy.WRITE_THROUGH_SELECTIVE: 2}


class EngineError(TierdiagError):
    """The engine cannot make progress (a bug or an impossible configuration)."""


class Scheduler(StoragePrefetch, RequestRecords):
    """The loop on the virtual clock, admission and batches, completion into the tree; the
    storage prefetch (prefetch.py) and the request records (request.py) are its mixins, the
    queue order a function of queue_policy.py."""

    def __init__(self, cfg: EngineConfig, cost: CostModel, tree: RadixTree, ctrl: CacheController,
                 probe, stats: EngineStats, progress: Callable[[int, int, EngineStats], None] | None = None):
        self.cfg = cfg
        self.rules = config_rules(cfg)  # what differs between SGLang releases (rules.py)
        self.queue = queue_policy(cfg.schedule_policy, self.rules.version, self.rules)  # --schedule-policy (queue_policy.py)
        self.processed_tokens, self.arrived_at = 0, {}  # HRRN's token clock: processed_tokens_counter, per-seq snapshot
        self.cost = cost
        self.tree = tree
        self.ctrl = ctrl
        self.probe = probe
        self.emit = ev.Emitters(probe)  # one callable an event kind, None where nothing is emitted
        self.miss = MissTracker(cfg.page_size) if self.emit.record is not None else None  # miss reasons' facts (miss.py)
        self.stats = stats
        self.progress = progress
        self.ps = cfg.page_size
        self.waiting: list[Req] = []
        # alloc_for_extend (both releases): at page 1 `alloc_token_slots(extend_num_tokens)`
        # evicts for the extend alone; above, alloc_paged_token_slots_extend asks a page a request more
        self.alloc_page = self.rules.alloc_overhead_pages if self.ps > 1 else 0
        self._pending_alloc: list[tuple[Req, int, int]] = []  # 0.5.23: extends allocated with the batch
        self.chunked: Req | None = None
        # The running (decoding) batch, in merge order, and what SGLang keeps beside it:
        # `batch_is_full` (a NO_TOKEN with requests running shuts admission until one leaves),
        # `new_token_ratio`, the decode steps run so far (`dstep`, the decode clock each request's
        # next page and finish are due on), S = sum(kv_len - join step) over running requests, so
        # a step's KV read is S + len(running) x step.
        self.running: list[Req] = []
        self.batch_is_full = False
        self._admission_reopens = False  # the next pass clears batch_is_full (_batch)
        self._join_front = None  # where the next joiner goes in `running` (after a mixed batch: the front)
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self.dstep = 0
        self._kv_base = 0
        self._page_due: dict[int, list[Req]] = {}
        self._fin_sum = self._n_short = 0  # running requests' finish steps (those with <= 4096 to go)
        self._long: list[Req] = []  # running requests that joined with more than 4096 tokens to go
        self._finish_due: dict[int, list[Req]] = {}
        self.mixed_chunk = cfg.enable_mixed_chunk
        # Runs of back-to-back decode steps on the clock (start, end, decode time before the
        # run): a request's record says how much of its wait was decode steps (`decode_before`).
        self._drun_starts: list[int] = []
        self._drun_ends: list[int] = []
        self._drun_cum: list[int] = []
        self._events: list = []
        self._order = 0
        self._batch_id = 0
        self._current = 0  # virtual time of the event being handled
        self.count_hits = cfg.write_policy != WritePolicy.WRITE_BACK  # _inc_hit_count returns early under write_back
        self.backup_threshold = WRITE_THROUGH_THRESHOLD.get(cfg.write_policy)
        self.prefetch_threshold = max(cfg.prefetch_threshold, self.ps)  # HiCacheController: >= a page
        self.prefetch_limit_tokens = prefetch_limit_tokens(self.rules, ctrl.host.capacity, ctrl.device.capacity,
                                                           self.ps)
        self.prefetch_tokens_occupied = 0
        self.prefetch_retry_due: dict[int, int | None] = {}  # req seq -> pass its re-query is due (0.5.23)
        self.prefetch_pass = 0  # scheduling passes, the re-queries' clock
        # SchedulePolicy._waiting_prefix_refresh_calls: the passes that reached the refresh (0.5.23)
        self.refresh_calls = 0
        self.refresh_interval = (self.rules.waiting_prefix_refresh_interval
                                 if cfg.waiting_prefix_refresh and cfg.eviction_policy == "lru" else 0)
        self.max_context = cfg.resolved_max_context()
        self.arrivals: ArrivalSource | None = None  # the trace's arrivals, open or closed loop (run)
        self.rank = 0  # the data-parallel rank (its rows' dp_rank; engine/deployment.py)
        self.id_step = 1  # batch ids: rank + 1, then every num_ranks-th
        # Called with (request, now) when a request leaves this scheduler, finished or rejected
        # (a deployment's router counts what it has in flight); None: nobody asks.
        self.on_leave: Callable[[Req, int], None] | None = None
        ctrl.at = self.at

    def as_rank(self, rank: int, num_ranks: int) -> None:
        """Rank `rank` of a deployment of `num_ranks` (engine/deployment.py): every row it and its
        controller emit says so, and its batch, node, eviction and transfer ids are rank + 1,
        then every num_ranks-th, so no two ranks' ids meet. Rank 0 of 1 is the default."""
        self.rank, self.id_step = rank, num_ranks
        self._batch_id = rank + 1 - num_ranks
        self.tree.number_nodes(rank + 1, num_ranks)
        self.ctrl.as_rank(rank, num_ranks)

    def at(self, t_ns: int, fn, arg) -> None:
        self._order += 1
        heapq.heappush(self._events, (t_ns, self._order, fn, arg))

    # --- main loop -----------------------------------------------------------------------
    def run(self, requests: Iterable[TraceRequest]) -> EngineStats:
        src = self.arrivals = ArrivalSource(requests, self.cfg.time_scale, closed=self.cfg.arrivals != "trace")
        src.on_drop = self._drop_turn
        now = 0
        gpu_free = 0
        events = self._events
        pop = heapq.heappop
        tick = self.emit.tick
        arrive = self._arrive
        while True:
            while True:  # arrivals and events at `now`, until a finish releases no turn due now
                for t, at, trace_at, think_ms in src.due(now):
                    arrive(t, at, trace_at, think_ms)
                while events and events[0][0] <= now:
                    self._current, _, fn, arg = pop(events)
                    fn(arg)
                nxt_t = src.next_ns(now)
                if nxt_t is None or nxt_t > now:
                    break
            ran = False
            if now >= gpu_free and (self.waiting or self.running or self.chunked is not None):
                end = self._batch(now)
                if end is not None:
                    gpu_free, ran = end, True
                if tick is not None:  # a batch's events are in: the probe may flush its buffers
                    tick()
            elif now >= gpu_free:
                self.new_token_ratio = INIT_NEW_TOKEN_RATIO  # nothing to run: self_check_during_idle
            nxt = nxt_t
            if events and (nxt is None or events[0][0] < nxt):
                nxt = events[0][0]
            # The next pass: when the GPU is free again (at once after a step that took no time)
            if (ran or gpu_free > now) and (nxt is None or gpu_free < nxt):
                nxt = gpu_free
            if nxt is None:
                if self.waiting or self.chunked is not None:
                    head = self.chunked or self.waiting[0]
                    raise EngineError(
                        f"no progress possible: request {head.req_id} waits for device memory that no "
                        f"event will free ({self.ctrl.device.free_pages} pages free, "
                        f"{self.tree.locked_device_pages} locked)")
                break
            now = max(now, nxt)
        self.stats.virtual_end_ns = now
        return self.stats

    # --- arrival -------------------------------------------------------------------------
    def _arrive(self, t: TraceRequest, now: int, trace_ns: int, think_ms: float | None,
                keys_np: np.ndarray | None = None, route: ev.Route | None = None) -> None:
        """A request arrives (a deployment passes the page keys it computed to route it, and the
        routing columns of its record)."""
        req = Req(t, now, trace_ns, think_ms)
        if route is not None:
            req.route = route
        ps = self.ps
        if self.emit.arrived is not None:
            self.emit.arrived((now, req.req_id, req.seq, req.input_len, req.output_len))
        # TokenizerManager._validate_one_request: input >= context_len, or input + max_new_tokens
        # > context_len, is refused; Scheduler.handle_generate_request -> validate_input_length:
        # input >= max_req_input_len = context_len - 1 - 5 is aborted (the KV-pool bound there is
        # the device-memory rejection below). Both before the request is queued.
        context = self.max_context
        if req.input_len + req.output_len > context or req.input_len >= context - 6:
            self._reject(req, f"context_length: {req.input_len:,} input + {req.output_len:,} output tokens; the "
                              f"model's context is {context:,} tokens")
            return
        # The KV a request ever holds: its input and every output token but the last, which is
        # never fed back through the model (ScheduleBatch.prepare_for_decode -> alloc_for_decode
        # allocates the slot of the token a step reads, the previous step's output), both releases.
        req.total_pages = -(-(req.input_len + max(req.output_len - 1, 0)) // ps)
        overhead = self.rules.admission_overhead_pages
        # Admission into an empty pool (PrefillAdder.add_one_req): input + min(output, 4096)
        # + the rule set's page must be less than the pool, or the request would wait forever.
        need = req.input_len + min(req.output_len, CLIP_MAX_NEW_TOKENS)
        if need + overhead * ps >= self.ctrl.device.capacity * ps:
            # Said with the admission overhead where the rule set has one (0.5.23's PrefillAdder
            # counts a page a request beside its tokens): a request that needs exactly the pool
            # is refused for that page, and the reason must say so.
            extra = (f" and {overhead * ps} of admission overhead (SGLang {self.rules.version}: a page a "
                     f"request)" if overhead else "")
            self._reject(req, f"needs {need} tokens of device memory{extra}; the pool holds "
                              f"{self.ctrl.device.capacity * ps}")
            return
        req.keys_np = page_keys_array(t, page_size=ps, block_size=self.cfg.block_size) if keys_np is None else keys_np
        req.keys = req.keys_np.tolist()
        req.max_match_pages = min(len(req.keys), (req.input_len - 1) // ps)
        if self.miss is not None:
            self.miss.arrived(req, self.tree)
        if self.ctrl.storage is not None:
            self._start_prefetch(req, now)
        self.waiting.append(req)
        self.arrived_at[req.seq] = self.processed_tokens  # req.arrival_processed_tokens

    def _reject(self, req: Req, reason: str, *, ends_session: bool = True) -> None:
        self.stats.requests_rejected += 1
        kind = reject_kind(reason)
        self.stats.rejected[kind] = self.stats.rejected.get(kind, 0) + 1
        if self.on_leave is not None:
            self.on_leave(req, req.arrival_ns)
        if ends_session and req.session is not None and self.arrivals.closed:
            self.arrivals.rejected(req.session, req.arrival_ns)
        emit = self.emit.request
        if emit is not None:
            # A rejected request: arrived, never served; its other columns at their rejected
            # values (0 where the column counts, NULL where it times or names), no miss reasons
            # (it computed nothing: miss.py), its routing columns as decided.
            route = req.route
            emit(req_id=req.req_id, seq=req.seq, arrival_ns=req.arrival_ns, input_tokens=req.input_len,
                 output_tokens=req.output_len, status="rejected", reject_reason=reason, hit_class=None,
                 device_hit_tokens=0, host_hit_tokens=0, storage_hit_tokens=0, computed_tokens=0,
                 recomputed_tokens=0, host_match_tokens=0, storage_match_tokens=0, loadback_skipped_reason=None,
                 loadback_skipped_tokens=0, storage_skipped_reason=None, prefix_indices_len=0,
                 cache_protected_len=0, extend_input_len=0, queue_ns=None, storage_wait_ns=None, loadback_ns=None,
                 loadback_exposed_ns=None, loadback_queued_ns=None, loadback_bytes=0, loadback_pages=0,
                 loadback_runs=0, storage_bytes=0, storage_fetch_ns=None, recompute_ns=None, compute_ns=None,
                 prefill_ns=None, ttft_ns=None, ideal_ttft_ns=None, ttft_if_device_resident_ns=None,
                 recompute_instead_ns=None, first_batch_id=None, num_chunks=0, first_token_ns=None, finish_ns=None,
                 session_id=req.session, think_ms=req.think_ms, trace_arrival_ns=req.trace_arrival_ns,
                 dp_rank=self.rank, route_branch=route[0], route_reason=route[1], route_score=route[2],
                 route_score_name=route[3], arrival_device_tokens=route[4], arrival_host_tokens=route[5],
                 best_rank=route[6], best_rank_device_tokens=route[7], best_rank_host_tokens=route[8],
                 ranks_json=route[9], decode_wait_ns=None, retractions=req.retractions,
                 miss_never_cached_tokens=None, miss_evicted_before_reuse_tokens=None,
                 miss_lost_while_queued_tokens=None, miss_loadback_skipped_tokens=None,
                 miss_prefetch_declined_tokens=None, miss_prefetch_revoked_tokens=None,
                 miss_shared_in_batch_tokens=None, miss_routed_elsewhere_tokens=None,
                 miss_beyond_storage_tokens=None)
            if self.emit.tick is not None:  # rejections come without batches: a trace of them stays bounded
                self.emit.tick()

    def _drop_turn(self, t: TraceRequest, now: int, trace_ns: int) -> None:
        """A turn of a session that ended (an earlier turn was rejected): never served, recorded
        as rejected at `now`, when the replay dropped it."""
        self._reject(Req(t, now, trace_ns, pause_ms(t)), "session_ended: an earlier turn of its session was rejected",
                     ends_session=False)

    # --- batches -------------------------------------------------------------------------
    def _batch(self, now: int) -> int | None:
        """One scheduling pass (Scheduler.get_next_batch_to_run, without mixed chunk unless
        `enable_mixed_chunk`): a prefill batch if one can be formed (`get_new_batch_prefill`),
        else a decode step of the running batch (`update_running_batch`), else nothing (the
        scheduler idles: `self_check_during_idle` resets `new_token_ratio`). Returns when the
        GPU is free again, None when nothing ran."""
        self.ctrl.blocking_ns = 0
        self.ctrl.ack_loads()  # _process_hicache_events -> check_hicache_events: loading_check
        self._retry_prefetches(now)  # _process_hicache_events, every pass
        if self._admission_reopens:
            # get_next_batch_to_run clears batch_is_full after the last prefill batch when
            # (a) it is filtered before it merges into the running batch
            # (`last_batch.filter_batch(reqs_to_exclude=[its chunked_req])`, and its finished
            # requests): "if last_batch.batch_size() < last_bs: batch_is_full = False"; or
            # (b) the running batch was empty: "if running_batch.is_empty(): running_batch =
            # last_batch", a batch whose flag was never set (the NO_TOKEN that set it marked the
            # empty batch object, which is dropped)
            self._admission_reopens = False
            self.batch_is_full = False
        if not self.running:
            self.batch_is_full = False  # "An empty batch has no request left to leave"
        items = None
        # _get_new_batch_prefill_raw: nothing to try while a NO_TOKEN with requests running
        # holds (batch_is_full) or nobody waits, unless a chunked request goes on.
        if (self.waiting and not self.batch_is_full) or self.chunked is not None:
            items = self._new_prefill(now)
        if items:
            return self._run_batch(items, now)
        if self.running:
            return self._decode(now)
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        return None

    def _new_prefill(self, now: int) -> list | None:
        """Scheduler.get_new_batch_prefill: the chunked request first, then waiting requests in
        policy order until one does not fit (it and everyone behind it wait). Memory is
        SGLang's PrefillAdder budget in tokens (`rem_total_tokens`): free + evictable device
        memory less what running requests may still decode (min(max_new - generated, 4096) x
        `new_token_ratio` each) and, for each request admitted this pass, its page of overhead
        (0.5.23) and its output (min(max_new, 4096), none for a chunk that goes on); the engine
        allocates each extend as it admits it, so the extend itself is already out of free
        memory. A request needs (input beyond its device prefix) + its output + the rule set's
        page < that budget, or it is NO_TOKEN; NO_TOKEN with a request admitted or running
        sets `batch_is_full`."""
        ps = self.ps
        mixed = len(self.running) if self.mixed_chunk else 0  # num_mixed_decode_tokens
        budget = self.cfg.max_prefill_tokens - mixed
        ratio = self.new_token_ratio
        self._total_offset = mixed + self._running_reserve() * ratio
        self._cur_offset = mixed
        items: list[tuple[Req, int, int, int]] = []  # (req, chunk tokens, load-back ns, load-back pages)
        chunk_continues = False
        capped = False  # the queue policy capped the chunked request's chunk (shortest-prefill-first)
        sorted_yet = False
        overhead = self.rules.admission_overhead_pages
        if self.chunked is not None:
            req = self.chunked
            chunk_budget = budget
            limit = self.queue.chunk_limit
            if limit is not None:
                # calc_priority runs before add_chunked_req, whose cap reads the sorted queue
                self._calc_priority(now)
                sorted_yet = True
                cap = limit(req, self.waiting, budget, ps)  # adder.chunked_req_limit
                if cap is not None:
                    chunk_budget, capped = min(budget, cap), True
            take = self._continue_chunk(req, chunk_budget, now)
            if take is None:
                return None  # the chunked request needs memory first; it goes before everyone
            items.append((req, take, 0, 0))
            budget -= -(-take // ps) * ps
            chunk_continues = req.done_tokens + take < req.fill_len
            # add_chunked_req -> _update_prefill_budget: its page, and its output when it ends here
            self._reserve(overhead, 0 if chunk_continues else min(req.output_len, CLIP_MAX_NEW_TOKENS))
        if not sorted_yet:
            self._calc_priority(now)
        i = 0
        # A continuing chunk spends the budget, unless the policy's cap left room beside it.
        while (capped or not chunk_continues) and budget >= ps and i < len(self.waiting):
            if self.batch_is_full:
                break  # a chunked request's pass: it goes on, nobody else is admitted
            req = self.waiting[i]
            if req.hold_until_ns > now and self._prefetch_holds(req, now):  # "skip staging requests that are ongoing prefetch"
                req.held = True
                i += 1
                continue
            admitted = self._admit(req, budget, now, first=not items, may_chunk=not chunk_continues)
            if admitted is NO_TOKEN:
                # "Set batch_is_full after making sure there are requests that can be served"
                self.batch_is_full = bool(items) or bool(self.running)
                break
            if admitted is OTHER:
                break  # the request waits, and so does everyone behind it
            del self.waiting[i]
            self.arrived_at.pop(req.seq, None)
            self.prefetch_retry_due.pop(req.seq, None)
            take, lb_ns, lb_pages = admitted
            items.append((req, take, lb_ns, lb_pages))
            budget -= -(-take // ps) * ps  # PrefillAdder._update_prefill_budget: page-ceiled
            ends = req.done_tokens + take >= req.fill_len
            self._reserve(overhead, min(req.output_len, CLIP_MAX_NEW_TOKENS) if ends else 0)
            if not ends:
                break  # it became the chunked request; the budget is spent
            if self._rem_total() <= 0 or self._rem_current() <= 0:  # budget_state: NO_TOKEN
                self.batch_is_full = True
                break
        if self.rules.batch_alloc_page_per_request:
            self._alloc_batch(items, now)
        return items or None

    def _running_reserve(self) -> int:
        """Sum over running requests of min(max_new - generated, 4096) (the tokens each may still
        decode, `_get_running_request_total_token_offset` before its ratio): a request's
        remaining output is its finish step less the decode clock; only those that joined with
        more than 4096 to go are clipped one by one."""
        k = self.dstep
        total = self._fin_sum - self._n_short * k
        for r in self._long:
            total += min(r.finish_step - k, CLIP_MAX_NEW_TOKENS)
        return total

    def _reserve(self, overhead_pages: int, max_new: int) -> None:
        """PrefillBudget.reserve (0.5.23; 0.5.9's `rem_total_token_offset`): the admitted
        request's page of overhead, and its output, stay reserved for the rest of the pass."""
        page = overhead_pages * self.ps
        self._total_offset += page + max_new
        self._cur_offset += page

    def _rem_total(self) -> float:
        """`rem_total_tokens`: free + evictable device tokens less the pass's reservations."""
        return (self.ctrl.device.free_pages + self.tree.evictable_device_pages) * self.ps - self._total_offset

    def _rem_current(self) -> float:
        return (self.ctrl.device.free_pages + self.tree.evictable_device_pages) * self.ps - self._cur_offset

    def _calc_priority(self, now: int) -> None:
        """SchedulePolicy.calc_priority: the queue policy's order, then (0.5.23)
        `_touch_waiting_prefixes`: on every `refresh_interval`-th pass that reaches it with a
        cache-agnostic active policy (a cache-aware one touches while matching) and a waiting
        queue, the cached prefixes of the first `waiting_prefix_refresh_max` waiting requests
        are walked, head last, so LRU evicts them in reverse admission order."""
        waiting = self.waiting
        self.queue.order(waiting, self.tree.match, self.ps, now, self.processed_tokens, self.arrived_at)
        interval = self.refresh_interval
        if not interval or not waiting or self.queue.cache_aware(waiting):
            return
        refresh = self.refresh_calls % interval == 0
        self.refresh_calls += 1
        if refresh:
            walk = self.tree._walk  # RadixTree.match's walk: the stamps without the match's result
            for r in reversed(waiting[:self.rules.waiting_prefix_refresh_max]):
                walk(r.keys, now, None)  # touch_waiting_prefix: the whole input, page-aligned

    def _pages_through(self, req: Req, end_tokens: int) -> int:
        """Pages holding tokens [0, end_tokens): the extend allocates its own tokens only
        (`alloc_for_extend`); output pages come a decode step at a time (`alloc_for_decode`)."""
        return -(-end_tokens // self.ps)

    def _take(self, remaining: int, budget: int) -> int:
        return remaining if remaining <= budget else (budget // self.ps) * self.ps

    def _admit(self, req: Req, budget: int, now: int, *, first: bool, may_chunk: bool = True):
        """PrefillAdder.add_one_req (SGLang 0.5.9; 0.5.23's `_select_prefill_admission` where the
        rule set says), with init_load_back inside it.

        1. match_prefix: a device part and a host part (`host_hit_length`), the storage pages
           this request's prefetch brought in being host pages by now;
        2. the chunk shape, assuming the host part loads: under 0.5.9 a request after the first
           whose input (less the host part) does not fit what is left of the batch budget waits
           for the next batch (OTHER); under 0.5.23 (`chunk_later_requests`) it is chunked into
           what is left, unless a chunked request goes on beside it (`has_chunked_req`: OTHER);
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
        match = tree.match(req.keys[:req.max_match_pages], now, req.req_id)
        dev_pages = match.device_pages
        host_nodes = match.host_nodes
        storage_pages = sum(len(n.keys) for n in host_nodes if n.prefetched_for == req.seq)
        host_pages = match.host_pages - storage_pages
        tiered = host_pages + storage_pages
        if self._waits_for_next_batch(req, (dev_pages + tiered) * ps, budget, first, may_chunk):
            return OTHER  # the shape chosen assuming the host part loads
        dev_node = match.last_device_node or tree.root
        tree.inc_lock(dev_node)
        # add_one_req: total_tokens = extend beyond the device prefix + max_new (less what was
        # generated, clipped) + 0.5.23's per_req_token_overhead, against rem_total_tokens
        max_new = min(max(req.output_len - req.generated, 0), CLIP_MAX_NEW_TOKENS)
        total_tokens = req.fill_len - dev_pages * ps + max_new + self.rules.admission_overhead_pages * ps
        if total_tokens >= self._rem_total():
            tree.dec_lock(dev_node)
            return NO_TOKEN
        load = tiered > 0
        skip = None
        if load and tiered * ps < self.cfg.load_back_threshold:
            load, skip = False, "below_threshold"
        if load:
            # Room for the host part first (HiCacheController.load, else evict and retry). Its
            # host copies are protected until allocation is done: a write-back during eviction
            # needs host room and must not take the very pages about to be loaded.
            tree.protect_host(host_nodes[-1])
            if ctrl.evict_device(tiered, req.req_id, now):
                lb_slots = ctrl.device.alloc(tiered)  # HiCacheController.load: the load's slots first
            else:
                tree.release_host(host_nodes[-1])
                load, skip = False, "device_full"
        prefix_pages = dev_pages + tiered if load else dev_pages
        if not load and self._waits_for_next_batch(req, prefix_pages * ps, budget, first, may_chunk):
            tree.dec_lock(dev_node)
            return OTHER  # re-selected as recompute: the declined host part counted as input
        take = self._take(req.fill_len - prefix_pages * ps, budget)
        need = self._pages_through(req, prefix_pages * ps + take) - prefix_pages
        if self.rules.batch_alloc_page_per_request:
            # 0.5.23: the extend is allocated with the batch (prepare_for_extend ->
            # alloc_paged_token_slots_extend, one eviction for every member: _alloc_batch), after
            # every member's prefix is locked; until then PrefillBudget.reserve holds its
            # page-ceiled extend against the pass's budget.
            if load:
                tree.release_host(host_nodes[-1])
            self._defer_alloc(req, need, take)
            slots = []
        else:
            # alloc_paged_token_slots_extend: the extend's eviction (with the rule set's page a request)
            if not ctrl.evict_device(need, req.req_id, now, reserve_pages=self.alloc_page):
                raise EngineError(f"request {req.req_id}: admitted with {need} device pages needed, but eviction "
                                  f"could not free them ({ctrl.device.free_pages} free, "
                                  f"{tree.evictable_device_pages} evictable)")
            if load:
                tree.release_host(host_nodes[-1])
            slots = ctrl.device.alloc(need)
            assert slots is not None, "evict_device reported room that alloc could not find"
        lb_ns = 0
        lock_node = dev_node
        if load:
            first_page = dev_pages
            lb_ns, runs, wall, verified = ctrl.load_back(host_nodes, lb_slots, req.req_id, now,
                                                         req.keys[first_page:first_page + tiered])
            req.lb_pages, req.lb_runs, req.lb_ns = tiered, runs, lb_ns
            req.host_loaded_pages, req.storage_loaded_pages = host_pages, storage_pages
            req.lb_wall, req.lb_verified = wall, verified
            lock_node = host_nodes[-1]  # the request now holds the loaded path
            tree.inc_lock(lock_node)
            tree.dec_lock(dev_node)
        req.prefix_pages = prefix_pages
        req.lock_node = lock_node
        # cache_protected_len: reset to the new prefix after a load-back; the device part when
        # the load-back was declined (host nodes stay unlocked then, free to be evicted).
        req.protected_pages = prefix_pages
        req.dev_pages = dev_pages
        req.host_match_pages = host_pages
        if storage_pages:
            req.storage_match_pages = max(req.storage_match_pages, storage_pages)
        req.lb_skip_reason = skip
        req.lb_skip_pages = tiered if skip else 0
        req.own_slots = slots
        req.own_from = prefix_pages
        req.done_tokens = prefix_pages * ps
        req.extend_total = req.fill_len - req.done_tokens
        req.sched_ns = now
        self._count_recomputed(req, match, skip is not None)
        if self.miss is not None:  # the pages this chunk computes, against its batch's (miss.py)
            self.miss.scheduled(req, now, prefix_pages, min((prefix_pages * ps + take) // ps, len(req.keys)))
        if self.emit.matched is not None:
            self.emit.matched((now, req.req_id, dev_pages * ps, req.host_loaded_pages * ps,
                              req.storage_loaded_pages * ps, prefix_pages * ps, req.protected_pages * ps))
        if skip and self.emit.skipped is not None:
            self.emit.skipped((now, req.req_id, Tier.HOST, tiered * ps, skip))
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
        if self.rules.chunk_later_requests:
            return not may_chunk and extend > budget
        return not first and extend >= budget

    def _count_recomputed(self, req: Req, match, skipped: bool) -> None:
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
                blame(cached, demoted, node.keys if node.keys_np is None else node.keys_np, lost, ps)
            elif node.evicted_by is not None and attribute:
                lost[node.evicted_by] = lost.get(node.evicted_by, 0) + len(node.keys) * ps
        recomputed = req.lb_skip_pages if skipped else 0
        path_pages = req.dev_pages + match.host_pages
        once = blame(cached, demoted, req.keys_np[path_pages:req.input_len // ps], lost, ps)
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
        the chunk goes on), not page-floored then. None when eviction cannot free its pages."""
        remaining = req.fill_len - req.done_tokens
        mem = int(self._rem_total())
        take = self._take(remaining, budget) if mem <= 0 or mem >= budget else min(remaining, mem)
        need = self._pages_through(req, req.done_tokens + take) - req.own_from - len(req.own_slots)
        if self.rules.batch_alloc_page_per_request:
            self._defer_alloc(req, max(need, 0), take)  # with the batch (0.5.23: _alloc_batch)
        elif need > 0:
            if not self.ctrl.evict_device(need, req.req_id, now, reserve_pages=self.alloc_page):
                return None
            req.own_slots.extend(self.ctrl.device.alloc(need))
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
        conservative = sum(take for _, _, take in pending) + len(items) * self.alloc_page * ps
        ctrl.evict_device(-(-conservative // ps), items[-1][0].req_id, now)
        for req, pages, _ in pending:
            if pages <= 0:
                continue
            slots = ctrl.device.alloc(pages)
            if slots is None:
                raise EngineError(f"request {req.req_id}: admitted with {pages} device pages needed, but eviction "
                                  f"could not free them ({ctrl.device.free_pages} free, "
                                  f"{self.tree.evictable_device_pages} evictable)")
            req.own_slots.extend(slots)

    def _run_batch(self, items, now: int) -> int:
        """A prefill batch on the GPU; with `enable_mixed_chunk` it carries a decode step of the
        running requests (`mix_with_running`) when their next step fits (`check_decode_mem`;
        else they sit it out, nothing retracted), the batch then also taking that step's time."""
        cost, ctrl, ps = self.cost, self.ctrl, self.ps
        mixed_ns = 0
        if not self.running:
            self._admission_reopens = True  # (b) in _batch: its members start the running batch
        if self.mixed_chunk and self.running and self._decode_fits(self.running, now):
            mixed_ns = self._decode_step(now)
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
                req.lb_queued = start - now
                lb_bytes_total += lb_pages * ctrl.page_bytes
                ctrl.emit_load_back(start, link, req.req_id, lb_pages, req.lb_runs, start - now,
                                    req.lb_wall, req.lb_verified)
            flops.append(cost.prefill_flops(take, req.done_tokens))
        ctrl.h2d_free_ns = link
        self.processed_tokens += sum(take for _, take, _, _ in items)  # += batch.extend_num_tokens
        load_ns = link - now
        compute_ns = cost.prefill_ns(sum(flops))
        blocking = ctrl.blocking_ns
        duration = cost.overlapped_ns(load_ns, compute_ns) + blocking
        exposed = duration - compute_ns - blocking
        duration += mixed_ns
        end = now + duration
        if mixed_ns and self.emit.decode_step is not None:
            self.emit.decode_step((now, end, self.dstep, tuple(r.req_id for r in self.running), (), bid,
                                   self.rank))
        total_flops = sum(flops) or 1.0
        total_lb = sum(p for _, _, _, p in items) or 1
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
            rec_end = req.fill_len - req.extend_total + min(req.recomputed_pages * ps, req.extend_total)
            r = min(take, rec_end - req.done_tokens)
            rec_flops.append(cost.prefill_flops(r, req.done_tokens) if r > 0 else 0.0)
        all_rec = sum(rec_flops)
        rec_per_flop = (compute_ns - cost.prefill_ns(sum(flops) - all_rec)) / all_rec if all_rec else 0.0
        for (req, take, lb_ns, lb_pages), f, rf in zip(items, flops, rec_flops):
            share = compute_ns * f / total_flops
            rec = rf * rec_per_flop
            req.recompute_ns += rec
            batch_recompute_ns += rec
            req.compute_ns += share - rec
            if lb_pages:
                req.lb_exposed += exposed * lb_pages / total_lb
            if req.first_batch_id is None:
                req.first_batch_id = bid
            req.num_chunks += 1
            self._write_chunk(req, take)
            req.done_tokens += take
            if req.done_tokens >= req.fill_len:
                if self.chunked is req:
                    self.chunked = None
                self.at(end, self._prefill_done, req)
            else:
                self.chunked = req
                self.at(end, self._cache_unfinished, req)
            if self.emit.prefill_done is not None:
                self.emit.prefill_done((end, req.req_id, bid, req.num_chunks, take))
        self._join_front = 0 if mixed_ns else None
        if mixed_ns:
            # process_batch_result_prefill walks the mixed batch in its order, the new requests
            # first (mix_with_running appends the running ones): their inserts come before the
            # finishing decoders' (cache_finished_req), which LRU then sees as the more recent
            self._finish_step(end)
        if self.emit.batch is not None:
            # A mixed batch's decode step is part of its compute (the rows' new compute)
            self.emit.batch((bid, now, end, len(items), sum(t for _, t, _, _ in items), lb_bytes_total,
                            compute_ns + mixed_ns, exposed, decoding, int(batch_recompute_ns), self.rank))
        return end

    def _write_chunk(self, req: Req, take: int) -> None:
        """The prefill output of this chunk: KV content for the pages it completes (a chunk that
        ended mid-page, memory-limited, left that page for this one to finish)."""
        ps = self.ps
        first = req.done_tokens // ps
        last = min((req.done_tokens + take) // ps, len(req.keys))
        if last > first:
            off = first - req.own_from
            self.ctrl.write_computed(req.own_slots[off:off + last - first], req.keys_np[first:last])

    # --- completion ----------------------------------------------------------------------
    def _cache_unfinished(self, req: Req) -> None:
        """A chunk that is not the last: Scheduler.stash_chunked_request ->
        cache_unfinished_req(chunked=True). The full pages computed so far enter the tree and stay
        locked; under 0.5.9 no hit is counted and nothing is backed up (_inc_hit_count skips
        chunked); under 0.5.23 the chunk's new pages count a hit and may be backed up at once."""
        self._insert(req, min(req.done_tokens // self.ps, len(req.keys)), self._current, chunk=True)
        self._admission_reopens = True  # the batch's chunked_req leaves it at the next pass

    def _prefill_done(self, req: Req) -> None:
        """process_batch_result_prefill: the last chunk samples a token. A request that goes on
        decoding is inserted (cache_unfinished_req), so a request arriving now matches it on
        device while it decodes (the insert counts hits and starts write-through), and joins
        the running batch; one whose output is complete (a single output token) finishes now
        (release_kv_cache -> cache_finished_req)."""
        req.generated += 1
        req.kv_len = req.fill_len
        done = req.generated >= req.output_len
        if not done:
            self._insert(req, len(req.keys), self._current, chunk=False)
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
        n = upto - req.own_from
        tree = self.tree
        if self.rules.hits_past_inserted:
            count, inserted = self.count_hits, req.inserted_pages
        else:
            count, inserted = self.count_hits and not chunk, 0
        done = tree.insert(req.keys[:upto], req.own_from, req.own_slots[:n], now, req.req_id,
                           count_hits=count, priority=req.priority, keys_np=req.keys_np[:upto], inserted=inserted)
        last, fresh = done.last, done.fresh
        req.inserted_pages = max(req.inserted_pages, upto)  # cache_inserted_len = max(.., page_aligned_len)
        self.ctrl.device.free(done.duplicate_slots)
        del req.own_slots[:n]
        req.own_from = upto
        if last is not req.lock_node:
            tree.inc_lock(last)
            tree.dec_lock(req.lock_node)
            req.lock_node = last
        for node in fresh:
            self.ctrl.cached_once.set_many(node.keys if node.keys_np is None else node.keys_np, 0, outputs_last=True)
        threshold = self.backup_threshold
        if threshold is not None:
            for node in done.hit:
                if node.host is None and node.device is not None and node.hit_count >= threshold:
                    self.ctrl.backup(node, req.req_id, now)
        return fresh

    def _first_token(self, req: Req) -> None:
        now = self._current
        req.first_token_ns = now
        ttft = now - req.arrival_ns
        self.stats.ttft_ns.append(ttft)
        if self.emit.first_token is not None:
            self.emit.first_token((now, req.req_id, ttft))

    # --- decode ----------------------------------------------------------------------------
    def _generated(self, req: Req) -> int:
        """Output tokens a running request has (len(output_ids)), after `dstep` decode steps."""
        return req.generated + self.dstep - req.join_step

    def _join(self, req: Req) -> None:
        """The request joins the running batch (get_next_batch_to_run merges the last prefill
        batch into it). Its next page and its finish are due on the decode clock: each decode
        step allocates the slot of the token it reads (kv_len before the step), a page when
        that slot starts one (`new_tokens_required_next_decode`: kv_committed_len % page == 0)."""
        k0 = self.dstep
        req.join_step = k0
        req.in_running = True
        self._kv_base += req.kv_len - k0
        req.finish_step = k0 + req.output_len - req.generated
        self._finish_due.setdefault(req.finish_step, []).append(req)
        if req.output_len - req.generated > CLIP_MAX_NEW_TOKENS:
            self._long.append(req)
        else:
            self._fin_sum += req.finish_step
            self._n_short += 1
        nxt = k0 + 1 + (-req.kv_len) % self.ps
        req.next_page = nxt
        if nxt <= req.finish_step:
            self._page_due.setdefault(nxt, []).append(req)
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
        req.generated += steps
        req.join_step = self.dstep
        self.running.remove(req)
        due = self._page_due.get(req.next_page)
        if due is not None and req in due:
            due.remove(req)
        due = self._finish_due.get(req.finish_step)
        if due is not None and req in due:
            due.remove(req)
        self.batch_is_full = False

    def _decode_fits(self, reqs, now: int) -> bool:
        """ScheduleBatch.check_decode_mem: the pages the next step of `reqs` needs, after
        evicting for them (`check_decode_capacity` -> `evict_to_free_tokens`)."""
        k = self.dstep + 1
        due = self._page_due.get(k)
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
        due = self._page_due.pop(k, None)
        if due:
            alloc = self.ctrl.device.alloc
            ps = self.ps
            page_due = self._page_due
            for r in due:
                slots = alloc(1)
                assert slots is not None, "check_decode_mem reported room that alloc could not find"
                r.own_slots.extend(slots)
                nxt = k + ps
                r.next_page = nxt
                if nxt <= r.finish_step:
                    page_due.setdefault(nxt, []).append(r)
        ctx = self._kv_base + len(self.running) * k
        self.dstep = k
        self.stats.decode_steps += 1
        return self.cost.decode_step_ns(ctx)

    def _finish_step(self, end: int) -> None:
        """The step's end: requests whose output is complete finish then (the event loop runs
        them before the next pass), in the running batch's order (process_batch_result walks
        the batch: the order their finish inserts stamp the tree)."""
        due = self._finish_due.pop(self.dstep, ())
        if len(due) > 1:
            where = {id(r): i for i, r in enumerate(self.running)}
            due = sorted(due, key=lambda r: where.get(id(r), 0))
        for r in due:
            self.at(end, self._finish, r)

    def _note_decode(self, start: int, end: int) -> None:
        """A decode step's time, kept as runs of steps on the clock (`decode_before`)."""
        self.stats.decode_ns += end - start
        starts = self._drun_starts
        if starts and self._drun_ends[-1] == start:
            self._drun_ends[-1] = end
        else:
            self._drun_cum.append(self._drun_cum[-1] + self._drun_ends[-1] - starts[-1] if starts else 0)
            starts.append(start)
            self._drun_ends.append(end)

    def decode_before(self, t: int) -> int:
        """Virtual time the GPU spent in decode steps before `t`."""
        starts = self._drun_starts
        i = bisect_right(starts, t) - 1
        if i < 0:
            return 0
        return self._drun_cum[i] + min(t, self._drun_ends[i]) - starts[i]

    def _decode(self, now: int) -> int:
        """Scheduler.update_running_batch: `check_decode_mem`; when the step does not fit,
        `retract_decode`, else `new_token_ratio` decays; then the step (`prepare_for_decode`)."""
        retracted = ()
        if not self._decode_fits(self.running, now):
            retracted = self._retract(now)
            if not self.running:
                return None
        else:
            self.new_token_ratio = max(self.new_token_ratio - NEW_TOKEN_RATIO_DECAY, MIN_NEW_TOKEN_RATIO)
        # the step, after any write-back its eviction waited for (write_back: blocking copies)
        end = now + self._decode_step(now) + self.ctrl.blocking_ns
        if self.emit.decode_step is not None:
            self.emit.decode_step((now, end, self.dstep, tuple(r.req_id for r in self.running),
                                   tuple(r.req_id for r in retracted), None, self.rank))
        self._finish_step(end)
        self._note_decode(now, end)
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
        for req in retracted:
            self._requeue(req, now)
        if aborted is not None:
            self._abort(aborted, now)
        return retracted

    def _release(self, req: Req) -> None:
        """release_kv_cache(checkpoint=False): the request's own pages are freed (what it
        inserted stays in the tree, unlocked), its lock dropped."""
        self.ctrl.device.free(req.own_slots)
        req.own_slots = []
        self.tree.dec_lock(req.lock_node)
        req.lock_node = None

    def _requeue(self, req: Req, now: int) -> None:
        """Req.reset_for_retract + _add_request_to_queue(is_retracted=True): prefix, protected
        and inserted lengths back to 0, the output so far kept (its next prefill is input +
        output: `fill_len`); at the end of the waiting queue, its storage prefetch started again.
        The record keeps what its first admission found (`first_pass`)."""
        if req.first_pass is None:
            req.first_pass = tuple(getattr(req, f) for f in FIRST_PASS_FIELDS)
        req.retractions += 1
        req.kv_len = 0
        req.fill_len = req.input_len + req.generated
        ps = self.ps
        n_in = req.input_len // ps
        n_fill = req.fill_len // ps
        if n_fill > len(req.keys):
            out = output_page_keys(req.req_id, req.keys[:n_in], n_fill - n_in)[len(req.keys) - n_in:]
            req.keys.extend(out)
            req.keys_np = np.concatenate((req.keys_np, np.array(out, dtype=np.int64)))
        req.max_match_pages = min(len(req.keys), (req.fill_len - 1) // ps)
        req.inserted_pages = req.protected_pages = req.prefix_pages = req.dev_pages = 0
        req.done_tokens = 0
        req.own_from = 0
        req.prefetch_retries = 0
        req.storage_hit_end = None
        self.waiting.append(req)
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
        now = self._current
        ps = self.ps
        self._leave(req)
        n_full = (req.input_len + max(req.output_len - 1, 0)) // ps
        n_in = req.input_len // ps
        have = len(req.keys)
        if n_full > have:
            # No content is written for output pages: their keys are this request's own, so no
            # request ever matches them and no load-back reads (or verifies) them back. Their
            # copies to host and storage still run, as the real ones would.
            out_keys = output_page_keys(req.req_id, req.keys[:n_in], n_full - n_in)[have - n_in:]
            req.keys.extend(out_keys)
            req.keys_np = np.concatenate((req.keys_np, np.array(out_keys, dtype=np.int64)))
        self._insert(req, n_full, now, chunk=False)
        if self.rules.finish_reinserts_prompt and 0 < n_in < n_full:
            # checkpoint_into_tree's second insert: the prompt again at priority + 1, on device
            # (our lock covers it), nothing to free, no node past `inserted_len` (no hit).
            self.tree.insert(req.keys[:n_in], n_in, [], now, req.req_id, count_hits=self.count_hits,
                             priority=min(req.priority + 1, INT64_MAX), keys_np=req.keys_np[:n_in], inserted=n_in)
        self.ctrl.device.free(req.own_slots)
        req.own_slots = []
        self.tree.dec_lock(req.lock_node)
        req.lock_node = None
        self._record(req, now)
        if self.on_leave is not None:
            self.on_leave(req, now)
        if req.session is not None and self.arrivals.closed:
            self.arrivals.finished(req.session, now)


def reject_kind(reason: str) -> str:
    """The kind of a rejection's reason, for the replay's closing counts: `context_length`,
    `session_ended` (the reason's own first word), else `device_memory` (a request the whole
    device pool cannot hold)."""
    head = reason.partition(":")[0]
    return head if head in ("context_length", "session_ended") else "device_memory"
