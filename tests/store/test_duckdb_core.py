"""store/duckdb_core.py: DuckDB's C extension as `duckdb` for a read command, the package loaded
the moment anything asks for what only it has. Each case runs in a fresh interpreter: install()
changes sys.modules and DuckDBPyConnection for the rest of the process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("_duckdb", reason="a DuckDB whose C extension is not the top-level _duckdb (1.x)")


def _fresh(code: str) -> dict:
    """Run `code` after install() in a new interpreter; its last stdout line, as JSON."""
    prelude = ("import json, sys\n"
               "from tierdiag.store import duckdb_core\n"
               "installed = duckdb_core.install()\n"
               "import duckdb\n"
               "def package_loaded():\n"
               "    return 'duckdb._relation' in sys.modules\n")
    proc = subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_readers_calls_need_no_package(tmp_path):
    """connect, execute, fetchall / fetchone / fetchnumpy and the exception classes: all the C
    extension's, the package never imported; its exception classes are the package's own."""
    db = tmp_path / "r.duckdb"
    out = _fresh(f"""
con = duckdb.connect({str(db)!r})
con.execute("CREATE TABLE t (a INTEGER, b VARCHAR)")
con.execute("INSERT INTO t VALUES (1, 'x'), (2, 'y')")
rows = con.execute("SELECT a, b FROM t ORDER BY a").fetchall()
one = con.execute("SELECT count(*) FROM t WHERE a = ?", [2]).fetchone()
arr = con.execute("SELECT a FROM t ORDER BY a").fetchnumpy()["a"].tolist()
try:
    con.execute("SELECT * FROM no_such_table")
    caught = None
except duckdb.CatalogException as exc:
    caught = type(exc).__name__
con.close()
ro = duckdb.connect({str(db)!r}, read_only=True)
again = ro.execute("SELECT sum(a) FROM t").fetchone()[0]
loaded = package_loaded()
import _duckdb
same = duckdb.Error is _duckdb.Error and duckdb.DuckDBPyConnection is _duckdb.DuckDBPyConnection
print(json.dumps([installed, rows, one, arr, caught, again, loaded, same]))
""")
    assert out == [True, [[1, "x"], [2, "y"]], [1], [1, 2], "CatalogException", 3, False, True]


@pytest.mark.parametrize("ask", [
    "duckdb.sql('SELECT 41 + 1').fetchall()[0][0]",                          # a name only the package has
    "duckdb.connect().sql('SELECT 42').fetchall()[0][0]",                     # a method it adds to the class
    "__import__('duckdb.sqltypes').sqltypes.INTEGER is not None and 42",      # a submodule
    "__import__('duckdb').DuckDBPyRelation is not None and 42",
])
def test_whatever_only_the_package_has_loads_it_then(ask):
    out = _fresh(f"""
before = package_loaded()
value = {ask}
con = duckdb.connect()
print(json.dumps([installed, before, value, package_loaded(), con.execute("SELECT 7").fetchone()[0],
                  callable(getattr(con, "sql", None)), sys.modules["duckdb"].__name__]))
""")
    assert out == [True, False, 42, True, 7, True, "duckdb"]


def test_a_python_object_scan_is_duckdbs_own_error_until_the_package_loads():
    """`SELECT ... FROM a_local_table`: the scanners DuckDB takes from its package as it loads
    (not deferred: module doc). Before, DuckDB's own error says so; once anything has loaded the
    package, the same scan reads the table."""
    pytest.importorskip("pyarrow")
    out = _fresh("""
import pyarrow as pa
tbl = pa.table({"x": [1, 2, 3]})
con = duckdb.connect()
try:
    con.execute("SELECT sum(x) FROM tbl")
    before = "scanned"
except duckdb.InvalidInputException as exc:
    before = "_sources" in str(exc)
duckdb.sql  # a name only the package has: it loads
print(json.dumps([before, con.execute("SELECT sum(x) FROM tbl").fetchone()[0], package_loaded()]))
""")
    assert out == [True, 6, True]


def test_a_missing_attribute_is_still_an_attribute_error():
    out = _fresh("""
con = duckdb.connect()
errors = []
for get in (lambda: con.no_such_method, lambda: duckdb.no_such_name):
    try:
        get()
    except AttributeError:
        errors.append("AttributeError")
