"""The scheduler on a virtual clock: arrivals, a waiting queue (FCFS or LPM), prefill batches
under a token budget with chunked prefill, admission gated on PrefillAdder's memory budget,
decode steps on the same clock (with their memory and retraction), and `cache_unfinished_req` /
`cache_finished_req` into the tree. The rules mirror SGLang (managers/scheduler.py,
schedule_policy.py, schedule_batch.py, scheduler_output_processor_mixin.py, mem_cache/), the
release's where they differ (rules.py); each function names the one it restates. This module
holds the loop, arrivals and the choice of the next batch; admission.py the admission, the
batch run and the inserts; decode.py the decode steps, retraction and the finish.

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

from heapq import heappop, heappush  # names, not the module's attributes: a look-up a call fewer
from typing import Any, Callable, Final, Iterable

import numpy as np

from tierdiag.config.names import WritePolicy
from tierdiag.config.engine import EngineConfig
from tierdiag.engine.admission import Admission
from tierdiag.engine.arrivals import ArrivalSource, pause_ms
from tierdiag.engine.cached_split import split_kind
from tierdiag.engine.controller import CacheController, Clock, EngineStats
from tierdiag.engine.costmodel import CostModel
from tierdiag.engine.emitters import Emitters
from tierdiag.engine.miss import MissTracker
from tierdiag.engine.prefetch import new_requeries, prefetch_limit_tokens
from tierdiag.engine.queue_policy import queue_policy
from tierdiag.engine.records import DecodeRuns
from tierdiag.engine.request import Req
from tierdiag.engine.rules import config_rules
from tierdiag.engine.schedule_common import (CLIP_MAX_NEW_TOKENS, INIT_NEW_TOKEN_RATIO, NO_TOKEN, OTHER,
                                             WRITE_THROUGH_THRESHOLD, EngineError)
from tierdiag.engine.tree import RadixTree
from tierdiag.engine.tree_node import KeyRun, empty_run, key_run
from tierdiag.probes import events as ev
from tierdiag.trace import pages as _pages
from tierdiag.trace.pages import page_keys_array
from tierdiag.trace.reader import TraceRequest

# _cplane.block_page_keys where trace/pages.py chose the compiled data plane (None on numpy):
# Scheduler._page_keys calls it with no interpreted frame between
_C_BLOCK_PAGE_KEYS: Final[Any] = (_pages._c_block_page_keys if _pages.block_page_keys is _pages._block_page_keys_c
                                  else None)
_INT64: Final[Any] = _pages._INT64  # np.frombuffer's dtype made once (its keyword and dtype parsing)
_FROMBUFFER: Final[Any] = np.frombuffer  # (bound once: `np.frombuffer` is a module attribute look-up a call)
# Final: a C static the compiled module reads, where an imported name is a look-up in the module's
# dict at every use (~130 instructions; issue 41, session 24)
_HEAPPUSH: Final = heappush
_HEAPPOP: Final = heappop


class OwnClock(Clock):
    """A scheduler's own event queue (Scheduler.run's): a heap of (t_ns, order, fn, arg), the
    order the pushes' count, so events at one time run in the order they were put in."""

    def __init__(self) -> None:
        self.events: list[tuple[int, int, Any, Any]] = []
        self.order = 0

    def at(self, t_ns: int, fn: Any, arg: Any) -> None:
        order = self.order + 1
        self.order = order
        _HEAPPUSH(self.events, (t_ns, order, fn, arg))


