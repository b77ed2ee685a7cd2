"""A data-parallel deployment (`replay --dp N --router NAME`): N ranks behind one router, on one
virtual clock, sharing one storage tier (docs/contract.md "Deployments", docs/engine.md).

Each rank is a whole one-GPU engine (engine.py builds them): its own radix tree, device and host
pools, cache controller (its link's clocks) and scheduler. What they share:

  - the clock and its event queue: one heap of (time, order, rank, callback, arg), so events at
    one instant run in the order they were scheduled, whichever rank scheduled them;
  - the arrivals (arrivals.py, closed loop included: a session's next turn is released when its
    previous turn finishes, on whatever rank that was);
  - the storage tier (storage.py): one index of content-keyed pages (page keys are prefix-chained,
    so a page one rank wrote is the page another rank's request needs) and one bandwidth clock
    (`StorageTier.free_ns`) that every rank's prefetches and writes queue on;
  - the stats (controller.EngineStats): the run's totals, over every rank.

    arrival ──► peek every rank's tree (no side effect) ──► Gateway.route (RequestView, RanksView)
            ──► that rank's scheduler (_arrive) ... finish or reject ──► Gateway.finish

At each arrival every rank's tree is asked, without touching it (`RadixTree.peek`: no access stamp,
no split, no lock), how much of the request's prefix it holds on device and on host: that goes
into the request's row (arrival_device_tokens / arrival_host_tokens of its own rank, best_rank*,
ranks_json), never to the router, which sees only RequestView and RanksView (routing/base.py).

Each rank's batches start when its own GPU is free: the loop advances the clock to the next
arrival, event or rank whose GPU frees, handles arrivals and events due, then lets every idle rank
with work form a batch, rank 0 first. Ids (batch, node, eviction, transfer) are rank + 1, then
every N-th (`Scheduler.as_rank`), so they stay unique within the run.

A one-rank replay does not come here: Engine runs its one Scheduler's own loop (rows identical to
the engine before deployments).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from typing import Any, Final, Iterable, Sequence

from mypy_extensions import mypyc_attr

from tierdiag.config.engine import EngineConfig
from tierdiag.engine.arrivals import ArrivalSource
from tierdiag.engine.controller import Clock, EngineStats
from tierdiag.engine.request import Req
from tierdiag.engine.routing import RequestView, RouterConfig
# (from its own module: compiled with this one, its calls are native; through the package, which
# is not compiled, the class was Any to mypyc and each route, finish and count a generic call)
from tierdiag.engine.routing.gateway import Gateway
from tierdiag.engine.schedule_common import INIT_NEW_TOKEN_RATIO, EngineError
from tierdiag.engine.scheduler import Scheduler
from tierdiag.native import cplane
from tierdiag.probes.events import Route
from tierdiag.trace.reader import TraceRequest


# _json_number's texts of nonzero scores by value (cleared when full)
_SCORE_TEXT: Final[dict[float, str]] = {}
_SCORE_TEXT_MAX: Final = 1 << 14


def _json_number(x: float | None) -> str:
    """A score as JSON writes it: float.__repr__ (scores are finite: match rates, loads). Most
    ranks score 0 for a request (they hold none of it, or nothing is in flight there): "0.0"
    without the float's repr."""
    if x is None:
        return "null"
    f = float(x)
    if f == 0.0:
        return "0.0" if math.copysign(1.0, f) > 0 else "-0.0"
    # float.__repr__ runs the shortest-digits search (~7,000 instructions); a rank's score
    # repeats (a request's ranks at the same depth, the same match rate or load again), so the
    # text is kept by value, the table cleared when full. -0.0 (equal to 0.0) is answered above,
    # NaN (equal to nothing) never kept. _json_number_reference is the text written out.
    text = _SCORE_TEXT.get(f)
    if text is None:
        text = repr(f)
        if f == f:
            if len(_SCORE_TEXT) >= _SCORE_TEXT_MAX:
                _SCORE_TEXT.clear()
            _SCORE_TEXT[f] = text
    return text


def _json_number_reference(x: float | None) -> str:
    """_json_number without its table: json.dumps's text of one score."""
    if x is None:
        return "null"
    f = float(x)
    if f == 0.0 and math.copysign(1.0, f) > 0:
        return "0.0"
    return repr(f)


