"""The one output writer (tierdiag/paths.py: `open_output`, `write_output`) where an output is
aimed at hostile places: a link planted at a temporary name, a FIFO, a device, a socket, a
folder, a link to the store or to an input, a loop. Whatever happens, the command fails in one
line with a documented exit code (2: the option names something it must not write; 6: cannot be
written) or writes exactly its output, and nothing that existed before is changed.

Issue 39, bugs 1 and 2: `.OUT.tmp` was written with `write_bytes`, following a link planted there
(`ln -s runs.duckdb .out.jsonl.tmp` replaced the store by the trace); a FIFO as `-o` hung in the
DuckDB-magic check (it opened the FIFO for reading); a character device was replaced by a
regular file.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import tempfile
import threading
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.support.cli import cli_argv, cli_env, completed_in_process, tierdiag, tierdiag_in_process
from tierdiag.errors import ExitCode, TierdiagError
from tierdiag import paths
from tierdiag.paths import is_duckdb_file

CONV = ('{"id": "c1", "block_size": 64, "requests": [{"t": 0, "in": 128, "out": 5, "hash_ids": [1, 2]}, '
        '{"t": 3, "in": 192, "out": 5, "hash_ids": [1, 2, 3], "think_time": 1.5}]}\n')
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _store(path: Path) -> Path:
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE runs (run_id VARCHAR)")
        con.execute("INSERT INTO runs VALUES ('r1')")
    return path


def snapshot(folder: Path) -> dict[str, tuple]:
    """Every entry under `folder` as it is (links not followed): kind, and bytes or target."""
    seen: dict[str, tuple] = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            p = Path(root) / name
            mode = p.lstat().st_mode
            rel = str(p.relative_to(folder))
            if stat.S_ISLNK(mode):
                seen[rel] = ("link", os.readlink(p))
            elif stat.S_ISREG(mode):
                seen[rel] = ("file", p.read_bytes(), stat.S_IMODE(mode))
            else:
                seen[rel] = (stat.S_IFMT(mode),)
    return seen


# --- bug 1: a link at the temporary name --------------------------------------------------------

def test_convert_never_writes_through_a_link_at_its_old_temporary_name(tmp_path):
    """Issue 39 bug 1, as reported: the store behind `.out.jsonl.tmp` stays the store."""
    (tmp_path / "conv.json").write_text(CONV)
    store = _store(tmp_path / "runs.duckdb")
    before = store.read_bytes()
    (tmp_path / ".out.jsonl.tmp").symlink_to("runs.duckdb")
    res = tierdiag_in_process("convert", "kv-cache-tester", "conv.json", "-o", "out.jsonl", cwd=tmp_path)
    assert res.code == 0, res.err
    assert store.read_bytes() == before and is_duckdb_file(store)
    assert os.readlink(tmp_path / ".out.jsonl.tmp") == "runs.duckdb"
    out = tmp_path / "out.jsonl"
    assert not out.is_symlink() and out.read_text().count("\n") == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.jsonl.tmp", "conv.json", "out.jsonl", "runs.duckdb"]


def _write_profile(path: Path) -> None:
    from tierdiag.config.profile import CLOCK_PARAMS, write_profile

    write_profile(path, model="tiny", gpu="cpu", clock={k: 1.0 for k in CLOCK_PARAMS}, fit={})


def _save_profile(path: Path) -> None:
    from tierdiag.engine.calibration import save_profile

    class Profile:
        def to_json(self):
            return {"x": 1}

    save_profile(Profile(), path)


def _report(path: Path) -> None:
    from tierdiag.report.page import write_atomic

    write_atomic(path, "<html></html>")


def _trace(path: Path) -> None:
    from tierdiag.trace.writer import write_jsonl

    write_jsonl(path, ['{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0]}'])


WRITERS = {"calibrate --from -o": _write_profile, "calibrate -o": _save_profile, "report -o": _report,
           "convert/synth": _trace}
# The names each writer used for its temporary file before the fix.
OLD_TMP = {"calibrate --from -o": ".{}.tmp", "calibrate -o": "{}.tmp", "report -o": ".{}.tmp", "convert/synth": ".{}.tmp"}


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_no_writer_follows_a_link_at_a_temporary_name(writer, tmp_path, monkeypatch):
    """A link at the old fixed name, and at the first name mkstemp would try: neither followed."""
    store = _store(tmp_path / "runs.duckdb")
    before = store.read_bytes()
    out = tmp_path / "out.file"
    (tmp_path / OLD_TMP[writer].format(out.name)).symlink_to("runs.duckdb")
    (tmp_path / f".{out.name}.planted.tmp").symlink_to("runs.duckdb")
    real = tempfile._get_candidate_names

    def planted_first():
        yield "planted"
        yield from real()

    monkeypatch.setattr(tempfile, "_get_candidate_names", planted_first)
    WRITERS[writer](out)
    assert store.read_bytes() == before
    assert out.is_file() and not out.is_symlink() and out.stat().st_size > 0


# --- bug 2: special files -----------------------------------------------------------------------

def test_a_fifo_nobody_reads_as_output_fails_at_once(tmp_path):
    """Issue 39 bug 2: `-o FIFO` hung in the DuckDB-magic check; now exit 6 at once, FIFO kept."""
    (tmp_path / "conv.json").write_text(CONV)
    os.mkfifo(tmp_path / "f.jsonl")
    res = tierdiag("convert", "kv-cache-tester", "conv.json", "-o", "f.jsonl", cwd=tmp_path, timeout=120)
    res.fails(ExitCode.IO, "f.jsonl", "FIFO")
    assert stat.S_ISFIFO((tmp_path / "f.jsonl").lstat().st_mode)


def test_a_fifo_with_a_reader_is_streamed_into(tmp_path):
    (tmp_path / "conv.json").write_text(CONV)
    fifo = tmp_path / "f.jsonl"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    res = tierdiag("convert", "kv-cache-tester", "conv.json", "-o", "f.jsonl", cwd=tmp_path, timeout=120)
    reader.join(timeout=60)
    assert res.code == 0, res.err
    assert got and got[0].count(b"\n") == 2
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conv.json", "f.jsonl"]  # no temporary file


def test_a_fifo_as_the_store_is_refused_without_blocking(tmp_path):
    (tmp_path / "t.jsonl").write_text('{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [0]}\n')
    os.mkfifo(tmp_path / "s.duckdb")
    res = tierdiag("replay", "t.jsonl", "--db", "s.duckdb", "--model", "tiny", "--gpu", "cpu", cwd=tmp_path,
                   timeout=120)
    res.fails(ExitCode.USAGE, "--db s.duckdb", "FIFO")


def test_the_duckdb_check_never_opens_a_fifo(tmp_path):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    done: list[bool] = []
    worker = threading.Thread(target=lambda: done.append(is_duckdb_file(fifo)), daemon=True)
    worker.start()
    worker.join(timeout=30)
    if worker.is_alive():  # unblock the stuck reader before failing
        with open(fifo, "wb"):
            pass
        pytest.fail("is_duckdb_file blocked on a FIFO")
    assert done == [False]


# Device nodes are made under tmp_path (root only), never the system's /dev/null or /dev/full:
# this file run against a writer without the fix (to see its tests fail) must not replace them.

@pytest.mark.skipif(not IS_ROOT, reason="making a device node needs root")
def test_a_character_device_node_is_streamed_into_not_replaced(tmp_path):
    """As root the old writer replaced a device node by a regular file."""
    (tmp_path / "conv.json").write_text(CONV)
    node = tmp_path / "null"
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers
    res = tierdiag_in_process("convert", "kv-cache-tester", "conv.json", "-o", "null", cwd=tmp_path)
    assert res.code == 0, res.err
    assert stat.S_ISCHR(node.lstat().st_mode) and node.lstat().st_rdev == os.makedev(1, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conv.json", "null"]


@pytest.mark.skipif(not IS_ROOT, reason="making a device node needs root")
def test_a_full_device_is_exit_6(tmp_path):
    (tmp_path / "conv.json").write_text(CONV)
    node = tmp_path / "full"
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 7))  # /dev/full's numbers: every write is ENOSPC
    res = tierdiag_in_process("convert", "kv-cache-tester", "conv.json", "-o", "full", cwd=tmp_path)
    res.fails(ExitCode.IO, "full", "No space left")
    assert stat.S_ISCHR(node.lstat().st_mode)


def test_a_socket_is_refused(tmp_path):
    (tmp_path / "conv.json").write_text(CONV)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tmp_path / "s.jsonl"))
        res = completed_in_process("synth", "s.jsonl", "--requests", "5", cwd=tmp_path)
    assert res.returncode == ExitCode.USAGE, res.stderr
    assert "socket" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert stat.S_ISSOCK((tmp_path / "s.jsonl").lstat().st_mode)


# --- property: any output location ---------------------------------------------------------------

KINDS = ["new", "regular", "link_to_store", "link_to_input", "input", "store", "tmp_links", "fifo", "folder",
         "socket", "under_a_file", "dangling_link", "link_loop", "read_only_folder", "char_device"]
NAMES = st.text(st.characters(blacklist_characters="/\x00", blacklist_categories=("Cs",)), min_size=1,
                max_size=30).filter(lambda s: s not in (".", "..") and len(os.fsencode(s)) < 200)


def _place(kind: str, folder: Path, name: str) -> tuple[Path, list]:
    """The output path for `kind` (made under `folder`), and the command's inputs."""
    store = _store(folder / "runs.duckdb")
    src = folder / "input.json"
    src.write_text(CONV)
    inputs = [("the input", src)]
    out = folder / name
    if out in (store, src):
        out = folder / ("x" + name)
    if kind == "regular":
        out.write_bytes(b"old\n")
        out.chmod(0o640)
    elif kind == "link_to_store":
        out.symlink_to(store)
    elif kind == "link_to_input":
        out.symlink_to(src)
    elif kind == "input":
        out = src
    elif kind == "store":
        out = store
    elif kind == "tmp_links":
        for tmp_name in (f".{out.name}.tmp", f"{out.name}.tmp", f".{out.name}.planted.tmp"):
            (folder / tmp_name).symlink_to(store)
    elif kind == "fifo":
        os.mkfifo(out)
    elif kind == "folder":
        out.mkdir()
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(out))
        sock.close()
    elif kind == "under_a_file":
        (folder / "afile").write_text("x")
        out = folder / "afile" / name
    elif kind == "dangling_link":
        out.symlink_to(folder / "nowhere" / "x")
    elif kind == "link_loop":
        out.symlink_to(out.name)
    elif kind == "read_only_folder":
        ro = folder / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        out = ro / name
    elif kind == "char_device":
        os.mknod(out, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a /dev/null of our own (root only)
    return out, inputs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(KINDS), name=NAMES, writer=st.sampled_from(["bytes", "trace"]))
