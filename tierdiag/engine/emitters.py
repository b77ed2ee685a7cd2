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

from librt.vecs import append, extend, vec
from mypy_extensions import i64

from tierdiag.config.names import EvictionAction, Tier
from tierdiag.probes import events as ev

Emit = Optional[Callable[[tuple], None]]


def _of(probe: Any, name: str) -> Emit:
    return ev.emitter(probe, ev.EMITTED[name])


class Emitters:
    """One attribute a kind of events.EMITTED (each its emitter or None), `tick` and `request`."""

    def __init__(self, probe: Any) -> None:
        # A recorder that hands its rows over encoded takes these tables' rows as columns (`Columns`,
        # one a probe and table; None for any other probe); the table's emitter is then its `append`
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
        # The `lost` events of a request in one call, (req_id, its `lost` dict): the recorder's
        # compiled row buffer's `append_pairs` (a row a pair, no tuple built and no int boxed a
        # row: issue 41, session 38); None where the probe has none (then `lost` a row at a time)
        pairs = getattr(probe, "pairs_emitter", None) if self.lost is not None else None
        self.lost_pairs: Optional[Callable[[object, dict], None]] = (None if pairs is None
                                                                     else pairs(ev.EMITTED["lost"]))
        self.tick: Optional[Callable[[], None]] = getattr(probe, "tick", None)
        # The request record by name (issue 38): `emit.request(req_id=..., seq=..., ...)`, every
        # field a keyword (those RequestRecord gives a default may be left out); None where no
        # record is emitted. Builds the same tuple `record` takes, in the columns' order.
        self.request: Optional[Callable[..., None]] = (None if self.record is None
                                                       else ev.by_keyword(ev.RequestRecord, self.record))


# The columnar buffers: a table's rows written by the compiled engine, its values unboxed (issue
# 41, session 24), each column as it travels: an int64 (*_INT_COLUMNS, into one librt `vec[i64]`),
# an object (*_OBJECT_COLUMNS: *_CODED ones as codes, the others set as they are), a group of
# columns as one tuple a row (*_TUPLE_COLUMNS: a request's Route), and constants.
# The rows a columnar buffer has room for at first (it doubles when full: `Columns._room`); a coded
# column's last values kept with their codes (`Columns._code`)
_FIRST_ROWS: Final = 256
_RECENT: Final = 4


