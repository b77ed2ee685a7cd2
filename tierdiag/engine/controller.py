"""The cache controller: owns copies between tiers, their timelines and completion, and the
execution of evictions (which node goes, demote/drop/delete, and who caused it).

The tree decides residency, the pools hand out slots, the kernels move bytes; the controller
ties them together and reports every step to the probe.
"""

from __future__ import annotations

from array import array
from time import perf_counter_ns
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from mypy_extensions import mypyc_attr

from tierdiag.config.names import EvictionAction, Tier, TransferKind, WritePolicy
from tierdiag.engine import rows as _rows
from tierdiag.config.engine import EngineConfig
from tierdiag.engine.costmodel import CostModel
from tierdiag.engine.emitters import Emitters
from tierdiag.engine.pagemap import GROW_SHIFT, GROW_SHIFT_MANY, SMALL_CALL, PageMap
from tierdiag.engine import content as _content
from tierdiag.engine.content import verify_content, write_content
from tierdiag.engine.pagepool import PagePool
from tierdiag.engine.rule_functions import _evict_shortfall, _evict_whole_need
from tierdiag.engine.rules import config_rules
from tierdiag.engine.storage import StorageTier
from tierdiag.engine.tree_node import KeyRun, empty_run
from tierdiag.engine.tree import RadixTree, TreeNode
from tierdiag.errors import EngineError

# Final: a C static the compiled module reads, where an imported name is a look-up in the module's
# dict at every use (~130 instructions; issue 41, session 24)
_PERF_COUNTER_NS: Final = perf_counter_ns

if TYPE_CHECKING:
    import numpy as np

VERIFY_SAMPLE_EVERY = 16  # with --verify sample, check one load-back in this many
_DEVICE: Final[str] = Tier.DEVICE  # read once: a compiled `Tier.DEVICE` calls EnumType.__getattr__ (3.11)
# The members an eviction records, read once for the same reason (compiled, each `Tier.X` /
# `EvictionAction.X` read was ~880 instructions, two an eviction: callgrind, issue 41)
_HOST: Final[str] = Tier.HOST
_DEMOTE: Final[str] = EvictionAction.DEMOTE
_DROP: Final[str] = EvictionAction.DROP
_DELETE: Final[str] = EvictionAction.DELETE
_FREE_DUPLICATE: Final[str] = EvictionAction.FREE_DUPLICATE
# EngineStats.evictions' keys (tier/action), each counted in a native int of EngineStats under its
# code (the key's place here): a dict's get, add and set an eviction were ~510 instructions
# (issue 41, session 36)
EVICTION_KEYS: Final[tuple[str, ...]] = (_DEVICE + "/" + _DEMOTE, _DEVICE + "/" + _DROP, _HOST + "/" + _DELETE,
                                         _HOST + "/" + _FREE_DUPLICATE, Tier.STORAGE + "/" + _DELETE)
_DEVICE_DEMOTE: Final = 0
_DEVICE_DROP: Final = 1
_HOST_DELETE: Final = 2
_HOST_FREE_DUPLICATE: Final = 3
_STORAGE_DELETE: Final = 4


def _as_list(run: Any) -> Any:
    """A slot run as a list, for the storage paths' slots (storage.py, prefetch.py), which take
    lists: the pools hand out array('q') runs (tree_node.SlotRun). Keys need no conversion: the
    storage index reads key runs in place (h41stor8). None stays None."""
    return run.tolist() if isinstance(run, array) else run


def _int64s() -> array:
    return array("q")


@dataclass
class EngineStats:
    """Counters kept whether or not probes are on (the replay summary needs them)."""
    requests_finished: int = 0
    requests_rejected: int = 0
    rejected: dict = field(default_factory=dict)  # reason kind (reject_kind) -> count
    input_tokens: int = 0
    device_tokens: int = 0
    host_tokens: int = 0
    storage_tokens: int = 0
    computed_tokens: int = 0
    recomputed_tokens: int = 0
    load_backs: int = 0
    load_back_bytes: int = 0
    # One int a finished request (a load-back): 8 bytes each in an array('q'), not a ~36-byte
    # Python int and its list slot (~40 MB of a 1M-request run's engine process; issue 41).
    load_back_ns: array = field(default_factory=_int64s)
    skipped: dict = field(default_factory=dict)  # reason -> count
    # The evictions a "tier/action" (EVICTION_KEYS, by code): native ints, `evictions` the dict
    # made when read, its keys in the order first counted (`eviction_order`: their codes)
    evicted_device_demote: int = 0
    evicted_device_drop: int = 0
    evicted_host_delete: int = 0
    evicted_host_free_duplicate: int = 0
    evicted_storage_delete: int = 0
    eviction_order: list[int] = field(default_factory=list)
    backups: int = 0
    backup_bytes: int = 0
    backups_skipped: int = 0
    write_backs: int = 0
    prefetches: int = 0
    verified_load_backs: int = 0
    loaded_data_plane_bytes: int = 0  # bytes the kernels moved into device slots by load-back
    verified_data_plane_bytes: int = 0  # bytes of those checked against what was written
    ttft_ns: array = field(default_factory=_int64s)
    batches: int = 0
    busy_ns: int = 0  # virtual time the GPU spent in prefill batches
    decode_steps: int = 0  # decode steps run (a mixed batch's included)
    decode_ns: int = 0  # virtual time the GPU spent in decode steps (not a mixed batch's)
    retractions: int = 0  # requests retracted for decode memory (retract_decode)
    virtual_end_ns: int = 0

    @property
    def evictions(self) -> dict[str, int]:
        """"tier/action" -> count, in the order each was first counted (a new dict each read)."""
        counts = (self.evicted_device_demote, self.evicted_device_drop, self.evicted_host_delete,
                  self.evicted_host_free_duplicate, self.evicted_storage_delete)
        return {EVICTION_KEYS[code]: counts[code] for code in self.eviction_order}

    def count_evictions(self, code: int, n: int) -> None:
        """`n` more evictions of EVICTION_KEYS[code]."""
        if code == _DEVICE_DEMOTE:
            before = self.evicted_device_demote
            self.evicted_device_demote = before + n
        elif code == _DEVICE_DROP:
            before = self.evicted_device_drop
            self.evicted_device_drop = before + n
        elif code == _HOST_DELETE:
            before = self.evicted_host_delete
            self.evicted_host_delete = before + n
        elif code == _HOST_FREE_DUPLICATE:
            before = self.evicted_host_free_duplicate
            self.evicted_host_free_duplicate = before + n
        elif code == _STORAGE_DELETE:
            before = self.evicted_storage_delete
            self.evicted_storage_delete = before + n
        else:
            raise ValueError(f"no eviction key has code {code}")
        if before == 0 and n != 0:
            self.eviction_order.append(code)