# ranks_json_py's whole texts of a rank holding nothing and scoring 0.0, kept for in_flight numbers below this
_IDLE_TEXTS_MAX: Final = 4096
# ... by rank, then by in_flight number (made the first time each is met)
_IDLE_TEXTS: Final[list[list[str]]] = []


def ranks_json_py(held: list[tuple[int, int]], in_flight: tuple[int, ...], scores: tuple[float, ...],
                  ps: int) -> str:
    """The arrival's `ranks_json`: for each rank r, {"rank", "device_tokens", "host_tokens",
    "in_flight", "score"} of what it held of the request's prefix (`held[r]`, pages on device and
    then on host only), the requests in flight there and the router's score for it (null past
    the scores' end): json.dumps of that list with separators (",", ":"), written out (~5x
    faster: one string a request, every request). A score of 0 is "0.0" (`_json_number`).
    A rank holding none of the prefix that the router scores +0.0 (most ranks of most
    requests) is a whole text kept by its in_flight number (`_IDLE_TEXTS`): no int formatted,
    no score, no string built. ranks_json_c (the data plane's C) writes the same text in one
    buffer; tests/engine/test_deployment.py holds the two and json.dumps equal."""
    num_scores = len(scores)
    parts: list[str] = []
    while len(_IDLE_TEXTS) < len(held):
        _IDLE_TEXTS.append([])
    for r, (d, h) in enumerate(held):
        f: int = in_flight[r]
        if d == 0 and h == 0 and r < num_scores:
            s: float = scores[r]
            if s == 0.0 and math.copysign(1.0, s) > 0 and 0 <= f < _IDLE_TEXTS_MAX:  # (f < 0: texts[f] is no text of f)
                texts = _IDLE_TEXTS[r]
                while len(texts) <= f:
                    texts.append(f'{{"rank":{r},"device_tokens":0,"host_tokens":0,"in_flight":{len(texts)},'
                                 f'"score":0.0}}')
                parts.append(texts[f])
                continue
        score = _json_number(scores[r] if r < num_scores else None)
        parts.append(f'{{"rank":{r},"device_tokens":{d * ps},"host_tokens":{h * ps},"in_flight":{f},'
                     f'"score":{score}}}')
    return "[" + ",".join(parts) + "]"


_ranks_json_native = cplane.compiled("ranks_json")


def ranks_json_c(held: list[tuple[int, int]], in_flight: tuple[int, ...], scores: tuple[float, ...],
                 ps: int) -> str:
    """ranks_json_py by the data plane's C (csrc/router.c): one buffer written in place, the
    scores' texts kept in the same table (`_SCORE_TEXT`). Where it is not its case (another
    shape, a value past int64) it changed nothing and the reference writes the text."""
    text = _ranks_json_native(held, in_flight, scores, ps, _SCORE_TEXT, _SCORE_TEXT_MAX)
    if isinstance(text, str):
        return text
    return ranks_json_py(held, in_flight, scores, ps)


ranks_json = cplane.choose("deployment.ranks_json", ranks_json_c, ranks_json_py)


# NamedTuples built by their tuple (NamedTuple._make's own call, without its interpreted frame)
_new_tuple: Final = tuple.__new__


# (a native float of this module: the imported name is a dict look-up a call, compiled)
_INIT_RATIO: Final[float] = INIT_NEW_TOKEN_RATIO


def idle_pass_changes(sched: Scheduler, acks_per_pass: bool) -> bool:
    """Whether `sched.idle_pass` could change anything: it resets new_token_ratio (a no-op where
    it is already reset), flushes the queued backups (`EngineController.flush_backups` swaps its
    two queues and sends the first: a no-op where both are empty) and, under the rule
    storage_acks_per_pass, passes where `_idle_storage_due` finds a storage write, a cut read's
    tail or a held release due (none where all three lists are empty: always without a storage
    tier). `acks_per_pass`: the rank's `rules.storage_acks_per_pass` (a run's rules never change;
    RuleSet is interpreted, so the loop reads it once a rank, not once a call: ~150k calls on a
    --dp 8 replay of 3,000 requests). tests/engine/test_deployment.py holds a replay that skips
    the other calls to the events of one that makes every call."""
    ctrl = sched.ctrl
    ratio: float = sched.new_token_ratio
    if ratio != _INIT_RATIO or ctrl.backup_queue or ctrl.backup_later:
        return True
    return acks_per_pass and bool(ctrl.storage_writes or ctrl.prefetch_tails or sched.held_releases)


