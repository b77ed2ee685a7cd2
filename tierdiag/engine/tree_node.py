"""The radix tree's node (residency, locks, the fields eviction keys read: config/policies.py's
EvictionNode) and what the tree's operations return (TreeMatch, TreeInsert). engine/tree.py
holds the operations.
"""

from __future__ import annotations

from array import array
from typing import Any, Final, Iterator

# A run of pool slots, one a page: an array('q') as PagePool.alloc hands it out (int64 values, no
# int object a slot: sliced, joined, freed and read by the C data plane as one buffer; issue 41,
# session 21). Anything with len, slicing and iteration over ints works where a run is read (a
# list or tuple in tests); `NO_SLOTS` is the empty run nobody extends (TreeInsert's duplicates).
SlotRun = Any
# (Final: compiled, a module static, not a look-up in the module's dict a read)
NO_SLOTS: Final[tuple[int, ...]] = ()
_EMPTY: Final[Any] = array("q")

# A run of page keys: an array('q') as the engine makes a request's keys (`key_run`; issue 41,
# session 22: no int object a page, sliced at every split and insert as one memcpy, freed as one
# block, handed to C as a buffer). As with `SlotRun`, anything with len, slicing, indexing and
# iteration over ints works where a run is read (a list or tuple in tests): item reads give
# ints equal to the list's, so the children dicts, keyed by a run's first key, are the same.
KeyRun = Any


def empty_run() -> Any:
    """A new empty slot run to extend (a slice of an empty array: half array("q")'s cost)."""
    return _EMPTY[:]


def key_list(run: Any) -> list[int]:
    """A key run (or slot run) as a list of ints, for the paths that take lists (the storage
    tier's); a list is copied."""
    return run.tolist() if isinstance(run, array) else list(run)


def key_run(keys_np: Any) -> Any:
    """A request's page keys (a 1-D int64 numpy array) as a key run: two memcpys into a new
    array('q') (its bytes, then the run: frombytes takes only a buffer of bytes), where
    `keys_list` made an int object a page (~20k instructions a request of the conversation
    trace, callgrind, issue 41)."""
    run = _EMPTY[:]
    run.frombytes(keys_np.tobytes())
    return run


class TreeNode:
    __slots__ = ("id", "parent", "children", "keys", "device", "host", "lock_ref", "hit_count",
                 "last_access_ns", "created_ns", "n_dev_children", "owner", "prefetched_for", "evicted_by",
                 "priority", "host_ref", "access_seq", "tlru_depth", "tlru_history", "created_seq",
                 "lru_key", "lru_key_seq", "mod_seq")

    def __init__(self, node_id: int, parent: "TreeNode | None", keys: KeyRun,
                 device: SlotRun, host: SlotRun, now_ns: int, owner: str | None):
        self.id = node_id
        self.parent = parent
        self.children: dict[int, TreeNode] = {}
        # The node's page keys: a key run (sliced from the request's), which the per-page
        # bookkeeping at eviction hands to C as it is (a numpy view of them beside it, kept until
        # issue 41's session 22, cost two numpy slices a split and one an insert).
        self.keys = keys
        self.device = device  # device pool slots, one per page, or None
        self.host = host  # host pool slots, one per page, or None
        self.lock_ref = 0
        self.hit_count = 0
        self.last_access_ns = now_ns
        # The order of access stamps within one virtual instant (the tree's counter): SGLang's
        # clocks never tie (0.5.9's time.monotonic, 0.5.23's logical counter), so neither may ours.
        self.access_seq = 0
        self.created_ns = now_ns
        # The order of creations within one virtual instant (the tree's counter, as access_seq):
        # SGLang 0.5.23's creation_time is its logical counter (UnifiedTreeNode.__init__:
        # get_and_increase_time_counter), so fifo / filo never tie, and a split's upper half
        # keeps the lower's (UnifiedTreeCore._split_node copies creation_time).
        self.created_seq = 0
        self.n_dev_children = 0
        self.owner = owner  # the last request that used these pages
        self.prefetched_for: int | None = None  # request seq whose storage prefetch brought it in
        self.evicted_by: int | None = None  # eviction id that demoted it (host-only nodes)
        self.priority = 0  # max "priority" of the requests that inserted it (eviction policy priority)
        # SGLang's host_ref_counter (protect_host): a prefetch anchored here keeps the host copy
        # from host eviction without pinning any device page.
        self.host_ref = 0
        # tlru's bookkeeping (config/policies.py), kept only when the policy reads it.
        self.tlru_depth = 0
        self.tlru_history = 0
        # lru's heap key (RadixTree._key) as last made, and the access_seq it was made at: only a
        # stamp moves last_access_ns, and every stamp moves access_seq, so a key made at this
        # node's current access_seq is its current key (-1: none made yet)
        self.lru_key = 0
        self.lru_key_seq = -1
        # The tree's change count (RadixTree.mod_seq) at this node's last change that a match
        # can see: its keys or parent (a split), its device or host copy, its deletion. A new
        # child is not one (a memoised path checks the one child it could take, prefetch.py).
        self.mod_seq = 0

    @property
    def num_pages(self) -> int:
        return len(self.keys)

    def __repr__(self) -> str:
        tiers = ("D" if self.device is not None else "") + ("H" if self.host is not None else "")
        return f"<node {self.id} pages={len(self.keys)} {tiers} lock={self.lock_ref}>"


