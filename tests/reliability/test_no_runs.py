"""A store with no run in it, and a --db that is no store at all, for every reader (docs/contract.md
§7, "A store with no runs").

A replay killed while it makes a new store (kill -9 of its process: nobody is left to remove the
file) leaves a 0-byte file, DuckDB's header alone, a schema begun, or a schema with no runs row
(checkpointed, or still in DuckDB's log); deleting a store's last run leaves the same. Every one
is one answer: `runs` lists no run (exit 0: its one line, `--json` `[]`), every command that
needs a run says `DB has no runs yet` (exit 4), with the replay that records one as its hint.
What is no store keeps its own line (missing, a dangling link, a link loop, a folder, a file that
is not DuckDB: exit 4; a FIFO or a device: exit 2, never opened). No reader changes, adds or
removes a byte of any of it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
import stat
import tempfile
import threading
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import SMALL, good_lines, write_trace

from tests.support.cli import tierdiag_in_process
from tierdiag.store.schema import OLDEST_READABLE_VERSION, columns_missing_in, create_statements
from tierdiag.store.writer import init_store


def _zero_bytes(p: Path) -> None:
    p.write_bytes(b"")


def _duckdb_header(p: Path) -> None:
    duckdb.connect(str(p)).close()


def _schema_begun(p: Path) -> None:  # an older tierdiag, killed between its CREATE TABLEs
    with duckdb.connect(str(p)) as con:
        for stmt in create_statements()[:3]:
            con.execute(stmt)


def _schema(p: Path) -> None:
    with duckdb.connect(str(p)) as con:
        init_store(con)


def _schema_in_log(p: Path) -> None:
    """The schema committed to DuckDB's log (DB.wal) and never checkpointed: what a kill -9 after
    the schema's commit leaves."""
    con = duckdb.connect(str(p))
    con.execute("PRAGMA disable_checkpoint_on_shutdown")
    con.execute("SET checkpoint_threshold = '1TB'")
    init_store(con)
    con.close()
    assert Path(f"{p}.wal").stat().st_size > 0


def _older_schema(p: Path) -> None:
    """The oldest schema this tierdiag reads, no run in it."""
    with duckdb.connect(str(p)) as con:
        init_store(con)
        for table, cols in columns_missing_in(OLDEST_READABLE_VERSION).items():
            for col in cols:
                con.execute(f"ALTER TABLE {table} DROP COLUMN {col}")
        con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(OLDEST_READABLE_VERSION)])


def _every_run_deleted(p: Path) -> None:
    with duckdb.connect(str(p)) as con:
        init_store(con)
        con.execute("INSERT INTO runs (run_id, name, status) VALUES ('r1', 'gone', 'complete')")
        con.execute("INSERT INTO requests (run_id, req_id, seq) VALUES ('r1', 'a', 0)")
    deleted = tierdiag_in_process("runs", "--delete", "r1", "--db", p)
    assert deleted.code == 0, deleted.err
    assert tierdiag_in_process("runs", "--json", "--db", p).json() == []


def _cut(size: int, *, marked: bool):
    """A new store cut between DuckDB's first writes (its main header, then its two database
    headers, 4 KiB each), as a kill there leaves it; `marked`: with the marker a replay leaves
    beside a store it is making (store/creating.py), which says it was tierdiag's."""
    def make(p: Path) -> None:
        from tierdiag.store import creating

        with tempfile.TemporaryDirectory() as tmp:
            duckdb.connect(f"{tmp}/fresh.duckdb").close()
            p.write_bytes(Path(f"{tmp}/fresh.duckdb").read_bytes()[:size])
        if marked:
            creating.begin(p)

    return make


NO_RUNS = {"zero bytes": _zero_bytes, "duckdb header": _duckdb_header, "schema begun": _schema_begun,
           "schema": _schema, "schema in the log": _schema_in_log, "older schema": _older_schema,
           "every run deleted": _every_run_deleted,
           # a replay's creation cut inside DuckDB's header (issue 41, session 39)
           "cut at 4 KiB, marked": _cut(4096, marked=True), "cut at 8 KiB, marked": _cut(8192, marked=True)}


def _text(p: Path) -> None:
    p.write_text("id,name\n1,a\n")


def _noise(p: Path) -> None:
    p.write_bytes(bytes(range(256)) * 20)


def _folder(p: Path) -> None:
    p.mkdir()


def _dangling(p: Path) -> None:
    p.symlink_to(p.parent / "gone.duckdb")


def _loop(p: Path) -> None:
    p.symlink_to(p.name)


def _fifo(p: Path) -> None:
    os.mkfifo(p)


@contextlib.contextmanager
def _writers_come(fifo: Path):
    """A reader that opened the FIFO would wait for a writer for ever: after 10 s one comes and
    goes (the reader reads nothing) every 0.1 s until the call returns, so that the test fails
    rather than hangs."""
    done = threading.Event()

    def come() -> None:
        done.wait(10)
        while not done.is_set():
            with contextlib.suppress(OSError):  # ENXIO: no reader waits on it now
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            done.wait(0.1)

    writer = threading.Thread(target=come, daemon=True)
    writer.start()
    try:
        yield
    finally:
        done.set()
        writer.join()


def _device(p: Path) -> None:
    p.symlink_to("/dev/null")


# kind -> (make it, exit code, what the one line says)
NOT_A_STORE = {"missing": (lambda p: None, 4, "no database at"),
               "dangling link": (_dangling, 4, "which is not there"),
               "link loop": (_loop, 4, "cannot read"),
               "folder": (_folder, 4, "is a folder, not a database file"),
               "text": (_text, 4, "is not a DuckDB database"),
               "noise": (_noise, 4, "is not a DuckDB database"),
               # no marker: tierdiag cannot say it was its own; refused, the hint says what to do
               "cut at 8 KiB, unmarked": (_cut(8192, marked=False), 4, "remove it to record into this path"),
               "fifo": (_fifo, 2, "is a FIFO (named pipe), not a database file"),
               "device": (_device, 2, "is a character device, not a database file")}

