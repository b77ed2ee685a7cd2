"""explain's reads on a second cursor and a thread (read/request_reads.py): each answer is the
answer of the query the caller's thread would have made, for every request of the planted run,
and a read that raises says so where it is asked for, not where the reads are closed."""

from __future__ import annotations

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tierdiag.diagnose.read import queries
from tierdiag.diagnose.read import request_context as read_req
from tierdiag.diagnose.read import request_steps as read_steps
from tierdiag.diagnose.read.request_reads import (RequestReads, asks_queue_depth, has_previous_turn, shadowed,
                                                  transfer_bounds)
from tierdiag.diagnose.read.rows import fetch_dicts
from tierdiag.diagnose.request.explain_steps import is_finished
from tierdiag.store.reader import open_store, resolve_run, views_shown


@pytest.fixture
def store(planted):
    con = open_store(planted.path)
    run = resolve_run(con, None)
    ids = [r["req_id"] for r in fetch_dicts(con, "SELECT req_id FROM requests WHERE run_id = ? ORDER BY seq",
                                            [run.run_id])]
    yield con, run, [queries.request(con, run, i) for i in ids]
    con.close()


def test_each_read_is_the_callers_query(store):
    con, run, rows = store
    assert rows
    assert not shadowed(con)  # a store of the current schema: the reads run on the thread
    for row in rows:
        finished = is_finished(row)
        reads = RequestReads(con, run, row, finished)
        try:
            rid = run.run_id
            t_lo = int(row.arrival_ns) if row.arrival_ns is not None else None
            assert reads.get("transfers") == read_steps.request_transfers(con, rid, row.req_id, t_lo, row.finish_ns)
            assert reads.get("evictions") == read_steps.request_evictions(con, rid, row.req_id)
            whole = read_steps.window_eviction_load(con, rid, 0, 10**12, None, None)
            assert reads.get("run_busy_ns") == whole.run_busy_ns
            assert read_steps.window_eviction_load(con, rid, 0, 10**12, None, None, reads.get("run_busy_ns")) == whole
            want_prev = queries.previous_turn(con, run, row) if has_previous_turn(row) else None
            assert reads.get("previous") == want_prev
            want_depth = (read_req.queue_depth_at_arrival(con, rid, row.req_id, int(row.arrival_ns or 0), int(row.seq),
                                                          int(row.dp_rank or 0))
                          if asks_queue_depth(row, finished) else None)
            assert reads.get("queue_depth") == want_depth
        finally:
            reads.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])  # read only
@given(lo=st.integers(-(2**63), 2**63 - 1), hi=st.integers(-(2**63), 2**63 - 1),
       ids=st.tuples(st.none() | st.integers(-(2**63), 2**63 - 1), st.none() | st.integers(-(2**63), 2**63 - 1)))
def test_the_window_load_with_the_run_busy_time_given_is_the_same(planted, lo, hi, ids):
    """Any window and id range, int64 extremes included: given the run's busy time (read apart),
    the window's numbers are the one query's."""
    con = open_store(planted.path)
    try:
        run = resolve_run(con, None)
        busy = read_steps.run_prefill_busy_ns(con, run.run_id)
        try:
            whole = read_steps.window_eviction_load(con, run.run_id, lo, hi, *ids)
        except duckdb.OutOfRangeException:  # the window's arithmetic overflows int64 either way
            with pytest.raises(duckdb.OutOfRangeException):
                read_steps.window_eviction_load(con, run.run_id, lo, hi, *ids, busy)
            return
        assert read_steps.window_eviction_load(con, run.run_id, lo, hi, *ids, busy) == whole
    finally:
        con.close()


def _without_batches(tmp_path, planted):
    """A read-only connection to a copy of the planted store whose batches table is dropped (the
    run's busy-time query then raises)."""
    import shutil

    copy = tmp_path / "nobatches.duckdb"
    shutil.copy(planted.path, copy)
    with duckdb.connect(str(copy)) as rw:
        rw.execute("DROP TABLE batches")
    return duckdb.connect(str(copy), read_only=True)


def test_a_read_that_raises_says_so_where_it_is_asked_for(tmp_path, planted):
    con = _without_batches(tmp_path, planted)
    try:
        run = resolve_run(con, None)
        row = queries.request(con, run, "recomp")
        reads = RequestReads(con, run, row, is_finished(row))
        try:
            assert reads.get("evictions") == read_steps.request_evictions(con, run.run_id, "recomp")
            with pytest.raises(duckdb.CatalogException):
                reads.get("run_busy_ns")
            with pytest.raises(duckdb.CatalogException):  # the reads after it never ran
                reads.get("previous")
        finally:
            reads.close()  # waits, raises nothing of its own
        reads.close()  # twice: nothing left to close
    finally:
        con.close()


def test_a_shadowed_store_reads_on_the_callers_thread(planted):
    """A connection with temporary views (an older schema's tables shadowed: store/reader.py) is
    read on the caller's thread, where the views are; the answers are the same. One open_store did
    not open is asked of DuckDB."""
    con = duckdb.connect(str(planted.path), read_only=True)
    try:
        run = resolve_run(con, None)
        row = queries.request(con, run, "recomp")
        assert views_shown(con) is None and not shadowed(con)
        con.execute("CREATE TEMP VIEW shadow_probe AS SELECT 1 AS x")
        assert shadowed(con)
        reads = RequestReads(con, run, row, is_finished(row))
        assert reads.get("evictions") == read_steps.request_evictions(con, run.run_id, row.req_id)
        assert reads.get("run_busy_ns") == read_steps.run_prefill_busy_ns(con, run.run_id)
        reads.close()
    finally:
        con.close()


