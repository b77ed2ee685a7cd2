"""SGLang 0.5.23's host memory under write_back with a storage tier, where the scheduler harness's
storage tier (tests/sglang/test_scheduler_0523.py, `stored` seed 0 at page 1, write_back,
best_effort, no system prompt) found the engine differing, and the engine bug that modelling it
exposed (the demo trace's write_back + storage replay failed its load-back verification).

The engine here prices storage at 0 ns, as the harness does.
"""

from __future__ import annotations

from types import SimpleNamespace
import json

from tests.engine import helpers
from tests.engine.helpers import PS
from tests.support.cli import invoke
from tierdiag.engine.content import verify_content, write_content
from tierdiag.engine.engine import Engine
from tierdiag.engine.rules import RULE_SETS

DEMO = "tierdiag/trace/samples/demo.jsonl"


def _engine(tmp_path, write_policy: str = "write_back", **kw) -> Engine:
    return helpers.storage_engine(tmp_path, write_policy=write_policy, **kw)


def _device_node(engine: Engine, keys: list[int], now: int):
    ctrl, tree = engine.ctrl, engine.scheduler.tree
    slots = ctrl.device.alloc(len(keys))
    ctrl.write_computed(slots, keys)
    return tree.insert(keys, 0, slots, now).last


def _host_child(engine: Engine, parent, keys: list[int], now: int):
    """A host-only node below `parent` (its pages on host only, their content written)."""
    ctrl = engine.ctrl
    slots = ctrl.host.alloc(len(keys))
    write_content(ctrl.host, slots, keys)
    return engine.scheduler.tree.insert_host(parent, keys, slots, now, None)


def _fill_host(engine: Engine) -> list[int]:
    """Every free host page taken outside the tree: a write-back finds no room, nothing to evict."""
    held = engine.ctrl.host.alloc(engine.ctrl.host.free_pages)
    assert held is not None and engine.ctrl.host.free_pages == 0
    return held


def _stored_content_is(engine: Engine, keys: list[int]) -> bool:
    """The tier's pages of `keys` read into spare host slots hold the content their keys imply."""
    ctrl = engine.ctrl
    spare = ctrl.host.alloc(len(keys)).tolist()  # (the storage tier takes slot lists)
    ctrl.storage.read_into(keys, ctrl.host.array, spare)
    ok = verify_content(ctrl.host, spare, keys)
    ctrl.host.free(spare)
    return ok


def test_a_write_back_drop_spares_a_subtree_a_storage_write_holds(tmp_path):
    """`UnifiedTreeCore.drop_subtree_no_host` (write_back: a device leaf whose D->H backup found
    no host room): the subtree is dropped only when nothing in it is pinned; a host lock
    (`host_lock_ref`: a storage write's host copy, `write_backup_storage`; a prefetch's anchor)
    declines the drop and the node "stays device-resident until host space frees"
    (`UnifiedRadixCache._evict_components`), the walk going on to the next leaf.

    The engine dropped it, the host-only node below with it: the storage write that held that
    node's host copy then read freed host slots (reused by then), so the tier kept another
    page's bytes under its keys, a later prefetch brought them back and the load-back failed its
    verification (the demo trace, write_back + storage, `--verify all`: agent1-step6 / agent3-step9)."""
    engine = _engine(tmp_path)
    ctrl, tree = engine.ctrl, engine.scheduler.tree
    ctrl.pass_owner = SimpleNamespace(prefetch_pass=4)
    held_node = _device_node(engine, [11, 12], 1)  # older: the walk's first victim
    written = _host_child(engine, held_node, [13, 14, 15], 1)
    ctrl._storage_after_ack(written, "x", 1)  # its storage write holds its host copy
    other = _device_node(engine, [21, 22, 23], 2)
    held = _fill_host(engine)
    assert ctrl.evict_device(ctrl.device.free_pages + 3, "y", 5)
    assert other.parent is None  # dropped instead (nothing below it pinned)
    assert held_node.parent is tree.root and held_node.device is not None
    assert written.parent is held_node and written.host is not None
    ctrl.release_storage_writes(6, every=True)
    ctrl.host.free(held)
    assert ctrl.storage.hits([13, 14, 15], 0) == 3 and _stored_content_is(engine, [13, 14, 15])
    assert RULE_SETS["0.5.23"].write_back_drop_spares_pinned
    assert not RULE_SETS["0.5.9"].write_back_drop_spares_pinned  # HiRadixCache.evict asserts instead


