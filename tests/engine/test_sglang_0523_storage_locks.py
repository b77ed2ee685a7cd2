"""SGLang 0.5.23's host locks and host memory around a storage query, narrated (rule
`storage_acks_per_pass`). Found by issue 43's driver (`python -m tests.sglang.drive`), where
`HybridCacheController.allocate_storage_hit` -> `evict_host(hit_tokens)` freed nothing on host and
the engine evicted: agent sessions seed 2 with storage behind pools of 3,072 tokens (a miss's
anchor, still host-locked), and demo.jsonl[:40] under best_effort (a prefetch ended before its
read's ack, whose host slots SGLang frees only two drains later). A host node SGLang's eviction
walk can take is `UnifiedTreeCore._is_host_leaf`: evicted, backed up, no children, and
`host_lock_ref` and `lock_ref` both 0.
"""

from __future__ import annotations

from tests.engine import helpers
from tests.engine.helpers import PS, req
from tierdiag.engine.engine import Engine, check_rank


def _engine(tmp_path, policy: str) -> Engine:
    engine = helpers.storage_engine(tmp_path, policy, prefetch_policy=policy)
    assert engine.scheduler.rules.storage_acks_per_pass  # 0.5.23's rule set, the default
    return engine


_queued = helpers.queued_req


def _missing_request_with_host_leaf(engine: Engine):
    """A request whose first 4 pages are on device (backed up), the next 2 a host-only leaf, and
    the rest nowhere (storage holds none of it: its query is a miss)."""
    ctrl, tree = engine.ctrl, engine.scheduler.tree
    r = _queued(req("m", 0, list(range(1, 11))))
    dev = ctrl.device.alloc(4)
    ctrl.write_computed(dev, r.keys[:4])
    node = tree.insert(r.keys[:4], 0, dev, 0).last
    tree.set_host(node, ctrl.host.alloc(4))
    leaf = tree.insert_host(node, r.keys[4:6], ctrl.host.alloc(2), 0, None)
    assert leaf.device is None and not leaf.children and tree.host_evictable(leaf)
    return r, leaf


def test_a_miss_keeps_its_anchor_host_locked_until_the_drain(tmp_path):
    """`UnifiedRadixCache.prefetch_from_storage`: once a lookup is issued (the requested span at
    least `prefetch_threshold`, not rate-limited), `inc_host_lock_ref(last_host_node_id)` pins the
    anchor before storage answers; a miss unlocks it only at the drain
    (`_drain_and_alloc_storage_hit`: below the threshold -> `revoke_pending_prefetch` ->
    `_retire_ongoing_prefetch` -> `dec_host_lock_ref`), in query order among the hits that drain
    allocates. Meanwhile the anchor is no `_is_host_leaf` (host_lock_ref > 0): another request's
    `allocate_storage_hit` -> `evict_host` cannot take it. The engine let it go at the query."""
    engine = _engine(tmp_path, "timeout")
    s, tree, ctrl = engine.scheduler, engine.scheduler.tree, engine.ctrl
    r, leaf = _missing_request_with_host_leaf(engine)
    s._start_prefetch(r, 0)
    assert r.prefetch is None and s.query_occupied == 4 * PS  # a miss, its span held
    assert leaf.host_ref == 1 and not tree.host_evictable(leaf)
    ctrl.evict_host(ctrl.host.capacity, None, 0)  # as much host memory as there is: not the anchor
    assert leaf.host is not None and leaf.parent is not None
    s.drain_prefetch_queries(0)
    assert leaf.host_ref == 0 and tree.host_evictable(leaf)
    assert s.query_occupied == 0 == s.prefetch_tokens_occupied
    check_rank(engine.ctrl.device, engine.ctrl.host, engine.scheduler.tree)  # (r is in no queue)


def test_best_effort_ending_a_missing_query_unlocks_its_anchor(tmp_path):
    """best_effort at the admission poll while the miss's query is in flight
    (`check_prefetch_progress`: `terminate_prefetch`, no host memory -> `poll_miss`,
    `revoke_pending_prefetch`): the anchor is unlocked at once; the span the query holds is the
    drain's to give back, as for any miss."""
    engine = _engine(tmp_path, "best_effort")
    s, tree = engine.scheduler, engine.scheduler.tree
    r, leaf = _missing_request_with_host_leaf(engine)
    s._start_prefetch(r, 0)
    assert leaf.host_ref == 1 and r in s.unallocated and r.query_anchor is leaf
    s._revoke_query(r)
    assert leaf.host_ref == 0 and tree.host_evictable(leaf) and r not in s.unallocated and r.query_anchor is None
    assert s.prefetch_tokens_occupied == 4 * PS == s.query_occupied
    s.drain_prefetch_queries(0)
    assert s.prefetch_tokens_occupied == 0
    check_rank(engine.ctrl.device, engine.ctrl.host, engine.scheduler.tree)  # (r is in no queue)


