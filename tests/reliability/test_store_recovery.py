"""Stores that are half made, damaged, or filled up: what a replay and the readers do with them.

A file with no complete schema and no run (0 bytes, an empty DuckDB file, a schema cut short) is
not foreign: a replay finishes it. A damaged store (cut short, a flipped bit, a table or column
missing) is exit 4 "damaged" for every reader, and a replay refuses it before writing a byte.
A disk that fills up mid-run: the run says exactly how many requests the file holds.
"""

from __future__ import annotations

import os
import shutil

import duckdb
import pytest

import functools

from harness import SMALL, WRITERS, bug_from, disk_full_after, good_lines, on_request_flush, runs, sql, write_trace

from tests.support.cli import tierdiag_in_process
from tierdiag.config.engine import EngineConfig
from tierdiag.errors import OutputError, StoreError
from tierdiag.app.replay import replay
from tierdiag.store.schema import create_statements

CFG = EngineConfig(model="tiny", gpu="cpu", device_tokens=4096)


def _replay(trace, db, **kw):
    return replay(trace, CFG, db=db, run_name=kw.pop("run_name", "r"), probes=True, skip_bad=False, **kw)


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return write_trace(tmp_path_factory.mktemp("t") / "t.jsonl", good_lines(12))


@pytest.fixture(scope="module")
def store(tmp_path_factory, trace):
    db = tmp_path_factory.mktemp("s") / "store.duckdb"
    _replay(trace, db)
    return db


def zero_bytes(path):
    path.write_bytes(b"")


def empty_duckdb(path):
    duckdb.connect(str(path)).close()


def half_made(path):
    # What an older tierdiag left when killed while creating a store: some tables, no meta row.
    with duckdb.connect(str(path)) as con:
        for stmt in create_statements()[:3]:
            con.execute(stmt)


@pytest.mark.parametrize("make", [zero_bytes, empty_duckdb, half_made])
def test_a_file_with_no_schema_and_no_run_takes_a_replay(tmp_path, trace, make):
    db = tmp_path / "new.duckdb"
    make(db)
    listed = tierdiag_in_process("runs", "--db", db)  # no run listed, and said (test_no_runs.py)
    assert listed.code == 0 and listed.out.startswith(f"{db} has no runs yet"), listed
    tierdiag_in_process("summary", "--db", db).fails(4, str(db), "has no runs yet")
    summary = _replay(trace, db)
    assert summary.status == "complete"
    (run,) = runs(db, process=False)
    assert run["status"] == "complete" and run["num_requests"] == 12


def test_a_half_made_file_with_a_foreign_table_stays_refused(tmp_path, trace):
    db = tmp_path / "mixed.duckdb"
    half_made(db)
    with duckdb.connect(str(db)) as con:
        con.execute("CREATE TABLE measurements (t BIGINT)")
    with pytest.raises(StoreError, match="not a tierdiag run store"):
        _replay(trace, db)


