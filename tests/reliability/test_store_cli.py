"""The run store seen from the CLI: missing, foreign, other-version, busy and unwritable files,
unknown runs and requests. Readers answer with one line and exit 4 (5 for an unknown request);
a replay refuses to write into a file that is not its own, and to a place it cannot write."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time

import duckdb
import pytest

from harness import ROOMY, SMALL, holder, line, runs, sql, tierdiag, write_trace

from tests.support.cli import tierdiag_in_process
from tests.support.mounts import read_only_folder, tmpfs
from tierdiag.store.schema import SCHEMA_VERSION

READERS = [("runs",), ("summary",), ("slow",), ("explain", "1")]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A real replay of 24 requests with string ids, named 'conversation'."""
    root = tmp_path_factory.mktemp("store")
    ids = [f"sess-{s}-turn-{t}" for s in range(6) for t in range(4)]
    lines = [line(100 * i, 600 + 100 * (i % 4), [0, 1000 + i], id=rid) for i, rid in enumerate(ids)]
    trace = write_trace(root / "conversation.jsonl", lines)
    db = root / "store.duckdb"
    r = tierdiag_in_process("replay", trace, "--db", db, *SMALL)
    assert r.code == 0, r.err
    return db


@pytest.fixture
def junk_files(tmp_path):
    text = tmp_path / "text.duckdb"
    text.write_text("id,name\n1,a\n")
    noise = tmp_path / "noise.duckdb"
    noise.write_bytes(os.urandom(64 * 1024))
    # A 0-byte file is not foreign: it holds nothing, and a replay takes it (test_store_recovery).
    return [text, noise]


def foreign_duckdb(path):
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE measurements (t BIGINT, value DOUBLE)")
        con.execute("INSERT INTO measurements VALUES (1, 2.5)")
    return path


def with_schema_version(store, path, version: int):
    shutil.copy(store, path)
    with duckdb.connect(str(path)) as con:
        con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(version)])
    return path


@pytest.mark.parametrize("args", READERS, ids=[a[0] for a in READERS])
def test_missing_database(tmp_path, args):
    tierdiag_in_process(*args, "--db", tmp_path / "none.duckdb").fails(4, "no database at", "none.duckdb",
                                                                      "tierdiag replay")


@pytest.mark.parametrize("args", READERS, ids=[a[0] for a in READERS])
def test_files_that_are_not_duckdb(junk_files, args):
    for junk in junk_files:
        tierdiag_in_process(*args, "--db", junk).fails(4, str(junk), "is not a DuckDB database")


def test_database_path_is_a_folder(tmp_path):
    tierdiag_in_process("runs", "--db", tmp_path).fails(4, str(tmp_path), "folder")
    tierdiag_in_process("replay", write_trace(tmp_path / "t.jsonl", [line(0, 900, [1, 2])]), "--db", tmp_path,
                        *SMALL).fails(6, str(tmp_path), "folder")


@pytest.mark.parametrize("args", READERS, ids=[a[0] for a in READERS])
def test_duckdb_file_that_is_not_a_run_store(tmp_path, args):
    db = foreign_duckdb(tmp_path / "other.duckdb")
    tierdiag_in_process(*args, "--db", db).fails(4, str(db), "not a tierdiag run store")


def test_store_from_another_schema_version_says_which_and_what_to_do(tmp_path, store):
    newer = with_schema_version(store, tmp_path / "newer.duckdb", SCHEMA_VERSION + 1)
    from tierdiag.store.schema import OLDEST_READABLE_VERSION

    readable = f"reads v{OLDEST_READABLE_VERSION} to v{SCHEMA_VERSION}"
    tierdiag_in_process("summary", "--db", newer).fails(4, f"schema v{SCHEMA_VERSION + 1}", readable,
                                                        "upgrade tierdiag")
    # Older than the oldest version this tierdiag still reads (a newer schema's added columns read
    # as NULL from the ones after it: tests/diagnose/test_sessions.py).
    older = with_schema_version(store, tmp_path / "older.duckdb", OLDEST_READABLE_VERSION - 1)
    tierdiag_in_process("explain", "1", "--db", older).fails(
        4, f"schema v{OLDEST_READABLE_VERSION - 1}", readable, "re-run `tierdiag replay`", "new --db")


def test_replay_never_writes_into_a_file_that_is_not_its_store(tmp_path, store, junk_files):
    trace = write_trace(tmp_path / "t.jsonl", [line(0, 900, [1, 2])])
    foreign = foreign_duckdb(tmp_path / "other.duckdb")
    newer = with_schema_version(store, tmp_path / "newer.duckdb", SCHEMA_VERSION + 1)
    cases = [(j, "not a DuckDB database") for j in junk_files] + [
        (foreign, "not a tierdiag run store"), (newer, f"schema v{SCHEMA_VERSION + 1}")]
    for path, fragment in cases:
        before = path.read_bytes()
        tierdiag_in_process("replay", trace, "--db", path, *SMALL).fails(4, str(path), fragment)
        assert path.read_bytes() == before, f"{path.name} was modified"
    assert sql(foreign, "SELECT * FROM measurements") == [(1, 2.5)]