def test_any_output_location_writes_exactly_the_output_or_fails_cleanly(kind, name, writer, monkeypatch):
    assume(kind != "char_device" or IS_ROOT)
    real = tempfile._get_candidate_names

    def planted_first():
        yield "planted"
        yield from real()

    monkeypatch.setattr(tempfile, "_get_candidate_names", planted_first)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        out, inputs = _place(kind, folder, name)
        before = snapshot(folder)
        payload = b'{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0]}\n'
        try:
            if writer == "bytes":
                paths.write_output(out, payload, what="-o", inputs=inputs)
            else:
                from tierdiag.trace.writer import write_jsonl

                write_jsonl(out, [payload.decode().rstrip("\n")], what="-o", inputs=inputs)
        except TierdiagError as exc:
            assert exc.exit_code in (ExitCode.USAGE, ExitCode.IO), (kind, exc)
            # one line once the CLI escapes what the name holds (a newline in a name is data)
            assert "\n" not in exc.one_line().replace(name, "")
            assert snapshot(folder) == before, kind
            assert kind not in ("new", "regular", "tmp_links", "char_device", "dangling_link"), (kind, exc)
            if kind == "read_only_folder":
                assert not IS_ROOT
            return
        finally:
            (folder / "ro").exists() and (folder / "ro").chmod(0o755)
        assert kind not in ("link_to_store", "link_to_input", "input", "store", "fifo", "folder", "socket",
                            "under_a_file", "link_loop"), kind
        after = snapshot(folder)
        rel = str(out.relative_to(folder)) if out.is_relative_to(folder) else None
        if kind == "char_device":
            assert after[rel] == before[rel]  # streamed into, still the device
        elif rel is not None:
            assert after[rel][:2] == ("file", payload)
            if kind == "regular":
                assert after[rel][2] == 0o640  # the old file's permissions are kept
        assert {k: v for k, v in after.items() if k != rel} == {k: v for k, v in before.items() if k != rel}
        assert is_duckdb_file(folder / "runs.duckdb")


