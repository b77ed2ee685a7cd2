"""Request rules that hold everywhere (issue 34 item 5): every finished request of a replay
with long, growing contexts, idle gaps and write_through (the default) is explained, and the
false patterns an audit of an unseen trace found must not appear:

* a counterfactual below the ideal (recompute priced by token count, not by position);
* "it fit" judged against device + host where write_through lets host alone hold a prefix;
* "thrashing" where none of the tokens evicted in its window were asked for again;
* "TTFT would have been X instead of X" (rounding hiding a difference);
* a window called "±1 s" that is longer.
"""

from __future__ import annotations

import re

import pytest

from tierdiag.diagnose.request.explain import explain_request
from tierdiag.diagnose.run.facts import RunFacts, run_context
from tierdiag.diagnose.read.rows import fetch_dicts
from tierdiag.store.reader import open_store, resolve_run

from .test_advice_planted import Story

pytest.importorskip("tierdiag.cli.replay")


def agentic(story: Story, sessions: int = 8, turns: int = 6, first_pages: int = 64, grow_pages: int = 32,
            gap_ms: int = 60_000) -> None:
    """`sessions` sessions whose every turn is its previous context plus `grow_pages` new pages
    (up to 14k tokens), one round of turns 20 ms apart every `gap_ms` (idle between rounds)."""
    contexts = [story.fresh(first_pages) for _ in range(sessions)]
    for t in range(turns):
        for i in range(sessions):
            story.add(f"s{i}t{t}", t * gap_ms + 20 * i, list(contexts[i]))
            contexts[i] = contexts[i] + story.fresh(grow_pages)


@pytest.fixture(scope="module")
def agentic_run(tmp_path_factory):
    s = Story()
    agentic(s)
    return s.replay(tmp_path_factory.mktemp("agentic"), {"model": "llama3-8b", "device_tokens": 16384,
                                                          "host_tokens": 24576})


def test_every_request_of_a_long_context_write_through_replay(agentic_run):
    with open_store(agentic_run) as con:
        run = resolve_run(con, None)
        assert run.config.get("write_policy") == "write_through"
        ctx = run_context(con, run)
        rows = fetch_dicts(con, "SELECT * FROM requests WHERE run_id = ? AND status = 'finished' ORDER BY seq",
                           [run.run_id])
        facts = RunFacts(con, run)  # the stored evidence decoded once, not once per request
        explained = [(r, explain_request(con, run, r["req_id"], run_ctx=ctx, facts=facts)) for r in rows]
        checked = {"counterfactual": 0, "capacity": 0, "thrashing": 0}
        for row, e in explained:
            rid = row["req_id"]
            assert e.ttft_if_never_evicted_ns >= row["ideal_ttft_ns"], rid
            m = re.search(r"TTFT would have been (?!the same )(.+?) instead of (.+?)(?:;|\.(?:\s|$))", e.verdict)
            if m:
                checked["counterfactual"] += 1
                assert m.group(1) != m.group(2), (rid, m.group(0))
            ev = e.steps[3].evidence
            m = re.search(r"Reuse distance ([\d,]+) tokens vs (.+?): (it fit|pools of this size)", e.steps[3].finding)
            if m:
                checked["capacity"] += 1
                held = run.config["host_tokens"] if any(x.tier != "device" for x in ev.events) \
                    else run.config["device_tokens"]
                assert ev.compared_capacity_tokens == held, rid
                assert (m.group(3) == "it fit") == (int(m.group(1).replace(",", "")) <= held), rid
            if ev.thrashing:
                checked["thrashing"] += 1
                lo = row["first_token_ns"] - row["prefill_ns"] - 1_000_000_000
                hi = row["first_token_ns"] + 1_000_000_000
                back = con.execute(
                    "SELECT coalesce(sum(tokens), 0) FROM evictions WHERE run_id = ? AND tier = 'device' "
                    "AND t_ns BETWEEN ? AND ? AND eviction_id IN (SELECT eviction_id FROM request_evictions "
                    "WHERE run_id = ?)", [run.run_id, max(lo, e.run_start_ns), hi, run.run_id]).fetchone()[0]
                assert back > 0, rid
            for step in e.steps:
                assert "±" not in step.finding
    # The workload exercised each rule (not a vacuous pass).
    assert checked["counterfactual"] > 10 and checked["capacity"] > 0, checked
