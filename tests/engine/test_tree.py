"""The radix tree on its own: matching, splits, locks and eviction order, step by step."""

from __future__ import annotations

import pytest

from tierdiag.engine.tree import RadixTree


def tree_with(*paths, policy="lru"):
    """Insert each key path (fresh device slots, numbered on) at time = its index; slots of
    pages already in the tree come back as duplicates and are not reused here."""
    tree = RadixTree(64, policy)
    slot = iter(range(10_000))
    for t, keys in enumerate(paths):
        tree.insert(keys, 0, [next(slot) for _ in keys], now_ns=t)
    return tree


def test_match_splits_a_node_where_the_prefix_ends():
    tree = tree_with([1, 2, 3, 4])
    m = tree.match([1, 2, 9], now_ns=10)
    assert m.device_pages == 2 and m.host_pages == 0
    (upper,) = m.device_nodes
    assert upper.keys == [1, 2] and [c.keys for c in upper.children.values()] == [[3, 4]]
    # both halves keep their slots; a second match reuses the split without splitting again
    assert upper.device == [0, 1] and tree.match([1, 2, 3, 4], now_ns=11).device_pages == 4


def test_insert_reports_duplicates_and_keeps_the_tree_slots():
    tree = tree_with([1, 2, 3])
    last, dups, fresh = tree.insert([1, 2, 3, 4, 5], 0, [50, 51, 52, 53, 54], now_ns=5)
    assert dups == [50, 51, 52]  # pages 1-3 were already on device: ours are freed by the caller
    assert [n.keys for n in fresh] == [[4, 5]] and last.device == [53, 54]


def test_lock_propagates_to_the_root_and_protects_from_eviction():
    tree = tree_with([1, 2], [1, 2, 3])
    leaf = tree.match([1, 2, 3], now_ns=5).last_node
    tree.inc_lock(leaf)
    assert leaf.lock_ref == 1 and leaf.parent.lock_ref == 1 and tree.root.lock_ref == 2
    assert tree.locked_device_pages == 3
    assert tree.pop_device_victim() is None  # the only leaf is locked
    tree.dec_lock(leaf)
    assert tree.locked_device_pages == 0 and tree.root.lock_ref == 1
    assert tree.pop_device_victim() is leaf


def test_demote_keeps_a_host_copy_and_exposes_the_parent():
    tree = tree_with([1, 2], [1, 2, 3, 4])
    leaf = tree.match([1, 2, 3, 4], now_ns=5).last_node
    tree.set_host(leaf, [100, 101])
    victim = tree.pop_device_victim()
    assert victim is leaf
    assert tree.demote(leaf) == [4, 5]  # freed device slots (2 and 3 were duplicates of pages 1-2)
    m = tree.match([1, 2, 3, 4], now_ns=6)
    assert (m.device_pages, m.host_pages) == (2, 2)
    assert tree.pop_device_victim() is m.device_nodes[-1]  # the parent is a device leaf now
    assert tree.pop_host_victim() is leaf


@pytest.mark.parametrize("policy,expected", [("lru", [3, 2, 1]), ("lfu", [3, 1, 2]), ("fifo", [1, 2, 3])])
def test_eviction_order_follows_the_policy(policy, expected):
    tree = tree_with([1], [2], [3], policy=policy)
    # inserted at t=0, 1, 2 (one hit each); page 2 is hit twice more at t=10-11, page 1 once at t=20:
    # LRU keeps 1 longest, LFU keeps 2 longest (3 hits), FIFO goes by insertion
    tree.match([2], now_ns=10)
    tree.match([2], now_ns=11)
    tree.match([1], now_ns=20)
    order = []
    while (node := tree.pop_device_victim()) is not None:
        order.append(node.keys[0])
        tree.delete(node)
    assert order == expected