def truncated(path):
    os.truncate(path, path.stat().st_size // 2)


def bit_flipped(path):
    """Flip one byte inside a block that holds the requests table (found from DuckDB's own map)."""
    with duckdb.connect(str(path), read_only=True) as con:
        (block, offset), = con.execute(
            "SELECT block_id, block_offset FROM pragma_storage_info('requests') WHERE block_id >= 0 "
            "ORDER BY block_id, block_offset LIMIT 1").fetchall()
        block_size = con.execute("SELECT block_size FROM pragma_database_size()").fetchall()[0][0]
    pos = 3 * 4096 + block * block_size + 8 + offset + 16  # file header, then blocks (checksum first)
    with open(path, "r+b") as fh:
        fh.seek(pos)
        byte = fh.read(1)
        fh.seek(pos)
        fh.write(bytes([byte[0] ^ 0xFF]))


def table_dropped(path):
    with duckdb.connect(str(path)) as con:
        con.execute("DROP TABLE transfers")


def column_dropped(path):
    with duckdb.connect(str(path)) as con:
        con.execute("ALTER TABLE requests DROP COLUMN ttft_ns")


@pytest.mark.parametrize("damage", [truncated, bit_flipped, table_dropped, column_dropped])
def test_a_damaged_store_is_exit_4_for_readers_and_refused_by_a_replay(tmp_path, store, trace, damage):
    db = tmp_path / "d.duckdb"
    shutil.copy(store, db)
    damage(db)
    # The runs table, then a request's rows, then every request's. A flip inside a requests block
    # shows only to a reader of those rows: `runs` reads a complete run's count from its own row
    # (DuckDB checks a block's checksum when it reads the block).
    readers = (("slow",), ("explain", "1")) if damage is bit_flipped else (("runs",), ("explain", "1"), ("slow",))
    for args in readers:
        tierdiag_in_process(*args, "--db", db).fails(4, "d.duckdb", "damaged")
    before = db.read_bytes()
    r = tierdiag_in_process("replay", trace, "--db", db, *SMALL)
    r.fails(4, "d.duckdb", "damaged")
    assert db.read_bytes() == before, "the replay wrote into a damaged store"


def test_a_runs_row_that_is_not_json_is_damage_not_a_bug(tmp_path, store):
    db = tmp_path / "j.duckdb"
    shutil.copy(store, db)
    with duckdb.connect(str(db)) as con:
        con.execute("UPDATE runs SET config_json = '{not json'")
    tierdiag_in_process("summary", "--db", db).fails(4, "j.duckdb", "damaged", "not JSON")


def test_database_in_a_missing_folder_is_created_like_every_output(tmp_path, trace):
    db = tmp_path / "no" / "such" / "r.duckdb"
    _replay(trace, db)
    assert runs(db, process=False)[0]["status"] == "complete"


def test_database_under_a_file_is_exit_6_naming_it(tmp_path, trace):
    (tmp_path / "afile").write_text("x")
    r = tierdiag_in_process("replay", trace, "--db", tmp_path / "afile" / "r.duckdb", *SMALL)
    r.fails(6, "afile")


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("ok_flushes", [0, 2], ids=["at-the-end", "mid-run"])
def test_disk_full_counts_what_the_file_holds(tmp_path, monkeypatch, ok_flushes, writer):
    """The message and runs.num_requests say how many requests the file holds, not how many the
    engine got to (before: '8,192 requests recorded' with 0 rows in the file); inline, or with
    the disk filling under the writer process."""
    monkeypatch.setenv("TIERDIAG_FLUSH_EVERY_S", "0")
    trace = tmp_path / "t.jsonl"
    assert tierdiag_in_process("synth", trace, "--requests", "1200", "--seed", "4").code == 0
    db = tmp_path / "r.duckdb"
    on_request_flush(monkeypatch, functools.partial(disk_full_after, ok_flushes), writer=writer, tmp_path=tmp_path)
    cfg = EngineConfig(model="tiny", gpu="cpu", device_tokens=65536)
    with pytest.raises(OutputError, match="no space left") as exc:
        replay(trace, cfg, db=db, run_name="full", probes=True, skip_bad=False)
    monkeypatch.undo()
    recorded = sql(db, "SELECT count(*) FROM requests")[0][0]
    assert (recorded > 0) == (ok_flushes > 0)
    # The raw column, not the reader's view of it (a reader recounts the rows of a failed run).
    assert sql(db, "SELECT status, num_requests FROM runs") == [("failed", recorded)]
    assert f"as failed, {recorded:,} request" in exc.value.one_line()


@pytest.mark.parametrize("writer", WRITERS)
def test_a_final_flush_that_fails_with_a_bug_marks_the_run_failed_and_keeps_earlier_rows(tmp_path, monkeypatch,
                                                                                          writer):
    """Not only write errors: whatever the final flush raises, the run is not left running (and a
    bug in the writer process is raised in the replay's, as the same exception)."""
    monkeypatch.setenv("TIERDIAG_FLUSH_EVERY_S", "0")
    trace = tmp_path / "t.jsonl"
    assert tierdiag_in_process("synth", trace, "--requests", "700", "--seed", "4").code == 0
    db = tmp_path / "r.duckdb"
    # 700 requests: flushes at 256 and 512, then the final one
    on_request_flush(monkeypatch, functools.partial(bug_from, 3), writer=writer, tmp_path=tmp_path)
    with pytest.raises(ValueError, match="a bug in the final flush"):
        replay(trace, EngineConfig(model="tiny", gpu="cpu", device_tokens=65536), db=db, run_name="x",
               probes=True, skip_bad=False)
    monkeypatch.undo()
    (status, n, error), = sql(db, "SELECT status, num_requests, error FROM runs")
    assert status == "failed" and "a bug in the final flush" in error
    assert n == sql(db, "SELECT count(*) FROM requests")[0][0] >= 512
