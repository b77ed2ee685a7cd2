"""The engine's handle on its probe (`Emitters`): one callable an event kind, taking the tuple of
the event's fields in order (probes/events.py's EMITTED names the kinds, `emitter` makes each),
or None where nothing is to be emitted (no probe, or a probe that keeps no such events: the
engine then builds neither the event nor its fields); `tick`, called once a batch (None where
the probe has nothing to do then); `request`, the `record` emitter taking every column by
keyword (issue 38).

Compiled with the engine core (compiled.MODULES): a native class whose attributes the compiled
Scheduler and CacheController (`emit: Emitters`) read at a fixed offset; as the plain class it
was in probes/events.py, each of the ~40 `self.emit.X` reads in the compiled core (with a probe
or without) was a look-up by name (issue 41). The Python source is its twin."""

from __future__ import annotations

from typing import Any, Callable, Final, Optional

from librt.vecs import append, vec
from mypy_extensions import i64

from tierdiag.probes import events as ev

Emit = Optional[Callable[[tuple], None]]


def _of(probe: Any, name: str) -> Emit:
    return ev.emitter(probe, ev.EMITTED[name])


class Emitters:
    """One attribute a kind of events.EMITTED (each its emitter or None), `tick` and `request`."""

    def __init__(self, probe: Any) -> None:
        # A recorder that hands its rows over encoded takes a finished request's record as
        # columns (`RequestColumns`: one a probe, made by the first Emitters that asks), and its
        # `record` emitter is then that buffer's `append` (the other rows: rejections)
        adopt = getattr(probe, "adopt_columns", None) if probe is not None else None
        self.request_columns: Optional[RequestColumns] = (adopt(ev.RequestRecord, RequestColumns)
                                                          if adopt is not None else None)
        self.arrived: Emit = _of(probe, "arrived")
        self.matched: Emit = _of(probe, "matched")
        self.skipped: Emit = _of(probe, "skipped")
        self.transfer: Emit = _of(probe, "transfer")
        self.eviction: Emit = _of(probe, "eviction")
        self.lost: Emit = _of(probe, "lost")
        self.batch: Emit = _of(probe, "batch")
        self.prefill_done: Emit = _of(probe, "prefill_done")
        self.first_token: Emit = _of(probe, "first_token")
        self.pool_sample: Emit = _of(probe, "pool_sample")
        self.record: Emit = _of(probe, "record")
        self.decode_step: Emit = _of(probe, "decode_step")
        self.tick: Optional[Callable[[], None]] = getattr(probe, "tick", None)
        # The request record by name (issue 38): `emit.request(req_id=..., seq=..., ...)`, every
        # field a keyword (those RequestRecord gives a default may be left out); None where no
        # record is emitted. Builds the same tuple `record` takes, in the columns' order.
        self.request: Optional[Callable[..., None]] = (None if self.record is None
                                                       else ev.by_keyword(ev.RequestRecord, self.record))


# A finished request's record as columns (`RequestColumns`), the columns by how they travel:
# an int64 each (RequestRecord's ints that a finished request always has), an object each (its
# strings, floats and Optional values: already objects, appended as they are), the routing
# columns as the request's `Route` tuple (one object a row, made once a request by the router),
# and two constants (status "finished", reject_reason NULL).
REQUEST_INT_COLUMNS: Final = (
    "seq", "arrival_ns", "input_tokens", "output_tokens", "device_hit_tokens", "host_hit_tokens",
    "storage_hit_tokens", "computed_tokens", "recomputed_tokens", "host_match_tokens",
    "storage_match_tokens", "loadback_skipped_tokens", "prefix_indices_len", "cache_protected_len",
    "extend_input_len", "queue_ns", "storage_wait_ns", "loadback_ns", "loadback_exposed_ns",
    "loadback_queued_ns", "loadback_bytes", "loadback_pages", "loadback_runs", "storage_bytes",
    "storage_fetch_ns", "recompute_ns", "compute_ns", "prefill_ns", "ttft_ns", "ideal_ttft_ns",
    "ttft_if_device_resident_ns", "recompute_instead_ns", "num_chunks", "first_token_ns", "finish_ns",
    "trace_arrival_ns", "dp_rank", "decode_wait_ns", "retractions", "miss_never_cached_tokens",
    "miss_evicted_before_reuse_tokens", "miss_lost_while_queued_tokens", "miss_loadback_skipped_tokens",
    "miss_prefetch_declined_tokens", "miss_prefetch_revoked_tokens", "miss_shared_in_batch_tokens",
    "miss_routed_elsewhere_tokens", "miss_beyond_storage_tokens", "miss_prefetch_lost_tokens",)
