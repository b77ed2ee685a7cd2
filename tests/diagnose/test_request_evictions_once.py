"""explain reads a request's evictions once (read/request_steps.py `request_evictions`): step 4
lists them, and the session step takes its pause's and its wait's from them (issue 41: each of
those was a join of request_evictions with evictions of its own, four of them, ~25 ms of a
1M-request run's explain). Held here to the queries they replace, kept below as the definition,
on every session turn of a replayed synth workload whose pools lose prefixes during pauses and
while turns queue: the evictions in a window (`evictions_between`), the moves of the wait
(`wait_moves`), the tokens lost while it waited (`row_lost_while_waiting`: the row's own count,
else the query), and the whole session step read either way."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tierdiag.diagnose.read import queries
from tierdiag.diagnose.read import request_steps as read_steps
from tierdiag.diagnose.read.waiting import lost_while_waiting, row_lost_while_waiting, wait_moves
from tierdiag.diagnose.request.explain import explain_request
from tierdiag.diagnose.session.sessions import session_step
from tierdiag.store.reader import open_store, resolve_run

pytest.importorskip("tierdiag.cli.replay")
from tierdiag.cli.main import app  # noqa: E402

# The queries the session step made before (read/sessions.py, read/waiting.py at 82db582).
BETWEEN_SQL = """
    SELECT e.eviction_id, e.t_ns, e.tier, e.action, re.tokens, e.cause_req_id
    FROM request_evictions re JOIN evictions e ON e.run_id = re.run_id AND e.eviction_id = re.eviction_id
    WHERE re.run_id = ? AND re.req_id = ? AND e.t_ns >= ? AND e.t_ns <= ?
    ORDER BY e.t_ns, e.eviction_id"""
MOVES_SQL = """
    SELECT e.tier, e.action, sum(re.tokens) FROM request_evictions re
    JOIN evictions e ON e.run_id = re.run_id AND e.eviction_id = re.eviction_id
    JOIN requests q ON q.run_id = re.run_id AND q.req_id = re.req_id
    WHERE re.run_id = ? AND re.req_id = ? AND q.seq = ? AND e.t_ns >= q.arrival_ns
      AND e.t_ns <= q.first_token_ns - coalesce(q.prefill_ns, 0)
    GROUP BY 1, 2"""


def _replay(folder: Path) -> Path:
    trace, db = folder / "mixed.jsonl", folder / "run.duckdb"
    for args in (["synth", str(trace), "--requests", "300", "--rate", "8"],
                 ["replay", str(trace), "--db", str(db), "--device-tokens", "16384", "--host-tokens", "32768"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, (result.output, result.exception)
    return db


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return _replay(tmp_path_factory.mktemp("evictions_once"))


def _turns(con, run) -> list:
    """Every session turn (a row with think_ms), whole."""
    seqs = [s for (s,) in con.execute("SELECT seq FROM requests WHERE run_id = ? AND think_ms IS NOT NULL "
                                      "ORDER BY seq", [run.run_id]).fetchall()]
    return [queries.request(con, run, rid) for (rid,) in
            (con.execute("SELECT req_id FROM requests WHERE run_id = ? AND seq = ?", [run.run_id, s]).fetchone()
             for s in seqs)]


def test_the_pause_and_the_wait_are_the_queries_they_replace(store):
    with open_store(store) as con:
        run = resolve_run(con, None)
        rid = run.run_id
        turns = _turns(con, run)
        moved = lost = paused = 0
        for row in turns:
            records = read_steps.request_evictions(con, rid, row.req_id)
            windows = []
            prev = queries.previous_turn(con, run, row)
            if prev is not None and prev.finish_ns is not None:
                windows.append((prev.finish_ns, row.arrival_ns))
            if row.first_token_ns is not None:
                windows.append((row.arrival_ns, row.first_token_ns - (row.prefill_ns or 0)))
            for lo, hi in windows:
                want = con.execute(BETWEEN_SQL, [rid, row.req_id, lo, hi]).fetchall()
                got = [(e.eviction_id, e.t_ns, e.tier, e.action, e.prefix_tokens, e.cause_req_id)
                       for e in read_steps.evictions_between(records, lo, hi)]
                assert got == want, (row.req_id, lo, hi)
                paused += bool(want)
            if row.first_token_ns is None:
                continue
            want_moves = {(t, a): int(n or 0) for t, a, n in con.execute(MOVES_SQL, [rid, row.req_id, row.seq]).fetchall()}
            assert wait_moves(records, row) == want_moves, row.req_id
            assert row_lost_while_waiting(con, rid, row) == lost_while_waiting(con, rid, row.req_id, row.seq)
            moved += bool(want_moves)
            lost += bool(lost_while_waiting(con, rid, row.req_id, row.seq))
    # The workload exercises each: evictions in pauses and waits, tokens lost while queued.
    assert len(turns) >= 40 and paused >= 10 and moved >= 10 and lost >= 1, (len(turns), paused, moved, lost)


def test_a_row_without_the_engine_count_asks_the_query(store, tmp_path):
    """A store whose rows lack miss_lost_while_queued_tokens (written before schema v5, or a NULL):
    the count comes from the eviction join, as lost_while_waiting's coalesce falls back to it."""
    import shutil

    copy = tmp_path / "no_count.duckdb"
    shutil.copy(store, copy)
    with duckdb.connect(str(copy)) as rw:
        rw.execute("UPDATE requests SET miss_lost_while_queued_tokens = NULL")
    with open_store(copy) as con:
        run = resolve_run(con, None)
        rows = [r for r in _turns(con, run) if r.first_token_ns is not None]
        got = [row_lost_while_waiting(con, run.run_id, r) for r in rows]
        assert got == [lost_while_waiting(con, run.run_id, r.req_id, r.seq) for r in rows]
        assert all(r.miss_lost_while_queued_tokens is None for r in rows)


