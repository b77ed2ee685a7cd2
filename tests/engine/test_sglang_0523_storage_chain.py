"""SGLang 0.5.23's write-through and storage bookkeeping where the scheduler harness's storage
tier found the engine differing (issue 43, second storage pass: tests/sglang/test_scheduler_0523.py,
`stored` seed 0 at page 1 under write_through, seed 2 under write_through_selective), narrated a function at a time.

The engine here prices storage at 0 ns, as the harness does.
"""

from __future__ import annotations

from tests.engine import helpers
from tierdiag.engine.engine import Engine
from tierdiag.engine.rules import RULE_SETS


def _engine(tmp_path, write_policy: str = "write_through", **kw) -> Engine:
    return helpers.storage_engine(tmp_path, write_policy=write_policy, **kw)


def _path(engine: Engine, first: list[int], rest: list[int]):
    """Two device nodes: `first` (a prompt's earlier insert) and `rest` below it."""
    tree, dev = engine.scheduler.tree, engine.ctrl.device
    slots = dev.alloc(len(first) + len(rest))
    upper = tree.insert(first, 0, slots[:len(first)], 1).last
    lower = tree.insert(first + rest, len(first), slots[len(first):], 2).last
    assert lower.parent is upper and upper.host is None and lower.host is None
    return upper, lower


def test_a_write_through_backup_chains_the_ancestors_not_backed_up(tmp_path):
    """unified_tree_core.py `_build_backup_kv_action` (write_through: "Ancestors first to preserve
    backup invariant"): a node's backup also backs up every ancestor not on host, root side
    first. stored seed 0, page 1: st0-6's prompt found the host full at its prefill (backup
    skipped); its finish insert counts only the new output node, and SGLang backs up the prompt
    first. 0.5.9 (`HiRadixCache.write_backup`) backs up the node alone."""
    engine = _engine(tmp_path)
    ctrl = engine.ctrl
    upper, lower = _path(engine, [11, 12, 13], [14, 15])
    assert ctrl.backup_chain(lower, "x", 3)
    assert upper.host is not None and lower.host is not None
    assert [len(node.keys) for node, *_ in ctrl.backup_queue] == [3, 2]  # the ancestor's copy first
    assert RULE_SETS["0.5.23"].backup_chains_ancestors and not RULE_SETS["0.5.9"].backup_chains_ancestors


def test_a_chained_backup_stops_at_the_first_node_without_host_room(tmp_path):
    """`UnifiedRadixCache._execute_and_commit_kv_backup`: "Run a backup action top-down,
    stopping at the first failed backup" (`_execute_kv_backup` returns None when `evict_host`
    frees less than the node needs): the node below is not backed up either, so no host copy
    hangs below a missing one. stored seed 0, page 1: st0-6's 331-token prompt found 115 host
    tokens free and nothing to evict, and its 5 output tokens were not backed up; the engine
    backed the 5 up alone (337 device tokens locked by the copy that SGLang never made)."""
    engine = _engine(tmp_path)
    ctrl = engine.ctrl
    upper, lower = _path(engine, [21, 22, 23], [24])
    held = ctrl.host.alloc(ctrl.host.free_pages - 2)  # 2 pages free, nothing evictable
    assert held is not None
    assert not ctrl.backup_chain(lower, "x", 3)
    assert upper.host is None and lower.host is None and ctrl.backup_queue == []
    assert ctrl.backup(lower, "x", 3)  # 0.5.9's write_backup: the node alone fits
    assert lower.host is not None and upper.host is None


def test_a_storage_write_covers_every_part_of_a_node_split_since_its_copy(tmp_path):
    """`UnifiedRadixCache._replace_pending_write_through_node` (a split while the copy is in
    flight: `UpdatePendingBackupOnNodeSplit`, publish [upper, lower]) and
    `write_backup_storage` at the ack, which takes the node's host value then: every page the
    copy covered goes to storage, however the node is split before the write. stored seed 0,
    page 1: st0-9 arrived with st0-0's prompt, its match (input - 1) split st0-0's last node
    between its copy's ack and the storage write; the engine wrote the lower part only (1 of 91
    pages), and st0-9's later storage hit stopped 90 pages short."""
    engine = _engine(tmp_path)
    ctrl, tree = engine.ctrl, engine.scheduler.tree
    keys = [31, 32, 33, 34, 35]
    slots = ctrl.device.alloc(len(keys))
    node = tree.insert(keys, 0, slots, 1).last
    assert ctrl.backup(node, "x", 2)
    ctrl.flush_backups(2)
    tree.match(keys[:3], 3)  # a match ending inside the node splits it while its copy is in flight
    assert len(node.keys) == 2 and len(node.parent.keys) == 3
    ctrl._ack_backups_to_storage([(node, "x", len(keys))])  # the copy's ack: both parts published
    tree.match(keys[:4], 4)  # and one more split between the ack and the storage write
    ctrl.release_storage_writes(5, every=True)
    assert ctrl.storage.hits(keys, 0) == len(keys)


def test_a_chunk_stash_runs_its_pass_storage_work_once(tmp_path):
    """`Scheduler.get_next_batch_to_run`: `_process_hicache_events` (the drain, then
    `_process_storage_prefetch_retries`) comes before `stash_chunked_request`; the engine
    inserts a chunk at its batch's end (`_cache_unfinished`), so it runs that pass's storage work
    there (`storage_pass_start`) and the pass at the same instant skips it. stored seed 2,
    write_through_selective: st2-33's re-query at pass 34 matched st2-22's first chunk in the
    engine (6 pages), not in SGLang (1 page), and was re-queried again at admission."""
    engine = _engine(tmp_path, write_policy="write_through_selective")
    s = engine.scheduler
    s.storage_pass_start(7)
    s.storage_pass_done_ns = 7  # as `_cache_unfinished` leaves it
    counted = s.prefetch_pass
    s.storage_pass_start(7)  # the pass at that instant: already run
    assert s.prefetch_pass == counted and s.storage_pass_done_ns == -1
    s.storage_pass_start(7)  # a later pass at the same instant runs its own
    assert s.prefetch_pass == counted + 1