print(json.dumps(errors))
""")
    assert out == ["AttributeError", "AttributeError"]


def test_nothing_is_installed_where_duckdb_is_loaded_already():
    proc = subprocess.run([sys.executable, "-c",
                           "import duckdb, sys\nfrom tierdiag.store import duckdb_core\n"
                           "print(duckdb_core.install(), sys.modules['duckdb'] is duckdb, "
                           "'__getattr__' in duckdb.DuckDBPyConnection.__dict__)"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.split() == ["False", "True", "False"], proc.stderr


def test_release_cached_blocks_evicts_and_leaves_the_default_limit(tmp_path):
    """store/duckdb_core.release_cached_blocks (issue 41, the writer's close): after it the
    instance's buffer pool holds less, its memory limit is the default again, and queries (one
    with a result still open among them) answer as before."""
    import duckdb

    from tierdiag.store.duckdb_core import release_cached_blocks

    path = tmp_path / "s.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE t AS SELECT range AS i, range::VARCHAR AS s FROM range(1000000)")
    con = duckdb.connect(":memory:")
    default = con.execute("SELECT current_setting('memory_limit')").fetchone()[0]
    con.execute(f"ATTACH '{path}' AS store")
    want = con.execute("SELECT sum(i), count(DISTINCT s) FROM store.t").fetchall()
    cached = con.execute("SELECT sum(memory_usage_bytes) FROM duckdb_memory()").fetchone()[0]
    assert release_cached_blocks(con) is True
    assert con.execute("SELECT sum(memory_usage_bytes) FROM duckdb_memory()").fetchone()[0] < cached
    assert con.execute("SELECT current_setting('memory_limit')").fetchone()[0] == default
    assert con.execute("SELECT sum(i), count(DISTINCT s) FROM store.t").fetchall() == want
    pending = con.cursor()
    pending.execute("SELECT i FROM store.t ORDER BY i DESC")
    release_cached_blocks(con)  # a result still open on another cursor: lowered or not, nothing fails
    assert pending.fetchone() == (999_999,)
    assert con.execute("SELECT current_setting('memory_limit')").fetchone()[0] == default


def test_purge_freed_memory_sets_the_allocators_threads_and_queries_answer_as_before():
    """store/duckdb_core.purge_freed_memory (issue 41, the writer's close): DuckDB's allocator
    purges on threads of its own from then on; a query answers as before it."""
    import duckdb

    from tierdiag.store.duckdb_core import purge_freed_memory

    con = duckdb.connect(":memory:", config={"threads": 1})
    want = con.execute("SELECT sum(range), count(DISTINCT range % 7) FROM range(100000)").fetchall()
    assert purge_freed_memory(con) is True
    assert con.execute("SELECT current_setting('allocator_background_threads')").fetchone()[0] is True
    assert con.execute("SELECT sum(range), count(DISTINCT range % 7) FROM range(100000)").fetchall() == want
    assert purge_freed_memory(con) is True  # set twice: as once


def test_purge_from_now_keeps_one_idle_instance_and_queries_answer_as_before():
    """store/duckdb_core.purge_from_now (issue 41, the writer process from the start of recording):
    one idle instance held, asked again it opens no other, and a connection opened after answers
    as before."""
    import duckdb

    from tierdiag.store import duckdb_core

    assert duckdb_core.purge_from_now() is True
    held = list(duckdb_core._PURGING)
    assert len(held) == 1 and duckdb_core.purge_from_now() is True and duckdb_core._PURGING == held
    con = duckdb.connect(":memory:", config={"threads": 1})
    assert con.execute("SELECT sum(range) FROM range(1000)").fetchone() == (499500,)



@settings(max_examples=40, deadline=None)
@given(threads=st.one_of(st.integers(-2**70, 2**70), st.sampled_from([-1, 0, 1, 2, 3, 2**63])),
       cpus=st.integers(1, 64), had=st.integers(1, 4))
def test_alone_threads_raises_to_at_most_the_cap_and_the_cpus_and_restore_undoes_it(threads, cpus, had):
    """store/duckdb_core.alone_threads (issue 41: a large run's request lookup on the idle core):
    whatever it is asked (negative, zero, one, past int64) the instance runs on
    min(asked, ALONE_THREADS, the usable CPUs) threads where that is more than it had, and is left
    as it was otherwise (None); restore_threads puts back what it had; a query answers the same."""
    import os
    from unittest import mock

    import duckdb

    from tierdiag.store import duckdb_core

    con = duckdb.connect(":memory:", config={"threads": had})
    want = con.execute("SELECT sum(range), count(DISTINCT range % 7) FROM range(100000)").fetchall()
    with mock.patch.object(os, "sched_getaffinity", lambda pid: set(range(cpus))):
        got = duckdb_core.alone_threads(con, threads)
    n = min(threads, duckdb_core.ALONE_THREADS, cpus)
    now = con.execute("SELECT current_setting('threads')").fetchone()[0]
    if n > had:
        assert got == had and now == n
    else:
        assert got is None and now == had
    assert con.execute("SELECT sum(range), count(DISTINCT range % 7) FROM range(100000)").fetchall() == want
    if got is not None:
        duckdb_core.restore_threads(con, got)
    assert con.execute("SELECT current_setting('threads')").fetchone()[0] == had
    con.close()


def test_the_request_lookup_written_on_two_threads_is_the_one_written_on_one(tmp_path):
    """store/lookup.py's rows (a hash and a sort by (bucket, seq) of every request id) written with
    the instance on two threads (the writer's close of a large run, issue 41) are the rows written
    on one, in the same order (rowid)."""
    import duckdb

    from tierdiag.store import duckdb_core
    from tierdiag.store.evidence import begin_run_evidence

    src = tmp_path / "src.duckdb"
    with duckdb.connect(str(src)) as con:
        con.execute("CREATE TABLE requests AS SELECT 'r' AS run_id, 'sess' || (range * 7919 % 300007)::VARCHAR "
                    "|| '-turn' || (range % 13)::VARCHAR AS req_id, range AS seq FROM range(300000)")
    rows = []
    for threads in (1, 2):
        db = tmp_path / f"t{threads}.duckdb"
        db.write_bytes(src.read_bytes())
        con = duckdb.connect(":memory:", config={"threads": 1})
        con.execute(f"ATTACH '{db}' AS s")
        con.execute("USE s")
        had = duckdb_core.alone_threads(con, threads)
        assert (had is None) == (threads == 1 or len(__import__("os").sched_getaffinity(0)) < 2)
        begin_run_evidence(con, "r")
        if had is not None:
            duckdb_core.restore_threads(con, had)
        con.execute("COMMIT")
        rows.append(con.execute("SELECT bucket, req_id, seq FROM request_lookup ORDER BY rowid").fetchall())
        con.close()
    assert len(rows[0]) == 300000 and rows[0] == rows[1]
    assert rows[0] == sorted(rows[0], key=lambda r: (r[0], r[2]))


def test_purge_from_now_asks_on_the_named_connection_and_opens_no_instance(monkeypatch):
    """store/duckdb_core.purge_on (issue 41, session 36: the writer process held a second DuckDB
    instance, ~15 ms of its CPU and ~8 threads, to set a setting that is the process's): with a
    connection named, the setting is asked on it and no instance is opened; one named and closed
    since (a writer whose let-go failed) is passed over for an idle instance of its own, as
    without one; None names none."""
    import duckdb

    from tierdiag.store import duckdb_core

    monkeypatch.setattr(duckdb_core, "_PURGING", [])
    monkeypatch.setattr(duckdb_core, "_LIFELONG", [])
    host = duckdb.connect(":memory:", config={"threads": 1})
    want = host.execute("SELECT sum(range), count(DISTINCT range % 7) FROM range(100000)").fetchall()
    duckdb_core.purge_on(host)
    real_connect = duckdb.connect
    with monkeypatch.context() as m:
        m.setattr(duckdb, "connect", lambda *a, **k: pytest.fail("purge_from_now opened an instance"))
        assert duckdb_core.purge_from_now() is True
        assert duckdb_core._PURGING == [host] and duckdb_core.purge_from_now() is True
    assert host.execute("SELECT current_setting('allocator_background_threads')").fetchone()[0] is True
    assert host.execute("SELECT sum(range), count(DISTINCT range % 7) FROM range(100000)").fetchall() == want

    gone = real_connect(":memory:", config={"threads": 1})
    gone.close()
    monkeypatch.setattr(duckdb_core, "_PURGING", [])
    duckdb_core.purge_on(gone)
    assert duckdb_core.purge_from_now() is True
    (own,) = duckdb_core._PURGING
    assert own is not gone and own.execute("SELECT current_setting('allocator_background_threads')").fetchone()[0]

    duckdb_core.purge_on(None)
    assert duckdb_core._LIFELONG == []
