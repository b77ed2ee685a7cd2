"""The writer process's DuckDB memory through a run's writes (issue 41's 1M row): held at
writer_process.WRITE_MEMORY_LIMIT (store/duckdb_core.py `hold_memory`), what passes it spilled into
a folder of its own in the system's temporary directory (never the current directory), lifted for
the close (RunWriter.finish), the folder removed as the process ends."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierdiag.store import duckdb_core, writer_process, writer_serve
from tierdiag.store.schema import TABLES
from tierdiag.store.writer import RunWriter


@contextlib.contextmanager
def _system_tmp(path: Path):
    """`tempfile`'s directory (the system's temporary directory) set to `path` for the block."""
    path.mkdir(parents=True, exist_ok=True)
    was = tempfile.tempdir
    tempfile.tempdir = str(path)
    try:
        yield path
    finally:
        tempfile.tempdir = was


def _setting(con, name: str):
    return con.execute(f"SELECT current_setting('{name}')").fetchall()[0][0]


def _writer(db: Path) -> RunWriter:
    return RunWriter(db, name="m", trace_path="t.jsonl", trace_sha256="", config={}, hardware={}, data_plane={},
                     timing="modelled", command_line=["t"], let_rows_go=True)


def _spills(root: Path) -> list[Path]:
    return sorted(root.glob("tierdiag-spill-*"))


def test_hold_sets_the_limit_and_a_spill_folder_of_its_own_lift_and_remove_undo_it(tmp_path):
    con = duckdb.connect(":memory:", config={"threads": 1})
    default_limit, default_temp = _setting(con, "memory_limit"), _setting(con, "temp_directory")
    with _system_tmp(tmp_path / "sys") as sys_tmp:
        folder = duckdb_core.hold_memory(con, 64 << 20)
    assert folder is not None and Path(folder).parent == sys_tmp and Path(folder).is_dir()
    assert _setting(con, "memory_limit") == "64.0 MiB"
    assert _setting(con, "temp_directory") == folder
    duckdb_core.lift_memory(con)
    assert _setting(con, "memory_limit") == default_limit
    assert _setting(con, "temp_directory") == folder != default_temp  # later spills still land there
    duckdb_core.remove_spill(folder)
    assert not Path(folder).exists()
    duckdb_core.remove_spill(None)  # nothing to remove: nothing happens


_HOSTILE = st.one_of(st.integers(min_value=-(2**70), max_value=2**70), st.booleans(), st.none(),
                     st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
                     st.sampled_from([0, 1, -1, 2**63 - 1, 2**63, 2**64, 1 << 20, (64 << 20) - 1, 64 << 20, "256MB", 1.5e8]))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(limit=_HOSTILE)
def test_hold_takes_an_int_from_the_least_on_and_leaves_everything_as_it_was_for_anything_else(tmp_path, limit):
    """Whatever the limit: an int of at least HOLD_LEAST_BYTES is set as that many bytes or refused
    by DuckDB; every refusal (DuckDB's, or not such an int at all: a few bytes would leave the
    instance refusing its own settings query) leaves the instance's limit and spill folder at
    their defaults and no folder behind, and the instance answers."""
    con = duckdb.connect(":memory:", config={"threads": 1})
    default_limit, default_temp = _setting(con, "memory_limit"), _setting(con, "temp_directory")
    root = tmp_path / f"sys-{os.urandom(6).hex()}"
    with _system_tmp(root):
        folder = duckdb_core.hold_memory(con, limit)
    if folder is None:
        assert _setting(con, "memory_limit") == default_limit
        assert _setting(con, "temp_directory") == default_temp
        assert _spills(root) == []
    else:
        assert type(limit) is int and limit >= duckdb_core.HOLD_LEAST_BYTES
        assert con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0] != default_limit
        assert _setting(con, "temp_directory") == folder and Path(folder).parent == root
        duckdb_core.lift_memory(con)
        assert _setting(con, "memory_limit") == default_limit
        duckdb_core.remove_spill(folder)
        assert _spills(root) == []
    con.close()


def test_no_temporary_directory_to_make_it_in_sets_nothing(tmp_path):
    con = duckdb.connect(":memory:", config={"threads": 1})
    default_limit = _setting(con, "memory_limit")
    was = tempfile.tempdir
    tempfile.tempdir = str(tmp_path / "missing" / "deeper")
    try:
        assert duckdb_core.hold_memory(con, 64 << 20) is None
    finally:
        tempfile.tempdir = was
    assert _setting(con, "memory_limit") == default_limit


def _rows(start: int, n: int) -> dict:
    """Every column of the widest table (`requests`), `n` rows: what a limit must leave a write
    room to pin (each column's segment being appended, compressed, checkpointed)."""
    seq = np.arange(start, start + n, dtype=np.int64)
    cols = {}
    for col, typ in TABLES["requests"].items():
        if col == "run_id":
            continue
        t = typ.upper()
        if t in ("VARCHAR", "TEXT"):
            cols[col] = pc.cast(pa.array(seq % 997), pa.string())
        elif t in ("DOUBLE", "FLOAT", "REAL"):
            cols[col] = pa.array(seq.astype(np.float64) / 7.0)
        elif t == "BOOLEAN":
            cols[col] = pa.array(seq % 3 == 0)
        elif t.startswith("TIMESTAMP"):
            cols[col] = pa.array(seq * 1_000_000, type=pa.timestamp("us"))
        elif t == "INTEGER":
            cols[col] = pa.array((seq % 1_000_000).astype(np.int32))
        else:
            cols[col] = pa.array(seq % 1_000_003)
    return {"requests": cols}


def _write_run(db: Path, limit: int | None, sys_tmp: Path, *, writes: int = 2, rows: int = 125_000):
    with _system_tmp(sys_tmp):
        w = _writer(db)
        if limit is not None:
            assert w.hold_memory(writer_process.WRITE_MEMORY_LIMIT)
            w._host.execute(f"SET memory_limit = '{limit}B'")  # tighter than any hold: the margin tried
        for k in range(writes):
            w.take(_rows(k * rows, rows))
            w.write(vacuum=k % 2 == 1)  # vacuuming checkpoints too: they merge row groups in memory
        spill = w._spill
        seen = {}

        def hook(con, db_path, run_id, status):
            seen["limit"] = _setting(con, "memory_limit")
            return None

        w.finish("complete", after_commit=hook)
        w.close()
    return w, spill, seen


def test_a_run_written_under_the_limit_with_a_third_of_it_commits_every_row_and_spills_nowhere_else(tmp_path, monkeypatch):
    """Writes of every column of the widest table, a few row groups each, vacuuming every 2nd:
    under a third of WRITE_MEMORY_LIMIT (the margin the limit keeps over what a write pins: a
    statement whose pinned memory passes the limit fails) every row is committed, the same rows
    as without a limit; nothing lands in the current directory; the close's hook runs without
    the limit; the spill folder is gone once the writer is closed."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    margin = writer_process.WRITE_MEMORY_LIMIT // 3
    held, spill, seen = _write_run(tmp_path / "held.duckdb", margin, tmp_path / "sys")
    plain, _, plain_seen = _write_run(tmp_path / "plain.duckdb", None, tmp_path / "sys2")
    assert held.closed_as == plain.closed_as == "complete" and held.recorded == plain.recorded == 250_000
    default_limit = _setting(duckdb.connect(":memory:"), "memory_limit")
    assert seen["limit"] == plain_seen["limit"] == default_limit
    assert spill is not None and not Path(spill).exists() and _spills(tmp_path / "sys") == []
    assert list(cwd.iterdir()) == []  # no `.tmp` of DuckDB's in the user's folder
    cols = ", ".join(c for c in TABLES["requests"] if c != "run_id")
    with duckdb.connect(":memory:") as con:
        con.execute(f"ATTACH '{tmp_path / 'held.duckdb'}' AS held (READ_ONLY)")
        con.execute(f"ATTACH '{tmp_path / 'plain.duckdb'}' AS plain (READ_ONLY)")
        for a, b in (("held", "plain"), ("plain", "held")):
            assert con.execute(f"SELECT count(*) FROM (SELECT {cols} FROM {a}.requests EXCEPT ALL "
                               f"SELECT {cols} FROM {b}.requests)").fetchall() == [(0,)]


def test_a_limit_below_what_a_write_pins_fails_it_as_a_write_error(tmp_path, monkeypatch):
    """Why the limit keeps a margin: far below what a write of the widest table pins, DuckDB
    refuses the write (out of memory), which fails the run as a full disk would: one line."""
    monkeypatch.chdir(tmp_path)
    from tierdiag.errors import TierdiagError

    with _system_tmp(tmp_path / "sys"):
        w = _writer(tmp_path / "low.duckdb")
        assert not w.hold_memory(4 << 20)  # under HOLD_LEAST_BYTES: refused, nothing set
        assert w.hold_memory(duckdb_core.HOLD_LEAST_BYTES)
        w._host.execute("SET memory_limit = '4MB'")  # what the least keeps a write from
        w.take(_rows(0, 150_000))
        with pytest.raises(TierdiagError) as err:
            w.write()
        assert "\n" not in err.value.one_line()
        w.close()
    assert _spills(tmp_path / "sys") == []


def _opened_serve(tmp_path: Path, reply_fd: int) -> writer_serve._Serve:
    """The writer process's server, its run opened on a store in `tmp_path` (nothing taken yet)."""
    serve = writer_serve._Serve(inbox=None, reply_fd=reply_fd)
    args = {"db_path": str(tmp_path / "p.duckdb"), "name": "p", "trace_path": str(tmp_path / "none.jsonl"),
            "trace_sha256": "", "config": {}, "hardware": {}, "data_plane": {}, "timing": "modelled",
            "command_line": ["t"]}
    assert serve.open({"writer": args, "write_every_s": 1.0})
    return serve


def test_the_writer_process_holds_the_limit_once_a_table_has_a_row_group_and_finish_lifts_it(tmp_path, monkeypatch):
    """`_Serve.write` holds WRITE_MEMORY_LIMIT on the writer's instance from the first write at
    which a table of the run has VACUUM_ROWS rows (not before: a small run's writes run as
    without it); `finish` lifts it."""
    monkeypatch.chdir(tmp_path)
    r, w = os.pipe()
    try:
        with _system_tmp(tmp_path / "sys"):
            serve = _opened_serve(tmp_path, w)
            con = serve.writer._host
            default = _setting(duckdb.connect(":memory:"), "memory_limit")
            serve.rows_taken["requests"] = writer_process.VACUUM_ROWS - 1
            serve.write()
            assert _setting(con, "memory_limit") == default and serve.writer._spill is None  # short of a row group
            serve.expected = writer_process.VACUUM_ROWS - 1  # (the trace's lines, counted on a thread)
            serve.write()
            assert _setting(con, "memory_limit") == default and serve.writer._spill is None
            serve.rows_taken["evictions"] = writer_process.VACUUM_ROWS
            serve.write()
            limit = writer_process.WRITE_MEMORY_LIMIT
            assert con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0] == f"{limit / 2**20:.1f} MiB"
            folder = serve.writer._spill
            assert folder and Path(folder).parent == tmp_path / "sys"
            serve.writer.finish("complete", release=False)  # as the writer process closes: the connection kept
            assert _setting(con, "memory_limit") == _setting(duckdb.connect(":memory:"), "memory_limit")
            serve.writer.close()
            assert not Path(folder).exists()
    finally:
        os.close(r)
        os.close(w)


