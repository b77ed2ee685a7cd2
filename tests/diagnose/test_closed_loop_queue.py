"""False rule 2 of issue 40: explain's "N requests were queued ahead of it at arrival" counted
earlier trace lines, not the requests waiting at its replayed arrival. In a closed-loop run a
session's next turn arrives when its predecessor finishes plus its pause, after trace lines that
come later in the file. The count is now the replay's own queue at the replayed arrival
(diagnose/request/context.py `request_context`).

Planted: session turn s-1 (trace line 2, think 5 s) arrives at ~5 s in the replay; ten one-off
2,048-token requests (trace lines 3-12) arrive at 4.990-4.999 s and queue behind one another on a
70B model. At s-1's arrival most of them are still waiting: they were queued ahead of it, though
the trace lists them after it."""

from __future__ import annotations

import re

import pytest

from tierdiag.diagnose.request.explain import explain_request
from tierdiag.store.reader import open_store, resolve_run

from .test_advice_planted import Story

pytest.importorskip("tierdiag.cli.replay")


def test_queued_ahead_is_the_replays_queue_at_the_replayed_arrival(tmp_path):
    s = Story()
    prefix = list(range(8))
    s.lines.append({"id": "s-0", "timestamp": 0, "input_length": 64 * 8, "output_length": 4, "hash_ids": prefix,
                    "session": "s"})
    s.lines.append({"id": "s-1", "timestamp": 1, "input_length": 64 * 9, "output_length": 4,
                    "hash_ids": prefix + [99], "session": "s", "think_ms": 5000})
    for i in range(10):
        s.add(f"f{i}", 4990 + i, s.fresh(32))
    db = s.replay(tmp_path, {"model": "llama3-70b", "device_tokens": 65536, "host_tokens": 65536,
                             "arrivals": "closed"})
    with open_store(db) as con:
        run = resolve_run(con, None)
        rid = run.run_id
        a, seq = con.execute("SELECT arrival_ns, seq FROM requests WHERE run_id = ? AND req_id = 's-1'",
                             [rid]).fetchone()
        # Its own SQL: waiting at s-1's replayed arrival (arrived before it, scheduled after it).
        waiting = con.execute(
            "SELECT count(*) FROM requests WHERE run_id = ? AND req_id <> 's-1' AND arrival_ns < ? "
            "AND first_token_ns - prefill_ns > ?", [rid, a, a]).fetchone()[0]
        earlier_lines = con.execute(
            "SELECT count(*) FROM requests WHERE run_id = ? AND seq < ? AND arrival_ns <= ? "
            "AND first_token_ns - prefill_ns > ?", [rid, seq, a, a]).fetchone()[0]
        e = explain_request(con, run, "s-1")
    # The planted case: requests listed after it in the trace were waiting when it arrived.
    assert waiting >= 5 and earlier_lines == 0
    assert e.context.queue_depth_at_arrival == waiting
    queue = next(c for c in e.claims if c.name == "queue")
    m = re.search(r"; ([\d,]+) requests were queued ahead of it at arrival", queue.text)
    assert m is not None and int(m[1]) == waiting, queue.text


def _queued_run(tmp_path):
    """24 requests arriving three at a time on a pool that makes them queue."""
    s = Story()
    for i in range(24):
        s.add(f"r{i}", 10 * (i // 3), s.fresh(16 + (i % 5) * 8))
    return s.replay(tmp_path, {"model": "llama3-70b", "device_tokens": 65536, "host_tokens": 65536})


def test_the_queue_at_arrival_reads_only_the_row_groups_around_it_and_counts_as_a_full_pass(tmp_path):
    """read/request_context.py `queue_depth_at_arrival` adds `finish_ns > arrival` so that DuckDB
    skips the row groups that finished before the arrival (issue 41: 45 -> 8 ms on a 1M run). The
    count must be the definition's, over every row, for every request of a queued run."""
    from tierdiag.diagnose.read.request_context import queue_depth_at_arrival

    db = _queued_run(tmp_path)
    with open_store(db) as con:
        rid = resolve_run(con, None).run_id
        rows = con.execute("SELECT req_id, seq, arrival_ns, status, first_token_ns - prefill_ns, "
                           "coalesce(dp_rank, 0) FROM requests WHERE run_id = ?", [rid]).fetchall()
        depths = []
        for req_id, seq, arrival, _, _, rank in rows:
            want = sum(1 for o_id, o_seq, o_arr, o_status, o_sched, o_rank in rows
                       if o_id != req_id and (o_arr < arrival or (o_arr == arrival and o_seq < seq))
                       and o_status == "finished" and o_sched is not None and o_sched > arrival and o_rank == rank)
            assert queue_depth_at_arrival(con, rid, req_id, arrival, seq, rank) == want, req_id
            depths.append(want)
    assert max(depths) >= 3  # the run queued: the counts were not all 0


def test_the_tokens_allocated_between_two_instants_count_as_a_full_pass(tmp_path):
    """read/request_steps.py `allocated_between` adds `finish_ns > after` (and `arrival_ns <
    before`) for the zone maps: the sum must be the definition's over every row, for windows
    before, across, inside and after the run."""
    from tierdiag.diagnose.read.request_steps import allocated_between

    db = _queued_run(tmp_path)
    with open_store(db) as con:
        rid = resolve_run(con, None).run_id
        rows = con.execute("SELECT coalesce(first_token_ns - prefill_ns, arrival_ns), "
                           "input_tokens - coalesce(device_hit_tokens, 0) + output_tokens, "
                           "coalesce(status, 'finished') = 'finished' AND ttft_ns IS NOT NULL "
                           "FROM requests WHERE run_id = ?", [rid]).fetchall()
        instants = sorted({t for t, _, _ in rows})
        edges = [instants[0] - 1, *instants[:: max(1, len(instants) // 6)], instants[-1] + 1]
        sums = []
        for after in edges:
            for before in edges:
                want = sum(tokens for t, tokens, finished in rows if finished and after < t < before)
                assert allocated_between(con, rid, after, before) == want, (after, before)
                sums.append(want)
    assert max(sums) > 0
