"""Miss reasons (engine/miss.py, DESIGN §7, issue 40): every token a finished request computed gets
exactly one reason from the fixed list; the reasons sum to computed_tokens for any workload and
configuration, never negative; rejected requests have none. A demotion to host is never a miss."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine.test_invariants import configs, replay, workloads
from tierdiag.engine import miss as M
from tierdiag.store import schema as S


def test_the_store_has_the_engines_columns():
    assert S.MISS_REASONS == M.MISS_REASONS and S.MISS_COLUMNS == M.MISS_COLUMNS
    assert set(M.MISS_COLUMNS) <= set(S.TABLES["requests"])
    # v5 added the first nine; v7 the tenth (prefetch_lost), at the end of the table (nothing renamed)
    assert S.ADDED_COLUMNS[5]["requests"] + S.ADDED_COLUMNS[7]["requests"] == M.MISS_COLUMNS
    assert list(S.TABLES["requests"])[-1] == "miss_prefetch_lost_tokens"
    assert len(set(M.MISS_REASONS)) == len(M.MISS_REASONS) == 10


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reqs=workloads(), cfg=configs())
def test_reasons_sum_to_computed_tokens_for_any_workload(reqs, cfg, tmp_path_factory):
    _, probe = replay(reqs, cfg, tmp_path_factory.mktemp("miss"), "a")
    for r in probe.records.values():
        got = [getattr(r, c) for c in M.MISS_COLUMNS]
        if r.status == "rejected":
            assert got == [None] * len(got)
            continue
        assert min(got) >= 0 and sum(got) == r.computed_tokens, (r.req_id, dict(zip(M.MISS_REASONS, got)))
        # The once-cached ones are exactly the recomputed tokens; the rest were new here.
        new = r.miss_never_cached_tokens + r.miss_shared_in_batch_tokens
        assert new == r.computed_tokens - r.recomputed_tokens
        if not cfg.storage_tokens:
            assert r.miss_beyond_storage_tokens == r.miss_prefetch_declined_tokens == r.miss_prefetch_revoked_tokens == 0
            assert r.miss_prefetch_lost_tokens == 0
        else:
            assert r.miss_evicted_before_reuse_tokens == 0
        assert r.miss_routed_elsewhere_tokens == 0  # one rank


_maybe_int = st.one_of(st.none(), st.integers(-10**12, 10**12))


@settings(max_examples=60, deadline=None)
@given(row=st.fixed_dictionaries({
    "computed_tokens": _maybe_int, "recomputed_tokens": _maybe_int, "device_hit_tokens": _maybe_int,
    "host_match_tokens": _maybe_int, "storage_match_tokens": _maybe_int, "storage_hit_tokens": _maybe_int,
    "loadback_skipped_tokens": _maybe_int,
    "loadback_skipped_reason": st.sampled_from([None, "below_threshold", "device_full"]),
    "storage_skipped_reason": st.sampled_from([None, "prefetch_incomplete", "host_full", "rate_limited", "x"]),
    "dp_rank": st.sampled_from([None, 0, 1]), "best_rank": st.sampled_from([None, 0, 1, 2]),
    "best_rank_device_tokens": _maybe_int, "best_rank_host_tokens": _maybe_int,
    "arrival_device_tokens": _maybe_int, "arrival_host_tokens": _maybe_int}),
    arrival=st.integers(-5, 10**6), shared=st.integers(-5, 10**6), lost=st.integers(-5, 10**6),
    ps=st.sampled_from([1, 16, 64]), storage=st.booleans())
def test_the_split_holds_for_hostile_rows(row, arrival, shared, lost, ps, storage):
    out = M.miss_split(row, M.MissFacts(arrival, shared, lost), ps, storage)
    assert list(out) == list(M.MISS_REASONS)
    assert min(out.values()) >= 0 and sum(out.values()) == max(row["computed_tokens"] or 0, 0)


def _lost_reference(ranges, matched):
    """The pages its prefetches inserted past its match at scheduling, one page at a time."""
    return len({p for lo, hi in ranges for p in range(lo, hi) if p >= matched})


_PAGE = st.integers(min_value=-5, max_value=200)


@settings(max_examples=60, deadline=None)
@given(ranges=st.lists(st.tuples(_PAGE, _PAGE), max_size=6), matched=st.integers(min_value=-10, max_value=250),
       again=st.integers(min_value=-10, max_value=250))
def test_prefetch_lost_pages_are_the_read_pages_past_the_match(ranges, matched, again):
    """MissTracker.prefetched / matched (engine/miss.py): the pages of every range its prefetches
    inserted (overlapping re-reads counted once) that lie past its match at its first scheduling;
    a retracted request matched again keeps the first count; a request never read has none."""
    tracker = M.MissTracker(64)
    for lo, hi in ranges:
        tracker.prefetched(7, lo, hi)
    tracker.matched(7, matched)
    tracker.prefetched(7, 0, 300)  # read again after a retraction: its record keeps its first admission
    tracker.matched(7, again)
    tracker.matched(8, matched)  # never prefetched
    want = _lost_reference([(lo, hi) for lo, hi in ranges if hi > lo], max(matched, 0))
    assert tracker.take(7).prefetch_lost_pages == want
    assert tracker.take(8).prefetch_lost_pages == 0
    assert tracker.take(7) == M.MissFacts(0, 0, 0)  # taken once