class AheadRun:
    """The passes a rank's `run_decode_ahead` ran at once after a batch ending at `start`: plain
    decode steps back to back, step k (k = first_step + 1 ...) of `decode_step_ns(kv_base +
    running * k)` (DecodeSteps._decode_ahead's loop: neither the KV base nor the running batch
    changes inside it). The loop needs each step's start (the pass it stands for) only where a
    rank is stuck, waiting for memory or a prefetch, and none is in a conversation replay; a
    list of them made every step was ~2.7 M boxed ints appended, and freed, on a --dp 8
    conversation replay (issue 41). `starts()` makes them when asked: the `wakes` list the
    decode loop writes (tests/engine/test_deployment.py holds the two equal). Set after the
    call, only where it ran steps (`first_step`: the decode clock before it; the KV base and the
    batch read after it are those it ran with): a run of none (most calls of a --dp 8 replay
    whose rank has more to prefill) sets nothing (issue 41, session 25). One a rank, restarted
    at each run (`restart`; session 37)."""

    __slots__ = ("sched", "start", "first_step", "kv_base", "running", "steps", "_starts")

    def __init__(self, sched: Scheduler, start: int, first_step: int) -> None:
        self.sched = sched
        self.start = start
        self.first_step = first_step
        self.kv_base: int = sched._kv_base
        self.running = len(sched.running)
        self.steps = sched.dstep - first_step
        self._starts: list[int] | None = None

    def restart(self, start: int, first_step: int) -> None:
        """This object made the run its rank's scheduler ran from `start` now (as `__init__`
        makes it): the loop keeps one a rank (`_start_run`), where a new one a run was ~57k
        objects made and freed on a --dp 8 conversation replay (issue 41 session 37)."""
        sched = self.sched
        self.start = start
        self.first_step = first_step
        self.kv_base = sched._kv_base
        self.running = len(sched.running)
        self.steps = sched.dstep - first_step
        self._starts = None

    def _step_ns(self, k: int) -> int:
        return self.sched.cost.decode_step_ns(self.kv_base + self.running * k)

    def last_start(self, end: int) -> int:
        """The last step's start, from the run's end (`end` = that start + its step)."""
        return end - self._step_ns(self.first_step + self.steps)

    def starts(self) -> list[int]:
        """Each step's start, in order (the decode loop's `wakes`)."""
        if self._starts is None:
            out = []
            t = self.start
            for k in range(self.first_step + 1, self.first_step + self.steps + 1):
                out.append(t)
                t += self._step_ns(k)
            self._starts = out
        return self._starts


@mypyc_attr(free_list_len=1)
class Event:
    """An event of the deployment's heap: its time (ns), its order (the pushes' count: events at
    one time run in the order given), its rank's scheduler and the call `fn(arg)`. Native
    fields: the heap compares the two ints compiled, where a tuple's heappush compared tuples
    by rich compare (issue 41 session 36). Compiled, the class keeps one freed instance for
    its next (`free_list_len`): an event is made by a push and freed after its call, most
    often with no other event made in between (-11 M instructions of a --dp 8 conversation
    replay; session 37)."""

    __slots__ = ("t_ns", "order", "sched", "fn", "arg")

    def __init__(self, t_ns: int, order: int, sched: Scheduler, fn: Any, arg: Any) -> None:
        self.t_ns = t_ns
        self.order = order
        self.sched = sched
        self.fn = fn
        self.arg = arg


