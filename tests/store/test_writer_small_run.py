"""The writer process's small runs (store/writer_serve.py `_Serve.interval`): a run whose late
writes will come (its trace's lines counted), short of LATE_FROM of them handed over, not large
(writer_process.VACUUM_ROWS: a table with a row group's rows, or a trace of as many requests),
with fewer rows pending than SMALL_PENDING_ROWS (all tables), waits the longest interval (`most`: the flush
interval's bound) for a write instead of the doubling one: each write costs ~20-25 ms of CPU
whatever its rows (issue 41, session 36 h46writes). Anything else is written as before."""

from __future__ import annotations

import queue

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from tests.support.serve_writer import CountingWriter
from tierdiag.store import writer_serve
from tierdiag.store.writer import RunWriter
from tierdiag.store.writer_process import SMALL_PENDING_ROWS, VACUUM_ROWS
from tierdiag.store.writer_serve import LATE_FROM


@pytest.fixture(autouse=True)
def _interval_stays_due(monkeypatch):
    """The doubling interval stays as set after a write (`_serve`'s `every`), whatever it took."""
    monkeypatch.setattr(writer_serve, "next_interval", lambda every, every_max, most, took: every)


def _serve(expected, *, every=0.0, most=10**9):
    """A serving loop whose doubling interval is always due (`every` 0) and whose longest never is."""
    serve = writer_serve._Serve(inbox=queue.SimpleQueue(), reply_fd=-1)
    serve.writer = CountingWriter()
    serve.every = serve.every_max = every
    serve.most = most
    serve.expected = expected
    return serve


def _batch(n: int, evictions: int = 0) -> dict:
    """n request rows, and `evictions` eviction rows."""
    tables = {"requests": {"seq": pa.array(range(n), pa.int64())}}
    if evictions:
        tables["evictions"] = {"eviction_id": pa.array(range(evictions), pa.int64())}
    return tables


def test_a_small_run_waits_for_its_first_late_write_then_is_written_as_before():
    """1,000 requests 50 at a time, the doubling interval due at every batch: a small run's first
    write is its first late one (50 %), where before every batch was written; from LATE_FROM on
    the doubling interval is back (every batch due is written)."""
    serve = _serve(1000)
    for _ in range(10):
        serve.rows(_batch(50))
    assert serve.writer.writes == [500]
    serve.rows(_batch(50))
    serve.rows(_batch(50))
    assert serve.writer.writes == [500, 550, 600]


def test_rows_pending_past_the_bound_are_written_at_the_interval():
    """The rows pending (every table's) reach SMALL_PENDING_ROWS: written at the interval, the
    bound counted again from that write."""
    serve = _serve(1000)
    half = SMALL_PENDING_ROWS // 2
    serve.rows(_batch(10, evictions=half - 10))
    assert serve.writer.writes == [] and serve.rows_pending == half
    serve.rows(_batch(10, evictions=half - 11))  # one short
    assert serve.writer.writes == []
    serve.rows(_batch(1))  # at the bound
    assert serve.writer.writes == [21]
    assert serve.rows_pending == 0
    serve.rows(_batch(10))
    assert serve.writer.writes == [21]


def test_the_bound_is_a_row_group():
    assert SMALL_PENDING_ROWS == VACUUM_ROWS == 122_880


@pytest.mark.parametrize("expected", [None, 0, -5])
def test_a_run_without_a_count_is_written_at_the_interval(expected):
    """No late write will come (a trace read through a pipe, a nonsense count): as before."""
    serve = _serve(expected)
    for _ in range(3):
        serve.rows(_batch(10))
    assert serve.writer.writes == [10, 20, 30]


def test_a_large_run_is_written_at_the_interval():
    """A trace of VACUUM_ROWS requests or more, or a table holding as many rows: as before."""
    serve = _serve(VACUUM_ROWS)
    serve.rows(_batch(10))
    assert serve.writer.writes == [10]
    serve = _serve(1000)  # a small trace, a table reaching a row group's rows
    serve.rows({"evictions": {"seq": pa.array(range(VACUUM_ROWS - 1), pa.int64())}})
    assert serve.writer.writes == []
    serve.write()  # (as a late write would: the rows pending counted again from 0)
    serve.rows(_batch(1))
    assert serve.writer.writes == [0]
    serve.rows({"evictions": {"seq": pa.array([0], pa.int64())}, **_batch(1)})
    assert serve.writer.writes == [0, 2]