def test_unknown_run_suggests_close_names(store):
    tierdiag_in_process("summary", "--db", store, "--run", "conversaton").fails(
        4, "no run 'conversaton'", "did you mean", "conversation")
    tierdiag_in_process("slow", "--db", store, "--run", "zzzzzz").fails(4, "no run 'zzzzzz'", "tierdiag runs")


def test_unknown_request_id_suggests_close_ids(store):
    tierdiag_in_process("explain", "sess-3-turn2", "--db", store).fails(
        5, "no request 'sess-3-turn2'", "did you mean", "sess-3-turn-2")
    tierdiag_in_process("explain", "zzz", "--db", store).fails(5, "no request 'zzz'")


def test_a_store_held_by_a_writer_is_reported_busy(tmp_path, store, monkeypatch):
    import tierdiag.store.reader as reader

    db = tmp_path / "s.duckdb"
    shutil.copy(store, db)
    # The reader retries for 0.3 s, not its 3 s, before it says busy (the same retries and answer;
    # the holder never lets go inside the block, so the 2.7 s more were idle time).
    monkeypatch.setitem(reader.connect_with_retry.__kwdefaults__, "wait_s", 0.3)
    with holder(db, read_only=False) as pid:
        tierdiag_in_process("runs", "--db", db).fails(4, str(db), "is busy", f"process {pid}")
    assert runs(db, process=False)[0]["status"] == "complete"  # and once it lets go, readers are back


def test_readers_share_the_file(tmp_path, store):
    db = tmp_path / "s.duckdb"
    shutil.copy(store, db)
    with holder(db, read_only=True):
        assert runs(db, process=False)[0]["name"] == "conversation"


@contextlib.contextmanager
def _writes_refused(path):
    """`refused(n)` returns once `path` was opened for writing and closed `n` times since the block
    began (inotify's IN_CLOSE_WRITE: a replay's write open that DuckDB's lock refused, closed at
    once; a read-only open is IN_CLOSE_NOWRITE); where inotify is missing, after 5 s instead. It
    replaced a fixed 5 s sleep, which was idle time, and no proof the replay had tried yet."""
    import ctypes
    import select
    import struct

    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_CLOEXEC) if hasattr(libc, "inotify_init1") else -1
    if fd < 0 or libc.inotify_add_watch(fd, os.fsencode(path), 0x08) < 0:  # 0x08: IN_CLOSE_WRITE
        if fd >= 0:
            os.close(fd)
        yield lambda n: time.sleep(5)
        return

    def refused(n: int) -> None:
        seen, deadline = 0, time.monotonic() + 240
        while seen < n:
            assert select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0], \
                f"{path}: {seen} refused write opens in 240 s, not {n}"
            data = os.read(fd, 4096)
            while data:  # struct inotify_event: wd, mask, cookie, len, then len bytes of name
                _, mask, _, size = struct.unpack_from("iIII", data)
                seen += bool(mask & 0x08)
                data = data[16 + size:]

    try:
        yield refused
    finally:
        os.close(fd)


