"""SGLang 0.5.23's storage work, seen a scheduling pass at a time (rule `storage_acks_per_pass`),
narrated. Found by the scheduler harness's storage tier (issue 43; tests/sglang/sglang0523_storage.py,
`stored` workloads): SGLang's storage threads answer between passes, and the scheduler thread
takes their answers only in a pass's drain (`check_hicache_events` ->
`_drain_storage_control_queues_impl`), which counts what is queued before it acts.

The engine here prices storage at 0 ns, as the harness does, so that only the passes decide.
"""

from __future__ import annotations

from tests.engine import helpers
from tests.engine.helpers import PS, req
from tierdiag.engine.engine import Engine
from tierdiag.engine.request import Req
from tierdiag.engine.rules import RULE_SETS
from tierdiag.trace.pages import page_keys_array


def _engine(tmp_path, policy: str, **kw) -> Engine:
    return helpers.storage_engine(tmp_path, policy, prefetch_policy=policy, **kw)


def _polls(engine: Engine, rid: str) -> list[tuple[int, str]]:
    """(pass, what the admission loop did with `rid`) for each pass that reached it."""
    s = engine.scheduler
    seen = []
    holds, finish = s._prefetch_holds, s._finish_prefetch

    def held(r, now):
        out = holds(r, now)
        if r.req_id == rid:
            seen.append((s.prefetch_pass, "held" if out else "polled"))
        return out

    def finished(r, now, acked=False):
        if r.req_id == rid:  # a drain's (acked) runs before the pass is counted
            seen.append((s.prefetch_pass + acked, "inserted at the drain" if acked else "finished"))
        return finish(r, now, acked=acked)

    s._prefetch_holds, s._finish_prefetch = held, finished
    return seen


@helpers.patches_the_engine  # wraps the scheduler's _prefetch_holds/_finish_prefetch
def test_a_read_is_seen_at_the_pass_after_its_hit_is_allocated(tmp_path):
    """`_drain_storage_control_queues_impl(n_storage_hit, n_ack_prefetch, ...)`: the counts come
    from `_sync_hicache_ready_counts` before the drain; `_drain_and_alloc_storage_hit` then
    allocates the hit and queues its read (`prefetch_buffer`), whose acks (`prefetch_sync_queue`
    -> `ack_prefetch_queue`) this drain did not count: `_drain_ack_prefetch` takes them at the next
    pass, and only then does `operation.completed_tokens` move. r arrives into an idle engine:
    its query runs at the first pass (`_add_request_to_queue` -> `_prefetch_kvcache`, before
    `get_next_batch_to_run`), the drain allocates its 8-page hit; under wait_complete
    `check_prefetch_progress` holds it (`_can_terminate_prefetch` False) and the loop passes again
    at once, whose drain takes the read's acks and inserts its pages (`_drain_ack_prefetch` ->
    `_handle_prefetch_result`); r is admitted and loads them back."""
    engine = _engine(tmp_path, "wait_complete")
    t = req("r", 0, list(range(1, 9)))
    helpers.store_input_pages(engine, t)
    seen = _polls(engine, "r")
    engine.run(helpers.numbered([t]))
    assert seen == [(1, "held"), (2, "inserted at the drain")]
    r = engine.probe.records["r"]
    assert (r.storage_hit_tokens, r.device_hit_tokens) == (8 * PS, 0)
    assert r.queue_ns == 0  # both passes at its arrival: storage costs no time here
    engine.check_invariants(idle=True)


@helpers.patches_the_engine  # wraps the scheduler's _prefetch_holds/_finish_prefetch
def test_best_effort_polled_before_the_read_is_seen_gets_nothing(tmp_path):
    """`check_prefetch_progress` under best_effort: `_can_terminate_prefetch` is True at once;
    `terminate_prefetch` then `_handle_prefetch_result(operation)` with `completed_tokens` 0 (no
    ack drained yet): nothing is inserted, the host memory is released. r, polled at the pass
    its hit was allocated, computes its whole input."""
    engine = _engine(tmp_path, "best_effort")
    t = req("r", 0, list(range(1, 9)))
    helpers.store_input_pages(engine, t)
    seen = _polls(engine, "r")
    engine.run(helpers.numbered([t]))
    assert seen == [(1, "polled"), (1, "finished")]  # not held: it ends at once
    r = engine.probe.records["r"]
    assert (r.storage_hit_tokens, r.storage_skipped_reason) == (0, "prefetch_incomplete")
    assert r.computed_tokens == t.input_len
    engine.check_invariants(idle=True)


def test_a_miss_holds_its_span_until_the_drain(tmp_path):
    """`prefetch_from_storage`: `prefetch_tokens_occupied += len(prefetch_key)` when the query is
    issued, before storage answers; a miss gives it back at the drain
    (`revoke_pending_prefetch`), so queries issued before that drain see it against the
    in-flight limit (`prefetch_rate_limited`)."""
    engine = _engine(tmp_path, "wait_complete")
    s = engine.scheduler
    t = req("m", 0, list(range(50, 58)))  # nothing stored: a miss
    r = Req(t, 0)
    r.keys_np = page_keys_array(t, page_size=PS, block_size=PS)
    r.keys = r.keys_np.tolist()
    r.max_match_pages = 8
    s._start_prefetch(r, 0)
    assert r.prefetch is None and s.prefetch_tokens_occupied == 8 * PS == s.query_occupied
    s.drain_prefetch_queries(0)
    assert s.prefetch_tokens_occupied == 0 == s.query_occupied


@helpers.patches_the_engine  # wraps the controller's _storage_after_ack/_write_storage
def test_a_storage_write_starts_at_the_host_copys_ack_and_holds_it_a_pass(tmp_path, monkeypatch):
    """`writing_check` -> `_finish_write_through_ack` -> `write_backup_storage`: a node goes to
    storage once its host copy is acknowledged, and `inc_host_lock_ref` keeps its host copy
    until `_drain_backup` takes the storage write's ack, at the pass after (the backup thread
    writes between them). a's prompt is backed up at its prefill's end; its write is in the tier,
    and its host copy free, from the drain of the pass after the one that acknowledged the copy.
    0.5.9 writes at the backup and holds nothing."""
    engine = _engine(tmp_path, "wait_complete")
    s, ctrl = engine.scheduler, engine.ctrl
    acked, written = [], []
    after_ack, write = ctrl._storage_after_ack, ctrl._write_storage

    def on_ack(node, cause, *rest):  # (passes, and the pass an ack batch read once)
        after_ack(node, cause, *rest)
        acked.append((s.prefetch_pass, node.host_ref))

    def on_write(node, cause, now, start=-1, end=-1):
        written.append((s.prefetch_pass + 1, node.host_ref))  # the pass the drain belongs to
        write(node, cause, now, start, end)

    monkeypatch.setattr(ctrl, "_storage_after_ack", on_ack)
    monkeypatch.setattr(ctrl, "_write_storage", on_write)
    engine.run(helpers.numbered([req("a", 0, list(range(1, 9)), output=8)]))
    assert acked and len(written) == len(acked)
    assert all(h == 1 for _, h in acked) and all(h == 1 for _, h in written)  # protected until written
    assert [p for p, _ in written] == [p + 2 for p, _ in acked]
    engine.check_invariants(idle=True)
    assert RULE_SETS["0.5.23"].storage_acks_per_pass and not RULE_SETS["0.5.9"].storage_acks_per_pass