class TreeInsert:
    """What `RadixTree.insert` did: the last node of the path, the caller's slots of pages the
    tree already held on device (to free), the nodes it created or revived, and the nodes whose
    hit count it raised in path order (the write-through candidates).

    A plain class (compiled: a native one, its fields read in place), not a NamedTuple: a
    NamedTuple's `__new__` is an interpreted function (~2.5k instructions an insert, callgrind,
    issue 41). It still unpacks, indexes and compares as the 4-tuple it was."""

    def __init__(self, last: TreeNode, duplicate_slots: SlotRun, fresh: list[TreeNode], hit: list[TreeNode]) -> None:
        self.last = last
        self.duplicate_slots = duplicate_slots
        self.fresh = fresh
        self.hit = hit

    def _tuple(self) -> tuple[TreeNode, SlotRun, list[TreeNode], list[TreeNode]]:
        return (self.last, self.duplicate_slots, self.fresh, self.hit)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._tuple())

    def __getitem__(self, index: int) -> Any:
        return self._tuple()[index]

    def __len__(self) -> int:
        return 4

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TreeInsert):
            return self._tuple() == other._tuple()
        return isinstance(other, tuple) and self._tuple() == other

    def __hash__(self) -> int:
        return id(self)  # (its lists make the tuple it was unhashable; nobody hashes one)

    def __repr__(self) -> str:
        return (f"TreeInsert(last={self.last!r}, duplicate_slots={self.duplicate_slots!r}, "
                f"fresh={self.fresh!r}, hit={self.hit!r})")


class TreeMatch:
    """What the tree knows of a key sequence: the matched path split by residency.

        pages:  |--- device_nodes ---|--- host_nodes ---|   (rest: not in the tree)

    A plain class (compiled: a native one), not a frozen dataclass: its generated `__init__` is
    interpreted and sets each field through `object.__setattr__` (~3.4k instructions a match,
    callgrind, issue 41). Nothing assigns its fields after construction."""

    def __init__(self, device_nodes: tuple[TreeNode, ...], host_nodes: tuple[TreeNode, ...]) -> None:
        self.device_nodes = device_nodes
        self.host_nodes = host_nodes

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, TreeMatch) and self.device_nodes == other.device_nodes
                and self.host_nodes == other.host_nodes)

    def __hash__(self) -> int:
        return hash((self.device_nodes, self.host_nodes))

    def __repr__(self) -> str:
        return f"TreeMatch(device_nodes={self.device_nodes!r}, host_nodes={self.host_nodes!r})"

    # (loops: compiled, `sum` of a generator was a generator object and a builtin call, read
    # two to four times an admission; issue 41, session 26)
    @property
    def device_pages(self) -> int:
        pages = 0
        for n in self.device_nodes:
            pages += len(n.keys)
        return pages

    @property
    def host_pages(self) -> int:
        pages = 0
        for n in self.host_nodes:
            pages += len(n.keys)
        return pages

    @property
    def last_node(self) -> "TreeNode | None":
        if self.host_nodes:
            return self.host_nodes[-1]
        return self.device_nodes[-1] if self.device_nodes else None

    @property
    def last_device_node(self) -> "TreeNode | None":
        return self.device_nodes[-1] if self.device_nodes else None


class WalkMemo:
    """A walk's path kept for the next walk of the same keys (`RadixTree.touch_walk`: 0.5.23's
    refresh of the waiting requests' prefixes walks the same requests pass after pass): the tree
    and key run it was made for and the run's length then, the path, its pages, the key after
    them (the int object the path's end is asked for a child by, read once: None where the path
    took every key), and the tree's change count (RadixTree.mod_seq) just after the walk.
    Mutated in place by a walk that finds it stale (one memo a request, made at its first
    refresh)."""

    def __init__(self, tree: Any, keys: KeyRun, n: int, path: list[TreeNode], pages: int, seq: int) -> None:
        self.tree = tree
        self.keys = keys
        self.n = n
        self.path = path
        self.pages = pages
        self.next_key: Any = keys[pages] if pages < n else None
        self.seq = seq
