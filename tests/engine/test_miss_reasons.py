"""Miss reasons (engine/miss.py, DESIGN §7, issue 40): every token a finished request computed gets
exactly one reason from the fixed list; the reasons sum to computed_tokens for any workload and
configuration, never negative; rejected requests have none. A demotion to host is never a miss."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine.helpers import chained_keys, tracked_req
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
    # the integers the record takes (miss_tokens, in MISS_REASONS' order) are the reference's split
    assert out == _split_reference(row, M.MissFacts(arrival, shared, lost), ps, storage)


def _split_reference(r: dict, facts, ps: int, storage_tier: bool) -> dict[str, int]:
    """miss_split as it was written before issue 41 made it integers (a dict of the reasons and a
    closure that gives each its share): the reference the compiled miss_tokens is held to."""
    out = dict.fromkeys(M.MISS_REASONS, 0)
    computed = max(int(r.get("computed_tokens") or 0), 0)
    left = computed
    recomputed = min(int(r.get("recomputed_tokens") or 0), computed)

    def give(reason, tokens, cap):
        nonlocal left
        n = max(min(tokens, cap, left), 0)
        out[reason] += n
        left -= n
        return n

    def routing():
        rank, best = r.get("dp_rank"), r.get("best_rank")
        if rank is None or best is None or best == rank:
            return 0
        gap = sum(int(r.get(k) or 0) for k in ("best_rank_device_tokens", "best_rank_host_tokens")) - sum(
            int(r.get(k) or 0) for k in ("arrival_device_tokens", "arrival_host_tokens", "storage_match_tokens"))
        return min(int(r.get("recomputed_tokens") or 0), max(gap, 0))

    rec_left = recomputed
    if r.get("loadback_skipped_reason"):
        rec_left -= give("loadback_skipped", int(r.get("loadback_skipped_tokens") or 0), rec_left)
    lost = give("prefetch_lost", max(facts.prefetch_lost_pages, 0) * ps, rec_left)
    rec_left -= lost
    if r.get("storage_skipped_reason"):
        unused = int(r.get("storage_match_tokens") or 0) - int(r.get("storage_hit_tokens") or 0) - lost
        reason = {"prefetch_incomplete": "prefetch_revoked"}.get(r["storage_skipped_reason"], "prefetch_declined")
        rec_left -= give(reason, unused, rec_left)
    rec_left -= give("routed_elsewhere", routing(), rec_left)
    at_sched = int(r.get("device_hit_tokens") or 0) + int(r.get("host_match_tokens") or 0)
    rec_left -= give("lost_while_queued", facts.arrival_pages * ps - at_sched, rec_left)
    give("beyond_storage" if storage_tier else "evicted_before_reuse", rec_left, rec_left)
    give("shared_in_batch", facts.shared_pages * ps, left)
    give("never_cached", left, left)
    return out


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
    seven, eight = tracked_req(7), tracked_req(8)
    for lo, hi in ranges:
        tracker.prefetched(7, lo, hi)
    tracker.matched(seven, matched)
    tracker.prefetched(7, 0, 300)  # read again after a retraction: its record keeps its first admission
    tracker.matched(seven, again)
    tracker.matched(eight, matched)  # never prefetched
    want = _lost_reference([(lo, hi) for lo, hi in ranges if hi > lo], max(matched, 0))
    assert tracker.take(seven).prefetch_lost_pages == want
    assert tracker.take(eight).prefetch_lost_pages == 0
    assert tracker.take(seven) == M.MissFacts(0, 0, 0)  # taken once
    assert not tracker._read  # the second read's ranges went with its take


@settings(max_examples=60, deadline=None)
@given(calls=st.lists(st.tuples(st.integers(0, 3), st.lists(st.integers(0, 2), max_size=10),
                                st.integers(-2, 12), st.integers(-2, 12), st.integers(-5, 200)), max_size=12),
       ps=st.sampled_from([1, 16]))
def test_shared_in_batch_pages_match_a_set_built_for_every_batch(calls, ps):
    """MissTracker.scheduled keeps a batch's first request's pages as they are until a second joins
    (issue 41); the shared pages it counts are those of a set made at every batch's start: a
    request's pages to compute ([first, input_len // ps)) that a request ahead of it in the same
    batch (same `now`) computes in its first chunk ([first, end)). Keys chain as the engine's
    page keys do (helpers.chained_keys, of each request's path of branch choices)."""
    tracker = M.MissTracker(ps)
    reqs = []
    want: dict[int, int] = {}
    batch_ns, batch = None, set()
    calls = sorted(calls, key=lambda c: c[0])
    keys_of = chained_keys([path for _, path, _, _, _ in calls])
    for seq, (now, _, first, end, input_len) in enumerate(calls):
        keys = keys_of[seq]
        req = tracked_req(seq, keys, input_len)
        reqs.append(req)
        tracker.scheduled(req, now, first, end)
        if now != batch_ns:
            batch_ns, batch = now, set()
        if batch:
            shared = sum(k in batch for k in keys[first:input_len // ps])
            if shared:
                want[seq] = shared
        batch.update(keys[first:end])
    assert {r.seq: tracker.take(r).shared_pages for r in reqs} == \
        {seq: want.get(seq, 0) for seq in range(len(calls))}
