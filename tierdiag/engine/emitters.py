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
        # A recorder that hands its rows over encoded takes these tables' rows as columns
        # (`Columns`: one a probe and table, made by the first Emitters that asks; None for any
        # other probe), and the table's emitter below is then that buffer's `append` (its other
        # rows: rejections, events built by a probe's `emit`)
        adopt = getattr(probe, "adopt_columns", None) if probe is not None else None
        self.request_columns: Optional[RequestColumns] = None
        self.eviction_columns: Optional[EvictionColumns] = None
        self.pool_sample_columns: Optional[PoolSampleColumns] = None
        self.batch_columns: Optional[BatchColumns] = None
        self.transfer_columns: Optional[TransferColumns] = None
        if adopt is not None:
            self.request_columns = adopt(ev.RequestRecord, RequestColumns)
            self.eviction_columns = adopt(ev.Eviction, EvictionColumns)
            self.pool_sample_columns = adopt(ev.PoolSample, PoolSampleColumns)
            self.batch_columns = adopt(ev.BatchScheduled, BatchColumns)
            self.transfer_columns = adopt(ev.Transfer, TransferColumns)
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


# The columnar buffers: a table's rows appended a column each by the compiled engine, its values
# unboxed (issue 41, session 24: a row as a tuple of boxed ints, encoded by the C row buffer
# and freed, was most of a row's cost: ~14k instructions a request record, ~2.5k an eviction).
# The columns by how they travel: an int64 each (*_INT_COLUMNS: librt's `vec[i64]`, a packed
# vector, native in compiled code: an int is written with no object made), an object each
# (*_OBJECT_COLUMNS: strings and Optional values, objects already: appended as they are), a
# group of columns as one tuple a row (*_TUPLE_COLUMNS: a request's Route), and constants.


class Columns:
    """A table's buffer where the probe is a recorder handing its rows over encoded (its
    `adopt_columns`: one a probe and table, made by the first Emitters that asks): rows
    appended a column each by the subclass's typed method (`finished` / `add`, called by the
    compiled engine with its values unboxed), any other row of the table (a rejected request's,
    an event a probe's `emit` was handed) as a tuple into the recorder's own buffer (`rows`),
    its place among the others kept (`at`: the column rows before it). `counter` (a vec of one
    int64, shared by a recorder's columnar buffers) is their column rows in all, kept as they
    are appended and taken: the recorder's ticker reads it in place (_cplane.FlushTicker,
    through a memoryview), where each buffer's len() was a call through mypyc's slot. A row is
    appended whole or not at all: compiled, its ints are i64 parameters, converted where they are passed (a
    value past int64 is an error before any column took a value); the Python twin, where a
    column refuses a value, takes back what the row's other columns took (`_truncate`).

    `take()` hands the lot over as one dict, and the buffer is empty again: {"n": column rows,
    "ints": {column: int64 bytes, the machine's order (both processes run on it)}, "objects":
    {column: list}, "constants": ((column, value), ...), "tuples": ((columns, list of tuples),
    ...), "at": int64 bytes (each other row's place: column rows before it), "rows": the other
    rows as the recorder's buffer takes them (a list of tuples, or RowBuffer.take()'s)}, which
    store/columns.py's `table_columns` turns into the table's Arrow columns and
    probes/recorder.py's `columns_of` into Python values, the rows in the order appended.
    Compiled with the engine core; the Python source (librt.vecs works interpreted too) is its
    twin."""

    rows: Any
    n: int
    at: vec[i64]
    counter: vec[i64]

    def __init__(self, rows: Any, counter: vec[i64]) -> None:
        self.rows = rows
        self.counter = counter
        self.n = 0
        self.at = vec[i64]()
        self._reset()

    def _layout(self) -> tuple[tuple[str, ...], tuple[str, ...], tuple, tuple]:
        """The subclass's columns: (int columns, held in `i_NAME` vecs; object columns, in
        `o_NAME` lists; the constants of its rows; ((tuple's columns, attribute), ...): columns
        that travel as one tuple a row, in that attribute's list). Its typed `add` appends to them
        by name (the hot path); emptying, cutting back and handing over (once a flush, or a
        refused row) go by these names."""
        return (), (), (), ()

    def _reset(self) -> None:
        """Every column empty."""
        ints, objects, _, tuples = self._layout()
        for name in ints:
            setattr(self, "i_" + name, vec[i64]())
        for name in objects:
            setattr(self, "o_" + name, [])
        for _, attr in tuples:
            setattr(self, attr, [])

    def _truncate(self) -> None:
        """Every column back to the rows appended whole (`n`): a row a column refused."""
        n = self.n
        ints, objects, _, tuples = self._layout()
        for name in ints:
            setattr(self, "i_" + name, getattr(self, "i_" + name)[:n])
        for name in objects:
            del getattr(self, "o_" + name)[n:]
        for _, attr in tuples:
            del getattr(self, attr)[n:]

    def _columns(self) -> tuple[dict, dict, tuple, tuple]:
        """(ints, objects, constants, tuples) of take()'s dict."""
        ints, objects, constants, tuples = self._layout()
        return ({name: bytes(memoryview(getattr(self, "i_" + name))) for name in ints},
                {name: getattr(self, "o_" + name) for name in objects}, constants,
                tuple((fields, getattr(self, attr)) for fields, attr in tuples))

    def append(self, row: tuple) -> None:
        """Any other row of the table (a tuple of its event's fields, in order): into the
        recorder's buffer, after the column rows appended so far."""
        self.rows.append(row)
        self.at = append(self.at, self.n)

    def __len__(self) -> int:
        return self.n + len(self.at)

    def take(self) -> dict:
        rows = self.rows
        other: object = rows.take() if not isinstance(rows, list) else list(rows)
        if isinstance(rows, list):
            rows.clear()
        ints, objects, constants, tuples = self._columns()
        out = {"n": self.n, "ints": ints, "objects": objects, "constants": constants, "tuples": tuples,
               "at": bytes(memoryview(self.at)), "rows": other}
        self.clear()
        return out

    def clear(self) -> None:
        self.rows.clear()
        self.counter[0] -= self.n
        self.n = 0
        self.at = vec[i64]()
        self._reset()


