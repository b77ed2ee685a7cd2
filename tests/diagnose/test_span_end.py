"""A run's span ends at its last served finish (docs/contract.md "Span"; issue 40 false rule 5).

In closed loop, a session whose turn was rejected drops its later turns (`session_ended`); each
is recorded when the trace reaches its line. A dropped turn whose line comes an hour after
everything else was served is read (and dropped) after the last finish, and was counted as the
end of the run: `summary`'s span (and replay's
virtual time, and the rates over it) ran to that record, 7.9 h against a last finish of 7.82 h on
the audited run.
"""

from __future__ import annotations

import json

from tests.support.cli import invoke, invoke_json
from tierdiag.store.reader import open_store, resolve_run

HOUR_MS = 3_600_000


def _line(req_id: str, t_ms: int, blocks: list[int], session: str, think_ms: float | None = None,
          output: int = 4) -> dict:
    d = {"id": req_id, "timestamp": t_ms, "input_length": 64 * len(blocks), "output_length": output,
         "hash_ids": blocks, "session": session}
    if think_ms is not None:
        d["think_ms"] = think_ms
    return d


def test_a_turn_dropped_after_the_last_finish_does_not_extend_the_span(tmp_path):
    lines = [
        _line("a1", 0, [1, 2], "a"),
        _line("b1", 0, list(range(100, 140)), "b"),  # 2,560 tokens: past --max-context 2048
        _line("a2", 1_000, [1, 2, 3], "a", think_ms=10),
        _line("b2", HOUR_MS, list(range(100, 141)), "b", think_ms=10),  # dropped, an hour on
    ]
    trace, db = tmp_path / "t.jsonl", tmp_path / "r.duckdb"
    trace.write_text("".join(json.dumps(x) + "\n" for x in lines))
    invoke("replay", str(trace), "--db", str(db), "--block-size", "64", "--max-context", "2048")
    with open_store(db) as con:
        run = resolve_run(con, None)
        rows = {r[0]: r[1:] for r in con.execute(
            "SELECT req_id, status, reject_reason, arrival_ns, finish_ns FROM requests WHERE run_id = ?",
            [run.run_id]).fetchall()}
    assert rows["b1"][0] == "rejected" and rows["b1"][1].startswith("context_length")
    assert rows["b2"][0] == "rejected" and rows["b2"][1].startswith("session_ended")
    first = min(r[2] for r in rows.values())
    last_finish = max(r[3] for r in rows.values() if r[3] is not None)
    assert rows["b2"][2] > last_finish  # the drop was recorded after the last request was served
    j = invoke_json("summary", "--db", str(db))
    assert j["span_ms"] == (last_finish - first) / 1e6
