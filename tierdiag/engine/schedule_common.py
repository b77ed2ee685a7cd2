"""What the scheduler and its mixins (admission.py, decode.py) share: SGLang's scheduling
constants (their environ.py defaults) and AddReqResult's values, and the engine's error."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Final

from tierdiag.config.names import WritePolicy
from tierdiag.native import cplane
from tierdiag.trace.pages import append_output_keys_py
# EngineError lives in tierdiag/errors.py, outside the compiled modules, and is imported from
# here as before: defined here, over TierdiagError (Any to mypyc: imports outside the compiled
# modules are not followed), mypyc built it as a native class laid out as a bare object (basicsize
# 24, not BaseException's 72), so making one wrote past it and reading its __context__ segfaulted
# (tests/reliability/test_engine_errors.py).
from tierdiag.errors import EngineError  # noqa: F401 - admission, scheduler and deployment import it from here

if TYPE_CHECKING:
    from tierdiag.config.engine import EngineConfig
    from tierdiag.engine.arrivals import ArrivalSource
    from tierdiag.engine.controller import CacheController, Clock, EngineStats
    from tierdiag.engine.costmodel import CostModel
    from tierdiag.engine.emitters import Emitters
    from tierdiag.engine.miss import MissTracker
    from tierdiag.engine.request import Req
    from tierdiag.engine.rules import RuleSet
    from tierdiag.engine.tree import RadixTree
    from tierdiag.engine.tree_node import TreeNode

# Decode memory (both releases, environ.py): new_token_ratio starts at SGLANG_INIT_NEW_TOKEN_RATIO
# (0.7) x schedule_conservativeness (1), decays by (init - init x SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
# (0.14)) / SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS (600) every decode step that retracts nothing, is
# reset when the scheduler idles; a running request reserves min(max_new - out, CLIP) x ratio.
# (Final: the compiled modules that import them read a constant or a C static, where a plain
# module name was a look-up in the importing module's dict at every use; issue 41, session 24)
INIT_NEW_TOKEN_RATIO: Final = 0.7
MIN_NEW_TOKEN_RATIO: Final = INIT_NEW_TOKEN_RATIO * 0.14
NEW_TOKEN_RATIO_DECAY: Final = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / 600
RETRACT_DECODE_STEPS: Final = 20  # SGLANG_RETRACT_DECODE_STEPS
CLIP_MAX_NEW_TOKENS: Final = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
NO_TOKEN: Final = "no_token"  # AddReqResult: memory ...
OTHER: Final = "other"  # ... or anything else (the shape, the budget)
INT64_MAX: Final = 2**63 - 1  # checkpoint_into_tree: min(priority + 1, torch.iinfo(torch.int64).max)
# HiRadixCache.write_through_threshold: insert hits that trigger a device->host backup.
WRITE_THROUGH_THRESHOLD = {WritePolicy.WRITE_THROUGH: 1, WritePolicy.WRITE_THROUGH_SELECTIVE: 2}


class SchedulerState:
    """The Scheduler's state, which its mixins (admission.py, decode.py, prefetch.py, request.py)
    read and write; Scheduler.__init__ sets it up and says what each is. Declared here, with its
    types, so that a compiled build (mypyc: setup.py) lays each attribute out once and the mixins
    reach it without a dictionary look-up. Floats are `Any`: a compiled build keeps them boxed.

    The mixins are one chain of native classes, in the order Scheduler's MRO always had them:

        SchedulerState <- RequestRecords <- StoragePrefetch <- DecodeSteps <- Admission <- Scheduler

    (not mypyc traits over a trait SchedulerState: compiled, a trait method's `self.attr` walked
    the object's vtable for the trait's offset table at every read and write (`CPy_FindAttrOffset`,
    428 sites), where a base class's attribute is at a fixed offset; issue 41, session 33)."""

    cfg: EngineConfig
    rules: RuleSet
    cost: CostModel
    tree: RadixTree
    ctrl: CacheController
    probe: Any
    emit: Emitters  # one attribute an event kind, set where it is built (compiled: native reads of its attributes)
    miss: MissTracker | None
    stats: EngineStats
    progress: Any
    ps: int
    waiting: list[Req]
    alloc_page: int
    _pending_alloc: list[tuple[Req, int, int]]
    chunked: Req | None
    running: list[Req]
    batch_is_full: bool
    _admission_reopens: bool
    _join_front: int | None
    new_token_ratio: Any
    dstep: int
    _kv_base: int
    _page_ring: list[list[Req]]
    _fin_sum: int
    _n_short: int
    _long: list[Req]
    _finish_due: dict[int, list[Req]]
    _finish_steps: list[int]
    mixed_chunk: bool
    _batch_id: int
    event_ns: int
    count_hits: bool
    refill_host_on_read: bool
    backup_threshold: int | None
    prefetch_threshold: int
    prefetch_tokens_occupied: int
    prefetch_limit_tokens: int
    requeries: Any  # the storage re-queries armed: prefetch.new_requeries() (C's RequeryIndex or RequeryIndexPy)
    # its `arm` and `fire`, bound once (StoragePrefetch.use_requeries sets all three)
    rq_arm: Callable[[Req, int], None]
    rq_fire: Callable[[int, list[Req]], list[Req] | None]
    retry_interval: int
    retry_cap: int
    storage_acks: bool
    has_storage: bool
    # RuleSet / EngineConfig fields admission reads per request, batch or insert, typed
    # (Scheduler.__init__): both classes are interpreted, a read of theirs a generic look-up
    r_chunk_later: bool
    r_overhead_pages: int
    r_batch_alloc_page: bool
    r_returns_early: bool
    r_hits_past_inserted: bool
    r_backup_chains: bool
    load_back_threshold: int
    max_prefill_tokens: int
    prefetch_pass: int
    unqueried: list[Req]
    unallocated: list[Req]  # the storage queries in flight, in query order (Req.query_*)
    query_occupied: int
    reading: dict[int, Req]
    held_releases: list[tuple[int, list[int]]]
    storage_pass_done_ns: int
    _running_extend: int
    arrivals: ArrivalSource | None
    rank: int
    id_step: int
    on_leave: Callable[[Req, int], None] | None
    clock: Clock
    processed_tokens: int
    arrived_at: dict[int, int]
    _total_offset: Any
    _cur_offset: int
    _prefill_done_fn: Any  # self._prefill_done and self._cache_unfinished, bound once (Scheduler.__init__)
    _cache_unfinished_fn: Any
    _give_step_fn: Any  # self._give_step and self._finish, bound once (Scheduler.__init__)
    _finish_fn: Any

    # The methods one mixin calls on another (or on Scheduler itself), declared here with their
    # signatures; each is defined once, where its docstring is (Scheduler's MRO puts every
    # definition before these). Compiled, a call of one declared here is a native call through
    # the class's vtable; undeclared it was a generic method call (attr-defined is off: the name
    # looked up on the type, a bound call through the callee's wrapper, its int arguments boxed
    # and parsed, its result unboxed): ~40k calls of conversation's first 3,000 requests, the
    # prefill's done and finish events' inserts among them (issue 41, session 25).
    def _insert(self, req: Req, upto: int, now: int, *, chunk: bool) -> list[TreeNode]:
        raise NotImplementedError  # admission.py

    def _join(self, req: Req) -> None:
        raise NotImplementedError  # decode.py

    def _finish(self, req: Req) -> None:
        raise NotImplementedError  # decode.py

    def _decode_fits(self, reqs, now: int) -> bool:  # (reqs: the running list, or a selection of it)
        raise NotImplementedError  # decode.py

    def _decode_step(self, now: int) -> int:
        raise NotImplementedError  # decode.py

    def _finish_step(self, end: int) -> None:
        raise NotImplementedError  # decode.py

    def _record(self, req: Req, now: int) -> None:
        raise NotImplementedError  # records.py

    def _note_decode(self, start: int, end: int) -> None:
        raise NotImplementedError  # records.py

    def _sample_pools(self, now: int) -> None:
        raise NotImplementedError  # records.py

    def _start_prefetch(self, req: Req, now: int) -> None:
        raise NotImplementedError  # prefetch.py

    def _finish_prefetch(self, req: Req, now: int, *, acked: bool = False) -> None:
        raise NotImplementedError  # prefetch.py

    def _rem_total(self) -> float:
        raise NotImplementedError  # scheduler.py

    def _pages_through(self, req: Req, end_tokens: int) -> int:
        raise NotImplementedError  # scheduler.py

    def _take(self, remaining: int, budget: int) -> int:
        raise NotImplementedError  # scheduler.py

    def _reject(self, req: Req, reason: str, *, ends_session: bool = True) -> None:
        raise NotImplementedError  # scheduler.py


_output_seed_native: Final = cplane.compiled("output_seed")
_output_keys_native: Final = cplane.compiled("output_keys")


def append_output_keys_c(req_id: str, keys: Any, n_in: int, n_total: int) -> None:
    """A finish's output keys appended to `keys` (trace.pages.append_output_keys_py's work) by a
    native function of the compiled engine: the seed's blake2b (_cplane.output_seed) and the keys
    (_cplane.output_keys handed None for keys_np) are two C calls from here, where the pages
    module's interpreted wrapper (since removed) and its `_seed_c` were two Python frames a
    finish (~20.9 M of Scheduler.run's 929 M instructions on conversation[:3000], ~7.8k a finish
    with output pages; issue 41, session 30). What either C declines (-1), having changed nothing, takes
    the Python reference (trace.pages.append_output_keys_py), as there."""
    if 0 <= n_in <= len(keys):
        seed: Any = _output_seed_native(req_id, keys[n_in - 1] if n_in else 0)
        if seed != -1 and _output_keys_native(keys, None, seed, len(keys) - n_in, n_total - n_in) is None:
            return
    append_output_keys_py(req_id, keys, n_in, n_total)


append_output_keys = cplane.choose("decode.append_output_keys", append_output_keys_c, append_output_keys_py)
_APPEND_C: Final = append_output_keys is append_output_keys_c  # (called by name below: a native call, compiled)
