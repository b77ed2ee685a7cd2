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
tests/engine/test_fast_paths.py holds whole replays alike.)

Then the index itself: the C data plane's RequeryIndex (csrc/requery.c, what the engine runs
where it is built) against its reference, prefetch.RequeryIndexPy, on hostile operation streams
answer by answer, its errors and references, and whole replays through either."""

from __future__ import annotations

import dataclasses
import gc
import weakref

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine import helpers
from tests.engine.helpers import PS, req, small_config
from tests.engine.test_fast_paths import Everything, _comparable
from tests.engine.test_invariants import workloads
from tierdiag.engine import prefetch
from tierdiag.engine.engine import Engine
from tierdiag.engine.request import Req
from tierdiag.native import cplane
from tierdiag.trace.reader import TraceRequest

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
    s.requeries.set_due(r, -1)


def _armed(s) -> dict[int, int]:
    """The armed re-queries, by request seq: due pass."""
    return {q.seq: due for q, due in s.requeries.items()}


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
            s.requeries.cancel(r)
        elif name == "requeue" and not queued:  # back at the end of the queue, its query armed again
            s.waiting.append(r)
            arm(r)
        elif name == "hit_loss" and queued:  # _prefetch_after_hit_loss: cancel, one more query now
            s.requeries.cancel(r)
            r.prefetch_retries += 1
            s._start_prefetch(r, 0)
        elif name == "pass":
            for _ in range(arg):
                step(0)
                seen.append((s.prefetch_pass, [q.prefetch_retries for q in reqs], _armed(s)))
        # every armed re-query is a queued request's (Engine.check_invariants)
        assert set(_armed(s)) <= {q.seq for q in s.waiting}
    due = _armed(s)
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


# --- the C index (csrc/requery.c) against its reference (prefetch.RequeryIndexPy) ------------------

compiled_plane = pytest.mark.skipif(cplane.C is None, reason=f"_cplane: {cplane.WHY_NOT}")
K = 7  # requests in a hostile stream
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
due = st.one_of(st.integers(-3, 40), INT64)
hostile = st.lists(st.one_of(
    st.tuples(st.just("arm"), st.integers(0, K - 1), due),
    st.tuples(st.just("arm_capped"), st.integers(0, K - 1)),
    st.tuples(st.just("cancel"), st.integers(0, K - 1)),
    st.tuples(st.just("set_due"), st.integers(0, K - 1), due),
    st.tuples(st.just("due"), st.integers(0, K - 1)),
    # a pass: any step, a waiting queue of any of the requests, repeats and order included
    st.tuples(st.just("fire"), st.one_of(st.integers(-3, 60), INT64), st.lists(st.integers(0, K - 1), max_size=9)),
    # many arms at once (the due list's growth and its spent prefix let go): n arms, due from d0
    st.tuples(st.just("burst"), st.integers(0, 700), st.integers(-3, 40)),
), max_size=50)


class Token:
    """A request as the index sees it: an object, by identity (weak-referenceable)."""

    def __init__(self, k: int):
        self.k = k


def _run_index(index, ops) -> list:
    reqs = [Token(k) for k in range(K)]
    name = {id(r): r.k for r in reqs}
    seen = []
    for op in ops:
        kind = op[0]
        if kind == "arm":
            seen.append(index.arm(reqs[op[1]], op[2]))
        elif kind == "arm_capped":
            seen.append(index.arm_capped(reqs[op[1]]))
        elif kind == "cancel":
            seen.append(index.cancel(reqs[op[1]]))
        elif kind == "set_due":
            seen.append(index.set_due(reqs[op[1]], op[2]))
        elif kind == "due":
            seen.append(index.due(reqs[op[1]]))
        elif kind == "fire":
            got = index.fire(op[1], [reqs[k] for k in op[2]])
            seen.append(None if got is None else [name[id(r)] for r in got])
        else:
            n, d0 = op[1], op[2]
            for i in range(n):
                index.arm(reqs[i % K], d0 + i // 3)
        seen.append((len(index), index.fired, sorted((name[id(r)], d) for r, d in index.items())))
    return seen


@compiled_plane
@settings(max_examples=300, deadline=None)
@given(ops=hostile)
def test_the_c_index_is_its_reference(ops):
    """Every answer (fire's requests and their order, due, len, the armed entries) after every
    operation, on hostile streams: dues out of order, negative and at int64's ends, steps
    anywhere, waiting queues with repeats, missing entries and foreign order, re-arms, cancels
    between passes, bursts past the due list's growth and its spent prefix's removal."""
    assert _run_index(cplane.C.RequeryIndex(), ops) == _run_index(prefetch.RequeryIndexPy(), ops)


@compiled_plane
def test_the_c_index_takes_only_what_it_can_hold_and_lets_its_requests_go():
    """Bad arguments get one-line errors (a due pass is an int64; the queue a list); the index
    holds each request it names until the entry goes, and a cycle through it is collected."""
    index = cplane.C.RequeryIndex()
    r = Token(0)
    with pytest.raises(TypeError, match="a due pass is an int"):
        index.arm(r, "8")
    with pytest.raises(OverflowError, match="int64"):
        index.arm(r, 1 << 63)
    with pytest.raises(TypeError, match="waiting queue is a list"):
        index.fire(1, (r,))
    with pytest.raises(TypeError):
        index.arm(r)
    assert len(index) == 0 and index.items() == []
    ref = weakref.ref(r)
    index.arm(r, 3)
    del r
    gc.collect()
    assert ref() is not None  # the index holds it
    got = index.fire(5, [Token(9), ref()])  # not the head: due, fired
    assert got == [ref()] and len(index) == 0
    del got
    gc.collect()
    assert ref() is None  # neither the map nor the due list keeps it
    # a cycle: a request that holds the index
    r = Token(1)
    r.index = cplane.C.RequeryIndex()
    r.index.arm(r, 2)
    r.index.arm_capped(r)
    ref = weakref.ref(r)
    del r
    gc.collect()
    assert ref() is None


def _replay_with(reqs, cfg, reference: bool, interval: int, cap: int) -> tuple[list, dict, int]:
    """One replay's every event (less a copy's measured wall time) and its stats, each rank's index the C one or the reference,
    its re-queries every `interval` passes up to `cap` (the rule set's fields as the scheduler
    keeps them typed)."""
    probe = Everything(False)
    engine = Engine(cfg, probe=probe)
    probe.schedulers = [r.scheduler for r in engine.ranks]
    for s in probe.schedulers:
        s.retry_interval, s.retry_cap = interval, cap
        if reference:
            s.use_requeries(prefetch.RequeryIndexPy())
    engine.run(sorted(reqs, key=lambda r: (r.arrival_ns, r.seq)))
    engine.check_invariants(idle=True)
    fired = sum(s.requeries.fired for s in probe.schedulers)
    return [_comparable(e) for e in probe.events], dataclasses.asdict(engine.stats), fired


@compiled_plane
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reqs=workloads(), dp=st.integers(1, 2), device=st.integers(4, 24), host=st.integers(1, 3),
       storage=st.sampled_from([8 * PS, 48 * PS]), interval=st.integers(1, 9), cap=st.integers(0, 9),
       policy=st.sampled_from(["best_effort", "wait_complete", "timeout"]),
       write_policy=st.sampled_from(["write_through", "write_back"]))
def test_whole_replays_through_the_c_index_are_the_references(reqs, dp, device, host, storage, interval, cap, policy,
                                                             write_policy, tmp_path_factory):
    """Whole replays (0.5.23, small pools: evictions while re-queries are armed and in flight;
    re-query intervals, caps, policies and tier sizes drawn): every event, the re-query clock
    at every prefill batch, and the stats the same through either index."""
    runs = []
    for reference in (False, True):
        cfg = small_config(dp=dp, device_tokens=device * PS, host_tokens=host * device * PS,
                           storage_tokens=storage, write_policy=write_policy, prefetch_policy=policy,
                           sglang_rules="0.5.23", storage_dir=str(tmp_path_factory.mktemp("rq")))
        runs.append(_replay_with(reqs, cfg, reference, interval, cap))
    assert runs[0] == runs[1]


@compiled_plane
@pytest.mark.parametrize("policy", ["best_effort", "wait_complete", "timeout"])
@pytest.mark.parametrize("cap", [0, 2, 8])
def test_a_replay_that_requeries_a_lot_is_the_references(policy, cap, tmp_path):
    """A burst of 40 requests on 5 conversations into a small device pool, a tier too small to
    keep them (misses, evictions while re-queries are armed, rate-limited declines): the same
    events, stats and re-queries fired through either index, and re-queries fired at all."""
    reqs = [TraceRequest(f"r{i}", i, i + 1, (i // 8) * 1_000_000, (4 + i % 7) * PS + 1, 40 + 10 * (i % 5),
                         tuple((i % 5) * 1000 + p for p in range(4 + i % 7)), None) for i in range(40)]
    runs = []
    for reference in (False, True):
        cfg = small_config(device_tokens=12 * PS, host_tokens=24 * PS, storage_tokens=16 * PS, prefetch_policy=policy,
                           sglang_rules="0.5.23", storage_dir=str(tmp_path / str(reference)))
        runs.append(_replay_with(reqs, cfg, reference, 3, cap))
    assert runs[0] == runs[1]
    assert (runs[0][2] > 0) == (cap > 0)