class EventHeap:
    """Events, a binary min-heap on (t_ns, order) in `slots[:n]` (slots[0] the next): the
    deployment's, and each rank's own beside it (the same Events). The orders are given by
    `push`, each one more than the last, so no two events compare equal and the pops' order is
    the one any heap on those keys gives (heapq's on the tuples (t_ns, order, ...) before:
    tests/engine/test_event_heap.py).

    `slots` never shrinks: a pop lowers `n` and a put fills the slot past it (appending only
    where every slot is in use). A list grown by `append` and shrunk by `pop` at every event
    reallocated its array at each of its size's steps: a rank's own heap goes between empty
    and one event most of the time, and from empty to one and back is a malloc and a free
    (`list.pop` and `list.append` were ~180 instructions each at --dp 8, ~37 M of a
    conversation replay; issue 41 session 37). A pop leaves `hole` in the slot it frees (an
    event of no callback, made at the first put), so no event popped is kept alive by its heap."""

    def __init__(self) -> None:
        self.slots: list[Event] = []
        self.n = 0
        self.last_order = 0
        self.hole: Event | None = None

    def __len__(self) -> int:
        return self.n

    @property
    def items(self) -> list[Event]:
        """The heap's events, in heap order (items[0] the next): a copy."""
        return self.slots[:self.n]

    def clear(self) -> None:
        """Every event taken out (none popped: `_untrack`'s)."""
        self.slots.clear()
        self.n = 0

    def push(self, t_ns: int, sched: Scheduler, fn: Any, arg: Any) -> Event:
        """A new event, its order the next, put in; returned (for a rank's own heap)."""
        order = self.last_order + 1
        self.last_order = order
        event = Event(t_ns, order, sched, fn, arg)
        self.put(event)
        return event

    def put(self, event: Event) -> None:
        """`event` put in: its order above every order in this heap (each `push` gives the next)."""
        t_ns = event.t_ns
        slots = self.slots
        pos = self.n
        self.n = pos + 1
        if pos == len(slots):
            slots.append(event)
            if self.hole is None:
                self.hole = Event(0, 0, event.sched, None, None)
        # (up past the parents later in time: the new order is above every order in the heap,
        # so a parent at the same time stays first)
        while pos > 0:
            parent_pos = (pos - 1) >> 1
            parent = slots[parent_pos]
            if t_ns >= parent.t_ns:
                break
            slots[pos] = parent
            pos = parent_pos
        slots[pos] = event

    def pop(self) -> Event:
        """The next event, taken out (the heap not empty)."""
        slots = self.slots
        n = self.n - 1
        self.n = n
        last = slots[n]
        hole = self.hole
        if hole is not None:  # (always, past a put)
            slots[n] = hole
        if n == 0:
            return last
        top = slots[0]
        t_ns, order = last.t_ns, last.order
        pos = 0
        child_pos = 1
        while child_pos < n:
            child = slots[child_pos]
            right_pos = child_pos + 1
            if right_pos < n:
                right = slots[right_pos]
                if right.t_ns < child.t_ns or (right.t_ns == child.t_ns and right.order < child.order):
                    child, child_pos = right, right_pos
            if child.t_ns > t_ns or (child.t_ns == t_ns and child.order > order):
                break
            slots[pos] = child
            pos = child_pos
            child_pos = 2 * pos + 1
        slots[pos] = last
        return top


class RankClock(Clock):
    """A rank's `clock` in a deployment: its events on the deployment's heap, with its rank's
    scheduler, and (`tracked`: while steps may run ahead) on the rank's own heap too. A
    native `at` (schedule_common.Clock; the closure in `sched.at` before was a generic call
    an event at --dp 8: ~50k on a conversation replay)."""

    def __init__(self, events: EventHeap, own: EventHeap, sched: Scheduler) -> None:
        self.events = events
        self.own = own
        self.sched = sched
        self.tracked = True

    def at(self, t_ns: int, fn: Any, arg: Any) -> None:
        event = self.events.push(t_ns, self.sched, fn, arg)
        if self.tracked:
            self.own.put(event)


class _Lane:
    """A rank as the loop reads it at every wake: when its GPU is free again (ns) and its rule
    storage_acks_per_pass (idle_pass_changes). Native attributes: the loop read each rank's
    GPU-free time from a list of boxed ints, an unbox a rank a wake (~4.4 M on a --dp 8
    conversation replay, ~250 M instructions: callgrind, issue 41 session 24)."""

    __slots__ = ("sched", "free", "acks")

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self.free = 0
        # (a run's rules never change; RuleSet is interpreted: read once a rank)
        self.acks: bool = bool(sched.rules.storage_acks_per_pass)


def _stuck_rank(lanes: list[_Lane], now: int, ran_mask: int) -> bool:
    """Whether a rank is stuck at `now`: its GPU free, its pass (if any) ran nothing (its bit
    in `ran_mask` clear), and it has work (waiting, chunked or running). A loop that stops at
    the first (`any()` over a generator was made a list of every rank's answer, compiled)."""
    for rank, lane in enumerate(lanes):
        if lane.free <= now and not (ran_mask >> rank) & 1:
            sched = lane.sched
            if sched.waiting or sched.chunked is not None or sched.running:
                return True
    return False


