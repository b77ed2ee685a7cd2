"""The two ways a replay writes its store, inline and through a writer process
(tierdiag/store/writer_process.py): the same rows, the same closing numbers, the same errors;
which one a replay takes; and what each process imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import duckdb
import pytest
from hypothesis import given, settings, strategies as st

from tests.reliability.harness import ROOMY, SMALL, assert_same_event_rows, cli_env, good_lines, runs, write_trace
from tests.support import bad_stores
from tests.support.cli import tierdiag_in_process
from tierdiag.errors import ConfigError
from tierdiag.store import writer_process
from tierdiag.store.schema import SCHEMA_VERSION


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("wp") / "t.jsonl"
    assert tierdiag_in_process("synth", path, "--requests", "1500", "--seed", "9").code == 0
    return path


def replay_json(trace, db, writer: str, *extra) -> dict:
    r = tierdiag_in_process("replay", trace, "--db", db, *ROOMY, "--json", *extra,
                            env=cli_env(TIERDIAG_WRITER=writer))
    return r.json()


@pytest.fixture(scope="module")
def both(tmp_path_factory, trace) -> tuple:
    """The trace replayed inline, then through a writer process, into one store: (store, each
    replay's --json summary by writer). Read only (the tests copy the summaries)."""
    db = tmp_path_factory.mktemp("both") / "both.duckdb"
    return db, {writer: replay_json(trace, db, writer) for writer in ("inline", "process")}


def test_inline_and_process_write_the_same_rows_and_print_the_same_numbers(both):
    """Every column of every event table (but the measured wall time of the real copies), as
    multisets both ways; the run's count; the closing summary (but wall time and the run's id).
    The batches travel much smaller with a writer process (8k rows against 250k), so this also
    checks that how rows are cut into flushes changes none of them."""
    db, by_writer = both
    summaries = [dict(by_writer[writer]) for writer in ("inline", "process")]
    assert [s.pop("writer") for s in summaries] == ["inline", "process"]  # the replay says which it took
    for s in summaries:
        for key in ("wall_s", "wall_phases", "run_id"):
            s.pop(key)
    assert summaries[0] == summaries[1]
    con = duckdb.connect(str(db), read_only=True)
    (a, na), (b, nb) = con.execute("SELECT run_id, num_requests FROM runs ORDER BY created_at").fetchall()
    assert na == nb == 1500
    assert_same_event_rows(con, a, b, may_be_empty=("pool_samples",))
    # Both runs got their evidence stored, and the runs row names the replay's own process.
    assert con.execute("SELECT count(*) FROM run_evidence").fetchone()[0] == 2
    assert all(pid for (pid,) in con.execute("SELECT pid FROM runs").fetchall())
    # The same evidence, though the writer process read the trace's pages for the size curves
    # while the run was recorded and the inline close read them itself (issue 41).
    inline, process = (json.loads(payload.replace(run_id, "RUN")) for run_id, payload in con.execute(
        "SELECT e.run_id, e.evidence_json FROM run_evidence e JOIN runs r USING (run_id) ORDER BY r.created_at"
    ).fetchall())
    assert inline["size_curves"] is not None
    assert inline == process
    con.close()


def test_what_the_writer_prepares_while_recording_never_stops_the_rows(tmp_path, capfd):
    """The writer process's `while_recording` hook (app/writer_child.py: the trace's pages read
    ahead for the close) is started once the store is open; one that fails is one warning line,
    and the run opens and records as without it."""
    from tierdiag.store import writer_serve
    from tierdiag.store.frames import read_frame

    seen = []

    def boom(run):
        seen.append(run["trace_path"])
        raise RuntimeError("no \x1b[2J\nmore")

    r, w = os.pipe()
    serve = writer_serve._Serve(inbox=None, reply_fd=w, while_recording=boom)
    args = {"db_path": str(tmp_path / "h.duckdb"), "run_id": "r1", "name": "h", "trace_path": "/t.jsonl",
            "trace_sha256": "", "config": {}, "hardware": {}, "data_plane": {}, "timing": "modeled"}
    assert serve.open({"writer": args, "write_every_s": 1.0})
    assert read_frame(r) == ("opened", None)
    assert seen == ["/t.jsonl"]
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "nothing prepared while recording (RuntimeError: no \\x1b[2J)" in err
    assert "\x1b" not in err  # no raw terminal escape reaches the terminal
    serve.writer.close()
    os.close(r)
    os.close(w)


@pytest.mark.parametrize("fails", [False, True])
def test_the_close_tells_what_was_prepared_that_no_row_comes_after(tmp_path, capfd, fails):
    """The writer process's close hands what `while_recording` returned None before it writes the
    last rows (issue 41: the size curves' pass walks its rest beside that write, not after it);
    one that fails there is one warning line, and the run is closed as without it."""
    from tierdiag.store import writer_serve
    from tierdiag.store.frames import read_frame

    order = []

    def on_rows(taken):
        order.append(("rows", taken))
        if fails:
            raise RuntimeError("no \x1b[2J\nend")

    r, w = os.pipe()
    serve = writer_serve._Serve(inbox=None, reply_fd=w, while_recording=lambda run: on_rows)
    args = {"db_path": str(tmp_path / "e.duckdb"), "run_id": "r1", "name": "e", "trace_path": "/t.jsonl",
            "trace_sha256": "", "config": {}, "hardware": {}, "data_plane": {}, "timing": "modeled"}
    assert serve.open({"writer": args, "write_every_s": 1.0})
    assert read_frame(r) == ("opened", None)
    real = serve.writer.finish

    def finish(*a, **kw):
        order.append(("finish", a[0]))
        return real(*a, **kw)

    serve.writer.finish = finish
    assert serve.finish({"status": "complete", "error": None, "write_pending": True, "trace_sha256": None})
    assert order == [("rows", None), ("finish", "complete")]
    kind, reply = read_frame(r)
    assert kind == "finished" and reply["closed_as"] == "complete"
    err = capfd.readouterr().err
    if fails:
        assert err.count("\n") == 1 and "nothing prepared while recording (RuntimeError: no \\x1b[2J)" in err
        assert serve.on_rows is None
    else:
        assert err == ""
    with duckdb.connect(str(tmp_path / "e.duckdb"), read_only=True) as con:
        assert con.execute("SELECT status FROM runs").fetchall() == [("complete",)]
    serve.writer.close()
    os.close(r)
    os.close(w)


@pytest.mark.parametrize("writer", ["inline", "process"])
def test_the_wall_phases_add_up_to_the_wall_time(both, writer):
    """replay --json says where its wall time went (start, engine, close: the probe overhead's
    split in benchmarks/run.py); the three cover wall_s, none negative (each writer's replay of
    `both`, the one the rows are compared on)."""
    s = both[1][writer]
    phases = s["wall_phases"]
    assert set(phases) == {"start_s", "engine_s", "close_s"}
    assert all(v >= 0 for v in phases.values())
    assert sum(phases.values()) == pytest.approx(s["wall_s"], abs=1e-6)


def test_the_wall_phases_of_a_replay_without_probes_are_nearly_all_the_engines(trace):
    """With probes off there is no run to close, so nearly all of the wall time is the engine's."""
    off = tierdiag_in_process("replay", trace, "--no-probes", *ROOMY, "--json").json()
    assert sum(off["wall_phases"].values()) == pytest.approx(off["wall_s"], abs=1e-6)
    assert off["wall_phases"]["close_s"] < off["wall_phases"]["engine_s"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    db = tmp_path_factory.mktemp("store") / "s.duckdb"
    trace = write_trace(db.parent / "s.jsonl", good_lines(6))
    assert tierdiag_in_process("replay", trace, "--db", db, *SMALL).code == 0
    return db


def test_a_store_that_is_not_ours_is_the_same_one_line_error_both_ways(tmp_path, store):
    """Refused by the writer process as by the inline writer: the same line, the same exit code,
    not a byte written, no run and no "kept" note (no run was ever created)."""
    trace = write_trace(tmp_path / "t.jsonl", good_lines(4))
    (tmp_path / "afile").write_text("x")
    cases = {
        "junk": (lambda p: p.write_text("id,name\n1,a\n"), 4, "not a DuckDB database"),
        "foreign": (bad_stores.foreign, 4, "not a tierdiag run store"),
        "newer": (lambda p: bad_stores.newer(p, store), 4, f"schema v{SCHEMA_VERSION + 1}"),
        "damaged": (lambda p: bad_stores.truncated(p, store), 4, "damaged"),
    }
    for name, (make, code, fragment) in cases.items():
        lines = []
        for i, writer in enumerate(("inline", "process")):
            db = tmp_path / f"w{i}" / f"{name}.duckdb"  # paths of one length: a long line is cut
            db.parent.mkdir(exist_ok=True)
            make(db)
            before = db.read_bytes()
            r = tierdiag_in_process("replay", trace, "--db", db, *SMALL, env=cli_env(TIERDIAG_WRITER=writer))
            lines.append(r.fails(code, fragment).replace(str(db), "DB"))
            assert db.read_bytes() == before, f"{name}: the {writer} writer changed the file"
            assert "kept in" not in lines[-1]
        assert lines[0] == lines[1], name
    under = []
    for writer in ("inline", "process"):
        r = tierdiag_in_process("replay", trace, "--db", tmp_path / "afile" / "r.duckdb", *SMALL,
                                env=cli_env(TIERDIAG_WRITER=writer))
        under.append(r.fails(6, "afile"))
    assert under[0] == under[1]


def test_which_writer_a_replay_takes(monkeypatch):
    monkeypatch.delenv("TIERDIAG_WRITER", raising=False)
    monkeypatch.setattr(writer_process, "_usable_cpus", lambda: 2)
    monkeypatch.setattr(writer_process, "_busy_elsewhere", lambda: 0.3)
    assert writer_process.writer_mode() == "process"
    monkeypatch.setattr(writer_process, "_busy_elsewhere", lambda: 1.2)
    assert writer_process.writer_mode() == "inline"  # no idle core: the processes would share one
    monkeypatch.setattr(writer_process, "_usable_cpus", lambda: 8)
    assert writer_process.writer_mode() == "process"
    monkeypatch.setattr(writer_process, "_usable_cpus", lambda: 1)
    monkeypatch.setattr(writer_process, "_busy_elsewhere", lambda: 0.0)
    assert writer_process.writer_mode() == "inline"  # one CPU: a second process does not pay
    for value, mode in (("process", "process"), ("INLINE", "inline"), ("auto", "inline"), ("", "inline")):
        monkeypatch.setenv("TIERDIAG_WRITER", value)
        assert writer_process.writer_mode() == mode
    monkeypatch.setenv("TIERDIAG_WRITER", "thread")
    with pytest.raises(ConfigError, match="TIERDIAG_WRITER='thread' must be process, inline or auto"):
        writer_process.writer_mode()


def test_a_bad_writer_setting_is_exit_2_before_anything_is_written(tmp_path):
    db = tmp_path / "r.duckdb"
    r = tierdiag_in_process("replay", write_trace(tmp_path / "t.jsonl", good_lines(2)), "--db", db, *SMALL,
                            env=cli_env(TIERDIAG_WRITER="yes"))
    r.fails(2, "TIERDIAG_WRITER")
    assert not db.exists()


_IN_A_WORKER = """
import multiprocessing as mp
from tierdiag.store import writer_process
from tierdiag.store.writer_process import writer_mode

def child(q):
    writer_process._busy_elsewhere = lambda: 0.0  # an idle machine: only being a worker decides
    q.put(writer_mode())

if __name__ == "__main__":
    writer_process._busy_elsewhere = lambda: 0.0
    q = mp.get_context("spawn").Queue()
    p = mp.get_context("spawn").Process(target=child, args=(q,))
    p.start()
    print(writer_mode(), q.get(timeout=60))
    p.join()
"""


def test_a_sweep_worker_writes_inline(tmp_path):
    """A multiprocessing child (the sweep's and advise's workers: one replay per core already)."""
    script = tmp_path / "w.py"
    script.write_text(_IN_A_WORKER)
    env = {k: v for k, v in os.environ.items() if k != "TIERDIAG_WRITER"}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    parent, child = out.stdout.split()
    assert child == "inline"
    assert parent == ("process" if len(os.sched_getaffinity(0)) >= 2 else "inline")


_IMPORTS = """
import json, sys
from tierdiag.app import writer_child
# In the writer: report what it imported, once the run is closed.
writer_child.ENTRY = (
    "import sys, json\\n" + writer_child.ENTRY.replace("main()", "") + "\\n"
    "import tierdiag.store.writer_serve as W\\n_f = W._Serve.finish\\n"
    "def finish(self, arg):\\n"
    "    done = _f(self, arg)\\n"
    "    print(json.dumps(['writer', sorted(m for m in ('torch',) if m in sys.modules)]), file=sys.stderr)\\n"
    "    return done\\n"
    "W._Serve.finish = finish\\nmain()\\n")
from tierdiag.config.engine import EngineConfig
from tierdiag.app.replay import replay
replay(__import__("pathlib").Path(sys.argv[1]), EngineConfig(model="tiny", gpu="cpu", device_tokens=65536),
       db=__import__("pathlib").Path(sys.argv[2]), run_name="x", probes=True, skip_bad=False)
print(json.dumps(["engine", sorted(m for m in ("duckdb", "pyarrow") if m in sys.modules)]), file=sys.stderr)
"""


def test_the_engine_imports_no_duckdb_and_the_writer_no_torch(tmp_path, trace):
    """With a writer process, the replay's own process never imports duckdb or pyarrow (their
    import is the writer's start-up, overlapping torch's), and the writer never imports torch
    (a torch object among the run's metadata would make unpickling it do that)."""
    script = tmp_path / "imports.py"
    script.write_text(_IMPORTS)
    out = subprocess.run([sys.executable, str(script), str(trace), str(tmp_path / "i.duckdb")], capture_output=True,
                         text=True, env=cli_env(TIERDIAG_WRITER="process"), timeout=300)
    assert out.returncode == 0, out.stderr
    said = dict(json.loads(ln) for ln in out.stderr.splitlines() if ln.startswith("["))
    assert said == {"writer": [], "engine": []}, out.stderr
    assert runs(tmp_path / "i.duckdb", process=False)[0]["status"] == "complete"


def test_a_write_that_failed_in_the_writer_is_raised_at_the_close_and_the_run_closes_failed(tmp_path, monkeypatch):
    """The writer reports a failed write while the engine is already asking for the close: the
    engine gets that error (never a run closed as complete short of its rows), then closes the
    run as failed, as inline; the process is gone afterwards."""
    import functools

    from tests.reliability.harness import disk_full_after, on_request_flush, sql
    from tierdiag.errors import OutputError

    on_request_flush(monkeypatch, functools.partial(disk_full_after, 0), writer="process", tmp_path=tmp_path)
    db = tmp_path / "w.duckdb"
    from tierdiag.app import writer_child

    w = writer_process.WriterProcess.start(entry=writer_child.ENTRY)  # the replay's, patched above
    try:
        w.open(db, run_id=writer_process.new_run_id(), name="w", trace_path="t.jsonl", trace_sha256="",
               config={}, hardware={}, data_plane={}, timing="modelled", command_line=["t"], write_every_s=0.0)
        w.append({"requests": {"req_id": ["a", "b"], "seq": [0, 1], "status": ["finished"] * 2}})
        with pytest.raises(OutputError, match="no space left"):
            w.finish("complete")
        assert w.has_run and w.closed_as is None
        w.finish("failed", error="disk full", write_pending=False)
        assert (w.closed_as, w.recorded) == ("failed", 0)
    finally:
        pid = w.pid
        w.close()
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    assert sql(db, "SELECT status, num_requests, error FROM runs") == [("failed", 0, "disk full")]


def _flushed_run(db, flushes: int, rows: int):
    """A run written in `flushes` appends (each a transaction and a checkpoint), and closed with
    one more batch of rows pending, as a replay's close writes its last rows."""
    from tierdiag.store.writer import RunWriter

    w = RunWriter(db, name="v", trace_path="t.jsonl", trace_sha256="", config={}, hardware={}, data_plane={},
                  timing="modelled", command_line=["t"])
    for f in range(flushes + 1):
        seq = range(f * rows, (f + 1) * rows)
        batch = {"requests": {"req_id": [f"r{i}" for i in seq], "seq": list(seq), "status": ["finished"] * rows}}
        if f < flushes:
            w.append(batch)
        else:
            w.take(batch)
    w.finish("complete")
    return w


def test_the_close_checkpoints_without_merging_the_runs_row_groups(tmp_path):
    """RunWriter.finish: DuckDB's checkpoint vacuums, merging a table's small row groups (one a
    flush) by rewriting them, which at a run's close is every row of a table short of a full row
    group; the close skips that (`_no_vacuum`), so its row groups stay as the flushes wrote
    them, and every row reads back."""
    from tests.reliability.harness import sql

    db = tmp_path / "v.duckdb"
    # Seven flushes, then the close with the last rows: DuckDB 2.0's checkpoints merge row groups
    # as a binary counter carries (1, 1, 2, 1, 2, 2, 3 groups after each of seven flushes), and
    # the eighth, the close's, would merge them all into one.
    w = _flushed_run(db, flushes=7, rows=2_000)
    assert w.recorded == 16_000
    assert sql(db, "SELECT count(*), count(DISTINCT seq), min(seq), max(seq) FROM requests") == [(16_000, 16_000, 0, 15_999)]
    groups = sql(db, "SELECT count(DISTINCT row_group_id) FROM pragma_storage_info('requests')")[0][0]
    assert groups > 1, "the close merged the flushes' row groups"


@pytest.mark.parametrize("bound", ["default", 0, 1 << 60])
def test_a_large_close_lets_the_cached_blocks_go_before_its_hook(tmp_path, monkeypatch, bound):
    """RunWriter.finish: where the close's pending Arrow columns are LET_GO_AFTER_BYTES or more,
    its last write is checkpointed and DuckDB's cached blocks let go (store/duckdb_core.py
    `release_cached_blocks`) before the close's hook computes on the connection (issue 41,
    session 24: a 1M-request close began ~165 MB over the writes' level); under it (a
    conversation replay's close, the default bound) nothing more is done. Either way every row
    is there for the hook and reads back, and the limit is the default after."""
    import pyarrow as pa

    from tests.reliability.harness import sql
    from tierdiag.store import writer as W

    if bound != "default":
        monkeypatch.setattr(W, "LET_GO_AFTER_BYTES", bound)
    released = []
    real = W.release_cached_blocks
    monkeypatch.setattr(W, "release_cached_blocks", lambda con: released.append(1) or real(con))
    real_arrow = W.release_arrow_memory
    monkeypatch.setattr(W, "release_arrow_memory", lambda: released.append(2) or real_arrow())
    db = tmp_path / "r.duckdb"
    w = W.RunWriter(db, name="r", trace_path="t.jsonl", trace_sha256="", config={}, hardware={}, data_plane={},
                    timing="modelled", command_line=["t"])
    rows = 3_000
    w.append({"requests": {"req_id": [f"r{i}" for i in range(rows)], "seq": list(range(rows))}})
    taken = w.take({"requests": {"req_id": [f"r{i}" for i in range(rows, 2 * rows)],
                                 "seq": list(range(rows, 2 * rows))}})
    size = W.pending_bytes([taken])
    assert size == sum(a.nbytes for a in taken["requests"].values()) and size >= rows * 8
    assert all(isinstance(a, pa.Array) for a in taken["requests"].values())
    seen = []

    def hook(con, path, run_id, status):
        wal = path.with_name(path.name + ".wal")
        seen.append((con.execute("SELECT count(*) FROM requests").fetchone()[0],
                     wal.stat().st_size if wal.exists() else 0,
                     con.execute("SELECT current_setting('memory_limit')").fetchone()[0]))
        return None

    default_limit = duckdb.connect().execute("SELECT current_setting('memory_limit')").fetchone()[0]
    w.finish("complete", after_commit=hook)
    large = bound == 0
    assert released == ([1, 2] if large else [])
    count, wal, limit = seen[0]
    assert count == 2 * rows and limit == default_limit
    # The WAL at the hook: the status update alone where the rows were checkpointed, else the rows too.
    assert (wal < rows) if large else (wal >= rows * 8), wal
    assert w.recorded == 2 * rows
    assert sql(db, "SELECT count(*), count(DISTINCT seq) FROM requests") == [(2 * rows, 2 * rows)]


def test_release_arrow_memory_hands_back_what_the_pool_kept(monkeypatch):
    """writer.release_arrow_memory: Arrow's pool's `release_unused` (what mimalloc kept of the
    arrays freed on this thread), nothing where a pyarrow lacks it; allocated bytes unchanged."""
    import pyarrow as pa

    from tierdiag.store import writer as W

    kept = pa.array(range(1000))
    freed = pa.concat_arrays([pa.array(range(100_000))] * 20)
    del freed
    before = pa.total_allocated_bytes()
    W.release_arrow_memory()
    assert pa.total_allocated_bytes() == before and kept[999].as_py() == 999

    class OldPool:
        pass

    monkeypatch.setattr(W.pa, "default_memory_pool", lambda: OldPool())
    W.release_arrow_memory()  # nothing to call: nothing happens


def test_writes_without_vacuum_leave_their_row_groups_and_a_vacuuming_write_merges_them(tmp_path):
    """RunWriter.write(vacuum=False): its checkpoint leaves each write's row group as written (the
    writer process's writes but every VACUUM_EVERY-th); a later write with vacuum (the default)
    merges them again, as DuckDB's checkpoint always did; every row reads back either way, in
    the order written."""
    from tests.reliability.harness import sql
    from tierdiag.store.writer import RunWriter

    db = tmp_path / "v.duckdb"
    w = RunWriter(db, name="v", trace_path="t.jsonl", trace_sha256="", config={}, hardware={}, data_plane={},
                  timing="modelled", command_line=["t"])

    def groups():
        return sql(db, "SELECT count(DISTINCT row_group_id) FROM pragma_storage_info('requests')")[0][0]

    rows = 1_500
    for f in range(4):
        seq = range(f * rows, (f + 1) * rows)
        w.take({"requests": {"req_id": [f"r{i}" for i in seq], "seq": list(seq), "status": ["finished"] * rows}})
        w.write(vacuum=False)
        assert groups() == f + 1, "a write without vacuum merged the row groups"
    seq = range(4 * rows, 5 * rows)
    w.take({"requests": {"req_id": [f"r{i}" for i in seq], "seq": list(seq), "status": ["finished"] * rows}})
    w.write()
    assert groups() < 5, "the vacuuming write left every row group"
    w.finish("complete")
    assert w.recorded == 5 * rows
    assert sql(db, "SELECT list(seq ORDER BY rowid) = range(0, 7500) AND count(DISTINCT req_id) = 7500 FROM requests") \
        == [(True,)]


def test_the_vacuum_setting_is_restored_for_a_vacuuming_write():
    """`_vacuum(con, True)` resets DuckDB's setting (a write after one without vacuum merges
    again); `_vacuum(con, False)` is `_no_vacuum`; a DuckDB without the setting always vacuums."""
    from tierdiag.store.writer import _vacuum

    class Con:
        def __init__(self, known=True):
            self.asked, self.known = [], known

        def execute(self, statement):
            self.asked.append(statement)
            if not self.known:
                raise duckdb.CatalogException('Catalog Error: unrecognized configuration parameter "max_vacuum_tasks"')

    con = Con()
    _vacuum(con, False)
    _vacuum(con, True)
    assert con.asked == ["SET max_vacuum_tasks = 0", "RESET max_vacuum_tasks"]
    older = Con(known=False)
    _vacuum(older, True)
    _vacuum(older, False)
    assert older.asked == ["RESET max_vacuum_tasks", "SET max_vacuum_tasks = 0"]
    real = duckdb.connect()
    _vacuum(real, False)
    assert real.sql("SELECT current_setting('max_vacuum_tasks')").fetchall() == [(0,)]
    _vacuum(real, True)
    assert real.sql("SELECT current_setting('max_vacuum_tasks')").fetchall() != [(0,)]


def test_a_duckdb_without_the_vacuum_setting_closes_as_before():
    """`_no_vacuum` on a DuckDB that has no max_vacuum_tasks: the close goes on (and vacuums)."""
    from tierdiag.store.writer import _no_vacuum

    class OlderDuckDB:
        def __init__(self):
            self.asked = []

        def execute(self, statement):
            self.asked.append(statement)
            raise duckdb.CatalogException('Catalog Error: unrecognized configuration parameter "max_vacuum_tasks"')

    con = OlderDuckDB()
    _no_vacuum(con)
    assert con.asked == ["SET max_vacuum_tasks = 0"]


def test_batches_taken_together_are_inserted_a_table_at_a_time_in_order(tmp_path):
    """RunWriter._write_pending: a table's consecutive batches with the same columns go in as
    one insert (their arrays one chunked array each, not copied); a batch with other columns
    keeps its place."""
    import pyarrow as pa

    from tests.reliability.harness import sql
    from tierdiag.store.writer import RunWriter, _by_table

    def batch(seqs, with_status=True):
        cols = {"req_id": [f"r{i}" for i in seqs], "seq": list(seqs)}
        if with_status:
            cols["status"] = ["finished"] * len(seqs)
        return {"requests": cols, "batches": {"batch_id": list(seqs)}}

    w = RunWriter(tmp_path / "b.duckdb", name="b", trace_path="t.jsonl", trace_sha256="", config={}, hardware={},
                  data_plane={}, timing="modelled", command_line=["t"])
    for part in (batch(range(0, 3)), batch(range(3, 5)), batch(range(5, 6), with_status=False), batch(range(6, 9))):
        w.take(part)
    grouped = [(table, len(cols["seq" if table == "requests" else "batch_id"]),
                isinstance(cols["req_id"], (pa.Array, pa.ChunkedArray)) if table == "requests" else None)
               for table, cols in _by_table(w._pending)]
    assert grouped == [("requests", 5, True), ("batches", 9, None), ("requests", 1, True), ("requests", 3, True)]
    w.finish("complete")
    assert w.recorded == 9
    assert sql(tmp_path / "b.duckdb", "SELECT seq, status FROM requests ORDER BY rowid") == \
        [(i, None if i == 5 else "finished") for i in range(9)]
    assert sql(tmp_path / "b.duckdb", "SELECT list(batch_id ORDER BY rowid) FROM batches")[0][0] == list(range(9))


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 40), max_size=12), other_at=st.one_of(st.none(), st.integers(0, 11)),
       most=st.one_of(st.integers(-5, 130), st.just(10**18)), let_go=st.booleans())
