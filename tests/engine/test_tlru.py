"""`tlru`: SGLang 0.5.23's `TLRUStrategy` (mem_cache/evict_policy.py, Tail-Optimized LRU,
arXiv:2510.15152) and the tree bookkeeping it reads (`unified_tree_core._set_tlru_lens_and_raise_history`,
`UnifiedTreeCore._split_node` under `tlru_bookkeeping`).

The story: conversation A asks for pages [1, 2] and then, a turn later, [1, 2, 3, 4]; the second
turn's insert hangs [3, 4] under [1, 2] and raises the branch's high-water mark ("history", the
paper's L) to 256 tokens on both nodes. `get_priority` calls a node TEL-safe when the tokens cached
above it already cover the branch's budget, L + next_prompt_estimate - threshold: such a node
cannot improve the next turn's tail latency and leaves first; then plain recency. With SGLang's
defaults (threshold 0, next_prompt_estimate 0) no node is ever TEL-safe, so the order is LRU's.
"""

from __future__ import annotations

import importlib.util
import random
from types import SimpleNamespace

import pytest

from tierdiag.config.policies import EVICTION_POLICIES, tlru_key
from tierdiag.engine.tree import RadixTree

from tests.support.sglang_wheels import unpacked_wheel

PAGE = 64


def _tree(policy: str = "tlru") -> RadixTree:
    return RadixTree(PAGE, policy)


def _node(tree: RadixTree, first_key: int):
    return next(n for n in tree.nodes() if n.keys[0] == first_key)


def _conversation_a_then_b(policy: str = "tlru") -> RadixTree:
    """B = [7, 8, 9, 10] at t=0 (one turn, 256 tokens); A's turns [1, 2] at t=1, [1, 2, 3, 4] at t=2."""
    tree = _tree(policy)
    slots = iter(range(1000))
    for t, keys in enumerate(([7, 8, 9, 10], [1, 2], [1, 2, 3, 4])):
        tree.insert(keys, 0, [next(slots) for _ in keys], now_ns=t)
    return tree


def test_tlru_is_registered_and_keeps_the_branch_depths():
    assert "tlru" in EVICTION_POLICIES and EVICTION_POLICIES["tlru"].tree_depths
    tree = _conversation_a_then_b()
    a1, a2, b = _node(tree, 1), _node(tree, 3), _node(tree, 7)
    # _set_tlru_lens_and_raise_history: depth = parent's + own tokens; the new node raises its
    # ancestors' history to its depth.
    assert (a1.tlru_depth, a1.tlru_history) == (128, 256)
    assert (a2.tlru_depth, a2.tlru_history) == (256, 256)
    assert (b.tlru_depth, b.tlru_history) == (256, 256)
    # _split_node: the upper half at the parent's depth + its tokens, with the branch's history;
    # the lower half keeps its own depth.
    tree.match([1, 9], now_ns=3)
    upper, lower = _node(tree, 1), _node(tree, 2)
    assert upper.keys == [1] and lower.keys == [2]
    assert (upper.tlru_depth, upper.tlru_history) == (64, 256)
    assert (lower.tlru_depth, lower.tlru_history) == (128, 256)
    # A trimmed tail does not lower the history ("deliberately does not shrink").
    tree.delete(_node(tree, 3))
    assert _node(tree, 2).tlru_history == 256


def test_a_tel_safe_tail_leaves_before_an_older_branch():
    tree = _conversation_a_then_b()
    key = tlru_key(threshold=128, next_prompt_estimate=0)
    a_tail, b = _node(tree, 3), _node(tree, 7)
    # A's budget: 256 + 0 - 128 = 128 tokens, already cached above [3, 4] ([1, 2]): TEL-safe.
    # B's: 128 as well, but nothing is cached above it: it stays, although it is older.
    assert key(a_tail)[0] == -1 and key(b)[0] == 0
    assert min((a_tail, b), key=key) is a_tail
    assert min((a_tail, b), key=EVICTION_POLICIES["lru"].key) is b
    # A next prompt expected to add 128 tokens raises the budget to 256: nothing is safe.
    assert tlru_key(threshold=128, next_prompt_estimate=128)(a_tail)[0] == 0


def _evict_all(tree: RadixTree) -> list[int]:
    order = []
    while (node := tree.pop_device_victim()) is not None:
        order.append(node.id)
        tree.delete(node)
    return order


def test_with_sglangs_default_config_tlru_orders_as_lru():
    # Seeded conversations with shared prefixes, matches that split nodes, and partial evictions.
    rng = random.Random(29)
    trees = {p: _tree(p) for p in ("lru", "tlru")}
    for t in range(200):
        base = rng.randrange(6)
        keys = [base * 100 + i for i in range(rng.randrange(1, 8))]
        insert = rng.random() >= 0.3  # else only a match (it may split a node)
        for tree in trees.values():
            tree.match(keys, now_ns=t)
            if insert:
                tree.insert(keys, 0, list(range(len(keys))), now_ns=t)
        if t % 50 == 49:
            victims = [tree.pop_device_victim() for tree in trees.values()]
            assert victims[0].id == victims[1].id
            for tree, v in zip(trees.values(), victims):
                tree.delete(v)
    assert _evict_all(trees["lru"]) == _evict_all(trees["tlru"])


def _sglang_evict_policy():
    path = unpacked_wheel("0.5.23") / "sglang" / "srt" / "mem_cache" / "evict_policy.py"  # fetched if not yet
    spec = importlib.util.spec_from_file_location("sglang_0523_evict_policy", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # stdlib only: its TreeNode import is for type checking
    return module


@pytest.mark.sglang
@pytest.mark.parametrize("threshold,estimate", [(0, 0), (64, 0), (128, 0), (128, 64), (256, 0), (64, 192)])
def test_tlru_agrees_with_sglangs_get_priority(threshold, estimate):
    strategy = _sglang_evict_policy().TLRUStrategy(threshold=threshold, next_prompt_estimate=estimate)
    tree = _conversation_a_then_b()
    tree.match([1, 9], now_ns=3)  # a split too
    ours = tlru_key(threshold, estimate)
    for node in tree.nodes():
        theirs = strategy.get_priority(SimpleNamespace(
            _tlru_history_len=node.tlru_history, _tlru_cached_prefix_len=node.tlru_depth,
            key=[0] * (len(node.keys) * PAGE), last_access_time=node.last_access_ns))
        assert (ours(node)[0], ours(node)[1]) == theirs, node
