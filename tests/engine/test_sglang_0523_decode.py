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