REQUEST_INT_COLUMNS: Final = (
    "seq", "arrival_ns", "input_tokens", "output_tokens", "device_hit_tokens", "host_hit_tokens",
    "storage_hit_tokens", "computed_tokens", "recomputed_tokens", "host_match_tokens", "storage_match_tokens",
    "loadback_skipped_tokens", "prefix_indices_len", "cache_protected_len", "extend_input_len", "queue_ns",
    "storage_wait_ns", "loadback_ns", "loadback_exposed_ns", "loadback_queued_ns", "loadback_bytes",
    "loadback_pages", "loadback_runs", "storage_bytes", "storage_fetch_ns", "recompute_ns", "compute_ns",
    "prefill_ns", "ttft_ns", "ideal_ttft_ns", "ttft_if_device_resident_ns", "recompute_instead_ns", "num_chunks",
    "first_token_ns", "finish_ns", "trace_arrival_ns", "dp_rank", "decode_wait_ns", "retractions",
    "miss_never_cached_tokens", "miss_evicted_before_reuse_tokens", "miss_lost_while_queued_tokens",
    "miss_loadback_skipped_tokens", "miss_prefetch_declined_tokens", "miss_prefetch_revoked_tokens",
    "miss_shared_in_batch_tokens", "miss_routed_elsewhere_tokens", "miss_beyond_storage_tokens",
    "miss_prefetch_lost_tokens",)
REQUEST_OBJECT_COLUMNS: Final = (
    "req_id", "hit_class", "loadback_skipped_reason", "storage_skipped_reason", "first_batch_id", "session_id",
    "think_ms",)
REQUEST_CONSTANTS: Final = (("status", "finished"), ("reject_reason", None))
REQUEST_TUPLE_COLUMNS: Final = ev.Route._fields

EVICTION_INT_COLUMNS: Final = (
    "eviction_id", "t_ns", "node_id", "tokens", "pool_used_tokens", "pool_capacity_tokens", "locked_tokens",
    "node_hit_count", "node_last_access_ns", "dp_rank",)
