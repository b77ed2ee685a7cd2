"""SGLang 0.5.23's HiCache storage tier (L3), run deterministically beside the virtual clock
(worker side of the scheduler harness; sglang0523_scheduler.py imports it).

SGLang moves storage pages in four controller threads fed by queues
(`HiCacheController._start_storage_threads`): `prefetch_thread_func` (the existence query:
prefetch_queue -> prefetch_hit_queue), `prefetch_io_aux_func` (the read into host memory:
prefetch_buffer -> prefetch_sync_queue), `prefetch_sync_thread_func` (the rank reduction:
prefetch_sync_queue -> ack_prefetch_queue) and `backup_thread_func` (host -> storage writes:
backup_queue -> ack_backup_queue). The scheduler thread drains the ack queues at each pass
(`check_hicache_events` -> `_drain_storage_control_queues_impl`, counts taken first).

What is SGLang's here: every one of those functions, the queues, the file backend
(`HiCacheFile`, in a temporary folder of its own per workload), `prefetch_from_storage`,
`check_prefetch_progress`, the drains, the re-queries (`StoragePrefetchRetries`), the
`timeout` / `wait_complete` / `best_effort` stop policies. What the harness replaces:
- the threads are created by SGLang's `_start_storage_threads` but never started;
- `pump` runs each thread function itself, in this thread, until its input queue is empty
  (the function's loop ends because `storage_stop_event.is_set()` answers "my queue is
  empty" for the call: `_UntilEmpty`), repeating until every storage queue a thread reads
  is empty: the threads quiescent. `run_workload` pumps once before each scheduling pass
  (after the pass's arrivals are handed in): storage I/O takes no virtual time and is done
  by the next pass, never inside one (SGLang's drain counts the acks before it allocates a
  hit's host memory and starts its read, so a read started in a pass is seen at the next);
- `PollTimer` (the `timeout` policy's clock, `time.perf_counter`) reads the virtual clock;
- the host pool's `pin_memory` is off (no accelerator: the file backend's read buffer,
  `get_dummy_flat_data_page`, would ask for pinned memory).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import types
from collections import deque
from queue import Queue

from sglang.srt.managers import cache_controller as cc_mod
from sglang.srt.managers import scheduler as S
from sglang.srt.mem_cache import unified_radix_cache as urc
from sglang.srt.utils import poll_timer

NOW = {"ns": 0}  # the virtual clock, as the harness last set it (pump)
poll_timer.time = types.SimpleNamespace(perf_counter=lambda: NOW["ns"] / 1e9)

# (thread function, the queue it reads), in the order data flows through them
THREADS = (("prefetch_thread_func", "prefetch_queue"), ("prefetch_io_aux_func", "prefetch_buffer"),
           ("prefetch_sync_thread_func", "prefetch_sync_queue"), ("backup_thread_func", "backup_queue"))
# what the scheduler thread drains (a pass is due while one of these holds something)
ACK_QUEUES = ("prefetch_hit_queue", "ack_prefetch_queue", "ack_backup_queue", "host_mem_release_queue")


class _NotStarted(threading.Thread):
    """A storage thread `_start_storage_threads` creates: never started (`pump` runs its target)."""

    def start(self):
        return None


class _ThreadingShim(types.SimpleNamespace):
    pass


_SHIM = _ThreadingShim(Thread=_NotStarted, Event=threading.Event, Lock=threading.Lock)
_orig_start_storage_threads = cc_mod.HiCacheController._start_storage_threads


def _start_storage_threads(self):
    """SGLang's `_start_storage_threads` (queues and Thread objects as it makes them), its
    threads left unstarted."""
    real = cc_mod.threading
    cc_mod.threading = _SHIM
    try:
        return _orig_start_storage_threads(self)
    finally:
        cc_mod.threading = real


cc_mod.HiCacheController._start_storage_threads = _start_storage_threads


class _UntilEmpty:
    """`storage_stop_event` for one synchronous run of a thread function: "set" once the queue
    that function reads is empty, so its `while not stop.is_set()` loop drains the queue and
    returns (its `get(block=True, timeout=1)` never waits: the queue holds an item)."""

    def __init__(self, queue: Queue):
        self.queue = queue

    def is_set(self) -> bool:
        return self.queue.empty()

    def set(self):
        return None

    def clear(self):
        return None


def controller(tree):
    ctrl = getattr(tree, "cache_controller", None)
    if ctrl is None or not getattr(ctrl, "enable_storage", False):
        return None
    return ctrl


def pump(tree, now_ns: int) -> int:
    """Run SGLang's storage thread functions until every queue they read is empty (instant
    storage), or, with `TIMING` set, as far as the virtual clock has come (`_Timed`). Returns the
    number of thread-function runs (0: nothing was queued)."""
    NOW["ns"] = now_ns
    HELD["pass"] = False
    ctrl = controller(tree)
    if ctrl is None:
        return 0
    # the byte layer's stand-in (sglang0523.py): the host pool is a plain CPU tensor, and the
    # file backend's read buffer (`get_dummy_flat_data_page`) must not ask for pinned memory
    ctrl.storage_host_pool.pin_memory = False
    if TIMING["cost"] is not None:
        ctrl._harness_tree = tree
        return _timed(ctrl).advance(now_ns)
    runs = 0
    while True:
        # the writes queued at an earlier pass first: they land before this pass's queries
        # (as they do on the clock, `_Timed`: a write started at an earlier pass has ended)
        busy = [(f, q) for f, q in THREADS[3:] + THREADS[:3] if not getattr(ctrl, q).empty()]
        if not busy:
            return runs
        for func, qname in busy:
            runs += _run_thread(ctrl, func, getattr(ctrl, qname))


def _run_thread(ctrl, func: str, queue: Queue) -> int:
    """One synchronous run of SGLang's thread function `func` over what `queue` holds."""
    stop = ctrl.storage_stop_event
    ctrl.storage_stop_event = _UntilEmpty(queue)
    try:
        getattr(ctrl, func)()
    finally:
        ctrl.storage_stop_event = stop
    return 1


