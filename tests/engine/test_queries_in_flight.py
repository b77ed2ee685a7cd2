"""The storage queries in flight (rule `storage_acks_per_pass`: a query made in one pass is
answered by the next pass's drain, `drain_prefetch_queries`), kept as the scheduler's list of
requests in query order with each query's entry on the request (`Req.query_*`, prefetch.py
`_queue_query`), against the dict by seq of (req, anchor, matched, hits, span) tuples it replaced
(the model below): on hostile operation streams (a request queried again while its query is in
flight, revoked at an admission poll, drained) the drain sees the same entries in the same order.
Then the scheduler's re-query index with its bound `arm` and `fire` (`use_requeries`)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine import helpers
from tests.engine.helpers import PS, req
from tierdiag.engine import prefetch
from tierdiag.engine.engine import Engine
from tierdiag.engine.request import Req
from tierdiag.engine.tree_node import TreeNode

N = 5  # requests
ANCHORS = 3

op = st.one_of(
    st.tuples(st.just("query"), st.integers(0, N - 1), st.integers(0, ANCHORS - 1),
              st.integers(-2**62, 2**62), st.integers(0, 3), st.integers(-5, 2**40)),
    st.tuples(st.just("revoke"), st.integers(0, N - 1)),
    st.tuples(st.just("drain")),
)


def _reqs() -> list[Req]:
    return [Req(req(f"r{i}", 0, [10 * (i + 1) + k for k in range(3)], seq=i), 0) for i in range(N)]


@settings(max_examples=300, deadline=None, database=None)
@given(ops=st.lists(op, max_size=60))
def test_the_list_of_queries_is_the_dict_it_replaced(ops):
    reqs = _reqs()
    anchors = [TreeNode(a + 1, None, [], [], None, 0, None) for a in range(ANCHORS)]  # (only kept)
    queued: list[Req] = []
    model: dict[int, tuple] = {}
    for o in ops:
        if o[0] == "query":
            _, i, a, matched, hits, span = o
            r = reqs[i]
            prefetch._queue_query(queued, r, anchors[a], matched, hits, span)
            model[r.seq] = (r, anchors[a], matched, hits, span)
        elif o[0] == "revoke":  # `_revoke_query`, asked only of a request in flight
            r = reqs[o[1]]
            assert (r.query_anchor is not None) == (r.seq in model) == (r in queued)
            if r.seq in model:
                assert (r.query_anchor, r.query_hits) == model.pop(r.seq)[1:4:2]
                r.query_anchor = None
                queued.remove(r)
        else:  # the drain: every entry, in query order, and none left in flight
            seen = []
            for r in queued:
                seen.append((r, r.query_anchor, r.query_matched, r.query_hits, r.query_span))
                r.query_anchor = None
            assert seen == list(model.values())
            queued, model = [], {}
        assert [r.seq for r in queued] == list(model)
        assert all(r.query_anchor is not None for r in queued)
        assert all(r.query_anchor is None for r in reqs if r not in queued)


def test_a_miss_and_a_hit_in_flight_are_drained_in_query_order(tmp_path):
    """A miss's anchor host-locked until the drain, a hit allocated by it: both on the list in
    the order queried, each request once, the list empty after the drain (Engine.check_invariants
    holds throughout)."""
    engine = helpers.storage_engine(tmp_path, "timeout", prefetch_policy="timeout")
    s = engine.scheduler
    assert s.rules.storage_acks_per_pass
    hit = helpers.queued_req(req("h", 0, list(range(1, 9)), seq=2))
    helpers.store_input_pages(engine, req("h", 0, list(range(1, 9)), seq=2))
    miss = helpers.queued_req(req("m", 0, list(range(101, 111)), seq=1))
    s.waiting[:] = [miss, hit]
    s._start_prefetch(miss, 0)
    s._start_prefetch(hit, 0)
    assert s.unallocated == [miss, hit]
    assert miss.query_hits == 0 and hit.query_hits > 0 and miss.query_span * PS == s.query_occupied
    engine.check_invariants()
    s.drain_prefetch_queries(0)
    assert s.unallocated == [] and miss.query_anchor is None is hit.query_anchor
    assert miss.prefetch is None and hit.prefetch is not None  # the hit's read started
    engine.check_invariants()


def test_the_index_and_its_bound_methods_are_set_together():
    """`use_requeries`: the scheduler arms and fires through the index it was given (the C one
    where the data plane is built, the reference in any case here)."""
    s = Engine(helpers.small_config(storage_tokens=128 * PS)).scheduler
    assert s.rq_arm.__self__ is s.requeries and s.rq_fire.__self__ is s.requeries
    ref = prefetch.RequeryIndexPy()
    s.use_requeries(ref)
    r = helpers.queued_req(req("r", 0, [1, 2, 3], seq=1))
    s.waiting[:] = [helpers.queued_req(req("head", 0, [7])), r]
    s.retry_interval, s.retry_cap = 2, 8
    s._arm_prefetch_retry(r)
    assert s.requeries is ref and ref.due(r) == s.prefetch_pass + 3
    s.prefetch_pass += 2
    assert s.rq_fire(s.prefetch_pass + 1, s.waiting) == [r] and ref.fired == 1 and not len(ref)
