"""Hostile file names and special files at every path a command takes (session 39, h49host's hunt).

What it found (input, before, after):

| input | before | after |
|---|---|---|
| `--db ':memory:x'` (any `:memory:NAME`) | the replay "recorded" its run into DuckDB's in-memory database: exit 0, nothing on disk | the file `./:memory:x`, as any other name |
| `--db '~/x.duckdb'` | DuckDB wrote `$HOME/x.duckdb`; every reader looked for `./~/x.duckdb` ("no database") | the file `./~/x.duckdb` |
| `--db md:x`, `motherduck:x`, `s3://b/x`, `http://h/x`, `NAME:...` | DuckDB tried to download an extension (MotherDuck, httpfs): exit 6, a network error | the file the name names (`./md:x`, `./s3:/b/x`) |
| `--db 'a\\b.duckdb'`, `export 'a\\e'` (a backslash) | DuckDB wrote `a/b.duckdb` (a folder separator to it), readers found nothing | exit 2, one line: DuckDB reads '\\' as a folder separator |
| `/dev/zero`, `/dev/full`, `/dev/urandom` as a trace, `--config`, `--profile`, a `convert` source or an `import sglang` export | read without end: a hang (the trace, `convert`, `import`), or memory growing until it ran out (`--config`, `--profile`: the whole "file" read first) | exit 2, one line: "is a character device, not a ... (read, it would never end)"; /dev/null and a pipe read as before |
| `export FILE` (a file, a device) | "cannot create F: File exists" | "cannot export into F: it is a file" (exit 6, as before) |

Every DuckDB open, attach and COPY target now goes through `paths.duckdb_name` (the absolute
path: DuckDB reads no prefix of one its own way), and every store name through
`check_duckdb_name`; each input that is read whole or by lines through `refuse_endless_input`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import SMALL, good_lines, tierdiag, tierdiag_in_process, write_trace  # noqa: E402

from tierdiag.errors import ConfigError  # noqa: E402
from tierdiag.paths import IN_MEMORY, check_duckdb_name, duckdb_name, refuse_endless_input  # noqa: E402
from tierdiag.store.reader import connect_with_retry  # noqa: E402

DEVICES = [d for d in ("/dev/zero", "/dev/full", "/dev/urandom") if os.path.exists(d)]


@pytest.fixture
def place(tmp_path, monkeypatch):
    """A working folder with a 6-request trace and its own HOME (nothing may land there)."""
    home = tmp_path / "home"
    home.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    trace = write_trace(work / "t.jsonl", good_lines(6))
    return work, home, trace


def _env(home: Path) -> dict:
    from tests.support.cli import cli_env

    return cli_env(HOME=str(home))


# --- names DuckDB reads its own way --------------------------------------------------------------

@pytest.mark.parametrize("name", [":memory:x", "md:x", "motherduck:x.duckdb", "~/x.duckdb", "s3://bucket/x.duckdb",
                                  "http://127.0.0.1:9/x.duckdb", "ab:c.duckdb"])
@pytest.mark.parametrize("direct", [False, True])
def test_a_store_named_as_duckdb_reads_a_name_its_own_way_is_that_file(place, name, direct):
    work, home, trace = place
    env = _env(home)
    code, _, err = tierdiag_in_process("replay", trace, "--db", name, *SMALL, env=env, cwd=work, direct=direct)
    assert code == 0, err
    on_disk = work / os.path.normpath(name)
    assert on_disk.is_file() and on_disk.read_bytes()[8:12] == b"DUCK", sorted(p.name for p in work.iterdir())
    assert not any(home.iterdir())
    code, out, err = tierdiag_in_process("runs", "--db", name, "--json", env=env, cwd=work, direct=direct)
    assert code == 0, err
    assert len(__import__("json").loads(out)) == 1
    code, _, err = tierdiag_in_process("export", "e~", "--db", name, env=env, cwd=work)
    assert code == 0, err


def test_export_into_a_folder_named_with_a_tilde_writes_there(place):
    work, home, trace = place
    env = _env(home)
    assert tierdiag_in_process("replay", trace, "--db", "s.duckdb", *SMALL, env=env, cwd=work).code == 0
    code, _, err = tierdiag_in_process("export", "~/out", "--db", "s.duckdb", env=env, cwd=work)
    assert code == 0, err
    assert list((work / "~" / "out" / "requests").iterdir())
    assert not any(home.iterdir())


@pytest.mark.parametrize("argv", [
    ("replay", "{trace}", "--db", "a\\b.duckdb", *SMALL),
    ("summary", "--db", "a\\b.duckdb"),
    ("runs", "--db", "a\\b.duckdb"),
    ("export", "a\\e", "--db", "s.duckdb"),
    ("sweep", "--resume", "a\\b.duckdb", "--db", "s.duckdb"),
])
def test_a_backslash_in_a_name_duckdb_opens_is_refused_before_anything_is_written(place, argv):
    work, home, trace = place
    env = _env(home)
    assert tierdiag_in_process("replay", trace, "--db", "s.duckdb", *SMALL, env=env, cwd=work).code == 0
    (work / "a").mkdir()
    before = sorted(p.relative_to(work) for p in work.rglob("*"))
    stored = (work / "s.duckdb").read_bytes()
    result = tierdiag_in_process(*(a.format(trace=trace) for a in argv), env=env, cwd=work)
    result.fails(2, "DuckDB reads '\\' in a file name as a folder separator")
    assert sorted(p.relative_to(work) for p in work.rglob("*")) == before
    assert (work / "s.duckdb").read_bytes() == stored


_NAME_CHARS = st.sampled_from(list("ab~:.-_ /") + ["md:", "s3://", ":memory:", "http://", "~/", "é", "[b]", "\x1b"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(_NAME_CHARS, min_size=1, max_size=6))
def test_every_name_opens_the_file_it_names(tmp_path, parts):
    """Hypothesis: a store name of DuckDB's prefixes, tildes, colons and slashes, relative to the
    working folder: `connect_with_retry` makes exactly the file the file system would."""
    name = "".join(parts).strip()
    assume(name and not name.endswith("/") and name not in (".", "..") and "\\" not in name)
    assume(all(len(c.encode()) <= 255 and c not in (".", "..") for c in name.split("/") if c))
    root = Path(tempfile.mkdtemp(dir=tmp_path))
    cwd = os.getcwd()
    os.chdir(root)
    try:
        target = Path(os.path.abspath(name))
        assume(root in target.parents)
        target.parent.mkdir(parents=True, exist_ok=True)
        assume(not target.exists())
        con = connect_with_retry(Path(name), read_only=False)
        con.execute("CREATE TABLE t AS SELECT 1 AS x")
        con.close()
        assert target.is_file() and target.read_bytes()[8:12] == b"DUCK"
        assert duckdb_name(name) == str(target)
    finally:
        os.chdir(cwd)


def test_the_in_memory_host_is_only_the_text_itself():
    con = connect_with_retry(IN_MEMORY, read_only=False)
    assert con.execute("SELECT path FROM duckdb_databases() WHERE database_name = current_database()"
                       ).fetchall()[0][0] is None
    con.close()
    assert duckdb_name(Path(IN_MEMORY)) == os.path.abspath(IN_MEMORY)
    with pytest.raises(ConfigError, match="folder separator"):
        check_duckdb_name("x\\y")
    check_duckdb_name("x/y:z~")


# --- inputs that never end -----------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_a_device_with_no_end_is_refused_as_every_input(device):
    for what, option in (("trace file", ""), ("TOML file", "--config"), ("calibrate profile", "--profile")):
        with pytest.raises(ConfigError, match="is a character device") as caught:
            refuse_endless_input(device, what=what, option=option)
        assert caught.value.args[0].startswith(f"{option} {device}".strip())


@pytest.mark.parametrize("path", [os.devnull, "/dev/stdin", "/no/such/file", "x\x00y"])
def test_what_ends_is_read_as_before(tmp_path, path):
    refuse_endless_input(path, what="trace file")  # /dev/null: empty; missing: the reader's own line
    refuse_endless_input(tmp_path, what="trace file")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    refuse_endless_input(fifo, what="trace file")  # a pipe ends when its writer does; never opened here


@pytest.mark.skipif(not DEVICES, reason="no /dev/zero")
@pytest.mark.parametrize("argv", [
    ("replay", "/dev/zero", "--db", "n.duckdb", *SMALL),
    ("replay", "{trace}", "--config", "/dev/zero", "--db", "n.duckdb", *SMALL),
    ("import", "sglang", "/dev/zero", "--db", "n.duckdb"),
])
def test_a_device_with_no_end_is_one_line_not_a_hang(place, argv):
    """In a process with a timeout: before, each of these ran until killed (the --config one
    growing without bound)."""
    work, home, trace = place
    result = tierdiag(*(a.format(trace=trace) for a in argv), env=_env(home), cwd=work, timeout=60)
    result.fails(2, "/dev/zero: is a character device")
    assert not (work / "n.duckdb").exists()


@pytest.mark.parametrize("argv,fragment", [
    (("replay", "/dev/full", "--db", "n.duckdb", *SMALL), "not a trace file"),
    (("replay", "{trace}", "--profile", "/dev/urandom", "--db", "n.duckdb", *SMALL), "--profile /dev/urandom: is a"),
    (("convert", "bailian", "/dev/full", "-o", "o.jsonl"), "/dev/full: is a character device"),
    (("convert", "kv-cache-tester", "/dev/full", "-o", "o.jsonl"), "/dev/full: is a character device"),
    (("sweep", "{trace}", "--set", "page_size=16,32", "--config", "/dev/full", "--db", "n.duckdb"), "--config /dev/full"),
])
def test_a_device_with_no_end_in_process(place, argv, fragment):
    work, home, trace = place
    if not os.path.exists(argv[1] if argv[1].startswith("/dev") else "/dev/full"):
        pytest.skip("no such device")
    result = tierdiag_in_process(*(a.format(trace=trace) for a in argv), env=_env(home), cwd=work)
    result.fails(2, fragment, "character device")
    assert sorted(p.name for p in work.iterdir()) == ["t.jsonl"]


def test_dev_null_and_a_pipe_are_still_read(place):
    work, home, trace = place
    tierdiag_in_process("replay", os.devnull, "--db", "n.duckdb", *SMALL, env=_env(home), cwd=work).fails(
        3, "no requests in the trace")
    proc = subprocess.run(["sh", "-c", f'cat "{trace}" | "$0" -c "$1" replay /dev/stdin --db n.duckdb '
                           + " ".join(SMALL), sys.executable, "from tierdiag.cli.main import main; main()"],
                          cwd=work, env=_env(home), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_export_into_a_file_names_it(place):
    work, home, trace = place
    env = _env(home)
    assert tierdiag_in_process("replay", trace, "--db", "s.duckdb", *SMALL, env=env, cwd=work).code == 0
    tierdiag_in_process("export", trace, "--db", "s.duckdb", env=env, cwd=work).fails(
        6, "cannot export into", "it is a file")
    assert trace.read_text() == "".join(x + "\n" for x in good_lines(6))


# --- a link to nothing ----------------------------------------------------------------------------

_TARGET_NAMES = st.sampled_from(["x.duckdb", "[bold]x.duckdb", "a b.duckdb", "é.duckdb", "x\x1b[31m.duckdb"])


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=_TARGET_NAMES, depth=st.integers(1, 3))
def test_a_db_linking_into_a_missing_folder_names_what_is_missing(tmp_path_factory, name, depth):
    """`--db L` where L links to a file in a folder that is not there: one line naming the link's
    target and the missing folder (DuckDB's own error named the link), exit 6, nothing made."""
    work = tmp_path_factory.mktemp("dangling")
    trace = write_trace(work / "t.jsonl", good_lines(6))
    missing = work.joinpath(*(f"gone{i}" for i in range(depth)))
    link = work / "l.duckdb"
    link.symlink_to(missing / name)
    result = tierdiag_in_process("replay", trace, "--db", link, *SMALL, cwd=work)
    line = result.fails(6, "it links to", "is not there")
    assert f"{work}/gone0" in line, "the missing folder is named"
    assert "\x1b" not in result.err
    assert sorted(p.name for p in work.iterdir()) == ["l.duckdb", "t.jsonl"]
    assert link.is_symlink() and not missing.exists()


def test_a_db_linking_to_a_new_file_in_a_folder_that_is_there_records_into_it(place):
    work, home, trace = place
    (work / "real").mkdir()
    link = work / "l.duckdb"
    link.symlink_to(work / "real" / "s.duckdb")
    assert tierdiag_in_process("replay", trace, "--db", link, *SMALL, env=_env(home), cwd=work).code == 0
    assert (work / "real" / "s.duckdb").is_file() and link.is_symlink()
    assert tierdiag_in_process("runs", "--db", link, env=_env(home), cwd=work).code == 0
