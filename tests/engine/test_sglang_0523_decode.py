"""Issue 43's divergences from SGLang, each narrated with the SGLang function it restates: the
last output token's page, the finish's second insert at the prompt boundary (priority + 1),
the waiting-prefix refresh, and decode on the scheduler's clock with its memory and retraction.

Pools: device 16 pages, host 64 pages of 64 tokens unless a test says otherwise (helpers.small_config).
"""

from __future__ import annotations

import pytest

from tests.engine import helpers
from tests.engine.helpers import PS, req


def pages(lo: int, n: int) -> list[int]:
    return list(range(lo, lo + n))


# --- 2. the last output token has no KV slot ----------------------------------------------------
@pytest.mark.parametrize("version", ["0.5.23", "0.5.9"])
def test_the_last_output_token_never_gets_a_kv_slot(version):
    """`ScheduleBatch.prepare_for_decode` -> `alloc_for_decode` (both releases) allocates, each
    decode step, the slot of the token the step reads: the previous step's output. The extend
    holds the input; output_len tokens take output_len - 1 decode steps, so a request holds
    ceil((input + output - 1) / page) pages, never ceil((input + output) / page).
    x leaves 5 evictable pages, 11 free. a's input is 9 pages + 1 token and its 64 output tokens
    fill its 10th page exactly (positions 577..639): 10 pages, with the allocation's page
    (`alloc_paged_token_slots_extend`) 11 = free, so x stays on device. Counting the last token
    (input + output = 9 pages + 65 tokens: 11 pages, 12 with the allocation's page) evicted x.
    (0.5.23's admission page, `per_req_token_overhead`, makes 11 = free there too.)"""
    x = req("x", 0, pages(1, 5), output=1)
    a = req("a", 1000, pages(100, 9), output=PS)
    engine, probe = helpers.run([x, a], sglang_rules=version)
    assert probe.evictions == []
    assert probe.records["a"].status == "finished"
    assert engine.tree.match(list(range(1, 6)), 10**12, "probe").device_pages == 5


# --- 1. the finish's second insert at the prompt boundary ----------------------------------------
def _priority_run(version):
    """a (prompt 4 pages, 1 output page) finishes, then b (4 pages, no output page), both at
    priority 0; c then needs 4 of their 9 pages under `--eviction-policy priority`."""
    a = req("a", 0, pages(1, 4), output=PS)
    b = req("b", 1000, pages(100, 4), output=1)
    c = req("c", 2000, pages(200, 9), output=1)
    engine, probe = helpers.run([a, b, c], sglang_rules=version, eviction_policy="priority")
    assert {r.status for r in probe.records.values()} == {"finished"}
    later = 10**13
    return (engine.tree.match(pages(1, 4), later, "probe").device_pages,
            engine.tree.match(pages(100, 4), later, "probe").device_pages)


def test_a_finished_prompt_is_inserted_again_one_priority_up():
    """`UnifiedRadixCache.checkpoint_into_tree` (0.5.23): after the finished request's insert of
    input + output (`token_ids[:up_to]`), "split the leaf at the prompt boundary so eviction can
    drop the output KV without the prompt": the page-aligned `origin_input_ids` are inserted again
    with `priority=min(insert_params.priority + 1, int64 max)`, `prev_prefix_len` and
    `inserted_len` at the prompt (nothing freed, no hit). So a's prompt nodes carry priority 1,
    its output page and b (whose output took no page: nothing past the prompt, no second
    insert) priority 0, and the priority policy (lowest first, then LRU) evicts a's output page
    and b for c, keeping a's prompt, which LRU alone (a finished first) would have evicted."""
    assert _priority_run("0.5.23") == (4, 0)


def _priorities(version):
    """The priority of each node under the root after a (4 prompt pages, 1 output page) finished."""
    engine, _ = helpers.run([req("a", 0, pages(1, 4), output=PS)], sglang_rules=version)
    out, node = [], engine.tree.root
    while node.children:
        (node,) = node.children.values()
        out.append((len(node.keys), node.priority))
    return out


def test_0_5_9_inserts_a_finished_request_once():
    """`RadixCache.cache_finished_req` (0.5.9, inherited by HiRadixCache): one insert of the
    committed KV at the request's priority, so every node keeps priority 0; 0.5.23 raises the
    prompt's to 1 and leaves the output page's at 0."""
    assert _priorities("0.5.9") == [(4, 0), (1, 0)]
    assert _priorities("0.5.23") == [(4, 1), (1, 0)]
