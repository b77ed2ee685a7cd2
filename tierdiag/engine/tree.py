"""The radix tree over page keys. It knows residency and locks, never bytes (SGLang's split:
the tree owns residency, the pools own slots and buffers, the controller owns copies).

A node holds a run of pages. Page keys are chained (a key names its whole prefix), so a node
whose last key matches is matched entirely, and the matched length inside a node is found by
binary search instead of a page-by-page walk.

Residency invariants (checked by tests):
- every node is on device, on host, or both;
- device-resident nodes form a root-connected prefix (a device node's parent is on device);
- `lock_ref` of a node counts the locks held on it or on any node below it.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush  # names, not the module's attributes: a look-up a call fewer
from typing import Any, Final, cast

from tierdiag.config.policies import EVICTION_POLICIES, EvictionPolicy
from tierdiag.engine.rules import RULE_SETS, RuleSet
from tierdiag.engine.tree_node import NO_SLOTS, KeyRun, SlotRun, TreeInsert, TreeMatch, TreeNode, WalkMemo
from tierdiag.native import cplane

# Final: a C static the compiled module reads, where an imported name is a look-up in the module's
# dict at every use (~130 instructions; issue 41, session 24)
_HEAPPUSH: Final = heappush
_HEAPPOP: Final = heappop
_HEAPIFY: Final = heapify
# lru's heap entries are single ints, key << _ID_BITS | node id (RadixTree._lru_entry): node ids
# stay below 2**_ID_BITS (a replay makes a few million nodes)
_ID_BITS: Final = 48
_ID_MASK: Final = (1 << 48) - 1
# The compiled side of lru's entries (None on the numpy data plane): an entry made, and its id
# read back, in one C call each, where compiled code made each through big-int operations (a new
# int each: ~900 instructions an entry, ~400 an id; issue 41, session 27)
_C_LRU_ENTRY: Final[Any] = cplane.compiled("lru_entry")
_C_LRU_ID: Final[Any] = cplane.compiled("lru_id")
# lru's heaps as C structs (native/csrc/lru_heap.c; None on the numpy data plane): an entry is
# (ns, seq, id), three int64s in the int entry's order where its stamp is in range, pushed and
# popped in one C call each, where the list heap's pushes and pops were big-int compares (~650
# instructions a pop) and each stamp's entry a big int made (issue 41, session 31). A stamp it
# cannot hold turns the tree's heaps into the list heaps (RadixTree._to_list_heaps).
_C_LRU_HEAP: Final[Any] = cplane.compiled("LruHeap")
_C_LRU_PUSH: Final[Any] = cplane.compiled("lru_push")
_C_LRU_POP: Final[Any] = cplane.compiled("lru_pop")
_C_LRU_FRESH: Final[Any] = cplane.compiled("lru_fresh")

__all__ = ["RadixTree", "TreeInsert", "TreeMatch", "TreeNode"]


def _child(node: TreeNode, key: Any) -> TreeNode | None:
    """The child of `node` whose first page key is `key` (an int object, read from a key run:
    the children's dict is looked up with that object as it is)."""
    children: dict[Any, TreeNode] = cast("dict[Any, TreeNode]", node.children)
    return children.get(key)


def _parent(node: TreeNode) -> TreeNode:
    """The parent of a node that has one (not the root): typed so that a compiled caller reads
    and writes its fields natively, where `node.parent` (Optional) was a generic attribute
    look-up and store (session 26). A node with none is a bug: TypeError compiled, AttributeError
    at the use in Python."""
    return cast(TreeNode, node.parent)


def common_pages_py(keys: KeyRun, start: int, node_keys: KeyRun) -> int:
    """Pages of node_keys matched by keys[start:]; node_keys[0] == keys[start] is known (the
    reference of _cplane.common_pages, which reads two key runs in place)."""
    m = len(node_keys)
    avail = len(keys) - start
    if avail >= m and keys[start + m - 1] == node_keys[-1]:
        return m
    lo, hi = 1, min(m, avail)  # keys[start+lo-1] matches; find the last matching index
    if keys[start + hi - 1] == node_keys[hi - 1]:
        return hi
    while hi - lo > 1:  # invariant: lo matches, hi does not (chained keys: monotone)
        mid = (lo + hi) // 2
        if keys[start + mid - 1] == node_keys[mid - 1]:
            lo = mid
        else:
            hi = mid
    return lo


# The compiled side (None on the numpy data plane): compiled code reading a key run's items one by
# one makes an int object a read through the generic protocol (~200 instructions; a walk step's
# 2-4 reads were ~900-1,400 instructions, callgrind, issue 41 session 22).
_C_COMMON_PAGES: Final[Any] = cplane.compiled("common_pages")


def common_pages_c(keys: KeyRun, start: int, node_keys: KeyRun) -> int:
    """`common_pages_py` in one C call where both are key runs (what it declines, a list, goes
    to the reference)."""
    if _C_COMMON_PAGES is not None:
        got: int = _C_COMMON_PAGES(keys, start, node_keys)
        if got >= 0:
            return got
    return common_pages_py(keys, start, node_keys)


common_pages = cplane.choose("tree.common_pages", common_pages_c, common_pages_py)


class RadixTree:
    def __init__(self, page_size: int, eviction_policy: "str | EvictionPolicy" = "lru", rules: RuleSet | None = None):
        self.page_size = page_size
        self.rules = rules or next(iter(RULE_SETS.values()))
        # The rule fields a walk and an insert read, typed once: RuleSet is interpreted, so each
        # read from compiled code was a generic attribute look-up (~240 instructions; issue 41)
        self._stamp_after: bool = self.rules.stamp_path_after_walk
        self._priority_before_split: bool = self.rules.insert_priority_before_split
        self._unevict_counts_hit: bool = self.rules.unevict_counts_hit
        # a registry name, or a policy with its settings (policies.configured_eviction_policy)
        policy = eviction_policy if isinstance(eviction_policy, EvictionPolicy) else EVICTION_POLICIES[eviction_policy]
        self.priority = policy.key
        # the registry's lru, its key built here (a compiled tree builds the tuple without a
        # call into the policy's Python function): (last_access_ns, access_seq, id), the same
        self._lru_key = policy.key is EVICTION_POLICIES["lru"].key
        # (declared bool: the policy is Any to mypyc, and an undeclared field of it an object
        # field, a truth test of it a generic call at every stamp and new node; session 26)
        self._repush_on_touch: bool = bool(policy.key_can_shrink)
        self._tree_depths: bool = bool(policy.tree_depths)
        self._next_id = 1
        self.id_step = 1  # node ids: rank + 1, then every num_ranks-th (engine/deployment.py)
        self._seq = 0  # access stamps (TreeNode.access_seq)
        # changes a match could see (TreeNode.mod_seq): a path whose nodes are all at or below
        # a count taken after a match, and whose end has no new child on the keys' way, is the
        # path a new match would walk (the storage re-queries' memo, prefetch.py)
        self.mod_seq = 0
        self.root = TreeNode(0, None, [], [], None, 0, None)
        self.root.lock_ref = 1  # the root is never evicted
        self.device_pages = 0  # pages of tree nodes on device (the root holds none)
        self.locked_device_pages = 0
        self.locked_host_pages = 0
        # lru: the heaps are C heaps of (ns, seq, id) entries (_C_LRU_HEAP) while every stamp
        # fits them, else lists of ints (_lru_entry); a popped entry's node is found by its id
        # here (every node in the tree but the root, from its creation to its delete)
        self._c_heaps: bool = self._lru_key and _C_LRU_HEAP is not None
        self._device_heap: Any = _C_LRU_HEAP() if self._c_heaps else []
        self._host_heap: Any = _C_LRU_HEAP() if self._c_heaps else []
        self._by_id: dict[int, TreeNode] = {}
        # UnifiedTreeCore.full_host_duplicates (0.5.23): nodes whose KV was on both tiers when
        # last registered, in registration order (a backup's ack, a split, a refill, a load-back);
        # entries go stale lazily and are re-checked when host pressure reads them.
        self.host_duplicates: dict[int, TreeNode] = {}
        self.tracks_duplicates = False  # set by the controller when host pressure reads them
        # node id -> the anchor of the load-back that filled it, until that load's ack (0.5.23's
        # `load_back_pending_id`: not a settled duplicate meanwhile; a split's upper half inherits
        # it, "split fragments stay on the anchor's root path for the ack's walk")
        self.load_pending: dict[int, int] = {}

    def number_nodes(self, first: int, step: int) -> None:
        """New nodes get ids first, first + step, ... (a rank's tree in a deployment: rank + 1,
        then every num_ranks-th, so no two ranks' node ids meet)."""
        self._next_id, self.id_step = first, step

    def _new_node(self, parent: TreeNode, keys: KeyRun, device, host, now_ns: int, owner) -> TreeNode:
        node = TreeNode(self._next_id, parent, keys, device, host, now_ns, owner)
        self._next_id += self.id_step
        if self._lru_key:
            self._by_id[node.id] = node
        self._seq += 1
        node.access_seq = node.created_seq = self._seq
        parent.children[keys[0]] = node
        if device is not None:
            parent.n_dev_children += 1
            self.device_pages += len(keys)
        if self._tree_depths:  # UnifiedTreeCore's _set_tlru_lens_and_raise_history (0.5.23)
            node.tlru_depth = node.tlru_history = parent.tlru_depth + len(keys) * self.page_size
            cur: TreeNode | None = parent
            while cur is not None and cur.tlru_history < node.tlru_depth:
                cur.tlru_history = node.tlru_depth
                cur = cur.parent
        return node

    @property
    def evictable_device_pages(self) -> int:
        """Device pages eviction could free now: SGLang's evictable_size() (unlocked tree pages)."""
        return self.device_pages - self.locked_device_pages

    # --- matching ------------------------------------------------------------------------
    @staticmethod
    def _common_pages(keys: KeyRun, start: int, node_keys: KeyRun) -> int:
        """Pages of node_keys matched by keys[start:]; node_keys[0] == keys[start] is known.
        The compiled side reads both runs in C (`common_pages_c`); the numpy data plane's, the
        reference."""
        if _C_COMMON_PAGES is not None:
            return common_pages_c(keys, start, node_keys)
        return common_pages_py(keys, start, node_keys)

    def _stamp(self, node: TreeNode, now_ns: int) -> None:
        node.last_access_ns = now_ns
        self._seq += 1
        node.access_seq = self._seq
        if self._repush_on_touch:
            self._touched(node)

    def _changed(self, node: TreeNode) -> None:
        self.mod_seq += 1
        node.mod_seq = self.mod_seq

    def touch_path(self, match: TreeMatch, now_ns: int) -> None:
        """A match's access stamps again, on a path known unchanged (TreeNode.mod_seq): the
        stamps `walk` makes, in its order (the path's, device nodes first), no split, no owner."""
        for node in match.device_nodes:
            self._stamp(node, now_ns)
        for node in match.host_nodes:
            self._stamp(node, now_ns)

    def _split(self, node: TreeNode, pages: int, now_ns: int | None = None) -> TreeNode:
        """Cut `node` after `pages` pages; return the new upper part (which takes node's place).

        With `now_ns` (a match or an insert splitting it) the lower half is stamped too: 0.5.9's
        callers stamp the node before `HiRadixCache._split_node`, 0.5.23's
        `UnifiedTreeCore._split_node` stamps the lower half after making the upper one. The upper
        half is created at the split under 0.5.9 (a new TreeNode), keeps the node's creation time
        under 0.5.23 (`split_upper_created_at_split`)."""
        parent = _parent(node)
        fresh = now_ns is not None and self.rules.split_upper_created_at_split
        created = now_ns if fresh and now_ns is not None else node.created_ns
        upper = TreeNode(self._next_id, parent, node.keys[:pages],
                         None if node.device is None else node.device[:pages],
                         None if node.host is None else node.host[:pages],
                         created, node.owner)
        self._next_id += self.id_step
        if self._lru_key:
            self._by_id[upper.id] = upper
        upper.lock_ref = node.lock_ref
        upper.hit_count = node.hit_count
        upper.last_access_ns = node.last_access_ns
        upper.access_seq = node.access_seq
        if fresh:  # 0.5.9: a new node, created at the split (HiRadixCache._split_node)
            self._seq += 1
            upper.created_seq = self._seq
        else:  # 0.5.23: the lower half's creation, both halves (UnifiedTreeCore._split_node)
            upper.created_seq = node.created_seq
        upper.prefetched_for = node.prefetched_for
        upper.evicted_by = node.evicted_by
        upper.priority = node.priority  # SGLang: the new node inherits the child's priority
        # UnifiedTreeCore._split_node under tlru: the upper half sits at the parent's depth + its
        # tokens with the branch's history; the lower half keeps both.
        upper.tlru_depth = parent.tlru_depth + pages * self.page_size if self._tree_depths else 0
        upper.tlru_history = node.tlru_history
        node.keys = node.keys[pages:]
        self._changed(node)
        if node.device is not None:
            node.device = node.device[pages:]
        if node.host is not None:
            node.host = node.host[pages:]
        parent.children[upper.keys[0]] = upper
        upper.children = {node.keys[0]: node}
        upper.n_dev_children = 1 if node.device is not None else 0
        node.parent = upper
        if now_ns is not None:
            self._stamp(node, now_ns)
        elif self._repush_on_touch and self._tree_depths:
            self._touched(node)  # tlru: a deeper parent can make the lower half TEL-safe
        anchor = self.load_pending.get(node.id)
        if anchor is not None:
            self.load_pending[upper.id] = anchor
        self.track_duplicate(upper)
        return upper

    def walk(self, keys: KeyRun, now_ns: int | None = None, owner: str | None = None) -> list[TreeNode]:
        """The path of nodes matching a prefix of `keys`, the last one split so the path ends
        exactly where the match does. With `now_ns`, touches each node's access time (and, with
        `owner`, records who used it). Matching never counts a hit: SGLang 0.5.9 counts hits per
        insert (HiRadixCache._inc_hit_count), not per match_prefix."""
        node = self.root
        i, n = 0, len(keys)
        path: list[TreeNode] = []
        stamp_after = self._stamp_after
        while i < n:
            child = _child(node, keys[i])
            if child is None:
                break
            m = self._common_pages(keys, i, child.keys)
            if m < len(child.keys):
                child = self._split(child, m, now_ns)
            if now_ns is not None:
                if owner is not None:
                    child.owner = owner
                if not stamp_after:
                    self._stamp(child, now_ns)  # HiRadixCache._match_prefix_helper: as it walks
            path.append(child)
            node = child
            i += m
        if now_ns is not None and stamp_after:
            for child in path:  # _match_post_processor: the best-match path, deepest newest
                self._stamp(child, now_ns)
        return path

    def touch_walk(self, keys: KeyRun, now_ns: int, memo: WalkMemo | None, owner: str | None = None) -> WalkMemo:
        """`walk(keys, now_ns, owner)` through `memo`, the path an earlier call returned for these
        keys: where it still holds (`_memo_path_holds`) its nodes get `owner` (when given) and
        their stamps in path order, what the walk would do (no split: every node of a held path
        is matched whole; no eviction key reads the owner, so owners before stamps is the walk's
        outcome under either stamp order), without the walk's key reads and child look-ups a node
        (issue 41: ~2k instructions a walk). 0.5.23's `_touch_waiting_prefixes` (no owner, ~17k
        walks on conversation[:3000]) and an admission's match of a whole key run (`match_of`
        the path) keep a request's memo between them. Returns the memo to keep: `memo`, updated
        in place where it was stale, or a new one; its `path` is the walk's."""
        if memo is not None and self._memo_path_holds(memo, keys):
            if owner is not None:
                for node in memo.path:
                    node.owner = owner
            for node in memo.path:
                self._stamp(node, now_ns)
            return memo
        path = self.walk(keys, now_ns, owner)
        pages = 0
        for node in path:
            pages += len(node.keys)
        n = len(keys)
        if memo is None:
            return WalkMemo(self, keys, n, path, pages, self.mod_seq)
        memo.tree, memo.keys, memo.n, memo.path, memo.pages, memo.seq = self, keys, n, path, pages, self.mod_seq
        memo.next_key = keys[pages] if pages < n else None
        return memo

    def _memo_path_holds(self, memo: WalkMemo, keys: KeyRun) -> bool:
        """Whether a walk of `keys` now would walk `memo`'s path: the same tree, key run and
        length (a retraction extends a run in place; no key of a run is ever rewritten); no node
        of the path changed since (a split, a delete, a copy gained or lost: each moves the
        node's `mod_seq` past the memo's count; a node's keys and parent change only by its
        split); and the path's end has no child on the keys' way (a child added there since
        would extend the walk)."""
        if memo.tree is not self or memo.keys is not keys or memo.n != len(keys):
            return False
        seq = memo.seq
        path = memo.path
        for node in path:
            if node.mod_seq > seq:
                return False
        if memo.next_key is not None:
            end = path[-1] if path else self.root
            if _child(end, memo.next_key) is not None:
                return False
        return True

    def _touched(self, node: TreeNode) -> None:
        """A policy whose key can shrink (mru) needs the node re-pushed with its new key."""
        self._push_device(node)
        self._push_host(node)

    def match(self, keys: KeyRun, now_ns: int, owner: str | None = None) -> TreeMatch:
        """Longest cached prefix of `keys`, split by residency (SGLang's match_prefix: touches
        the access time of every node on the path)."""
        return self.match_of(self.walk(keys, now_ns, owner))

    @staticmethod
    def match_of(path: list[TreeNode]) -> TreeMatch:
        """A walk's path split by residency (`match`'s answer)."""
        on_device = 0
        while on_device < len(path) and path[on_device].device is not None:
            on_device += 1
        return TreeMatch(tuple(path[:on_device]), tuple(path[on_device:]))

    def peek(self, keys) -> tuple[int, int]:
        """Pages of the longest cached prefix of `keys` on device, and after them on host only,
        with no side effect at all: no access stamp, no split, no lock (a deployment asks every
        rank this at each arrival, engine/deployment.py). A partly matched node counts the pages
        matched, as `match` would after splitting it."""
        node = self.root
        children = node.children
        i, n = 0, len(keys)
        device = host = 0
        while i < n:
            child = children.get(keys[i])
            if child is None:
                break
            m = self._common_pages(keys, i, child.keys)  # (named here: a native call, not a bound method's)
            if child.device is not None and not host:
                device += m
            else:
                host += m
            if m < len(child.keys):
                break
            i += m
            children = child.children
        return device, host

    def locate(self, keys: KeyRun) -> tuple[TreeNode, int]:
        """Deepest node on the path of `keys` and the pages matched, without touching anything
        (prefetch bookkeeping, not a request's match)."""
        path = self.walk(keys)
        return (path[-1] if path else self.root), sum(len(node.keys) for node in path)

    # --- insertion -----------------------------------------------------------------------
    def insert(self, keys: KeyRun, own_from: int, device_slots: SlotRun, now_ns: int,
               owner: str | None = None, *, count_hits: bool = True, priority: int = 0,
               inserted: int = 0) -> TreeInsert:
        """Give the tree a computed prefix: `keys[:own_from]` are already in the tree on device
        (the caller holds a lock on them), `device_slots` hold pages `keys[own_from:]`.

        As HiRadixCache.insert (SGLang 0.5.9): a device-resident node on the path is a duplicate
        (our slots for it are returned to be freed) and, unless `count_hits` is off (a chunk
        insert, or write_back), gets one more hit; a host-only node on the path is revived with
        our slots (0.5.9: no hit, "KV cache recomputation"; 0.5.23: a hit, `unevict_counts_hit`,
        and so a write-through candidate); the rest becomes a new node whose first
        hit is this insert. Every node passed keeps the max of its priority and ours.

        `inserted` (pages, 0.5.23's `InsertParams.inserted_len` = `req.kv.cache_inserted_len`):
        only a node ending past it gains the hit (`_finish_insert_walk_node`,
        `_should_backup_after_insert`: "nodes this request already inserted were counted back
        then"); 0.5.9's callers pass 0.

        Returns a TreeInsert. A new node keeps a slice of `keys` (a key run's: one memcpy).
        """
        assert len(keys) - own_from == len(device_slots), "one device slot per page key"
        node = self.root
        i, n = 0, len(keys)
        dups: SlotRun = None  # made at the first duplicate (most inserts have none)
        fresh: list[TreeNode] = []
        hit: list[TreeNode] = []
        stamp_after = self._stamp_after
        while i < n:
            child = _child(node, keys[i])
            if child is None:
                assert i >= own_from, f"page {i} of a locked prefix is missing from the tree"
                child = self._new_node(node, keys[i:], device_slots[i - own_from:], None, now_ns, owner)
                child.priority = priority
                if count_hits and n > inserted:
                    child.hit_count = 1
                    hit.append(child)
                fresh.append(child)
                self._push_device(child)
                return TreeInsert(child, NO_SLOTS if dups is None else dups, fresh, hit)
            m = self._common_pages(keys, i, child.keys)
            if i < own_from < i + m:  # keep the locked prefix and our pages in separate nodes
                m = own_from - i
            if m < len(child.keys):
                if priority > child.priority and self._priority_before_split:
                    child.priority = priority  # 0.5.9: the lower half keeps it too
                lower = child
                child = self._split(child, m, None if stamp_after else now_ns)
            else:
                lower = None
            if i >= own_from and child.device is None:
                self.set_device(child, device_slots[i - own_from:i - own_from + m])
                fresh.append(child)
                self.track_duplicate(child)  # _unevict_node_on_insert: a duplicate at once
                if count_hits and self._unevict_counts_hit and i + m > inserted:
                    child.hit_count += 1  # _finish_insert_walk_node (0.5.23)
                    hit.append(child)
            else:
                assert i >= own_from or child.device is not None, f"{child}: locked prefix page not on device"
                if i >= own_from:
                    part = device_slots[i - own_from:i - own_from + m]
                    if dups is None:
                        dups = part  # a new run (a slice), ours to extend
                    else:
                        dups.extend(part)
                if count_hits and i + m > inserted:
                    child.hit_count += 1
                    hit.append(child)
            self._stamp(child, now_ns)
            if lower is not None and stamp_after:
                self._stamp(lower, now_ns)  # UnifiedTreeCore._split_node: the lower half, after
            if priority > child.priority:
                child.priority = priority
            child.owner = owner
            node = child
            i += m
        return TreeInsert(node, NO_SLOTS if dups is None else dups, fresh, hit)

    def insert_host(self, parent: TreeNode, keys: KeyRun, host_slots: SlotRun, now_ns: int,
                    owner: str | None) -> TreeNode:
        """Attach host-only pages (a storage prefetch) below `parent`, which must be the path's end."""
        assert keys and keys[0] not in parent.children, "prefetched pages must extend the tree"
        node = self._new_node(parent, keys, None, host_slots, now_ns, owner)
        node.priority = parent.priority  # HiRadixCache._insert_helper_host
        self._push_host(node)
        return node

    # --- residency changes ---------------------------------------------------------------
    def set_device(self, node: TreeNode, slots: SlotRun) -> None:
        assert node.device is None and len(slots) == len(node.keys)
        parent = _parent(node)
        assert parent.device is not None, f"{node}: device residency must stay root-connected"
        node.device = slots
        self._changed(node)
        parent.n_dev_children += 1
        self.device_pages += len(slots)
        if node.lock_ref:
            self.locked_device_pages += len(slots)
        self._push_device(node)

    def set_host(self, node: TreeNode, slots: SlotRun) -> None:
        assert node.host is None and len(slots) == len(node.keys)
        node.host = slots
        self._changed(node)
        if node.lock_ref:
            self.locked_host_pages += len(slots)

    def demote(self, node: TreeNode) -> SlotRun:
        """Device copy goes, host copy stays. Returns the freed device slots."""
        assert node.host is not None and node.lock_ref == 0 and node.n_dev_children == 0
        slots, node.device = node.device, None
        self._changed(node)
        parent = _parent(node)
        parent.n_dev_children -= 1
        self.device_pages -= len(slots)
        self._push_device(parent)
        self._push_host(node)
        return slots

    def delete(self, node: TreeNode) -> tuple[SlotRun, SlotRun]:
        """Remove a leaf from the tree. Returns its (device slots, host slots)."""
        assert node.lock_ref == 0 and not node.children, f"{node}: only unlocked leaves are deleted"
        parent = _parent(node)
        del parent.children[node.keys[0]]
        if self.host_duplicates:  # (empty unless host pressure reads them: no generic `pop` call then)
            self.host_duplicates.pop(node.id, None)
        if node.device is not None:
            parent.n_dev_children -= 1
            self.device_pages -= len(node.device)
        node.parent = None
        if self._lru_key:
            del self._by_id[node.id]  # its heap entries, if any, are skipped when popped
        self._changed(node)
        self._push_device(parent)
        self._push_host(parent)
        return node.device or [], node.host or []

    def drop_host(self, node: TreeNode) -> SlotRun:
        """Free a node's host copy while its device copy stays (0.5.23's
        `_release_full_host_duplicate`). Returns the host slots."""
        assert node.device is not None and node.host is not None, f"{node}: not on both tiers"
        slots, node.host = node.host, None
        self._changed(node)
        if node.lock_ref:
            self.locked_host_pages -= len(slots)
        self.host_duplicates.pop(node.id, None)
        return slots

    # --- host duplicates (UnifiedTreeCore._update_duplicate_tracking, 0.5.23) --------------
    def track_duplicate(self, node: TreeNode) -> None:
        """Register a node settled on both tiers (kept in its first place if already there), or
        deregister it. Called where 0.5.23 calls it: a backup's ack, a split's upper half, a
        refill by insert, a load-back's completion."""
        if not self.tracks_duplicates:
            return
        if node.parent is not None and node.device is not None and node.host is not None \
                and node.id not in self.load_pending:  # _is_settled_full_host_duplicate
            self.host_duplicates.setdefault(node.id, node)
        else:
            self.host_duplicates.pop(node.id, None)

    # --- locks ---------------------------------------------------------------------------
    def inc_lock(self, node: TreeNode | None) -> None:
        while node is not None:
            if node.lock_ref == 0:
                if node.device is not None:
                    self.locked_device_pages += len(node.keys)
                if node.host is not None:
                    self.locked_host_pages += len(node.keys)
            node.lock_ref += 1
            node = node.parent

    def dec_lock(self, node: TreeNode | None) -> None:
        while node is not None:
            assert node.lock_ref > 0, f"{node}: lock_ref would go negative (unbalanced dec_lock)"
            node.lock_ref -= 1
            if node.lock_ref == 0:
                if node.device is not None:
                    self.locked_device_pages -= len(node.keys)
                    self._push_device(node)
                if node.host is not None:
                    self.locked_host_pages -= len(node.keys)
                    self._push_host(node)
            node = node.parent

    # --- host protection (SGLang's protect_host / release_host) ---------------------------
    def protect_host(self, node: TreeNode) -> None:
        node.host_ref += 1

    def release_host(self, node: TreeNode) -> None:
        assert node.host_ref > 0, f"{node}: host protection released twice"
        node.host_ref -= 1
        if node.host_ref == 0:
            self._push_host(node)

    # --- eviction candidates (lazy heaps: a stale entry is re-pushed with its current key when
    #     popped; a policy whose keys can shrink re-pushes on every touch, see _touched) ---
    @staticmethod
    def device_evictable(node: TreeNode) -> bool:
        return (node.parent is not None and node.device is not None and node.lock_ref == 0
                and node.n_dev_children == 0)

    @staticmethod
    def host_evictable(node: TreeNode) -> bool:
        return (node.parent is not None and node.device is None and node.host is not None
                and node.lock_ref == 0 and node.host_ref == 0 and not node.children)

    def _key(self, node: TreeNode) -> Any:
        """The node's eviction key under the tree's policy (`EvictionPolicy.key`). lru's
        (last_access_ns, access_seq, id) is one int, last_access_ns * 2**64 + access_seq: the
        same order (access_seq counts from 0 and never reaches 2**64, so it never carries into
        the time; ns may be any int); its heap entries add the id below it (`_lru_entry`)."""
        if self._lru_key:
            return self._lru_entry(node) >> _ID_BITS
        return self.priority(node)

    def _lru_entry(self, node: TreeNode) -> int:
        """lru's heap entry: (last_access_ns << 64 | access_seq) << 48 | id, one int ordered as
        the tuple (key, id) was, and where two nodes tie on both stamps (a split's halves) by id
        as the tuple's second item did. The heap compares two ints, one call, where a tuple entry
        was the tuple's compare and two of its items' (its EQ, then LT) and a tuple allocated a
        push; those compares were ~5 % of Scheduler.run (callgrind, issue 41 session 24). Made
        once a stamp (TreeNode.lru_key): a node is keyed at every push and at every pop of one of
        its entries, mostly between the same two stamps, and the big-int operations cost ~900
        instructions compiled (callgrind, issue 41)."""
        seq = node.access_seq
        if node.lru_key_seq != seq:
            nid = node.id
            if nid < 0 or nid > _ID_MASK:
                raise ValueError(f"node id {nid} outside the lru heap's [0, 2**{_ID_BITS})")
            entry: Any = None if _C_LRU_ENTRY is None else _C_LRU_ENTRY(node.last_access_ns, seq, nid)
            if entry is None:  # (the numpy data plane; a stamp outside [0, 2**63): the C's None)
                entry = ((((node.last_access_ns << 64) | seq)) << _ID_BITS) | nid  # policies._lru
            node.lru_key = entry
            node.lru_key_seq = seq
        return node.lru_key

    def _push_device(self, node: TreeNode) -> None:
        if self.device_evictable(node):
            if self._lru_key:
                if self._c_heaps:
                    if _C_LRU_PUSH(self._device_heap, node.last_access_ns, node.access_seq, node.id):
                        return
                    self._to_list_heaps()
                _HEAPPUSH(self._device_heap, self._lru_entry(node))
            else:
                _HEAPPUSH(self._device_heap, (self.priority(node), node.id, node))

    def _push_host(self, node: TreeNode) -> None:
        if self.host_evictable(node):
            if self._lru_key:
                if self._c_heaps:
                    if _C_LRU_PUSH(self._host_heap, node.last_access_ns, node.access_seq, node.id):
                        return
                    self._to_list_heaps()
                _HEAPPUSH(self._host_heap, self._lru_entry(node))
            else:
                _HEAPPUSH(self._host_heap, (self.priority(node), node.id, node))

    def _to_list_heaps(self) -> None:
        """The C heaps turned into lru's list heaps of int entries, for good: a stamp the C
        cannot hold (a negative time, one past 2**63, not an int) goes where any int goes. Each
        entry becomes the int of the same order (_lru_entry's expression), so the entries popped
        after are those the list heaps would have popped all along."""
        if not self._c_heaps:
            return
        self._c_heaps = False
        device: list[int] = []
        for ns, seq, nid in self._device_heap.items():
            device.append((((ns << 64) | seq) << _ID_BITS) | nid)
        host: list[int] = []
        for ns, seq, nid in self._host_heap.items():
            host.append((((ns << 64) | seq) << _ID_BITS) | nid)
        _HEAPIFY(device)
        _HEAPIFY(host)
        self._device_heap = device
        self._host_heap = host

    def _pop(self, heap: Any, device: bool) -> TreeNode | None:
        """The next victim of the device heap (`device`) or the host heap. The entry is typed
        and the check named (not a callable passed in, not a tuple unpacked): compiled, the
        entry's items are read in place and the check is a native call, where an unpack of
        what heappop returns iterated it and a passed callable went through Python's calling
        convention (~60 M instructions of a 3,000-request run, issue 41)."""
        if self._lru_key:
            return self._pop_lru(heap, device)
        while heap:
            entry: tuple[Any, int, TreeNode] = _HEAPPOP(heap)
            node = entry[2]
            if not (self.device_evictable(node) if device else self.host_evictable(node)):
                continue
            current = self.priority(node)
            if current != entry[0]:
                _HEAPPUSH(heap, (current, node.id, node))
                continue
            # drop duplicates of the same node still in the heap lazily (they fail the check later)
            return node
        return None

    def _pop_lru(self, heap: Any, device: bool) -> TreeNode | None:
        """`_pop` on lru's int entries: the node by its id (a deleted node's entries find none,
        as the tuple's node failed the evictable check once detached), then the same checks."""
        if self._c_heaps:
            return self._pop_lru_c(heap, device)
        # (keys Any to mypyc: the id the C hands back is looked up as the object it is, not
        # unboxed into an int and boxed again)
        by_id: dict[Any, TreeNode] = cast("dict[Any, TreeNode]", self._by_id)
        while heap:
            entry: int = _HEAPPOP(heap)
            nid: Any = _C_LRU_ID(entry) if _C_LRU_ID is not None else entry & _ID_MASK
            node = by_id.get(nid)
            if node is None:
                continue
            if not (self.device_evictable(node) if device else self.host_evictable(node)):
                continue
            current = self._lru_entry(node)
            if current != entry:  # re-stamped since: back in with its current entry
                _HEAPPUSH(heap, current)
                continue
            return node
        return None

    def _pop_lru_c(self, heap: Any, device: bool) -> TreeNode | None:
        """`_pop_lru` on the C heaps: lru_pop takes entries off until one's id finds a node
        and hands the node out; the checks are `_pop_lru`'s, in its order, the entry's stamp
        compared in C (lru_fresh) and a stale one's current entry pushed back (a stamp the C
        cannot hold: the list heaps from here on, the node's entry pushed there)."""
        by_id: dict[Any, TreeNode] = cast("dict[Any, TreeNode]", self._by_id)
        while True:
            node: TreeNode | None = _C_LRU_POP(heap, by_id)
            if node is None:
                return None
            if not (self.device_evictable(node) if device else self.host_evictable(node)):
                continue
            if _C_LRU_FRESH(heap, node.last_access_ns, node.access_seq):
                return node
            if not _C_LRU_PUSH(heap, node.last_access_ns, node.access_seq, node.id):
                self._to_list_heaps()
                heap = self._device_heap if device else self._host_heap
                _HEAPPUSH(heap, self._lru_entry(node))
                return self._pop_lru(heap, device)

    def pop_device_victim(self) -> TreeNode | None:
        return self._pop(self._device_heap, True)

    def pop_host_victim(self) -> TreeNode | None:
        return self._pop(self._host_heap, False)

    # --- inspection (tests, invariants) --------------------------------------------------
    def nodes(self):
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())
