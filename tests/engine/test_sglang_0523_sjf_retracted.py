"""Issue 43 (found by tests/sglang/hunt.py: decode pressure under shortest-prefill-first, seed 832
at page 64, 87 of 103 prefill steps apart from step 17): a retracted request's prefill work
counts its output so far, as SGLang 0.5.23's does.

`SchedulePolicy._shortest_prefill_work` (managers/schedule_policy.py) is

    max(1, len(r.origin_input_ids) + len(r.output_ids) - r.num_matched_prefix_tokens)

and a retracted request keeps its `output_ids` (`Req.reset_for_retract`): it is prefilled again,
input and output so far, so that is its work. `_sort_by_shortest_prefill` breaks ties by
`time_stats.wait_queue_entry_time`, which `_add_request_to_queue` sets again at the retraction;
`shortest_prefill_chunk_limit` measures what the chunked request has left against
`full_untruncated_fill_ids` (input + output so far) too. The engine counted the input alone
(`input_len - matched`: a retracted request whose input is cached looked like 1 token of work,
and went first), broke ties by arrival, and measured the chunk's rest against the input.

The scenario is test_sglang_0523_decode.py's: a, b and c (a page + 1 token each; 700, 700 and 600
output tokens) on a 32-page pool; c (admitted last) is retracted at 21.6 ms with ~575 tokens of
output. d (3 pages + 1 token, nothing cached: 193 tokens of work) arrives at 20 ms and waits.
"""

from __future__ import annotations

import pytest

from tests.engine import helpers
from tests.engine.helpers import PS, req
from tierdiag.engine.engine import Engine
from tierdiag.engine.queue_policy import sort_by_shortest_prefill
from tierdiag.engine.request import Req
from tierdiag.probes import events as ev


class Order(helpers.Collect):
    def __init__(self):
        super().__init__()
        self.prefills: list[tuple[str, int]] = []

    def emit(self, event):
        super().emit(event)
        if isinstance(event, ev.PrefillDone):
            self.prefills.append((event.req_id, event.extend_tokens))


def _run(policy: str, d_ms: float) -> Order:
    trace = [req("a", 0, [1], output=700), req("b", 1, [2], output=700), req("c", 2, [3], output=600),
             req("d", d_ms, [4, 5, 6], output=4)]
    probe = Order()
    engine = Engine(helpers.small_config(device_tokens=32 * PS, schedule_policy=policy), probe=probe)
    engine.run(helpers.numbered(trace))
    engine.check_invariants(idle=True)
    assert probe.records["c"].retractions == 1
    return probe


def test_a_retracted_requests_work_is_its_input_and_output_less_the_cached_prefix():
    """c waits again after its retraction with its input page cached: 1 token of its input is
    uncached, 577 of input + output. d's 193 are less: d goes first (the engine, counting the
    input alone, ran c's 577 tokens first)."""
    probe = _run("shortest-prefill-first", 20)
    assert probe.prefills[3:] == [("d", 3 * PS + 1), ("c", 577)]


def test_a_request_arriving_after_the_re_prefill_does_not_overtake_it():
    """d at 40 ms: c was prefilled again before d arrived; nothing to reorder."""
    probe = _run("shortest-prefill-first", 40)
    assert probe.prefills[3:] == [("c", 577), ("d", 3 * PS + 1)]


def _waiting(rid: str, seq: int, entry: tuple[int, int, int]) -> Req:
    """A waiting request of 2 pages + 1 token, nothing cached, that joined the queue at `entry`."""
    r = Req(req(rid, 0, [10 * (seq + 1), 10 * (seq + 1) + 1], seq=seq), 0)
    r.keys = list(r.keys) or [10 * (seq + 1), 10 * (seq + 1) + 1]
    r.queue_entry = entry
    return r


class _NoMatch:
    device_pages = host_pages = 0


@pytest.mark.parametrize("entries,expected", [
    # equal work: the earlier queue entry first; a retracted request (entry rank >= 0) re-entered the
    # queue at its retraction, after the arrivals of that instant (rank -1), in retract_decode's order
    ({"x": (5, -1, 0), "y": (3, 0, 1)}, ["y", "x"]),
    ({"x": (5, -1, 0), "y": (5, 0, 1)}, ["x", "y"]),
    ({"x": (5, 1, 0), "y": (5, 0, 1)}, ["y", "x"]),
])
def test_ties_go_to_the_earlier_queue_entry(entries, expected):
    waiting = [_waiting(rid, i, e) for i, (rid, e) in enumerate(entries.items())]
    sort_by_shortest_prefill(waiting, lambda keys, now: _NoMatch(), PS, 0, 0, {})
    assert [r.req_id for r in waiting] == expected