def test_a_tables_batches_are_joined_at_most_a_row_group_at_a_time(sizes, other_at, most, let_go):
    """writer._by_table(pending, most_rows): a table's consecutive batches with the same columns
    joined into pieces of at most `most_rows` rows (a batch larger than that, or any batch where
    the bound is 0 or less, alone as it is; issue 41, session 24), each column the batches' own
    arrays as one chunked array (no copy: session 25); every row once, in the order taken, a
    batch with other columns in its place, and the default bound is DuckDB's row group. With
    `let_go` the same pieces, and `pending` is emptied as soon as they start."""
    import pyarrow as pa

    from tierdiag.store.writer import INSERT_ROWS, _by_table

    assert INSERT_ROWS == 122_880
    pending, want, seq = [], [], 0
    for i, n in enumerate(sizes):
        cols = {"seq": pa.array(range(seq, seq + n), type=pa.int64())}
        if i == other_at:
            cols["status"] = pa.array(["x"] * n)
        pending.append({"requests": cols, "batches": {"batch_id": pa.array(range(seq, seq + n), type=pa.int64())}})
        want.append(list(range(seq, seq + n)))
        seq += n
    taken = list(pending)
    buffers = {a.buffers()[1].address for b in pending for cols in b.values() for a in cols.values() if len(a)}
    got = {"requests": [], "batches": []}
    for table, cols in _by_table(pending, most, let_go=let_go):
        assert pending == ([] if let_go else taken)
        key = "seq" if table == "requests" else "batch_id"
        values = cols[key].to_pylist()
        assert len(values) <= max(most, 0) or len(values) in sizes, (len(values), most)
        got[table].append((values, "status" in cols))
        chunks = cols[key].chunks if isinstance(cols[key], pa.ChunkedArray) else [cols[key]]
        assert all(c.buffers()[1].address in buffers for c in chunks if len(c))  # the batches' own values
    every = [v for part in want for v in part]
    assert [v for part, _ in got["batches"] for v in part] == every
    assert [v for part, _ in got["requests"] for v in part] == every
    if other_at is not None and other_at < len(sizes):  # its own piece, its rows only
        assert (want[other_at], True) in got["requests"]
        assert all(not other or part == want[other_at] for part, other in got["requests"])


