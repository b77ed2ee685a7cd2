"""Routing end to end (issue 31): real `replay --dp 4` runs, diagnosed and advised.

Six bursts, a minute apart, of the same 41 prefixes (48 pages of 64 tokens each, and 16 fresh
pages). With 41 prefixes over 4 ranks, round_robin sends each prefix to the next rank every
burst, so the rank that held it last time is seldom the one serving it; each rank's host pool
(65,536 tokens) keeps a prefix for about four bursts. What a request's own rank once cached and
lost while another rank still held it is routing's (causes.py): `summary` names it, `explain` says
where the prefix was, and `advise` replays cache_aware and confirms it. A one-rank replay of the
same trace has no routing at all.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from tierdiag.diagnose.request.causes import TtftParts

from tests.support.cli import invoke as _invoke, invoke_json as _json

from .test_advice_planted import Story
from .test_run_story import bursty

POOLS = {"model": "llama3-8b", "device_tokens": 16384, "host_tokens": 65536}


def _trace_runs(folder: Path, **options) -> Path:
    s = Story()
    bursty(s, prefixes=41, gap_ms=60_000)
    return s.replay(folder, {**POOLS, **options})


@pytest.fixture(scope="module")
def rr(tmp_path_factory) -> Path:
    return _trace_runs(tmp_path_factory.mktemp("rr"), dp=4, router="round_robin")


def _lost(db: Path) -> tuple[int, int, int, int]:
    """(routing tokens, their requests, recomputed tokens, input tokens) by this file's own SQL."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("""
            SELECT sum(CASE WHEN best_rank <> dp_rank THEN least(recomputed_tokens, greatest(best_rank_device_tokens
                       + best_rank_host_tokens - arrival_device_tokens - arrival_host_tokens - storage_match_tokens,
                       0)) ELSE 0 END),
                   count(*) FILTER (WHERE best_rank <> dp_rank AND least(recomputed_tokens, greatest(
                       best_rank_device_tokens + best_rank_host_tokens - arrival_device_tokens - arrival_host_tokens
                       - storage_match_tokens, 0)) > 0),
                   sum(recomputed_tokens), sum(input_tokens)
            FROM requests WHERE status = 'finished'""").fetchone()
    finally:
        con.close()


def test_summary_names_routing_where_it_lost_most_reuse(rr):
    lost, n, recomputed, _ = _lost(rr)
    assert lost >= recomputed / 2 > 0  # routing dominates the lost reuse
    d = _json("summary", "--db", str(rr))["diagnosis"]
    claim = next(c["text"] for c in d["claims"] if c["name"] == "routing")
    assert claim.startswith(f"Routing lost {lost:,} once-cached tokens")
    assert f"of the {recomputed:,} recomputed" in claim and f"in {n:,} requests across 4 ranks" in claim
    assert "the router (round_robin)" in claim
    by = {c["cause"]: c for c in _json("summary", "--db", str(rr))["time_by_cause"]}
    assert by["routing"]["ttft_part_ms"] > 0


def test_explain_says_where_the_prefix_was(rr):
    con = duckdb.connect(str(rr), read_only=True)
    cur = con.execute("SELECT * FROM requests WHERE status = 'finished'")
    names = [x[0] for x in cur.description]
    rows = [dict(zip(names, r)) for r in cur.fetchall()]
    con.close()
    row = max(rows, key=lambda r: TtftParts.from_row(r).routing_ns)
    e = _json("explain", row["req_id"], "--db", str(rr))
    claim = next(c["text"] for c in e["claims"] if c["name"] == "routing")
    held = row["best_rank_device_tokens"] + row["best_rank_host_tokens"]
    assert f"At its arrival rank {row['best_rank']} held {held:,} tokens of its prefix" in claim
    assert f"the router sent it to rank {row['dp_rank']} ({row['route_reason']})" in claim


def test_advise_proposes_and_confirms_cache_aware(rr, tmp_path):
    db = tmp_path / "advise.duckdb"
    db.write_bytes(rr.read_bytes())
    out = _invoke("advise", "--db", str(db), "--budget", "2", "--jobs", "1", "--json")
    j = json.loads(out[out.index("{"):])
    router = next(c for c in j["candidates"] if c["kind"] == "router")
    assert router["changes"] == {"router": "cache_aware"} and router["advice_status"] == "confirmed"
    item = next(a for a in j["advice"] if a["kind"] == "router")
    v = item["verified"]
    assert v["target"] == "routing_share" and v["target_after"] < v["target_before"]
    assert v["ttft_p50_ms_after"] <= v["ttft_p50_ms_before"] * 0.95
    assert item["prediction"].startswith("predicted: brings back up to")


def test_one_rank_has_no_routing(tmp_path):
    db = _trace_runs(tmp_path)
    assert _lost(db)[0] == 0
    d = _json("summary", "--db", str(db))["diagnosis"]
    assert not any(c["name"] == "routing" for c in d["claims"])
    assert not any(a["kind"] in ("router", "router_threshold") for a in d["advice"])
