"""MissTracker.scheduled counts a request's pages that an earlier request of the same prefill
batch computes (engine/miss.py). It runs for every admitted request of a probed replay, so it
counts from the members' key chains (BatchPages, in C) and skips the batch's first request;
this checks it against the counting it replaced, a Python loop a page over a set of the
batch's keys, on hostile streams of batches whose keys chain as the engine's page keys do."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine.helpers import chained_keys, tracked_req
from tierdiag.engine.miss import MissTracker


def _reference(calls, ps):
    shared, batch_ns, batch = {}, None, set()
    for now, seq, keys, input_len, first, end in calls:
        if now != batch_ns:
            batch_ns, batch = now, set()
        n = sum(1 for k in keys[first:input_len // ps] if k in batch)
        if n:
            shared[seq] = n
        batch.update(keys[first:end])
    return shared


# a request's path of branch choices: its page keys (helpers.chained_keys) share a prefix with
# every other request's that took the same choices, and part where they part
_PATH = st.lists(st.integers(min_value=0, max_value=2), max_size=30)


@settings(max_examples=60, deadline=None)
@given(ps=st.sampled_from([1, 2, 16, 64]),
       calls=st.lists(st.tuples(st.integers(min_value=0, max_value=3), _PATH,
                                st.integers(min_value=0, max_value=2000), st.integers(min_value=-3, max_value=40),
                                st.integers(min_value=-3, max_value=40)), max_size=25))
def test_shared_pages_in_a_batch_are_counted_as_the_page_loop_counted_them(ps, calls):
    tracker = MissTracker(ps)
    keys_of = chained_keys([path for _, path, _, _, _ in calls])
    stream = [(now, seq, keys_of[seq], input_len, first, end)
              for seq, (now, _, input_len, first, end) in enumerate(calls)]
    reqs = [tracked_req(seq, keys, input_len) for _, seq, keys, input_len, _, _ in stream]
    for now, seq, keys, input_len, first, end in stream:
        tracker.scheduled(reqs[seq], now, first, end)
    want = _reference(stream, ps)
    assert {r.seq: r.miss_shared_pages for r in reqs if r.miss_shared_pages} == want
    for r in reqs:
        assert tracker.take(r).shared_pages == want.get(r.seq, 0)
        assert tracker.take(r).shared_pages == 0  # taken once