def test_rows_handed_over_as_tuples_land_as_columns_numpy_values_included(tmp_path):
    """WriterProcess.append_rows: the recorder's row tuples go over pickled and are zipped into
    columns in the writer. A numpy integer among them lands as its number (marshal, faster,
    would have sent its bytes)."""
    import numpy as np

    from tests.reliability.harness import sql

    db = tmp_path / "r.duckdb"
    fields = ("req_id", "seq", "status", "ttft_ns")
    w = writer_process.WriterProcess.start()
    try:
        w.open(db, run_id=writer_process.new_run_id(), name="r", trace_path="t.jsonl", trace_sha256="",
               config={}, hardware={}, data_plane={}, timing="modelled", command_line=["t"], write_every_s=0.0)
        w.append_rows({"requests": (fields, [("a", 0, "finished", 5), ("b", 1, "finished", None)])})
        w.append_rows({"requests": (fields, [("c", np.int64(2), "finished", np.int64(7))])})
        w.finish("complete")
        assert (w.closed_as, w.recorded) == ("complete", 3)
    finally:
        w.close()
    assert sql(db, "SELECT req_id, seq, ttft_ns FROM requests ORDER BY seq") == [("a", 0, 5), ("b", 1, None), ("c", 2, 7)]


@pytest.mark.parametrize("closed", [True, False])
def test_a_closed_writer_is_reaped_at_exit_when_asked_and_only_then(tmp_path, monkeypatch, closed):
    """WriterProcess.close(wait=False) (the CLI's replay, which prints its result and ends): a
    writer that answered the run's close (the store committed and let go of) is reaped by an
    atexit function, after the result, not waited for in the close; one that did not close a
    run (or died) is reaped at once, as close() always did. Either way it is reaped, exit 0."""
    import atexit

    from tests.reliability.harness import sql

    registered: list = []
    monkeypatch.setattr(atexit, "register", lambda fn, *args: registered.append((fn, args)))
    db = tmp_path / "reap.duckdb"
    w = writer_process.WriterProcess.start()
    proc = w._proc
    try:
        w.open(db, run_id=writer_process.new_run_id(), name="r", trace_path="t.jsonl", trace_sha256="",
               config={}, hardware={}, data_plane={}, timing="modelled", command_line=["t"], write_every_s=0.0)
        w.append_rows({"requests": (("req_id", "seq", "status", "ttft_ns"), [("a", 0, "finished", 5)])})
        if closed:
            w.finish("complete")
            assert sql(db, "SELECT status, num_requests FROM runs") == [("complete", 1)]  # let go of: readable
    finally:
        w.close(wait=False)
    if closed:
        assert [fn for fn, _ in registered] == [writer_process.WriterProcess._reap]
        fn, args = registered[0]
        fn(*args)
    else:
        assert registered == []
    assert proc.returncode == 0
    w.close(wait=False)  # again: nothing left to reap
    assert len(registered) == int(closed)