class Columns:
    """A table's buffer where the probe is a recorder handing its rows over encoded (its
    `adopt_columns`: one a probe and table): rows appended by the subclass's typed method
    (`finished` / `add`, called by the compiled engine with its values unboxed), any other row
    of the table (a rejected request's, an event a probe's `emit` was handed) as a tuple into
    the recorder's own buffer (`rows`), its place among the others kept (`at`: the column rows
    before it). `counter` (a vec of one int64 shared by a recorder's columnar buffers, which
    its ticker reads in place) is their column rows in all.

    The ints of a row go into one librt `vec[i64]`, `block`, row after row (`width` ints a row,
    room for `cap` rows), each written by index (compiled: a bounds check and a store, ~8
    instructions; issue 41 session 25). The object columns are lists made `cap` long, set by
    index. The block and lists grow together, doubled (`_room`), when `n` reaches `cap`; the
    block is reused after a take. A row is kept whole or not at all: `n` moves only after every
    value is written, the objects after the ints, which alone can refuse a value (compiled, an
    i64 parameter is converted where it is passed; the twin's vec refuses it at its item set).
    A coded column (*_CODED: an object column of few values: tiers, actions, kinds, reasons)
    is an int in the block, an index into `dictionary`, the values met
    since the last take (`_code`: the column's last _RECENT values found by identity, a new one
    appended): a hand-over pickles each value once, not a reference a row, and the writer makes
    its Arrow strings from the codes in numpy (issue 41, session 28).

    `take()` hands the lot over as one dict, and the buffer is empty again: {"n": column rows,
    "ints": (int column names then coded ones, their values as int64s row after row, the
    machine's order: a read-only memoryview of the block's bytes, valid until the next row is
    written), "coded": (coded column names, dictionary), "objects": {column: list},
    "constants": ((column, value), ...), "tuples": ((columns, list of tuples), ...), "at": int64
    bytes (each other row's place), "rows": the other rows as the recorder's buffer takes them},
    which store/columns.py's `table_columns` turns into the table's Arrow columns and
    probes/recorder.py's `columns_of` into Python values, in the order appended. Compiled with
    the engine core; the Python source (librt.vecs works interpreted too) is its twin."""

    rows: Any
    n: i64
    cap: i64
    width: i64
    block: vec[i64]
    at: vec[i64]
    counter: vec[i64]
    dictionary: list[object]
    recent: vec[i64]
    words_at: i64

    def __init__(self, rows: Any, counter: vec[i64]) -> None:
        self.rows = rows
        self.counter = counter
        self.n = 0
        self.cap = 0
        ints, _, _, _, coded = self._layout()
        self.width = len(ints) + len(coded)
        self.block = vec[i64]()
        self.at = vec[i64]()
        self._objects_empty()
        self._codes_empty()

    def _codes_empty(self) -> None:
        self.dictionary = []
        self.words_at = -1  # where `_words_code` put the subclass's fixed words in `dictionary` (-1: not yet)
        # a kept value's id and its code side by side, a slot each (id 0: none; no object is at 0)
        self.recent = vec[i64]([0] * (2 * _RECENT * len(self._layout()[4])))

    def _code(self, at: i64, value: object) -> i64:
        """`value`'s code in a coded column whose last values are kept from slot `at` in `recent`:
        a value met there (by identity: its id) its code, else the next code (the dictionary
        appended). The ids are ints in a vec, compared unboxed: compiled, a list of the values
        was an item read by a C call with its incref and decref a slot compared (~80
        instructions a call, ~234k calls a conversation replay; issue 41 session 35). An id
        stands for its value while the value lives: every kept value is in `dictionary`, which
        `_codes_empty` drops together with the ids."""
        recent = self.recent
        key: i64 = id(value)
        i: i64 = 2 * at
        end: i64 = i + 2 * _RECENT
        while i < end:
            if recent[i] == key:
                return recent[i + 1]
            i += 2
        code: i64 = len(self.dictionary)
        self.dictionary.append(value)
        i = 2 * (at + (code & (_RECENT - 1)))  # the slots taken in turn
        recent[i] = key
        recent[i + 1] = code
        return code

    def _words_code(self, words: tuple[object, ...]) -> i64:
        """Where `words` (a subclass's fixed values of its coded columns, known by their place in
        it: `EvictionColumns.add_keyed`) start in this hand-over's `dictionary`: appended once,
        at the first row that uses them, after whatever `_code` appended before (their codes and
        `_code`'s never mix up: `_code` finds only the values it appended)."""
        at = self.words_at
        if at < 0:
            at = len(self.dictionary)
            self.dictionary.extend(words)
            self.words_at = at
        return at

    def _layout(self) -> tuple[tuple[str, ...], tuple[str, ...], tuple, tuple, tuple[str, ...]]:
        """The subclass's columns: (int columns, in `block`'s rows in this order; object columns,
        in `o_NAME` lists; the constants of its rows; ((tuple's columns, attribute), ...): columns
        that travel as one tuple a row, in that attribute's list; coded columns, their codes in
        `block`'s rows after the ints). Its typed `add` writes them by place and name (the hot
        path); growing, emptying and handing over (once a flush, or when full) go by these names."""
        return (), (), (), (), ()

    def _object_attrs(self) -> list[str]:
        _, objects, _, tuples, _ = self._layout()
        return ["o_" + name for name in objects] + [attr for _, attr in tuples]

    def _objects_empty(self) -> None:
        """Every object column `cap` long, its rows unset (None)."""
        for attr in self._object_attrs():
            setattr(self, attr, [None] * self.cap)

    def _room(self) -> None:
        """Room for more rows (the typed add's, when `n` reached `cap`): the block and the object
        columns made twice as long (at first _FIRST_ROWS rows), the rows kept."""
        if self.cap > 0:
            # doubled by extending the block with itself (the new half never read before it is
            # written: `n` says which rows are kept), no zeroed vec made and copied for it
            cap = self.cap * 2
            self.block = extend(self.block, self.block)
        else:
            cap = _FIRST_ROWS
            self.block = vec[i64]([0] * (cap * self.width))
        for attr in self._object_attrs():
            column: list = getattr(self, attr)
            column.extend([None] * (cap - self.cap))
        self.cap = cap

    def append(self, row: tuple) -> None:
        """Any other row of the table (its event's fields): into the recorder's buffer, in turn."""
        self.rows.append(row)
        self.at = append(self.at, self.n)

    def __len__(self) -> int:
        return self.n + len(self.at)

    def take(self) -> dict:
        rows = self.rows
        other: object = rows.take() if not isinstance(rows, list) else list(rows)
        if isinstance(rows, list):
            rows.clear()
        n = self.n
        ints, objects, constants, tuples, coded = self._layout()
        # the object columns handed over as they are (cut to the rows kept), fresh ones in their place
        taken: dict[str, list] = {}
        for attr in self._object_attrs():
            column: list = getattr(self, attr)
            del column[n:]
            taken[attr] = column
        # the ints as a view of the block itself, not a copy (the block's rows, ~15 MB of a
        # conversation replay, were copied into a bytes a hand-over: issue 41, session 38): a rows
        # sink is done with what it is handed when it returns (probes/recorder.py), and no row
        # is written into the block before then (the next rows overwrite it in place)
        # (as unsigned bytes: array.frombytes and a bytes-like argument take no other format)
        out = {"n": n, "ints": (ints + coded, memoryview(self.block).cast("B")[:8 * n * self.width]),
               "coded": (coded, self.dictionary),
               "objects": {name: taken["o_" + name] for name in objects}, "constants": constants,
               "tuples": tuple((fields, taken[attr]) for fields, attr in tuples),
               "at": bytes(memoryview(self.at)), "rows": other}
        self._objects_empty()
        self._emptied()
        return out

    def clear(self) -> None:
        if self.n:
            self._objects_empty()  # no row's objects held past the rows
        self._emptied()

    def _emptied(self) -> None:
        """No rows (the block and the object columns' room kept), no codes."""
        self._codes_empty()
        self.rows.clear()
        self.counter[0] -= self.n
        self.n = 0
        self.at = vec[i64]()


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
REQUEST_CODED: Final = ("hit_class", "loadback_skipped_reason", "storage_skipped_reason")
REQUEST_LISTED: Final = ("req_id", "first_batch_id", "session_id", "think_ms")
REQUEST_CONSTANTS: Final = (("status", "finished"), ("reject_reason", None))
REQUEST_TUPLE_COLUMNS: Final = ev.Route._fields

