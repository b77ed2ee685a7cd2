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
from hypothesis import HealthCheck, event, given, settings, strategies as st

from tests.support.sql_rows import insert_rows
from tierdiag.diagnose.read import run_context as read_ctx
from tierdiag.diagnose.run import story_rows
from tierdiag.diagnose.run.story_rows import StoryRows
from tierdiag.store.reader import open_store, resolve_run


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """A real replay (agent sessions: queueing, causes of every kind) recorded into a store."""
    from tests.support.cli import cli_env, completed_in_process as run  # the CLI in this process: ~0.45 s a start

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


def _folded(recorded, cuts) -> tuple:
    """The recorded run's id and its rows taken by a fold in the batches `cuts` makes."""
    run_id, rows = _taken(recorded)
    fold = StoryRows(run_id)
    for batch in _batches(rows, [min(c, rows.num_rows) for c in cuts]):
        fold.take(batch)
    return run_id, fold


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cuts=st.lists(st.integers(0, 300), max_size=8))
def test_the_folded_rows_are_the_stores_whatever_the_batches(recorded, cuts):
    run_id, fold = _folded(recorded, cuts)
    fold.take(None)  # the end: nothing more comes, the parts kept for the close
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


# Hostile request rows for the numpy projection against the story's SQL: NULLs where the SQL
# coalesces (and where it does not), ties between the TTFT parts, routing on and off (best rank
# NULL, equal, other; recomputed tokens 0), negative values, magnitudes near and past numpy's reach.
_NUM = st.one_of(st.none(), st.integers(0, 50), st.integers(0, 50), st.integers(-5, 5), st.integers(0, 10**9),
                 st.integers(0, 10**9))
_HUGE = st.sampled_from([2**54, 2**55 + 1, 2**62, -(2**61)])


@st.composite
def _hostile_rows(draw):
    n = draw(st.integers(1, 12))
    huge = draw(st.integers(0, 3)) == 0  # an example of one in four with magnitudes near int64's
    num = st.one_of(_NUM, _HUGE) if huge else _NUM
    holes = draw(st.integers(0, 3)) == 0  # one in four: NULLs where the story does not coalesce
    kept = (lambda s: st.one_of(s, st.none())) if holes else (lambda s: s)
    rows = []
    for i in range(n):
        row = {name: draw(num) for name in (
            "storage_wait_ns", "queue_ns", "ideal_ttft_ns", "loadback_exposed_ns", "recompute_ns", "compute_ns",
            "decode_wait_ns", "recomputed_tokens", "best_rank_device_tokens", "best_rank_host_tokens",
            "arrival_device_tokens", "arrival_host_tokens", "storage_match_tokens")}
        row.update(
            req_id=f"r{i}", seq=draw(kept(st.just(i))),
            status=draw(st.sampled_from([None, "finished", "finished", "rejected"])),
            ttft_ns=draw(st.one_of(st.integers(0, 10**9), st.integers(0, 10**9), st.none(),
                                   *([_HUGE] if huge else []))),
            arrival_ns=draw(kept(st.integers(0, 10**9))), first_token_ns=draw(kept(st.integers(0, 10**9))),
            miss_lost_while_queued_tokens=draw(kept(st.integers(0, 99))),
            dp_rank=draw(st.sampled_from([None, 0, 1])), best_rank=draw(st.sampled_from([None, 0, 1, 2])))
        rows.append(row)
    return rows


@pytest.fixture(scope="module")
def empty_store():
    """One in-memory store for every example of the test below, its request rows deleted after
    each: a fresh database and `init_store` an example were ~60 ms of its CPU (~18 s of the
    suite's 300 examples), the rows and the queries ~30-60 ms. Deleted rows are never read, and
    the statistics they leave are only ever wider than a fresh table's, so DuckDB checks at least
    the overflows it checked before (the test's `duckdb.Error` branch)."""
    import duckdb

    from tierdiag.store.writer import init_store

    with duckdb.connect(":memory:") as con:
        init_store(con)
        yield con


def _insert(con, rows: list[dict]) -> None:
    """`rows` (dicts of one set of columns) as run R's request rows, in their order (executemany's
    rows in one statement: ~2 ms of CPU a row saved, tests/support/sql_rows.py)."""
    cols = sorted(rows[0])
    insert_rows(con, f"INSERT INTO requests (run_id, {', '.join(cols)})", [["R", *(r[c] for c in cols)] for r in rows])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=_hostile_rows())