def test_the_writer_process_writes_sooner_at_first_then_at_its_interval():
    """_Serve's write interval starts at FIRST_WRITE_S and doubles after each write up to the
    interval the replay asked for (WRITE_EVERY_S at most): a replay of a second or two has rows
    written before its close, which otherwise inserts all of them while the replay waits."""
    class Writer:
        writes = 0
        vacuums: list = []
        pending = False

        def write(self, *, vacuum=True):
            Writer.writes += 1
            Writer.vacuums.append(vacuum)

    from tierdiag.store import writer_serve

    serve = writer_serve._Serve(inbox=None, reply_fd=-1)
    serve.writer = Writer()
    serve.every_max = writer_process.WRITE_EVERY_S
    serve.every = writer_process.FIRST_WRITE_S
    seen = [serve.every]
    for _ in range(6):
        serve.write()
        seen.append(serve.every)
    assert Writer.writes == 6
    # Every VACUUM_EVERY-th write merges the row groups the others left (writer._vacuum), while no
    # table of the run holds a row group (writer_serve.vacuum_due; tests/store/test_writer_vacuum.py).
    assert Writer.vacuums == [(i + 1) % writer_process.VACUUM_EVERY == 0 for i in range(6)]
    first = writer_process.FIRST_WRITE_S
    assert seen[:3] == [first, 2 * first, 4 * first]
    assert seen[-1] == writer_process.WRITE_EVERY_S and max(seen) == writer_process.WRITE_EVERY_S
    assert seen == sorted(seen)


