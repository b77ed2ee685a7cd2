"""False rule 4 of issue 40: the session step's "at this arrival: N gone (recomputed)" was the
match taken at the turn's schedule; the prefix may have been intact at arrival and lost while the
turn queued. The step now gives the split at arrival and what was lost while queued, apart, and
summary's survival table splits the recomputed part into lost during the pause and lost while
queued.

Planted (open loop): session turn s-0 caches a 24-page prefix; s-1 (its next turn) arrives at
1.012 s, its prefix still on device, behind twelve 32-page one-off requests (arrived 1.000-1.011 s)
whose allocations push the prefix off the 8,192-token device pool and out of the 8,192-token host
pool while s-1 waits: all of it is lost while queued, none during the pause."""

from __future__ import annotations

import pytest

from tierdiag.diagnose.request.explain import explain_request
from tierdiag.diagnose.run.summary import run_summary
from tierdiag.store.reader import open_store, resolve_run

from .test_advice_planted import Story

pytest.importorskip("tierdiag.cli.replay")


def test_a_turn_losing_its_prefix_while_queued_is_told_apart_from_the_pause(tmp_path):
    s = Story()
    prefix = list(range(24))
    s.lines.append({"id": "s-0", "timestamp": 0, "input_length": 64 * 24, "output_length": 4, "hash_ids": prefix,
                    "session": "s"})
    for i in range(12):
        s.add(f"f{i}", 1000 + i, s.fresh(32))
    s.lines.append({"id": "s-1", "timestamp": 1012, "input_length": 64 * 25, "output_length": 4,
                    "hash_ids": prefix + [99], "session": "s", "think_ms": 1000})
    db = s.replay(tmp_path, {"model": "llama3-70b", "device_tokens": 8192, "host_tokens": 8192, "arrivals": "trace"})
    with open_store(db) as con:
        run = resolve_run(con, None)
        rid = run.run_id
        a, sched, rec, dev = con.execute(
            "SELECT arrival_ns, first_token_ns - prefill_ns, recomputed_tokens, device_hit_tokens FROM requests "
            "WHERE run_id = ? AND req_id = 's-1'", [rid]).fetchone()
        # Its own SQL: evictions of s-1's prefix before its arrival (the pause) and after (the queue).
        before, after = con.execute(
            """SELECT coalesce(sum(re.tokens) FILTER (WHERE e.t_ns < ?), 0),
                      coalesce(sum(re.tokens) FILTER (WHERE e.t_ns >= ? AND e.action IN ('drop', 'delete')), 0)
               FROM request_evictions re JOIN evictions e USING (run_id, eviction_id)
               WHERE run_id = ? AND req_id = 's-1'""", [a, a, rid]).fetchone()
        step = explain_request(con, run, "s-1").steps[-1]
        sessions = run_summary(con, run).sessions
    # The planted case: nothing moved during the pause, it queued, and all of it left every tier meanwhile.
    assert sched > a and before == 0 and after >= 1536 and rec == 1536 and dev == 0
    ev = step.evidence
    assert step.name == "session"
    assert (ev.at_arrival_device_tokens, ev.at_arrival_host_tokens, ev.at_arrival_gone_tokens) == (1536, 0, 0)
    assert (ev.at_schedule_device_tokens, ev.at_schedule_gone_tokens, ev.lost_while_queued_tokens) == (0, 1536, 1536)
    assert ev.evictions == () and ev.queued_evictions
    assert "at this arrival: 1,536 on device." in step.finding
    assert "No eviction during the pause moved it." in step.finding
    assert "1,536 tokens were lost while it queued (recomputed)" in step.finding
    assert "at its schedule: 1,536 gone (recomputed)." in step.finding
    # The survival table: the bucket's recomputed part was lost while queued, not during the pause.
    [bucket] = [b for b in sessions.survival if b.num_turns]
    assert bucket.recomputed_share == 1.0 and bucket.queued_lost_share == 1.0 and bucket.paused_lost_share == 0.0