EVICTION_OBJECT_COLUMNS: Final = (
    "tier", "action", "cause_req_id", "owner_req_id",)
EVICTION_CONSTANTS: Final = ()

POOL_SAMPLE_INT_COLUMNS: Final = (
    "t_ns", "used_tokens", "capacity_tokens", "locked_tokens", "dp_rank",)
POOL_SAMPLE_OBJECT_COLUMNS: Final = (
    "tier",)
POOL_SAMPLE_CONSTANTS: Final = ()

TRANSFER_INT_COLUMNS: Final = (
    "transfer_id", "t_start_ns", "t_end_ns", "pages", "runs", "bytes", "data_plane_bytes", "queued_ns",
    "wall_ns", "dp_rank",)
TRANSFER_OBJECT_COLUMNS: Final = (
    "kind", "req_id", "verified",)
TRANSFER_CONSTANTS: Final = ()

BATCH_INT_COLUMNS: Final = (
    "batch_id", "t_start_ns", "t_end_ns", "num_reqs", "extend_tokens", "loadback_bytes", "compute_ns",
    "loadback_exposed_ns", "num_decoding", "recompute_ns", "dp_rank",)
BATCH_OBJECT_COLUMNS: Final = ()
BATCH_CONSTANTS: Final = ()


class RequestColumns(Columns):
    """A finished request's record (RequestRecords._record), a column each; other rows
    (a rejected request's, by `append`) as tuples. Its routing columns travel as the request's
    `Route` tuple (one object a row, made once a request by the router), status and
    reject_reason as the constants of a finished row."""

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
    t_route: list[object]

    def _layout(self) -> tuple[tuple[str, ...], tuple[str, ...], tuple, tuple]:
        return REQUEST_INT_COLUMNS, REQUEST_OBJECT_COLUMNS, REQUEST_CONSTANTS, ((REQUEST_TUPLE_COLUMNS, "t_route"),)

    def finished(self,
            req_id: object, seq: i64, arrival_ns: i64, input_tokens: i64, output_tokens: i64, hit_class: object,
            device_hit_tokens: i64, host_hit_tokens: i64, storage_hit_tokens: i64, computed_tokens: i64,
            recomputed_tokens: i64, host_match_tokens: i64, storage_match_tokens: i64,
            loadback_skipped_reason: object, loadback_skipped_tokens: i64, storage_skipped_reason: object,
            prefix_indices_len: i64, cache_protected_len: i64, extend_input_len: i64, queue_ns: i64,
            storage_wait_ns: i64, loadback_ns: i64, loadback_exposed_ns: i64, loadback_queued_ns: i64,
            loadback_bytes: i64, loadback_pages: i64, loadback_runs: i64, storage_bytes: i64,
            storage_fetch_ns: i64, recompute_ns: i64, compute_ns: i64, prefill_ns: i64, ttft_ns: i64,
            ideal_ttft_ns: i64, ttft_if_device_resident_ns: i64, recompute_instead_ns: i64,
            first_batch_id: object, num_chunks: i64, first_token_ns: i64, finish_ns: i64, session_id: object,
            think_ms: object, trace_arrival_ns: i64, dp_rank: i64, decode_wait_ns: i64, retractions: i64,
            miss_never_cached_tokens: i64, miss_evicted_before_reuse_tokens: i64,
            miss_lost_while_queued_tokens: i64, miss_loadback_skipped_tokens: i64,
            miss_prefetch_declined_tokens: i64, miss_prefetch_revoked_tokens: i64,
            miss_shared_in_batch_tokens: i64, miss_routed_elsewhere_tokens: i64, miss_beyond_storage_tokens: i64,
            miss_prefetch_lost_tokens: i64, route: tuple) -> None:
        """One row, its columns by keyword (`Columns`: a row is appended whole or not at all)."""
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
            self.t_route.append(route)
        except BaseException:  # a value the Python twin's vec refused: the row not kept at all
            self._truncate()
            raise
        self.n += 1
        self.counter[0] += 1

