"""SGLang 0.5.23's storage I/O on the virtual clock, narrated (rule `storage_acks_per_pass`).
Found by the scheduler harness with storage that takes time (issue 43;
tests/sglang/sglang0523_storage.py `_Timed`, scheduler_harness.timed_storage_cases): SGLang's
storage threads move a read or a write in batches of STORAGE_BATCH_SIZE (128) pages, one backend
call each (`HiCacheController._page_transfer`, `_page_backup`), a read acknowledged batch by
batch (`PrefetchAck(completed_tokens=...)`), reads in `prefetch_io_aux_func`, writes in
`backup_thread_func`: two threads, each one operation at a time.
"""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine import helpers
from tests.engine.helpers import PS, req
from tierdiag.engine.costmodel import STORAGE_BATCH_PAGES
from tierdiag.engine.engine import Engine
from tierdiag.engine.controller import CallClock


def _cost():
    return Engine(helpers.small_config(verify="off")).cost


@settings(max_examples=60, deadline=None)
@given(pages=st.integers(min_value=0, max_value=2000), page_bytes=st.integers(min_value=0, max_value=1 << 30),
       elapsed=st.integers(min_value=-(1 << 40), max_value=1 << 40))
def test_a_storage_operation_is_its_batches_one_after_another(pages, page_bytes, elapsed):
    """`_page_transfer` / `_page_backup`: `for i in range(0, len(hash_value), STORAGE_BATCH_SIZE)`,
    one `batch_get` / `batch_set` each, in turn. A read's acknowledged pages
    (`_drain_ack_prefetch` -> `operation.completed_tokens`) are the whole batches ended by then:
    never more than the read, never fewer as time goes on, all of it at its end."""
    cost = _cost()
    ends = cost.storage_batch_ends(pages, page_bytes)
    assert len(ends) == max(1, -(-pages // STORAGE_BATCH_PAGES))
    assert all(b > a for a, b in zip(ends, ends[1:]))
    assert ends[-1] == cost.storage_io_ns(pages, page_bytes)
    if pages <= STORAGE_BATCH_PAGES:  # one batch: the engine's one-call price
        assert ends == [cost.storage_ns(pages * page_bytes)]
    done = cost.storage_pages_done(pages, page_bytes, elapsed)
    assert 0 <= done <= pages
    assert done == pages or done % STORAGE_BATCH_PAGES == 0
    assert done <= cost.storage_pages_done(pages, page_bytes, max(elapsed, 0) + 1)
    assert cost.storage_pages_done(pages, page_bytes, ends[-1]) == pages
    assert cost.storage_pages_done(pages, page_bytes, ends[0] - 1) == 0


def test_a_read_cut_short_gives_its_host_slots_back_after_the_drain_after_its_last_ack(tmp_path):
    """`check_prefetch_progress` -> `terminate_prefetch` while the read is in flight:
    `_handle_prefetch_result` owns only `host_indices[:completed_tokens]`; the read thread stops
    at the end of its batch in progress (`_page_transfer` checks `is_terminated` between
    batches), and its last ack (`completed_req`) hands the rest back
    (`_drain_ack_prefetch` -> `append_host_mem_release`), which `_drain_release` frees at the
    drain after (its count is taken before the acks are drained). Until then those host slots
    are in use: a hit allocated meanwhile finds less room."""
    engine = Engine(helpers.small_config(storage_tokens=128 * PS, prefetch_threshold=PS,
                                         prefetch_policy="best_effort", storage_dir=str(tmp_path / "t"),
                                         verify="off"), probe=helpers.Collect())
    ctrl = engine.ctrl
    calls = []

    class Passes:  # the pass count: the events' calls so far (a pass each)
        @property
        def prefetch_pass(self) -> int:
            return len(calls)

    ctrl.pass_owner = Passes()
    ctrl.clock = CallClock(lambda t, fn, arg: calls.append(("wake", t)))
    slots = ctrl.host.alloc(8)
    free = ctrl.host.free_pages
    ctrl.hold_prefetch_tail(slots, 1_000)
    assert calls == [("wake", 1_000)]  # the event loop passes when the read stops
    ctrl.free_prefetch_tails(999)  # a pass before it stops: nothing
    ctrl.free_prefetch_tails(1_000)  # its last ack drained: released to the queue, not yet freed
    assert ctrl.host.free_pages == free and len(ctrl.prefetch_tails) == 1
    calls.append("pass")
    ctrl.free_prefetch_tails(1_000)  # the drain after: freed
    assert ctrl.host.free_pages == free + 8 and not ctrl.prefetch_tails


def test_best_effort_cuts_a_read_in_flight_and_nothing_leaks(tmp_path):
    """best_effort at the pass that allocated the hit (`_can_terminate_prefetch` True at once):
    the read has started (SGLang's read thread takes it as the drain queues it), so its one batch
    runs to its end, and only then are its host slots handed back; r computes its whole input,
    and once every pass is done no host slot is left outside the tree."""
    engine = Engine(helpers.small_config(storage_tokens=128 * PS, prefetch_threshold=PS,
                                         prefetch_policy="best_effort", storage_dir=str(tmp_path / "b"),
                                         verify="off"), probe=helpers.Collect())
    t = req("r", 0, list(range(1, 9)))
    helpers.store_input_pages(engine, t)
    engine.run(helpers.numbered([t, req("s", 50, list(range(20, 24)))]))
    r = engine.probe.records["r"]
    assert (r.storage_hit_tokens, r.storage_skipped_reason) == (0, "prefetch_incomplete")
    assert r.computed_tokens == t.input_len
    assert not engine.ctrl.prefetch_tails
    engine.check_invariants(idle=True)


def test_an_idle_scheduler_still_drains_a_cut_reads_tail(tmp_path):
    """0.5.23 `Scheduler.event_loop_normal` calls `get_next_batch_to_run` every iteration, a
    batch or none, and it begins with `_process_hicache_events` -> `check_hicache_events` ->
    `drain_storage_control_queues`: with nobody waiting or running, a cut read's last ack
    (`completed_req`) is still taken when the read stops (`_drain_ack_prefetch` ->
    `append_host_mem_release`) and its tail freed by the drain after (`_drain_release`), both
    before the next request arrives. The engine ran no pass while idle, so the tail was freed
    only at the next arrival's pass and a batch formed there found that host memory still taken
    (the scheduler harness's timed100-s1-p64-fcfs-write_back-timeout-nosystem, step 16: the
    engine evicted 576 host tokens SGLang did not)."""
    engine = Engine(helpers.small_config(storage_tokens=128 * PS, prefetch_threshold=PS,
                                         prefetch_policy="timeout", storage_dir=str(tmp_path / "i"),
                                         verify="off"), probe=helpers.Collect())
    ctrl, sched = engine.ctrl, engine.scheduler
    assert sched.rules.storage_acks_per_pass
    slots = ctrl.host.alloc(8)
    free = ctrl.host.free_pages
    ctrl.hold_prefetch_tail(slots, 1_000)  # a read cut in flight, stopping at 1 us
    seen = []
    form = sched.pass_fn

    def batch(now):
        seen.append((now, ctrl.host.free_pages, len(ctrl.prefetch_tails)))
        return form(now)

    sched.pass_fn = batch
    engine.run(helpers.numbered([req("late", 1_000, list(range(1, 5)))]))
    assert seen[0][0] == 10**9  # its arrival, 1 s
    assert seen[0][1:] == (free + 8, 0)  # freed while idle, before the arrival's pass
    engine.check_invariants(idle=True)


@helpers.patches_the_engine  # wraps the controller's _write_storage
def test_a_storage_write_is_in_the_tier_from_its_end(tmp_path, monkeypatch):
    """`backup_thread_func` writes a node's pages (`_page_backup` -> `batch_set`) and only then
    puts its ack on `ack_backup_queue`: the pages are in the tier once the write has ended, and a
    pass's queries before that (`prefetch_thread_func`'s `batch_exists`) do not find them. The
    engine put them there at the pass after the write's start, before its end (docs/engine.md,
    "Storage on the clock"); now at the first pass at or after its end (the pass its ack wakes),
    never before the pass after its start. A disk slow enough that a's writes outlast a few of its
    decode steps."""
    cfg = helpers.small_config(storage_tokens=128 * PS, prefetch_threshold=PS, prefetch_policy="timeout",
                               storage_dir=str(tmp_path / "w"), verify="off")
    engine = Engine(cfg, probe=helpers.Collect())
    base = type(engine.cost)
    slow = type("SlowStorage", (base,), {"storage_ns": lambda self, num_bytes: 5_000_000})  # 5 ms a call
    cost = slow(**{f.name: getattr(engine.cost, f.name) for f in dataclasses.fields(engine.cost) if f.init})
    engine.cost = engine.ctrl.cost = engine.scheduler.cost = cost
    ctrl, s = engine.ctrl, engine.scheduler
    landed = []
    write = ctrl._write_storage

    def on_write(node, cause, now, start=-1, end=-1):
        landed.append((now, start, end, s.prefetch_pass))
        write(node, cause, now, start, end)

    monkeypatch.setattr(ctrl, "_write_storage", on_write)
    engine.run(helpers.numbered([req("a", 0, list(range(1, 9)), output=64), req("b", 500, list(range(20, 24)))]))
    timed = [(now, start, end) for now, start, end, _ in landed if start >= 0]
    assert timed and all(end - start == 5_000_000 for _, start, end in timed)
    assert all(now >= end for now, _, end in timed)  # in the tier from its end, not before
    engine.check_invariants(idle=True)