EVICTION_INT_COLUMNS: Final = (
    "eviction_id", "t_ns", "node_id", "tokens", "pool_used_tokens", "pool_capacity_tokens", "locked_tokens",
    "node_hit_count", "node_last_access_ns", "dp_rank",)
EVICTION_OBJECT_COLUMNS: Final = (
    "tier", "action", "cause_req_id", "owner_req_id",)
EVICTION_CODED: Final = ("tier", "action")
EVICTION_CONSTANTS: Final = ()
# An eviction's tier and action by its EngineStats key (controller.EVICTION_KEYS, in this order:
# device/demote, device/drop, host/delete, host/free_duplicate, storage/delete): the tier is
# EVICTION_WORDS[key >> 1], the action EVICTION_WORDS[3 + key] (key 4: [3 + 2], delete)
EVICTION_WORDS: Final[tuple[object, ...]] = (
    Tier.DEVICE, Tier.HOST, Tier.STORAGE, EvictionAction.DEMOTE, EvictionAction.DROP, EvictionAction.DELETE,
    EvictionAction.FREE_DUPLICATE)

POOL_SAMPLE_INT_COLUMNS: Final = (
    "t_ns", "used_tokens", "capacity_tokens", "locked_tokens", "dp_rank",)
POOL_SAMPLE_OBJECT_COLUMNS: Final = (
    "tier",)
