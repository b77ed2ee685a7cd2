"""The finished request's record (`RequestRecords._record`: its row, its token split and TTFT
parts, and the run's totals) and the pool samples taken beside it: the Scheduler's mixin for its
output (engine/request.py holds the request, `Req`, and the row's columns, `request_row`).

TTFT parts (every one in ns of the virtual clock, adding up to TTFT):

    arrival |-- queue --|-- storage wait --|-- load-back exposed --|-- recompute --|-- compute --| first token
"""

from __future__ import annotations

from typing import cast

from librt.vecs import append, vec
from mypy_extensions import i64

from tierdiag.engine.cached_split import SPLIT_BY_TIER, SPLIT_PROMISED, split_by_tier, split_promised
from tierdiag.engine.miss import miss_tokens, routing_tokens
from tierdiag.engine.request import FIRST_PASS_FIELDS, Req, request_row
from tierdiag.engine.schedule_common import SchedulerState


class DecodeRuns:
    """The decode steps on the clock, kept as runs of back-to-back steps (`note`, every step:
    RequestRecords._note_decode): each run's start, end, and the decode time before it, so that a
    request's record can say how much of its wait was decode steps (`before`, twice a record).

    The runs are librt `vec[i64]`s in a native class of their own: compiled, a step's item read
    in `before`'s search is a bounds check and a load, where the Scheduler's lists of int
    objects were an item read, an unboxing of a two-digit int (the clock's ns) and a decref, ~58
    instructions a step of ~17, ~990 a call; and `note` writes the ends unboxed, where the list's
    last end was a new int object every decode step (issue 41 session 27). (Not three vec
    attributes of the Scheduler: mypyc 2.4.1 emits C that does not compile for a vec attribute
    set through a trait, as DecodeSteps' `self._drun_ends = append(...)` was.) Compiled with the
    engine core; the Python source (librt.vecs works interpreted too) is its twin."""

    starts: vec[i64]
    ends: vec[i64]
    cum: vec[i64]

    def __init__(self) -> None:
        self.starts = vec[i64]()
        self.ends = vec[i64]()
        self.cum = vec[i64]()

    def note(self, start: i64, end: i64) -> None:
        """A decode step from `start` to `end`: it joins the last run if it starts where that
        one ends, else it starts a run."""
        ends = self.ends
        n: i64 = len(ends)
        if n and ends[n - 1] == start:
            ends[n - 1] = end
            return
        starts = self.starts
        # all three made before any is set: the twin's vec refuses a value that is no int64 at
        # its append (compiled, where it is passed), and the runs are then as they were
        before: i64 = 0
        if n:
            before = self.cum[n - 1] + ends[n - 1] - starts[n - 1]
        cum = append(self.cum, before)
        starts = append(starts, start)
        ends = append(ends, end)
        self.cum = cum
        self.starts = starts
        self.ends = ends

    def before(self, t: i64) -> i64:
        """Virtual time the GPU spent in decode steps before `t`. The run is found by
        bisect_right(starts, t) - 1 written as its loop (compiled, the builtin `bisect_right` was
        a generic call: ~2k instructions a call, issue 41 session 22), its bounds native i64."""
        starts = self.starts
        lo: i64 = 0
        hi: i64 = len(starts)
        while lo < hi:
            mid = (lo + hi) >> 1
            if t < starts[mid]:
                hi = mid
            else:
                lo = mid + 1
        i = lo - 1
        if i < 0:
            return 0
        end = self.ends[i]
        return self.cum[i] + (t if t < end else end) - starts[i]


