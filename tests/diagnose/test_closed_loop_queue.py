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
