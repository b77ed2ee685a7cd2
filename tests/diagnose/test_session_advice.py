"""Advice for sessions (issue 30, item 5): "keep sessions alive for the p90 pause: host pool of N
tokens", sized from the run's own pause distribution (diagnose/session/session_pool.py's LRU stack
distances), and `advise` verifies it like any change.

The workload: `tierdiag synth --kind agent` (120 steps of agent loops, 64-token blocks) replayed
closed-loop on the tiny model with a 16,384-token device pool and as much host (write_through,
the default: the host pool alone holds the copies). Loops overlap, so a step's context is pushed
out while its tool runs: about half of the later steps' reused prefix is recomputed. On the same
trace with a 65,536-token host pool the contexts survive the pause and nothing is proposed."""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from tierdiag.diagnose.advice import propose
from tierdiag.diagnose.run.facts import run_context
from tierdiag.diagnose.session.session_pool import session_pauses, session_turns
from tierdiag.store.reader import open_store, resolve_run

pytest.importorskip("tierdiag.cli.replay")
from tierdiag.cli.main import app  # noqa: E402

DEVICE = 16384
SMALL_HOST = 16384
LATER_RECOMPUTE_SQL = ("SELECT sum(recomputed_tokens) / sum(input_tokens) FROM requests WHERE run_id = ? "
                       "AND status = 'finished' AND ttft_ns IS NOT NULL AND think_ms IS NOT NULL")


