"""Issue 43, the last scheduler-harness case (tiered seed 2, page 1, lpm, write_through_selective,
step 38): LPM's prefix match is not capped at the request's last matchable token.

SGLang 0.5.23, `SchedulePolicy._compute_prefix_matches` (schedule_policy.py), for every waiting
request under a cache-aware policy (lpm, hrrn, shortest-prefill-first):

    prefix_ids = r.origin_input_ids + r.output_ids
    match_result = match_kv_cache(r, self.tree_cache, prefix_ids)

with no `max_prefix_len`: `common._req_radix_key` builds a RadixKey without a limit, so
`UnifiedTreeCore.match_prefix` walks the whole page-aligned input and `_match_post_processor`
stamps every node down to its last full page (and `_split_node` splits there). Only the count is
capped: `num_matched_prefix_tokens = min(prefix_len + host_hit_length,
_compute_max_prefix_len(len(prefix_ids)))` (input - 1). `Req.init_next_round_input` matches again
later with the cap (`key_limit = _compute_max_prefix_len(input_len)`), which is what the engine's
admission does. The engine's LPM used the capped walk too: a node holding only a waiting request's
last full page was never stamped by the LPM pass, so it stayed older in LRU than in SGLang, and a
host eviction took it (a 1-token host leaf at page 1) where SGLang took the next one.

Pools: page 64 (tests/engine/helpers.PS), a tree driven by hand.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine.helpers import PS, req
from tierdiag.engine.queue_policy import queue_policy
from tierdiag.engine.request import Req
from tierdiag.engine.rules import RULE_SETS
from tierdiag.engine.tree import RadixTree


def _waiting(rid: str, keys: list[int], input_len: int, seq: int) -> Req:
    r = Req(req(rid, 0, keys, seq=seq), 0)
    r.input_len = r.fill_len = input_len
    r.keys = list(keys[:input_len // PS])
    r.max_match_pages = min(len(r.keys), (input_len - 1) // PS)
    return r


def _order(policy: str, tree: RadixTree, waiting: list[Req], now: int) -> list[str]:
    queue_policy(policy, "0.5.23").order(waiting, tree.match, PS, now, 0, {r.seq: 0 for r in waiting})
    return [r.req_id for r in waiting]


def test_lpm_stamps_the_last_full_page_past_the_match_cap():
    """a's prompt [1, 2, 3, 4] and b's [1, 2, 3, 9] leave two leaves under [1, 2, 3]: [4] (older)
    and [9]. w waits with exactly four pages of input (256 tokens): its capped match
    (`_compute_max_prefix_len`: 255 tokens, 3 pages) stops above [4], but SGLang's LPM pass walks
    the whole input (`_compute_prefix_matches` -> `match_kv_cache` without `max_prefix_len`) and
    stamps [4] now, so LRU's next device victim is [9], not [4]."""
    tree = RadixTree(PS, "lru", RULE_SETS["0.5.23"])
    tree.insert([1, 2, 3, 4], 0, [0, 1, 2, 3], now_ns=10)
    tree.insert([1, 2, 3, 9], 3, [4], now_ns=20, count_hits=False)
    w = _waiting("w", [1, 2, 3, 4], 4 * PS, 0)
    assert _order("lpm", tree, [w], now=30) == ["w"]
    leaf = tree.pop_device_victim()
    assert leaf is not None and leaf.keys == [9]


def test_lpm_counts_the_uncapped_match_capped_at_input_minus_one():
    """`num_matched_prefix_tokens` = min(device + host of the uncapped match, input - 1): q (3
    pages + 60 tokens, 3 pages cached) counts 192; w (exactly 4 pages, all cached) 255, not the
    capped walk's 192. So w goes first although q is ahead in the queue (a 192 / 192 tie kept
    queue order before)."""
    tree = RadixTree(PS, "lru", RULE_SETS["0.5.23"])
    tree.insert([1, 2, 3, 4], 0, [0, 1, 2, 3], now_ns=10)
    q = _waiting("q", [1, 2, 3, 7], 3 * PS + 60, 0)
    w = _waiting("w", [1, 2, 3, 4], 4 * PS, 1)
    for policy in ("lpm", "shortest-prefill-first"):
        assert _order(policy, tree, [q, w], now=30) == ["w", "q"]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(1, 6), min_size=1, max_size=6), min_size=1, max_size=6),
       st.lists(st.tuples(st.lists(st.integers(1, 6), min_size=1, max_size=7), st.integers(0, PS - 1)),
                min_size=1, max_size=5))
def test_every_cached_node_on_a_waiting_inputs_full_pages_is_stamped(prompts, waiting_specs):
    """Whatever the tree and the queue: after a cache-aware policy's pass at `now`, every node
    on the cached path of each waiting request's full pages (not only its capped part) carries
    `now` (`_match_post_processor` stamps best_match_node and every ancestor)."""
    tree = RadixTree(PS, "lru", RULE_SETS["0.5.23"])
    slot = 0
    for t, p in enumerate(prompts):
        keys = _chain(p)
        own = tree.match(keys, t).device_pages
        tree.insert(keys, own, list(range(slot, slot + len(keys) - own)), now_ns=t, count_hits=False)
        slot += len(keys) - own
    now = 10**6
    waiting = [_waiting(f"w{i}", _chain(p), len(p) * PS + extra, i) for i, (p, extra) in enumerate(waiting_specs)]
    _order("lpm", tree, waiting, now)
    for r in waiting:
        node, i = tree.root, 0
        while i < len(r.keys) and r.keys[i] in node.children:
            node = node.children[r.keys[i]]
            assert node.last_access_ns == now, (r.req_id, node.keys)
            i += len(node.keys)


def _chain(ids: list[int]) -> list[int]:
    """Prefix-chained page keys (a key names its prefix), as trace/pages.py makes them."""
    out, h = [], 0
    for x in ids:
        h = h * 7 + x
        out.append(h)
    return out
