"""Routing as the dominant cause gets routing advice (issue 40): where routing lost most of the
reuse but the prefixes it lost are a smaller share of their requests than cache_aware's default
router_cache_threshold (0.3), `cache_aware` alone would place them as round_robin did and the rule
proposed nothing. It now advises cache_aware with router_cache_threshold just under their best
rank's share, names the router's keys, and advise's replay confirms it.

Planted: 30 groups of 3 requests 100 ms apart, each group sharing a 16-page prefix before 48 fresh
pages (25 % of the input), 2 s between groups, on 4 ranks behind round_robin."""

from __future__ import annotations

import json

import pytest

from tierdiag.diagnose.advice import propose
from tierdiag.diagnose.run.facts import run_context
from tierdiag.store.reader import open_store, resolve_run

from .test_advice_planted import Story

pytest.importorskip("tierdiag.cli.replay")
from tests.support.cli import invoke  # noqa: E402


def test_routing_dominant_gets_cache_aware_with_a_threshold_and_is_confirmed(tmp_path):
    s = Story()
    for g in range(30):
        shared = s.fresh(16)
        for i in range(3):
            s.add(f"g{g}r{i}", 2000 * g + 100 * i, shared + s.fresh(48))
    db = s.replay(tmp_path / "rr", {"model": "llama3-8b", "dp": 4, "router": "round_robin"})
    with open_store(db) as con:
        run = resolve_run(con, None)
        ctx = run_context(con, run)
        advice = [a for a in propose(ctx) if a.kind == "router"]
    ev = ctx.routing
    # The planted case: routing lost all the reuse, none of it above the default threshold.
    assert ev.dominates_lost_reuse and ev.tokens_above(0.3) == 0 and ev.routing_tokens >= 0.05 * ev.input_tokens
    [item] = advice
    assert item.changes == {"router": "cache_aware", "router_cache_threshold": 0.24}
    assert "router_cache_threshold 0.24" in item.reason and "router_balance_abs_threshold 64" in item.reason
    out = invoke("advise", "--db", str(db), "--budget", "2", "--jobs", "1", "--json")
    j = json.loads(out[out.index("{"):])
    router = next(a for a in j["advice"] if a["kind"] == "router")
    assert router["status"] == "confirmed"
    v = router["verified"]
    assert v["target"] == "routing_share" and v["target_after"] < v["target_before"]
