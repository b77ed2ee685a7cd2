"""SGLang 0.5.23's `UnifiedTreeCore.insert_host` (mem_cache/unified_cache/unified_tree_core.py),
narrated (rule `insert_host_refills_host`). Found by the hunt (tests/sglang/hunt.py) on
`synth-mixed-s642-r8-n150-p16-lpm-write_through-mru-b4096-st4000000-wait_complete-d24576-h24576`:
a storage read whose pages another request computed meanwhile, on device without a host copy
(the host pool was full when their write-through backup was tried).

When a prefetch's read is done, `UnifiedRadixCache._handle_prefetch_result` calls
`tree_core.insert_host(last_host_node_id, fetched_key, host_indices, hash_value)`. That walks the
read's path below the anchor. Under a non-write-back policy each node on it that has no host copy
takes the read's pages for it (`full_data.host_value = matched_host_value.clone()`, then
`_update_duplicate_tracking`); the pages of nodes that already had one are `host_prefix_len` (and
SGLang asserts none of them lies below a refilled node). `InsertResult.prefix_len` is that
`host_prefix_len` (write_back: every matched page). The caller frees `host_indices[:prefix_len]`
and sets `loaded_from_storage = completed_tokens - prefix_len`
(`prefetch_loaded_tokens_by_reqid`, storage start `storage_start + prefix_len`): the refilled
pages count as loaded from storage, and the request's storage span includes them.
0.5.9's `HiRadixCache._insert_helper_host` refills nothing and returns every matched page.
"""

from __future__ import annotations

import pytest

from tests.engine import helpers
from tests.engine.helpers import req
from tierdiag.engine.content import verify_content_numpy, write_content_numpy
from tierdiag.engine.engine import Engine, check_rank

_queued = helpers.queued_req


def _read_over_a_device_only_node(engine: Engine):
    """A request of 10 pages, all in storage; pages 0-3 an anchor on device and host, pages 4-7
    a node on device only (computed by another request; no host copy), and a finished read of
    pages 4-9 from storage into host memory, as `_alloc_prefetch` leaves it."""
    ctrl, s = engine.ctrl, engine.scheduler
    tree = s.tree
    t = req("r", 0, list(range(1, 11)))
    r = _queued(t)
    staged = ctrl.host.alloc(10).tolist()  # (the storage tier takes slot lists) storage holds the pages' real contents (the data plane)
    write_content_numpy(ctrl.host, staged, r.keys[:10])
    ctrl.storage.write_from(ctrl.host.array, staged, r.keys[:10], rows=ctrl.host.rows)
    ctrl.host.free(staged)
    dev = ctrl.device.alloc(4)
    ctrl.write_computed(dev, r.keys[:4])
    anchor = tree.insert(r.keys[:4], 0, dev, 0).last
    tree.set_host(anchor, ctrl.host.alloc(4))  # its backup (contents not read here)
    dev2 = ctrl.device.alloc(4)
    ctrl.write_computed(dev2, r.keys[4:8])
    other = tree.insert(r.keys[:8], 4, dev2, 0).last
    assert other.host is None and other.device is not None
    tree.protect_host(anchor)
    r.anchor = anchor
    slots = ctrl.host.alloc(6).tolist()  # (a prefetch's slots are lists: controller.alloc_storage_hit)
    start, end = ctrl.prefetch(r.keys[4:10], slots, r.req_id, 0)
    r.prefetch = (4, 6, slots, start, end)
    r.prefetch_ack_pass = 0  # its acks drained
    return r, anchor, other, slots, end


def test_a_read_refills_the_host_copy_of_a_device_only_node_and_counts_it_loaded(tmp_path):
    """0.5.23, write_through: the read's pages 4-7 become the host copy of the node on device
    without one, pages 8-9 a new host-only node; none of the read is freed, and all 6 pages are
    the request's storage span, starting at page 4 (`storage_start + host_prefix_len`)."""
    engine = helpers.storage_engine(tmp_path, write_policy="write_through")
    s, ctrl, tree = engine.scheduler, engine.ctrl, engine.scheduler.tree
    assert s.rules.insert_host_refills_host and s.refill_host_on_read
    r, anchor, other, slots, end = _read_over_a_device_only_node(engine)
    free_before = ctrl.host.free_pages
    s._finish_prefetch(r, end, acked=True)
    assert other.host == slots[:4]  # full_data.host_value = matched_host_value
    assert other.device is not None  # still on device: now on both tiers
    tail = other.children[r.keys[8]]
    assert tail.device is None and tail.host == slots[4:6]  # the new host-only node below it
    assert ctrl.host.free_pages == free_before  # host_indices[:prefix_len] with prefix_len 0
    assert (r.loaded_span_pages, r.loaded_span_start) == (6, 4)  # loaded_from_storage = 6 pages
    # the data plane: the refilled host copy holds the read's bytes, which are the node's pages
    assert verify_content_numpy(ctrl.host, other.host, other.keys)
    assert verify_content_numpy(ctrl.host, tail.host, tail.keys)
    check_rank(ctrl.device, ctrl.host, tree)


def test_pages_whose_node_had_a_host_copy_are_freed_and_not_counted(tmp_path):
    """`host_prefix_len`: a node on the path that already has a host copy keeps it; the read's
    pages for it are freed (`mem_pool_host.free(host_indices[:prefix_len])`) and are not loaded
    from storage, so the span starts past them."""
    engine = helpers.storage_engine(tmp_path, write_policy="write_through")
    s, ctrl, tree = engine.scheduler, engine.ctrl, engine.scheduler.tree
    r, anchor, other, slots, end = _read_over_a_device_only_node(engine)
    mine = ctrl.host.alloc(4)
    tree.set_host(other, mine)  # its backup found room after all
    free_before = ctrl.host.free_pages
    s._finish_prefetch(r, end, acked=True)
    assert other.host == mine
    assert ctrl.host.free_pages == free_before + 4
    assert (r.loaded_span_pages, r.loaded_span_start) == (2, 8)
    check_rank(ctrl.device, ctrl.host, tree)


@pytest.mark.parametrize("how", ["write_back", "0.5.9"])
def test_write_back_and_0_5_9_refill_nothing(tmp_path, how):
    """`prefix_len = matched_length if self.is_write_back else host_prefix_len`, and the refill is
    under `if not self.is_write_back`; 0.5.9's `_insert_helper_host` has no refill at all: the
    device-only node stays so, its read pages are freed, and only pages 8-9 are loaded."""
    kw = {"write_policy": "write_back"} if how == "write_back" else {"write_policy": "write_through",
                                                                     "sglang_rules": "0.5.9"}
    engine = helpers.storage_engine(tmp_path, **kw)
    s, ctrl, tree = engine.scheduler, engine.ctrl, engine.scheduler.tree
    assert not s.refill_host_on_read
    r, anchor, other, slots, end = _read_over_a_device_only_node(engine)
    free_before = ctrl.host.free_pages
    s._finish_prefetch(r, end, acked=True)
    assert other.host is None
    assert ctrl.host.free_pages == free_before + 4
    assert (r.loaded_span_pages, r.loaded_span_start) == (2, 8)
    check_rank(ctrl.device, ctrl.host, tree)
