"""The run story's per-request rows folded while a run is recorded (diagnose/run/story_rows.py,
issue 41 session 24): from the request rows as a writer takes them, batch by batch, they are
the arrays `story_requests` reads from the committed store (every field, its dtype and its
values, in trace order), whatever the batches; and where they cannot be (a finished row without
the engine's lost-while-queued count, rows the store does not hold, a large run, a batch it
cannot project) the close gets None and queries the store as before."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tierdiag.diagnose.read import run_context as read_ctx
from tierdiag.diagnose.run import story_rows
from tierdiag.diagnose.run.story_rows import StoryRows
from tierdiag.store.reader import open_store, resolve_run


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """A real replay (agent sessions: queueing, causes of every kind) recorded into a store."""
    from tests.support.cli import cli_env, run

    folder = tmp_path_factory.mktemp("story_rows")
    trace = folder / "t.jsonl"
    assert run("synth", trace, "--requests", "300", "--kind", "agent", "--seed", "5").returncode == 0
    db = folder / "run.duckdb"
    done = run("replay", trace, "--db", db, "--device-tokens", "65536", env=cli_env(TIERDIAG_WRITER="inline"))
    assert done.returncode == 0, done.stderr
    return db


def _taken(db: Path) -> tuple[str, pa.Table]:
    """The run's id and its request rows as the writer took them: in the order written, the
    schema's types, no run_id."""
    with open_store(db) as con:
        run_id = resolve_run(con, None).run_id
        rows = con.sql("SELECT * EXCLUDE (run_id) FROM requests ORDER BY rowid").to_arrow_table()
    return run_id, rows


def _batches(rows: pa.Table, cuts: list[int]):
    at = 0
    for cut in sorted(set(cuts)) + [rows.num_rows]:
        yield {"requests": {c: rows.column(c).slice(at, cut - at).combine_chunks() for c in rows.column_names},
               "batches": {}}
        at = cut


def _same(got, want) -> None:
    assert got is not None
    assert type(got) is type(want)
    for field, a, b in zip(want._fields, got, want):
        assert type(a) is type(b) and a.dtype == b.dtype, field
        assert np.array_equal(a, b), field


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cuts=st.lists(st.integers(0, 300), max_size=8))
def test_the_folded_rows_are_the_stores_whatever_the_batches(recorded, cuts):
    run_id, rows = _taken(recorded)
    fold = StoryRows(run_id)
    for batch in _batches(rows, [min(c, rows.num_rows) for c in cuts]):
        fold.take(batch)
    fold.take(None)  # the end: its DuckDB let go, the parts kept for the close
    with open_store(recorded) as con:
        want = read_ctx.story_requests(con, run_id)
        assert len(want.arrival_ns) > 100 and want.cause.dtype == np.int8 and (want.cause >= 0).any()
        _same(fold.result(con, run_id), want)


def test_rows_written_out_of_trace_order_come_back_in_it(recorded):
    run_id, rows = _taken(recorded)
    fold = StoryRows(run_id)
    backwards = rows.take(pa.array(np.arange(rows.num_rows)[::-1]))
    for batch in _batches(backwards, [50, 120]):
        fold.take(batch)
    with open_store(recorded) as con:
        _same(fold.result(con, run_id), read_ctx.story_requests(con, run_id))


@pytest.mark.parametrize("spoil", ["a finished row without the engine's count", "a batch never committed",
                                   "a large run", "a column missing", "a column of another type", "another run",
                                   "nothing taken"])
def test_where_the_rows_are_not_the_stores_the_close_queries(recorded, spoil):
    run_id, rows = _taken(recorded)
    fold = StoryRows(run_id, most_rows=100 if spoil == "a large run" else story_rows.MOST_ROWS)
    batches = list(_batches(rows, [100, 200]))
    if spoil == "a finished row without the engine's count":
        col = batches[1]["requests"]["miss_lost_while_queued_tokens"]
        batches[1]["requests"]["miss_lost_while_queued_tokens"] = pa.array([None] + col.to_pylist()[1:],
                                                                         type=col.type)
    if spoil == "a batch never committed":
        batches.pop(1)
    if spoil == "a column missing":
        del batches[2]["requests"]["ttft_ns"]
    if spoil == "a column of another type":
        batches[0]["requests"]["status"] = pa.array([{"x": 1}] * len(batches[0]["requests"]["seq"]))
    if spoil == "nothing taken":
        batches = []
    for batch in batches:
        fold.take(batch)  # never raises: what it cannot project gives the parts up
    with open_store(recorded) as con:
        got = fold.result(con, "another" if spoil == "another run" else run_id)
        assert got is None, spoil
        assert fold.parts == [] or spoil in ("a batch never committed", "another run")


def test_the_close_takes_the_fold_once_and_only_its_runs(recorded):
    run_id, rows = _taken(recorded)
    assert story_rows.start({"trace_path": "x"}) is None  # no run id: nothing folded
    fold = story_rows.start({"run_id": run_id})
    for batch in _batches(rows, [77]):
        fold.take(batch)
    with open_store(recorded) as con:
        assert story_rows.story_rows(con, run_id, use=False) is None  # let go unused (no per-batch recompute)
        assert story_rows.story_rows(con, run_id) is None  # nothing left
        fold = story_rows.start({"run_id": run_id})
        for batch in _batches(rows, [77]):
            fold.take(batch)
        _same(story_rows.story_rows(con, run_id), read_ctx.story_requests(con, run_id))
        assert story_rows.story_rows(con, run_id) is None


def test_the_run_story_is_the_same_from_the_folded_rows(recorded):
    """run_story(requests=...) with the folded rows: the story and its cause counts as queried."""
    from tierdiag.diagnose.run.story import run_story

    run_id, rows = _taken(recorded)
    fold = StoryRows(run_id)
    for batch in _batches(rows, [150]):
        fold.take(batch)
    with open_store(recorded) as con:
        rec = read_ctx.batch_recompute_sql(con)
        counts_q: dict = {}
        counts_f: dict = {}
        want = run_story(con, run_id, rec, cause_counts=counts_q)
        got = run_story(con, run_id, rec, cause_counts=counts_f, requests=fold.result(con, run_id))
    assert want is not None and got == want and counts_f == counts_q and counts_q


def test_no_fold_for_a_trace_of_a_large_runs_lines(tmp_path, monkeypatch):
    """A trace file of MOST_ROWS lines or more starts no fold (its parts would be given up at
    MOST_ROWS rows, after the work); fewer, or no file to count (a pipe), folds."""
    trace = tmp_path / "t.jsonl"
    trace.write_text("{}\n" * 5)
    monkeypatch.setattr(story_rows, "MOST_ROWS", 5)
    assert story_rows.start({"run_id": "r", "trace_path": str(trace)}) is None
    monkeypatch.setattr(story_rows, "MOST_ROWS", 6)
    assert story_rows.start({"run_id": "r", "trace_path": str(trace)}) is not None
    assert story_rows.start({"run_id": "r", "trace_path": str(tmp_path / "gone.jsonl")}) is not None