POOL_SAMPLE_CODED: Final = POOL_SAMPLE_OBJECT_COLUMNS
POOL_SAMPLE_CONSTANTS: Final = ()

TRANSFER_INT_COLUMNS: Final = (
    "transfer_id", "t_start_ns", "t_end_ns", "pages", "runs", "bytes", "data_plane_bytes", "queued_ns",
    "wall_ns", "dp_rank",)
TRANSFER_OBJECT_COLUMNS: Final = (
    "kind", "req_id", "verified",)
TRANSFER_CODED: Final = ("kind", "verified")
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

    o_req_id: list[object]
    o_first_batch_id: list[object]
    o_session_id: list[object]
    o_think_ms: list[object]
    t_route: list[object]

    def _layout(self) -> tuple[tuple[str, ...], tuple[str, ...], tuple, tuple, tuple[str, ...]]:
        return (REQUEST_INT_COLUMNS, REQUEST_LISTED, REQUEST_CONSTANTS, ((REQUEST_TUPLE_COLUMNS, "t_route"),),
                REQUEST_CODED)

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
        """One row, its columns by keyword (`Columns`: its ints by place in `block`, a row kept whole or not at all)."""
        k = self.n
        if k == self.cap:
            self._room()
        b = self.block
        p: i64 = k * 52
        b[p] = seq
        b[p + 1] = arrival_ns
        b[p + 2] = input_tokens
        b[p + 3] = output_tokens
        b[p + 4] = device_hit_tokens
        b[p + 5] = host_hit_tokens
        b[p + 6] = storage_hit_tokens
        b[p + 7] = computed_tokens
        b[p + 8] = recomputed_tokens
        b[p + 9] = host_match_tokens
        b[p + 10] = storage_match_tokens
        b[p + 11] = loadback_skipped_tokens
        b[p + 12] = prefix_indices_len
        b[p + 13] = cache_protected_len
        b[p + 14] = extend_input_len
        b[p + 15] = queue_ns
        b[p + 16] = storage_wait_ns
        b[p + 17] = loadback_ns
        b[p + 18] = loadback_exposed_ns
        b[p + 19] = loadback_queued_ns
        b[p + 20] = loadback_bytes
        b[p + 21] = loadback_pages
        b[p + 22] = loadback_runs
        b[p + 23] = storage_bytes
        b[p + 24] = storage_fetch_ns
        b[p + 25] = recompute_ns
        b[p + 26] = compute_ns
        b[p + 27] = prefill_ns
        b[p + 28] = ttft_ns
        b[p + 29] = ideal_ttft_ns
        b[p + 30] = ttft_if_device_resident_ns
        b[p + 31] = recompute_instead_ns
        b[p + 32] = num_chunks
        b[p + 33] = first_token_ns
        b[p + 34] = finish_ns
        b[p + 35] = trace_arrival_ns
        b[p + 36] = dp_rank
        b[p + 37] = decode_wait_ns
        b[p + 38] = retractions
        b[p + 39] = miss_never_cached_tokens
        b[p + 40] = miss_evicted_before_reuse_tokens
        b[p + 41] = miss_lost_while_queued_tokens
        b[p + 42] = miss_loadback_skipped_tokens
        b[p + 43] = miss_prefetch_declined_tokens
        b[p + 44] = miss_prefetch_revoked_tokens
        b[p + 45] = miss_shared_in_batch_tokens
        b[p + 46] = miss_routed_elsewhere_tokens
        b[p + 47] = miss_beyond_storage_tokens
        b[p + 48] = miss_prefetch_lost_tokens
        b[p + 49] = self._code(0, hit_class)
        b[p + 50] = self._code(4, loadback_skipped_reason)
        b[p + 51] = self._code(8, storage_skipped_reason)
        self.o_req_id[k] = req_id
        self.o_first_batch_id[k] = first_batch_id
        self.o_session_id[k] = session_id
        self.o_think_ms[k] = think_ms
        self.t_route[k] = route
        self.n = k + 1
        self.counter[0] += 1

