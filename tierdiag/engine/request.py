"""A request inside the engine (`Req`: what the scheduler knows of it, from arrival to finish)
and its record's columns (`request_row`); engine/records.py builds the record
(`RequestRecords._record`: the finished request's row, its token split and TTFT parts, and the
run's totals), with the pool samples taken beside it.

TTFT parts (every one in ns of the virtual clock, adding up to TTFT):

    arrival |-- queue --|-- storage wait --|-- load-back exposed --|-- recompute --|-- compute --| first token
"""

from __future__ import annotations
from typing import Any

import numpy as np

from tierdiag.engine.tree import TreeNode
from tierdiag.probes.events import ROUTE_NONE
from tierdiag.trace.reader import TraceRequest
from tierdiag.engine.tree_node import KeyRun, WalkMemo, empty_run


class Req:
    __slots__ = (
        "seq", "req_id", "arrival_ns", "input_len", "output_len", "keys", "keys_np", "total_pages", "max_match_pages",
        "prefetch", "anchor", "prefetch_tokens", "hold_until_ns", "held", "priority", "sort_key",
        "lock_node", "device_prefix_pages", "prefix_pages", "host_loaded_pages", "storage_loaded_pages",
        "host_match_pages", "storage_match_pages", "loadback_skip_reason", "loadback_skip_pages", "storage_skip_reason",
        "own_slots", "own_from_page", "done_tokens", "extend_total_tokens", "recomputed_pages",
        "fill_len", "generated_tokens", "kv_len", "join_step", "next_page", "finish_step", "in_running", "first_pass",
        "retractions",
        "scheduled_ns", "first_batch_id", "num_chunks", "loadback_ns", "loadback_exposed_ns", "loadback_queued_ns",
        "loadback_pages", "loadback_runs",
        "storage_bytes", "storage_fetch_ns", "recompute_ns", "compute_ns", "first_token_ns", "lost",
        "loadback_wall_ns", "loadback_verified", "protected_pages", "session", "think_ms", "trace_arrival_ns",
        "prefetch_wait_ns", "prefetch_deadline_ns", "prefetch_retries", "inserted_pages", "prefill_work_tokens",
        "storage_hit_end", "route", "storage_last_match", "prefetch_ack_pass", "prefetch_query_pass", "storage_memo",
        "walk_memo", "query_anchor", "query_matched", "query_hits", "query_span",
        "storage_span_pages", "storage_span_start", "loaded_span_pages", "loaded_span_start", "queue_entry",
        "miss_arrival_pages", "miss_shared_pages", "miss_prefetch_lost",
    )
    total_pages: int  # set on arrival (Scheduler._arrive)
    max_match_pages: int
    # Declared int: compiled, these are native ints. Read off the trace's request (an
    # interpreted msgspec Struct: Any to mypyc), they were object fields, and every sum,
    # product and compare of them a generic number operation on a boxed int (~90 instructions,
    # 5-10 a request at admission alone; issue 41, session 26)
    input_len: int
    output_len: int
    fill_len: int

    def __init__(self, t: TraceRequest, arrival_ns: int, trace_arrival_ns: int | None = None,
                 think_ms: float | None = None):
        self.seq = t.seq
        self.req_id = t.req_id
        self.arrival_ns = arrival_ns  # in this replay (closed loop: the predecessor's finish + think)
        self.trace_arrival_ns = arrival_ns if trace_arrival_ns is None else trace_arrival_ns  # the timestamp, scaled
        self.session = t.session
        # The pause after the predecessor's answer (None: no predecessor; 0 where the line gives none).
        self.think_ms = think_ms
        self.input_len = t.input_len
        self.output_len = t.output_len
        # page keys: the input's full pages, then (at finish) output pages; a key run (array('q'),
        # tree_node.key_run) made at arrival, a list where a test sets one
        self.keys: KeyRun = []
        # `keys` as an array (the prefill's content writes and the arrival's blame read it); None
        # from the finish on (DecodeSteps._finish: nobody reads it after)
        self.keys_np: np.ndarray | None = None
        self.prefetch: tuple | None = None  # (first page, pages, host slots, start ns, end ns)
        self.anchor: TreeNode | None = None  # the node whose host copy the prefetch protects
        self.prefetch_tokens = 0  # tokens the prefetch counts against the capacity limit
        self.prefetch_wait_ns: int | None = None  # timeout budget armed at the first blocked poll (0.5.23)
        self.prefetch_deadline_ns: int | None = None  # when that budget ends; kept across re-queries
        self.prefetch_retries = 0  # storage re-queries made (StoragePrefetchRetries, 0.5.23)
        # 0.5.23's `storage_hit_end` in pages: where a hit the host could not take ended, carried
        # into the re-query (`poll_miss`), which then assumes that span stored (`assume_stored`).
        self.storage_hit_end: int | None = None
        # The span its last finished prefetch put into the tree (pages read from storage less
        # those already there, and the page it starts at: `prefetch_loaded_tokens_by_reqid`,
        # `prefetch_loaded_storage_start_by_reqid`), until an admission poll takes it
        # (`pop_prefetch_loaded_span`) as `storage_span_*` (`req.storage_hit_length`,
        # `storage_hit_start`), which only a span of at least a page replaces.
        self.loaded_span_pages = self.loaded_span_start = 0
        self.storage_span_pages = self.storage_span_start = 0
        # 0.5.23's `storage_prefetch_last_match_len` in pages: device + host pages matched at the
        # last storage query (`_prefetch_kvcache`); 0 before any
        self.storage_last_match = 0
        # its last storage query's tree match, for its re-queries (prefetch.StorageQueryMemo)
        self.storage_memo: Any = None
        # its key run's path at its last walk (a refresh while it waits, an admission's match):
        # RadixTree.touch_walk's memo
        self.walk_memo: WalkMemo | None = None
        # the scheduling pass (Scheduler.prefetch_pass) from which its prefetch's read is seen
        # (rule storage_acks_per_pass); 0: on its read's time only
        self.prefetch_ack_pass = 0
        # the pass its last storage query was made in (rule storage_acks_per_pass): a query made
        # inside a pass (a re-query) is answered by the next; -1: none
        self.prefetch_query_pass = -1
        # its storage query in flight until the next drain (rule storage_acks_per_pass: on the
        # scheduler's `unallocated` list): the anchor it host-protects (None: no query in flight),
        # the pages matched, the hit (0: a miss) and the span requested (prefetch.py)
        self.query_anchor: TreeNode | None = None
        self.query_matched = self.query_hits = self.query_span = 0
        self.inserted_pages = 0  # req.kv.cache_inserted_len in pages: what this request's inserts covered
        # Decode: the tokens its next prefill covers (input, plus the output so far after a
        # retraction), output tokens generated (len(output_ids)) and KV committed when it last
        # joined or left the running batch, and its place on the decode clock (scheduler.py).
        self.fill_len = self.input_len
        self.generated_tokens = 0
        self.kv_len = 0
        self.join_step = self.next_page = self.finish_step = 0
        self.in_running = False
        self.first_pass: tuple | None = None  # FIRST_PASS_FIELDS at its first retraction
        self.retractions = 0
        self.prefill_work_tokens = 0  # `_shortest_prefill_work` at the last sort (shortest-prefill-first)
        # When it last joined the waiting queue (SGLang's time_stats.wait_queue_entry_time, the
        # shortest-prefill-first tie-break): (ns, -1, seq) at arrival; a retracted request's
        # (ns, i, seq), i its place among that retraction's requests (they re-enter the queue
        # after the arrivals handed in before the pass, in retract_decode's order).
        self.queue_entry = (arrival_ns, -1, t.seq)
        self.route = ROUTE_NONE  # the record's routing columns (engine/deployment.py sets them)
        self.priority = t.priority
        self.sort_key = 0.0
        self.hold_until_ns = 0
        self.held = False
        self.lock_node: TreeNode | None = None
        self.device_prefix_pages = self.prefix_pages = self.host_loaded_pages = self.storage_loaded_pages = 0
        self.host_match_pages = self.storage_match_pages = 0
        self.loadback_skip_reason: str | None = None
        self.loadback_skip_pages = 0
        self.storage_skip_reason: str | None = None
        self.own_slots: Any = empty_run()
        self.own_from_page = 0  # page index of own_slots[0]
        self.done_tokens = 0  # input tokens whose KV exists (prefix + computed chunks)
        self.extend_total_tokens = 0
        self.recomputed_pages = 0
        self.scheduled_ns: int | None = None
        self.first_batch_id: int | None = None
        self.num_chunks = 0
        self.loadback_ns = self.loadback_queued_ns = self.loadback_pages = self.loadback_runs = 0
        self.loadback_exposed_ns = 0.0
        self.storage_bytes = self.storage_fetch_ns = 0
        self.recompute_ns = self.compute_ns = 0.0
        self.first_token_ns: int | None = None
        self.lost: dict[int, int] = {}  # eviction id -> tokens of this request's prefix it took
        self.loadback_wall_ns = 0
        self.protected_pages = 0  # cache_protected_len in pages: the prefix the tree protects for us
        self.loadback_verified: bool | None = None
        # The miss reasons' facts (engine/miss.py's MissTracker, a probe's only): its own tree's
        # device + host pages at arrival, the pages another request of its batch computes, the
        # pages its own prefetch read and lost before its first scheduling (-1: not scheduled yet)
        self.miss_arrival_pages = self.miss_shared_pages = 0
        self.miss_prefetch_lost = -1


