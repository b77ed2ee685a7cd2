"""cache_aware's approximate tree in the data plane's C (native/csrc/approx_tree.c: `RouterTree`),
with `approx_tree.ApproxTree` as its Python twin (the reference's reference is `ApproxTreeByKey`).

The Python `ApproxTree`'s walk, a dict lookup, an array read and a compare a run, boxed, was
~2,500 instructions a rank a routed request at --dp 8 (8 ranks a match) and its insert ~6,500
(issue 41, session 27, callgrind): ~0.3 G instructions of a --dp 8 replay of the conversation
trace. `RouterTree` keeps the same runs as structs in one array and every parent's children in
one table; a match is one call, the insert another, the same answers step for step.

`new_tree(num_ranks)` is what CacheAwareRouter builds: `NativeApproxTree` on the compiled data
plane, `ApproxTree` on the numpy one (`cplane.choose`, pair "routing.approx_tree"). The C
type answers the router's calls (insert, prefix_match, touch, evict, smallest_rank, `pages` as a
new list); this subclass adds the walks the tests compare (`_ticks_of`, `holds`, `len`, `check`).
"""

from __future__ import annotations

from typing import Any

from tierdiag.engine.routing.approx_tree import ApproxTree
from tierdiag.native import cplane

_RouterTree: Any = cplane.compiled("RouterTree")


class _TestWalks:
    """What ApproxTree offers the tests beyond the router's calls, from `runs(rank)`:
    (run, parent, tick, keys) of every run of a rank (parent == rank: a child of its root)."""

    def _ticks_of(self: Any, rank: int) -> dict[int, int]:
        """{key: tick} of every key `rank` holds (ApproxTree._ticks_of)."""
        return {key: tick for _, _, tick, keys in self.runs(rank) for key in keys}

    def holds(self: Any, rank: int, key: int) -> bool:
        return key in self._ticks_of(rank)

    def __len__(self: Any) -> int:
        """Nodes in the tree (keys any rank holds)."""
        return len(set().union(*(self._ticks_of(r) for r in range(self.num_ranks))))

    def check(self: Any) -> None:
        """ApproxTree.check's invariants: every run has keys and is its parent's child by its
        first key; a rank holds no key twice; the page counts agree with the runs."""
        pages = self.pages
        for r in range(self.num_ranks):
            runs = self.runs(r)
            ids = {run for run, _, _, _ in runs}
            seen: set[int] = set()
            for run, parent, _, keys in runs:
                assert keys, f"rank {r}: an empty run"
                assert parent == r or parent in ids, f"rank {r}: run {run}'s parent {parent} is not the rank's"
                assert self.child(parent, keys[0]) == run, f"rank {r}: run {keys[0]} is not its parent's child"
                assert seen.isdisjoint(keys), f"rank {r} holds a key twice"
                seen.update(keys)
            assert len(seen) == pages[r], f"rank {r}: page count {pages[r]} != counted {len(seen)}"


NativeApproxTree: Any = None
if _RouterTree is not None:
    class NativeApproxTree(_RouterTree, _TestWalks):  # type: ignore[no-redef]
        """RouterTree with the tests' walks (the C type's methods first)."""
        __slots__ = ()

#: The tree CacheAwareRouter builds: the C one on the compiled data plane, else the Python twin.
new_tree: Any = cplane.choose("routing.approx_tree", NativeApproxTree, ApproxTree)
