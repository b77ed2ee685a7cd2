"""Issue 43, found by the scheduler harness's audit (chunk seed 0, page 64, lpm, mixed chunk): a
chunked request's next chunk is never page-floored.

`PrefillAdder.add_chunked_req` (0.5.23; 0.5.9 the same): `_rem_tokens = min(rem_chunk_tokens,
rem_total_tokens)` (`available_chunk_tokens`; nothing left: `rem_chunk_tokens`, so the chunk goes
on), and the extend is `min(extend_input_len, _rem_tokens)`: no page floor (only
`floor_chunked_tokens`' mamba grid, 1 here). A new request's first chunk is floored
(`_select_prefill_admission`: `chunk_tokens_limit // page_size * page_size`). With
`--enable-mixed-chunk`, `rem_chunk_tokens` starts at `chunked_prefill_size` less a token a
running request (`num_mixed_decode_tokens`), so a continuing chunk ends off a page boundary; the
engine floored it to a page.

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


def _chunks(version: str, mixed: bool) -> list[int]:
    a = req("a", 0, list(range(1, 2)), output=400)  # decodes while b's chunks run
    b = req("b", 0, list(range(100, 140)), output=1)  # 40 pages + 1 token: three chunks
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
