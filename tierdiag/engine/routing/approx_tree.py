"""cache_aware's approximate tree: what the router *believes* each rank caches.

SGLang's model gateway keeps one multi-tenant radix tree per model (policies/tree.rs, `Tree`):
every node records, per worker ("tenant"), when that worker last touched it. It is fed only by
the router's own decisions: `Tree::insert(text, worker)` on every routed request, whatever the
worker later computes, keeps or evicts. It is never told of the worker's real evictions, never
of output tokens, never of a request the worker refused. Its only forgetting is its own:
`Tree::evict_tenant_by_size(max_tree_size)`, run every `eviction_interval_secs` by a background
thread, drops each over-size worker's least recently touched leaves until the worker is back
under the limit.

Here the nodes are page keys. A key stands for its whole prefix (trace/pages.py), so a tree of
page keys needs no node splitting: each key is one node whose parent is the key before it, and
a worker's set of keys stays prefix-closed (it gains keys by inserting whole prefixes and loses
only leaves). The gateway's functions map one to one:

    Tree::insert(text, tenant)        insert(keys, rank, tick): attach rank to every key, touch it
    Tree::prefix_match(text)          prefix_match(keys, tick): longest run of keys in the tree,
                                      one tenant of the deepest matched node, touched to the root
    Tree::prefix_match_tenant         the per-rank depths prefix_match returns beside it
    Tree::leaf_of / evict_tenant_by_size   evict(max_pages): per over-size rank, oldest leaf first
    Tree::get_smallest_tenant         smallest_rank(): fewest pages (first rank on a tie)
    tenant_char_count                 pages[rank] (× page size = the tokens compared to the limit)

Two choices the gateway leaves to a hash map's iteration order are fixed here so a replay repeats
itself: the tenant of the deepest node is the one that touched it last (the token tree's
`get_any_tenant` prefers its cached `last_tenant`, a recent toucher), then the lowest rank; and
time is a counter the caller advances (the token tree's `next_timestamp()`), not wall-clock
milliseconds, so eviction order has no ties between requests.
"""

from __future__ import annotations

import heapq
from typing import Sequence


class ApproxTree:
    def __init__(self, num_ranks: int) -> None:
        self.num_ranks = num_ranks
        self._touched: dict[int, dict[int, int]] = {}  # key -> {rank: tick it last touched the key}
        self._parent: dict[int, int | None] = {}  # key -> the key before it (None: first page)
        # (key, rank) -> children of key that rank holds; a rank's leaf has none.
        self._children: dict[tuple[int, int], int] = {}
        self.pages = [0] * num_ranks  # tenant_char_count, in pages

    def __len__(self) -> int:
        """Nodes in the tree (keys any rank holds)."""
        return len(self._touched)

    def holds(self, rank: int, key: int) -> bool:
        t = self._touched.get(key)
        return t is not None and rank in t

    def insert(self, keys: Sequence[int], rank: int, tick: int) -> None:
        touched, children = self._touched, self._children
        parent = None
        for key in keys:
            owners = touched.get(key)
            if owners is None:
                owners = touched[key] = {}
                self._parent[key] = parent
            if rank not in owners:
                self.pages[rank] += 1
                if parent is not None:
                    children[(parent, rank)] = children.get((parent, rank), 0) + 1
            owners[rank] = tick
            parent = key

    def prefix_match(self, keys: Sequence[int], tick: int, *, touch: bool = True
                     ) -> tuple[int, int | None, list[int]]:
        """(matched pages, the rank of the deepest matched node or None, pages each rank holds of
        `keys`' prefix). Touches the chosen rank along the matched path, as Tree::prefix_match
        does before the policy has decided anything; `touch=False` leaves that to the caller
        (cache_aware skips it when the chosen rank is the one it inserts for: same keys, same
        tick)."""
        touched = self._touched
        depth_of = [0] * self.num_ranks
        alive = set(range(self.num_ranks))
        depth = 0
        n = len(keys)
        while depth < n and alive:  # some rank may still hold all of it so far
            owners = touched.get(keys[depth])
            if not owners:
                break
            if not alive <= owners.keys():  # some rank's own prefix ends before this key
                gone = alive - owners.keys()
                for r in gone:
                    depth_of[r] = depth
                alive -= gone
            depth += 1
        for r in alive:
            depth_of[r] = depth
        while depth < n and touched.get(keys[depth]):  # the union goes on; no rank holds it whole
            depth += 1
        if depth == 0:
            return 0, None, depth_of
        owners = touched[keys[depth - 1]]
        chosen = max(owners, key=lambda r: (owners[r], -r))
        if touch:
            self.touch(keys[:depth], chosen, tick)
        return depth, chosen, depth_of

    def touch(self, keys: Sequence[int], rank: int, tick: int) -> None:
        """Mark `rank`'s use of a path it holds (the timestamp walk of Tree::prefix_match)."""
        touched = self._touched
        for key in keys:
            touched[key][rank] = tick

    def smallest_rank(self) -> int:
        return min(range(self.num_ranks), key=self.pages.__getitem__)

    def evict(self, max_pages: int) -> int:
        """Tree::evict_tenant_by_size: for every rank over `max_pages`, drop its least recently
        touched leaves (a parent left without that rank's children becomes a leaf in turn) until
        it holds `max_pages`. Ranks are independent: a leaf is a leaf per rank. Returns the
        (key, rank) entries dropped."""
        dropped = 0
        for rank in range(self.num_ranks):
            if self.pages[rank] <= max_pages:
                continue
            heap = [(owners[rank], key) for key, owners in self._touched.items()
                    if rank in owners and not self._children.get((key, rank))]
            heapq.heapify(heap)
            while heap and self.pages[rank] > max_pages:
                _, key = heapq.heappop(heap)
                parent = self._parent[key]  # before the drop, which may remove the node
                self._drop(key, rank)
                dropped += 1
                if parent is not None and not self._children.get((parent, rank)):
                    heapq.heappush(heap, (self._touched[parent][rank], parent))
        return dropped

    def _drop(self, key: int, rank: int) -> None:
        owners = self._touched[key]
        del owners[rank]
        self.pages[rank] -= 1
        parent = self._parent[key]
        if parent is not None:
            left = self._children[(parent, rank)] - 1
            if left:
                self._children[(parent, rank)] = left
            else:
                del self._children[(parent, rank)]
        if not owners:  # no rank holds it: the node goes (Tree removes empty childless nodes)
            del self._touched[key]
            del self._parent[key]

    def check(self) -> None:
        """Invariants, for tests: every rank's keys are prefix-closed, the page counts and child
        counts agree with the nodes."""
        pages = [0] * self.num_ranks
        children: dict[tuple[int, int], int] = {}
        for key, owners in self._touched.items():
            assert owners, f"node {key} has no rank left but was not removed"
            parent = self._parent[key]
            for r in owners:
                pages[r] += 1
                if parent is not None:
                    assert r in self._touched.get(parent, {}), f"rank {r} holds {key} but not its parent {parent}"
                    children[(parent, r)] = children.get((parent, r), 0) + 1
        assert pages == self.pages, f"page counts {self.pages} != counted {pages}"
        assert children == self._children, "child counts drifted from the nodes"