# --- the same locations through the CLI: one line, the documented code, nothing changed ----------

CLI_KINDS = {  # kind: the exit code convert -o KIND gives (0: written)
    "new": 0, "regular": 0, "link_to_store": ExitCode.USAGE, "link_to_input": ExitCode.USAGE,
    "input": ExitCode.USAGE, "store": ExitCode.USAGE, "tmp_links": 0, "fifo": ExitCode.IO, "folder": ExitCode.IO,
    "socket": ExitCode.USAGE, "under_a_file": ExitCode.IO, "link_loop": ExitCode.IO,
}


@pytest.mark.parametrize("kind", sorted(CLI_KINDS))
def test_convert_output_locations_through_the_cli(kind, tmp_path):
    out, _ = _place(kind, tmp_path, "o.jsonl")  # tmp_links: links at the old temporary names
    before = snapshot(tmp_path)
    args = ("convert", "kv-cache-tester", tmp_path / "input.json", "-o", out)
    # A FIFO would block a writer that opened it as a file: a process, which the timeout ends.
    res = tierdiag(*args, timeout=120) if kind == "fifo" else tierdiag_in_process(*args)
    want = CLI_KINDS[kind]
    if want:
        res.fails(want)
        assert snapshot(tmp_path) == before
        return
    assert res.code == 0, res.err
    after = snapshot(tmp_path)
    rel = str(out.relative_to(tmp_path))
    assert after[rel][0] == "file" and after[rel][1].count(b"\n") == 2
    assert {k: v for k, v in after.items() if k != rel} == {k: v for k, v in before.items() if k != rel}