# Every command that reads a store; OUT (a path beside the store) where it writes one.
READERS = [("runs",), ("runs", "--json"), ("runs", "--delete", "r1"), ("summary",), ("summary", "--json"),
           ("slow",), ("slow", "--json"), ("slow", "--by", "rank"), ("explain", "a"), ("explain", "a", "--json"),
           ("report", "-o", "OUT"), ("report", "--compare", "r1", "r2", "-o", "OUT"),
           ("report", "--sweep", "s", "-o", "OUT"),
           ("compare",), ("compare", "r1", "r2"), ("compare", "r1", "r2", "--json"), ("compare", "--sweep", "s"),
           ("compare", "r1", "r2", "--requests"), ("export", "OUT"), ("export", "OUT", "--all"),
           ("advise",), ("calibrate", "--from", "r1", "-o", "OUT")]

# A file name as a user may give one: blanks, quotes, shell and Rich markup characters, letters
# of other scripts; no control character (printed escaped), no slash.
NAMES = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp"), blacklist_characters="/\\"),
                min_size=1, max_size=24).filter(
    lambda s: s not in (".", "..", "out-x", "gone.duckdb") and len(s.encode()) <= 96)


def _snapshot(root: Path) -> dict:
    """Every entry under root as it is on disk (links not followed): kind, size, time, bytes."""
    seen = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st_ = p.lstat()
            if stat.S_ISLNK(st_.st_mode):
                seen[str(p)] = ("link", os.readlink(p))
            elif stat.S_ISREG(st_.st_mode):
                seen[str(p)] = ("file", st_.st_size, st_.st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            else:
                seen[str(p)] = (stat.S_IFMT(st_.st_mode), st_.st_mtime_ns)
    return seen


def _no_runs_line(db: Path) -> str:
    return f"{db} has no runs yet (record one with `tierdiag replay TRACE --db {shlex.quote(str(db))}`)"


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Each no-run kind made once (its files), copied into each example's folder."""
    root = tmp_path_factory.mktemp("kinds")
    out = {}
    for kind, make in NO_RUNS.items():
        folder = root / kind.replace(" ", "-")
        folder.mkdir()
        make(folder / "s.duckdb")
        out[kind] = folder
    return out


def _place(made: dict, kind: str, folder: Path, name: str) -> Path:
    db = folder / name
    if kind in NO_RUNS:
        for f in made[kind].iterdir():
            shutil.copy2(f, folder / (name + f.name[len("s.duckdb"):]))
    else:
        NOT_A_STORE[kind][0](db)
    return db


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(sorted(NO_RUNS) + sorted(NOT_A_STORE)), reader=st.sampled_from(READERS),
       name=NAMES, direct=st.booleans())
def test_every_reader_gives_one_answer_and_leaves_the_file_as_it_was(made, kind, reader, name, direct):
    with tempfile.TemporaryDirectory(prefix="nr") as tmp:
        folder = Path(tmp)
        db = _place(made, kind, folder, name)
        args = [str(folder / "out-x") if a == "OUT" else a for a in reader]
        before = _snapshot(folder)
        with _writers_come(db) if kind == "fifo" else contextlib.nullcontext():
            code, out, err = tierdiag_in_process(*args, "--db", db, direct=direct)
        assert _snapshot(folder) == before, f"{reader} changed what is at --db (or wrote an output)"
    assert "Traceback" not in err, err
    if kind in NO_RUNS and reader[0] == "runs" and "--delete" not in reader:
        assert code == 0 and err == "", err
        if "--json" in reader:
            assert json.loads(out) == []
        else:
            assert out.splitlines() == [_no_runs_line(db)]
        return
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tierdiag: error: "), err
    if kind in NO_RUNS:
        assert code == 4 and lines[0] == f"tierdiag: error: {_no_runs_line(db)}", lines[0]
    else:
        _, want_code, says = NOT_A_STORE[kind]
        assert code == want_code and says in lines[0] and str(db) in lines[0], (code, lines[0])


@pytest.mark.parametrize("kind", sorted(NO_RUNS))
def test_the_hint_records_a_run_as_printed(made, tmp_path, kind):
    """The line's hint, run as printed (TRACE a real trace), records a run where `runs` said none."""
    trace = write_trace(tmp_path / "t.jsonl", good_lines(8))
    db = _place(made, kind, tmp_path, "it's a store.duckdb")
    line = tierdiag_in_process("runs", "--db", db).out.strip()
    hint = line[line.index("`") + 1:line.rindex("`")]
    argv = shlex.split(hint)
    assert argv[:3] == ["tierdiag", "replay", "TRACE"] and argv[3:] == ["--db", str(db)], argv
    done = tierdiag_in_process(*argv[1:2], trace, *argv[3:], *SMALL)
    assert done.code == 0, done.err
    (run,) = tierdiag_in_process("runs", "--json", "--db", db).json()
    assert run["status"] == "complete" and run["num_requests"] == 8


def test_the_default_store_hint_names_no_db(tmp_path):
    (tmp_path / "tierdiag.duckdb").write_bytes(b"")
    r = tierdiag_in_process("summary", cwd=tmp_path)
    r.fails(4, "tierdiag.duckdb has no runs yet (record one with `tierdiag replay TRACE`)")
    assert tierdiag_in_process("runs", cwd=tmp_path).out == "tierdiag.duckdb has no runs yet (record one with " \
                                                            "`tierdiag replay TRACE`)\n"
