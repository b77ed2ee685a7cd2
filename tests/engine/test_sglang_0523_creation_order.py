"""Issue 43 (found by tests/sglang/hunt.py: decode pressure under `--eviction-policy filo`, 23 of
45 prefill steps apart from step 7, and a conversation slice at page 64): fifo and filo order
nodes by their creation as SGLang 0.5.23's tree does, within one virtual instant too.

SGLang 0.5.23's `FIFOStrategy.get_priority` is `node.creation_time`, `FILOStrategy`'s
`-node.creation_time` (mem_cache/evict_policy.py), and a node's `creation_time` is the tree's
logical counter (`UnifiedTreeNode.__init__`: `get_and_increase_time_counter()`, the counter the
access stamps use too), not a clock: two nodes made in one batch are still older and newer.
`UnifiedTreeCore._split_node` gives the new upper half the lower half's `creation_time`.
The engine keyed fifo by (created_ns, node id) and filo by (-created_ns, node id): within an
instant filo evicted the oldest node first, where SGLang evicts the newest; and a split's upper
half (a new node id) ranked as made at the split among its instant's nodes under both. Both keys
now read `created_seq`, the tree's counter at the node's creation (a split's upper half keeps the
lower's under 0.5.23; under 0.5.9, whose `HiRadixCache._split_node` makes a new node at the split's
`time.monotonic()`, it is the split's).
"""

from __future__ import annotations

import pytest

from tierdiag.engine.rules import RULE_SETS
from tierdiag.engine.tree import RadixTree


def _order(tree: RadixTree) -> list[int]:
    out = []
    while (node := tree.pop_device_victim()) is not None:
        out.append(node.keys[0])
        tree.delete(node)
    return out


def _tree(policy: str, version: str = "0.5.23") -> RadixTree:
    return RadixTree(64, policy, rules=RULE_SETS[version])


@pytest.mark.parametrize("policy,expected", [("fifo", [1, 2, 3]), ("filo", [3, 2, 1])])
def test_nodes_made_at_one_instant_leave_in_creation_order(policy, expected):
    """Three prompts inserted by one batch at t=0: fifo evicts the first made first, filo the last
    made first (the node id alone gave filo 1, 2, 3)."""
    tree = _tree(policy)
    for slot, key in enumerate((1, 2, 3)):
        tree.insert([key], 0, [slot], now_ns=0)
    assert _order(tree) == expected


@pytest.mark.parametrize("version,expected", [("0.5.23", [2, 1, 5]), ("0.5.9", [2, 5, 1])])
def test_a_splits_upper_half_keeps_its_creation_under_0523(version, expected):
    """[1, 2] made before [5], both at t=0; a match of [1] at t=1 splits [1, 2]. Under fifo the
    lower half [2] (made first) goes first, then, under 0.5.23, the upper half [1] (it keeps the
    creation of [1, 2]: made before [5]); under 0.5.9 the upper half is a node made at the split
    (t=1), after [5]."""
    tree = _tree("fifo", version)
    tree.insert([1, 2], 0, [0, 1], now_ns=0)
    tree.insert([5], 0, [2], now_ns=0)
    m = tree.match([1], now_ns=1)
    assert [n.keys for n in m.device_nodes] == [[1]]  # split: [1] over [2]
    assert _order(tree) == expected


def test_a_chunk_is_stashed_after_its_batchs_other_inserts():
    """Found by the hunt next (synthetic_trace[758:858] at 4x, page 16, shortest-prefill-first,
    write_back, filo: step 21 evicted 24,336 device tokens where SGLang evicted 18,848): a
    chunked request's chunk enters the tree at the next pass's start
    (`Scheduler.get_next_batch_to_run` -> `stash_chunked_request` -> `cache_unfinished_req`),
    after `process_batch_result` inserted the batch's other requests (`cache_unfinished_req` for
    those that go on decoding, `cache_finished_req` for those done): at one virtual instant, but
    SGLang's counter makes the chunk's nodes newer than theirs (filo evicts them first; lru too
    sees them as the more recent). The engine stashed the chunk first (the batch's order: a
    continuing chunk leads its batch).

    a (40 pages) chunks at a 16-page budget; b and c (a page + 1 token each) arrive during its
    first chunk, and shortest-prefill-first caps a's second chunk to leave them room
    (`shortest_prefill_chunk_limit`): batch 2 is [a's 12 pages, b, c]."""
    from tests.engine import helpers
    from tests.engine.helpers import PS, req
    from tierdiag.engine.engine import Engine
    from tierdiag.probes import events as ev

    class Prefills(helpers.Collect):
        def __init__(self):
            super().__init__()
            self.done: list[tuple[int, str, int]] = []

        def emit(self, event):
            super().emit(event)
            if isinstance(event, ev.PrefillDone):
                self.done.append((event.batch_id, event.req_id, event.extend_tokens))

    probe = Prefills()
    engine = Engine(helpers.small_config(device_tokens=128 * PS, host_tokens=256 * PS, max_prefill_tokens=16 * PS,
                                         schedule_policy="shortest-prefill-first"), probe=probe)
    engine.run(helpers.numbered([req("a", 0, list(range(1, 41)), output=2), req("b", 0.5, [100], output=3),
                                 req("c", 0.5, [200], output=3)]))
    engine.check_invariants(idle=True)
    second = [(rid, n) for bid, rid, n in probe.done if bid == probe.done[1][0]]
    assert second == [("a", 12 * PS), ("b", PS + 1), ("c", PS + 1)]
    root = engine.scheduler.tree.root
    a1 = next(n for n in root.children.values() if len(n.keys) == 16)  # a's first chunk
    (a2,) = a1.children.values()  # its second
    assert len(a2.keys) == 12
    b, c = (next(n for n in root.children.values() if n.owner == rid) for rid in "bc")
    assert a2.created_ns == b.created_ns == c.created_ns
    assert b.created_seq < c.created_seq < a2.created_seq
