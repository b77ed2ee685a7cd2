"""The report's numbers, checked against the fake run's own columns (computed independently)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fake_run import fake_columns, write_fake_run
from tierdiag.diagnose.causes import primary_cause
from tierdiag.report import data as rd
from tierdiag.store.reader import open_store, resolve_run

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
    fin = _finished(req)
    assert h.num_requests == N and h.num_rejected == 2 and h.num_finished == N - 2
    assert h.input_tokens == _col(req, "input_tokens", fin).sum()
    split = h.tier_split["all"]
    assert split["device"] == _col(req, "device_hit_tokens", fin).sum()
    assert split["host"] == _col(req, "host_hit_tokens", fin).sum()
    assert split["storage"] == _col(req, "storage_hit_tokens", fin).sum()
    assert split["new"] + split["recomputed"] == _col(req, "computed_tokens", fin).sum()
    # Token conservation survives aggregation, for the run and for every class.
    for cls, parts in h.tier_split.items():
        mask = fin & (np.array(req["hit_class"]) == cls) if cls != "all" else fin
        assert sum(parts.values()) == _col(req, "input_tokens", mask).sum(), cls
    assert h.num_skipped_loadbacks == sum(r is not None for r in req["loadback_skipped_reason"])


def test_ttft_percentiles_per_class(store):
    con, run, req = store
    h = rd.load_headline(con, run)
    fin = _finished(req)
    classes = np.array(req["hit_class"])
    assert [t.hit_class for t in h.ttft] == ["all", "device_hit", "tiered_hit", "miss"]
    for t in h.ttft:
        mask = fin if t.hit_class == "all" else fin & (classes == t.hit_class)
        ttft = _col(req, "ttft_ns", mask)
        assert t.num_requests == len(ttft)
        assert t.p50_ns == pytest.approx(np.percentile(ttft, 50))
        assert t.p99_ns == pytest.approx(np.percentile(ttft, 99))
        assert t.p01_ns <= t.p25_ns <= t.p50_ns <= t.p75_ns <= t.p99_ns


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


def test_slowest_cached_are_cached_ranked_and_explained(store):
    con, run, _ = store
    slow = rd.load_slowest_cached(con, run, limit=12)
    assert len(slow) == 12
    assert {s.request.hit_class for s in slow} <= {"device_hit", "tiered_hit"}
    excess = [s.request.excess_ns for s in slow]
    assert excess == sorted(excess, reverse=True)
    for s in slow:
        assert s.explanation.req_id == s.request.req_id
        assert s.explanation.primary_cause == s.request.primary_cause
    # Nothing cached is slower than the last one listed.
    (worst_left,) = con.execute(
        "SELECT max(ttft_ns - ideal_ttft_ns) FROM requests WHERE run_id = ? AND status = 'finished' "
        "AND hit_class IN ('device_hit', 'tiered_hit') AND req_id NOT IN (SELECT unnest(?))",
        [run.run_id, [s.request.req_id for s in slow]]).fetchone()
    assert worst_left <= excess[-1]


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