def test_the_writer_process_holds_a_large_traces_run_from_its_first_write(tmp_path, monkeypatch):
    """A trace of VACUUM_ROWS requests or more (`expected`, its lines) is held from the first
    write, before any table has a row group's rows."""
    monkeypatch.chdir(tmp_path)
    r, w = os.pipe()
    try:
        with _system_tmp(tmp_path / "sys"):
            serve = _opened_serve(tmp_path, w)
            serve.expected = writer_process.VACUUM_ROWS
            serve.write()
            limit = writer_process.WRITE_MEMORY_LIMIT
            assert _setting(serve.writer._host, "memory_limit") == f"{limit / 2**20:.1f} MiB"
            serve.writer.close()
    finally:
        os.close(r)
        os.close(w)


def test_a_replay_with_a_writer_process_leaves_no_spill_folder(tmp_path):
    """The writer process leaves by os._exit: it removes its spill folder itself first; nothing of
    DuckDB's lands in the replay's current directory."""
    from tests.support.cli import cli_env, run
    from tests.support.traces import good_lines, write_trace

    trace = write_trace(tmp_path / "t.jsonl", good_lines(300))
    sys_tmp = tmp_path / "sys"
    sys_tmp.mkdir()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    proc = run("replay", trace, "--db", tmp_path / "r.duckdb", "--json", cwd=cwd,
               env=cli_env(TIERDIAG_WRITER="process", TMPDIR=str(sys_tmp)))
    assert proc.returncode == 0, proc.stderr
    assert list(sys_tmp.iterdir()) == [] and list(cwd.iterdir()) == []
