"""The writer process's start (store/writer_serve.py `_Serve.open`, app/writer_child.py; issue 41,
session 36): one DuckDB instance in the process (the allocator's purge asked on the writer's own),
the run's trace counted once (the late writes' count, which the story's fold asks too), and the
collector held off through the imports and settled once the store is open."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from tests.support import bad_stores
from tierdiag.store import duckdb_core, writer_serve
from tierdiag.store.frames import read_frame
from tierdiag.store.reader import open_store

_ENV = {**os.environ, "PYTHONPATH": str(Path(writer_serve.__file__).resolve().parents[2])}


def _args(tmp_path, trace_path="/t.jsonl") -> dict:
    return {"db_path": str(tmp_path / "s.duckdb"), "run_id": "r1", "name": "s", "trace_path": trace_path,
            "trace_sha256": "", "config": {}, "hardware": {}, "data_plane": {}, "timing": "modeled"}


def test_the_allocators_purge_is_asked_on_the_writers_own_instance(tmp_path, monkeypatch):
    """What starts while recording (size_curves.read_ahead) asks DuckDB to purge for the whole
    process: on the writer's own connection, no second instance opened; the writes after it
    commit as before, and the setting holds through them."""
    import duckdb

    monkeypatch.setattr(duckdb_core, "_PURGING", [])
    monkeypatch.setattr(duckdb_core, "_LIFELONG", [])
    order = []

    def while_recording(run):
        real = duckdb.connect
        duckdb.connect = lambda *a, **k: pytest.fail("a second DuckDB instance")
        try:
            assert duckdb_core.purge_from_now() is True
        finally:
            duckdb.connect = real
        order.append("while_recording")

    r, w = os.pipe()
    serve = writer_serve._Serve(inbox=None, reply_fd=w, while_recording=while_recording,
                                opened=lambda: order.append("opened"))
    assert serve.open({"writer": _args(tmp_path), "write_every_s": 1.0})
    assert read_frame(r) == ("opened", None)
    assert order == ["while_recording", "opened"]
    host = serve.writer.host
    assert duckdb_core._PURGING == [host]
    serve.writer.take({"requests": {"req_id": ["a", "b"], "seq": [0, 1], "arrival_ns": [0, 10]}})
    serve.write()
    assert not serve.failed and not serve.writer.pending
    assert host.execute("SELECT current_setting('allocator_background_threads')").fetchone()[0] is True
    serve.writer.close()
    with open_store(tmp_path / "s.duckdb") as con:
        assert con.execute("SELECT count(*) FROM requests").fetchone() == (2,)
    os.close(r)
    os.close(w)


def test_a_store_that_cannot_be_opened_settles_nothing_and_names_no_connection(tmp_path, monkeypatch):
    """The open fails (a file that is not a store): one open_failed answer, nothing started,
    the `opened` hook not called, no connection named for the purge."""
    monkeypatch.setattr(duckdb_core, "_LIFELONG", [])
    (tmp_path / "s.duckdb").write_bytes(b"not a database at all" * 100)
    called = []
    r, w = os.pipe()
    serve = writer_serve._Serve(inbox=None, reply_fd=w, while_recording=lambda run: called.append("wr"),
                                opened=lambda: called.append("opened"))
    assert not serve.open({"writer": _args(tmp_path), "write_every_s": 1.0})
    kind, exc = read_frame(r)
    assert kind == "open_failed" and "not a DuckDB database" in str(exc)
    assert called == [] and duckdb_core._LIFELONG == []
    os.close(r)
    os.close(w)


def _join_counts():
    for thread in threading.enumerate():
        if thread.name == "tierdiag-trace-lines":
            thread.join(10)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")), max_size=40), st.booleans())
def test_the_trace_is_counted_once_and_its_count_handed_to_who_asks(tmp_path_factory, lines, last_newline):
    """The writer's count of its run's trace (`_count_trace`, on a thread) is what `trace_lines`
    answers for that file afterwards, without counting again (the story's fold asks it at the
    same open: ~0.13 s of CPU a count at 1M requests); the same as a count of its own, whatever
    the bytes (NULs, invalid UTF-8, no last newline)."""
    path = tmp_path_factory.mktemp("count") / "t.jsonl"
    path.write_bytes(b"\n".join(lines) + (b"\n" if last_newline and lines else b""))
    want = writer_serve._count_lines(str(path))[1]
    saved = list(writer_serve._SHARED)
    real = writer_serve._count_lines
    try:
        serve = writer_serve._Serve(inbox=None, reply_fd=-1)
        serve._count_trace(str(path))
        _join_counts()
        assert serve.expected == want
        writer_serve._count_lines = lambda p: pytest.fail("counted again")
        assert writer_serve.trace_lines(str(path)) == want
    finally:
        writer_serve._count_lines = real
        writer_serve._SHARED[:] = saved


def test_a_changed_or_other_file_is_counted_anew_and_a_count_in_progress_is_waited_for(tmp_path, monkeypatch):
    monkeypatch.setattr(writer_serve, "_SHARED", [])
    trace = tmp_path / "t.jsonl"
    trace.write_text("{}\n" * 5)
    serve = writer_serve._Serve(inbox=None, reply_fd=-1)
    serve._count_trace(str(trace))
    _join_counts()
    assert writer_serve.trace_lines(str(trace)) == 5
    other = tmp_path / "o.jsonl"
    other.write_text("{}\n" * 3)
    assert writer_serve.trace_lines(str(other)) == 3
    trace.write_text("{}\n" * 9)  # changed since its count: its size tells
    assert writer_serve.trace_lines(str(trace)) == 9
    trace.unlink()  # gone: counted (and found gone) by the caller, not the stale count
    assert writer_serve.trace_lines(str(trace)) is None
    for path in (None, ""):
        assert writer_serve.trace_lines(path) is None

    # A count not done yet: the caller waits for it rather than counting beside it.
    trace.write_text("{}\n" * 4)
    identity = writer_serve._count_lines(str(trace))[0]
    shared = writer_serve._SharedCount(str(trace))
    writer_serve._SHARED[:] = [shared]

    def finish_later():
        time.sleep(0.2)
        shared.identity, shared.lines = identity, 4
        shared.done.set()

    monkeypatch.setattr(writer_serve, "_count_lines", lambda p: pytest.fail("counted beside the count"))
    threading.Thread(target=finish_later).start()
    assert writer_serve.trace_lines(str(trace)) == 4
    assert shared.done.is_set()


def test_the_settle_freezes_the_start_and_runs_the_collector_again():
    """`_settle` (called once the store is open, in the writer process only: `main`): what the
    start made is out of the collector's passes, and the collector runs again where the entry
    (app/writer_child.py) held it off. In a process of its own: a freeze here would hold the test
    process's objects."""
    code = ("import gc\ngc.disable()\nfrom tierdiag.store.writer_serve import _settle\n"
            "before = gc.get_freeze_count()\n_settle()\n"
            "print(before, gc.get_freeze_count() > 1000, gc.isenabled())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=_ENV).stdout.split()
    assert out == ["0", "True", "True"]


def test_the_writer_entry_holds_the_collector_off_through_its_imports():
    """app/writer_child.py `main` disables the collector before its imports (duckdb, pyarrow,
    numpy, the close's modules); the serving loop's `main` settles it once the store is open
    (here: the entry run up to the serving loop, which is replaced by a probe)."""
    code = ("import gc, sys\nimport tierdiag.store.writer_serve as W\n"
            "def probe(after_commit=None, preload=(), while_recording=None):\n"
            "    print(gc.isenabled(), 'duckdb' in sys.modules, callable(after_commit), len(preload) > 0)\n"
            "W.main = probe\nfrom tierdiag.app.writer_child import main\nmain()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=_ENV).stdout.split()
    assert out == ["False", "True", "True", "True"]


def _writer_at(db):
    from tierdiag.store.writer import RunWriter

    return RunWriter(db, name="r", trace_path="t.jsonl", trace_sha256="ab" * 32, config={}, hardware={},
                     data_plane={}, timing="modeled", command_line=["tierdiag", "replay", "t.jsonl"])


def test_a_store_that_exists_is_checked_on_the_writers_own_instance(tmp_path, monkeypatch):
    """A replay into a store that holds runs checks it (ours, current, every block read back) with
    the file attached read-only to the writer's own connection: one DuckDB instance opened in all
    (the check opened one of its own before: ~15 ms of CPU), and the run written beside the
    earlier one."""
    import duckdb

    db = tmp_path / "s.duckdb"
    first = _writer_at(db)
    first.append({"requests": {"req_id": ["a"], "seq": [0], "arrival_ns": [0]}})
    first.finish("complete")
    first.close()
    opened = []
    real = duckdb.connect
    monkeypatch.setattr(duckdb, "connect", lambda *a, **k: opened.append(a[0] if a else k) or real(*a, **k))
    second = _writer_at(db)
    assert opened == [":memory:"]
    second.append({"requests": {"req_id": ["b", "c"], "seq": [0, 1], "arrival_ns": [0, 5]}})
    second.finish("complete")
    second.close()
    monkeypatch.setattr(duckdb, "connect", real)
    with open_store(db) as con:
        assert con.execute("SELECT count(*), count(DISTINCT run_id) FROM requests").fetchone() == (3, 2)


def _junk(path, store):
    path.write_text("id,name\n1,a\n")


def _damaged_block(path, store):
    import shutil

    shutil.copy(store, path)
    size = path.stat().st_size
    with open(path, "r+b") as fh:  # a block past the headers overwritten: its checksum fails when read
        fh.seek(size - 3 * 262144 if size > 4 * 262144 else size // 2)
        fh.write(b"\xa5" * 8192)


def _a_folder(path, store):
    path.mkdir()


@pytest.mark.parametrize("make", [_junk, bad_stores.foreign, bad_stores.newer, bad_stores.truncated,
                                  _damaged_block, _a_folder])
def test_the_check_on_the_writers_connection_refuses_as_its_own_connection_did(tmp_path, make):
    """Every file the check refuses is refused the same way attached to the writer's connection
    as opened on a connection of its own (the same error class, the same line, the same hint),
    the file unchanged, and the writer's connection left with nothing attached."""
    import duckdb

    from tierdiag.errors import TierdiagError
    from tierdiag.store.writer import check_before_writing

    store = tmp_path / "store.duckdb"
    w = _writer_at(store)
    w.append({"requests": {"req_id": [f"r{i}" for i in range(3000)], "seq": list(range(3000)),
                           "arrival_ns": list(range(3000))}})
    w.finish("complete")
    w.close()
    said = []
    for way in ("owns", "host"):  # folders of one length: a long line is cut at the same place
        path = tmp_path / way / "s.duckdb"
        path.parent.mkdir()
        make(path, store)
        before = path.read_bytes() if path.is_file() else None
        host = duckdb.connect(":memory:", config={"threads": 1}) if way == "host" else None
        with pytest.raises(Exception) as caught:
            check_before_writing(path, host=host)
        exc = caught.value
        said.append((type(exc), str(exc).replace(str(path), "DB"), getattr(exc, "hint", None)))
        assert isinstance(exc, (TierdiagError, duckdb.Error)), exc
        if before is not None:
            assert path.read_bytes() == before
        if host is not None:
            assert host.execute("SELECT current_database()").fetchone() == ("memory",)
            assert host.execute("SELECT count(*) FROM duckdb_databases() WHERE database_name = 'store'").fetchone() == (0,)
            host.close()
    assert said[0] == said[1]
