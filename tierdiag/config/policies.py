"""Eviction policies: the order in which evictable tree nodes leave a tier (smallest key first).

One registry, as SGLang 0.5.9's `mem_cache/evict_policy.py` (`*Strategy.get_priority`) and the
`eviction_policy` switch in `RadixCache.__init__`: lru, lfu, fifo, mru, filo, priority; plus slru
and tlru, which SGLang added after 0.5.9 (0.5.23's `SLRUStrategy`, `TLRUStrategy`). Every key ends in the node id so
ties break the same way in every run; before it, `access_seq`, the order of the access stamps
within one virtual instant (SGLang's clocks never tie: the newer stamp is the more recent).

What the keys read (`EvictionNode`; engine/tree.py's TreeNode is one):
- `last_access_ns`: set by every match and insert that walks through the node;
- `hit_count`: grows per *insert* that walks through the node (chunk inserts excluded, and never
  under write_back), as HiRadixCache._inc_hit_count; matches do not count;
- `created_ns`, `created_seq`: when the node's first page entered the tree (a split keeps it
  under 0.5.23) and the order of creations within that instant (SGLang 0.5.23's creation_time is
  a logical counter, `get_and_increase_time_counter`: two nodes made at one virtual instant are
  still older and newer, so fifo and filo never tie);
- `priority`: the highest `"priority"` of the requests that inserted the node (RadixCache keeps
  the max along the path; a split inherits it);
- `tlru_depth`, `tlru_history` (tlru only, kept by the tree when the policy asks, `tree_depths`):
  the tokens from the root to the node's end, and the deepest its branch has ever reached
  (UnifiedTreeCore's `_tlru_cached_prefix_len`, `_tlru_history_len`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol


class EvictionNode(Protocol):
    """What an eviction key reads of a tree node: the config names the policies and their keys,
    the engine's tree nodes carry these attributes (config sits below the engine)."""

    id: int
    parent: "EvictionNode | None"
    last_access_ns: int
    access_seq: int
    hit_count: int
    created_ns: int
    created_seq: int
    priority: int
    tlru_depth: int
    tlru_history: int

# SLRUStrategy(protected_threshold=2) in SGLang 0.5.23: a node hit twice is "protected".
SLRU_PROTECTED_HITS = 2


@dataclass(frozen=True)
class EvictionPolicy:
    """An eviction policy of the registry: how the tree orders its victims (`key`), and its words."""

    name: str
    key: Callable[[EvictionNode], tuple]
    # True when a node's key can get smaller while it sits in an eviction heap (mru: every
    # access makes it a better victim). The tree then re-pushes a node each time it is touched.
    key_can_shrink: bool
    doc: str
    # The tree keeps the nodes' tlru_depth / tlru_history (UnifiedTreeCore.tlru_bookkeeping).
    tree_depths: bool = False


def _lru(n: EvictionNode) -> tuple:
    return (n.last_access_ns, n.access_seq, n.id)


def _lfu(n: EvictionNode) -> tuple:
    return (n.hit_count, n.last_access_ns, n.access_seq, n.id)


def _fifo(n: EvictionNode) -> tuple:
    return (n.created_ns, n.created_seq, n.id)


def _mru(n: EvictionNode) -> tuple:
    return (-n.last_access_ns, -n.access_seq, n.id)


def _filo(n: EvictionNode) -> tuple:
    # newest first within an instant too (FILOStrategy: -creation_time, a counter): the node id
    # alone broke such ties oldest first
    return (-n.created_ns, -n.created_seq, n.id)


def _priority(n: EvictionNode) -> tuple:
    return (n.priority, n.last_access_ns, n.access_seq, n.id)


def _slru(n: EvictionNode) -> tuple:
    return (1 if n.hit_count >= SLRU_PROTECTED_HITS else 0, n.last_access_ns, n.access_seq, n.id)


def tlru_key(threshold: int = 0, next_prompt_estimate: int = 0) -> Callable[[EvictionNode], tuple]:
    """SGLang 0.5.23 `TLRUStrategy(threshold, next_prompt_estimate).get_priority` (Tail-Optimized
    LRU, arXiv:2510.15152; both in tokens): a branch whose history reached L tokens only needs
    L + next_prompt_estimate - threshold of them cached; a node whose ancestors already hold that
    budget is "TEL-safe" and leaves before everything else, then LRU.

    SGLang's `_tlru_cached_prefix_len - len(node.key)` is the parent's depth (a split gives the
    upper half the parent's depth + its own tokens, the lower half keeps its own), read here as
    such. Under SGLang's defaults (no `--radix-eviction-policy-config`: 0 and 0) no node is ever
    TEL-safe (its history is at least its own depth, beyond its parent's): the order is LRU's."""
    def _tlru(n: EvictionNode) -> tuple:
        budget = max(n.tlru_history + next_prompt_estimate - threshold, 0)
        without_this_node = n.parent.tlru_depth if n.parent is not None else 0
        return (-1 if without_this_node >= budget else 0, n.last_access_ns, n.access_seq, n.id)
    return _tlru


def configured_eviction_policy(name: str, tlru_threshold: int = 0, tlru_next_prompt_estimate: int = 0
                               ) -> EvictionPolicy:
    """The registry's policy, with tlru's settings (SGLang's `--radix-eviction-policy-config`
    `{"threshold": T, "next_prompt_estimate": E}`, passed to `TLRUStrategy` as keyword
    arguments; config keys `tlru_threshold`, `tlru_next_prompt_estimate`, checked by
    EngineConfig). With T > E a node can become TEL-safe when a split deepens its parent, so its
    key can shrink: the tree re-pushes it when touched or split."""
    policy = EVICTION_POLICIES[name]
    if name != "tlru" or (tlru_threshold, tlru_next_prompt_estimate) == (0, 0):
        return policy
    return EvictionPolicy(policy.name, tlru_key(tlru_threshold, tlru_next_prompt_estimate),
                          tlru_threshold > tlru_next_prompt_estimate,
                          f"tail-optimized LRU, threshold {tlru_threshold}, next_prompt_estimate "
                          f"{tlru_next_prompt_estimate} (TLRUStrategy, SGLang 0.5.23)", tree_depths=True)


EVICTION_POLICIES: dict[str, EvictionPolicy] = {p.name: p for p in (
    EvictionPolicy("lru", _lru, False, "least recently used first (LRUStrategy)"),
    EvictionPolicy("lfu", _lfu, False, "fewest insert hits first, then least recent (LFUStrategy)"),
    EvictionPolicy("fifo", _fifo, False, "oldest node first (FIFOStrategy)"),
    EvictionPolicy("mru", _mru, True, "most recently used first (MRUStrategy)"),
    EvictionPolicy("filo", _filo, False, "newest node first (FILOStrategy)"),
    EvictionPolicy("priority", _priority, False,
                   "lowest request priority first, then least recent (PriorityStrategy)"),
    EvictionPolicy("slru", _slru, False,
                   f"nodes hit fewer than {SLRU_PROTECTED_HITS} times first, each segment least recent first "
                   "(SLRUStrategy, SGLang after 0.5.9)"),
    # SGLang's default config (threshold 0, next_prompt_estimate 0): a key only grows (no node
    # becomes TEL-safe), so no re-push on touch.
    EvictionPolicy("tlru", tlru_key(), False,
                   "tail-optimized LRU with SGLang's default config: TEL-safe tails first, then least recent "
                   "(TLRUStrategy, SGLang 0.5.23)", tree_depths=True),
)}