def _run_one(ctrl, func: str, qname: str, op) -> int:
    """SGLang's thread function `func` on the one operation `op`, as if its queue `qname` held
    only that."""
    real = getattr(ctrl, qname)
    one = Queue()
    one.put(op)
    setattr(ctrl, qname, one)
    try:
        return _run_thread(ctrl, func, one)
    finally:
        setattr(ctrl, qname, real)


# --- storage that takes virtual time ---------------------------------------------------------------
# The engine's cost model (the worker's Pricer gives it: `timed_by`): a read or a write of N pages is
# SGLang's batches of STORAGE_BATCH_SIZE pages (one backend call each: `_page_transfer`,
# `_page_backup`), each priced `storage_ns(pages * page_bytes)`, one after another.
TIMING = {"cost": None, "page_bytes": 0}


def timed_by(cost, page_bytes: int) -> None:
    """Storage I/O priced by the engine's cost model from now on (None: instant, `pump`)."""
    TIMING["cost"], TIMING["page_bytes"] = cost, page_bytes


def batch_ends(pages: int) -> list[int]:
    """The ends of a storage operation's batches, from its start (ns): one a STORAGE_BATCH_SIZE
    pages (`_page_transfer` / `_page_backup` loop over them; the engine's
    CostModel.storage_batch_ends prices them the same)."""
    return TIMING["cost"].storage_batch_ends(pages, TIMING["page_bytes"])


class _Thread:
    """One of SGLang's storage I/O threads on the virtual clock: the operations its queue was
    given (each stamped with the time it was put there), one at a time, each from
    max(its enqueue, the end of the one before)."""

    def __init__(self):
        self.free_ns = 0
        self.ops: deque = deque()
        self.busy = None  # the operation running: [op, [[t, ack], ...]] (reads) or [op, end] (writes)