@settings(max_examples=300, deadline=None)
@given(st.floats(0.0, 10.0), st.floats(0.0, 10.0), st.floats(0.0, 30.0), st.floats(0.0, 100.0))
def test_a_costly_write_stretches_the_interval_up_to_the_flush_interval(every, every_max, flush, took):
    """writer_serve.next_interval (issue 41: a write's checkpoint costs more as the store grows,
    ~0.1-0.15 s at 200k synth requests): the doubled interval as before, or the write's time over
    WRITE_COST_SHARE where longer; never past the replay's flush interval (the contract's "at
    least this often") where that is the longer, never under the doubled one."""
    from tierdiag.store.writer_serve import next_interval

    most = max(every_max, flush)
    got = next_interval(every, every_max, most, took)
    doubled = min(2 * every, every_max)
    assert doubled <= got <= max(doubled, most)
    assert got == max(doubled, min(took / writer_process.WRITE_COST_SHARE, most))
    # A cheap write (the conversation trace's ~25-30 ms against a second) leaves the interval as it was.
    assert next_interval(every_max, every_max, most, 0.3 * writer_process.WRITE_COST_SHARE * every_max) == every_max


def test_the_writer_process_is_told_the_flush_interval_it_may_stretch_to():
    """_Serve.open takes the replay's flush interval as the most a costly write stretches the
    interval to, capped at STRETCH_MOST_S (the 1M run's peak: a late write's rows), never under
    the interval itself (TIERDIAG_FLUSH_EVERY_S smaller than a second: no stretch); an opener
    that does not say keeps the interval."""
    from tierdiag.store import writer_serve

    class Serve(writer_serve._Serve):
        def reply(self, msg):
            return True

    cap = writer_serve.STRETCH_MOST_S
    assert 1.0 <= cap < 5.0
    for flush, every, want in ((5.0, 1.0, cap), (1.5, 1.0, min(1.5, cap)), (0.5, 0.5, 0.5), (None, 1.0, 1.0),
                               (1e9, 1.0, cap), (0.0, 1.0, 1.0)):
        serve = Serve(inbox=None, reply_fd=-1)
        serve.writer = None
        arg = {"writer": {}, "write_every_s": every}
        if flush is not None:
            arg["flush_every_s"] = flush
        import tierdiag.store.writer as W

        real = W.RunWriter
        W.RunWriter = lambda **kw: types.SimpleNamespace(host=None)  # the open names its host to duckdb_core.purge_on
        try:
            assert serve.open(arg)
        finally:
            W.RunWriter = real
        assert serve.most == want and serve.every_max == every


