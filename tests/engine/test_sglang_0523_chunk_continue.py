"""Issue 43, found by the scheduler harness's audit (mixed chunk at page 64): a chunked request's
next chunk is never page-floored, and a new request is chunked when its page-ceiled extend does
not fit.

`PrefillAdder.add_chunked_req` (0.5.23; 0.5.9 the same): `_rem_tokens = min(rem_chunk_tokens,
rem_total_tokens)` (`available_chunk_tokens`; nothing left: `rem_chunk_tokens`, so the chunk goes
on), and the extend is `min(extend_input_len, _rem_tokens)`: no page floor (only
`floor_chunked_tokens`' mamba grid, 1 here). A new request's first chunk is floored
(`_select_prefill_admission`: `chunk_tokens_limit // page_size * page_size`). With
`--enable-mixed-chunk`, `rem_chunk_tokens` starts at `chunked_prefill_size` less a token a
running request (`num_mixed_decode_tokens`), so a continuing chunk ends off a page boundary; the
engine floored it to a page. And whether a new request fits whole is its page-ceiled extend
against that budget (`input_tokens = ceil_paged_tokens(extend_len)`; the raw length only under
`SGLANG_EXACT_CHUNK_FILL` on gfx95): the engine compared the raw extend, which fits an
off-page budget where the page-ceiled one does not.

Pools: page 64 (tests/engine/helpers.PS), device 128 pages, a prefill budget of 16 pages.
"""

from __future__ import annotations

import pytest

from tests.engine import helpers
from tests.engine.helpers import PS, req
from tierdiag.engine.engine import Engine
from tierdiag.probes import events as ev


class Chunks(helpers.Collect):
    def __init__(self):
        super().__init__()
        self.chunks: dict[str, list[int]] = {}

    def emit(self, event):
        super().emit(event)
        if isinstance(event, ev.PrefillDone):
            self.chunks.setdefault(event.req_id, []).append(event.extend_tokens)


def _chunks(version: str, mixed: bool, b_ms: float = 0, b_pages: int = 40, b_extra: int = 1) -> list[int]:
    a = req("a", 0, list(range(1, 2)), output=400)  # decodes while b's chunks run
    b = req("b", b_ms, list(range(100, 100 + b_pages)), output=1, extra_tokens=b_extra)
    probe = Chunks()
    cfg = helpers.small_config(device_tokens=128 * PS, host_tokens=128 * PS, max_prefill_tokens=16 * PS,
                               enable_mixed_chunk=mixed, sglang_rules=version)
    engine = Engine(cfg, probe=probe)
    engine.run(helpers.numbered([a, b]))
    engine.check_invariants(idle=True)
    assert probe.records["b"].status == "finished"
    return probe.chunks["b"]


@pytest.mark.parametrize("version,first", [("0.5.23", 1024 - 2 * PS), ("0.5.9", 1024 - PS)])
def test_a_continuing_chunk_takes_the_mixed_budget_unfloored(version, first):
    """a (65 tokens, 400 output) and b (40 pages + 1 token) arrive together. 0.5.23 chunks b
    into what a's page-ceiled extend leaves of the 1,024-token budget (896); 0.5.9 keeps b for
    the next batch (`chunk_later_requests`), where a's decode token leaves 1,023, floored to 960.
    Either way a is running from then on and each pass mixes its decode token in: b's next chunk
    gets 1,024 - 1 = 1,023 tokens (960 when floored), and the last one the rest."""
    chunks = _chunks(version, mixed=True)
    assert chunks == [first, 1023, 40 * PS + 1 - first - 1023]


def test_without_mixed_chunk_the_budget_is_whole_pages():
    """Mixed chunk off: `rem_chunk_tokens` is `chunked_prefill_size` itself (a page multiple),
    so the continuing chunk is whole pages anyway."""
    assert _chunks("0.5.23", mixed=False) == [1024 - 2 * PS, 1024, 40 * PS + 1 - 896 - 1024]


@pytest.mark.parametrize("version", ["0.5.23", "0.5.9"])
def test_a_new_request_whose_page_ceiled_extend_misses_the_mixed_budget_is_chunked(version):
    """b (15 pages + 40 tokens = 1,000) arrives while a decodes: its batch mixes a's decode token
    in, leaving 1,023 tokens of budget. 1,000 <= 1,023, but its page-ceiled extend is 1,024 >
    1,023: `_select_prefill_admission` (`add_one_req` in 0.5.9) chunks it into the budget floored
    to a page (960), the rest (40) in the next pass. Mixed chunk off, the budget is 1,024 and b
    goes whole."""
    assert _chunks(version, mixed=True, b_ms=1.5, b_pages=15, b_extra=40) == [960, 40]
    assert _chunks(version, mixed=False, b_ms=1.5, b_pages=15, b_extra=40) == [1000]


# --- batch_is_full after a mixed batch ------------------------------------------------------------
class Steps(helpers.Collect):
    def __init__(self):
        super().__init__()
        self.batches: list[ev.BatchScheduled] = []
        self.decodes: list[ev.DecodeStep] = []

    def emit(self, event):
        super().emit(event)
        if isinstance(event, ev.BatchScheduled):
            self.batches.append(event)
        elif isinstance(event, ev.DecodeStep):
            self.decodes.append(event)


def _reopen_run(mixed: bool):
    a = req("a", 0, [1], output=200)  # 65 tokens, decodes throughout
    b = req("b", 1.5, list(range(100, 106)), output=50)  # 6 pages + 1 token
    c = req("c", 1.5, list(range(200, 203)), output=1)  # 3 pages + 1 token
    probe = Steps()
    cfg = helpers.small_config(enable_mixed_chunk=mixed, sglang_rules="0.5.23")  # device 16 pages
    engine = Engine(cfg, probe=probe)
    engine.run(helpers.numbered([a, b, c]))
    engine.check_invariants(idle=True)
    assert {r.status for r in probe.records.values()} == {"finished"}
    return probe


def test_a_mixed_batch_reopens_admission_at_the_next_pass():
    """`Scheduler.get_new_batch_prefill` with `--enable-mixed-chunk`: when the running requests'
    step fits (`check_decode_mem`), `mix_with_running` moves them into the prefill batch and
    the running batch becomes `ScheduleBatch(reqs=[], batch_is_full=...)`. A NO_TOKEN in that
    pass set `batch_is_full` on the running batch it replaced; at the next pass
    `get_next_batch_to_run` finds the running batch empty and takes the mixed batch as it
    ("running_batch = last_batch"), whose flag was never set: admission is tried again though no
    request left. b's pass admits b (a decoding) and finds c NO_TOKEN (the pass still holds b's
    page of overhead and its whole output); at the next pass, b running at new_token_ratio, c
    fits and goes into the very next batch. Mixed chunk off, the running batch keeps the flag
    (b merges into it) and c waits for a decode step to finish someone (a or b) first."""
    probe = _reopen_run(mixed=True)
    rb, rc = probe.records["b"], probe.records["c"]
    assert rc.first_batch_id != rb.first_batch_id  # NO_TOKEN in b's pass
    b_batch = next(x for x in probe.batches if x.batch_id == rb.first_batch_id)
    c_batch = next(x for x in probe.batches if x.batch_id == rc.first_batch_id)
    assert c_batch.t_start_ns == b_batch.t_end_ns  # the very next pass, no decode step between
    assert c_batch.num_decoding == 2  # a and b's steps ride in it
    plain = _reopen_run(mixed=False)
    assert plain.records["c"].first_token_ns > plain.records["b"].finish_ns