class RequestRecords(SchedulerState):
    """The Scheduler's records (a mixin, as SGLang's scheduler keeps its output processing in
    scheduler_output_processor_mixin.py): the finished request's row and the pool samples.
    A SchedulerState, as the other mixins: compiled, `self.ps`, `self.ctrl`, `self.emit` ... are
    native reads of the declared layout (they were generic look-ups by name: ~25 a record and
    ~10 a pool sample, issue 41)."""

    _druns: DecodeRuns  # (declared here, not in SchedulerState: records.py imports schedule_common)
    _split_kind: i64  # cached_split.split_kind of the rule set's split_cached_prefix (rules_split)

    def _note_decode(self, start: int, end: int) -> None:
        """A decode step's time (DecodeSteps, every step or run of steps back to back), kept as
        runs of steps on the clock (`DecodeRuns`)."""
        self.stats.decode_ns += end - start
        self._druns.note(start, end)

    def _record(self, req: Req, now: int) -> None:
        ps, cost, st = self.ps, self.cost, self.stats
        if req.first_pass is not None:
            for name, value in zip(FIRST_PASS_FIELDS, req.first_pass):
                setattr(req, name, value)
        device, host, storage = self.rules_split(req)
        # The request's ints as native ints, read once: compiled, `input_len` (Any on the Req) and
        # the Optional first_token_ns / scheduled_ns (set by now: it was scheduled and sampled
        # its first token) made every subtraction below and its results generic (PyNumber_*
        # on boxed ints, ~9 a record, and the request row's values boxed again; issue 41 s23)
        input_len: int = req.input_len
        first_token: int = cast(int, req.first_token_ns)
        scheduled: int = cast(int, req.scheduled_ns)
        arrival: int = req.arrival_ns
        computed = input_len - req.prefix_pages * ps
        recomputed = min(req.recomputed_pages * ps, computed)
        ttft = first_token - arrival
        storage_wait = 0
        if req.held:
            storage_wait = max(0, min(req.hold_until_ns, scheduled) - arrival)
        lb_exposed = int(req.loadback_exposed_ns)
        recompute_ns = int(req.recompute_ns)
        compute_ns = int(req.compute_ns)
        queue = ttft - storage_wait - lb_exposed - recompute_ns - compute_ns
        assert queue >= -2, f"request {req.req_id}: TTFT parts exceed TTFT by {-queue} ns"
        if queue < 0:
            compute_ns += queue
            queue = 0
        st.requests_finished += 1
        st.input_tokens += input_len
        st.device_tokens += device
        st.host_tokens += host
        st.storage_tokens += storage
        st.computed_tokens += computed
        st.recomputed_tokens += recomputed
        if req.loadback_pages:
            st.load_backs += 1
            st.load_back_bytes += req.loadback_pages * self.ctrl.page_bytes
            st.load_back_ns.append(req.loadback_ns)
        # the two reasons one after the other (a tuple of them iterated was a new tuple, an iterator
        # and three generic next calls a record, compiled)
        reason = req.loadback_skip_reason
        if reason:
            st.skipped[reason] = st.skipped.get(reason, 0) + 1
        reason = req.storage_skip_reason
        if reason:
            st.skipped[reason] = st.skipped.get(reason, 0) + 1
        emits = self.emit
        lost = emits.lost
        if lost is not None:
            lost_pairs = emits.lost_pairs
            if lost_pairs is not None:  # the recorder's row buffer: the dict's rows in one call
                if req.lost:
                    lost_pairs(req.req_id, req.lost)
            else:
                for eid, tokens in req.lost.items():
                    lost((req.req_id, eid, tokens))
        emit = emits.record
        cols = emits.request_columns
        if emit is not None:  # the record's counterfactuals: only for a probe that keeps them
            # Of its queue, the time the GPU ran decode steps (DecodeRuns.before): a column only
            runs = self._druns
            decode_wait: int = runs.before(first_token) - runs.before(arrival + storage_wait)
            if decode_wait > queue:
                decode_wait = queue
            new_tokens = computed - recomputed
            prefix = req.prefix_pages * ps
            ideal = cost.prefill_alone_ns(new_tokens, input_len - (new_tokens if new_tokens > 1 else 1))
            if_resident = ttft - lb_exposed - storage_wait
            loaded = (req.host_loaded_pages + req.storage_loaded_pages) * ps  # what was loaded, whatever is reported
            recompute_instead = if_resident + (cost.prefill_alone_ns(computed + loaded, req.device_prefix_pages * ps)
                                               - cost.prefill_alone_ns(computed, prefix)) if loaded else if_resident
            hit_class = "tiered_hit" if host + storage else "device_hit" if device else "miss"
            route: tuple = req.route  # (a tuple: its items are read natively, not by a generic subscript)
            host_match, storage_match = req.host_match_pages * ps, req.storage_match_pages * ps
            lb_skipped = req.loadback_skip_pages * ps
            # The miss reasons (engine/miss.py) from the record's own columns, those it reads
            arrival_pages, shared_pages, prefetch_lost_pages = (self.miss.take_pages(req) if self.miss is not None
                                                                else (0, 0, 0))
            best_rank_device, best_rank_host = route[7], route[8]
            arrival_device, arrival_host = route[4], route[5]
            miss = miss_tokens(
                computed, recomputed, req.loadback_skip_reason, lb_skipped, req.storage_skip_reason, storage_match,
                storage, device, host_match,
                routing_tokens(self.rank, route[6], best_rank_device or 0, best_rank_host or 0, arrival_device or 0,
                               arrival_host or 0, storage_match, recomputed),
                arrival_pages, shared_pages, prefetch_lost_pages, ps, self.ctrl.storage is not None)
            if cols is not None:  # a recorder's columns: the values unboxed, a column each (emitters.py)
                lb_pages = req.loadback_pages
                cols.finished(
                    seq=req.seq, arrival_ns=arrival, input_tokens=input_len, output_tokens=req.output_len,
                    device_hit_tokens=device, host_hit_tokens=host, storage_hit_tokens=storage,
                    computed_tokens=computed, recomputed_tokens=recomputed, host_match_tokens=host_match,
                    storage_match_tokens=storage_match, loadback_skipped_tokens=lb_skipped, prefix_indices_len=prefix,
                    cache_protected_len=req.protected_pages * ps, extend_input_len=input_len - prefix, queue_ns=queue,
                    storage_wait_ns=storage_wait, loadback_ns=req.loadback_ns, loadback_exposed_ns=lb_exposed,
                    loadback_queued_ns=req.loadback_queued_ns, loadback_bytes=lb_pages * self.ctrl.page_bytes,
                    loadback_pages=lb_pages, loadback_runs=req.loadback_runs, storage_bytes=req.storage_bytes,
                    storage_fetch_ns=req.storage_fetch_ns, recompute_ns=recompute_ns, compute_ns=compute_ns,
                    prefill_ns=first_token - scheduled, ttft_ns=ttft, ideal_ttft_ns=ideal,
                    ttft_if_device_resident_ns=if_resident, recompute_instead_ns=recompute_instead,
                    num_chunks=req.num_chunks, first_token_ns=first_token, finish_ns=now,
                    trace_arrival_ns=req.trace_arrival_ns, dp_rank=self.rank, decode_wait_ns=decode_wait,
                    retractions=req.retractions, miss_never_cached_tokens=miss[0],
                    miss_evicted_before_reuse_tokens=miss[1], miss_lost_while_queued_tokens=miss[2],
                    miss_loadback_skipped_tokens=miss[3], miss_prefetch_declined_tokens=miss[4],
                    miss_prefetch_revoked_tokens=miss[5], miss_shared_in_batch_tokens=miss[6],
                    miss_routed_elsewhere_tokens=miss[7], miss_beyond_storage_tokens=miss[8],
                    miss_prefetch_lost_tokens=miss[9], req_id=req.req_id, hit_class=hit_class,
                    loadback_skipped_reason=req.loadback_skip_reason, storage_skipped_reason=req.storage_skip_reason,
                    first_batch_id=req.first_batch_id, session_id=req.session, think_ms=req.think_ms, route=route)
            elif emit is not None:
                # By keyword into request_row, compiled: the keywords are resolved when it is compiled.
                emit(request_row(
                    req_id=req.req_id, seq=req.seq, arrival_ns=arrival, input_tokens=input_len,
                    output_tokens=req.output_len, status="finished", reject_reason=None, hit_class=hit_class,
                    device_hit_tokens=device, host_hit_tokens=host, storage_hit_tokens=storage,
                    computed_tokens=computed, recomputed_tokens=recomputed, host_match_tokens=host_match,
                    storage_match_tokens=storage_match, loadback_skipped_reason=req.loadback_skip_reason,
                    loadback_skipped_tokens=lb_skipped, storage_skipped_reason=req.storage_skip_reason,
                    prefix_indices_len=prefix, cache_protected_len=req.protected_pages * ps,
                    extend_input_len=input_len - prefix, queue_ns=queue, storage_wait_ns=storage_wait,
                    loadback_ns=req.loadback_ns, loadback_exposed_ns=lb_exposed,
                    loadback_queued_ns=req.loadback_queued_ns,
                    loadback_bytes=req.loadback_pages * self.ctrl.page_bytes, loadback_pages=req.loadback_pages,
                    loadback_runs=req.loadback_runs, storage_bytes=req.storage_bytes,
                    storage_fetch_ns=req.storage_fetch_ns,
                    recompute_ns=recompute_ns, compute_ns=compute_ns, prefill_ns=first_token - scheduled,
                    ttft_ns=ttft, ideal_ttft_ns=ideal, ttft_if_device_resident_ns=if_resident,
                    recompute_instead_ns=recompute_instead, first_batch_id=req.first_batch_id,
                    num_chunks=req.num_chunks, first_token_ns=first_token, finish_ns=now,
                    session_id=req.session, think_ms=req.think_ms, trace_arrival_ns=req.trace_arrival_ns,
                    dp_rank=self.rank, route_branch=route[0], route_reason=route[1], route_score=route[2],
                    route_score_name=route[3], arrival_device_tokens=arrival_device, arrival_host_tokens=arrival_host,
                    best_rank=route[6], best_rank_device_tokens=best_rank_device, best_rank_host_tokens=best_rank_host,
                    ranks_json=route[9], decode_wait_ns=decode_wait, retractions=req.retractions,
                    miss_never_cached_tokens=miss[0], miss_evicted_before_reuse_tokens=miss[1],
                    miss_lost_while_queued_tokens=miss[2], miss_loadback_skipped_tokens=miss[3],
                    miss_prefetch_declined_tokens=miss[4], miss_prefetch_revoked_tokens=miss[5],
                    miss_shared_in_batch_tokens=miss[6], miss_routed_elsewhere_tokens=miss[7],
                    miss_beyond_storage_tokens=miss[8], miss_prefetch_lost_tokens=miss[9]))
        if self.progress is not None and st.requests_finished % 256 == 0:
            self.progress(st.requests_finished, now, st)

    def rules_split(self, req: Req) -> tuple[int, int, int]:
        """The cached prefix by tier in tokens, as the rule set's release reports it
        (rules.RuleSet.split_cached_prefix): the host hit promised at match (0.5.9) or the one
        loaded (0.5.23), the storage pages this request's prefetch brought, after its host ones.

            input pages |-- dev_pages --|-- host_match --|-- storage (prefetched) --|
        """
        ps: int = self.ps
        storage_hit: int = (req.storage_loaded_pages if req.loadback_skip_pages == 0
                            else req.loadback_skip_pages - req.host_match_pages)
        host_hit: int = req.host_match_pages + storage_hit  # host_hit_length: prefetched pages are host pages by now
        host_loaded: int = req.host_loaded_pages + req.storage_loaded_pages
        prefix: int = req.prefix_pages
        device_prefix: int = req.device_prefix_pages
        storage_start: int = device_prefix + req.host_match_pages
        span: int = req.storage_span_pages
        span_start: int = req.storage_span_start
        # The rule set's function called by name (`_split_kind`, cached_split.split_kind): compiled, a
        # native call returning a struct of native ints, not a generic call through the field
        kind = self._split_kind
        if kind == SPLIT_BY_TIER:
            d, h, s = split_by_tier(prefix, device_prefix, host_hit, host_loaded, storage_hit, storage_start, span,
                                    span_start)
        elif kind == SPLIT_PROMISED:
            d, h, s = split_promised(prefix, device_prefix, host_hit, host_loaded, storage_hit, storage_start, span,
                                     span_start)
        else:
            d, h, s = self.rules.split_cached_prefix(prefix, device_prefix, host_hit, host_loaded, storage_hit,
                                                     storage_start, span, span_start)
        return d * ps, h * ps, s * ps

    def _sample_pools(self, now: int) -> None:
        ps, tree, ctrl = self.ps, self.tree, self.ctrl
        emit = self.emit.pool_sample
        rank = self.rank
        # capacity - free_pages, not PagePool's used_pages property (a Python call from compiled code);
        # declared int: native arithmetic on them, not generic operations on objects. The
        # capacities are the controller's (fixed: read once, their tokens boxed once)
        free: int = ctrl.device.free_pages
        cols = self.emit.pool_sample_columns
        if cols is not None:  # a recorder's columns: the values unboxed (emitters.py)
            cols.add(now, "device", (ctrl.device_capacity - free) * ps, ctrl.device_capacity * ps,
                     tree.locked_device_pages * ps, rank)
            free = ctrl.host.free_pages
            cols.add(now, "host", (ctrl.host_capacity - free) * ps, ctrl.host_capacity * ps,
                     tree.locked_host_pages * ps, rank)
            if ctrl.storage is not None:
                cols.add(now, "storage", ctrl.storage.used_pages * ps, ctrl.storage.capacity * ps, 0, rank)
            return
        emit((now, "device", (ctrl.device_capacity - free) * ps, ctrl.device_capacity_tokens,
              tree.locked_device_pages * ps, rank))
        free = ctrl.host.free_pages
        emit((now, "host", (ctrl.host_capacity - free) * ps, ctrl.host_capacity_tokens,
              tree.locked_host_pages * ps, rank))
        if ctrl.storage is not None:  # with ranks, the one shared tier as this rank's batch found it
            emit((now, "storage", ctrl.storage.used_pages * ps, ctrl.storage.capacity * ps, 0, rank))
