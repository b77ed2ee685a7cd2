"""The radix tree on its own: matching, splits, locks and eviction order, step by step."""

from __future__ import annotations

import pytest

from tierdiag.engine.tree import RadixTree


def tree_with(*paths, policy="lru", priorities=None):
    """Insert each key path (fresh device slots, numbered on) at time = its index; slots of
    pages already in the tree come back as duplicates and are not reused here."""
    tree = RadixTree(64, policy)
    slot = iter(range(10_000))
    for t, keys in enumerate(paths):
        tree.insert(keys, 0, [next(slot) for _ in keys], now_ns=t, priority=(priorities or {}).get(keys[0], 0))
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
    last, dups, fresh, hit = tree.insert([1, 2, 3, 4, 5], 0, [50, 51, 52, 53, 54], now_ns=5)
    assert dups == [50, 51, 52]  # pages 1-3 were already on device: ours are freed by the caller
    assert [n.keys for n in fresh] == [[4, 5]] and last.device == [53, 54]
    # an insert is a hit for every device node it passes and the first hit of the new one
    assert [(n.keys, n.hit_count) for n in hit] == [([1, 2, 3], 2), ([4, 5], 1)]
    # a chunk insert counts nothing
    _, _, _, hit = tree.insert([1, 2, 3, 4, 5, 6], 0, [60, 61, 62, 63, 64, 65], now_ns=6, count_hits=False)
    assert hit == [] and tree.match([1, 2, 3, 4, 5, 6], now_ns=7).device_nodes[-1].hit_count == 0


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


@pytest.mark.parametrize("policy,expected", [
    ("lru", [3, 2, 1]), ("lfu", [3, 1, 2]), ("fifo", [1, 2, 3]), ("mru", [1, 2, 3]), ("filo", [3, 2, 1]),
    ("slru", [3, 1, 2]), ("priority", [2, 1, 3]), ("tlru", [3, 2, 1])])
def test_eviction_order_follows_the_policy(policy, expected):
    # pages 1, 2, 3 inserted at t=0, 1, 2 (one insert hit each; page 3 with priority 5); page 2
    # is inserted twice more at t=10-11 (3 hits), page 1 only matched at t=20 (access, no hit):
    # LRU keeps 1 longest, LFU and SLRU (2 hits protect) keep 2, FIFO goes by insertion, MRU
    # drops the most recent first, FILO the newest, priority the lowest priority then LRU, TLRU
    # (SGLang's default config: nothing TEL-safe) as LRU
    tree = tree_with([1], [2], [3], policy=policy, priorities={3: 5})
    tree.insert([2], 0, [90], now_ns=10)
    tree.insert([2], 0, [91], now_ns=11)
    tree.match([1], now_ns=20)
    order = []
    while (node := tree.pop_device_victim()) is not None:
        order.append(node.keys[0])
        tree.delete(node)
    assert order == expected


def test_every_registered_policy_is_a_config_choice():
    from tierdiag.config.engine import EVICTION_POLICIES
    from tierdiag.config.policies import EVICTION_POLICIES as REGISTRY
    assert EVICTION_POLICIES == tuple(REGISTRY) == ("lru", "lfu", "fifo", "mru", "filo", "priority", "slru",
                                                                  "tlru")


def test_lru_key_kept_on_the_node_is_always_the_current_one():
    """RadixTree._key keeps lru's key on the node (TreeNode.lru_key) and reuses it until the next
    stamp: after any mix of inserts, matches (which split and stamp) and evictions, every node's
    kept key is the one made from its stamp now, and each victim is the least recently stamped evictable node."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    paths = st.lists(st.lists(st.integers(1, 6), min_size=1, max_size=6), min_size=1, max_size=12)

    @settings(max_examples=60, deadline=None)
    @given(paths, st.lists(st.booleans(), max_size=12))
    def check(inserts, matches):
        tree = RadixTree(64, "lru")
        slot = iter(range(100_000))
        now = 0
        for i, raw in enumerate(inserts):
            keys = [sum(raw[:j + 1]) * 10 + j for j in range(len(raw))]  # chained: a prefix names its path
            now += 1 if i % 3 else 0  # ties in time too: access_seq orders them
            tree.insert(keys, 0, [next(slot) for _ in keys], now_ns=now)
            if i < len(matches) and matches[i]:
                tree.match(keys[: max(1, len(keys) // 2)], now_ns=now)  # a split, both halves stamped
            for node in tree.nodes():
                tree._key(node)  # keyed (and kept) now ...
        now += 1
        tree.match(keys, now_ns=now)  # ... then stamped again: the kept keys must follow
        for node in tree.nodes():
            assert tree._key(node) == (node.last_access_ns << 64) | node.access_seq
        while True:  # each victim: the least recently stamped of the leaves evictable then
            stamps = sorted((n.last_access_ns, n.access_seq, n.id) for n in tree.nodes() if tree.device_evictable(n))
            victim = tree.pop_device_victim()
            if victim is None:
                assert stamps == []
                break
            assert (victim.last_access_ns, victim.access_seq, victim.id) == stamps[0]
            tree.delete(victim)

    check()


def test_lru_heap_entries_are_one_int_each_found_by_id():
    """lru's heaps hold ints, (last_access_ns << 64 | access_seq) << 48 | id (RadixTree._lru_entry),
    ordered as the (key, id) tuples were; a popped entry's node comes from the tree's id index,
    which holds every node from its creation (an insert, a split's upper half) to its delete, so
    a deleted node's entries are skipped; an id the entry cannot hold is refused, naming it."""
    import pytest

    tree = RadixTree(64, "lru")
    tree.insert([1, 2, 3, 4], 0, [0, 1, 2, 3], now_ns=-3)  # a negative time too
    tree.insert([1, 2, 7], 0, [4, 5, 6], now_ns=5)  # splits [1, 2, 3, 4]
    nodes = list(tree.nodes())
    assert sorted(tree._by_id) == sorted(n.id for n in nodes) and len(nodes) == 3
    assert all(type(e) is int for e in tree._device_heap)
    for n in nodes:
        e = tree._lru_entry(n)
        assert e == ((((n.last_access_ns << 64) | n.access_seq)) << 48) | n.id
        assert tree._key(n) == (n.last_access_ns << 64) | n.access_seq == e >> 48
    leaves = sorted((n for n in nodes if tree.device_evictable(n)),
                    key=lambda n: (n.last_access_ns, n.access_seq, n.id))
    first = tree.pop_device_victim()
    assert first is leaves[0]  # the least recently stamped leaf
    tree.delete(first)
    assert first.id not in tree._by_id
    tree._device_heap.append(tree._lru_entry(first))  # a stale entry of the deleted node
    assert tree.pop_device_victim() is leaves[1]
    big = RadixTree(64, "lru")
    big.number_nodes(2**48, 1)
    with pytest.raises(ValueError, match=r"node id 281474976710656 outside"):
        big.insert([9], 0, [0], now_ns=0)
    tuples = RadixTree(64, "lfu")
    tuples.insert([1, 2], 0, [0, 1], now_ns=0)
    assert tuples._by_id == {} and all(type(e) is tuple for e in tuples._device_heap)
