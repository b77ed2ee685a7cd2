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
    """Run SGLang's storage thread functions until every queue they read is empty. Returns the
    number of thread-function runs (0: nothing was queued)."""
    NOW["ns"] = now_ns
    HELD["pass"] = False
    ctrl = controller(tree)
    if ctrl is None:
        return 0
    # the byte layer's stand-in (sglang0523.py): the host pool is a plain CPU tensor, and the
    # file backend's read buffer (`get_dummy_flat_data_page`) must not ask for pinned memory
    ctrl.storage_host_pool.pin_memory = False
    runs = 0
    stop = ctrl.storage_stop_event
    try:
        while True:
            busy = [(f, q) for f, q in THREADS if not getattr(ctrl, q).empty()]
            if not busy:
                return runs
            for func, qname in busy:
                ctrl.storage_stop_event = _UntilEmpty(getattr(ctrl, qname))
                getattr(ctrl, func)()
                runs += 1
    finally:
        ctrl.storage_stop_event = stop


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


def server_args(spec: dict) -> tuple[dict, str | None]:
    """ServerArgs fields for the workload's storage tier (the file backend in a fresh temporary
    folder; SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR names it), and the folder."""
    policy = spec.get("prefetch_policy")
    if not spec.get("storage"):
        return {}, None
    folder = tempfile.mkdtemp(prefix="tierdiag-hicache-")
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
    return out