def _ahead_limit(src: ArrivalSource, now: int, closed: bool, has_next: bool, src_next: int,
                 own: EventHeap) -> int | None:
    """Where a rank's run-ahead from `now` stops: the next arrival (asked of the source in a
    closed loop) or the rank's own next event (`own`: its events, a heap), whichever is
    first; None where there is neither. Another rank's event is no limit (issue 41 session 33:
    on a --dp 8 conversation replay it stopped most runs): what it changes reaches this rank
    only at an arrival (the router's view: peeks, `ranks_json`, the gateway's counts) or by an
    event of this rank's own (a copy's or a storage write's ack, a load-back's, a finish, a wake
    its storage work asked for); the plain decode steps run ahead read nothing shared (no
    storage query, read or write in flight: `_decode_ahead`'s checks); an idle rank's pass at a
    wake the longer run leaves out keeps its times (a second backup flush starts at the link's
    free time, which its first copy's ack, an event, ends; a storage write's start and ack are
    its rank's own wakes), and a rank stuck for memory or a prefetch still wakes at every step
    of every run (`AheadRun.starts`). tests/engine/test_fast_paths.py holds every event equal to
    the pass-by-pass loop's and to the loop's that stopped at every rank's next event."""
    limit = src.next_ns(now) if closed else (src_next if has_next else None)
    if own.n:
        head_ns = own.slots[0].t_ns
        if limit is None or head_ns < limit:
            limit = head_ns
    return limit


def _start_run(run_at_once: list[AheadRun | None], runs: list[AheadRun], rank: int, start: int, first_step: int,
               end: int) -> int:
    """Note the steps rank `rank` ran ahead from `start` (its step counter at `first_step` before
    them, the run ending at `end`) as the rank's run (`runs[rank]`, restarted); the last step's
    start (the loop keeps the latest of its ranks')."""
    run = runs[rank]  # (the rank's one object: nothing holds a run past the loop's wake that reads it)
    run.restart(start, first_step)
    run_at_once[rank] = run
    return run.last_start(end)


