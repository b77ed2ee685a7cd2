"""Session views on real replays: explain's session step (did the prefix survive the pause, and
which eviction moved it), summary's survival by pause length, sessions that ended at a
rejected turn, context-length rejections, and a v2 store (before the session columns) read."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from tierdiag.diagnose.request.explain import explain_request
from tierdiag.diagnose.session.sessions import PAUSE_BUCKETS
from tierdiag.diagnose.run.summary import run_summary
from tierdiag.store.reader import open_store, resolve_run
from tierdiag.store.schema import SCHEMA_VERSION, columns_missing_in

pytest.importorskip("tierdiag.cli.replay")
from tierdiag.cli.main import app  # noqa: E402

SMALL = ["--model", "tiny", "--gpu", "h100", "--device-tokens", "1024", "--host-tokens", "4096",
         "--page-size", "64", "--block-size", "64", "--data-plane-mib", "4"]
DEMO = Path(__file__).resolve().parents[2] / "tierdiag" / "trace" / "samples" / "demo.jsonl"


def replay(folder: Path, lines: list[dict] | Path, *options: str) -> Path:
    if isinstance(lines, Path):
        trace = lines
    else:
        trace = folder / "trace.jsonl"
        trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    db = folder / "run.duckdb"
    result = CliRunner().invoke(app, ["replay", str(trace), "--db", str(db), *options])
    assert result.exit_code == 0, (result.output, result.exception)
    return db


def explain(db: Path, req_id: str):
    with open_store(db) as con:
        return explain_request(con, resolve_run(con, None), req_id)


def summary(db: Path):
    with open_store(db) as con:
        return run_summary(con, resolve_run(con, None))


def test_explain_says_the_prefix_was_demoted_during_the_pause_and_by_whom(tmp_path):
    """s-0 caches 6 pages and finishes at ~1 ms; its user thinks for 1 s. At 100 ms 'f' needs 13
    of the device pool's 16 pages: s-0's prefix (backed up on host) is demoted to make room. s-1
    arrives at s-0's finish + 1 s and finds its 384-token prefix on host, loaded back."""
    db = replay(tmp_path, [
        {"id": "s-0", "timestamp": 0, "input_length": 385, "output_length": 4, "hash_ids": [1, 2, 3, 4, 5, 6, 7],
         "session": "s"},
        {"id": "f", "timestamp": 100, "input_length": 769, "output_length": 4, "hash_ids": list(range(101, 114))},
        {"id": "s-1", "timestamp": 1000, "input_length": 449, "output_length": 4,
         "hash_ids": [1, 2, 3, 4, 5, 6, 8, 9], "session": "s", "think_ms": 1000},
    ], *SMALL)
    e = explain(db, "s-1")
    step = e.steps[-1]
    assert (step.step, step.name) == (5, "session")
    ev = step.evidence
    assert (ev.session_id, ev.previous_req_id, ev.previous_status, ev.think_ms) == ("s", "s-0", "finished", 1000.0)
    assert ev.pause_ns == 1000 * 1_000_000  # closed loop: exactly the pause after s-0's finish
    assert (ev.reused_tokens, ev.at_pause_start_device_tokens) == (384, 384)
    assert (ev.at_arrival_device_tokens, ev.at_arrival_host_tokens, ev.at_arrival_gone_tokens) == (0, 384, 0)
    [moved] = ev.evictions
    assert (moved.tier, moved.action, moved.prefix_tokens, moved.cause_req_id) == ("device", "demote", 384, "f")
    assert "384 on host" in step.finding
    assert f"eviction {moved.eviction_id} at 100.0 ms: 384 tokens demoted from device to host by request f's " \
           "allocation" in step.finding
    assert json.loads(json.dumps(e.to_json()))["steps"][4]["evidence"]["evictions"][0]["cause_req_id"] == "f"
    # A first turn, and a request without a session, have the four steps only.
    assert [s.name for s in explain(db, "s-0").steps][-1] == "eviction"
    assert len(explain(db, "f").steps) == 4