class _Timed:
    """SGLang's four storage threads on the virtual clock, for one controller.

    - `backup_thread_func` (writes): an operation runs at its end (its pages written to the file
      backend, its ack put on `ack_backup_queue`); the writes that have ended by a pass land
      before its queries;
    - `prefetch_thread_func` (the existence query) and `prefetch_sync_thread_func` (the rank
      reduction): instant, as the engine's query is;
    - `prefetch_io_aux_func` (reads): SGLang's function runs on the operation at its start (the
      pages read into the host slots it was given), and the acks it puts on
      `prefetch_sync_queue` are held: each batch's (`completed_tokens`) until that batch's
      end, the last (`completed_req`) until the read's end. A read terminated while it runs
      (`terminate_prefetch`: the stop policy, or best_effort at once) stops at the end of the
      batch in progress (`_page_transfer` checks `is_terminated` between batches, the file
      backend's `_generic_page_get` between pages after its batch read): its later acks come
      then, counting only the batches done before the termination, and the next read starts.
    """

    def __init__(self, ctrl):
        self.ctrl = ctrl
        self.reader, self.writer = _Thread(), _Thread()
        # reads terminated in flight (`_cut`), and those of them that kept some batches
        self.cut = {"reads_cut": 0, "partial_reads": 0}
        for name in ("prefetch_buffer", "backup_queue"):
            _stamp(getattr(ctrl, name))
        orig = ctrl.terminate_prefetch

        def terminate_prefetch(operation):
            if getattr(operation, "_harness_terminated", None) is None:
                operation._harness_terminated = NOW["ns"]
            return orig(operation)

        ctrl.terminate_prefetch = terminate_prefetch

    def advance(self, now: int) -> int:
        ctrl = self.ctrl
        runs = self._writes(now)
        if not ctrl.prefetch_queue.empty():
            runs += _run_thread(ctrl, "prefetch_thread_func", ctrl.prefetch_queue)
        runs += self._reads(now)
        if not ctrl.prefetch_sync_queue.empty():
            runs += _run_thread(ctrl, "prefetch_sync_thread_func", ctrl.prefetch_sync_queue)
        return runs

    def wake_ns(self, now: int) -> int | None:
        """The next time a pass would find something new from these threads (None: nothing to
        come): a write's end, a read's next ack, a queued read's start, a `timeout` wait's end."""
        ctrl, r, w = self.ctrl, self.reader, self.writer
        _take(ctrl.backup_queue, w.ops)
        _take(ctrl.prefetch_buffer, r.ops)
        times = []
        if w.busy is not None:
            times.append(w.busy[1])
        elif w.ops:
            op = w.ops[0]
            times.append(max(op._harness_enqueued, w.free_ns) + batch_ends(len(op.hash_value or ()))[-1])
        if r.busy is not None and r.busy[1]:
            times.append(r.busy[1][0][0])
        elif r.ops:  # its first ack
            op = r.ops[0]
            times.append(max(op._harness_enqueued, r.free_ns) + batch_ends(len(op.hash_value or ()))[0])
        for wait in getattr(ctrl, "_harness_tree")._storage_prefetch_wait.values():
            if wait.timer.running and not wait.expired:
                # `_prefetch_deadline_expired`: elapsed() > timeout_s, on the virtual clock
                times.append(round(wait.timer.started_at * 1e9) + int(wait.timeout_s * 1e9) + 1)
        return min((t for t in times if t >= now), default=None)

    def _writes(self, now: int) -> int:
        ctrl, w = self.ctrl, self.writer
        _take(ctrl.backup_queue, w.ops)
        runs = 0
        while True:
            if w.busy is None:
                if not w.ops:
                    return runs
                op = w.ops[0]
                start = max(op._harness_enqueued, w.free_ns)
                ends = batch_ends(len(op.hash_value or ()))
                w.busy = [op, start + (ends[-1] if ends else 0)]
                w.ops.popleft()
            op, end = w.busy
            if end > now:
                return runs
            runs += _run_one(ctrl, "backup_thread_func", "backup_queue", op)
            w.free_ns = end
            w.busy = None

    def _reads(self, now: int) -> int:
        ctrl, r = self.ctrl, self.reader
        _take(ctrl.prefetch_buffer, r.ops)
        runs = 0
        while True:
            if r.busy is None:
                if not r.ops:
                    return runs
                op = r.ops[0]
                start = max(op._harness_enqueued, r.free_ns)
                if start > now:
                    return runs
                r.ops.popleft()
                r.busy = [op, self._run_read(op, start), 0]
                runs += 1
            op, acks, done = r.busy
            term = getattr(op, "_harness_terminated", None)
            if term is not None and acks and acks[-1][0] > term:
                _cut(acks, term, done)
                self.cut["reads_cut"] += 1
                self.cut["partial_reads"] += 1 if done else 0
            while acks and acks[0][0] <= now:
                t, ack = acks.pop(0)
                if ack.completed_tokens is not None:
                    r.busy[2] = ack.completed_tokens
                ctrl.prefetch_sync_queue.put(ack)
                r.free_ns = t
            if acks:
                return runs
            r.busy = None

    def _run_read(self, op, start: int) -> list:
        """SGLang's `prefetch_io_aux_func` on `op`, its acks kept with the times they are due."""
        ctrl = self.ctrl
        sync = ctrl.prefetch_sync_queue
        ctrl.prefetch_sync_queue = held = Queue()
        # terminated at its start (the pass that started it polled it: best_effort): the thread
        # took it first, its batch in progress runs to its end (`_cut`); before its start: nothing
        term = getattr(op, "_harness_terminated", None)
        started = term is not None and term >= start
        if started:
            op._terminated_flag = False
        try:
            _run_one(ctrl, "prefetch_io_aux_func", "prefetch_buffer", op)
        finally:
            ctrl.prefetch_sync_queue = sync
            if started:
                op._terminated_flag = True
        acks = []
        while not held.empty():
            acks.append(held.get())
        if op.is_terminated() and not started:  # before its start: `_page_transfer` reads nothing, at once
            return [[start, a] for a in acks]
        ends = batch_ends(len(op.hash_value or ()))
        out, k = [], 0
        for a in acks:
            if a.completed_tokens is not None and not a.completed_req and k < len(ends):
                out.append([start + ends[k], a])
                k += 1
            else:  # the read's end (a sidecar ack, `completed_req`)
                out.append([start + (ends[-1] if ends else 0), a])
        return out


