"""Issue 43 (found by tests/sglang/hunt.py: `shape-tiered-s216-p1-o64_200-lpm-write_back`, lru and
tlru, both of SGLang's tree cores: at step 32 a host eviction freed 210 tokens where SGLang freed
211): a node split while its load-back is in flight joins the host-duplicate registry at the
load's ack, anchor first, as SGLang 0.5.23's does.

Under write_back, host pressure first frees host copies of nodes also on device
(`UnifiedTreeCore._reclaim_full_host_duplicates`), walking `full_host_duplicates` in registration
order. A node is registered where it becomes a *settled* duplicate (`_update_duplicate_tracking`
-> `_is_settled_full_host_duplicate`: both tiers and no DMA in flight); a load-back's nodes are
`load_back_pending` until its ack, so a split of one of them in between (`_split_node`: the new
upper half inherits `load_back_pending_id`, "split fragments stay on the anchor's root path")
registers nothing, and the ack (`finish_load_back`) walks from the anchor up to the root,
registering each node of that load: the lower half (the anchor) before its upper half. The
engine registered the upper half at the split (both tiers set, in flight or not) and the ack
registered the load's original nodes only: the upper half came first, and host pressure freed it
before the lower one.

a's 4 pages went to host (written back when f's allocation evicted them) and are loaded back;
before the ack a match of its first 3 pages splits the node.
"""

from __future__ import annotations

from tests.engine.helpers import PS, req
from tests.engine.test_sglang_0523_decode import pages, run_batches
from tierdiag.trace.pages import page_keys_array


def test_a_split_during_a_load_back_registers_anchor_first_at_the_ack():
    a = req("a", 0, pages(1, 4), extra_tokens=0, output=1)
    f = req("f", 100, pages(100, 11), output=1)
    engine, _ = run_batches([a, f], write_policy="write_back")
    ctrl, tree = engine.scheduler.ctrl, engine.tree
    keys = page_keys_array(a, page_size=PS, block_size=PS).tolist()
    match = tree.match(keys, 10**12, "probe")
    assert (match.device_pages, match.host_pages) == (0, 4)
    ctrl.load_back(match.host_nodes, engine.device.alloc(4), "probe", 10**12, keys)
    upper = tree.match(keys[:3], 10**12, "probe").device_nodes[-1]  # splits the loading node
    (lower,) = upper.children.values()
    assert (len(upper.keys), len(lower.keys)) == (3, 1)
    assert upper.id not in tree.host_duplicates  # in flight: not a settled duplicate yet
    ctrl.ack_loads()  # the next pass's check_hicache_events -> finish_load_back
    order = [n.id for n in tree.host_duplicates.values() if n.id in (upper.id, lower.id)]
    assert order == [lower.id, upper.id]  # what host pressure walks (its first pass sparing device leaves)
    assert not tree.load_pending  # the ack cleared the load's pins, fragments included