def test_survival_shares_add_up_per_bucket_and_ttft_is_nearest_rank(tmp_path):
    db = replay(tmp_path, DEMO, "--device-tokens", "98304", "--host-tokens", "393216")
    s = summary(db)
    sess = s.sessions
    assert sess.arrivals == "closed" and sess.num_sessions > 0
    assert [b.label for b in sess.survival] == [label for label, _, _ in PAUSE_BUCKETS]
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT think_ms, ttft_ns, device_hit_tokens, host_hit_tokens, storage_hit_tokens, "
                           "recomputed_tokens FROM requests WHERE think_ms IS NOT NULL AND status = 'finished'"
                           ).fetchall()
    assert sess.num_turns_with_predecessor == len(rows) > 0
    filled = 0
    for b in sess.survival:
        mine = [r for r in rows if r[0] >= b.min_think_ms and (b.max_think_ms is None or r[0] < b.max_think_ms)]
        assert b.num_turns == len(mine)
        assert b.reused_tokens == sum(sum(r[2:]) for r in mine)
        if b.reused_tokens:
            filled += 1
            assert sum((b.device_share, b.host_share, b.storage_share, b.recomputed_share)) == pytest.approx(1.0)
        if mine:
            ttfts = sorted(r[1] for r in mine)
            assert b.ttft_p50_ns == ttfts[-(-len(ttfts) // 2) - 1]
            assert b.ttft_p99_ns == ttfts[-(-len(ttfts) * 99 // 100) - 1]
    assert filled >= 3
    d = s.to_json()
    assert len(d["session_survival"]) == len(PAUSE_BUCKETS) and d["sessions"]["arrivals"] == "closed"


def test_summary_counts_context_length_and_names_the_sessions_that_ended(tmp_path):
    lines = [
        {"id": "a-0", "timestamp": 0, "input_length": 129, "output_length": 4, "hash_ids": [1, 2, 3], "session": "a"},
        {"id": "a-1", "timestamp": 5, "input_length": 600, "output_length": 500,
         "hash_ids": list(range(1, 11)), "session": "a", "think_ms": 1},
        {"id": "a-2", "timestamp": 9, "input_length": 700, "output_length": 4,
         "hash_ids": list(range(1, 12)), "session": "a", "think_ms": 1},
        {"id": "b-0", "timestamp": 1, "input_length": 129, "output_length": 4, "hash_ids": [50, 51, 52], "session": "b"},
        {"id": "b-1", "timestamp": 8, "input_length": 193, "output_length": 4,
         "hash_ids": [50, 51, 52, 53], "session": "b", "think_ms": 2},
    ]
    lines.sort(key=lambda line: line["timestamp"])
    db = replay(tmp_path, lines, *SMALL, "--max-context", "1000")
    s = summary(db)
    assert (s.num_finished, s.num_rejected) == (3, 2)
    reasons = {r.reason.split(":")[0]: r.num_requests for r in s.rejected_reasons}
    assert reasons == {"context_length": 1, "session_ended": 1}
    [ended] = s.sessions.ended
    assert (ended.session_id, ended.rejected_req_id, ended.turns_not_served) == ("a", "a-1", 1)
    assert ended.reject_reason.startswith("context_length")
    assert (s.sessions.num_ended_sessions, s.sessions.num_turns_not_served) == (1, 1)
    with open_store(db) as con:
        run = resolve_run(con, None)
        assert run.config["max_context_tokens"] == 1000
        row = con.execute("SELECT status, finish_ns, session_id FROM requests WHERE req_id = 'a-2'").fetchall()
    assert row == [("rejected", None, "a")]
    result = CliRunner().invoke(app, ["summary", "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert "context_length" in result.output and "session_ended" in result.output
    assert "sessions ended at a rejected turn: 1" in result.output
    assert "a-1: context_length" in result.output  # the ended session's row names the turn that ended it


def test_a_v2_store_reads_with_the_session_columns_null_and_takes_a_new_run(tmp_path):
    db = replay(tmp_path, [{"id": "r1", "timestamp": 0, "input_length": 129, "output_length": 4,
                            "hash_ids": [1, 2, 3]}], *SMALL)
    with duckdb.connect(str(db)) as con:  # as tierdiag wrote it before v3 (and v4)
        for table, cols in columns_missing_in(2).items():
            for col in cols:
                con.execute(f"ALTER TABLE {table} DROP COLUMN {col}")
        con.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    s = summary(db)
    assert s.num_finished == 1 and s.sessions is None
    assert [st.name for st in explain(db, "r1").steps][-1] == "eviction"
    # A replay into it adds the columns (NULL for the old run) and moves it to the current version.
    replay(tmp_path, [{"id": "r2", "timestamp": 0, "input_length": 129, "output_length": 4,
                       "hash_ids": [1, 2, 3], "session": "x"}], *SMALL)
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchall() == [(str(SCHEMA_VERSION),)]
        got = dict(con.execute("SELECT req_id, session_id FROM requests").fetchall())
    assert got == {"r1": None, "r2": "x"}