@pytest.fixture(scope="module")
def agent_trace(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sessions")
    trace = folder / "agent.jsonl"
    r = CliRunner().invoke(app, ["synth", str(trace), "--kind", "agent", "--requests", "120", "--rate", "4",
                                 "--block-size", "64"])
    assert r.exit_code == 0, r.output
    return trace


def _replay(trace, db, host_tokens: int, *extra: str):
    r = CliRunner().invoke(app, ["replay", str(trace), "--db", str(db), "--block-size", "64", "--model", "tiny",
                                 "--gpu", "cpu", "--device-tokens", str(DEVICE), "--host-tokens", str(host_tokens),
                                 "--json", *extra])
    assert r.exit_code == 0, (r.output, r.exception)
    return db


def _summary(db) -> dict:
    r = CliRunner().invoke(app, ["summary", "--db", str(db), "--json"])
    assert r.exit_code == 0, (r.output, r.exception)
    return json.loads(r.output)


@pytest.fixture(scope="module")
def small_pools(agent_trace):
    return _replay(agent_trace, agent_trace.with_name("small.duckdb"), SMALL_HOST)


def test_the_rule_sizes_the_host_pool_from_the_pause_distribution(small_pools):
    j = _summary(small_pools)
    items = j["diagnosis"]["advice"]
    (item,) = [a for a in items if a["kind"] == "session"]
    ev = item["evidence"]
    with open_store(small_pools) as con:
        run = resolve_run(con, None)
        # The p90 pause, over the finished later turns, straight from the rows.
        p90 = con.execute("SELECT quantile_disc(think_ms, 0.9) FROM requests WHERE run_id = ? AND think_ms IS NOT NULL "
                          "AND status = 'finished' AND ttft_ns IS NOT NULL", [run.run_id]).fetchone()[0]
        later = con.execute("SELECT sum(input_tokens), sum(recomputed_tokens + host_hit_tokens + storage_hit_tokens) "
                            "FROM requests WHERE run_id = ? AND think_ms IS NOT NULL AND status = 'finished' "
                            "AND ttft_ns IS NOT NULL", [run.run_id]).fetchone()
        sp, turns = session_pauses(con, run), session_turns(con, run)
    assert ev["pause_p90_ms"] == pytest.approx(p90) and sp.pause_p90_ms == pytest.approx(p90)
    assert ev["later_input_tokens"] == later[0]
    assert ev["later_recomputed_tokens"] + ev["later_loaded_tokens"] == later[1] >= 0.05 * later[0]
    # The pool that keeps every turn paused at most p90: their largest stack distance, host alone
    # under write_through, rounded up to a power of two of pages.
    need = max(t.distance_tokens for t in turns if t.think_ms <= p90)
    assert ev["pool_p90_tokens"] == need > SMALL_HOST
    assert item["changes"] == {"host_tokens": item["value"]} and item["value"] >= need > item["value"] // 2
    assert (f"keep sessions alive for the p90 pause ({p90 / 1000:.2f} s): host pool of {item['value']:,} tokens"
            in item["reason"])
    assert item["prediction"].startswith("predicted under LRU: keeps ")
    assert sp.kept_share(item["value"]) > sp.kept_share(SMALL_HOST)
    # The capacity rule's host pool, when it is the same change, is the one session item (one replay).
    assert len({json.dumps(a["changes"], sort_keys=True) for a in items}) == len(items)


def test_advise_confirms_the_session_host_pool(small_pools):
    result = CliRunner().invoke(app, ["advise", "--db", str(small_pools), "--budget", "1", "--jobs", "1", "--json"])
    assert result.exit_code == 0, (result.output, result.exception)
    j = json.loads(result.output)
    (cand,) = j["candidates"]
    assert cand["kind"] == "session" and cand["status"] == "complete" and cand["advice_status"] == "confirmed"
    assert cand["ttft_p50_ms"] <= 0.95 * j["baseline"]["ttft_p50_ms"]
    assert cand["ttft_p99_ms"] <= 1.05 * j["baseline"]["ttft_p99_ms"]
    (item,) = [a for a in j["advice"] if a["kind"] == "session"]
    v = item["verified"]
    assert item["status"] == "confirmed" and v["run_id"] == cand["run_id"]
    assert v["target"] == "session_recompute_share" and v["target_after"] < v["target_before"]
    with open_store(small_pools) as con:
        before = con.execute(LATER_RECOMPUTE_SQL, [j["baseline"]["run_id"]]).fetchone()[0]
        after = con.execute(LATER_RECOMPUTE_SQL, [cand["run_id"]]).fetchone()[0]
    assert (v["target_before"], v["target_after"]) == (pytest.approx(before), pytest.approx(after))
    assert after < before


def test_capped_by_host_memory_and_never_for_open_loop(small_pools):
    with open_store(small_pools) as con:
        run = resolve_run(con, None)
        ctx, sp = run_context(con, run), session_pauses(con, run)
    kv = ctx.kv_bytes_per_token
    (full,) = [a for a in propose(ctx, sessions=sp) if a.kind == "session"]
    cap = full.value // 2
    (capped,) = [a for a in propose(ctx, sessions=sp, host_limit_bytes=cap * kv) if a.kind == "session"]
    assert capped.value == cap and "the most it holds" in capped.reason
    assert f"host pool of {full.value:,} tokens, beyond the" in capped.reason
    # The pauses of an open-loop replay are not the sessions' own: nothing sized from them.
    open_loop = dataclasses.replace(ctx, config={**ctx.config, "arrivals": "trace"})
    assert not [a for a in propose(open_loop, sessions=sp) if a.kind == "session"]
    assert not [a for a in propose(ctx) if a.kind == "session"]  # no session evidence given


def test_no_proposal_where_sessions_already_survive(agent_trace):
    db = _replay(agent_trace, agent_trace.with_name("big.duckdb"), 4 * SMALL_HOST)
    j = _summary(db)
    assert j["session_survival"] is not None and j["sessions"]["num_turns_with_predecessor"] > 0
    assert "session" not in [a["kind"] for a in j["diagnosis"]["advice"]]
    with open_store(db) as con:
        run = resolve_run(con, None)
        sp = session_pauses(con, run)
        later = con.execute(LATER_RECOMPUTE_SQL, [run.run_id]).fetchone()[0]
    # The contexts survived their pauses: hardly anything recomputed, and the pool the p90 pause
    # needs is within the host pool the run had.
    assert later < 0.05 and sp.pool_p90_tokens <= 4 * SMALL_HOST