REQUEST_OBJECT_COLUMNS: Final = (
    "req_id", "hit_class", "loadback_skipped_reason", "storage_skipped_reason", "first_batch_id",
    "session_id", "think_ms",)
REQUEST_CONSTANTS: Final = (("status", "finished"), ("reject_reason", None))


class RequestColumns:
    """The requests table's buffer where the probe is a recorder handing rows over encoded (its
    `adopt_columns`): a finished request's record appended a column each (`finished`, called by
    the compiled RequestRecords._record with its values unboxed: an int is written into a
    `vec[i64]`, librt's packed vector, with no int object, no tuple and no free; issue 41: the
    record's 70-value tuple, its boxed ints and their frees were ~45 % of its ~14k instructions),
    and any other row (a rejected request's, a probe's `emit`) as a tuple into the recorder's own
    buffer (`rows`), its place among the finished ones kept (`at`: finished rows before it).
    `take()` hands the lot over as one dict (its shape below: the ints as little-endian int64
    bytes) that store/columns.py's `table_columns` turns into the table's Arrow columns, the rows
    in the order they were appended; probes/recorder.py's `columns_of` into Python values.
    Compiled with the engine core; the Python source (librt.vecs works interpreted too) is its
    twin."""

    i_seq: vec[i64]
    i_arrival_ns: vec[i64]
    i_input_tokens: vec[i64]
    i_output_tokens: vec[i64]
    i_device_hit_tokens: vec[i64]
    i_host_hit_tokens: vec[i64]
    i_storage_hit_tokens: vec[i64]
    i_computed_tokens: vec[i64]
    i_recomputed_tokens: vec[i64]
    i_host_match_tokens: vec[i64]
    i_storage_match_tokens: vec[i64]
    i_loadback_skipped_tokens: vec[i64]
    i_prefix_indices_len: vec[i64]
    i_cache_protected_len: vec[i64]
    i_extend_input_len: vec[i64]
    i_queue_ns: vec[i64]
    i_storage_wait_ns: vec[i64]
    i_loadback_ns: vec[i64]
    i_loadback_exposed_ns: vec[i64]
    i_loadback_queued_ns: vec[i64]
    i_loadback_bytes: vec[i64]
    i_loadback_pages: vec[i64]
    i_loadback_runs: vec[i64]
    i_storage_bytes: vec[i64]
    i_storage_fetch_ns: vec[i64]
    i_recompute_ns: vec[i64]
    i_compute_ns: vec[i64]
    i_prefill_ns: vec[i64]
    i_ttft_ns: vec[i64]
    i_ideal_ttft_ns: vec[i64]
    i_ttft_if_device_resident_ns: vec[i64]
    i_recompute_instead_ns: vec[i64]
    i_num_chunks: vec[i64]
    i_first_token_ns: vec[i64]
    i_finish_ns: vec[i64]
    i_trace_arrival_ns: vec[i64]
    i_dp_rank: vec[i64]
    i_decode_wait_ns: vec[i64]
    i_retractions: vec[i64]
    i_miss_never_cached_tokens: vec[i64]
    i_miss_evicted_before_reuse_tokens: vec[i64]
    i_miss_lost_while_queued_tokens: vec[i64]
    i_miss_loadback_skipped_tokens: vec[i64]
    i_miss_prefetch_declined_tokens: vec[i64]
    i_miss_prefetch_revoked_tokens: vec[i64]
    i_miss_shared_in_batch_tokens: vec[i64]
    i_miss_routed_elsewhere_tokens: vec[i64]
    i_miss_beyond_storage_tokens: vec[i64]
    i_miss_prefetch_lost_tokens: vec[i64]
    o_req_id: list[object]
    o_hit_class: list[object]
    o_loadback_skipped_reason: list[object]
    o_storage_skipped_reason: list[object]
    o_first_batch_id: list[object]
    o_session_id: list[object]
    o_think_ms: list[object]
    rows: Any
    n: int
    at: vec[i64]
    route: list[object]

    def __init__(self, rows: Any) -> None:
        self.rows = rows
        self._reset()

    def _reset(self) -> None:
        self.n = 0
        self.at = vec[i64]()
        self.route = []
        self.i_seq = vec[i64]()
        self.i_arrival_ns = vec[i64]()
        self.i_input_tokens = vec[i64]()
        self.i_output_tokens = vec[i64]()
        self.i_device_hit_tokens = vec[i64]()
        self.i_host_hit_tokens = vec[i64]()
        self.i_storage_hit_tokens = vec[i64]()
        self.i_computed_tokens = vec[i64]()
        self.i_recomputed_tokens = vec[i64]()
        self.i_host_match_tokens = vec[i64]()
        self.i_storage_match_tokens = vec[i64]()
        self.i_loadback_skipped_tokens = vec[i64]()
        self.i_prefix_indices_len = vec[i64]()
        self.i_cache_protected_len = vec[i64]()
        self.i_extend_input_len = vec[i64]()
        self.i_queue_ns = vec[i64]()
        self.i_storage_wait_ns = vec[i64]()
        self.i_loadback_ns = vec[i64]()
        self.i_loadback_exposed_ns = vec[i64]()
        self.i_loadback_queued_ns = vec[i64]()
        self.i_loadback_bytes = vec[i64]()
        self.i_loadback_pages = vec[i64]()
        self.i_loadback_runs = vec[i64]()
        self.i_storage_bytes = vec[i64]()
        self.i_storage_fetch_ns = vec[i64]()
        self.i_recompute_ns = vec[i64]()
        self.i_compute_ns = vec[i64]()
        self.i_prefill_ns = vec[i64]()
        self.i_ttft_ns = vec[i64]()
        self.i_ideal_ttft_ns = vec[i64]()
        self.i_ttft_if_device_resident_ns = vec[i64]()
        self.i_recompute_instead_ns = vec[i64]()
        self.i_num_chunks = vec[i64]()
        self.i_first_token_ns = vec[i64]()
        self.i_finish_ns = vec[i64]()
        self.i_trace_arrival_ns = vec[i64]()
        self.i_dp_rank = vec[i64]()
        self.i_decode_wait_ns = vec[i64]()
        self.i_retractions = vec[i64]()
        self.i_miss_never_cached_tokens = vec[i64]()
        self.i_miss_evicted_before_reuse_tokens = vec[i64]()
        self.i_miss_lost_while_queued_tokens = vec[i64]()
        self.i_miss_loadback_skipped_tokens = vec[i64]()
        self.i_miss_prefetch_declined_tokens = vec[i64]()
        self.i_miss_prefetch_revoked_tokens = vec[i64]()
        self.i_miss_shared_in_batch_tokens = vec[i64]()
        self.i_miss_routed_elsewhere_tokens = vec[i64]()
        self.i_miss_beyond_storage_tokens = vec[i64]()
        self.i_miss_prefetch_lost_tokens = vec[i64]()
        self.o_req_id = []
        self.o_hit_class = []
        self.o_loadback_skipped_reason = []
        self.o_storage_skipped_reason = []
        self.o_first_batch_id = []
        self.o_session_id = []
        self.o_think_ms = []

    def finished(self,
            seq: i64, arrival_ns: i64, input_tokens: i64, output_tokens: i64, device_hit_tokens: i64,
            host_hit_tokens: i64, storage_hit_tokens: i64, computed_tokens: i64, recomputed_tokens: i64,
            host_match_tokens: i64, storage_match_tokens: i64, loadback_skipped_tokens: i64,
            prefix_indices_len: i64, cache_protected_len: i64, extend_input_len: i64, queue_ns: i64,
            storage_wait_ns: i64, loadback_ns: i64, loadback_exposed_ns: i64, loadback_queued_ns: i64,
            loadback_bytes: i64, loadback_pages: i64, loadback_runs: i64, storage_bytes: i64,
            storage_fetch_ns: i64, recompute_ns: i64, compute_ns: i64, prefill_ns: i64, ttft_ns: i64,
            ideal_ttft_ns: i64, ttft_if_device_resident_ns: i64, recompute_instead_ns: i64, num_chunks: i64,
            first_token_ns: i64, finish_ns: i64, trace_arrival_ns: i64, dp_rank: i64, decode_wait_ns: i64,
            retractions: i64, miss_never_cached_tokens: i64, miss_evicted_before_reuse_tokens: i64,
            miss_lost_while_queued_tokens: i64, miss_loadback_skipped_tokens: i64,
            miss_prefetch_declined_tokens: i64, miss_prefetch_revoked_tokens: i64,
            miss_shared_in_batch_tokens: i64, miss_routed_elsewhere_tokens: i64,
            miss_beyond_storage_tokens: i64, miss_prefetch_lost_tokens: i64, req_id: object,
            hit_class: object, loadback_skipped_reason: object, storage_skipped_reason: object,
            first_batch_id: object, session_id: object, think_ms: object, route: tuple) -> None:
        """A finished request's record, every column but the constants, by keyword. The ints are
        i64 parameters: each is converted where it is passed (compiled: by the caller), so a
        value past int64 is an OverflowError before any column took a value; the Python twin,
        where a column refuses it, takes back what the row's other columns took (a row is
        appended whole or not at all)."""
        try:
            self.i_seq = append(self.i_seq, seq)
            self.i_arrival_ns = append(self.i_arrival_ns, arrival_ns)
            self.i_input_tokens = append(self.i_input_tokens, input_tokens)
            self.i_output_tokens = append(self.i_output_tokens, output_tokens)
            self.i_device_hit_tokens = append(self.i_device_hit_tokens, device_hit_tokens)
            self.i_host_hit_tokens = append(self.i_host_hit_tokens, host_hit_tokens)
            self.i_storage_hit_tokens = append(self.i_storage_hit_tokens, storage_hit_tokens)
            self.i_computed_tokens = append(self.i_computed_tokens, computed_tokens)
            self.i_recomputed_tokens = append(self.i_recomputed_tokens, recomputed_tokens)
            self.i_host_match_tokens = append(self.i_host_match_tokens, host_match_tokens)
            self.i_storage_match_tokens = append(self.i_storage_match_tokens, storage_match_tokens)
            self.i_loadback_skipped_tokens = append(self.i_loadback_skipped_tokens, loadback_skipped_tokens)
            self.i_prefix_indices_len = append(self.i_prefix_indices_len, prefix_indices_len)
            self.i_cache_protected_len = append(self.i_cache_protected_len, cache_protected_len)
            self.i_extend_input_len = append(self.i_extend_input_len, extend_input_len)
            self.i_queue_ns = append(self.i_queue_ns, queue_ns)
            self.i_storage_wait_ns = append(self.i_storage_wait_ns, storage_wait_ns)
            self.i_loadback_ns = append(self.i_loadback_ns, loadback_ns)
            self.i_loadback_exposed_ns = append(self.i_loadback_exposed_ns, loadback_exposed_ns)
            self.i_loadback_queued_ns = append(self.i_loadback_queued_ns, loadback_queued_ns)
            self.i_loadback_bytes = append(self.i_loadback_bytes, loadback_bytes)
            self.i_loadback_pages = append(self.i_loadback_pages, loadback_pages)
            self.i_loadback_runs = append(self.i_loadback_runs, loadback_runs)
            self.i_storage_bytes = append(self.i_storage_bytes, storage_bytes)
            self.i_storage_fetch_ns = append(self.i_storage_fetch_ns, storage_fetch_ns)
            self.i_recompute_ns = append(self.i_recompute_ns, recompute_ns)
            self.i_compute_ns = append(self.i_compute_ns, compute_ns)
            self.i_prefill_ns = append(self.i_prefill_ns, prefill_ns)
            self.i_ttft_ns = append(self.i_ttft_ns, ttft_ns)
            self.i_ideal_ttft_ns = append(self.i_ideal_ttft_ns, ideal_ttft_ns)
            self.i_ttft_if_device_resident_ns = append(self.i_ttft_if_device_resident_ns, ttft_if_device_resident_ns)
            self.i_recompute_instead_ns = append(self.i_recompute_instead_ns, recompute_instead_ns)
            self.i_num_chunks = append(self.i_num_chunks, num_chunks)
            self.i_first_token_ns = append(self.i_first_token_ns, first_token_ns)
            self.i_finish_ns = append(self.i_finish_ns, finish_ns)
            self.i_trace_arrival_ns = append(self.i_trace_arrival_ns, trace_arrival_ns)
            self.i_dp_rank = append(self.i_dp_rank, dp_rank)
            self.i_decode_wait_ns = append(self.i_decode_wait_ns, decode_wait_ns)
            self.i_retractions = append(self.i_retractions, retractions)
            self.i_miss_never_cached_tokens = append(self.i_miss_never_cached_tokens, miss_never_cached_tokens)
            self.i_miss_evicted_before_reuse_tokens = append(self.i_miss_evicted_before_reuse_tokens, miss_evicted_before_reuse_tokens)
            self.i_miss_lost_while_queued_tokens = append(self.i_miss_lost_while_queued_tokens, miss_lost_while_queued_tokens)
            self.i_miss_loadback_skipped_tokens = append(self.i_miss_loadback_skipped_tokens, miss_loadback_skipped_tokens)
            self.i_miss_prefetch_declined_tokens = append(self.i_miss_prefetch_declined_tokens, miss_prefetch_declined_tokens)
            self.i_miss_prefetch_revoked_tokens = append(self.i_miss_prefetch_revoked_tokens, miss_prefetch_revoked_tokens)
            self.i_miss_shared_in_batch_tokens = append(self.i_miss_shared_in_batch_tokens, miss_shared_in_batch_tokens)
            self.i_miss_routed_elsewhere_tokens = append(self.i_miss_routed_elsewhere_tokens, miss_routed_elsewhere_tokens)
            self.i_miss_beyond_storage_tokens = append(self.i_miss_beyond_storage_tokens, miss_beyond_storage_tokens)
            self.i_miss_prefetch_lost_tokens = append(self.i_miss_prefetch_lost_tokens, miss_prefetch_lost_tokens)
            self.o_req_id.append(req_id)
            self.o_hit_class.append(hit_class)
            self.o_loadback_skipped_reason.append(loadback_skipped_reason)
            self.o_storage_skipped_reason.append(storage_skipped_reason)
            self.o_first_batch_id.append(first_batch_id)
            self.o_session_id.append(session_id)
            self.o_think_ms.append(think_ms)
        except BaseException:  # a value the twin could not take: the row not kept at all
            self._truncate()
            raise
        self.route.append(route)
        self.n += 1


    def _truncate(self) -> None:
        """Every column back to the finished rows' count (a row that failed part-way)."""
        n = self.n
        self.i_seq = self.i_seq[:n]
        self.i_arrival_ns = self.i_arrival_ns[:n]
        self.i_input_tokens = self.i_input_tokens[:n]
        self.i_output_tokens = self.i_output_tokens[:n]
        self.i_device_hit_tokens = self.i_device_hit_tokens[:n]
        self.i_host_hit_tokens = self.i_host_hit_tokens[:n]
        self.i_storage_hit_tokens = self.i_storage_hit_tokens[:n]
        self.i_computed_tokens = self.i_computed_tokens[:n]
        self.i_recomputed_tokens = self.i_recomputed_tokens[:n]
        self.i_host_match_tokens = self.i_host_match_tokens[:n]
        self.i_storage_match_tokens = self.i_storage_match_tokens[:n]
        self.i_loadback_skipped_tokens = self.i_loadback_skipped_tokens[:n]
        self.i_prefix_indices_len = self.i_prefix_indices_len[:n]
        self.i_cache_protected_len = self.i_cache_protected_len[:n]
        self.i_extend_input_len = self.i_extend_input_len[:n]
        self.i_queue_ns = self.i_queue_ns[:n]
        self.i_storage_wait_ns = self.i_storage_wait_ns[:n]
        self.i_loadback_ns = self.i_loadback_ns[:n]
        self.i_loadback_exposed_ns = self.i_loadback_exposed_ns[:n]
        self.i_loadback_queued_ns = self.i_loadback_queued_ns[:n]
        self.i_loadback_bytes = self.i_loadback_bytes[:n]
        self.i_loadback_pages = self.i_loadback_pages[:n]
        self.i_loadback_runs = self.i_loadback_runs[:n]
        self.i_storage_bytes = self.i_storage_bytes[:n]
        self.i_storage_fetch_ns = self.i_storage_fetch_ns[:n]
        self.i_recompute_ns = self.i_recompute_ns[:n]
        self.i_compute_ns = self.i_compute_ns[:n]
        self.i_prefill_ns = self.i_prefill_ns[:n]
        self.i_ttft_ns = self.i_ttft_ns[:n]
        self.i_ideal_ttft_ns = self.i_ideal_ttft_ns[:n]
        self.i_ttft_if_device_resident_ns = self.i_ttft_if_device_resident_ns[:n]
        self.i_recompute_instead_ns = self.i_recompute_instead_ns[:n]
        self.i_num_chunks = self.i_num_chunks[:n]
        self.i_first_token_ns = self.i_first_token_ns[:n]
        self.i_finish_ns = self.i_finish_ns[:n]
        self.i_trace_arrival_ns = self.i_trace_arrival_ns[:n]
        self.i_dp_rank = self.i_dp_rank[:n]
        self.i_decode_wait_ns = self.i_decode_wait_ns[:n]
        self.i_retractions = self.i_retractions[:n]
        self.i_miss_never_cached_tokens = self.i_miss_never_cached_tokens[:n]
        self.i_miss_evicted_before_reuse_tokens = self.i_miss_evicted_before_reuse_tokens[:n]
        self.i_miss_lost_while_queued_tokens = self.i_miss_lost_while_queued_tokens[:n]
        self.i_miss_loadback_skipped_tokens = self.i_miss_loadback_skipped_tokens[:n]
        self.i_miss_prefetch_declined_tokens = self.i_miss_prefetch_declined_tokens[:n]
        self.i_miss_prefetch_revoked_tokens = self.i_miss_prefetch_revoked_tokens[:n]
        self.i_miss_shared_in_batch_tokens = self.i_miss_shared_in_batch_tokens[:n]
        self.i_miss_routed_elsewhere_tokens = self.i_miss_routed_elsewhere_tokens[:n]
        self.i_miss_beyond_storage_tokens = self.i_miss_beyond_storage_tokens[:n]
        self.i_miss_prefetch_lost_tokens = self.i_miss_prefetch_lost_tokens[:n]
        del self.o_req_id[n:]
        del self.o_hit_class[n:]
        del self.o_loadback_skipped_reason[n:]
        del self.o_storage_skipped_reason[n:]
        del self.o_first_batch_id[n:]
        del self.o_session_id[n:]
        del self.o_think_ms[n:]
        del self.route[n:]

    def append(self, row: tuple) -> None:
        """Any other row of the table (a tuple of RequestRecord's fields, in order): into the
        recorder's buffer, after the finished rows appended so far."""
        self.rows.append(row)
        self.at = append(self.at, self.n)

    def __len__(self) -> int:
        return self.n + len(self.at)

    def take(self) -> dict:
        """What was appended since the last take, and the buffer empty again: {"n": finished
        rows, "ints": {column: int64 bytes}, "objects": {column: list}, "route": list of
        Route tuples, "constants": ((column, value), ...), "at": int64 bytes (each other row's
        place: finished rows before it), "rows": the other rows as the recorder's buffer takes
        them (a list of tuples, or RowBuffer.take()'s)}."""
        rows = self.rows
        other: object = rows.take() if not isinstance(rows, list) else list(rows)
        if isinstance(rows, list):
            rows.clear()
        out = {"n": self.n, "constants": REQUEST_CONSTANTS, "at": bytes(memoryview(self.at)),
               "rows": other, "route": self.route, "ints": {
            "seq": bytes(memoryview(self.i_seq)),
            "arrival_ns": bytes(memoryview(self.i_arrival_ns)),
            "input_tokens": bytes(memoryview(self.i_input_tokens)),
            "output_tokens": bytes(memoryview(self.i_output_tokens)),
            "device_hit_tokens": bytes(memoryview(self.i_device_hit_tokens)),
            "host_hit_tokens": bytes(memoryview(self.i_host_hit_tokens)),
            "storage_hit_tokens": bytes(memoryview(self.i_storage_hit_tokens)),
            "computed_tokens": bytes(memoryview(self.i_computed_tokens)),
            "recomputed_tokens": bytes(memoryview(self.i_recomputed_tokens)),
            "host_match_tokens": bytes(memoryview(self.i_host_match_tokens)),
            "storage_match_tokens": bytes(memoryview(self.i_storage_match_tokens)),
            "loadback_skipped_tokens": bytes(memoryview(self.i_loadback_skipped_tokens)),
            "prefix_indices_len": bytes(memoryview(self.i_prefix_indices_len)),
            "cache_protected_len": bytes(memoryview(self.i_cache_protected_len)),
            "extend_input_len": bytes(memoryview(self.i_extend_input_len)),
            "queue_ns": bytes(memoryview(self.i_queue_ns)),
            "storage_wait_ns": bytes(memoryview(self.i_storage_wait_ns)),
            "loadback_ns": bytes(memoryview(self.i_loadback_ns)),
            "loadback_exposed_ns": bytes(memoryview(self.i_loadback_exposed_ns)),
            "loadback_queued_ns": bytes(memoryview(self.i_loadback_queued_ns)),
            "loadback_bytes": bytes(memoryview(self.i_loadback_bytes)),
            "loadback_pages": bytes(memoryview(self.i_loadback_pages)),
            "loadback_runs": bytes(memoryview(self.i_loadback_runs)),
            "storage_bytes": bytes(memoryview(self.i_storage_bytes)),
            "storage_fetch_ns": bytes(memoryview(self.i_storage_fetch_ns)),
            "recompute_ns": bytes(memoryview(self.i_recompute_ns)),
            "compute_ns": bytes(memoryview(self.i_compute_ns)),
            "prefill_ns": bytes(memoryview(self.i_prefill_ns)),
            "ttft_ns": bytes(memoryview(self.i_ttft_ns)),
            "ideal_ttft_ns": bytes(memoryview(self.i_ideal_ttft_ns)),
            "ttft_if_device_resident_ns": bytes(memoryview(self.i_ttft_if_device_resident_ns)),
            "recompute_instead_ns": bytes(memoryview(self.i_recompute_instead_ns)),
            "num_chunks": bytes(memoryview(self.i_num_chunks)),
            "first_token_ns": bytes(memoryview(self.i_first_token_ns)),
            "finish_ns": bytes(memoryview(self.i_finish_ns)),
            "trace_arrival_ns": bytes(memoryview(self.i_trace_arrival_ns)),
            "dp_rank": bytes(memoryview(self.i_dp_rank)),
            "decode_wait_ns": bytes(memoryview(self.i_decode_wait_ns)),
            "retractions": bytes(memoryview(self.i_retractions)),
            "miss_never_cached_tokens": bytes(memoryview(self.i_miss_never_cached_tokens)),
            "miss_evicted_before_reuse_tokens": bytes(memoryview(self.i_miss_evicted_before_reuse_tokens)),
            "miss_lost_while_queued_tokens": bytes(memoryview(self.i_miss_lost_while_queued_tokens)),
            "miss_loadback_skipped_tokens": bytes(memoryview(self.i_miss_loadback_skipped_tokens)),
            "miss_prefetch_declined_tokens": bytes(memoryview(self.i_miss_prefetch_declined_tokens)),
            "miss_prefetch_revoked_tokens": bytes(memoryview(self.i_miss_prefetch_revoked_tokens)),
            "miss_shared_in_batch_tokens": bytes(memoryview(self.i_miss_shared_in_batch_tokens)),
            "miss_routed_elsewhere_tokens": bytes(memoryview(self.i_miss_routed_elsewhere_tokens)),
            "miss_beyond_storage_tokens": bytes(memoryview(self.i_miss_beyond_storage_tokens)),
            "miss_prefetch_lost_tokens": bytes(memoryview(self.i_miss_prefetch_lost_tokens)),
        }, "objects": {
            "req_id": self.o_req_id,
            "hit_class": self.o_hit_class,
            "loadback_skipped_reason": self.o_loadback_skipped_reason,
            "storage_skipped_reason": self.o_storage_skipped_reason,
            "first_batch_id": self.o_first_batch_id,
            "session_id": self.o_session_id,
            "think_ms": self.o_think_ms,
        }}
        self._reset()
        return out

    def clear(self) -> None:
        rows = self.rows
        rows.clear()
        self._reset()
