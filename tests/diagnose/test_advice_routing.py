"""Advice for data-parallel runs (advice/rules/router.py, router_threshold.py, dp.py): the router's policy, its thresholds and the
number of ranks, each proposed from the run's rows with a prediction built from them.

The routed runs are test_routing_loss.py's: a bursty replay made a 4-rank run by writing the v4
columns (every recomputed token planted on another rank at arrival, which held 75 % of the input).
The overloaded run is a steady stream of fresh 4,096-token prompts, 20 ms apart, on one H100.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from tierdiag.diagnose.advice.rules import dp as D
from tierdiag.diagnose.advice.rules import router as R
from tierdiag.diagnose.advice import propose
from tierdiag.diagnose.run.capacity import TARGET_LOAD
from tierdiag.diagnose.run.facts import run_context
from tierdiag.config.router import RouterConfig
from tierdiag.store.reader import open_store, resolve_run

from .test_advice_planted import Story
from .test_routing import _json, bursts, plant_ranks  # noqa: F401 - bursts: the module's fixture


def _advice(db: Path) -> dict:
    with open_store(db) as con:
        ctx = run_context(con, resolve_run(con, None))
        return ctx, {a.kind: a for a in propose(ctx)}


def _copy(src: Path, folder: Path, name: str) -> Path:
    db = folder / f"{name}.duckdb"
    db.write_bytes(src.read_bytes())
    return db


def test_the_routers_defaults_are_the_gateways():
    d = RouterConfig()
    assert (R.DEFAULT_CACHE_THRESHOLD, R.DEFAULT_BALANCE_ABS, R.DEFAULT_BALANCE_REL) == (
        d.router_cache_threshold, d.router_balance_abs_threshold, d.router_balance_rel_threshold)


def test_round_robin_losing_reuse_gets_cache_aware_with_its_prediction(bursts, tmp_path):
    db = _copy(bursts, tmp_path, "rr")
    plant_ranks(db, routed=True)
    ctx, items = _advice(db)
    a = items["router"]
    assert a.changes == {"router": "cache_aware"}
    ev = ctx.routing
    # Every routed request's best rank held 3,072 + its recomputed... of 4,096 tokens: > 0.3, so
    # all of routing's tokens are predicted back.
    con = duckdb.connect(str(db), read_only=True)
    lost, inp = con.execute("""SELECT sum(least(recomputed_tokens, greatest(best_rank_device_tokens
                                   + best_rank_host_tokens - arrival_device_tokens - arrival_host_tokens
                                   - storage_match_tokens, 0))) FILTER (WHERE best_rank <> dp_rank
                                   AND (best_rank_device_tokens + best_rank_host_tokens) / input_tokens > 0.3),
                               sum(input_tokens) FROM requests WHERE status = 'finished'""").fetchone()
    con.close()
    assert a.evidence["kept_tokens"] == lost == ev.routing_tokens
    assert f"brings back up to {lost:,} tokens" in a.prediction and f"of input" in a.prediction
    assert a.evidence["input_tokens"] == inp
    # `summary` carries it as advice, beside the routing verdict.
    d = _json("summary", "--db", str(db))["diagnosis"]
    assert {"router": "cache_aware"} in [x["changes"] for x in d["advice"]]


def test_a_router_that_looks_at_the_prefix_gets_no_policy_change(bursts, tmp_path):
    for router in ("cache_aware", "session", "prefix_hash"):
        db = _copy(bursts, tmp_path, router)
        plant_ranks(db, routed=True, router=router)
        _, items = _advice(db)
        assert "router" not in items, router


def test_no_routing_loss_no_router_advice(bursts, tmp_path):
    db = _copy(bursts, tmp_path, "control")
    plant_ranks(db, routed=False)
    _, items = _advice(db)
    assert "router" not in items and "router_threshold" not in items


def test_cache_aware_misses_get_a_lower_cache_threshold(bursts, tmp_path):
    # cache_aware's cache_miss rule placed every routed request while its best rank held 20 % of
    # it (under the 0.3 threshold): a threshold just under 0.2 would have matched them.
    db = _copy(bursts, tmp_path, "miss")
    plant_ranks(db, routed=True, router="cache_aware")
    con = duckdb.connect(str(db))
    con.execute("""UPDATE requests SET route_branch = 'cache_miss',
                       best_rank_device_tokens = arrival_device_tokens + arrival_host_tokens + storage_match_tokens
                           + (input_tokens // 5) - best_rank_host_tokens
                   WHERE best_rank <> dp_rank""")
    con.close()
    ctx, items = _advice(db)
    a = items["router_threshold"]
    assert a.changes == {"router_cache_threshold": 0.19}
    assert ctx.routing.miss_best_share_tokens[0][0] == pytest.approx(0.2)
    assert a.evidence["kept_tokens"] == ctx.routing.routing_tokens
    assert "brings back up to" in a.prediction and "more than 19 %" in a.prediction


def test_cache_aware_imbalance_gets_higher_balance_thresholds(bursts, tmp_path):
    db = _copy(bursts, tmp_path, "imb")
    plant_ranks(db, routed=True, router="cache_aware")
    con = duckdb.connect(str(db))
    con.execute("UPDATE requests SET route_branch = 'imbalanced' WHERE best_rank <> dp_rank")
    con.close()
    _, items = _advice(db)
    assert items["router_threshold"].changes == {"router_balance_abs_threshold": 256,
                                                 "router_balance_rel_threshold": 6.0}


@pytest.fixture(scope="module")
def overloaded(tmp_path_factory) -> Path:
    s = Story()
    for i in range(120):
        s.add(f"q{i}", 20 * i, s.fresh(64))
    return s.replay(tmp_path_factory.mktemp("overload"), {"model": "llama3-8b", "device_tokens": 1 << 20,
                                                          "host_tokens": 1 << 20})


def test_dp_is_the_smallest_n_whose_ranks_are_offered_under_target(overloaded):
    ctx, items = _advice(overloaded)
    a = items["dp"]
    load = ctx.capacity.material_load
    n = a.changes["dp"]
    assert load / n <= TARGET_LOAD < load / (n - 1)  # the smallest such N
    assert a.evidence["queue_excess_share"] == pytest.approx(ctx.queue_total_ns / ctx.excess_total_ns)
    assert a.evidence["queue_excess_share"] >= D.QUEUE_EXCESS_SHARE
    assert f"{n} ranks are each offered {load / n:,.2f}×" in a.reason
    assert "queueing falls below 20 % of the excess TTFT" in a.prediction


def test_dp_is_not_advised_where_the_ranks_already_suffice(overloaded, tmp_path):
    db = _copy(overloaded, tmp_path, "wide")
    with open_store(db) as con:
        load = run_context(con, resolve_run(con, None)).capacity.material_load
    con = duckdb.connect(str(db))
    cfg = json.loads(con.execute("SELECT config_json FROM runs").fetchone()[0])
    con.execute("UPDATE runs SET config_json = ?", [json.dumps({**cfg, "dp": int(load / TARGET_LOAD) + 1})])
    con.close()
    _, items = _advice(db)
    assert "dp" not in items


def test_dp_counts_the_ranks_the_run_already_had(overloaded, tmp_path):
    # The same arrivals recorded as a 2-rank run: capacity's loads are per rank (half), the N
    # advised is the same (the offered work did not change), and the claim names the ranks.
    _, one = _advice(overloaded)
    db = _copy(overloaded, tmp_path, "two")
    con = duckdb.connect(str(db))
    cfg = json.loads(con.execute("SELECT config_json FROM runs").fetchone()[0])
    con.execute("UPDATE runs SET config_json = ?", [json.dumps({**cfg, "dp": 2})])
    con.close()
    ctx, two = _advice(db)
    assert ctx.capacity.num_ranks == 2
    assert two["dp"].changes == one["dp"].changes and two["dp"].evidence["dp"] == 2
    d = _json("summary", "--db", str(db))["diagnosis"]
    cap = next(c["text"] for c in d["claims"] if c["name"] == "capacity")
    assert "× each of its 2 ranks' GPUs (spread evenly)" in cap


def test_the_router_leads_where_routing_lost_most_reuse(bursts, tmp_path):
    db = _copy(bursts, tmp_path, "first")
    plant_ranks(db, routed=True)
    with open_store(db) as con:
        ctx = run_context(con, resolve_run(con, None))
        kinds = [a.kind for a in propose(ctx)]
    assert ctx.routing.dominates_lost_reuse and kinds[0] == "router" and "capacity" in kinds
