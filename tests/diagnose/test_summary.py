"""summary on the planted store: token-weighted split, classes, load-backs, evictions, causes."""

from __future__ import annotations

import json

import pytest

from tierdiag.diagnose.run.summary import run_summary
from tierdiag.store.reader import open_store, resolve_run

from .conftest import KV_BYTES_PER_TOKEN, MS


@pytest.fixture
def summary(planted):
    with open_store(planted.path) as con:
        return run_summary(con, resolve_run(con, None))


def test_token_weighted_split(summary, planted):
    finished = [r for r in planted.requests if r["status"] == "finished"]
    t = summary.tokens
    assert t.input_tokens == sum(r["input_tokens"] for r in finished)
    assert (t.device_tokens, t.host_tokens, t.storage_tokens) == (4096, 2048, 1024)
    assert t.device_tokens + t.host_tokens + t.storage_tokens + t.computed_tokens == t.input_tokens
    assert t.recomputed_tokens == 512 + 192
    # 4 of 11 requests reused something, but the token share is what tiers actually served.
    assert summary.hit_requests == 4 and summary.hit_request_share == pytest.approx(4 / 11)
    assert summary.reused_token_share == pytest.approx(7168 / t.input_tokens)
    assert summary.median_reused_tokens_per_hit == 2048


def test_counts_and_classes(summary):
    assert (summary.num_requests, summary.num_finished, summary.num_rejected) == (12, 11, 1)
    assert [(r.reason, r.num_requests) for r in summary.rejected_reasons] == [("larger than the device pool", 1)]
    by = {c.hit_class: c for c in summary.classes}
    assert [c.hit_class for c in summary.classes] == ["device_hit", "tiered_hit", "miss", "all"]
    assert (by["device_hit"].num_requests, by["tiered_hit"].num_requests, by["miss"].num_requests) == (2, 2, 7)
    assert by["all"].num_requests == 11
    assert by["tiered_hit"].ttft_max_ns == 8 * MS + 60_000


def test_load_back_skips_and_evictions(summary):
    lb = summary.load_back
    assert lb.num_requests == 2 and lb.num_transfers == 2 and lb.loaded_tokens == 3072
    assert lb.bytes == 3072 * KV_BYTES_PER_TOKEN and lb.exposed_ns == 9 * MS
    assert lb.num_prefetches == 1 and lb.storage_wait_ns == 4 * MS
    assert [(s.tier, s.reason, s.num_requests, s.tokens) for s in summary.skipped] == [
        ("host", "below_threshold", 1, 192)]
    assert [(e.tier, e.action, e.num_events) for e in summary.evictions] == [("device", "demote", 4), ("host", "delete", 1)]
    assert [(r.req_id, r.num_events) for r in summary.most_evicted_from] == [("warm", 5)]
    assert [(r.req_id, r.num_events) for r in summary.top_evictors] == [("f2", 3), ("f1", 2)]


def test_time_by_cause(summary):
    by = {c.cause: c for c in summary.time_by_cause}
    assert {c: by[c].num_requests for c in by} == {
        "none": 5, "queueing": 1, "load_back": 1, "storage_fetch": 1, "routing": 0, "recompute": 2, "compute": 1}
    assert by["load_back"].ttft_part_ns == 9 * MS
    shares = [c.ttft_share for c in summary.time_by_cause if c.ttft_share is not None]
    assert sum(shares) == pytest.approx(1.0)
    assert by["compute"].excess_part_ns == 1 * MS  # only chunky's compute beyond its ideal
    assert sum(c.excess_part_ns for c in summary.time_by_cause if c.excess_part_ns) == summary.excess_total_ns


def test_json_round_trips(summary):
    j = json.loads(json.dumps(summary.to_json()))
    assert j["tokens"]["share_of_input"]["host"] == pytest.approx(2048 / summary.tokens.input_tokens)
    assert j["load_back"]["exposed_ms"] == pytest.approx(9.0)


def test_a_run_with_no_requests(tmp_path):
    """A replay interrupted before its first flush: every view still answers, with zeros."""
    from tierdiag.diagnose.request.slow import slow_requests

    from .conftest import RunBuilder

    b = RunBuilder(tmp_path / "empty.duckdb")
    b.write()
    with open_store(b.path) as con:
        run = resolve_run(con, None)
        s = run_summary(con, run)
        assert slow_requests(con, run) == []
    assert (s.num_requests, s.tokens.input_tokens, s.span_ns) == (0, 0, 0)
    assert [c.hit_class for c in s.classes] == ["all"] and s.classes[0].ttft_p50_ns is None
    assert s.load_back.loadbacks_per_s is None and s.reused_token_share is None
    json.dumps(s.to_json())


def test_median_reused_per_hit_is_nearest_rank(tmp_path):
    """One percentile definition (diagnose/read/quantile.py): the median reused tokens per hit is a
    recorded request's value at rank ceil(n / 2), never DuckDB's interpolating median() (which
    would say 2,560 for hits of 1,024 and 4,096 tokens: no request's)."""
    from .conftest import RunBuilder

    b = RunBuilder(tmp_path / "two_hits.duckdb")
    b.request("a", arrival_ns=0, input_tokens=8192, device=1024)
    b.request("b", arrival_ns=MS, input_tokens=8192, device=4096)
    b.request("c", arrival_ns=2 * MS, input_tokens=8192)  # a miss: not a hit
    b.write()
    with open_store(b.path) as con:
        s = run_summary(con, resolve_run(con, None))
    assert s.hit_requests == 2
    assert s.median_reused_tokens_per_hit == 1024