def test_a_declined_drop_is_taken_after_all_when_nothing_else_frees_memory(tmp_path):
    """With nothing else to evict SGLang's allocation fails ("Prefill out of memory" in
    `alloc_paged_token_slots_extend`: its scheduler dies); the engine departs and drops the
    declined subtree after all. The storage write that held a host copy in it is then not made:
    before, it wrote whatever the freed host slots held by the time it ran."""
    engine = _engine(tmp_path)
    ctrl = engine.ctrl
    ctrl.pass_owner = SimpleNamespace(prefetch_pass=4)
    node = _device_node(engine, [31, 32], 1)
    written = _host_child(engine, node, [33, 34], 1)
    ctrl._storage_after_ack(written, "x", 1)
    held = _fill_host(engine)
    assert ctrl.evict_device(ctrl.device.free_pages + 2, "y", 5)
    assert node.parent is None and written.parent is None
    ctrl.host.free(held)
    reused = ctrl.host.alloc(ctrl.host.free_pages)  # the freed slots go to someone else
    write_content(ctrl.host, reused, list(range(1000, 1000 + len(reused))))
    ctrl.release_storage_writes(6, every=True)
    assert ctrl.storage.hits([33, 34], 0) == 0


def test_a_write_back_storage_write_is_released_at_the_next_pass(tmp_path):
    """`UnifiedRadixCache.writing_check(write_back=True)`: a write-back's D->H copy is waited for
    inside the eviction ("Blocking: ... wait for every ack"), so `_finish_write_through_ack` ->
    `write_backup_storage` starts the node's storage write (and takes its host lock) in the very
    pass that evicts; the backup thread runs before the next pass, whose drain (`_drain_backup`)
    releases the lock. A write-through copy is acknowledged by a later pass's `writing_check`,
    its lock released a pass after that. The engine held a write-back's copy a pass too long:
    stored seed 0 (page 1, write_back): SGLang's `evict_host(538)` for st0-27's storage hit freed
    703 host tokens, taking four nodes demoted the pass before; the engine 333."""
    engine = _engine(tmp_path)
    ctrl, tree = engine.ctrl, engine.scheduler.tree
    ctrl.pass_owner = SimpleNamespace(prefetch_pass=7)
    node = _device_node(engine, [41, 42, 43], 1)
    assert ctrl.evict_device(ctrl.device.free_pages + 3, "y", 2)  # written back, demoted
    assert node.device is None and node.host_ref == 1
    assert [entry.release_pass for entry in ctrl.storage_writes] == [8]
    ctrl.start_storage_writes(3)  # the next pass's start: the write on the tier's queue, in the tier
    end = ctrl.storage_writes[0].end
    ctrl.release_storage_writes(end)  # that pass's drain once the write has ended (the pass count still 7)
    assert node.host_ref == 0 and tree.host_evictable(node)
    assert ctrl.storage.hits([41, 42, 43], 0) == 3 and _stored_content_is(engine, [41, 42, 43])


def test_a_storage_hit_evicts_the_whole_hit_from_host(tmp_path):
    """`HybridCacheController.allocate_storage_hit` (0.5.23, `_try_alloc_storage_hit`): when the
    hit's host buffers cannot be allocated, `evict_host(hit_tokens)` frees until the whole hit's
    worth is freed (`drive_host_eviction(num_tokens)`), not the shortfall as other host
    allocations do (rule `eviction_amount`); 0.5.9's `prefetch_from_storage` evicts the whole
    request too (`evict_host(prefetch_length)`). stored seed 0 (page 1, write_back): a hit of 376
    tokens with 326 free reclaimed 608 host tokens in SGLang, 109 in the engine."""
    engine = _engine(tmp_path, host_tokens=64 * PS)
    ctrl, tree = engine.ctrl, engine.scheduler.tree
    leaves = [_host_child(engine, tree.root, [100 * (i + 1) + k for k in range(8)], i) for i in range(4)]
    rest = ctrl.host.alloc(ctrl.host.free_pages - 4)  # 4 pages free
    assert rest is not None and ctrl.host.free_pages == 4
    slots = ctrl.alloc_storage_hit(10, "r", 9)
    assert slots is not None and len(slots) == 10
    # the shortfall (6) would take one 8-page leaf and leave 2 free; the whole hit takes two
    assert [leaf.parent is None for leaf in leaves] == [True, True, False, False]
    assert ctrl.host.free_pages == 4 + 16 - 10
    assert ctrl.alloc_storage_hit(6, "r", 10) is not None and ctrl.host.free_pages == 4  # it fits: nothing evicted
    assert all(leaf.parent is tree.root for leaf in leaves[2:])


def test_the_demo_trace_under_write_back_with_storage_verifies_every_load_back(tmp_path):
    """The replay that showed the bug: every load-back's device pages checked against the
    content their keys imply (`--verify all`)."""
    out = invoke("replay", DEMO, "--db", tmp_path / "r.duckdb", "--device-tokens", "16384", "--host-tokens",
                 "16384", "--storage-tokens", "400000", "--prefetch-threshold", "64", "--write-policy",
                 "write_back", "--storage-dir", tmp_path / "s", "--verify", "all", "--json")
    summary = json.loads(out[out.index("{"):])
    assert summary["storage_tokens"] > 0
