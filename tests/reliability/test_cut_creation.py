"""A store a replay began and that was cut inside DuckDB's header (issue 41, session 39 h49rel).

DuckDB makes a new file in three 4 KiB writes (main header, two database headers) under its
lock; a kill between them left a 4 or 8 KiB file every reader called damaged and a replay
refused. A replay now leaves `P.tierdiag-creating` beside a store it makes until the run's row
is in (store/creating.py): such a file, marked, 4 or 8 KiB of a new empty database's header, no
log with anything in it, no process holding it, is made afresh by a replay and read as "no runs
yet" by readers. Anything else is left byte for byte as it was: refused (exit 4, one line), an
unmarked file of that shape with a hint that says what to do. A user's file is never removed.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import SMALL, cli_env, good_lines, write_trace
from tests.support.cli import tierdiag_in_process
from tierdiag.store import creating

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc (Linux)")

SIZES = (1, 12, 100, 4095, 4096, 4097, 8191, 8192, 8193, 12287)
COMMANDS = (("runs",), ("runs", "--json"), ("summary",), ("slow", "--json"), ("replay",))


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict:
    """What a cut file is cut from: a new, empty DuckDB file (what a creation writes), and a store
    with a run, checkpointed twice (its first database header no longer the empty one)."""
    root = tmp_path_factory.mktemp("cut")
    fresh = root / "fresh.duckdb"
    duckdb.connect(str(fresh)).close()
    store = root / "store.duckdb"
    trace = write_trace(root / "t.jsonl", good_lines(6))
    for _ in range(2):
        assert tierdiag_in_process("replay", trace, "--db", store, *SMALL).code == 0
    with duckdb.connect(str(store)) as con:
        con.execute("CHECKPOINT")
    made = {"fresh": fresh.read_bytes()[:12288], "store": store.read_bytes()[:12288]}
    assert made["store"][4096:8192] != made["fresh"][4096:8192]  # a store's header says it has blocks
    return {**made, "trace": trace}


def _content(sources: dict, kind: str, size: int) -> bytes:
    if kind == "zeros":
        return bytes(size)
    if kind == "noise":
        return bytes((i * 37 + 11) % 256 for i in range(size))
    return sources[kind][:size]


def _files(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def _holds_nothing(kind: str, size: int, wal: str) -> bool:
    """The rule, from how each file was made (not from its bytes): cut between DuckDB's whole
    writes of a new database (any store's first 4 KiB: its main header alone), no log with data."""
    return size in (4096, 8192) and (kind == "fresh" or (kind == "store" and size == 4096)) and wal != "data"


@settings(max_examples=70, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=st.one_of(st.sampled_from((4096, 8192)), st.sampled_from(SIZES)),  # the cut windows, often
       kind=st.one_of(st.just("fresh"), st.sampled_from(["fresh", "store", "zeros", "noise"])),
       marked=st.booleans(), wal=st.sampled_from(["none", "empty", "data"]), command=st.sampled_from(COMMANDS))
def test_a_cut_file_is_made_afresh_only_where_it_was_a_replays_creation(sources, size, kind, marked, wal, command):
    with tempfile.TemporaryDirectory(prefix="cut") as tmp:
        folder = Path(tmp)
        db = folder / "s.duckdb"
        db.write_bytes(_content(sources, kind, size))
        if marked:
            creating.begin(db)
        if wal != "none":
            Path(f"{db}.wal").write_bytes(b"" if wal == "empty" else b"\x01" * 300)
        before = _files(folder)
        if command == ("replay",):
            r = tierdiag_in_process("replay", sources["trace"], "--db", db, *SMALL)
        else:
            r = tierdiag_in_process(*command, "--db", db)
        assert "Traceback" not in r.err, r.err
        cut = marked and _holds_nothing(kind, size, wal)
        if command == ("replay",) and cut:
            assert r.code == 0, r.err
            (run,) = tierdiag_in_process("runs", "--json", "--db", db).json()
            assert run["status"] == "complete" and run["num_requests"] == 6
            assert not creating.marker(db).exists()
            return
        assert _files(folder) == before, "a file left as it was changed"
        if cut and command[0] == "runs":
            assert r.code == 0 and r.err == "", r.err
            assert (json.loads(r.out) == []) if "--json" in command else ("has no runs yet" in r.out)
            return
        lines = r.err.splitlines()
        assert r.code == 4 and r.out == "" and len(lines) == 1 and lines[0].startswith("tierdiag: error: "), r.err
        if cut:
            assert "has no runs yet" in lines[0], lines[0]
        elif _holds_nothing(kind, size, wal):  # the shape, no marker: refused, with the hint
            assert "remove it to record into this path" in lines[0], lines[0]
        else:
            assert "remove it to record" not in lines[0], lines[0]


def test_a_cut_file_another_process_holds_is_left(sources, tmp_path):
    """Held (DuckDB's lock: a replay making it now): neither removed nor called empty."""
    db = tmp_path / "s.duckdb"
    db.write_bytes(sources["fresh"][:8192])
    creating.begin(db)
    code = (f"import fcntl, sys\nfh = open({str(db)!r}, 'rb+')\nfcntl.lockf(fh.fileno(), fcntl.LOCK_EX)\n"
            "print('ready', flush=True)\nsys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert not creating.cut_creation(db) and not creating.remove_cut_creation(db)
        r = tierdiag_in_process("replay", sources["trace"], "--db", db, *SMALL)
        assert r.code == 4 and db.stat().st_size == 8192 and creating.marker(db).exists(), r.err
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    assert creating.remove_cut_creation(db)  # let go of: now it is removed
    assert not db.exists() and not creating.marker(db).exists()


def test_a_replay_leaves_no_marker_and_removes_a_stale_one(sources, tmp_path):
    """A replay into a new path: the marker goes once the run's row is in. A marker a killed
    replay left beside a store that is whole (its header written) goes with the next replay."""
    db = tmp_path / "s.duckdb"
    assert tierdiag_in_process("replay", sources["trace"], "--db", db, *SMALL).code == 0
    assert not creating.marker(db).exists()
    creating.begin(db)
    assert tierdiag_in_process("runs", "--db", db).code == 0 and creating.marker(db).exists()  # readers leave it
    assert tierdiag_in_process("replay", sources["trace"], "--db", db, *SMALL).code == 0
    assert not creating.marker(db).exists()
    assert len(tierdiag_in_process("runs", "--json", "--db", db).json()) == 2


# In a replay's process (inline), before the store is made: held where DuckDB writes its header.
_HELD_IN_ATTACH = """
import os, time
from tierdiag.store import writer as _w
_real = _w.RunWriter._connect
def _held(self, *a, **k):
    if {size} == 0:
        open({marker!r}, "w").close(); time.sleep(600)
    with open(self.db_path, "wb") as fh:  # what DuckDB has written when the kill lands
        fh.write(open({fresh!r}, "rb").read()[:{size}])
    open({marker!r}, "w").close(); time.sleep(600)
_w.RunWriter._connect = _held
from tierdiag.cli.main import main
main()
"""


@pytest.mark.parametrize("size", [0, 4096, 8192])
def test_a_replay_killed_as_it_made_the_store_is_followed_by_one_that_records(sources, tmp_path, size):
    """The replay (inline) killed with DuckDB's header cut at 0, 4 or 8 KiB: `runs` says no runs
    (0: no database), `summary` exit 4 with that line, and the next replay records its run."""
    import time

    db = tmp_path / "s.duckdb"
    fresh = tmp_path / "fresh.duckdb"
    fresh.write_bytes(sources["fresh"])
    held = tmp_path / "held"
    code = _HELD_IN_ATTACH.format(size=size, marker=str(held), fresh=str(fresh))
    env = cli_env(TIERDIAG_WRITER="inline")
    proc = subprocess.Popen([sys.executable, "-c", code, "replay", str(sources["trace"]), "--db", str(db), *SMALL],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)
    deadline = time.monotonic() + 120
    while not held.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert creating.marker(db).exists()  # left by the killed replay
    runs = tierdiag_in_process("runs", "--db", db)
    if size:
        assert runs.code == 0 and "has no runs yet" in runs.out, runs.err
        assert tierdiag_in_process("summary", "--db", db).fails(4, "has no runs yet")
    else:
        assert runs.fails(4, "no database at")
    done = tierdiag_in_process("replay", sources["trace"], "--db", db, *SMALL)
    assert done.code == 0, done.err
    (run,) = tierdiag_in_process("runs", "--json", "--db", db).json()
    assert run["status"] == "complete" and not creating.marker(db).exists()


def test_holds_nothing_is_exact(sources):
    """Only whole 4 / 8 KiB cuts of a new database's header (any store's 4 KiB main header)."""
    fresh, store = sources["fresh"], sources["store"]
    assert creating._holds_nothing(fresh[:4096]) and creating._holds_nothing(fresh[:8192])
    assert creating._holds_nothing(store[:4096]) and not creating._holds_nothing(store[:8192])
    for size in (0, 1, 12, 4095, 4097, 8191, 8193, 12288):
        assert not creating._holds_nothing(fresh[:size])
    flipped = bytearray(fresh[:8192])
    flipped[5000] ^= 1
    assert not creating._holds_nothing(bytes(flipped))
    assert not creating._holds_nothing(bytes(4096)) and not creating._holds_nothing(b"x" * 8192)