@pytest.mark.slow
def test_a_replay_waits_for_a_reader_to_let_go(tmp_path, store):
    """DuckDB keeps a writer out while a reader holds the file: the replay waits, then writes."""
    db = tmp_path / "s.duckdb"
    shutil.copy(store, db)
    trace = write_trace(tmp_path / "t.jsonl", [line(10 * i, 900, [1, 2 + i]) for i in range(10)])
    with holder(db, read_only=True), _writes_refused(db) as refused:
        proc = subprocess.Popen([sys.executable, "-c", "from tierdiag.cli.main import main; main()", "replay",
                                 str(trace), "--db", str(db), *SMALL], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        refused(2)  # the replay found the file held, and tried again: it waits
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert [r["status"] for r in runs(db, process=False)] == ["complete", "complete"]
    assert sql(db, "SELECT count(*) FROM requests WHERE run_id = ?", [runs(db, process=False)[1]["run_id"]]) == [(10,)]


def test_database_in_a_missing_folder_is_created(tmp_path):
    """The rule for every output (-o, export, synth, calibrate -o, --db): missing folders are made."""
    trace = write_trace(tmp_path / "t.jsonl", [line(0, 900, [1, 2])])
    db = tmp_path / "no" / "such" / "r.duckdb"
    assert tierdiag_in_process("replay", trace, "--db", db, *SMALL).code == 0
    assert runs(db, process=False)[0]["status"] == "complete"


def test_database_in_a_read_only_folder(tmp_path):
    trace = write_trace(tmp_path / "t.jsonl", [line(0, 900, [1, 2])])
    with read_only_folder(tmp_path) as folder:
        tierdiag_in_process("replay", trace, "--db", folder / "r.duckdb", *SMALL).fails(6, str(folder / "r.duckdb"),
                                                                                       "writ")
        assert not (folder / "r.duckdb").exists()


@pytest.mark.parametrize("in_process", [False, True], ids=["process", "in-process"])
def test_disk_full_during_replay(tmp_path, in_process):
    """A real full disk (a 512 KiB tmpfs): the replay stops with one line, exit 6, and the
    store it leaves is still readable, its run not marked complete. As a process: what its end
    leaves (the writer child reaped, the run closed). In this process (a library caller, which
    lives on): the run is already closed as failed when the command returns (the runs row was
    committed, then the file's checkpoint failed: store/writer.py `_close_unopened`), never
    `running` (a reader shows a running run as interrupted only once its process is gone)."""
    trace = tmp_path / "t.jsonl"
    assert tierdiag_in_process("synth", trace, "--requests", "400", "--seed", "2").code == 0
    with tmpfs(tmp_path / "full", "size=512k") as folder:
        db = folder / "r.duckdb"
        (tierdiag_in_process if in_process else tierdiag)("replay", trace, "--db", db, *ROOMY).fails(
            6, str(db), "no space left")
        listed = tierdiag_in_process("runs", "--db", db, "--json")
        if listed.code == 0:
            statuses = [r["status"] for r in listed.json()]
            assert statuses in ((["failed"],) if in_process else (["failed"], ["interrupted"])), statuses
        else:  # the file never got past its header: still a clean answer
            listed.fails(4, str(db))


def test_debug_shows_the_traceback(tmp_path):
    r = tierdiag("--debug", "runs", "--db", tmp_path / "none.duckdb")
    assert r.code != 0 and "Traceback" in r.err and "StoreError" in r.err


# --- an output that is one of the command's inputs or its store (issue 32, item 1) ---------------

def _export(folder):
    sys.path.insert(0, str(REPO_ROOT))
    from tests.importers.sglang_export import record, write_export

    return write_export(folder, "20251201_09", [record("a", prompt=4, tokens=[1, 2, 3, 4], arrival_s=1.0)])


REPO_ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


@pytest.fixture
def shared_store(tmp_path, store):
    """A copy of the store, one hard link and one symbolic link to it, and its run count."""
    db = tmp_path / "s.duckdb"
    shutil.copy(store, db)
    os.link(db, tmp_path / "hard.duckdb")
    os.symlink(db, tmp_path / "soft.duckdb")
    return db, sql(db, "SELECT count(*) FROM runs")[0][0], os.stat(db).st_size


@pytest.mark.parametrize("name", ["s.duckdb", "hard.duckdb", "soft.duckdb"])
@pytest.mark.parametrize("command", ["import --trace-out", "report -o"])
def test_an_output_that_is_the_store_is_refused_through_links_too(tmp_path, shared_store, name, command):
    db, n_runs, size = shared_store
    out = tmp_path / name
    if command == "report -o":
        args = ("report", "--db", db, "-o", out)
    else:
        args = ("import", "sglang", _export(tmp_path / "export"), "--db", db, "--trace-out", out)
    tierdiag_in_process(*args).fails(2, f"{out}", "same file as --db", "refusing to write over")
    assert sql(db, "SELECT count(*) FROM runs")[0][0] == n_runs and os.stat(db).st_size == size


def test_an_output_that_is_an_input_is_refused(tmp_path):
    export = _export(tmp_path / "export")
    before = export.read_bytes()
    tierdiag_in_process("import", "sglang", export.parent, "--db", tmp_path / "o.duckdb", "--trace-out", export).fails(
        2, "--trace-out", "same file as an export file")
    tierdiag_in_process("import", "sglang", export.parent, "--db", export).fails(2, "--db",
                                                                                 "same file as an export file")
    trace = write_trace(tmp_path / "t.jsonl", [line(0, 1000, [0, 1])])
    tierdiag_in_process("replay", trace, "--db", trace, *SMALL).fails(2, "--db", "same file as TRACE")
    tierdiag_in_process("sweep", trace, "--set", "seed=1,2", "--db", trace, *()).fails(2, "--db", "same file as TRACE")
    assert export.read_bytes() == before and trace.read_text().count("\n") == 1
    assert not (tmp_path / "o.duckdb").exists()


def test_nothing_but_a_store_replaces_a_duckdb_file(tmp_path, shared_store):
    db, n_runs, size = shared_store
    other = tmp_path / "other.duckdb"
    shutil.copy(db, other)
    tierdiag_in_process("report", "--db", db, "-o", other).fails(2, f"-o {other}", "DuckDB database")
    tierdiag_in_process("synth", other, "--requests", "5").fails(2, f"{other}", "DuckDB database")
    tierdiag_in_process("import", "sglang", _export(tmp_path / "export"), "--db", tmp_path / "o.duckdb",
                        "--trace-out", other).fails(2, f"--trace-out {other}", "DuckDB database")
    assert sql(other, "SELECT count(*) FROM runs")[0][0] == n_runs


def test_trace_out_creates_its_parent_folders(tmp_path):
    """The contract's rule for outputs; it was exit 6 for --trace-out new/sub/t.jsonl."""
    out = tmp_path / "new" / "sub" / "t.jsonl"
    r = tierdiag_in_process("import", "sglang", _export(tmp_path / "export"), "--db", tmp_path / "o.duckdb",
                            "--trace-out", out)
    assert r.code == 0, r.err
    assert out.read_text().count("\n") == 1
