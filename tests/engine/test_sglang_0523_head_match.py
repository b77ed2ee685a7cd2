"""Issue 43 (found by the scheduler harness's sweeps: chunk seed 4, page 64, fcfs, write_back,
mixed chunk, step 13 of 18): the waiting queue's head is matched while any prefill budget is
left, even under a page.

SGLang 0.5.23 `Scheduler._get_new_batch_prefill_raw` walks the waiting queue with

    for req in self.waiting_queue:
        if adder.budget_state() == AddReqResult.OTHER:   # rem_chunk_tokens <= 0 (or rem_input_tokens)
            break
        ...
        req.init_next_round_input(self.tree_cache)       # match_prefix: its path stamped
        res = adder.add_one_req(req, ...)

and `PrefillAdder._select_prefill_admission` (inside `add_one_req`) returns NO_TOKEN when the
request does not fit memory (`check_prefill`), else shapes it: a request whose page-ceiled extend
misses `rem_chunk_tokens` is chunked into it floored to a page, "if extend_len <= 0: return
AddReqResult.OTHER". The budget is charged page-ceiled extends, so it stays a page multiple
without mixed chunk; with `--enable-mixed-chunk` it starts at `chunked_prefill_size` less a token
a running request, so a batch can leave 1..63 tokens of it. SGLang then still matches the next
waiting request (`match_prefix` -> `_match_post_processor` stamps its path newest) before
refusing it; the engine stopped at less than a page and never matched it, so the two trees'
LRU orders differed: in the sweep, a later 64-token eviction took a 448-token node on SGLang's
side and a 128-token node on the engine's.

The same walk goes on past a new request that became the chunked request (its chunk is the
budget floored to a page: what is left, under a page, still matches the next head), and past a
continuing chunk that memory, not the budget, cut short (the head is then NO_TOKEN, which sets
`batch_is_full`).

Pools: page 64 (tests/engine/helpers.PS), a prefill budget of 16 pages (1,024 tokens).
"""

from __future__ import annotations

import pytest

from tests.engine import helpers
from tests.engine.helpers import PS, req
from tierdiag.engine.engine import Engine
from tierdiag.probes import events as ev


class Stamps(helpers.Collect):
    """At each batch's formation (BatchScheduled: after the pass's admissions), the access time
    of the cached node that c's input starts with (read without touching the tree)."""

    def __init__(self, first_key: int):
        super().__init__()
        self.first_key = first_key
        self.engine = None
        self.batches: list[tuple[ev.BatchScheduled, int | None]] = []

    def emit(self, event):
        super().emit(event)
        if isinstance(event, ev.BatchScheduled):
            node = self.engine.tree.root.children.get(self.first_key)
            self.batches.append((event, None if node is None else node.last_access_ns))


def _run(b_extra: int, mixed: bool = True, b_pages: int = 14) -> Stamps:
    a = req("a", 0, [1], output=400)  # decodes throughout: each mixed batch carries its token
    x = req("x", 0, [10, 11], output=1)  # caches [10, 11], then finishes
    b = req("b", 2, list(range(100, 100 + b_pages)), extra_tokens=b_extra, output=1)
    c = req("c", 2, [10, 11, 12, 13], output=1)  # shares x's [10, 11]; arrives with b, after it
    probe = Stamps(10)
    cfg = helpers.small_config(device_tokens=128 * PS, host_tokens=128 * PS, max_prefill_tokens=16 * PS,
                               enable_mixed_chunk=mixed, sglang_rules="0.5.23")
    engine = Engine(cfg, probe=probe)
    probe.engine = engine
    engine.run(helpers.numbered([a, x, b, c]))
    engine.check_invariants(idle=True)
    assert {r.status for r in probe.records.values()} == {"finished"}
    return probe


def _batch_of(probe: Stamps, rid: str):
    bid = probe.records[rid].first_batch_id
    return next((e, stamp) for e, stamp in probe.batches if e.batch_id == bid)


def test_the_head_is_matched_under_a_page_of_budget():
    """b (956 tokens, page-ceiled 960) arrives with c while a decodes: its batch mixes a's token
    in, so the budget is 1,023 and b leaves 63 tokens of it. c is the head then: SGLang matches
    it (its [10, 11] stamped at b's batch) and refuses it (a chunk of 63 floored to a page is 0:
    OTHER); c goes in the next batch. The engine stopped at under a page: [10, 11] kept x's
    stamp, older than b's batch."""
    probe = _run(b_extra=60)
    b_batch, stamp = _batch_of(probe, "b")
    assert b_batch.num_decoding == 1 and b_batch.extend_tokens == 14 * PS + 60  # mixed, b alone
    c_batch, _ = _batch_of(probe, "c")
    assert c_batch.batch_id > b_batch.batch_id  # c was refused in b's pass
    assert stamp == b_batch.t_start_ns  # ... but matched: its prefix stamped at b's pass


def test_without_mixed_chunk_the_page_left_takes_a_chunk_of_the_head():
    """Mixed chunk off, the budget is 1,024: b's 960 leave a whole page, and c is chunked into
    it at once (0.5.23 chunks a later request into what is left): the same batch."""
    probe = _run(b_extra=60, mixed=False)
    assert _batch_of(probe, "c")[0].batch_id == _batch_of(probe, "b")[0].batch_id


def test_a_new_chunk_leaves_under_a_page_and_a_continuing_chunk_none():
    """b (30 pages + 1 token) does not fit the mixed budget (1,023): it becomes the chunked
    request at 1,023 floored to a page (960), which leaves 63: c, behind it, is matched (stamped
    at b's first pass) and refused. b's next chunk is the rest (961 tokens, page-ceiled 1,024 >
    1,023): the budget is spent (`budget_state()` OTHER), the loop stops before c, and c's
    prefix keeps the first pass's stamp."""
    probe = _run(b_extra=1, b_pages=30)
    chunks = [(e, stamp) for e, stamp in probe.batches if e.num_reqs == 1 and e.extend_tokens >= 960]
    (first, stamp1), (second, stamp2) = chunks
    assert (first.extend_tokens, second.extend_tokens) == (960, 961)
    assert stamp1 == first.t_start_ns
    assert stamp2 == first.t_start_ns < second.t_start_ns
    assert _batch_of(probe, "c")[0].batch_id > second.batch_id


@pytest.mark.parametrize("b_extra", [1, 30, 62])
def test_the_stamp_follows_the_budget_left(b_extra):
    """Any 1..63 tokens left over: b (14 pages + b_extra, page-ceiled 960) leaves 63 of the mixed
    budget whatever b_extra is, and c's prefix is stamped at b's pass each time."""
    probe = _run(b_extra=b_extra)
    b_batch, stamp = _batch_of(probe, "b")
    assert stamp == b_batch.t_start_ns
    assert _batch_of(probe, "c")[0].batch_id > b_batch.batch_id