def _let_go_batches(k: int, n: int = 50_000):
    """`k` hand-overs of three tables' columns, `n` rows each, as Python lists (`take` makes them
    Arrow arrays on Arrow's pool: what a piece holds is seen in pa.total_allocated_bytes)."""
    out = []
    for f in range(k):
        seq = list(range(f * n, (f + 1) * n))
        out.append({"requests": {"req_id": [f"r{i}" for i in seq], "seq": seq, "status": ["finished"] * n},
                    "batches": {"batch_id": seq, "num_reqs": seq},
                    "evictions": {"eviction_id": seq, "tokens": seq}})
    return out


@pytest.mark.parametrize("let_go", [False, True])
def test_a_write_that_lets_its_rows_go_frees_each_piece_once_inserted(tmp_path, monkeypatch, let_go):
    """RunWriter.let_rows_go (the writer process's, issue 41: a 1M-request replay's write held its
    ~5 s of rows as Arrow beside DuckDB's transaction copy of them): each table's piece is let go
    once inserted, so the Arrow bytes held fall through the write instead of staying to its
    commit, the freed heap is handed back (`release_freed_heap`, past TRIM_AFTER_BYTES and at
    the end); the rows committed are the same, in the same order, one transaction."""
    import pyarrow as pa

    from tests.reliability.harness import sql
    from tierdiag.store import writer as writer_mod
    from tierdiag.store.writer import RunWriter

    held, trims = [], []
    plain = RunWriter._append

    def append(con, table, cols):
        held.append(pa.total_allocated_bytes())
        plain(con, table, cols)

    monkeypatch.setattr(RunWriter, "_append", staticmethod(append))
    monkeypatch.setattr(writer_mod, "release_freed_heap", lambda: trims.append(len(held)) or True)
    monkeypatch.setattr(writer_mod, "TRIM_AFTER_BYTES", 1 << 20)
    db = tmp_path / "g.duckdb"
    w = RunWriter(db, name="g", trace_path="t.jsonl", trace_sha256="", config={}, hardware={}, data_plane={},
                  timing="modelled", command_line=["t"], let_rows_go=let_go)
    for batch in _let_go_batches(2):
        w.take(batch)
    held.clear()
    w.write()
    assert not w.pending and w.recorded == 100_000
    assert len(held) == 3  # a piece a table: requests, batches, evictions (100k rows each, one piece)
    if let_go:
        # requests' ~3 MB then batches' 1.6 MB let go before the next insert: the bytes held fall
        assert held[0] - held[1] > 2_000_000 and held[1] - held[2] > 1_000_000, held
        assert trims == [1, 2, 3]  # before batches (requests' past 1 MiB), before evictions, at the end
    else:
        assert max(held) - min(held) < 500_000, held  # every piece held to the commit
        assert trims == []
    w.take({"batches": {"batch_id": [100_000, 100_001]}})  # a small write: under the bound, no call
    w.write()
    assert trims == ([1, 2, 3] if let_go else [])
    w.finish("complete")
    assert sql(db, "SELECT count(*), min(seq), max(seq), count(DISTINCT run_id) FROM requests") == [(100_000, 0, 99_999, 1)]
    assert sql(db, "SELECT list(batch_id ORDER BY rowid) = range(100002), bool_and(num_reqs = batch_id) "
                   "FROM batches") == [(True, True)]
    assert sql(db, "SELECT list(eviction_id ORDER BY rowid) = range(100000) FROM evictions") == [(True,)]


