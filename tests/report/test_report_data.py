"""The report's numbers, checked against the fake run's own columns (computed independently)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fake_run import fake_columns, write_fake_run
from tierdiag.diagnose.request.causes import primary_cause
from tierdiag.diagnose.read.quantile import nearest_rank
from tierdiag.diagnose.request.slow import slow_requests
from tierdiag.diagnose.request.slow_groups import BURST_GAP_SHARE
from tierdiag.report import series as rd
from tierdiag.store.reader import open_store, resolve_run
from tierdiag.store.schema import TABLES

N = 400
SEED = 3


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    db = tmp_path_factory.mktemp("data") / "run.duckdb"
    write_fake_run(db, N, SEED)
    con = open_store(db)
    yield con, resolve_run(con, None), fake_columns(N, SEED)["requests"]
    con.close()


def _finished(req: dict) -> np.ndarray:
    return np.array([s == "finished" for s in req["status"]])


def _col(req: dict, name: str, mask: np.ndarray) -> np.ndarray:
    return np.array([v for v, ok in zip(req[name], mask) if ok], dtype=float)


def test_headline_token_split_matches_columns(store):
    con, run, req = store
    h = rd.load_headline(con, run)
    sm = h.summary
    fin = _finished(req)
    assert sm.num_requests == N and sm.num_rejected == 2 and sm.num_finished == N - 2
    assert sm.tokens.input_tokens == _col(req, "input_tokens", fin).sum()
    split = h.tier_split["all"]
    assert split["device"] == _col(req, "device_hit_tokens", fin).sum()
    assert split["host"] == _col(req, "host_hit_tokens", fin).sum()
    assert split["storage"] == _col(req, "storage_hit_tokens", fin).sum()
    assert split["new"] + split["recomputed"] == _col(req, "computed_tokens", fin).sum()
    # Token conservation survives aggregation, for the run and for every class.
    for cls, parts in h.tier_split.items():
        mask = fin & (np.array(req["hit_class"]) == cls) if cls != "all" else fin
        assert sum(parts.values()) == _col(req, "input_tokens", mask).sum(), cls
    skipped = sum(k.num_requests for k in sm.skipped if k.tier == "host")
    assert skipped == sum(r is not None for r, ok in zip(req["loadback_skipped_reason"], fin) if ok)
    # The span starts at the first arrival (rejected requests arrive too).
    assert h.t0_ns == min(req["arrival_ns"])


def test_ttft_percentiles_per_class_are_nearest_rank(store):
    con, run, req = store
    h = rd.load_headline(con, run)
    fin = _finished(req)
    classes = np.array(req["hit_class"])
    assert [t.hit_class for t in h.ttft] == ["all", "device_hit", "tiered_hit", "miss"]
    for t in h.ttft:
        mask = fin if t.hit_class == "all" else fin & (classes == t.hit_class)
        ttft = sorted(_col(req, "ttft_ns", mask))
        assert t.num_requests == len(ttft)
        # One definition: nearest rank, a recorded value, the same as summary's.
        assert t.p50_ns == nearest_rank(ttft, 0.5) and t.p99_ns == nearest_rank(ttft, 0.99)
        assert t.p25_ns == nearest_rank(ttft, 0.25) and t.p01_ns == nearest_rank(ttft, 0.01)
        assert t.p01_ns <= t.p25_ns <= t.p50_ns <= t.p75_ns <= t.p99_ns
    by_class = {c.hit_class: c for c in h.summary.classes}
    assert all(t.p50_ns == by_class[t.hit_class].ttft_p50_ns for t in h.ttft)


def test_timeline_keeps_peaks_when_binned(store, monkeypatch):
    con, run, _ = store
    raw = rd.load_timeline(con, run)
    assert {p.tier for p in raw.pools} == {"device", "host"} and not any(p.binned for p in raw.pools)
    monkeypatch.setattr(rd, "MAX_LINE_POINTS", 50)
    monkeypatch.setattr(rd, "TIME_BINS", 40)
    binned = rd.load_timeline(con, run)
    for r, b in zip(raw.pools, binned.pools):
        assert b.binned and len(b.t_s) <= 40
        # Max per bin: the pool's highest occupancy is never smoothed away.
        assert b.used_tokens.max() == r.used_tokens.max()
        assert b.capacity_tokens == r.capacity_tokens
    # Every eviction and every load-back byte lands in some bin.
    (n_ev,) = con.execute("SELECT count(*) FROM evictions WHERE run_id = ?", [run.run_id]).fetchone()
    assert sum(m.count.sum() for m in binned.evictions) == n_ev
    (lb_bytes,) = con.execute("SELECT sum(bytes) FROM transfers WHERE run_id = ? AND kind = 'load_back'",
                              [run.run_id]).fetchone()
    assert (binned.bw_bytes_per_s * binned.bin_s).sum() == pytest.approx(lb_bytes)


def test_points_unsampled_carry_causes(store):
    con, run, req = store
    pts = rd.load_points(con, run)
    assert not pts.sampled and pts.total == N - 2 and len(pts.req_id) == N - 2
    by_id = {rid: i for i, rid in enumerate(req["req_id"])}
    for rid, cause in zip(pts.req_id[:50], pts.cause[:50]):
        row = {k: v[by_id[rid]] for k, v in req.items()}
        assert cause == primary_cause(row)
    assert np.all((pts.host_share >= 0) & (pts.host_share < 1))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(max_points=st.integers(1, N), keep=st.integers(0, N))
def test_points_sampling_keeps_the_slowest(store, max_points, keep):
    con, run, _ = store
    full = rd.load_points(con, run)
    pts = rd.load_points(con, run, max_points=max_points, keep_slowest=keep)
    assert pts.total == full.total
    assert pts.sampled == (full.total > max_points)
    assert len(pts.req_id) == min(max_points, full.total)
    assert len(set(pts.req_id)) == len(pts.req_id)
    kept = min(keep, max_points)
    if pts.sampled and kept:
        slowest = set(full.req_id[np.argsort(-full.excess_ns, kind="stable")[:kept]])
        # Ties in excess may swap which equal-excess request is kept; compare excess values.
        threshold = np.sort(full.excess_ns)[::-1][kept - 1]
        assert pts.excess_ns.max() == full.excess_ns.max()
        assert (pts.excess_ns >= threshold).sum() >= len(slowest) - 1


def test_points_sample_is_deterministic(store):
    con, run, _ = store
    a = rd.load_points(con, run, max_points=100, keep_slowest=10)
    b = rd.load_points(con, run, max_points=100, keep_slowest=10)
    assert a.req_id.tolist() == b.req_id.tolist()


def test_decomposition_shares_and_class_means(store):
    con, run, req = store
    d = rd.load_decomposition(con, run)
    assert sum(d.total_share.values()) == pytest.approx(1.0)
    assert d.bin_count.sum() == N - 2
    fin = _finished(req)
    classes = np.array(req["hit_class"])
    for cls, means in d.by_class.items():
        mask = fin & (classes == cls)
        for comp in rd.COMPONENTS:
            assert means[comp] == pytest.approx(_col(req, comp, mask).mean()), (cls, comp)
        assert sum(means.values()) == pytest.approx(_col(req, "ttft_ns", mask).mean())


def test_slow_groups_are_cached_bursts_of_one_cause(store):
    con, run, _ = store
    h = rd.load_headline(con, run)
    groups, considered = rd.load_slow_groups(con, run, h.t0_ns, h.span_ns, pool=60, limit=50)
    members = [r for g in groups for r in g.requests]
    assert len(members) == considered <= 60 and len({r.req_id for r in members}) == len(members)
    totals = [g.excess_total_ns for g in groups]
    assert totals == sorted(totals, reverse=True)
    gap = BURST_GAP_SHARE * h.span_ns
    for g in groups:
        assert {r.primary_cause for r in g.requests} == {g.cause} and g.cause != "none"
        assert {r.hit_class for r in g.requests} <= {"device_hit", "tiered_hit"}
        excess = [r.excess_ns for r in g.requests]
        assert excess == sorted(excess, reverse=True) and g.excess_total_ns == sum(excess)
        assert g.worst.request is g.requests[0] and g.worst.explanation.req_id == g.requests[0].req_id
        assert g.worst.explanation.primary_cause == g.cause
        assert g.first_arrival_s <= g.last_arrival_s
    # Bursts: consecutive (in arrival order) members of different bursts are more than a gap apart.
    by_arrival = sorted(members, key=lambda r: r.arrival_ns)
    burst_of = {r.req_id: g.burst for g in groups for r in g.requests}
    for a, b in zip(by_arrival, by_arrival[1:]):
        assert (burst_of[a.req_id] != burst_of[b.req_id]) == (b.arrival_ns - a.arrival_ns > gap)
    # Nothing cached and slow for a reason is left out of a pool it would rank into.
    worst_left = max((r.excess_ns for cls in ("device_hit", "tiered_hit")
                      for r in slow_requests(con, run, top=500, hit_class=cls)
                      if r.primary_cause != "none" and r.req_id not in burst_of), default=0)
    assert worst_left <= min(r.excess_ns for r in members)


def test_load_series_integrates_to_the_requests_and_batches(store):
    con, run, req = store
    h = rd.load_headline(con, run)
    ld = rd.load_load(con, run, h.t0_ns)
    fin = _finished(req)
    arrival, queue = _col(req, "arrival_ns", fin), _col(req, "queue_ns", fin)
    ttft, finish = _col(req, "ttft_ns", fin), _col(req, "finish_ns", fin)
    w_ns = ld.bin_s * 1e9
    # Time-weighted means per bin integrate back to the summed time in each phase.
    assert ld.waiting.sum() * w_ns == pytest.approx(queue.sum(), rel=1e-6)
    assert ld.prefilling.sum() * w_ns == pytest.approx((ttft - queue).sum(), rel=1e-6)
    assert ld.decoding.sum() * w_ns == pytest.approx((finish - arrival - ttft).sum(), rel=1e-6)
    waiting_tok = (queue * _col(req, "input_tokens", fin)).sum()
    assert ld.waiting_tokens.sum() * w_ns == pytest.approx(waiting_tok, rel=1e-6)
    # Busy share over the run's span, the span summary reports.
    assert ld.prefill_busy_share == pytest.approx((ttft - queue).sum() / h.span_ns)
    assert ld.busy_total.sum() * w_ns == pytest.approx((ttft - queue).sum(), rel=1e-6)
    assert len(ld.t_s) == rd.LOAD_BINS
    assert (ld.busy_recompute is not None) == ("recompute_ns" in TABLES["batches"])


def test_arrival_bins_carry_token_sources_and_quantiles(store):
    con, run, req = store
    d = rd.load_decomposition(con, run)
    fin = _finished(req)
    assert sum(d.bin_tokens[p].sum() for p in rd.TIER_PARTS) == _col(req, "input_tokens", fin).sum()
    assert d.bin_tokens["device"].sum() == _col(req, "device_hit_tokens", fin).sum()
    assert np.all(d.bin_p50_ns <= d.bin_p99_ns)
    assert d.bin_t_s[0] < d.bin_s  # from the first arrival


def test_run_verdict_is_summary_dominant_cause(store):
    con, run, _ = store
    data = rd.load_report_data(con, run)
    v, sm = data.verdict, data.summary
    with_excess = [c for c in sm.time_by_cause if c.cause != "none" and (c.excess_part_ns or 0) > 0]
    assert v.dominant == max(with_excess, key=lambda c: c.excess_part_ns).cause
    assert v.ranked[0].excess_share == max(c.excess_share for c in with_excess)
    assert v.excess_total_ns == sm.excess_total_ns
    # The verdict carries summary's diagnosis (issue 12) as it is: root cause, finding, advice.
    assert sm.diagnosis is not None
    assert (v.root_cause, v.finding, v.advice) == (sm.diagnosis.dominant_cause, sm.diagnosis.finding,
                                                   tuple(sm.diagnosis.advice))


def test_run_without_transfers_or_evictions(tmp_path: Path):
    db = tmp_path / "empty.duckdb"
    writer = write_fake_run(db, 30, 1)
    con = open_store(db)
    try:
        run = resolve_run(con, writer.run_id)
        con.close()
        import duckdb

        rw = duckdb.connect(str(db))
        rw.execute("DELETE FROM transfers; DELETE FROM evictions")
        rw.close()
        con = open_store(db)
        data = rd.load_report_data(con, run)
        assert len(data.transfers.bytes) == 0
        assert data.timeline.evictions == ()
        assert data.timeline.bw_bytes_per_s.sum() == 0
        assert data.headline.num_evictions == 0
    finally:
        con.close()


def _union_ns(intervals) -> float:
    total, reach = 0.0, None
    for t0, t1 in sorted(intervals):
        if reach is None or t0 > reach:
            total += t1 - t0
            reach = t1
        elif t1 > reach:
            total += t1 - reach
            reach = t1
    return total


def test_decode_busy_is_the_union_of_decode_intervals(store):
    con, run, req = store
    h = rd.load_headline(con, run)
    ld = rd.load_load(con, run, h.t0_ns)
    fin = _finished(req)
    arrival, ttft, finish = _col(req, "arrival_ns", fin), _col(req, "ttft_ns", fin), _col(req, "finish_ns", fin)
    decoding = [(a + t, f) for a, t, f in zip(arrival, ttft, finish) if f > a + t]
    union = _union_ns(decoding)
    # Busy while any request decodes: the union, never the sum (requests decode side by side).
    assert ld.busy_decode.sum() * ld.bin_s * 1e9 == pytest.approx(union, rel=1e-6)
    assert ld.decode_busy_share == pytest.approx(union / h.span_ns, rel=1e-6)
    assert union < sum(f - t0 for t0, f in decoding)  # the fake run does overlap its decodes
    assert ((ld.busy_decode >= 0) & (ld.busy_decode <= 1 + 1e-9)).all()
