"""The storage re-queries found by index (`StoragePrefetch._retry_prefetches`: a due list in due
order, set as each entry is armed, and the entries armed past the cap since the last pass) against
pop_ready's walk of the whole waiting queue (`_retry_prefetches_walk`, the reference), on the same
operations: arming, admission (the entry dropped), a requeue that arms again, a re-query at
admission (the armed one cancelled, `_prefetch_after_device_hit_loss`), passes with and without a
waiting queue. Every pass's re-queries, the armed entries and their due passes are the reference's.
The reference's arms (the operations') are `poll_miss` as pop_ready reads it, due -1 until the
first pass that sees the entry sets it; the indexed engine's `_arm_prefetch_retry` sets the due
pass at once (that first pass is the next one), so an entry armed after the last pass is compared
by the pass it will be due. (Unpatched: each engine calls its own method;
tests/engine/test_fast_paths.py holds whole replays alike.)"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine import helpers
from tests.engine.helpers import PS, req
from tierdiag.engine.engine import Engine
from tierdiag.engine.request import Req

N = 6  # requests

op = st.one_of(
    st.tuples(st.just("arm"), st.integers(0, N - 1)),
    st.tuples(st.just("admit"), st.integers(0, N - 1)),
    st.tuples(st.just("requeue"), st.integers(0, N - 1)),
    st.tuples(st.just("hit_loss"), st.integers(0, N - 1)),
    st.tuples(st.just("pass"), st.integers(1, 12)),
)


def _engine(fast: bool):
    s = Engine(helpers.small_config(storage_tokens=128 * PS)).scheduler
    reqs = []
    for i in range(N):
        keys = [1000 * (i + 1) + k for k in range(4 + i)]  # no page stored: every query misses
        r = Req(req(f"r{i}", 0, keys, seq=i), 0)
        r.keys, r.max_match_pages = list(keys), len(keys)
        reqs.append(r)
    s.waiting[:] = list(reqs)
    step = s._retry_prefetches if fast else s._retry_prefetches_walk
    return s, reqs, step


def _reference_arm(s, r) -> None:
    """StoragePrefetchRetries.poll_miss: armed (-1), its due pass set by the first pass that
    sees it (`_retry_prefetches_walk`)."""
    s.prefetch_retry_due[r.seq] = -1


def _apply(fast: bool, ops) -> list:
    s, reqs, step = _engine(fast)
    arm = s._arm_prefetch_retry if fast else (lambda r: _reference_arm(s, r))
    seen = []
    for name, arg in ops:
        r = reqs[arg] if name != "pass" else None
        queued = any(q is r for q in s.waiting)
        if name == "arm" and queued:
            arm(r)
        elif name == "admit" and queued:  # _new_prefill's admission
            s.waiting.remove(r)
            s.prefetch_retry_due.pop(r.seq, 0)
        elif name == "requeue" and not queued:  # back at the end of the queue, its query armed again
            s.waiting.append(r)
            arm(r)
        elif name == "hit_loss" and queued:  # _prefetch_after_hit_loss: cancel, one more query now
            s.prefetch_retry_due.pop(r.seq, 0)
            r.prefetch_retries += 1
            s._start_prefetch(r, 0)
        elif name == "pass":
            for _ in range(arg):
                step(0)
                seen.append((s.prefetch_pass, [q.prefetch_retries for q in reqs], dict(s.prefetch_retry_due)))
        # every armed re-query is a queued request's (Engine.check_invariants)
        assert set(s.prefetch_retry_due) <= {q.seq for q in s.waiting}
    due = dict(s.prefetch_retry_due)
    if not fast:  # armed since the last pass: due `interval` passes after the next one
        interval, cap = s.retry_interval, s.retry_cap
        by_seq = {q.seq: q for q in reqs}
        for seq, at in due.items():
            if at == -1 and by_seq[seq].prefetch_retries < cap:
                due[seq] = s.prefetch_pass + 1 + interval
    seen.append(sorted(due.items()))
    return seen


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(op, max_size=40))
def test_the_indexed_requeries_are_the_walks(ops):
    assert _apply(True, ops) == _apply(False, ops)


def test_requeries_past_the_cap_stop_and_a_readmitted_request_starts_afresh():
    """Re-queries every 8 passes until the cap (8), then none; a request admitted and requeued
    is armed anew: its stale due entries never fire it early."""
    ops = [("arm", 1), ("arm", 2), ("pass", 30), ("admit", 2), ("requeue", 2), ("pass", 5),
           ("hit_loss", 1), ("pass", 100)]
    fast, walk = _apply(True, ops), _apply(False, ops)
    assert fast == walk
    retries = fast[-2][1]
    assert retries[1] == 8 and retries[0] == 0  # the head's (r0) was dropped, never queried