def test_the_longest_interval_still_writes_a_small_run():
    """The wait stops at `most` (the flush interval's bound, the contract's "at least this often")."""
    serve = _serve(1000, every=0.0, most=5.0)
    serve.rows(_batch(10))
    assert serve.writer.writes == []
    serve.last_write -= 5.0
    serve.rows(_batch(10))
    assert serve.writer.writes == [20]


def test_the_idle_wait_follows_the_interval(monkeypatch):
    """The serving loop's wait for rows (`run`'s timeout) is the interval's: a small run's pending
    rows wait for `most`, not the doubling interval."""
    serve = _serve(1000, every=0.2, most=2.0)
    serve.rows(_batch(10))
    assert serve.interval() == 2.0
    seen = []

    class Inbox:
        def get(self, timeout=None):
            seen.append(timeout)
            return writer_serve.EOF

    serve.inbox = Inbox()
    monkeypatch.setattr(serve, "engine_gone", lambda: None)
    serve.run()
    assert seen and 1.5 < seen[0] <= 2.0


_COUNT = st.one_of(st.none(), st.integers(-10**18, 10**18), st.sampled_from([0, 1, VACUUM_ROWS - 1, VACUUM_ROWS, 2**63]))
_SECONDS = st.floats(0, 1e6, allow_nan=False)


@settings(max_examples=400, deadline=None)
@given(_COUNT, st.integers(-10**6, 10**18), st.integers(-10**6, 2**63), _SECONDS, _SECONDS,
       st.dictionaries(st.sampled_from(["requests", "evictions"]), st.integers(0, 2**63), max_size=2))
def test_the_interval_for_any_counts(expected, taken, rows_pending, every, most, rows_taken):
    """Hostile counts (None, negative, zero, past int64): the doubling interval, or the longest
    exactly where the run is small, its late writes will come, it is short of LATE_FROM and its
    rows pending are under the bound; never shorter than the doubling one."""
    serve = _serve(expected, every=every, most=most)
    serve.taken, serve.rows_pending, serve.rows_taken = taken, rows_pending, dict(rows_taken)
    got = serve.interval()
    small = (expected is not None and 0 < expected < VACUUM_ROWS and taken < LATE_FROM * expected
             and rows_pending < SMALL_PENDING_ROWS and max(rows_taken.values(), default=0) < VACUUM_ROWS)
    assert got == (max(every, most) if small else every)
    assert got >= every


def test_a_small_run_through_the_real_writer_commits_every_row_once(tmp_path, monkeypatch):
    """The real RunWriter behind the loop, the doubling interval due at every batch until a write
    sets the next (then never): a small run's rows written at its late writes and the close, each
    once, in order."""
    import duckdb

    monkeypatch.setattr(writer_serve, "next_interval", lambda *a: 10**9)  # after the first write: never

    writer = RunWriter(tmp_path / "s.duckdb", name="s", trace_path="t.jsonl", trace_sha256="00" * 32, config={},
                       hardware={}, data_plane={}, timing="modelled", let_rows_go=True)
    serve = writer_serve._Serve(inbox=queue.SimpleQueue(), reply_fd=-1)
    serve.writer = writer
    serve.every = serve.every_max = 0.0
    serve.most = 10**9
    serve.expected = 400
    writes = []
    real_write = writer.write

    def write(**kw):
        writes.append(serve.taken)
        real_write(**kw)

    writer.write = write
    for first in range(0, 400, 40):
        serve.rows({"requests": {"req_id": [str(i) for i in range(first, first + 40)],
                                 "seq": list(range(first, first + 40)), "status": ["finished"] * 40}})
    assert writes == [200, 320, 360]  # 50 %, then each as much pending as to come (the close: the rest)
    writer.finish("complete")
    con = duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True)
    assert con.execute("SELECT seq FROM requests ORDER BY rowid").fetchall() == [(i,) for i in range(400)]
    assert con.execute("SELECT num_requests FROM runs").fetchall() == [(400,)]