@pytest.mark.parametrize("let_go", [False, True])
def test_a_write_that_fails_after_letting_rows_go_gives_them_up_and_commits_none(tmp_path, monkeypatch, let_go):
    """A write that fails part-way (the disk full at its second table): its transaction rolled
    back, nothing of it in the file, every earlier write there. Its rows are given up, and every
    row handed over after it, whether or not the writer let some go (`let_rows_go`: the writer
    process): the close, with the disk free again, writes none of them (tests/store/
    test_writer_failure_parity.py: the same inline and through a writer process)."""
    from tests.reliability.harness import sql
    from tierdiag.errors import OutputError
    from tierdiag.store.writer import RunWriter

    db = tmp_path / "f.duckdb"
    w = RunWriter(db, name="f", trace_path="t.jsonl", trace_sha256="", config={}, hardware={}, data_plane={},
                  timing="modelled", command_line=["t"], let_rows_go=let_go)
    first, second = _let_go_batches(2, n=1_000)
    w.append(first)
    plain = RunWriter._append
    calls = []

    def append(con, table, cols):
        calls.append(table)
        if len(calls) == 2:
            raise duckdb.IOException("could not write: No space left on device")
        plain(con, table, cols)

    monkeypatch.setattr(RunWriter, "_append", staticmethod(append))
    w.take(second)
    with pytest.raises(OutputError, match="no space left"):
        w.write()
    assert not w.pending and w.given_up and w.recorded == 1_000
    monkeypatch.setattr(RunWriter, "_append", staticmethod(plain))
    w.append(first)  # after the failure: given up, not taken
    assert not w.pending
    w.finish("failed", error="disk full")
    n = 1_000
    assert sql(db, "SELECT status, num_requests FROM runs") == [("failed", n)]
    assert sql(db, "SELECT (SELECT count(*) FROM requests), (SELECT count(*) FROM batches), "
                   "(SELECT count(*) FROM evictions)") == [(n, n, n)]