# --- a descriptor's name: -o /dev/stdout ---------------------------------------------------------

def test_convert_to_dev_stdout_redirected_to_a_file(tmp_path):
    """`-o /dev/stdout > f`: the trace goes through descriptor 1 itself (no temporary file in
    /proc), where the shell left it (`>>` appends), and the closing line goes to stderr."""
    (tmp_path / "conv.json").write_text(CONV)
    target = tmp_path / "t.jsonl"
    target.write_text("kept\n")
    with open(target, "ab") as fh:
        proc = subprocess.run(cli_argv("convert", "kv-cache-tester", "conv.json", "-o", "/dev/stdout"), stdout=fh,
                              stderr=subprocess.PIPE, text=True, env=cli_env(), cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = target.read_text().splitlines()
    assert lines[0] == "kept" and len(lines) == 3 and all(json.loads(x)["session"] == "c1" for x in lines[1:])
    assert "wrote 2 requests" in proc.stderr


def test_convert_to_dev_stdout_through_a_pipe(tmp_path):
    (tmp_path / "conv.json").write_text(CONV)
    proc = subprocess.run(cli_argv("convert", "kv-cache-tester", "conv.json", "-o", "/dev/stdout", "--json"),
                          capture_output=True, text=True, env=cli_env(), cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(x)["id"] for x in proc.stdout.splitlines()] == ["c1#1", "c1#2"]
    assert json.loads(proc.stderr)["num_requests"] == 2