def test_a_prefetch_ended_before_its_ack_frees_its_host_memory_two_drains_later(tmp_path):
    """`check_prefetch_progress` under best_effort before the read's ack: `terminate_prefetch`,
    then `_handle_prefetch_result` with `completed_tokens` 0 inserts nothing and frees nothing
    (it owns only `host_indices[0:completed_tokens]`). The IO thread acks the terminated read
    (`prefetch_io_aux_func`: `PrefetchAck(completed_req=True)`); the next pass's drain takes that
    ack (`_drain_ack_prefetch`: `ack_releases_incomplete_host_indices` ->
    `append_host_mem_release(host_indices[completed_tokens:])`) and the drain after it frees the
    slots (`_drain_release`, whose count `drain_storage_control_queues` took at the drain's
    start). Until then an `allocate_storage_hit` or a backup finds that much less host memory."""
    engine = _engine(tmp_path, "best_effort")
    s, host = engine.scheduler, engine.ctrl.host
    t = req("r", 0, list(range(1, 9)))
    helpers.store_input_pages(engine, t)
    r = _queued(t)
    s._start_prefetch(r, 0)
    s.drain_prefetch_queries(0)  # pass 1's drain: the 8-page hit's host memory, its read queued
    assert r.prefetch is not None and r.prefetch_ack_pass == 2
    free = host.free_pages
    s._finish_prefetch(r, 0)  # pass 1's admission poll: best_effort ends it, no ack drained
    assert r.prefetch is None and host.free_pages == free  # nothing inserted, nothing freed
    s.prefetch_pass = 1
    s._drain_held_releases()  # pass 2's drain takes the read's ack: the release is queued
    assert host.free_pages == free
    s.prefetch_pass = 2
    s._drain_held_releases()  # pass 3's drain frees it
    assert host.free_pages == free + 8 and s.held_releases == []
    check_rank(engine.ctrl.device, engine.ctrl.host, engine.scheduler.tree)  # (r is in no queue)


def _evict_from_storage(engine: Engine, keep_out: list) -> None:
    """Write fresh pages until none of `keep_out` is left in the bounded tier (its LRU)."""
    storage, host = engine.ctrl.storage, engine.ctrl.host
    fresh = 10_000_000
    while storage.hits(keep_out[:1], 0):
        slots = host.alloc(8).tolist()  # (the storage tier takes slot lists)
        storage.write_from(host.array, slots, list(range(fresh, fresh + 8)), rows=host.rows)
        host.free(slots)
        fresh += 8


def test_a_hit_the_tier_evicted_before_the_drain_is_read_as_far_as_it_is_there(tmp_path):
    """The engine's storage tier is bounded (LRU by page; SGLang's file backend is not, a
    Mooncake store is): between a query that counted a hit and the drain that allocates it
    (`_drain_and_alloc_storage_hit`, the next pass), a storage write landing may evict the hit's
    pages. The read gets the run still there, as a backend's get failing mid-read stops SGLang's
    `_page_transfer` there; none left is a miss (the anchor unlocked, the span given back).
    Found by tests/reliability/test_engine_random.py (a 128-token tier): the read asked the tier
    for pages it no longer had (KeyError)."""
    engine = _engine(tmp_path, "timeout")
    s = engine.scheduler
    t = req("r", 0, list(range(1, 9)))
    helpers.store_input_pages(engine, t)
    r = _queued(t)
    s._start_prefetch(r, 0)
    assert r in s.unallocated and r.query_hits > 0  # a hit, counted at the query
    _evict_from_storage(engine, r.keys)
    s.drain_prefetch_queries(0)
    assert r.prefetch is None and r.seq not in s.reading  # a miss now: no read
    assert s.prefetch_tokens_occupied == 0  # the span given back
    check_rank(engine.ctrl.device, engine.ctrl.host, engine.scheduler.tree)