class EvictionColumns(Columns):
    """An eviction's row (CacheController.record_eviction), a column each."""

    o_cause_req_id: list[object]
    o_owner_req_id: list[object]

    def _layout(self) -> tuple[tuple[str, ...], tuple[str, ...], tuple, tuple, tuple[str, ...]]:
        return EVICTION_INT_COLUMNS, ("cause_req_id", "owner_req_id"), EVICTION_CONSTANTS, (), EVICTION_CODED

    def add(self,
            eviction_id: i64, t_ns: i64, tier: object, node_id: i64, tokens: i64, action: object,
            cause_req_id: object, owner_req_id: object, pool_used_tokens: i64, pool_capacity_tokens: i64,
            locked_tokens: i64, node_hit_count: i64, node_last_access_ns: i64, dp_rank: i64) -> None:
        """One row, its columns by keyword (`Columns`: its ints by place in `block`, a row kept whole or not at all)."""
        self._row(eviction_id, t_ns, self._code(0, tier), self._code(4, action), node_id, tokens, cause_req_id,
                  owner_req_id, pool_used_tokens, pool_capacity_tokens, locked_tokens, node_hit_count,
                  node_last_access_ns, dp_rank)

    def add_keyed(self,
            eviction_id: i64, t_ns: i64, key: i64, node_id: i64, tokens: i64, cause_req_id: object,
            owner_req_id: object, pool_used_tokens: i64, pool_capacity_tokens: i64, locked_tokens: i64,
            node_hit_count: i64, node_last_access_ns: i64, dp_rank: i64) -> None:
        """`add`'s row with its tier and action given by the eviction's EngineStats key (0-4,
        EVICTION_WORDS), the engine's own rows (CacheController.record_eviction): the two codes
        by place in the hand-over's fixed words, not found by `_code` (two calls a row, ~150
        instructions; issue 41, session 38). The same values as `add` given the key's tier and
        action; a key outside 0-4 is a ValueError and no row."""
        if key < 0 or key > 4:
            raise ValueError(f"an eviction's key is 0-4, not {key}")
        at = self._words_code(EVICTION_WORDS)
        self._row(eviction_id, t_ns, at + (key >> 1), at + 3 + (key if key < 4 else 2), node_id, tokens,
                  cause_req_id, owner_req_id, pool_used_tokens, pool_capacity_tokens, locked_tokens, node_hit_count,
                  node_last_access_ns, dp_rank)

    def _row(self,
            eviction_id: i64, t_ns: i64, tier_code: i64, action_code: i64, node_id: i64, tokens: i64,
            cause_req_id: object, owner_req_id: object, pool_used_tokens: i64, pool_capacity_tokens: i64,
            locked_tokens: i64, node_hit_count: i64, node_last_access_ns: i64, dp_rank: i64) -> None:
        """`add`'s and `add_keyed`'s row, its tier and action as their codes."""
        k = self.n
        if k == self.cap:
            self._room()
        b = self.block
        p: i64 = k * 12
        b[p] = eviction_id
        b[p + 1] = t_ns
        b[p + 2] = node_id
        b[p + 3] = tokens
        b[p + 4] = pool_used_tokens
        b[p + 5] = pool_capacity_tokens
        b[p + 6] = locked_tokens
        b[p + 7] = node_hit_count
        b[p + 8] = node_last_access_ns
        b[p + 9] = dp_rank
        b[p + 10] = tier_code
        b[p + 11] = action_code
        self.o_cause_req_id[k] = cause_req_id
        self.o_owner_req_id[k] = owner_req_id
        self.n = k + 1
        self.counter[0] += 1