def test_open_store_says_whether_it_read_an_older_schema_through_views(tmp_path, planted):
    """open_store's word (no duckdb_views() query per explain): False for the current schema, even
    with a view made since; True for a v2 store, whose reads then run on the caller's thread and
    answer as the queries do."""
    import shutil

    from tierdiag.store.schema import columns_missing_in

    with open_store(planted.path) as con:
        assert views_shown(con) is False
        con.execute("CREATE TEMP VIEW shadow_probe AS SELECT 1 AS x")
        assert not shadowed(con)
    older = tmp_path / "v2.duckdb"
    shutil.copy(planted.path, older)
    with duckdb.connect(str(older)) as rw:  # as tierdiag wrote it before v3
        for table, cols in columns_missing_in(2).items():
            for col in cols:
                rw.execute(f"ALTER TABLE {table} DROP COLUMN {col}")
        rw.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    with open_store(older) as con:
        assert views_shown(con) is True and shadowed(con)
        run = resolve_run(con, None)
        row = queries.request(con, run, "recomp")
        reads = RequestReads(con, run, row, is_finished(row))
        try:
            assert reads.get("evictions") == read_steps.request_evictions(con, run.run_id, "recomp")
            assert reads.get("transfers") == read_steps.request_transfers(con, run.run_id, "recomp", *transfer_bounds(row))
            assert reads.get("run_busy_ns") == read_steps.run_prefill_busy_ns(con, run.run_id)
        finally:
            reads.close()


def test_a_read_given_is_not_made(tmp_path, planted):
    """A read the caller gives (explain: the run's busy time from the stored run context) is
    answered as given and never queried: on a store without batches, where the query raises."""
    con = _without_batches(tmp_path, planted)
    try:
        run = resolve_run(con, None)
        row = queries.request(con, run, "recomp")
        con.execute("CREATE TEMP VIEW shadow_probe AS SELECT 1 AS x")  # the caller's thread: deterministic
        reads = RequestReads(con, run, row, is_finished(row))
        reads.give("run_busy_ns", 12345)
        assert reads.get("run_busy_ns") == 12345
        assert reads.get("previous") == (queries.previous_turn(con, run, row) if has_previous_turn(row) else None)
        with pytest.raises(KeyError):
            reads.give("no such read", 1)
        reads.close()
    finally:
        con.close()


def test_a_read_given_on_the_thread_answers_the_same(store):
    """Given while the thread runs (before, during or after it reads the same), get() answers it."""
    con, run, rows = store
    busy = read_steps.run_prefill_busy_ns(con, run.run_id)
    for row in rows:
        reads = RequestReads(con, run, row, is_finished(row))
        try:
            reads.give("run_busy_ns", busy)
            assert reads.get("run_busy_ns") == busy
            assert reads.get("evictions") == read_steps.request_evictions(con, run.run_id, row.req_id)
        finally:
            reads.close()


_HOSTILE_BUSY = (st.none() | st.booleans() | st.integers(max_value=-1) | st.floats(allow_nan=True)
                 | st.text(max_size=8) | st.lists(st.integers(), max_size=3)
                 | st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=_HOSTILE_BUSY)
def test_a_hand_edited_stored_busy_time_is_not_used(planted, tmp_path_factory, value):
    """The stored run context's prefill_busy_ns (what explain takes instead of summing the run's
    batches) edited by hand to anything but a count of ns: explain sums the batches, as before, and
    says what it says with the true one."""
    import json
    import shutil

    from tierdiag.diagnose.request.explain import explain_request

    def explained(path):
        with open_store(path) as c:
            r = resolve_run(c, None)
            return [explain_request(c, r, i).to_json() for i in ("recomp", "tier")]

    copy = tmp_path_factory.mktemp("edited") / "edited.duckdb"
    shutil.copy(planted.path, copy)
    with duckdb.connect(str(copy)) as rw:
        (raw,) = rw.execute("SELECT evidence_json FROM run_evidence").fetchone()
        sections = json.loads(raw)
        assert type(sections["context"]["prefill_busy_ns"]) is int
        sections["context"]["prefill_busy_ns"] = value
        rw.execute("UPDATE run_evidence SET evidence_json = ?", [json.dumps(sections)])
    assert explained(copy) == explained(planted.path)


def test_a_read_not_there_yet_runs_the_callers_idle_work_first(store, monkeypatch):
    """get() of a read the thread has not finished is a wait on another thread: the caller's
    deferred work (threads.idle_work: the text view's import) runs there, once, on the caller's
    thread, before the read is waited for; a read already there runs nothing."""
    import threading

    from tierdiag.diagnose.read import request_reads
    from tierdiag.threads import idle_work

    con, run, rows = store
    gate = threading.Event()
    real = request_reads.request_transfers

    def held(*args):
        gate.wait(10)  # the read ends only once the idle work has run
        return real(*args)

    monkeypatch.setattr(request_reads, "request_transfers", held)
    ran: list[int] = []
    with idle_work(lambda: (ran.append(threading.get_ident()), gate.set())):
        reads = RequestReads(con, run, rows[0], is_finished(rows[0]))
        try:
            assert reads.get("transfers") == real(con, run.run_id, rows[0].req_id, *transfer_bounds(rows[0]))
            reads.get("evictions")
        finally:
            reads.close()
    assert ran == [threading.get_ident()]