def test_the_writer_process_lets_its_writes_rows_go(tmp_path):
    """_Serve.open: the writer process's RunWriter lets each write's rows go as it inserts them
    (it gives up every row after a failed write: `fail`); a RunWriter of its own (inline) keeps
    them to the commit."""
    from tierdiag.store import writer_serve
    from tierdiag.store.frames import read_frame
    from tierdiag.store.writer import RunWriter

    r, w = os.pipe()
    serve = writer_serve._Serve(inbox=None, reply_fd=w)
    args = {"db_path": str(tmp_path / "s.duckdb"), "run_id": "r1", "name": "s", "trace_path": "/t.jsonl",
            "trace_sha256": "", "config": {}, "hardware": {}, "data_plane": {}, "timing": "modeled"}
    assert serve.open({"writer": args, "write_every_s": 1.0})
    assert read_frame(r) == ("opened", None)
    assert serve.writer.let_rows_go is True
    serve.writer.close()
    inline = RunWriter(tmp_path / "i.duckdb", name="i", trace_path="t.jsonl", trace_sha256="", config={},
                       hardware={}, data_plane={}, timing="modelled", command_line=["t"])
    assert inline.let_rows_go is False
    inline.close()
    os.close(r)
    os.close(w)


def test_release_freed_heap_calls_malloc_trim_where_there_is_one(monkeypatch):
    """duckdb_core.release_freed_heap (the writer's and the live pass's): malloc_trim(0) where the
    C library has it (glibc: True), and nothing, False, where it has not; the live pass's name is
    the same function."""
    import ctypes

    from tierdiag.diagnose.run import live_curves
    from tierdiag.store import duckdb_core, writer as writer_mod

    assert writer_mod.release_freed_heap is duckdb_core.release_freed_heap is live_curves.release_freed_heap
    monkeypatch.setattr(duckdb_core, "_TRIM", [])
    has_trim = hasattr(ctypes.CDLL(None), "malloc_trim")
    assert duckdb_core.release_freed_heap() is has_trim
    assert duckdb_core.release_freed_heap() is has_trim  # looked up once, called again
    assert len(duckdb_core._TRIM) == 1
    monkeypatch.setattr(duckdb_core, "_TRIM", [None])
    assert duckdb_core.release_freed_heap() is False