class PoolSampleColumns(Columns):
    """A pool sample (RequestRecords._sample_pools), a column each."""

    def _layout(self) -> tuple[tuple[str, ...], tuple[str, ...], tuple, tuple, tuple[str, ...]]:
        return POOL_SAMPLE_INT_COLUMNS, (), POOL_SAMPLE_CONSTANTS, (), POOL_SAMPLE_CODED

    def add(self,
            t_ns: i64, tier: object, used_tokens: i64, capacity_tokens: i64, locked_tokens: i64, dp_rank: i64) -> None:
        """One row, its columns by keyword (`Columns`: its ints by place in `block`, a row kept whole or not at all)."""
        k = self.n
        if k == self.cap:
            self._room()
        b = self.block
        p: i64 = k * 6
        b[p] = t_ns
        b[p + 1] = used_tokens
        b[p + 2] = capacity_tokens
        b[p + 3] = locked_tokens
        b[p + 4] = dp_rank
        b[p + 5] = self._code(0, tier)
        self.n = k + 1
        self.counter[0] += 1

class TransferColumns(Columns):
    """A transfer's row (CacheController's copies between tiers), a column each."""

    o_req_id: list[object]

    def _layout(self) -> tuple[tuple[str, ...], tuple[str, ...], tuple, tuple, tuple[str, ...]]:
        return TRANSFER_INT_COLUMNS, ("req_id",), TRANSFER_CONSTANTS, (), TRANSFER_CODED

    def add(self,
            transfer_id: i64, t_start_ns: i64, t_end_ns: i64, kind: object, req_id: object, pages: i64,
            runs: i64, bytes: i64, data_plane_bytes: i64, queued_ns: i64, wall_ns: i64, verified: object,
            dp_rank: i64) -> None:
        """One row, its columns by keyword (`Columns`: its ints by place in `block`, a row kept whole or not at all)."""
        k = self.n
        if k == self.cap:
            self._room()
        b = self.block
        p: i64 = k * 12
        b[p] = transfer_id
        b[p + 1] = t_start_ns
        b[p + 2] = t_end_ns
        b[p + 3] = pages
        b[p + 4] = runs
        b[p + 5] = bytes
        b[p + 6] = data_plane_bytes
        b[p + 7] = queued_ns
        b[p + 8] = wall_ns
        b[p + 9] = dp_rank
        b[p + 10] = self._code(0, kind)
        b[p + 11] = self._code(4, verified)
        self.o_req_id[k] = req_id
        self.n = k + 1
        self.counter[0] += 1

class BatchColumns(Columns):
    """A prefill batch's row (Admission's batch run), a column each."""

    def _layout(self) -> tuple[tuple[str, ...], tuple[str, ...], tuple, tuple, tuple[str, ...]]:
        return BATCH_INT_COLUMNS, BATCH_OBJECT_COLUMNS, BATCH_CONSTANTS, (), ()

    def add(self,
            batch_id: i64, t_start_ns: i64, t_end_ns: i64, num_reqs: i64, extend_tokens: i64,
            loadback_bytes: i64, compute_ns: i64, loadback_exposed_ns: i64, num_decoding: i64, recompute_ns: i64,
            dp_rank: i64) -> None:
        """One row, its columns by keyword (`Columns`: its ints by place in `block`, a row kept whole or not at all)."""
        k = self.n
        if k == self.cap:
            self._room()
        b = self.block
        p: i64 = k * 11
        b[p] = batch_id
        b[p + 1] = t_start_ns
        b[p + 2] = t_end_ns
        b[p + 3] = num_reqs
        b[p + 4] = extend_tokens
        b[p + 5] = loadback_bytes
        b[p + 6] = compute_ns
        b[p + 7] = loadback_exposed_ns
        b[p + 8] = num_decoding
        b[p + 9] = recompute_ns
        b[p + 10] = dp_rank
        self.n = k + 1
        self.counter[0] += 1