# What a request's record says of its first admission: a retracted request is admitted again
# (its input and output so far prefilled anew), and its record keeps the first one's.
FIRST_PASS_FIELDS = (
    "device_prefix_pages", "prefix_pages", "host_loaded_pages", "storage_loaded_pages", "host_match_pages",
    "storage_match_pages", "loadback_skip_reason", "loadback_skip_pages", "storage_skip_reason", "recomputed_pages",
    "scheduled_ns", "first_batch_id", "num_chunks", "loadback_ns", "loadback_exposed_ns", "loadback_queued_ns",
    "loadback_pages", "loadback_runs",
    "storage_bytes", "storage_fetch_ns", "recompute_ns", "compute_ns", "protected_pages", "loadback_wall_ns",
    "loadback_verified",
    "held", "hold_until_ns", "extend_total_tokens", "storage_span_pages", "storage_span_start")


def request_row(
        *,
        req_id: object, seq: object, arrival_ns: object, input_tokens: object, output_tokens: object, status: object,
        reject_reason: object, hit_class: object, device_hit_tokens: object, host_hit_tokens: object,
        storage_hit_tokens: object, computed_tokens: object, recomputed_tokens: object, host_match_tokens: object,
        storage_match_tokens: object, loadback_skipped_reason: object, loadback_skipped_tokens: object,
        storage_skipped_reason: object, prefix_indices_len: object, cache_protected_len: object,
        extend_input_len: object, queue_ns: object, storage_wait_ns: object, loadback_ns: object,
        loadback_exposed_ns: object, loadback_queued_ns: object, loadback_bytes: object, loadback_pages: object,
        loadback_runs: object, storage_bytes: object, storage_fetch_ns: object, recompute_ns: object,
        compute_ns: object, prefill_ns: object, ttft_ns: object, ideal_ttft_ns: object,
        ttft_if_device_resident_ns: object, recompute_instead_ns: object, first_batch_id: object, num_chunks: object,
        first_token_ns: object, finish_ns: object, session_id: object, think_ms: object, trace_arrival_ns: object,
        dp_rank: object, route_branch: object, route_reason: object, route_score: object, route_score_name: object,
        arrival_device_tokens: object, arrival_host_tokens: object, best_rank: object,
        best_rank_device_tokens: object, best_rank_host_tokens: object, ranks_json: object, decode_wait_ns: object,
        retractions: object, miss_never_cached_tokens: object, miss_evicted_before_reuse_tokens: object,
        miss_lost_while_queued_tokens: object, miss_loadback_skipped_tokens: object,
        miss_prefetch_declined_tokens: object, miss_prefetch_revoked_tokens: object,
        miss_shared_in_batch_tokens: object, miss_routed_elsewhere_tokens: object,
        miss_beyond_storage_tokens: object, miss_prefetch_lost_tokens: object) -> tuple:
    """A request's record as the tuple the recorder stores (RequestRecord's fields, in order),
    every field by keyword and every one required. Compiled, a call by keyword to this function
    is resolved when it is compiled: the arguments are passed by position and the tuple built in
    C (issue 41: the generated keyword emitter, `events.by_keyword`, matched ~70 keywords in a
    Python frame a request, ~14k instructions, the largest single piece of a record). The values
    are the row's as they are (the store's schema types them); tests/engine/test_recorder.py
    holds the parameters to RequestRecord's fields, in order."""
    return (req_id, seq, arrival_ns, input_tokens, output_tokens, status, reject_reason, hit_class,
            device_hit_tokens, host_hit_tokens, storage_hit_tokens, computed_tokens, recomputed_tokens,
            host_match_tokens, storage_match_tokens, loadback_skipped_reason, loadback_skipped_tokens,
            storage_skipped_reason, prefix_indices_len, cache_protected_len, extend_input_len, queue_ns,
            storage_wait_ns, loadback_ns, loadback_exposed_ns, loadback_queued_ns, loadback_bytes, loadback_pages,
            loadback_runs, storage_bytes, storage_fetch_ns, recompute_ns, compute_ns, prefill_ns, ttft_ns,
            ideal_ttft_ns, ttft_if_device_resident_ns, recompute_instead_ns, first_batch_id, num_chunks,
            first_token_ns, finish_ns, session_id, think_ms, trace_arrival_ns, dp_rank, route_branch, route_reason,
            route_score, route_score_name, arrival_device_tokens, arrival_host_tokens, best_rank,
            best_rank_device_tokens, best_rank_host_tokens, ranks_json, decode_wait_ns, retractions,
            miss_never_cached_tokens, miss_evicted_before_reuse_tokens, miss_lost_while_queued_tokens,
            miss_loadback_skipped_tokens, miss_prefetch_declined_tokens, miss_prefetch_revoked_tokens,
            miss_shared_in_batch_tokens, miss_routed_elsewhere_tokens, miss_beyond_storage_tokens,
            miss_prefetch_lost_tokens)

