"""A replay's start-up (issue 41's floor row): OpenBLAS kept to one thread unless the user says
otherwise, the trace's digest taken on a thread beside the engine's import (and not at all
when nothing is recorded), and the replay's own table of dataclass methods
(tierdiag/dataclass_code.py) covering what a replay makes, and the writer process's own table."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.cli.cli_helpers import REPLAY_ARGS, _env, write_late_trace
from tierdiag.app import replay as app_replay

_NAMES = st.sampled_from([*app_replay.BLAS_THREAD_VARIABLES, "MKL_NUM_THREADS", "OPENBLAS_THREAD_TIMEOUT", "PATH",
                          "openblas_num_threads"])
_VALUES = st.one_of(st.sampled_from(["", "0", "1", "4", "-1", "nan", "1e9", " 2 ", "caf\u00e9", "\x1b[31m", "\\n"]),
                    st.text(max_size=12))


@settings(max_examples=200, deadline=None)
@given(environ=st.dictionaries(_NAMES, _VALUES, max_size=5))
def test_blas_goes_to_one_thread_only_where_the_user_set_no_thread_count(environ):
    """Any of OpenBLAS's own variables set, to anything (empty, 0, negative, not a number,
    unicode, escapes): left as it is, nothing added. None set: OPENBLAS_NUM_THREADS=1, nothing
    else touched."""
    before = dict(environ)
    changed = app_replay.single_threaded_blas(environ)
    user_set = any(k in before for k in app_replay.BLAS_THREAD_VARIABLES)
    assert changed is (not user_set)
    assert environ == (before if user_set else {**before, "OPENBLAS_NUM_THREADS": "1"})


_THREADS = ("import os, sys\nfrom tierdiag.app.replay import single_threaded_blas\nsingle_threaded_blas()\n"
            "import numpy\nprint(len(os.listdir('/proc/self/task')), os.environ.get('OPENBLAS_NUM_THREADS'))\n")


@pytest.mark.skipif(not os.path.isdir("/proc/self/task") or (os.cpu_count() or 1) < 2, reason="Linux, 2+ CPUs")
def test_numpy_loads_without_blas_threads_unless_asked():
    """The process (and what it starts) loads numpy's OpenBLAS with no thread beside its own; a
    user's OPENBLAS_NUM_THREADS or OMP_NUM_THREADS stays theirs."""
    env = {k: v for k, v in _env().items() if k not in app_replay.BLAS_THREAD_VARIABLES}

    def threads(**extra) -> list[str]:
        out = subprocess.run([sys.executable, "-c", _THREADS], capture_output=True, text=True, timeout=120,
                             env={**env, **extra})
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    assert threads() == ["1", "1"]
    assert threads(OPENBLAS_NUM_THREADS="2") == ["2", "2"]
    assert threads(OMP_NUM_THREADS="2") == ["2", "None"]