def test_the_session_step_is_the_same_read_once_or_alone(store):
    with open_store(store) as con:
        run = resolve_run(con, None)
        start = con.execute("SELECT min(arrival_ns) FROM requests WHERE run_id = ?", [run.run_id]).fetchone()[0]
        steps = 0
        for row in _turns(con, run):
            alone = session_step(con, run, row, start, 5)
            once = session_step(con, run, row, start, 5, read_steps.request_evictions(con, run.run_id, row.req_id))
            assert once == alone, row.req_id
            steps += alone is not None and bool(alone.evidence.evictions or alone.evidence.queued_evictions)
            assert explain_request(con, run, row.req_id).steps[4:5] == ((alone,) if alone is not None else ())
        assert steps >= 10


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_any_window_is_the_between_query(store, data):
    """Any window over a request's evictions, hostile bounds included (before the run, after it,
    reversed, the int64 extremes): the records kept are the rows `BETWEEN` keeps, in its order."""
    with open_store(store) as con:
        run = resolve_run(con, None)
        rid = run.run_id
        reqs = [r for (r,) in con.execute("SELECT DISTINCT req_id FROM request_evictions WHERE run_id = ? "
                                          "ORDER BY req_id", [rid]).fetchall()]
        req = data.draw(st.sampled_from(reqs))
        records = read_steps.request_evictions(con, rid, req)
        times = [e.t_ns for e in records]
        bound = st.one_of(st.sampled_from(times), st.integers(-2**63, 2**63 - 1),
                          st.sampled_from(times).map(lambda t: t + 1), st.sampled_from(times).map(lambda t: t - 1))
        lo, hi = data.draw(bound), data.draw(bound)
        want = con.execute(BETWEEN_SQL, [rid, req, lo, hi]).fetchall()
        got = [(e.eviction_id, e.t_ns, e.tier, e.action, e.prefix_tokens, e.cause_req_id)
               for e in read_steps.evictions_between(records, lo, hi)]
        assert got == want