def test_the_numpy_projection_is_the_stories_sql_or_declines(empty_store, rows):
    """read/run_context.py `taken_story_rows` (numpy) against `story_requests` (DuckDB) on the same
    rows: where it answers, every column equal, with the SQL's dtypes, in any order; where it
    declines (None) the SQL would read the rows otherwise (a NULL it keeps, an engine count
    missing: then it joins) or differently (a negative it divides, a value past int64's reach)."""
    import duckdb

    con = empty_store
    assert con.execute("SELECT count(*) FROM requests").fetchall() == [(0,)]  # as a fresh store's
    try:
        _insert(con, rows)
        taken = con.sql("SELECT * EXCLUDE (run_id) FROM requests").to_arrow_table()
        got = read_ctx.taken_story_rows({c: taken.column(c).combine_chunks() for c in taken.column_names})
        finished = [r for r in rows if (r["status"] or "finished") == "finished" and r["ttft_ns"] is not None]
        kept_null = any(r[c] is None for r in finished for c in ("arrival_ns", "first_token_ns", "seq",
                                                                  "miss_lost_while_queued_tokens"))
        event("declined" if got is None else "answered")
        if got is None:
            assert kept_null or any(abs(v) >= read_ctx._NP_SAFE for r in finished for v in r.values()
                                    if isinstance(v, int)) or any(
                (r["recomputed_tokens"] or 0) > 0 and (r["recompute_ns"] or 0) < 0 for r in finished) or any(
                abs(r["recompute_ns"] or 0) * max(abs(r["recomputed_tokens"] or 0), 1) >= 2**62 for r in finished), rows
            return
        assert not kept_null
        try:
            want = read_ctx.story_requests(con, "R")
        except duckdb.Error:  # an overflow the SQL refuses: numpy must not have answered it
            raise AssertionError(f"numpy answered rows the SQL refuses: {rows}") from None
        _same(read_ctx.story_requests_of(got), want)
    finally:
        con.execute("DELETE FROM requests")


# --------------------------------------------------------------------------- the run context's rows
# diagnose/run/context_rows.py (issue 41, session 32): the run context's per-request columns (six
# queries' results) folded beside the story's rows, checked with them.

def _same_context(got, con, run_id) -> None:
    assert got is not None
    want = (read_ctx.wait_windows(con, run_id), read_ctx.allocations(con, run_id))
    for have, should in zip(got[:2], want):
        assert type(have) is type(should)
        for field, a, b in zip(should._fields, have, should):
            assert a.dtype == b.dtype and np.array_equal(a, b), field  # in the store's row order too
    lost = read_ctx.lost_request_sizes(con, run_id)
    assert got.lost_sizes.dtype == lost.dtype and np.array_equal(got.lost_sizes, lost)
    for have, query in ((got.skipped, read_ctx.loadback_skipped_by_reason), (got.unused, read_ctx.storage_unused_by_reason)):
        # as the context reads them (`_i`: a sum of NULLs alone is 0 there), in the SQL's order
        assert [(r, int(n or 0)) for r, n in have] == [(r, int(n or 0)) for r, n in query(con, run_id)]
    ideal = read_ctx.ideal_arrivals(con, run_id)
    assert got.ideal.arrival_ns.dtype == ideal.arrival_ns.dtype and got.ideal.ideal_ttft_ns.dtype == ideal.ideal_ttft_ns.dtype
    assert np.array_equal(got.ideal.arrival_ns, ideal.arrival_ns)  # equal arrivals' ideals: in any order
    assert sorted(zip(got.ideal.arrival_ns.tolist(), got.ideal.ideal_ttft_ns.tolist())) == sorted(
        zip(ideal.arrival_ns.tolist(), ideal.ideal_ttft_ns.tolist()))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cuts=st.lists(st.integers(0, 300), max_size=8))
def test_the_folded_context_rows_are_the_stores_whatever_the_batches(recorded, cuts):
    run_id, fold = _folded(recorded, cuts)
    with open_store(recorded) as con:
        story, context = fold.results(con, run_id)
        _same(story, read_ctx.story_requests(con, run_id))
        assert len(context.lost_sizes) and len(context.allocations.sched_ns) > 100 and len(context.ideal.arrival_ns)
        _same_context(context, con, run_id)


def test_the_run_context_is_the_same_from_the_folded_rows(recorded):
    """compute_run_context(rows=...) with the folded rows: the whole context as queried."""
    from tierdiag.diagnose.run.runcontext import compute_run_context

    run_id, rows = _taken(recorded)
    fold = StoryRows(run_id)
    for batch in _batches(rows, [90, 91, 250]):
        fold.take(batch)
    with open_store(recorded) as con:
        run = resolve_run(con, run_id)
        context = fold.results(con, run_id)[1]
        assert compute_run_context(con, run, rows=lambda: context) == compute_run_context(con, run)


@pytest.mark.parametrize("spoil", ["a NULL it carries", "a column of another type"])
def test_a_batch_the_context_cannot_project_gives_up_its_rows_alone(recorded, spoil):
    run_id, rows = _taken(recorded)
    fold = StoryRows(run_id)
    batches = list(_batches(rows, [100]))
    col = batches[1]["requests"]["input_tokens"]
    finished = np.flatnonzero(np.asarray(batches[1]["requests"]["prefill_ns"].is_valid()))[0]
    batches[1]["requests"]["input_tokens"] = (
        pa.array([None if i == finished else v for i, v in enumerate(col.to_pylist())], type=col.type)
        if spoil == "a NULL it carries" else pa.array([str(v) for v in col.to_pylist()]))  # arrow_ints raises
    for batch in batches:
        fold.take(batch)
    with open_store(recorded) as con:
        story, context = fold.results(con, run_id)
    assert story is not None and context is None  # the story's parts stay; the context queries


