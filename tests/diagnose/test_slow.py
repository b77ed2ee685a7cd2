"""slow: ranking by excess TTFT, filters, and agreement with explain."""

from __future__ import annotations

import pytest

from tierdiag.diagnose.request.explain import explain_request
from tierdiag.diagnose.request.slow import slow_requests
from tierdiag.errors import ConfigError
from tierdiag.store.reader import open_store, resolve_run


@pytest.fixture
def store(planted):
    con = open_store(planted.path)
    yield con, resolve_run(con, None)
    con.close()


def test_ranked_by_excess(store):
    con, run = store
    rows = slow_requests(con, run, top=6)
    assert [r.req_id for r in rows] == ["tier", "stor", "chunky", "queued", "recomp", "skip"]
    assert [r.rank for r in rows] == [1, 2, 3, 4, 5, 6]
    excess = [r.excess_ns for r in rows]
    assert excess == sorted(excess, reverse=True)
    assert rows[0].cause_ns == rows[0].excess_ns  # load-back owns all of tier's excess


def test_rejected_requests_are_not_ranked(store):
    con, run = store
    assert "rej" not in {r.req_id for r in slow_requests(con, run, top=100)}
    # warm, f1, f2 and miss ran at their ideal: not slow, not listed.
    assert {r.req_id for r in slow_requests(con, run, top=100)} == {
        "tier", "stor", "chunky", "queued", "recomp", "skip", "dev"}


def test_filters(store):
    con, run = store
    assert [r.req_id for r in slow_requests(con, run, hit_class="tiered_hit")] == ["tier", "stor"]
    assert [r.req_id for r in slow_requests(con, run, cause="recompute")] == ["recomp", "skip"]
    assert [r.req_id for r in slow_requests(con, run, hit_class="miss", cause="recompute", top=1)] == ["recomp"]
    assert slow_requests(con, run, hit_class="device_hit", cause="load_back") == []


def test_cause_agrees_with_explain(store):
    con, run = store
    for r in slow_requests(con, run, top=100):
        assert explain_request(con, run, r.req_id).primary_cause == r.primary_cause


@pytest.mark.parametrize("kwargs, fragment", [
    ({"hit_class": "tiered"}, "unknown hit class 'tiered'"),
    ({"cause": "loadback"}, "unknown cause 'loadback'"),
    ({"top": 0}, "--top must be at least 1"),
])
def test_bad_filters_are_user_errors(store, kwargs, fragment):
    con, run = store
    with pytest.raises(ConfigError, match=fragment):
        slow_requests(con, run, **kwargs)