def _cut(acks: list, term: int, done: int) -> None:
    """A read terminated at `term`, `done` tokens acknowledged by then: the batch in progress
    ends it (its pages not counted, nor any later batch's), and every ack still to come comes
    then."""
    cut = next(t for t, _ in acks if t > term)
    for item in acks:
        if item[0] > term:
            item[0] = cut
            if item[1].completed_tokens is not None:
                item[1].completed_tokens = done


def _stamp(queue: Queue) -> None:
    """Each operation put on `queue` carries the virtual time it was put there."""
    orig = queue.put

    def put(item, *args, **kw):
        if item is not None:
            item._harness_enqueued = NOW["ns"]
        return orig(item, *args, **kw)

    queue.put = put


def _take(queue: Queue, into: deque) -> None:
    while not queue.empty():
        item = queue.get()
        if item is not None:
            into.append(item)


def wake_ns(tree, now: int) -> int | None:
    """With storage on the clock, when the next pass is due for storage: `now` while something a
    pass drains or an instant thread reads is queued, else the next time a timed thread delivers
    (`_Timed.wake_ns`). None: nothing to come, or instant storage (`held` says)."""
    ctrl = controller(tree)
    if ctrl is None:
        return None
    if TIMING["cost"] is None:
        return None
    if any(not getattr(ctrl, q).empty() for q in ACK_QUEUES + ("prefetch_queue", "prefetch_sync_queue")):
        return now
    ctrl._harness_tree = tree
    return _timed(ctrl).wake_ns(now)


