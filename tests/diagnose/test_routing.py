"""Routing as a cause (issue 31): once-cached tokens recomputed on one data-parallel rank while
another rank held them at arrival.

A bursty replay on small pools (six bursts of the same 40 prefixes, each burst recomputing what
the last one cached) is turned into a 4-rank run by writing the v4 columns, as the engine's
`--dp 4` would: every request served by rank 0 (whose GPU the recorded batches are), and for the
planted requests a best rank among 1-3 that held their whole recomputed prefix on device at arrival. `summary` must then name routing as
the root cause, with a sentence whose every number this file recomputes from the rows with its
own SQL; a control (the same rows, each request's best rank its own) must not mention routing.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import duckdb
import pytest

from tierdiag.diagnose.request.causes import TtftParts, recompute_cost_ns
from tierdiag.diagnose.dp.routing_loss import position_weight, routing_cost_ns, tokens_per_attention
from tierdiag.store.reader import open_store, resolve_run
from tierdiag.units import fmt_ms, fmt_pct

from .test_advice_planted import Story
from .test_run_story import bursty

pytest.importorskip("tierdiag.cli.replay")
from tests.support.cli import invoke_json as _json  # noqa: E402

RANKS = 4


def plant_ranks(db: Path, *, routed: bool, router: str = "round_robin", share_lost: float = 1.0) -> None:
    """Make the store's one run a RANKS-rank run (module doc). `routed`: the requests that
    recomputed something (all of them when `share_lost` is 1; else the first that share of
    each burst) had it on rank 1 + seq % 3 at arrival; otherwise every best rank is the own one."""
    con = duckdb.connect(str(db))
    try:
        rid, cfg = con.execute("SELECT run_id, config_json FROM runs").fetchone()
        con.execute("UPDATE runs SET config_json = ? WHERE run_id = ?",
                    [json.dumps({**json.loads(cfg), "dp": RANKS, "router": router}), rid])
        lost = (f"recomputed_tokens > 0 AND (seq % 40) < {int(40 * share_lost)}" if routed else "false")
        con.execute(f"""UPDATE requests SET dp_rank = 0, route_branch = 'round_robin',
                            route_reason = 'round_robin: next rank 0',
                            arrival_device_tokens = device_hit_tokens, arrival_host_tokens = host_match_tokens,
                            best_rank = CASE WHEN {lost} THEN 1 + seq % {RANKS - 1} ELSE 0 END,
                            best_rank_device_tokens = device_hit_tokens
                                + CASE WHEN {lost} THEN recomputed_tokens + host_match_tokens ELSE 0 END,
                            best_rank_host_tokens = host_match_tokens WHERE run_id = ?""", [rid])
        for table in ("batches", "transfers", "evictions", "pool_samples"):
            con.execute(f"UPDATE {table} SET dp_rank = 0 WHERE run_id = ?", [rid])
    finally:
        con.close()


@pytest.fixture(scope="module")
def bursts(tmp_path_factory) -> Path:
    s = Story()
    bursty(s)
    return s.replay(tmp_path_factory.mktemp("dp"), {"model": "llama3-8b", "device_tokens": 16384,
                                                    "host_tokens": 16384})


@pytest.fixture
def routed(bursts, tmp_path) -> Path:
    db = tmp_path / "routed.duckdb"
    db.write_bytes(bursts.read_bytes())
    plant_ranks(db, routed=True)
    return db


def _rows(db: Path) -> list[dict]:
    with open_store(db) as con:
        run = resolve_run(con, None)
        cur = con.execute("SELECT * FROM requests WHERE run_id = ? AND status = 'finished'", [run.run_id])
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r)) for r in cur.fetchall()], run.config


def _tokens(text: str) -> list[int]:
    return [int(x.replace(",", "")) for x in re.findall(r"\b\d[\d,]*\b", text)]


def test_the_routing_tokens_by_the_tests_own_sql(routed):
    # r = min(recomputed, best device + host - own device + host + storage match), best != own.
    con = duckdb.connect(str(routed), read_only=True)
    ours = con.execute("""
        SELECT sum(least(recomputed_tokens, greatest(best_rank_device_tokens + best_rank_host_tokens
                   - arrival_device_tokens - arrival_host_tokens - storage_match_tokens, 0))),
               sum(recomputed_tokens), count(*) FILTER (WHERE best_rank <> dp_rank AND recomputed_tokens > 0)
        FROM requests WHERE status = 'finished' AND best_rank <> dp_rank""").fetchone()
    total = con.execute("SELECT sum(recomputed_tokens), sum(input_tokens) FROM requests "
                        "WHERE status = 'finished'").fetchone()
    con.close()
    assert ours[0] > 0 and ours[0] == total[0]  # planted: every recomputed token was on another rank
    d = _json("summary", "--db", str(routed))["diagnosis"]
    assert d["dominant_cause"] == "routing", d["finding"]
    claim = next(c["text"] for c in d["claims"] if c["name"] == "routing")
    numbers = _tokens(claim)
    # "Routing lost R once-cached tokens (x % of the T recomputed, y % of input) in N requests across K ranks"
    assert numbers[0] == ours[0] and f"of the {total[0]:,} recomputed" in claim
    assert f"in {ours[2]:,} requests across {RANKS} ranks" in claim
    assert "round_robin" in claim and "round_robin 100 %" in claim
    assert f"({fmt_pct(ours[0] / total[0])} of the" in claim and f", {fmt_pct(ours[0] / total[1])} of input)" in claim
    # Its cost, priced by position with this file's own arithmetic: the request's recompute
    # re-priced against its ideal, times the routing tokens' share of the recomputed positions'
    # weight (a + b p per token, a / b = 2 params / (4 layers hidden) of llama3-8b).
    k = 2 * 8.03e9 / (4 * 32 * 4096)
    cost = 0.0
    for r in _rows(routed)[0]:
        lost = min(r["recomputed_tokens"], max(r["best_rank_device_tokens"] + r["best_rank_host_tokens"]
                                               - r["arrival_device_tokens"] - r["arrival_host_tokens"]
                                               - r["storage_match_tokens"], 0)) if r["best_rank"] != r["dp_rank"] else 0
        if not lost:
            continue
        rec, comp = r["recompute_ns"], r["compute_ns"]
        repriced = comp + rec - max(comp, min(r["ideal_ttft_ns"], comp + rec))
        h = r["device_hit_tokens"] + r["host_hit_tokens"] + r["storage_hit_tokens"]
        w = lambda x, y: (y - x) + (y * y - x * x) / (2 * k)  # noqa: E731
        cost += int(repriced * w(h, h + lost) / w(h, h + r["recomputed_tokens"]))
    assert f"recomputing those tokens took {fmt_ms(cost)} (priced by their position" in claim


def test_time_by_cause_has_routing_carved_from_recompute(routed, bursts):
    before = {c["cause"]: c for c in _json("summary", "--db", str(bursts))["time_by_cause"]}
    after = {c["cause"]: c for c in _json("summary", "--db", str(routed))["time_by_cause"]}
    assert list(after) == ["none", "queueing", "load_back", "storage_fetch", "routing", "recompute", "compute"]
    # The same recompute time, now routing's (every recomputed token was planted as routing's).
    rec = before["recompute"]["ttft_part_ms"]
    assert after["routing"]["ttft_part_ms"] + after["recompute"]["ttft_part_ms"] == pytest.approx(rec, abs=1e-6)
    assert after["routing"]["ttft_part_ms"] == pytest.approx(rec, rel=1e-6)
    assert before["routing"]["ttft_part_ms"] == 0


def test_a_routed_request_explains_where_its_prefix_was(routed):
    rows, config = _rows(routed)
    row = max((r for r in rows if TtftParts.from_row(r).primary_cause() == "routing"),
              key=lambda r: r["recompute_ns"])
    e = _json("explain", row["req_id"], "--db", str(routed))
    assert e["primary_cause"] == "routing"
    assert e["headline"].startswith("routing: ") and f"rank {row['best_rank']} held" in e["headline"]
    claim = next(c["text"] for c in e["claims"] if c["name"] == "routing")
    held = row["best_rank_device_tokens"] + row["best_rank_host_tokens"]
    assert f"rank {row['best_rank']} held {held:,} tokens" in claim
    assert f"the router sent it to rank {row['dp_rank']} (round_robin: next rank {row['dp_rank']})" in claim


def test_routing_cost_is_priced_by_position():
    # 8B model: K = 2 x 8.03e9 / (4 x 32 x 4096) ~ 30,633 tokens. A request with a 10,000-token
    # own prefix recomputing 20,000 tokens of which routing's are the first 5,000: routing's
    # share of the re-priced recompute is W(10k, 15k) / W(10k, 30k), less than 5/20 by count.
    config = {"model": "llama3-8b"}
    k = tokens_per_attention(config)
    assert k == pytest.approx(2 * 8.03e9 / (4 * 32 * 4096))
    row = {"dp_rank": 1, "best_rank": 0, "best_rank_device_tokens": 15_000, "arrival_device_tokens": 10_000,
           "device_hit_tokens": 10_000, "recomputed_tokens": 20_000, "recompute_ns": 4_000_000,
           "compute_ns": 1_000_000, "ideal_ttft_ns": 1_000_000}
    whole = recompute_cost_ns(row)
    expect = whole * position_weight(10_000, 15_000, k) / position_weight(10_000, 30_000, k)
    assert routing_cost_ns(row, config) == int(expect)
    assert routing_cost_ns(row, config) < whole * 5_000 / 20_000
    # An unknown model prices by count.
    assert routing_cost_ns(row, {"model": "unknown"}) == whole * 5_000 // 20_000


def test_no_routing_where_every_request_went_to_its_best_rank(bursts, tmp_path):
    db = tmp_path / "control.duckdb"
    db.write_bytes(bursts.read_bytes())
    plant_ranks(db, routed=False)
    d = _json("summary", "--db", str(db))["diagnosis"]
    assert d["dominant_cause"] != "routing"
    assert not any(c["name"] == "routing" for c in d["claims"])
    assert "routing" not in d["finding"].lower()