class EvictionColumns(Columns):
    """An eviction's row (CacheController.record_eviction), a column each."""

    i_eviction_id: vec[i64]
    i_t_ns: vec[i64]
    i_node_id: vec[i64]
    i_tokens: vec[i64]
    i_pool_used_tokens: vec[i64]
    i_pool_capacity_tokens: vec[i64]
    i_locked_tokens: vec[i64]
    i_node_hit_count: vec[i64]
    i_node_last_access_ns: vec[i64]
    i_dp_rank: vec[i64]
    o_tier: list[object]
    o_action: list[object]
    o_cause_req_id: list[object]
    o_owner_req_id: list[object]

    def _layout(self) -> tuple[tuple[str, ...], tuple[str, ...], tuple, tuple]:
        return EVICTION_INT_COLUMNS, EVICTION_OBJECT_COLUMNS, EVICTION_CONSTANTS, ()

    def add(self,
            eviction_id: i64, t_ns: i64, tier: object, node_id: i64, tokens: i64, action: object,
            cause_req_id: object, owner_req_id: object, pool_used_tokens: i64, pool_capacity_tokens: i64,
            locked_tokens: i64, node_hit_count: i64, node_last_access_ns: i64, dp_rank: i64) -> None:
        """One row, its columns by keyword (`Columns`: a row is appended whole or not at all)."""
        try:
            self.i_eviction_id = append(self.i_eviction_id, eviction_id)
            self.i_t_ns = append(self.i_t_ns, t_ns)
            self.i_node_id = append(self.i_node_id, node_id)
            self.i_tokens = append(self.i_tokens, tokens)
            self.i_pool_used_tokens = append(self.i_pool_used_tokens, pool_used_tokens)
            self.i_pool_capacity_tokens = append(self.i_pool_capacity_tokens, pool_capacity_tokens)
            self.i_locked_tokens = append(self.i_locked_tokens, locked_tokens)
            self.i_node_hit_count = append(self.i_node_hit_count, node_hit_count)
            self.i_node_last_access_ns = append(self.i_node_last_access_ns, node_last_access_ns)
            self.i_dp_rank = append(self.i_dp_rank, dp_rank)
            self.o_tier.append(tier)
            self.o_action.append(action)
            self.o_cause_req_id.append(cause_req_id)
            self.o_owner_req_id.append(owner_req_id)
        except BaseException:  # a value the Python twin's vec refused: the row not kept at all
            self._truncate()
            raise
        self.n += 1
        self.counter[0] += 1

class PoolSampleColumns(Columns):
    """A pool sample (RequestRecords._sample_pools), a column each."""

    i_t_ns: vec[i64]
    i_used_tokens: vec[i64]
    i_capacity_tokens: vec[i64]
    i_locked_tokens: vec[i64]
    i_dp_rank: vec[i64]
    o_tier: list[object]

    def _layout(self) -> tuple[tuple[str, ...], tuple[str, ...], tuple, tuple]:
        return POOL_SAMPLE_INT_COLUMNS, POOL_SAMPLE_OBJECT_COLUMNS, POOL_SAMPLE_CONSTANTS, ()

    def add(self,
            t_ns: i64, tier: object, used_tokens: i64, capacity_tokens: i64, locked_tokens: i64, dp_rank: i64) -> None:
        """One row, its columns by keyword (`Columns`: a row is appended whole or not at all)."""
        try:
            self.i_t_ns = append(self.i_t_ns, t_ns)
            self.i_used_tokens = append(self.i_used_tokens, used_tokens)
            self.i_capacity_tokens = append(self.i_capacity_tokens, capacity_tokens)
            self.i_locked_tokens = append(self.i_locked_tokens, locked_tokens)
            self.i_dp_rank = append(self.i_dp_rank, dp_rank)
            self.o_tier.append(tier)
        except BaseException:  # a value the Python twin's vec refused: the row not kept at all
            self._truncate()
            raise
        self.n += 1
        self.counter[0] += 1