def test_the_digest_on_its_thread_is_the_files_or_raises_what_reading_it_raised(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(b"x" * 3_000_001)
    assert app_replay._Digest(trace).result() == hashlib.sha256(trace.read_bytes()).hexdigest()
    from tierdiag.errors import TraceError

    missing = app_replay._Digest(tmp_path / "gone.jsonl")
    with pytest.raises(TraceError, match="gone.jsonl: no such trace file"):
        missing.result()


def test_a_recorded_replay_names_its_traces_digest_and_an_unrecorded_one_takes_none(tmp_path, monkeypatch):
    """The run row's trace_sha256 is the file's (taken beside the engine's import); --no-probes
    hashes nothing."""
    from tierdiag.config.engine import EngineConfig
    from tierdiag.store.reader import open_store

    trace = write_late_trace(tmp_path / "t.jsonl", num_requests=30)
    cfg = EngineConfig(model="tiny", gpu="cpu", device_tokens=12288, host_tokens=20480)
    monkeypatch.setenv("TIERDIAG_WRITER", "inline")
    made = []
    real = app_replay._Digest
    monkeypatch.setattr(app_replay, "_Digest", lambda path: made.append(path) or real(path))
    app_replay.replay(trace, cfg, db=None, run_name=None, probes=False, skip_bad=False)
    assert made == []
    db = tmp_path / "r.duckdb"
    res = app_replay.replay(trace, cfg, db=db, run_name=None, probes=True, skip_bad=False)
    assert made == [trace]
    with open_store(db) as con:
        (sha,) = con.execute("SELECT trace_sha256 FROM runs WHERE run_id = ?", [res.run_id]).fetchone()
    assert sha == hashlib.sha256(trace.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def bytecode(tmp_path_factory) -> Path:
    """A pycache prefix holding the .pyc files of what a recorded replay and its writer process
    import (one replay written with bytecode on), without the dataclass tables that replay wrote
    at its exit: the two tests below start from a copy each, so their processes read compiled
    modules instead of compiling every module from source where bytecode is not written
    (~1.4 s of CPU a replay and its writer). The tables, what the tests are about, start absent."""
    folder = tmp_path_factory.mktemp("bytecode")
    prefix = folder / "pycache"
    env = _env(PYTHONPYCACHEPREFIX=str(prefix), TIERDIAG_WRITER="process")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    trace = write_late_trace(folder / "t.jsonl", num_requests=20)
    r = subprocess.run([sys.executable, "-m", "tierdiag", "replay", str(trace), *map(str, REPLAY_ARGS), "--db",
                        str(folder / "r.duckdb")], capture_output=True, text=True, timeout=300, env=env, cwd=folder)
    assert r.returncode == 0, r.stderr
    for table in prefix.glob("**/*.marshal"):
        table.unlink()
    assert list(prefix.glob("**/*.pyc"))
    return prefix


def _pycache_from(bytecode: Path, tmp_path: Path) -> Path:
    prefix = tmp_path / "pycache"
    shutil.copytree(bytecode, prefix)
    return prefix


def test_the_replays_table_covers_a_replay_and_outputs_stay_the_same(tmp_path, bytecode):
    """`python -m tierdiag.cli.dataclass_code` writes the replay's table beside the read
    commands'; a replay (recorded by the writer process and not, text and --json, each into a
    fresh store) then compiles no dataclass method of its own (the table is not written again),
    and prints what it prints without the table. (An inline writer's close, or a store holding
    runs already, makes classes the table learns at that replay's exit, where bytecode is
    written.)"""
    from tierdiag.cli.dataclass_code import TABLES, load

    prefix = _pycache_from(bytecode, tmp_path)
    base = _env(PYTHONPYCACHEPREFIX=str(prefix), TIERDIAG_WRITER="process")
    base.pop("PYTHONDONTWRITEBYTECODE", None)
    trace = write_late_trace(tmp_path / "t.jsonl", num_requests=30)
    entry = "import tierdiag.cli.main as m; m.entry()"

    def replays(env, series: str) -> list[tuple]:
        out = []
        (tmp_path / series).mkdir()
        for i, extra in enumerate((["--no-probes", "--json"], ["--no-probes"], ["--json"], [])):
            r = subprocess.run([sys.executable, "-c", entry, "replay", str(trace), *map(str, REPLAY_ARGS), *extra,
                                "--db", f"r{i}.duckdb", "--run-name", "r"], capture_output=True, text=True,
                               timeout=300, env=env, cwd=tmp_path / series)
            assert r.returncode == 0, r.stderr
            text = r.stdout
            if "--json" in extra:
                import json

                doc = json.loads(text)
                for k in ("wall_s", "wall_phases", "run_id", "db_path"):
                    doc.pop(k)
                text = doc
            else:  # the closing table's wall and run id lines move run to run
                text = [line for line in text.splitlines() if "wall" not in line and "run " not in line]
            out.append((text, r.stderr))
        return out

    plain = replays({**base, "PYTHONDONTWRITEBYTECODE": "1"}, "plain")
    assert not list(prefix.glob("**/*.marshal"))
    built = subprocess.run([sys.executable, "-m", "tierdiag.cli.dataclass_code"], capture_output=True, text=True,
                           timeout=300, env={**base, "PYTHONDONTWRITEBYTECODE": "1"})
    assert built.returncode == 0, built.stderr
    [table] = list(prefix.glob(f"**/{TABLES['replay']}.*.marshal"))
    [writer_table] = list(prefix.glob(f"**/{TABLES['writer']}.*.marshal"))  # the writer process's own
    before, writer_before = table.read_bytes(), writer_table.read_bytes()
    load_before, writer_load_before = load(str(table)), load(str(writer_table))
    assert len(load_before) > 100 and len(writer_load_before) > 300
    warm = replays(base, "warm")
    for got, want in zip(warm, plain):
        assert got == want, "\n".join(map(str, (got[0], want[0])))
    new = set(load(str(table))) - set(load_before)
    assert not new, [k[:300] for k in new][:5]  # nothing new compiled: nothing written back
    assert table.read_bytes() == before
    # The writer process (two of the replays recorded through it, its close run) compiled
    # nothing the table lacked either: it writes back only what is new.
    new = set(load(str(writer_table))) - set(writer_load_before)
    assert not new, [k[:300] for k in new][:5]
    assert writer_table.read_bytes() == writer_before


def test_the_writer_process_learns_its_table_where_bytecode_is_written(tmp_path, bytecode):
    """A recorded replay's writer process (ended by os._exit, no atexit) writes the methods it
    compiled to its table once its close has run, where bytecode is written, and not where it is
    not (PYTHONDONTWRITEBYTECODE); the next writer compiles none of them again."""
    from tierdiag.cli.dataclass_code import TABLES, load

    trace = write_late_trace(tmp_path / "t.jsonl", num_requests=20)

    def replay(env, db: str) -> None:
        r = subprocess.run([sys.executable, "-m", "tierdiag", "replay", str(trace), *map(str, REPLAY_ARGS),
                            "--json", "--db", db], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
        assert r.returncode == 0, r.stderr

    prefix = _pycache_from(bytecode, tmp_path)
    env = _env(PYTHONPYCACHEPREFIX=str(prefix), TIERDIAG_WRITER="process")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    replay({**env, "PYTHONDONTWRITEBYTECODE": "1"}, "a.duckdb")
    assert not list(prefix.glob("**/*.marshal"))
    replay(env, "b.duckdb")
    [table] = list(prefix.glob(f"**/{TABLES['writer']}.*.marshal"))
    learnt = load(str(table))
    assert len(learnt) > 300  # the evidence's, the writer's, the read-ahead's classes
    before = table.read_bytes()
    replay(env, "c.duckdb")
    assert table.read_bytes() == before  # nothing new the second time: not written again