class Deployment:
    """N schedulers (already built, one a rank) driven on one clock behind a Gateway."""

    def __init__(self, cfg: EngineConfig, ranks: Sequence[Scheduler], stats: EngineStats):
        self.cfg = cfg
        self.ranks = list(ranks)
        self.stats = stats
        # (ints: the arrival's products and division native; the config's fields are Any to mypyc)
        self.ps: int = cfg.page_size
        self.block_size: int = cfg.block_size
        # (the rank whose `_page_keys` makes an arrival's keys: any rank's are the same)
        self.keys_of: Scheduler = self.ranks[0]
        if any(sched.ps != self.ps or sched.cfg.block_size != self.block_size for sched in self.ranks):
            raise ValueError("a deployment's ranks share its page and block size")
        self.gateway = Gateway(RouterConfig.from_config(cfg), len(self.ranks))
        # (typed: the loop reads the head's time as a native int, where an untyped list's
        # `events[0][0]` was a generic item read and a compare with `now` boxed, issue 41)
        # (its order an object: only the time is read natively, one unbox a head, not two)
        # (a heap of native Events, their order given by the heap: an itertools.count's `next`
        # was a builtins look-up and a generic call an event, issue 41; heapq's pushes of tuples
        # compared them by rich compare, ~32 M instructions of a --dp 8 conversation replay)
        self.events = EventHeap()
        # Each rank's events (a heap beside `events`, of the same Events: put in by its `at`,
        # popped with its event): where its run-ahead stops (`_ahead_limit`). Kept while steps may run
        # ahead: not once a closed loop has met a session (`_untrack`), where two heap
        # operations an event were +0.3 % instructions on a --dp 4 synth replay (issue 41
        # session 33), nor where a probe takes the decode steps
        self.own_times: list[EventHeap] = [EventHeap() for _ in ranks]
        self.track_own = True
        self.in_flight: dict[int, tuple[int, RequestView]] = {}  # request seq -> (rank, what the router saw)
        self.session_rank: dict[str, int] = {}  # a session's last rank (where its dropped turns are recorded)
        self.arrivals: ArrivalSource | None = None
        n = len(self.ranks)
        self.clocks: list[RankClock] = []
        for rank, sched in enumerate(self.ranks):
            sched.as_rank(rank, n)
            clock = RankClock(self.events, self.own_times[rank], sched)
            self.clocks.append(clock)
            sched.clock = sched.ctrl.clock = clock
            sched.on_leave = self._leave

    def _untrack(self) -> None:
        """No rank's steps run ahead from here on: their events' times are no longer kept."""
        self.track_own = False
        for clock in self.clocks:
            clock.tracked = False
        for own in self.own_times:
            own.clear()

    # --- the loop ------------------------------------------------------------------------
    def run(self, requests: Iterable[TraceRequest]) -> EngineStats:
        src = self.arrivals = ArrivalSource(requests, self.cfg.time_scale, closed=self.cfg.arrivals != "trace")
        src.on_drop = self._drop_turn
        ranks = self.ranks
        for sched in ranks:
            sched.arrivals = src
        lanes = [_Lane(sched) for sched in ranks]
        events = self.events
        heads = events.slots  # (slots[0]: the next event where `events.n`; the heap keeps this list)
        own_times = self.own_times
        ticks = [t for t in dict.fromkeys(s.emit.tick for s in ranks) if t is not None]
        # An idle rank passes (Scheduler.idle_pass) only where that can change something
        # (idle_pass_changes): ~586k calls of a --dp 8 conversation replay, most at wakes for
        # another rank's batch or events.
        # What a rank does before the next arrival or its own next event reaches no other rank unless it
        # evicts (host and storage writes), finishes (the router, the storage tier) or emits a
        # decode-step event (one stream, in clock order); passes that can only be plain decode
        # steps run at once (DecodeSteps.run_decode_ahead checks the rest). Not in a closed loop
        # once a session is met: another rank's finish may release a turn routed here at any step.
        # The loop still wakes at those passes' times while some rank is stuck (its pass ran
        # nothing: it waits for memory or a prefetch), as such a rank passes at every wake.
        ahead = all(s.decode_ahead and s.emit.decode_step is None for s in ranks)
        closed = src.closed
        track = self.track_own
        # Per rank: its last passes run at once, as what their times are made from (AheadRun);
        # the times themselves only where a stuck rank asks for them (no conversation replay does)
        run_at_once: list[AheadRun | None] = [None for _ in ranks]
        runs = [AheadRun(sched, 0, sched.dstep) for sched in ranks]  # (each rank's, restarted by _start_run)
        at_once_until = -1  # the latest of them
        now = 0
        # In an open loop only `due` moves the source (no finish releases a turn, none is
        # dropped, nobody waits for a line read ahead): its next arrival, once asked, holds until
        # the clock reaches it, and the loop's wakes before then (~190k a --dp 8 conversation
        # replay against 12k arrivals) ask the interpreted source nothing.
        # (src.next_ns(...) named on the source, not read into a local: a native call, compiled;
        # the bound method in a local was a generic call, `now` boxed, ~190k a --dp 8 replay)
        # The times the loop compares at every wake are native ints, each beside a flag where
        # it may be none (`has_next`, `has_nxt`): an `int | None` is a boxed int, unboxed at each
        # compare (~8 a wake, ~3 M on a --dp 8 conversation replay with the events' heads)
        has_next = False
        src_next = 0
        if not closed:
            asked = src.next_ns(now)
            has_next, src_next = asked is not None, asked if asked is not None else 0
        while True:
            while True:  # arrivals and events at `now`, until a finish releases no turn due now
                deliver = closed or (has_next and src_next <= now)
                # (`has_due` first, as Scheduler.run asks: in a closed loop `deliver` holds at
                # every wake, and `due` is a generator object made, stepped and freed a call:
                # ~129k of them on a --dp 8 conversation replay for 12k arrivals, ~95 M
                # instructions; `due` does nothing where `has_due` is false)
                if deliver and src.has_due(now):
                    for t, at, trace_at, think_ms in src.due(now):
                        self._arrive(t, at, trace_at, think_ms)  # (a native call: no bound method)
                while events.n and heads[0].t_ns <= now:
                    event = events.pop()
                    sched = event.sched
                    if track:
                        own_times[sched.rank].pop()  # (the rank's earliest: no event of it is before this one)
                    sched.event_ns = event.t_ns
                    event.fn(event.arg)
                if deliver:
                    asked = src.next_ns(now)
                    has_next, src_next = asked is not None, asked if asked is not None else 0
                if not has_next or src_next > now:
                    break
            batched = False
            # Ranks whose pass ran a batch (bit `rank`): their next pass is when it ends, even now.
            # Each rank's GPU-free time is read once a wake, here (a native attribute of its
            # _Lane), and the earliest next pass among the ranks (busy past now, or that ran)
            # taken as the loop goes.
            ran_mask = 0
            have_free = False
            min_free = 0
            for rank, lane in enumerate(lanes):
                sched = lane.sched
                free = lane.free
                if now >= free and (sched.waiting or sched.running or sched.chunked is not None):
                    batched = True
                    runs_ahead = ahead and not (closed and src.num_sessions)
                    if track and not runs_ahead:  # (for good: a closed loop's sessions only come)
                        self._untrack()
                        track = False
                    own = sched.pass_fn is sched._own_pass
                    # A pass that can only be a plain decode step is the first of the run-ahead's
                    # steps (`_decode_ahead` checks the state that makes it one, as it does for
                    # each step after a pass): no schedule_pass, no `_decode` (~23k passes on
                    # conversation[:2000] at --dp 8, each where another rank's event or an
                    # arrival cut this rank's run; issue 41 session 32). Where it is not (a prefill,
                    # a finish, an eviction, storage work), the run-ahead ran nothing and the pass
                    # runs as below.
                    # (`_decode_ahead`'s first checks, here: a rank with a request to prefill runs
                    # nothing ahead, ~36k tries of ~190k at --dp 8 on the conversation trace)
                    if runs_ahead and own and sched.running and sched.chunked is None \
                            and (not sched.waiting or sched.batch_is_full):
                        first_step = sched.dstep
                        end = sched.run_decode_ahead(now, _ahead_limit(src, now, closed, has_next, src_next,
                                                                       own_times[rank]))
                        if sched.dstep > first_step:
                            last = _start_run(run_at_once, runs, rank, now, first_step, end)
                            if last > at_once_until:
                                at_once_until = last
                            lane.free = end
                            ran_mask |= 1 << rank
                            if not have_free or end < min_free:
                                have_free, min_free = True, end
                            continue
                    # (Scheduler.run's own test: its schedule_pass called natively unless a
                    # harness has put its own in `pass_fn`)
                    ended = sched.schedule_pass(now) if own else sched.pass_fn(now)
                    if ended is not None:
                        end = ended  # (unboxed once)
                        if runs_ahead:
                            limit = _ahead_limit(src, now, closed, has_next, src_next, own_times[rank])
                            start, first_step = end, sched.dstep
                            end = sched.run_decode_ahead(end, limit)
                            if sched.dstep > first_step:
                                last = _start_run(run_at_once, runs, rank, start, first_step, end)
                                if last > at_once_until:
                                    at_once_until = last
                            elif run_at_once[rank] is not None:
                                run_at_once[rank] = None
                        lane.free = end
                        free = end
                        ran_mask |= 1 << rank
                        if not have_free or free < min_free:
                            have_free, min_free = True, free
                        continue
                elif now >= free and idle_pass_changes(sched, lane.acks):
                    sched.idle_pass(now, has_next)  # self_check_during_idle, the storage drain
                if free > now and (not have_free or free < min_free):
                    have_free, min_free = True, free
            if batched:
                for tick in ticks:  # a batch's events are in: the probe may flush its buffers
                    tick()
            has_nxt, nxt = has_next, src_next
            if events.n:
                head_ns = heads[0].t_ns
                if not has_nxt or head_ns < nxt:
                    has_nxt, nxt = True, head_ns
            if have_free and (not has_nxt or min_free < nxt):
                has_nxt, nxt = True, min_free
            if at_once_until > now and _stuck_rank(lanes, now, ran_mask):
                for stepped in run_at_once:  # a stuck rank: the loop's next wake, those passes' included
                    if stepped is None:
                        continue
                    wakes = stepped.starts()
                    i = bisect_right(wakes, now)
                    if i < len(wakes) and (not has_nxt or wakes[i] < nxt):
                        has_nxt, nxt = True, wakes[i]
            if not has_nxt:
                stuck = [(r, s) for r, s in enumerate(ranks) if s.waiting or s.chunked is not None]
                if stuck:
                    rank, sched = stuck[0]
                    head = sched.chunked or sched.waiting[0]
                    raise EngineError(
                        f"no progress possible: request {head.req_id} waits on rank {rank} for device memory "
                        f"that no event will free ({sched.ctrl.device.free_pages} pages free, "
                        f"{sched.tree.locked_device_pages} locked)")
                break
            now = max(now, nxt)
        for sched in self.ranks:  # the passes after the end would take every storage write's ack
            sched.ctrl.release_storage_writes(now, every=True)
            sched._drain_held_releases(every=True)
        self.stats.virtual_end_ns = now
        return self.stats

    # --- arrival and leaving -----------------------------------------------------------------
    def _arrive(self, t: TraceRequest, now: int, trace_ns: int, think_ms: float | None) -> None:
        ps = self.ps
        # (each field of the trace's request read once: a generic attribute read each)
        input_len: int = t.input_len
        session: str | None = t.session
        # The page keys as a rank's own arrival makes them (`Scheduler._page_keys`: the data
        # plane's C for a hash_ids request, page_keys_array otherwise, which raises what it
        # raises; every rank has the deployment's page and block size). page_keys_array called
        # here was three interpreted frames, ~8,600 instructions an arrival, where a --dp 1
        # replay took the C path (issue 41 session 37).
        keys_np, keys = self.keys_of._page_keys(t)
        # The router's keys and the peeks': a key run (array('q'), two memcpys), not a list of an
        # int object a page (~21,000 instructions an arrival, callgrind, conversation trace): the
        # router reads a few keys of it a rank (the first of each run on its path) and lists only
        # the pages it adds, and a run's compare with a tree node's keys is the data plane's C
        # where a list went to the Python reference. The rank's request keeps its own int64 run
        # of `keys_np` (`Scheduler._arrive`: one memcpy), which its finish grows with the output
        # pages' keys; this one is never grown (no policy's `on_finish` reads `page_keys`).
        # (tuple.__new__ as NamedTuple._make does, here and for Route: the generated __new__, or
        # _make, is an interpreted frame, ~2,500 instructions a request each, callgrind)
        view: RequestView = _new_tuple(RequestView, (t.req_id, keys, input_len, ps, session))
        # What each rank really holds of the prefix it could reuse (the scheduler matches at most
        # the pages before the last input token), asked before routing and without side effect.
        matchable = keys[:max(0, min(len(keys), (input_len - 1) // ps))]
        held = [sched.tree.peek(matchable) for sched in self.ranks]
        gateway = self.gateway
        in_flight = gateway.in_flight
        # RouteDecision's fields in order, read by position (a plain tuple where cache_aware's head
        # decided: no RouteDecision built, no field read by name; routing/gateway.py)
        decision: tuple = gateway.route_fields(view, now)
        # (an int: the rank's scheduler taken from the typed list and its _arrive called natively)
        rank: int = decision[0]
        self.in_flight[t.seq] = (rank, view)
        if session is not None:
            self.session_rank[session] = rank
        best = rank
        own_d, own_h = held[rank]
        best_total = own_d + own_h
        for r, (d, h) in enumerate(held):
            if d + h > best_total:
                best, best_total = r, d + h
        # (the data plane's C where compiled: ~45,000 instructions an arrival at --dp 8 in f-strings)
        text = ranks_json(held, in_flight, decision[6], ps)  # (RouteDecision.scores)
        best_d, best_h = held[best]
        # Route's fields in order (records.py reads them by position), built as _make builds it;
        # RouteDecision's branch, reason, score and score_name first
        route: Route = _new_tuple(Route, (decision[2], decision[3], decision[4], decision[5],
                                          own_d * ps, own_h * ps, best, best_d * ps, best_h * ps, text))
        self.ranks[rank]._arrive(t, now, trace_ns, think_ms, keys_np, route)

    def _leave(self, req: Req, now: int) -> None:
        """A request left its rank (finished, or rejected there): the gateway stops counting it."""
        in_flight = self.in_flight
        seq = req.seq
        # (get and del: native dict calls; pop with a default was a generic method call, ~400
        # instructions a request at --dp 8)
        entry = in_flight.get(seq)
        if entry is not None:
            del in_flight[seq]
            rank, view = entry
            self.gateway.finish(rank, view, now)

    def _drop_turn(self, t: TraceRequest, now: int, trace_ns: int) -> None:
        """A turn of a session that ended (closed loop): never routed, recorded as rejected on
        the rank that served the session's last turn."""
        self.ranks[self.session_rank.get(t.session, 0)]._drop_turn(t, now, trace_ns)