class TransferColumns(Columns):
    """A transfer's row (CacheController's copies between tiers), a column each."""

    i_transfer_id: vec[i64]
    i_t_start_ns: vec[i64]
    i_t_end_ns: vec[i64]
    i_pages: vec[i64]
    i_runs: vec[i64]
    i_bytes: vec[i64]
    i_data_plane_bytes: vec[i64]
    i_queued_ns: vec[i64]
    i_wall_ns: vec[i64]
    i_dp_rank: vec[i64]
    o_kind: list[object]
    o_req_id: list[object]
    o_verified: list[object]

    def _layout(self) -> tuple[tuple[str, ...], tuple[str, ...], tuple, tuple]:
        return TRANSFER_INT_COLUMNS, TRANSFER_OBJECT_COLUMNS, TRANSFER_CONSTANTS, ()

    def add(self,
            transfer_id: i64, t_start_ns: i64, t_end_ns: i64, kind: object, req_id: object, pages: i64,
            runs: i64, bytes: i64, data_plane_bytes: i64, queued_ns: i64, wall_ns: i64, verified: object,
            dp_rank: i64) -> None:
        """One row, its columns by keyword (`Columns`: a row is appended whole or not at all)."""
        try:
            self.i_transfer_id = append(self.i_transfer_id, transfer_id)
            self.i_t_start_ns = append(self.i_t_start_ns, t_start_ns)
            self.i_t_end_ns = append(self.i_t_end_ns, t_end_ns)
            self.i_pages = append(self.i_pages, pages)
            self.i_runs = append(self.i_runs, runs)
            self.i_bytes = append(self.i_bytes, bytes)
            self.i_data_plane_bytes = append(self.i_data_plane_bytes, data_plane_bytes)
            self.i_queued_ns = append(self.i_queued_ns, queued_ns)
            self.i_wall_ns = append(self.i_wall_ns, wall_ns)
            self.i_dp_rank = append(self.i_dp_rank, dp_rank)
            self.o_kind.append(kind)
            self.o_req_id.append(req_id)
            self.o_verified.append(verified)
        except BaseException:  # a value the Python twin's vec refused: the row not kept at all
            self._truncate()
            raise
        self.n += 1
        self.counter[0] += 1

class BatchColumns(Columns):
    """A prefill batch's row (Admission's batch run), a column each."""

    i_batch_id: vec[i64]
    i_t_start_ns: vec[i64]
    i_t_end_ns: vec[i64]
    i_num_reqs: vec[i64]
    i_extend_tokens: vec[i64]
    i_loadback_bytes: vec[i64]
    i_compute_ns: vec[i64]
    i_loadback_exposed_ns: vec[i64]
    i_num_decoding: vec[i64]
    i_recompute_ns: vec[i64]
    i_dp_rank: vec[i64]

    def _layout(self) -> tuple[tuple[str, ...], tuple[str, ...], tuple, tuple]:
        return BATCH_INT_COLUMNS, BATCH_OBJECT_COLUMNS, BATCH_CONSTANTS, ()

    def add(self,
            batch_id: i64, t_start_ns: i64, t_end_ns: i64, num_reqs: i64, extend_tokens: i64,
            loadback_bytes: i64, compute_ns: i64, loadback_exposed_ns: i64, num_decoding: i64, recompute_ns: i64,
            dp_rank: i64) -> None:
        """One row, its columns by keyword (`Columns`: a row is appended whole or not at all)."""
        try:
            self.i_batch_id = append(self.i_batch_id, batch_id)
            self.i_t_start_ns = append(self.i_t_start_ns, t_start_ns)
            self.i_t_end_ns = append(self.i_t_end_ns, t_end_ns)
            self.i_num_reqs = append(self.i_num_reqs, num_reqs)
            self.i_extend_tokens = append(self.i_extend_tokens, extend_tokens)
            self.i_loadback_bytes = append(self.i_loadback_bytes, loadback_bytes)
            self.i_compute_ns = append(self.i_compute_ns, compute_ns)
            self.i_loadback_exposed_ns = append(self.i_loadback_exposed_ns, loadback_exposed_ns)
            self.i_num_decoding = append(self.i_num_decoding, num_decoding)
            self.i_recompute_ns = append(self.i_recompute_ns, recompute_ns)
            self.i_dp_rank = append(self.i_dp_rank, dp_rank)
        except BaseException:  # a value the Python twin's vec refused: the row not kept at all
            self._truncate()
            raise
        self.n += 1
        self.counter[0] += 1