class StorageWrite:
    """A node's storage write under 0.5.23's rules (rules.storage_acks_per_pass), from its host
    copy's ack until the drain that takes its own ack (CacheController.storage_writes): the node,
    the eviction cause, the pass whose drain releases its host copy, its pages at the ack, its
    write's start and end on the tier's clock (-1 until the pass after the ack starts it,
    `start_storage_writes`) and whether it is in the tier. A class of typed fields, not a list:
    the two walks a pass makes of the writes in flight compare plain ints compiled (issue 41)."""
    __slots__ = ("node", "cause", "release_pass", "pages", "start", "end", "landed")

    def __init__(self, node: TreeNode, cause: str | None, release_pass: int, pages: int) -> None:
        self.node = node
        self.cause = cause
        self.release_pass = release_pass
        self.pages = pages
        self.start = -1
        self.end = -1
        self.landed = False


# The compiled data plane's page move and content write where this process runs them (cplane's
# choice; None on the numpy data plane): called straight from here, where rows.copy_rows_c and
# content.write_content_c were an interpreted frame each around the C call (~2.7k instructions
# a backup, ~48k backups, load-backs and prefill writes on the whole conversation trace). What
# the C declines, having changed nothing, goes to the chosen wrapper as before.
_C_MOVE: Final[Any] = _rows.compiled_move if _rows.copy_rows is _rows.copy_rows_c else None
_C_WRITE_CONTENT: Final[Any] = (_content._c_write_content if _content.write_content is _content.write_content_c
                                else None)


@mypyc_attr(allow_interpreted_subclasses=True)
class Clock:
    """Where a scheduler and its controller put their events: `at(t_ns, fn, arg)` runs fn(arg)
    at virtual time t_ns. Its event loop's: the scheduler's own heap (`scheduler.OwnClock`),
    a deployment's (`deployment.RankClock`: the ranks' shared heap). A native class held in a
    typed field (`clock`) by both, so each `at` is a native call through the class's method
    table: a callable in an attribute typed Any was Python's generic call, its time boxed and
    its three arguments parsed by the callee's wrapper (~300 instructions an event; issue 41
    session 37). This one has no loop: `at` refuses. Python may subclass it (the engine's
    Python twin, loaded beside the compiled modules by tests, defines its clocks over this one)."""

    def at(self, t_ns: int, fn: Any, arg: Any) -> None:
        raise EngineError(f"no event loop takes events here (an event at {t_ns} ns)")


class CallClock(Clock):
    """`at` by a callable `call(t_ns, fn, arg)`: a harness's that watches the events or drops
    them (tests/sglang/differential.py, tests/engine: a lambda where one was put in `ctrl.at`)."""

    def __init__(self, call: Any) -> None:
        self.call = call

    def at(self, t_ns: int, fn: Any, arg: Any) -> None:
        self.call(t_ns, fn, arg)