# Hostile rows for the three projections against their SQL: NULLs (where the SQL coalesces, where
# it carries them, where the skipped reasons make a column count), repeated seqs and schedule
# instants, negatives, magnitudes near and past numpy's reach.
_SMALL = st.one_of(st.none(), st.integers(0, 40), st.integers(-3, 3), st.integers(0, 10**9))


@st.composite
def _context_rows(draw):
    n = draw(st.integers(1, 12))
    huge = draw(st.integers(0, 3)) == 0
    num = st.one_of(_SMALL, _HUGE) if huge else _SMALL
    rows = []
    for i in range(n):
        row = {name: draw(num) for name in (
            "storage_wait_ns", "input_tokens", "device_hit_tokens", "output_tokens", "recomputed_tokens",
            "loadback_skipped_tokens", "storage_match_tokens", "storage_hit_tokens", "prefill_ns",
            "miss_prefetch_lost_tokens", "ideal_ttft_ns")}
        row.update(
            req_id=f"r{i}", seq=draw(st.one_of(st.just(i), st.integers(0, 2), st.none())),
            status=draw(st.sampled_from([None, "finished", "finished", "rejected"])),
            ttft_ns=draw(st.one_of(st.integers(0, 10**9), st.none())),
            arrival_ns=draw(st.one_of(st.integers(0, 10**9), st.none())),
            first_token_ns=draw(st.one_of(st.integers(0, 5), st.integers(0, 10**9), st.none())),
            dp_rank=draw(st.sampled_from([None, 0, 1])),
            loadback_skipped_reason=draw(st.sampled_from([None, "below_threshold", "device_full", "\u00e9", "Z"])),
            storage_skipped_reason=draw(st.sampled_from([None, "host_full", "prefetch_incomplete", "a\x00", "\u00df"])))
        rows.append(row)
    return rows


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=_context_rows(), cut=st.integers(0, 12))
def test_the_context_projection_is_the_sqls_or_declines(empty_store, rows, cut):
    """context_rows.py (numpy, the rows cut in two batches) against the six queries (DuckDB:
    `wait_windows`, `allocations`, `lost_request_sizes`, the two sums by reason, `ideal_arrivals`)
    on the same rows: where it answers, equal, dtypes and the
    wait windows' order too; where it declines, the SQL reads a NULL, a magnitude past
    _NP_SAFE or an undecided order there (or refuses the rows)."""
    import duckdb

    from tierdiag.diagnose.run import context_rows as cr

    con = empty_store
    try:
        _insert(con, rows)
        taken = con.sql("SELECT * EXCLUDE (run_id) FROM requests ORDER BY rowid").to_arrow_table()
        cut = min(cut, taken.num_rows)
        parts = [cr.taken_context_rows({c: taken.column(c).slice(lo, hi - lo).combine_chunks()
                                        for c in taken.column_names})
                 for lo, hi in ((0, cut), (cut, taken.num_rows))]
        got = None if any(p is None for p in parts) else cr.context_rows(parts)
        event("declined" if got is None else "answered")
        if got is None:
            finished = [r for r in rows if (r["status"] or "finished") == "finished" and r["ttft_ns"] is not None]
            sched = [r for r in finished if r["prefill_ns"] is not None]
            assert (any(v is None for r in sched for v in (r["arrival_ns"], r["first_token_ns"], r["seq"],
                                                           r["input_tokens"], r["output_tokens"]))
                    or any(abs(v) >= cr._NP_SAFE for r in rows for v in r.values() if isinstance(v, int))
                    or len({(r["first_token_ns"] - r["prefill_ns"], r["seq"]) for r in sched}) < len(sched)
                    or any((r["recomputed_tokens"] or 0) > 0 and (
                        (r["loadback_skipped_reason"] and r["loadback_skipped_tokens"] is None)
                        or (r["storage_skipped_reason"] and None in (r["storage_match_tokens"], r["storage_hit_tokens"])))
                        for r in finished)
                    or any(r["storage_skipped_reason"] and None in (r["storage_match_tokens"], r["storage_hit_tokens"],
                                                                   r["recomputed_tokens"]) for r in finished)
                    or any(r["ideal_ttft_ns"] is not None and r["arrival_ns"] is None for r in finished)
                    or sum(abs(r["ideal_ttft_ns"] or 0) for r in finished) >= cr._EXACT_DOUBLE
                    or sum(abs((r["input_tokens"] or 0) - (r["device_hit_tokens"] or 0) + (r["output_tokens"] or 0))
                           for r in sched) >= cr._EXACT_DOUBLE), rows
            return
        try:
            _same_context(got, con, "R")
        except duckdb.Error:  # an overflow the SQL refuses: numpy must not have answered it
            raise AssertionError(f"numpy answered rows the SQL refuses: {rows}") from None
    finally:
        con.execute("DELETE FROM requests")
