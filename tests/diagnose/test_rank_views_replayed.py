"""The per-rank views end to end: one trace replayed with `--dp 4` behind `cache_aware` and behind
`round_robin`, and with one rank. What the views print is checked against the rows the engine
wrote (the same checks as test_rank_views.py's on planted rows), and the two routers compared.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.support.ranks import REUSE_POOLS, reuse_lines, rows
from tests.support.traces import write_trace
from tierdiag.diagnose.dp.ranks import rank_summary, slow_by_rank
from tierdiag.diagnose.dp.routing import routing_step
from tierdiag.diagnose.request.slow import slow_requests
from tierdiag.store.reader import open_store, resolve_run

pytest.importorskip("tierdiag.cli.replay")
from tierdiag.cli.main import app  # noqa: E402

DP = 4


def cli(*args) -> str:
    result = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "80"})
    assert result.exit_code == 0, (result.output, result.exception)
    return result.output


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("dp")
    trace = write_trace(folder / "reuse.jsonl", reuse_lines())
    path = folder / "run.duckdb"
    cli("replay", trace, "--db", path, "--run-name", "solo", *REUSE_POOLS)
    for router in ("cache_aware", "round_robin"):
        cli("replay", trace, "--db", path, "--run-name", router, "--dp", DP, "--router", router, *REUSE_POOLS)
    return path


@pytest.mark.parametrize("router", ["cache_aware", "round_robin"])
def test_per_rank_summary_is_the_engine_rows(db, router):
    reqs, batches = rows(db, router), rows(db, router, "batches")
    with open_store(db) as con:
        s = rank_summary(con, resolve_run(con, router))
    assert (s.dp, s.router) == (DP, router)
    assert sum(k.num_requests for k in s.ranks) == len(reqs) and [k.dp_rank for k in s.ranks] == list(range(DP))
    for k in s.ranks:
        mine = [r for r in reqs if r["dp_rank"] == k.dp_rank and r["status"] == "finished"]
        assert k.device_hit_tokens == sum(r["device_hit_tokens"] for r in mine)
        assert k.computed_tokens == sum(r["computed_tokens"] for r in mine)
        assert k.prefill_busy_ns == sum(b["t_end_ns"] - b["t_start_ns"] for b in batches if b["dp_rank"] == k.dp_rank)
    busy = [k.prefill_busy_ns for k in s.ranks]
    assert s.imbalance == pytest.approx(max(busy) / (sum(busy) / DP))
    assert s.num_routed == len(reqs)
    assert s.to_best_rank == sum(1 for r in reqs if r["best_rank"] == r["dp_rank"])


@pytest.mark.parametrize("router", ["cache_aware", "round_robin"])
def test_routing_steps_say_what_the_rows_say(db, router):
    with open_store(db) as con:
        run = resolve_run(con, router)
    for r in rows(db, router):
        step = routing_step(run, r, 5)
        ev, claims = step.evidence, {c.name: c.text for c in step.claims}
        assert ev.dp_rank == r["dp_rank"] and ev.route_reason == r["route_reason"] and len(ev.ranks) == DP
        own = ev.ranks[r["dp_rank"]]
        assert (own.device_tokens, own.host_tokens) == (r["arrival_device_tokens"], r["arrival_host_tokens"])
        assert f"sent it to rank {r['dp_rank']} of {DP} by its {r['route_branch']} rule" in claims["routed"]
        assert ("best_rank" in claims) == (r["best_rank"] != r["dp_rank"])


def test_slow_by_rank_on_a_dp_replay(db):
    reqs = {r["req_id"]: r["dp_rank"] for r in rows(db, "round_robin")}
    with open_store(db) as con:
        run = resolve_run(con, "round_robin")
        groups = slow_by_rank(con, run, top=2)
        everyone = slow_requests(con, run, top=10_000)
    assert [g.dp_rank for g in groups] == list(range(DP))
    assert sum(g.num_slow for g in groups) == len(everyone)
    for g in groups:
        assert all(reqs[s.req_id] == g.dp_rank for s in g.requests)


def test_the_routers_compared_and_one_rank_as_before(db):
    """cache_aware against round_robin on one trace: compare prints the reuse and TTFT
    difference and, per run, the ranks; a run of one rank (dp_rank 0 on its rows) has none."""
    with open_store(db) as con:
        ca, rr = (rank_summary(con, resolve_run(con, n)) for n in ("cache_aware", "round_robin"))
        assert rank_summary(con, resolve_run(con, "solo")) is None
    d = json.loads(cli("compare", "cache_aware", "round_robin", "--db", db, "--json"))
    a, b = d["runs"]
    assert d["varied"] == ["router"]
    assert (a["ranks"]["router"], b["ranks"]["router"]) == ("cache_aware", "round_robin")
    assert a["ranks"]["to_best_rank"] == ca.to_best_rank and b["ranks"]["to_best_rank"] == rr.to_best_rank
    # This trace's pairs of requests share a document: the cache-aware router keeps a pair on one
    # rank, round robin splits it, so the second of a pair finds its document on another rank.
    assert a["reuse_share"] > b["reuse_share"] and a["device_share"] > b["device_share"]
    assert ca.held_elsewhere_tokens < rr.held_elsewhere_tokens
    out = CliRunner().invoke(app, ["compare", "cache_aware", "round_robin", "--db", str(db)],
                             env={"COLUMNS": "200"}).output
    assert "ranks and routing" in out
    solo = json.loads(cli("summary", "--db", db, "--run", "solo", "--json"))
    assert "ranks" not in solo
    assert {r["dp_rank"] for r in rows(db, "solo")} <= {0, None}
    e = json.loads(cli("explain", rows(db, "solo")[5]["req_id"], "--db", db, "--run", "solo", "--json"))
    assert all(s["name"] != "routing" for s in e["steps"])