class CacheController:
    def __init__(self, cfg: EngineConfig, cost: CostModel, tree: RadixTree, device: PagePool,
                 host: PagePool, storage: StorageTier | None, probe, stats: EngineStats):
        self.cfg = cfg
        self.rules = config_rules(cfg)
        self.cost = cost
        self.tree = tree
        # 0.5.23's host pressure under write_back reads the tree's duplicate registry.
        # The config and rule fields every eviction reads, typed here once: EngineConfig and
        # RuleSet are interpreted (frozen), so each read from compiled code was a generic
        # attribute look-up, and the write policy's an enum member read too (issue 41)
        self.write_back: bool = cfg.write_policy == WritePolicy.WRITE_BACK
        self.decline_spares: bool = self.write_back and self.rules.write_back_drop_spares_pinned
        # the rule set's eviction amount (rules.py): 1 the shortfall (0.5.23), 0 the whole need
        # (0.5.9), both computed here; -1 another callable, called
        amount = self.rules.eviction_amount
        self.evict_shortfall: int = 1 if amount is _evict_shortfall else 0 if amount is _evict_whole_need else -1
        self.reclaim_duplicates: bool = bool(self.rules.reclaim_host_duplicates) and self.write_back
        self.measured_timing: bool = cfg.timing == "measured"  # (read at every copy)
        # Whether a prefill's pages get their content (write_computed): the content is what a
        # load-back's check compares with, and under --verify off nothing ever compares, so it
        # is not generated. The copies still move the slots' bytes (whatever they hold), with
        # the same runs, data-plane bytes and modelled times (issue 41, session 33: ~2.5 % of
        # a closed-loop synth trace's Engine.run, with the chunk's slices made for it).
        self.writes_content: bool = cfg.verify != "off"
        self.verify_mode: str = cfg.verify  # (typed once: read at every load-back)
        self.host_capacity: int = host.capacity  # (a pool's capacity is fixed; read at every backup)
        self.device_capacity: int = device.capacity
        # the eviction row's and the pool sample's capacity column, as the object the row holds:
        # made once, not boxed a row
        self.device_capacity_tokens: object = device.capacity * cfg.page_size
        self.host_capacity_tokens: object = host.capacity * cfg.page_size
        tree.tracks_duplicates = self.reclaim_duplicates
        self.device = device
        self.host = host
        self.storage = storage
        self.probe = probe
        self.emit = Emitters(probe)  # one callable an event kind, None where nothing is emitted (a native class)
        self.stats = stats
        self.page_size: int = cfg.page_size  # typed: compiled, `x * page_size` is a native multiply, not PyNumber_Multiply
        # (declared int: the config and the pools are Any to mypyc, and an undeclared field of theirs an
        # object field, every product with it a generic multiply of boxed ints; session 26)
        self.page_bytes: int = cfg.page_size * cost.kv_bytes_per_token  # modelled
        self.dp_page_bytes: int = device.page_bytes  # one page of the real buffers, all layers
        # Both pools CPU buffers: copies go straight between their numpy row views
        # (rows.copy_rows); otherwise (CUDA) through the torch/Triton kernels.
        self._rows = device.rows is not None and host.rows is not None
        # The pools' row views and the device pool's geometry, read once: fixed for a pool's life
        # (PagePool.__init__), and each read of an interpreted pool's attribute from compiled code
        # is a generic look-up (~200 instructions; a backup, a load-back and a prefill write read
        # two to four; issue 41, session 26)
        self._device_rows: Any = device.rows
        self._host_rows: Any = host.rows
        self._host_array: Any = host.array  # (a storage write's source: read at each of ~28k landings)
        self._device_layers: Any = device.num_layers
        self._device_elems: Any = device.page_elems
        self.h2d_free_ns = 0
        self.d2h_free_ns = 0
        self.loads_pending: list = []  # load-backs not yet acknowledged (ack_loads), node tuples
        self.blocking_ns = 0  # write-backs done synchronously during the current admission
        # 0.5.23 (rules.backups_flush_per_batch): write-through backups queued, not yet copied
        # (flush_backups); `stash_backups` routes a chunk stash's to the flush after the next
        self.flush_per_batch: bool = bool(self.rules.backups_flush_per_batch)
        self.backup_queue: list[tuple] = []
        self.backup_later: list[tuple] = []
        self.stash_backups = False
        self.backups_in_flight = 0  # nodes copied, not yet acknowledged (flush_backups)
        # The storage tier's own clock (storage.free_ns): one bandwidth, shared by every rank
        # that shares the tier (engine/deployment.py).
        self.rank = 0  # the data-parallel rank (its rows' dp_rank)
        self.id_step = 1  # eviction and transfer ids: rank + 1, then every num_ranks-th
        self._next_eviction = 1
        self._next_transfer = 1
        self._loadback_count = 0
        # page key -> id of the eviction that last took it off the device / out of the tree
        # (0: cached once, never evicted). Answers "was this computed token cached before?".
        # (a rank of several: its maps grow by half, not an eighth; pagemap.PageMap._grow)
        grow_shift = GROW_SHIFT_MANY if cfg.dp > 1 else GROW_SHIFT
        self.cached_once = PageMap(grow_shift)
        # page key -> the device demotion that preceded its deletion from the host tier
        self.demoted_by = PageMap(grow_shift)
        # The pools' and maps' methods the engine calls per node or per request, bound once: a
        # call `self.device.free(...)` from compiled code looked the name up (the instance's
        # dict, then the type's) at every call, ~190 instructions of ~70k look-ups a 3,000-request
        # run (issue 41, session 29). The pools and maps are never replaced. (A test that patches
        # a pool's method on the instance patches these too.)
        self.dev_alloc: Any = device.alloc
        self.dev_free: Any = device.free
        self.host_alloc_slots: Any = host.alloc
        self.host_free: Any = host.free
        self.once_set: Any = self.cached_once.set_many
        self.demoted_set: Any = self.demoted_by.set_many
        # The scheduler's event queue: clock.at(t_ns, callback, arg) runs callback(arg) at virtual
        # time t_ns (the scheduler puts its own, or a deployment's, in its place)
        self.clock: Clock = Clock()
        # Called with (node, tier, action) as each eviction is recorded, before the node changes;
        # None: nobody asks (tests/sglang/differential.py logs the evicted keys: a compiled
        # controller's methods cannot be wrapped in their place).
        self.on_eviction: Any = None
        # 0.5.23 (rules.storage_acks_per_pass): a node's storage write waits for its host copy's
        # ack, and holds the host copy until the pass after that ack's (release_storage_writes);
        # `pass_now` is the scheduler's pass count (Scheduler.prefetch_pass)
        self.storage_per_pass: bool = bool(self.rules.storage_acks_per_pass) and storage is not None
        # The storage prefetch's rule flags (prefetch.py), typed: rules.py is interpreted, so a
        # RuleSet field read from compiled code is a generic attribute lookup, and a storage
        # query read ~5 of them (~100k queries and re-queries a whole-trace storage replay)
        self.prefetch_gate_on_best_match = self.rules.prefetch_gate_on_best_match
        self.prefetch_alloc_hit_only = self.rules.prefetch_alloc_hit_only
        self.prefetch_retry_interval = self.rules.prefetch_retry_interval_passes
        self.prefetch_assume_stored = self.rules.prefetch_assume_stored
        # the writes whose host copy is held (StorageWrite), in the order their acks came
        self.storage_writes: list[StorageWrite] = []
        # whose `prefetch_pass` is the pass count (the Scheduler; None: pass 0), read by
        # pass_now: a compiled read, where an interpreted lambda was a Python call each time
        self.pass_owner: Any = None
        # `_wake` bound once: an event that only wakes the scheduler is queued at every storage
        # write's start (a bound method made a write, ~10k a conversation replay, otherwise)
        self._wake_fn: Any = self._wake
        # ... and the backups' acks (a bound method made a backup or a flush otherwise; session 27).
        # The tree's dec_lock bound here too: `self.tree` is never replaced
        self._ack_backups_fn: Any = self._ack_backups
        self._ack_to_storage_fn: Any = self._ack_backups_to_storage
        self._dec_lock_fn: Any = tree.dec_lock
        # 0.5.23: the host slots of prefetch reads cut short while in flight, freed as SGLang frees
        # them (free_prefetch_tails): (when the read stops, the pass that took its last ack or
        # -1, the slots)
        self.prefetch_tails: list[tuple[int, int, Any]] = []

    # --- helpers -------------------------------------------------------------------------
    def _to_host(self, device_slots: Any, host_slots: Any) -> tuple[int, int]:
        """Copy device pages into host slots: (wall ns, contiguous runs of the device pages)."""
        if self._rows:
            move = _C_MOVE
            if move is not None:  # rows.copy_rows_c's work without its interpreted frame
                t0 = _PERF_COUNTER_NS()
                runs: int = move(self._device_rows, device_slots, self._host_rows, host_slots)
                if runs >= 0:
                    return _PERF_COUNTER_NS() - t0, runs
            return _rows.copy_rows(self._device_rows, device_slots, self._host_rows, host_slots)
        from tierdiag.engine import kernels  # CUDA: the torch/Triton kernels

        wall = kernels.backup(self.device.buffer, device_slots, self.host.buffer, host_slots)
        return wall, kernels.count_runs(device_slots)

    def _to_device(self, host_slots: Any, device_slots: Any) -> tuple[int, int]:
        """Copy host pages into device slots (CPU pools): (wall ns, contiguous runs of the host pages)."""
        move = _C_MOVE
        if move is not None:  # as _to_host
            t0 = _PERF_COUNTER_NS()
            runs: int = move(self._host_rows, host_slots, self._device_rows, device_slots)
            if runs >= 0:
                return _PERF_COUNTER_NS() - t0, runs
        return _rows.copy_rows(self._host_rows, host_slots, self._device_rows, device_slots)

    def as_rank(self, rank: int, num_ranks: int) -> None:
        """Rank `rank` of `num_ranks`: its rows say so and its ids never meet another rank's."""
        self.rank, self.id_step = rank, num_ranks
        self._next_eviction = self._next_transfer = rank + 1

    def _transfer_id(self) -> int:
        tid = self._next_transfer
        self._next_transfer += self.id_step
        return tid

    def _transfer_row(self, start: int, end: int, kind: str, req_id: str | None, pages: int, runs: int, nbytes: int,
                      dp_bytes: int, queued_ns: int, wall_ns: int, verified: object) -> None:
        """A transfer's row, its id the next: by columns to a recorder that takes them (the values
        unboxed: emitters.py), else as the Transfer's tuple (the caller checked emit.transfer)."""
        cols = self.emit.transfer_columns
        if cols is not None:
            cols.add(self._transfer_id(), start, end, kind, req_id, pages, runs, nbytes, dp_bytes, queued_ns, wall_ns,
                     verified, self.rank)
            return
        emit = self.emit.transfer
        if emit is not None:
            emit((self._transfer_id(), start, end, kind, req_id, pages, runs, nbytes, dp_bytes, queued_ns, wall_ns,
                  verified, self.rank))

    def _copy_ns(self, pages: int, wall_ns: int, data_plane_bytes: int, *, to_device: bool, runs: int) -> int:
        nbytes = pages * self.page_bytes
        if self.measured_timing and data_plane_bytes:
            # Real kernel time, scaled from the reduced data plane to the modelled geometry.
            return int(wall_ns * nbytes / data_plane_bytes) + self.cost.transfer_overhead_ns
        return self.cost.copy_ns(nbytes, pages, to_device=to_device, runs=runs)

    def record_eviction(self, node: TreeNode, tier: str, action: str, cause: str | None, now_ns: int,
                        key: int, free: int = -1) -> int:
        """An eviction's id, counts and row; `key` is EngineStats.evictions' `tier/action` by its
        code (its place in EVICTION_KEYS). `free`: the tier's pool's free pages as the eviction loop
        read them, nothing allocated or freed in that pool since (its row's used tokens are
        capacity - free at this moment); -1: read here."""
        if self.on_eviction is not None:
            self.on_eviction(node, tier, action)
            free = -1  # (a test's hook: whatever it did, the pool is read at the row)
        eid = self._next_eviction
        self._next_eviction += self.id_step
        # (the tokens a tier lost are the rows' sum: a per-tier dict of them, which nothing read,
        # was ~500 instructions an eviction; issue 41, session 28)
        self.stats.count_evictions(key, 1)
        emit = self.emit.eviction
        if emit is not None:
            tokens = len(node.keys) * self.page_size
            # _DEVICE, not Tier.DEVICE: compiled, an enum member read is a call of 3.11's
            # EnumType.__getattr__ (~1k instructions; twice an eviction was ~4 % of the recording)
            on_device = tier == _DEVICE
            locked = self.tree.locked_device_pages if on_device else self.tree.locked_host_pages
            # capacity - free_pages, not the used_pages property: compiled, a property of the
            # interpreted PagePool is a Python call (three reads a row were ~1/3 of its cost);
            # free declared int: native arithmetic, not PyNumber_Subtract/_Multiply on objects.
            # The capacity is fixed: read once in __init__ (a generic attribute read a row was
            # ~200 instructions), its tokens boxed once (issue 41 session 22)
            if free < 0:  # (the pool's count is a generic attribute read compiled, ~170 instructions)
                free = self.device.free_pages if on_device else self.host.free_pages
            capacity = self.device_capacity if on_device else self.host_capacity
            ps = self.page_size
            cols = self.emit.eviction_columns
            if cols is not None:  # a recorder's columns: the values unboxed (emitters.py)
                # (its tier and action by `key`, their codes by place: emitters.EVICTION_WORDS)
                cols.add_keyed(eid, now_ns, key, node.id, tokens, cause, node.owner, (capacity - free) * ps,
                               capacity * ps, locked * ps, node.hit_count, node.last_access_ns, self.rank)
                return eid
            emit((
                eid, now_ns, tier, node.id, tokens, action, cause, node.owner,
                (capacity - free) * ps, self.device_capacity_tokens if on_device else self.host_capacity_tokens,
                locked * ps, node.hit_count, node.last_access_ns, self.rank))
        return eid

    # --- eviction ------------------------------------------------------------------------
    def evict_device(self, pages_needed: int, cause: str | None, now_ns: int, *, reserve_pages: int = 0) -> bool:
        """Evict device nodes for an allocation of `pages_needed` (plus `reserve_pages` asked for
        and not allocated: alloc_paged_token_slots_extend's page a request). How much goes is
        the rule set's (`eviction_amount`: 0.5.9 the whole need when it does not fit, 0.5.23 the
        shortfall). True when `pages_needed` are free after; False if locks make it impossible."""
        free: int = self.device.free_pages
        if free >= pages_needed + reserve_pages:
            return True  # both rule sets' eviction_amount: nothing when the need fits
        target = free + self._eviction_amount(free, pages_needed + reserve_pages)
        write_back = self.write_back
        decline = self.decline_spares
        kept: list[TreeNode] = []  # declined drops (drop_subtree_no_host), in walk order
        while True:
            # (the count read into an int: compiled, the compare is native, where the pool's
            # attribute (Any) made it a generic compare and a truth test a victim; session 26)
            free_now: int = self.device.free_pages
            if free_now >= target:
                break
            node = self.tree.pop_device_victim()
            if node is None:
                if not kept:
                    break
                # Nothing else to evict: SGLang's allocation would fail here ("Prefill out of
                # memory": its scheduler dies). The engine departs: the declined subtrees are
                # dropped after all, pins and all (a prefetch anchored there finds its path gone
                # and frees its pages; a storage write holding a copy there is not made).
                decline = False
                node = kept.pop(0)
                if self.tree.device_evictable(node):
                    self._remove(node, cause, now_ns)
                continue
            if kept and node in kept:
                continue  # declined already (its write-back's unlock pushed it back)
            # the device's free pages for the victim's row: free_now, unless a write-back ran
            # (it allocates and may evict on host: read at the row, as before)
            row_free = free_now
            if node.host is None and write_back:
                row_free = -1
                # (the write-back's outcome, not `node.host` again: a compiled build keeps the
                # attribute narrowed to None in this branch)
                if not self._write_back(node, cause, now_ns) and decline and self._pinned_subtree(node):
                    kept.append(node)  # drop_subtree_no_host declined: it stays on device
                    continue
            if node.host is not None:
                eid = self.record_eviction(node, _DEVICE, _DEMOTE, cause, now_ns, _DEVICE_DEMOTE, row_free)
                node.evicted_by = eid
                self.dev_free(self.tree.demote(node))
            else:
                self._remove(node, cause, now_ns, row_free, -1)
        for node in kept:  # still device leaves: the next eviction's candidates again
            self.tree._push_device(node)
        # (the loop's last read of the pool's count, a generic attribute read compiled: nothing
        # freed since, the loop left at its top or after popping no victim; pushing frees none)
        return free_now >= pages_needed

    def _eviction_amount(self, free_pages: int, need_pages: int) -> int:
        """The rule set's `eviction_amount`: the two the rule sets use (rule_functions.py) called
        directly, a native call within the compiled core; read off the interpreted RuleSet, the
        field was a generic look-up and a generic call an eviction (issue 41)."""
        if self.evict_shortfall == 1:
            return _evict_shortfall(free_pages, need_pages)
        if self.evict_shortfall == 0:
            return _evict_whole_need(free_pages, need_pages)
        return self.rules.eviction_amount(free_pages, need_pages)

    def _pinned_subtree(self, node: TreeNode) -> bool:
        """0.5.23 `UnifiedTreeCore.drop_subtree_no_host` (rule `write_back_drop_spares_pinned`):
        a device leaf whose write-back found no host room is dropped with the host-only nodes
        below it only when none of them is pinned: no lock, no host lock (`host_lock_ref`: a
        prefetch's anchor, a storage write holding its host copy) and no load-back pending;
        else the drop is declined and the node "stays device-resident until host space frees"
        (`_evict_components`)."""
        if node.id in self.tree.load_pending:
            return True
        stack = [node]
        while stack:
            cur = stack.pop()
            if cur.host_ref or cur.lock_ref:
                return True
            stack.extend(cur.children.values())
        return False

    def _remove(self, node: TreeNode, cause: str | None, now_ns: int, device_free: int = -1,
                host_free: int = -1) -> None:
        """Take a node out of the tree with every node below it (those are host-only: device
        residency is root-connected), recording each: a device node is dropped, a host-only
        node deleted. `device_free` / `host_free`: that pool's free pages as the caller's loop
        read them, nothing allocated or freed in it since (-1: read at the row)."""
        if node.children:  # (most victims are leaves: no list made of no children)
            device_free = host_free = -1  # (their frees come before the node's row)
            for child in list(node.children.values()):
                self._remove(child, cause, now_ns)
        on_device = node.device is not None
        if on_device:
            eid = self.record_eviction(node, _DEVICE, _DROP, cause, now_ns, _DEVICE_DROP, device_free)
        else:
            eid = self.record_eviction(node, _HOST, _DELETE, cause, now_ns, _HOST_DELETE, host_free)
        self._forget(node, eid)
        device_slots, host_slots = self.tree.delete(node)
        if device_slots:  # (a free of nothing changes nothing: one call into the pool less)
            self.dev_free(device_slots)
        if host_slots:
            self.host_free(host_slots)

    def _forget(self, node: TreeNode, eid: int) -> None:
        keys: Any = node.keys  # a key run: the maps read it in place (a list from a test: as before)
        if len(keys) > SMALL_CALL and isinstance(keys, list):  # an array for both maps, converted once
            keys = PageMap.keys_array(keys)
        self.once_set(keys, eid, outputs_last=True)
        if node.evicted_by is not None:  # it had been demoted first: remember that eviction too
            self.demoted_set(keys, node.evicted_by, outputs_last=True)

    def evict_host(self, pages_needed: int, cause: str | None, now_ns: int, *, whole: bool = False) -> bool:
        """Host room for `pages_needed` (the amount is the rule set's, as for the device; `whole`:
        the whole need when it does not fit, whatever the rule set). Under 0.5.23 with
        write_back, host copies of nodes also on device go first
        (`_reclaim_full_host_duplicates`), then host-only leaves."""
        free: int = self.host.free_pages
        if free >= pages_needed:
            return True  # both rule sets' eviction_amount and `whole`: nothing when the need fits
        if whole:
            amount = pages_needed
        else:
            amount = self._eviction_amount(free, pages_needed)
        target = free + amount
        if self.reclaim_duplicates and free < target:  # (nothing freed since `free` was read)
            self._reclaim_duplicates(target, cause, now_ns)
        # (the pool's count is a generic attribute read compiled, ~200 instructions: read once a
        # victim, and the last read answers)
        while True:
            free_now: int = self.host.free_pages  # (an int: a native compare, as evict_device's)
            if free_now >= target:
                return free_now >= pages_needed
            node = self.tree.pop_host_victim()
            if node is None:
                return free_now >= pages_needed  # (popping no victim frees nothing)
            self._remove(node, cause, now_ns, -1, free_now)

    def _reclaim_duplicates(self, target: int, cause: str | None, now_ns: int) -> None:
        """UnifiedTreeCore._reclaim_full_host_duplicates (0.5.23): walk the registered duplicates
        in registration order, freeing host copies until `target` host pages are free; the first
        pass spares evictable device leaves (the next device eviction demotes them, needing the
        copy), the second takes them. Stale entries (no longer on both tiers) are swept."""
        tree = self.tree
        swept: list[int] = []
        for spare_device_leaves in (True, False):
            if self.host.free_pages >= target:
                break
            for node in list(tree.host_duplicates.values()):
                if self.host.free_pages >= target:
                    break
                if node.device is None or node.host is None:
                    swept.append(node.id)  # stale
                    continue
                if spare_device_leaves and tree.device_evictable(node):
                    continue
                if node.host_ref:  # a host lock (a load-back's or a prefetch's anchor)
                    continue
                if node.id in tree.load_pending:  # loaded back this pass, not yet acknowledged
                    continue
                self.record_eviction(node, _HOST, _FREE_DUPLICATE, cause, now_ns, _HOST_FREE_DUPLICATE)
                self.host.free(tree.drop_host(node))
                swept.append(node.id)
        for nid in swept:
            tree.host_duplicates.pop(nid, None)

    # --- device -> host ------------------------------------------------------------------
    def _alloc_host(self, pages: int, cause: str | None, now_ns: int) -> Any:
        if pages > self.host_capacity:
            return None
        if not self.evict_host(pages, cause, now_ns):
            return None
        return self.host_alloc_slots(pages)

    def backup(self, node: TreeNode, cause: str | None, now_ns: int) -> bool:
        """write_through: copy a device node to host; it stays locked on device until the copy is done."""
        pages = len(node.keys)
        # Keep the node (and its path) from being evicted while host room is made.
        self.tree.inc_lock(node)
        slots = self._alloc_host(pages, cause, now_ns)
        if slots is None:
            self.tree.dec_lock(node)
            self.stats.backups_skipped += 1
            return False
        wall, runs = self._to_host(node.device, slots)
        self.tree.set_host(node, slots)
        dp_bytes = pages * self.dp_page_bytes
        self.stats.backups += 1
        self.stats.backup_bytes += pages * self.page_bytes
        if self.flush_per_batch:
            (self.backup_later if self.stash_backups else self.backup_queue).append(
                (node, cause, pages, wall, runs, dp_bytes, now_ns))
            return True
        start = max(now_ns, self.d2h_free_ns)
        end = start + self._copy_ns(pages, wall, dp_bytes, to_device=False, runs=runs)
        self.d2h_free_ns = end
        if self.emit.transfer is not None:
            self._transfer_row(start, end, "backup", cause, pages, runs, pages * self.page_bytes, dp_bytes,
                               start - now_ns, wall, None)
        self.clock.at(end, self._dec_lock_fn, node)
        self._write_storage(node, cause, end)
        return True

    def backup_chain(self, node: TreeNode, cause: str | None, now_ns: int) -> bool:
        """0.5.23 write_through (rule `backup_chains_ancestors`): `UnifiedTreeCore._build_backup_kv_action`
        chains the node's ancestors not backed up, root side first, and
        `UnifiedRadixCache._execute_and_commit_kv_backup` backs them up in that order, stopping
        at the first that finds no host room (`_execute_kv_backup`: `evict_host` short)."""
        chain = [node]
        up, root = node.parent, self.tree.root
        while up is not None and up is not root and up.host is None:
            chain.append(up)
            up = up.parent
        for target in reversed(chain):
            if not self.backup(target, cause, now_ns):
                return False
        return True

    def flush_backups(self, now_ns: int) -> None:
        """0.5.23 `flush_pending_backups` (the end of a batch's result processing, or the next
        pass's `writing_check`): the queued backups go as one copy, node after node on the
        device->host link, with one ack at its end (`CacheOperation.merge_ops`, one `HiCacheAck`):
        every node in it unlocks then. A chunk stash's backups (queued at the pass's start) wait
        for the flush after this one: the end of the batch that pass runs."""
        queue, self.backup_queue, self.backup_later = self.backup_queue, self.backup_later, []
        if not queue:
            return
        t = max(now_ns, self.d2h_free_ns)
        nodes = []
        emit = self.emit.transfer
        for node, cause, pages, wall, runs, dp_bytes, queued_ns in queue:
            start, t = t, t + self._copy_ns(pages, wall, dp_bytes, to_device=False, runs=runs)
            if emit is not None:
                self._transfer_row(start, t, "backup", cause, pages, runs, pages * self.page_bytes, dp_bytes,
                                   start - queued_ns, wall, None)
            nodes.append(node)
        self.d2h_free_ns = t
        self.backups_in_flight += len(nodes)
        # (entries indexed, not unpacked with a starred name: compiled, `*_` made a list an entry)
        if self.storage_per_pass:
            self.clock.at(t, self._ack_to_storage_fn, [(entry[0], entry[1], entry[2]) for entry in queue])
            return
        self.clock.at(t, self._ack_backups_fn, nodes)
        for entry in queue:
            self._write_storage(entry[0], entry[1], t)

    def _ack_backups_to_storage(self, acked: list[tuple[TreeNode, str | None, int]]) -> None:
        """The copy's ack (`writing_check` -> `_finish_write_through_ack`), and each node's
        storage write started (`write_backup_storage`). A node split while its copy was in flight
        (a match ending inside it) is now the lower part, its upper part a new parent: SGLang
        moves the pending backup to both (`UpdatePendingBackupOnNodeSplit` ->
        `_replace_pending_write_through_node`: publish [upper, lower]) and writes each to storage,
        so every part the copy covered is written, root side first."""
        # (`_ack_backups` of the batch's nodes, without their list: every lock dropped before
        # any storage write is queued, as there)
        self.backups_in_flight -= len(acked)
        for entry in acked:
            self.tree.dec_lock(entry[0])
        # the pass count read once for the batch (the owner's field is a generic read from
        # here, ~1.6 parts an ack): no part's storage write moves it
        now_pass = self.pass_now()
        for node, cause, pages in acked:
            if len(node.keys) >= pages:  # not split while its copy was in flight: `_parts`' [node]
                self._storage_after_ack(node, cause, 2, now_pass)
                continue
            for part in self._parts(node, pages):
                self._storage_after_ack(part, cause, 2, now_pass)

    def _parts(self, node: TreeNode, pages: int) -> list[TreeNode]:
        """The nodes that now hold the `pages` pages `node` held (the last of them `node`, a
        split's lower part; its upper parts above it), root side first."""
        parts = [node]
        covered = len(node.keys)
        up = node.parent
        while covered < pages and up is not None and up is not self.tree.root:
            parts.append(up)
            covered += len(up.keys)
            up = up.parent
        parts.reverse()
        return parts

    def pass_now(self) -> int:
        """The scheduler's pass count (Scheduler.prefetch_pass; 0 with no scheduler)."""
        owner = self.pass_owner
        if owner is None:
            return 0
        n: int = owner.prefetch_pass
        return n

    def _ack_backups(self, nodes: list[TreeNode]) -> None:
        self.backups_in_flight -= len(nodes)
        for node in nodes:
            self.tree.dec_lock(node)

    def _storage_after_ack(self, node: TreeNode, cause: str | None, passes: int = 2, now_pass: int = -1) -> None:
        """0.5.23: the node's host copy held from its copy's ack until its storage write's ack is
        drained, at the pass after the one whose `writing_check` takes the copy's ack: for a
        write-through copy acknowledged between passes, the pass after the next (pass_now
        counts the pass running, or the last one between passes); for a write-back, whose ack
        is taken in the eviction itself (`writing_check(write_back=True)` blocks for it), the
        next pass (`passes` 1). `now_pass`: pass_now() where the caller has read it."""
        self.tree.protect_host(node)
        if now_pass < 0:
            now_pass = self.pass_now()
        self.storage_writes.append(StorageWrite(node, cause, now_pass + passes, len(node.keys)))

    def start_storage_writes(self, now_ns: int, step: int = -1) -> None:
        """A pass's start (`writing_check` -> `write_backup_storage`): the storage writes whose
        host copies were acknowledged since the last pass go on the tier's write queue
        (`backup_thread_func`, one write after another, each as long as
        CostModel.storage_io_ns prices its pages; the pass at its end takes its ack). Their
        pages are in the tier from the first pass at or after the write's end (and after the
        pass that started it), before its queries: `backup_thread_func` writes, then acks.
        `step`: that pass (`pass_now() + 1`), where the caller has it at hand (the scheduler's
        pass start: no generic read of its pass count a pass)."""
        if not self.storage_writes:
            return
        storage = self.storage
        assert storage is not None  # (a write in flight has a tier; typed, the compares are plain ints)
        if step < 0:
            step = self.pass_now() + 1
        for entry in self.storage_writes:
            if entry.start < 0:
                start = max(now_ns, storage.write_free_ns)
                end = start + self.cost.storage_io_ns(entry.pages, self.page_bytes)
                storage.write_free_ns = end
                entry.start, entry.end = start, end
                self.clock.at(end, self._wake_fn, None)  # the event loop's pass then takes its ack
            if not entry.landed and entry.release_pass <= step and entry.end <= now_ns:
                self._land(entry.node, entry.cause, entry.pages, entry.start, entry.end, now_ns)
                entry.landed = True

    def hold_prefetch_tail(self, slots: Any, stop_ns: int) -> None:
        """A prefetch read terminated while in flight (`check_prefetch_progress` ->
        `terminate_prefetch`) whose pages `slots` were not acknowledged: SGLang's read thread
        stops at the end of the batch in progress (`stop_ns`), its last ack (`completed_req`)
        then hands the slots back (`_drain_ack_prefetch` -> `append_host_mem_release`), and
        the drain after the one that takes that ack frees them (`_drain_release`: its count is
        taken before the acks are drained)."""
        if slots:
            self.prefetch_tails.append((stop_ns, -1, slots))
            self.clock.at(stop_ns, self._wake_fn, None)

    def free_prefetch_tails(self, now_ns: int, *, every: bool = False, step: int = -1) -> None:
        """A pass's drain, its end (`_drain_release`): the tails whose last ack an earlier pass
        took are freed; those whose read has stopped by now have their ack taken by this pass
        (`step`, as in start_storage_writes)."""
        if not self.prefetch_tails:
            return
        if step < 0:
            step = self.pass_now() + 1  # the pass this drain belongs to
        keep = []
        for stop, seen, slots in self.prefetch_tails:
            if every or (seen >= 0 and step > seen):
                self.host.free(slots)
                continue
            if seen < 0 and now_ns >= stop:
                seen = step
                self.clock.at(now_ns, self._wake_fn, None)  # the event loop's next pass frees them
            keep.append((stop, seen, slots))
        self.prefetch_tails = keep

    def _wake(self, _arg) -> None:
        """An event that only wakes the scheduler (a storage ack due)."""

    def _land(self, node: TreeNode, cause: str | None, pages: int, start: int, end: int, now_ns: int) -> None:
        # what was written is the host copy as the ack found it (`write_backup_storage` takes the
        # node's host value then); a match may have split the node since: write each part
        if len(node.keys) >= pages:
            # not split since (nearly every landing): the node alone, what `_parts` answers then,
            # without its list
            if node.host is not None and node.parent is not None:
                self._write_storage(node, cause, now_ns, start, end)
            return
        for part in self._parts(node, pages):
            # a part dropped from the tree since (its host slots freed, maybe reused) is not
            # written: only a rule set with `write_back_drop_spares_pinned` switched back drops a
            # subtree whose storage write holds it
            if part.host is not None and part.parent is not None:
                self._write_storage(part, cause, now_ns, start, end)

    def release_storage_writes(self, now_ns: int, *, every: bool = False, step: int = -1) -> None:
        """A pass's drain (`_drain_backup`): the storage writes whose ack it takes (in the tier
        since this pass's start, start_storage_writes) free their host copies to evict again.
        `every`: the replay's end, when the passes after it would take every ack. `step`: the
        pass this drain belongs to, as in start_storage_writes."""
        if every:
            self.free_prefetch_tails(now_ns, every=True)
        if not self.storage_writes:
            return
        if step < 0:
            step = self.pass_now() + 1  # the pass this drain belongs to
        if not every:
            # Most passes take no write's ack (~5 writes in flight, one landing every few
            # passes): those leave the list as it is, not copied into a new one
            for entry in self.storage_writes:
                if entry.landed and entry.release_pass <= step and entry.end <= now_ns:
                    break
            else:
                return
        keep: list[StorageWrite] = []
        for entry in self.storage_writes:
            if every and not entry.landed:  # the replay's end: the passes after it would take every ack
                if entry.start < 0:
                    entry.start = max(now_ns, self.storage.write_free_ns)
                    entry.end = entry.start + self.cost.storage_io_ns(entry.pages, self.page_bytes)
                    self.storage.write_free_ns = entry.end
                self._land(entry.node, entry.cause, entry.pages, entry.start, entry.end, now_ns)
                entry.landed = True
            if not every and (not entry.landed or entry.release_pass > step or entry.end > now_ns):
                keep.append(entry)
                continue
            self.tree.release_host(entry.node)
        self.storage_writes = keep

    def _write_back(self, node: TreeNode, cause: str | None, now_ns: int) -> bool:
        """write_back: back the node up at eviction, synchronously (the allocation waits for it).
        False when the host has no room for it."""
        pages = len(node.keys)
        self.tree.inc_lock(node)
        slots = self._alloc_host(pages, cause, now_ns)
        self.tree.dec_lock(node)
        if slots is None:
            return False  # host is full of locked pages: the node is dropped instead
        wall, runs = self._to_host(node.device, slots)
        self.tree.set_host(node, slots)
        self.tree.track_duplicate(node)  # finish_write_through: the acked copy is a duplicate
        dp_bytes = pages * self.dp_page_bytes
        dur = self._copy_ns(pages, wall, dp_bytes, to_device=False, runs=runs)
        start = max(now_ns + self.blocking_ns, self.d2h_free_ns)
        self.d2h_free_ns = start + dur
        self.blocking_ns = self.d2h_free_ns - now_ns
        self.stats.write_backs += 1
        if self.emit.transfer is not None:
            self._transfer_row(start, start + dur, TransferKind.WRITE_BACK, cause, pages, runs,
                               pages * self.page_bytes, dp_bytes, start - now_ns, wall, None)
        if self.storage_per_pass:
            self._storage_after_ack(node, cause, 1)
        else:
            self._write_storage(node, cause, start + dur)
        return True

    def _write_storage(self, node: TreeNode, cause: str | None, now_ns: int, start: int = -1,
                       end: int = -1) -> None:
        """Write the node's host copy into the tier: on the tier's link from `now_ns`, or (0.5.23,
        start_storage_writes) timed already, from `start` to `end`."""
        storage = self.storage
        if storage is None:
            return
        # a page key names its whole prefix: the tier's key as it is; the node's key run as it is (the
        # index reads its int64 values in place: no int object a key, no list a write)
        keys = node.keys
        # Straight from the host slots into one append (no per-page work): the bytes on disk are
        # the host copy's, which a later prefetch reads back and a load-back verifies.
        # (the node's slot run as it is: an array('q') goes to pwrite_rows as a buffer)
        deleted = storage.write_from(self._host_array, node.host, keys, rows=self._host_rows)  # a count
        pages = len(keys)
        if start < 0:
            start = max(now_ns, storage.free_ns)
            end = start + self.cost.storage_ns(pages * self.page_bytes)
            storage.free_ns = end
        if deleted:
            self.stats.count_evictions(_STORAGE_DELETE, deleted)
        if self.emit.transfer is not None:
            self._transfer_row(start, end, TransferKind.STORAGE_WRITE, cause, pages, 1,
                               pages * self.page_bytes, pages * self.dp_page_bytes, max(0, start - now_ns), 0, None)

    # --- host -> device ------------------------------------------------------------------
    def load_back(self, nodes: tuple[TreeNode, ...], slots: Any, req_id: str, now_ns: int,
                  page_keys: Any) -> tuple[int, int, int, bool | None]:
        """Copy the host part of a matched chain into `slots` (already allocated on device).

        Returns (link ns, contiguous runs, measured wall ns, verified). All-or-nothing: callers decide
        before calling whether it happens at all.
        """
        host_slots: Any = nodes[0].host if len(nodes) == 1 else empty_run()
        if len(nodes) > 1:
            for part in nodes:
                host_slots.extend(part.host)
        if self._rows:
            wall, runs = self._to_device(host_slots, slots)
        else:
            from tierdiag.engine import kernels  # CUDA: the torch/Triton kernels

            wall = kernels.load_back(self.host.buffer, host_slots, self.device.buffer, slots).wait()
            runs = kernels.count_runs(host_slots)
        i = 0
        for node in nodes:
            n = len(node.keys)
            self.tree.set_device(node, slots[i:i + n])
            i += n
        if self.reclaim_duplicates:
            # The load-back's ack comes at the next scheduling pass (check_hicache_events ->
            # loading_check -> UnifiedTreeCore.finish_load_back): until then its nodes are
            # `load_back_pending` (write_back), which `_can_reclaim_full_host_duplicate`
            # refuses, and not yet registered as duplicates (ack_loads).
            self.loads_pending.append(nodes)
            anchor_id = nodes[-1].id
            for node in nodes:
                self.tree.load_pending[node.id] = anchor_id
        pages = len(slots)
        dp_bytes = pages * self.dp_page_bytes
        self.stats.loaded_data_plane_bytes += dp_bytes
        verified = None
        self._loadback_count += 1
        mode = self.verify_mode
        if mode == "all" or (mode == "sample" and self._loadback_count % VERIFY_SAMPLE_EVERY == 1):
            verified = verify_content(self.device, slots, page_keys)
            if not verified:
                raise AssertionError(f"load-back for request {req_id}: device pages differ from what was written "
                                     f"(copy kernel or slot bookkeeping bug)")
            self.stats.verified_load_backs += 1
            self.stats.verified_data_plane_bytes += dp_bytes
        return self._copy_ns(pages, wall, dp_bytes, to_device=True, runs=runs), runs, wall, verified

    def ack_loads(self) -> None:
        """A scheduling pass's start (check_hicache_events -> loading_check): the load-backs
        issued before it are acknowledged, each registering its nodes as host duplicates from
        the anchor up (`finish_load_back` -> `_update_duplicate_tracking`)."""
        if not self.loads_pending:
            return
        tree = self.tree
        pending = tree.load_pending
        for nodes in self.loads_pending:
            # the anchor's root path, split fragments included (its upper halves, made since)
            anchor = nodes[-1]
            aid = anchor.id
            node: TreeNode | None = anchor
            while node is not None and node.parent is not None:
                if pending.get(node.id) == aid:
                    del pending[node.id]
                    tree.track_duplicate(node)
                node = node.parent
        self.loads_pending.clear()

    def write_computed(self, slots: Any, page_keys: "np.ndarray | list[int]") -> None:
        """The prefill's output: KV for these pages, derived from their keys."""
        write = _C_WRITE_CONTENT
        rows = self._device_rows
        if write is not None and len(slots) and rows is not None:  # content.write_content_c's work
            if write(rows, slots, page_keys, self._device_layers, self._device_elems) >= 0:
                return
        write_content(self.device, slots, page_keys)

    # --- storage -> host -----------------------------------------------------------------
    def alloc_host(self, pages: int, cause: str | None, now_ns: int) -> Any:
        """Host slots, host-evicting unprotected leaves for room (None if that cannot be done)."""
        return _as_list(self._alloc_host(pages, cause, now_ns))

    def alloc_storage_hit(self, pages: int, cause: str | None, now_ns: int) -> Any:
        """Host slots for a storage hit of `pages` (both releases): when they are not free, host
        eviction is asked for the whole hit, not the shortfall, and the allocation tried again
        (0.5.23 `HybridCacheController.allocate_storage_hit`: `evict_host(hit_tokens)`, which
        frees until that many are freed; 0.5.9 `HiRadixCache.prefetch_from_storage`:
        `evict_host(prefetch_length)`). None when they still are not free (the caller may take
        what fits)."""
        if pages <= self.host.free_pages:
            return _as_list(self.host.alloc(pages))
        self.evict_host(pages, cause, now_ns, whole=True)
        if pages > self.host.free_pages:
            return None
        return _as_list(self.host.alloc(pages))

    def prefetch(self, keys: KeyRun, slots: Any, req_id: str, now_ns: int) -> tuple[int, int]:
        """Read pages from storage into host `slots` (allocated by the caller). Returns (start, end)."""
        pages = len(keys)
        dp_bytes = self.storage.read_into(keys, self.host.array, _as_list(slots))
        storage = self.storage
        start = max(now_ns, storage.free_ns)
        if self.storage_per_pass:  # SGLang's batches, one backend call each (storage_batch_ends)
            end = start + self.cost.storage_io_ns(pages, self.page_bytes)
        else:
            end = start + self.cost.storage_ns(pages * self.page_bytes)
        storage.free_ns = end
        self.stats.prefetches += 1
        if self.emit.transfer is not None:
            self._transfer_row(start, end, TransferKind.PREFETCH, req_id, pages, _rows.count_runs(slots),
                               pages * self.page_bytes, dp_bytes, start - now_ns, 0, None)
        return start, end

    def emit_load_back(self, start: int, end: int, req_id: str, pages: int, runs: int, queued: int,
                       wall: int, verified) -> None:
        if self.emit.transfer is not None:
            dp_bytes = pages * self.dp_page_bytes
            self._transfer_row(start, end, TransferKind.LOAD_BACK, req_id, pages, runs,
                               pages * self.page_bytes, dp_bytes, queued, wall, verified)