class Scheduler(Admission):
    """The loop on the virtual clock, arrivals and the choice of the next batch; admission and
    completion into the tree (admission.py), decode steps (decode.py), the storage prefetch
    (prefetch.py) and the request records (records.py) are its mixins, the queue order a
    function of queue_policy.py. The mixins are one chain of bases (schedule_common.SchedulerState
    says why), Admission the last."""

    def __init__(self, cfg: EngineConfig, cost: CostModel, tree: RadixTree, ctrl: CacheController,
                 probe, stats: EngineStats, progress: Callable[[int, int, EngineStats], None] | None = None):
        # An attribute SchedulerState declares is assigned here without a type: an annotation
        # here declares it a second time, in Scheduler, and mypyc's tp_traverse visits a field
        # once per class of the chain that declares it (its struct holds the field once). A
        # field visited twice makes the collector subtract two references where it holds one,
        # and a compiled replay's engine cycle was never freed (tests/engine/test_engine_freed.py)
        self.cfg = cfg
        self.rules = config_rules(cfg)  # what differs between SGLang releases (rules.py)
        self.queue = queue_policy(cfg.schedule_policy, self.rules.version, self.rules)  # --schedule-policy (queue_policy.py)
        self.processed_tokens, self.arrived_at = 0, dict[int, int]()  # HRRN's token clock: processed_tokens_counter, per-seq snapshot
        # the running batch's `extend_num_tokens`: every decode step adds it to HRRN's clock (the
        # batch that became the running batch keeps its own; prepare_for_decode never resets it)
        self._running_extend = 0
        self.cost = cost
        self.tree = tree
        self.ctrl = ctrl
        self.probe = probe
        self.emit = Emitters(probe)  # one callable an event kind, None where nothing is emitted (a native class)
        self.miss = MissTracker(cfg.page_size) if self.emit.record is not None else None  # miss reasons' facts (miss.py)
        self.stats = stats
        self.progress = progress
        self.ps = cfg.page_size
        # pages a hash_ids block (_page_keys' C path; 0: a page size that does not divide the
        # block, which page_keys_array refuses)
        self._per_block: int = (cfg.block_size // cfg.page_size
                                if 0 < cfg.page_size and cfg.block_size % cfg.page_size == 0 else 0)
        self.waiting = []
        # alloc_for_extend (both releases): at page 1 `alloc_token_slots(extend_num_tokens)`
        # evicts for the extend alone; above, alloc_paged_token_slots_extend asks a page a request more
        self.alloc_page = self.rules.alloc_overhead_pages if self.ps > 1 else 0
        self._pending_alloc = []  # 0.5.23: extends allocated with the batch
        self.chunked = None
        # The running (decoding) batch, in merge order, and what SGLang keeps beside it:
        # `batch_is_full` (a NO_TOKEN with requests running shuts admission until one leaves),
        # `new_token_ratio`, the decode steps run so far (`dstep`, the decode clock each request's
        # next page and finish are due on), S = sum(kv_len - join step) over running requests, so
        # a step's KV read is S + len(running) x step.
        self.running = []
        self.batch_is_full = False
        self._admission_reopens = False  # the next pass clears batch_is_full (schedule_pass)
        self._join_front = None  # where the next joiner goes in `running` (after a mixed batch: the front)
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self.dstep = 0
        self._kv_base = 0
        # The running requests whose next page is due at a decode step, by step: a request's next
        # page is always within a page of steps of the clock (its first after it joins at most
        # `ps` steps on, each next `ps` after the last), so the steps due are a window of `ps`
        # and slot `step % ps` is step's alone (a dict by step was a new int key and a hash a
        # step; compiled, the steps read a list slot)
        self._page_ring = [[] for _ in range(self.ps)]
        self._fin_sum = self._n_short = 0  # running requests' finish steps (those with <= 4096 to go)
        self._long = []  # running requests that joined with more than 4096 tokens to go
        self._finish_due = {}
        self._finish_steps = []  # a heap of the steps put in _finish_due (run_decode_ahead)
        self.mixed_chunk = cfg.enable_mixed_chunk
        # Runs of back-to-back decode steps on the clock (start, end, decode time before the
        # run): a request's record says how much of its wait was decode steps (`DecodeRuns.before`).
        self._druns = DecodeRuns()
        self._split_kind = split_kind(self.rules.split_cached_prefix)  # RequestRecords.rules_split's call
        own_clock = OwnClock()
        self._events: list[tuple[int, int, Any, Any]] = own_clock.events  # (the loop reads the heap itself)
        self._fold_now = 0  # the loop's wake that `_wakes_until` ran last
        self._batch_id = 0
        self.event_ns = 0  # virtual time of the event being handled
        self.count_hits = cfg.write_policy != WritePolicy.WRITE_BACK  # _inc_hit_count returns early under write_back
        # UnifiedTreeCore.insert_host refills device-only nodes' host copies (not under write_back)
        self.refill_host_on_read = self.rules.insert_host_refills_host and cfg.write_policy != WritePolicy.WRITE_BACK
        self.backup_threshold = WRITE_THROUGH_THRESHOLD.get(cfg.write_policy)
        self.prefetch_threshold = max(cfg.prefetch_threshold, self.ps)  # HiCacheController: >= a page
        self.prefetch_limit_tokens = prefetch_limit_tokens(self.rules, ctrl.host.capacity, ctrl.device.capacity,
                                                           self.ps)
        self.prefetch_tokens_occupied = 0
        # the storage re-queries armed (0.5.23 StoragePrefetchRetries): each queued request's
        # due pass (set as it is armed; -1: armed past max_attempts, dropped by the first pass
        # that sees it), indexed by due pass, fired once a pass (`_retry_prefetches`): the C
        # data plane's RequeryIndex, or its reference prefetch.RequeryIndexPy
        self.use_requeries(new_requeries())
        # The rule fields every pass's storage half reads, typed: rules.py is interpreted, so a
        # RuleSet field read from compiled code is a generic attribute lookup
        self.retry_interval = self.rules.prefetch_retry_interval_passes
        self.retry_cap = self.rules.prefetch_retry_max_attempts
        self.storage_acks = self.rules.storage_acks_per_pass
        self.has_storage = ctrl.storage is not None
        # ... and those admission reads a request, a batch or an insert (SchedulerState's `r_`
        # fields), with the two config fields it reads as often
        self.r_chunk_later = self.rules.chunk_later_requests
        self.r_overhead_pages = self.rules.admission_overhead_pages
        self.r_batch_alloc_page = self.rules.batch_alloc_page_per_request
        self.r_returns_early = self.rules.max_running_check_returns_early
        self.r_hits_past_inserted = self.rules.hits_past_inserted
        self.r_backup_chains = self.rules.backup_chains_ancestors
        self.load_back_threshold = cfg.load_back_threshold
        self.max_prefill_tokens = cfg.max_prefill_tokens
        self.prefetch_pass = 0  # scheduling passes, the re-queries' clock
        # arrivals whose storage query waits for the next pass (rule storage_acks_per_pass)
        self.unqueried = []
        # queries made, their hits' host memory and reads waiting for the next drain
        # (drain_prefetch_queries), their requests in query order (each query's entry on the
        # request itself, Req.query_*: no dict, tuple or boxed int a query); and the spans the misses
        # among them hold until then
        self.unallocated = []
        self.query_occupied = 0
        self.reading = {}  # prefetches whose read's acks a later drain takes
        # host slots of prefetches ended before their read's ack: (the drain that frees them, slots)
        self.held_releases = []
        self.storage_pass_done_ns = -1  # a chunk's stash ran this instant's storage_pass_start
        self.ctrl.pass_owner = self  # CacheController.pass_now reads prefetch_pass
        # SchedulePolicy._waiting_prefix_refresh_calls: the passes that reached the refresh (0.5.23)
        self.refresh_calls = 0
        self.refresh_max: int = self.rules.waiting_prefix_refresh_max  # (typed once: rules.py is interpreted)
        self.refresh_interval: int = (self.rules.waiting_prefix_refresh_interval
                                      if cfg.waiting_prefix_refresh and cfg.eviction_policy == "lru" else 0)
        # (declared int: the config is Any to mypyc, and an undeclared field of it an object field,
        # every compare and difference with it a generic operation on boxed ints; session 26)
        self.max_context: int = cfg.resolved_max_context()
        # SGLang's max_running_requests (its ReqToTokenPool's rows and pp_max_micro_batch_size):
        # admission stops at it (_new_prefill)
        self.max_running: int = cfg.resolved_max_running_requests()
        self.arrivals = None  # the trace's arrivals, open or closed loop (run)
        self.rank = 0  # the data-parallel rank (its rows' dp_rank; engine/deployment.py)
        self.id_step = 1  # batch ids: rank + 1, then every num_ranks-th
        # Called with (request, now) when a request leaves this scheduler, finished or rejected
        # (a deployment's router counts what it has in flight); None: nobody asks.
        self.on_leave = None
        # clock.at(t_ns, fn, arg): fn(arg) at virtual time t_ns; its own queue's, where a
        # deployment puts its shared queue's (engine/deployment.py RankClock)
        self.clock = own_clock
        ctrl.clock = own_clock
        # The events' callbacks bound once (a bound method made at every `at` was ~460
        # instructions: the attribute look-up on the type and the method object; session 27)
        self._prefill_done_fn = self._prefill_done
        self._cache_unfinished_fn = self._cache_unfinished
        # (and the run-ahead's step callback: bound at every run-ahead that steps, 117,543 on
        # conversation --dp 8; the finish event's: every finish; session 33)
        self._give_step_fn = self._give_step
        self._finish_fn = self._finish
        # The pass the loops run (schedule_pass): an attribute, so that a harness can watch each
        # pass (tests/sglang/scheduler_harness.py) where a compiled method cannot be replaced
        self.pass_fn: Callable[[int], int | None] = self.schedule_pass
        self._own_pass: Callable[[int], int | None] = self.pass_fn  # run: still ours, called natively

    def as_rank(self, rank: int, num_ranks: int) -> None:
        """Rank `rank` of a deployment of `num_ranks` (engine/deployment.py): every row it and its
        controller emit says so, and its batch, node, eviction and transfer ids are rank + 1,
        then every num_ranks-th, so no two ranks' ids meet. Rank 0 of 1 is the default."""
        self.rank, self.id_step = rank, num_ranks
        self._batch_id = rank + 1 - num_ranks
        self.tree.number_nodes(rank + 1, num_ranks)
        self.ctrl.as_rank(rank, num_ranks)

    # --- main loop -----------------------------------------------------------------------
    def run(self, requests: Iterable[TraceRequest]) -> EngineStats:
        src = self.arrivals = ArrivalSource(requests, self.cfg.time_scale, closed=self.cfg.arrivals != "trace")
        src.on_drop = self._drop_turn
        now = 0
        gpu_free = 0
        events = self._events
        pop = _HEAPPOP
        tick = self.emit.tick
        # Nothing reaches the scheduler but the trace's arrivals and its own events, so the
        # passes before the next of them that can only be decode steps run at once
        # (DecodeSteps.run_decode_ahead). In a closed loop too: a turn is released by a finish
        # (an event: the steps stop before it, or it is folded in as the loop runs it) and the
        # read-ahead moves only when asked while it has room (`reads_ahead`), which the steps
        # cannot give it (no delivery, no finish, no drop): the loop's asks at their passes
        # would read nothing. Where it has room after a pass (an abort dropped a session's
        # turns), the loop asks at its next wake, at that wake's clock: no steps run ahead.
        ahead = self.decode_ahead
        # The wakes that stop them (an arrival, an event) run there too, as this loop runs them
        # (`_wakes_until`), and the steps go on where the pass stays a decode step
        fold = self._wakes_until
        # The pass: `schedule_pass` called natively (compiled: a direct call, not Python's
        # generic call through the attribute) unless a harness has put its own in `pass_fn`
        own_pass = self._own_pass
        while True:
            while True:  # arrivals and events at `now`, until a finish releases no turn due now
                if src.has_due(now):  # (most wakes are a pass's or an event's: no generator made)
                    for t, at, trace_at, think_ms in src.due(now):
                        self._arrive(t, at, trace_at, think_ms)  # (a native call: no bound method)
                while events and events[0][0] <= now:
                    event: tuple[int, int, Any, Any] = pop(events)  # (typed: its items read in place)
                    self.event_ns = event[0]
                    event[2](event[3])
                nxt_t = src.next_ns(now)
                if nxt_t is None or nxt_t > now:
                    break
            ran = False
            if now >= gpu_free and (self.waiting or self.running or self.chunked is not None):
                end = self.schedule_pass(now) if self.pass_fn is own_pass else self.pass_fn(now)
                if end is not None:
                    # (not in a closed loop with sessions and a storage tier: a turn a finish
                    # releases among the steps arrives there and starts its storage query, whose
                    # progress SGLang checks pass by pass; the steps would run past those passes.
                    # tests/sglang/test_scheduler_0523.py's demo40 `stored-best_effort` case)
                    if ahead and not (src.closed and src.num_sessions and self.ctrl.storage is not None) \
                            and not src.reads_ahead():
                        limit = src.next_ns(now)
                        if events and (limit is None or events[0][0] < limit):
                            limit = events[0][0]
                        self._fold_now = now
                        end = self.run_decode_ahead(end, limit, None, fold)
                        # (arrivals up to `end` may have come in there: at the last wake it ran)
                        nxt_t = src.next_ns(self._fold_now)
                    gpu_free, ran = end, True
                if tick is not None:  # a batch's events are in: the probe may flush its buffers
                    tick()
            elif now >= gpu_free:
                self.idle_pass(now, nxt_t is not None)
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
        self.ctrl.release_storage_writes(now, every=True)
        self._drain_held_releases(every=True)
        self.stats.virtual_end_ns = now
        return self.stats

    def idle_pass(self, now: int, more: bool) -> None:
        """A pass with nothing to run (`event_loop_normal`: no batch, `on_idle`), at a wake.
        `self_check_during_idle` resets `new_token_ratio`; the last batch's backups go
        (process_batch_result). 0.5.23's idle loop still calls `get_next_batch_to_run`, whose
        `_process_hicache_events` -> `check_hicache_events` drains the storage queues
        (`drain_storage_control_queues`): a cut read's last ack is taken when the read stops and
        its tail freed at the drain after (`_drain_ack_prefetch`, `_drain_release`), a storage
        write's ack releases its host copy (`_drain_backup`), while nobody waits. `more`:
        arrivals are still to come (after the last, the replay's end frees them all)."""
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self.ctrl.flush_backups(now)
        if more and self.storage_acks and self._idle_storage_due(now):
            self.storage_pass_start(now)

    def _idle_storage_due(self, now: int) -> bool:
        """Whether an idle pass now would change the storage state: a write to start, land or
        release, a cut read's tail whose last ack is due or taken, a held release due. SGLang's
        idle loop spins (a number of passes no virtual clock reproduces); the engine passes only
        where one changes something, so its pass count (the re-queries' clock) does not depend on
        how often the loop wakes."""
        step = self.prefetch_pass + 1
        for entry in self.ctrl.storage_writes:
            if entry.start < 0 or (entry.release_pass <= step and entry.end <= now):
                return True
        for stop, seen, _slots in self.ctrl.prefetch_tails:
            if (seen < 0 and now >= stop) or (seen >= 0 and step > seen):
                return True
        for due, _slots in self.held_releases:
            if due <= step:
                return True
        return False

    def _wakes_until(self, t: int) -> int | None:
        """The loop's wakes at or before `t` while the GPU is busy until `t` (no pass among
        them), run as `run` runs them: at each, the arrivals due, then the events due; returns
        the next wake after `t`, None if none (DecodeSteps.run_decode_ahead's `fold`). In a
        closed loop the source is asked at each wake's clock, after its arrivals and events, as
        the loop asks it (a finish's released turn, the read-ahead: `next_ns(now)`)."""
        src = self.arrivals
        assert src is not None
        events = self._events
        pop = _HEAPPOP
        woke = False
        while True:
            w = src.next_ns(self._fold_now)
            if events and (w is None or events[0][0] < w):
                w = events[0][0]
            if w is None or w > t:
                if woke and self.emit.tick is not None:  # what came in may be flushed
                    self.emit.tick()
                return w
            woke = True
            self._fold_now = w
            if src.has_due(w):  # (an event's wake has no arrival: no generator made)
                for tr, at, trace_at, think_ms in src.due(w):
                    # (a native call: `self._arrive` kept in a local was a bound method made every
                    # fold, ~8k a 3,000-request run, and a generic call an arrival; session 27)
                    self._arrive(tr, at, trace_at, think_ms)
            while events and events[0][0] <= w:
                entry: tuple[int, int, Any, Any] = pop(events)  # (typed: its items read in place)
                self.event_ns = entry[0]
                entry[2](entry[3])

    # --- arrival -------------------------------------------------------------------------
    def _arrive(self, t: TraceRequest, now: int, trace_ns: int, think_ms: float | None,
                keys_np: np.ndarray | None = None, route: ev.Route | None = None) -> None:
        """A request arrives (a deployment passes the page keys' array it computed to route it,
        and the routing columns of its record; the request's key run is one copy of that array)."""
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
        overhead = self.r_overhead_pages
        # Admission into an empty pool (PrefillAdder.add_one_req): input + min(output, 4096)
        # + the rule set's page must be less than the pool, or the request would wait forever.
        need = req.input_len + min(req.output_len, CLIP_MAX_NEW_TOKENS)
        if need + overhead * ps >= self.ctrl.device_capacity * ps:  # (the typed copy: a native compare)
            # Said with the admission overhead where the rule set has one (0.5.23's PrefillAdder
            # counts a page a request beside its tokens): a request that needs exactly the pool
            # is refused for that page, and the reason must say so.
            extra = (f" and {overhead * ps} of admission overhead (SGLang {self.rules.version}: a page a "
                     f"request)" if overhead else "")
            self._reject(req, f"needs {need} tokens of device memory{extra}; the pool holds "
                              f"{self.ctrl.device.capacity * ps}")
            return
        if keys_np is None:
            req.keys_np, req.keys = self._page_keys(t)
        else:
            req.keys_np, req.keys = keys_np, key_run(keys_np)
        req.max_match_pages = min(len(req.keys), (req.input_len - 1) // ps)
        if self.miss is not None:
            self.miss.arrived(req, self.tree)
        if self.ctrl.storage is not None:
            if self.storage_acks:
                # 0.5.23 handles an arrival at the next pass (recv_requests ->
                # `_add_request_to_queue` -> `_prefetch_kvcache`, before get_next_batch_to_run)
                self.unqueried.append(req)
            else:
                self._start_prefetch(req, now)
        self.waiting.append(req)
        self.arrived_at[req.seq] = self.processed_tokens  # req.arrival_processed_tokens

    def _page_keys(self, t: TraceRequest) -> tuple[np.ndarray, KeyRun]:
        """The request's page keys as `page_keys_array` makes them, and their run (`key_run`). A
        hash_ids request without an extra_key, on the compiled data plane: the bytearray of
        `_cplane.block_page_keys` is both, the array a view of it and the run one copy of it
        (page_keys_array's three interpreted frames and key_run's `tobytes` copy were ~5k
        instructions an arrival; issue 41, session 24). Anything else, or what the C declines,
        takes page_keys_array, which raises what it raises."""
        per_block = self._per_block
        hash_ids = t.hash_ids
        if per_block and hash_ids is not None and t.extra_key is None and _C_BLOCK_PAGE_KEYS is not None:
            raw = _C_BLOCK_PAGE_KEYS(hash_ids, t.input_len // self.ps, per_block)
            if isinstance(raw, bytearray):
                run = empty_run()
                run.frombytes(raw)
                return _FROMBUFFER(raw, _INT64), run
        keys_np = page_keys_array(t, page_size=self.ps, block_size=self.cfg.block_size)
        return keys_np, key_run(keys_np)

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
                 miss_beyond_storage_tokens=None, miss_prefetch_lost_tokens=None)
            if self.emit.tick is not None:  # rejections come without batches: a trace of them stays bounded
                self.emit.tick()

    def _drop_turn(self, t: TraceRequest, now: int, trace_ns: int) -> None:
        """A turn of a session that ended (an earlier turn was rejected): never served, recorded
        as rejected at `now`, when the replay dropped it."""
        self._reject(Req(t, now, trace_ns, pause_ms(t)), "session_ended: an earlier turn of its session was rejected",
                     ends_session=False)

    # --- batches -------------------------------------------------------------------------
    def schedule_pass(self, now: int) -> int | None:
        """One scheduling pass (Scheduler.get_next_batch_to_run, without mixed chunk unless
        `enable_mixed_chunk`): a prefill batch if one can be formed (`get_new_batch_prefill`),
        else a decode step of the running batch (`update_running_batch`), else nothing (the
        scheduler idles: `self_check_during_idle` resets `new_token_ratio`). Returns when the
        GPU is free again, None when nothing ran."""
        self.ctrl.blocking_ns = 0
        # 0.5.23: the last batch's backups (process_batch_result -> flush_pending_backups, the
        # same instant) or a batch-less pass's stash (writing_check) go now, merged
        self.ctrl.flush_backups(now)
        self.ctrl.ack_loads()  # _process_hicache_events -> check_hicache_events: loading_check
        self.storage_pass_start(now)  # queries, drain, re-queries (prefetch.py)
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
        # nothing ran, but requests wait (memory, a copy's ack): `Scheduler.on_idle` resets
        # new_token_ratio only when `is_fully_idle` (no waiting request either), the run loop's
        # idle branch
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
        # get_num_allocatable_reqs: the cap less the running batch (the ReqToTokenPool's free
        # rows, plus the row a continuing chunk holds, come to the same number)
        allocatable = self.max_running - len(self.running)
        returns_early = self.r_returns_early
        if allocatable <= 0 and self.chunked is None:
            # 0.5.23 `_get_new_batch_prefill_raw`: "get_num_allocatable_reqs(...) <= 0 and
            # self.chunked_req is None" -> batch_is_full, before calc_priority. 0.5.9 goes on
            # (its test reads `chunked_req is not None`): calc_priority, then the loop's first
            # request meets the cap.
            if not returns_early and self.waiting:
                self._calc_priority(now)
            self.batch_is_full = True
            return None
        mixed = len(self.running) if self.mixed_chunk else 0  # num_mixed_decode_tokens
        budget = self.max_prefill_tokens - mixed
        ratio = self.new_token_ratio
        self._total_offset = mixed + self._running_reserve() * ratio
        self._cur_offset = mixed
        items: list[tuple[Req, int, int, int]] = []  # (req, chunk tokens, load-back ns, load-back pages)
        chunk_continues = False
        sorted_yet = False
        overhead = self.r_overhead_pages
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
                    chunk_budget = min(budget, cap)
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
        # The admitted leave the queue together when the loop is done, not one by one (`del
        # waiting[i]` moved the rest of the queue, ~1,000 long, at every admission): [0, i) are
        # then the requests tried, each admitted or kept (`kept`, in queue order). Nothing the
        # loop calls reads the queue.
        waiting = self.waiting
        kept: list[Req] = []
        i = 0
        # The head is tried while any budget is left (0.5.23: the loop breaks on `budget_state()
        # == OTHER`, rem_chunk_tokens <= 0): under a page it is still matched (its prefix
        # stamped) before `_select_prefill_admission` finds no page to give it (OTHER), or no
        # memory (NO_TOKEN). A continuing chunk spends the budget, unless memory cut it short.
        while i < len(waiting):
            # `len(adder.can_run_list) >= get_num_allocatable_reqs(...)` -> batch_is_full: 0.5.23
            # after the budget's break, 0.5.9 before it
            if not returns_early and len(items) >= allocatable:
                self.batch_is_full = True
            if budget <= 0:
                break
            if returns_early and len(items) >= allocatable:
                self.batch_is_full = True
            if self.batch_is_full:
                break  # a chunked request's pass: it goes on, nobody else is admitted
            req = waiting[i]
            if (req.hold_until_ns > now or req.prefetch_ack_pass > self.prefetch_pass
                    or req.prefetch_query_pass == self.prefetch_pass) and \
                    self._prefetch_holds(req, now):  # "skip staging requests that are ongoing prefetch"
                req.held = True
                kept.append(req)
                i += 1
                continue
            if self.ctrl.storage is not None:
                if req.query_anchor is not None:  # its query in flight, the policy lets it end now
                    self._revoke_query(req)
                if req.prefetch is not None:  # check_prefetch_progress: the policy lets it end now
                    self._finish_prefetch(req, now)
                self._pop_loaded_span(req)
                if self._prefetch_after_hit_loss(req, now):
                    kept.append(req)
                    i += 1
                    continue
            admitted = self._admit(req, budget, now, first=not items, may_chunk=not chunk_continues)
            if admitted is NO_TOKEN:
                # "Set batch_is_full after making sure there are requests that can be served"
                self.batch_is_full = bool(items) or bool(self.running)
                break
            if admitted is OTHER:
                break  # the request waits, and so does everyone behind it
            i += 1  # (out of the queue with the others at the end)
            arrived_at = self.arrived_at
            if req.seq in arrived_at:  # (compiled, `dict.pop` is a generic method call)
                del arrived_at[req.seq]
            if self.has_storage:  # (no tier: no query, so nothing armed)
                self.requeries.cancel(req)  # its armed re-query, if any, cancelled
            take, lb_ns, lb_pages = admitted
            items.append((req, take, lb_ns, lb_pages))
            budget -= -(-take // ps) * ps  # PrefillAdder._update_prefill_budget: page-ceiled
            ends = req.done_tokens + take >= req.fill_len
            self._reserve(overhead, min(req.output_len, CLIP_MAX_NEW_TOKENS) if ends else 0)
            # (a request that became the chunked request took the budget floored to a page: what
            # is left, under a page, still matches the next head)
            if self._rem_total() <= 0 or self._rem_current() <= 0:  # budget_state: NO_TOKEN
                self.batch_is_full = True
                break
        if len(kept) < i:  # someone was admitted: [0, i) becomes the kept, in their order
            if kept:
                waiting[:i] = kept
            else:
                del waiting[:i]
        if self.r_batch_alloc_page:
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
        return self._free_tokens() - self._total_offset

    def _rem_current(self) -> float:
        return self._free_tokens() - self._cur_offset

    def _free_tokens(self) -> int:
        """Free + evictable device tokens. `free` declared int: compiled, the sum and product are
        native, where the pool's count (an interpreted class's attribute: Any) made each of them a
        generic operation on boxed ints (issue 41, session 25)."""
        free: int = self.ctrl.device.free_pages
        return (free + self.tree.evictable_device_pages) * self.ps

    def _calc_priority(self, now: int) -> None:
        """SchedulePolicy.calc_priority: the queue policy's order, then (0.5.23)
        `_touch_waiting_prefixes`: on every `refresh_interval`-th pass that reaches it with a
        cache-agnostic active policy (a cache-aware one touches while matching) and a waiting
        queue, the cached prefixes of the first `waiting_prefix_refresh_max` waiting requests
        are walked, head last, so LRU evicts them in reverse admission order."""
        waiting = self.waiting
        if self.queue.sort is not None:  # (fcfs orders nothing: no bound `match` made a pass for it)
            self.queue.order(waiting, self.tree.match, self.ps, now, self.processed_tokens, self.arrived_at)
        interval = self.refresh_interval
        if not interval or not waiting or self.queue.cache_aware(waiting):
            return
        refresh = self.refresh_calls % interval == 0
        self.refresh_calls += 1
        if refresh:
            # RadixTree.match's walk: the stamps without the match's result. Called on the typed
            # tree, a native call (a bound method kept in a local was a generic call: the
            # wrapper's argument parsing and `now` boxed, a walk; issue 41, session 24)
            # Each request's path is kept for its next refresh (`touch_walk`: the same stamps, no
            # walk where nothing on its path changed; issue 41, session 28)
            tree = self.tree
            for r in reversed(waiting[:self.refresh_max]):
                # touch_waiting_prefix: the whole input, page-aligned
                r.walk_memo = tree.touch_walk(r.keys, now, r.walk_memo)

    def _pages_through(self, req: Req, end_tokens: int) -> int:
        """Pages holding tokens [0, end_tokens): the extend allocates its own tokens only
        (`alloc_for_extend`); output pages come a decode step at a time (`alloc_for_decode`)."""
        return -(-end_tokens // self.ps)

    def _take(self, remaining: int, budget: int) -> int:
        """A new request's extend: whole if its page-ceiled length fits what is left of the
        budget (`input_tokens = ceil_paged_tokens(extend)` against `rem_chunk_tokens`, 0.5.9
        `add_one_req`, 0.5.23 `_select_prefill_admission`: exact-chunk-fill is gfx95 only), else
        a chunk of the budget floored to a page. Under mixed chunk the budget is off a page
        boundary (a token a running request less), where the raw length would fit a chunk in."""
        ps = self.ps
        return remaining if -(-remaining // ps) * ps <= budget else (budget // ps) * ps



def reject_kind(reason: str) -> str:
    """The kind of a rejection's reason, for the replay's closing counts: `context_length`,
    `session_ended` (the reason's own first word), else `device_memory` (a request the whole
    device pool cannot hold)."""
    head = reason.partition(":")[0]
    return head if head in ("context_length", "session_ended") else "device_memory"