def _timed(ctrl) -> _Timed:
    io = getattr(ctrl, "_harness_timed", None)
    if io is None:
        io = ctrl._harness_timed = _Timed(ctrl)
    return io


HELD = {"pass": False}  # a request was skipped for storage in this pass (the harness wakes at once)
_orig_check = urc.UnifiedRadixCache.check_prefetch_progress
_orig_hit_loss = S.Scheduler._prefetch_after_device_hit_loss


def _check_prefetch_progress(self, request):
    done = _orig_check(self, request)
    if not done:
        HELD["pass"] = True
    return done


def _prefetch_after_device_hit_loss(self, req):
    skipped = _orig_hit_loss(self, req)
    if skipped:
        HELD["pass"] = True
    return skipped


urc.UnifiedRadixCache.check_prefetch_progress = _check_prefetch_progress
S.Scheduler._prefetch_after_device_hit_loss = _prefetch_after_device_hit_loss


def held() -> bool:
    """Whether the last pass skipped a request for storage ("skip staging requests that are
    ongoing prefetch", or a re-query after its prefix shrank): SGLang's event loop passes again
    at once (the engine wakes its loop at the same instant)."""
    return HELD["pass"]


def pending(tree) -> bool:
    """Whether storage work is queued (a thread's input: pumped before the next pass) or has
    results for the scheduler thread to drain: a pass is due, at once (the event loop's next)."""
    ctrl = controller(tree)
    return ctrl is not None and any(not getattr(ctrl, q).empty()
                                    for q in ACK_QUEUES + tuple(q for _, q in THREADS))


# Where the file backend's folders go: memory (tmpfs) where the machine has it. The backend writes
# one file a page (`HiCacheFile.set`: ~70,000 files over the suite's storage workloads); on the
# disk's file system each create, write and rename cost the worker ~11 % more CPU over those
# workloads (measured: 55.7 / 57.0 s against 50.9 / 49.7 s, benchmarks/README.md, session 29).
# The backend's code is the same either way; only the folder's file system differs.
_IN_MEMORY = "/dev/shm"


def _scratch() -> str | None:
    return _IN_MEMORY if os.path.isdir(_IN_MEMORY) and os.access(_IN_MEMORY, os.W_OK | os.X_OK) else None


def server_args(spec: dict) -> tuple[dict, str | None]:
    """ServerArgs fields for the workload's storage tier (the file backend in a fresh temporary
    folder, in memory where the machine has a tmpfs; SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR
    names it), and the folder."""
    policy = spec.get("prefetch_policy")
    if not spec.get("storage"):
        return {}, None
    folder = tempfile.mkdtemp(prefix="tierdiag-hicache-", dir=_scratch())
    os.environ["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = folder
    kw = {"hicache_storage_backend": "file"}
    if policy:
        kw["hicache_storage_prefetch_policy"] = policy
    return kw, folder


def cleanup(folder: str | None) -> None:
    os.environ.pop("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


def stats(tree, folder: str | None) -> dict | None:
    """SGLang's prefetch outcome counters (`_prefetch_outcome_stats`) and the pages the file
    backend holds, for the report."""
    if controller(tree) is None:
        return None
    out = {k: int(v) for k, v in dict(getattr(tree, "_prefetch_outcome_stats", {})).items()}
    out["files"] = len(os.listdir(folder)) if folder and os.path.isdir(folder) else 0
    timed = getattr(controller(tree), "_harness_timed", None)
    if timed is not None:
        out.update(timed.cut)
    return out
