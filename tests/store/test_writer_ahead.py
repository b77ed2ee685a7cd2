"""The writer process started ahead of the replay (app/replay_writers.py `writer_ahead`, started at the
top of `tierdiag replay`): its start-up overlaps the CLI's checks, config and first trace line, and
where the command fails first (a bad option, config or trace, a signal) the process, still starting
or waiting for its first message, is ended at once: no store file made, no process left. Where it
is not asked for (nothing recorded, the inline writer, a refused TIERDIAG_WRITER, no process to be
had) nothing starts and the replay decides as before."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.support.cli import cli_argv, cli_env
from tierdiag.app.replay_writers import WriterInProcess, writer_ahead
from tierdiag.errors import ConfigError, TraceError
from tierdiag.store.writer_process import WriterProcess

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc (Linux)")


def _gone(pid: int) -> bool:
    """Reaped (no /proc entry) or at least not running (a zombie of another parent)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


class _Failed(Exception):
    pass


FAILURES = {"config": lambda: ConfigError("--page-size 3 must be a power of two"),
            "trace": lambda: TraceError("t.jsonl:1: bad JSON"), "interrupt": KeyboardInterrupt,
            "bug": lambda: _Failed("a bug before the replay")}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(delay_s=st.one_of(st.just(0.0), st.floats(0.0, 0.6)), failure=st.sampled_from(sorted(FAILURES)))
def test_a_caller_that_fails_while_the_writer_starts_ends_it_and_makes_nothing(tmp_path, monkeypatch, delay_s, failure):
    """Wherever the caller fails (its start-up, the writer's interpreter, its imports, or its wait
    for the first message), the error goes on unchanged, the writer is gone when the block is
    left, and no store file exists."""
    monkeypatch.setenv("TIERDIAG_WRITER", "process")
    db = tmp_path / f"never-{failure}-{delay_s:.3f}.duckdb"
    seen = []
    with pytest.raises(BaseException) as raised:
        with writer_ahead(db) as ahead:
            assert isinstance(ahead, WriterInProcess)
            proc = ahead.process._proc
            seen.append(proc)
            time.sleep(delay_s)
            raise FAILURES[failure]()
    assert type(raised.value) is type(FAILURES[failure]())
    (proc,) = seen
    assert proc.returncode is not None and _gone(proc.pid)  # reaped by the block, not left to exit later
    assert not db.exists()


def test_the_writer_is_still_starting_when_an_early_failure_ends_it(tmp_path, monkeypatch):
    """The window this closes: failing right after the spawn finds the child alive (its
    interpreter starting), and the block's exit ends it then and there."""
    monkeypatch.setenv("TIERDIAG_WRITER", "process")
    db = tmp_path / "s.duckdb"
    with pytest.raises(ConfigError):
        with writer_ahead(db) as ahead:
            proc = ahead.process._proc
            assert proc.poll() is None  # alive: ~0.2 s of start-up ahead of it
            raise ConfigError("bad")
    assert proc.returncode is not None and _gone(proc.pid)
    assert not db.exists()


def test_an_ahead_writer_that_is_handed_to_the_replay_records_the_run(tmp_path, monkeypatch):
    """The replay takes the started writer (no second process), records through it, and the
    block's exit afterwards has nothing left to reap."""
    from tierdiag.app.replay import replay
    from tierdiag.config.engine import EngineConfig

    monkeypatch.setenv("TIERDIAG_WRITER", "process")
    starts = []
    real = WriterProcess.start.__func__

    def counted(cls, *args, **kwargs):
        made = real(cls, *args, **kwargs)
        starts.append(made._proc)
        return made

    monkeypatch.setattr(WriterProcess, "start", classmethod(counted))
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(f'{{"timestamp": {i * 10}, "input_length": 1024, "output_length": 4, '
                             f'"hash_ids": [{i % 3}, {100 + i}]}}\n' for i in range(20)))
    db = tmp_path / "r.duckdb"
    with writer_ahead(db) as ahead:
        assert len(starts) == 1
        result = replay(trace, EngineConfig(model="tiny", gpu="cpu", device_tokens=4096), db=db, run_name="ahead",
                        probes=True, skip_bad=False, recording=ahead)
    assert len(starts) == 1 and result.writer == "process" and result.num_requests == 20
    assert starts[0].returncode is not None


def test_an_ahead_writer_before_an_empty_trace_is_ended_and_no_store_made(tmp_path, monkeypatch):
    from tierdiag.app.replay import replay
    from tierdiag.config.engine import EngineConfig

    monkeypatch.setenv("TIERDIAG_WRITER", "process")
    trace = tmp_path / "empty.jsonl"
    trace.write_text("")
    db = tmp_path / "r.duckdb"
    with pytest.raises(TraceError):
        with writer_ahead(db) as ahead:
            proc = ahead.process._proc
            replay(trace, EngineConfig(model="tiny", gpu="cpu", device_tokens=4096), db=db, run_name=None,
                   probes=True, skip_bad=False, recording=ahead)
    assert proc.returncode is not None and _gone(proc.pid)
    assert not db.exists()


@pytest.mark.parametrize("db, env", [(None, "process"), ("s.duckdb", "inline"), ("s.duckdb", "bogus")])
def test_nothing_starts_where_no_writer_process_is_asked_for(tmp_path, monkeypatch, db, env):
    """No --db (or --no-probes), the inline writer, or a TIERDIAG_WRITER the replay refuses (with
    its own line, in its order of checks): nothing spawned, None yielded."""
    monkeypatch.setenv("TIERDIAG_WRITER", env)
    monkeypatch.setattr(WriterProcess, "start", lambda *a, **k: pytest.fail("a writer process started"))
    with writer_ahead(None if db is None else tmp_path / db) as ahead:
        assert ahead is None


def test_no_process_to_be_had_yields_none_and_the_replay_decides(tmp_path, monkeypatch):
    monkeypatch.setenv("TIERDIAG_WRITER", "process")

    def no_process(*args, **kwargs):
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(WriterProcess, "start", no_process)
    with writer_ahead(tmp_path / "s.duckdb") as ahead:
        assert ahead is None


MARK = "TIERDIAG_TEST_MARK"


def _marked(mark: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if f"{MARK}={mark}".encode() not in (entry / "environ").read_bytes().split(b"\0"):
                continue
        except OSError:
            continue
        if not _gone(int(entry.name)):
            found.append(int(entry.name))
    return found


@pytest.mark.parametrize("case, code", [("bad option value", 2), ("db is the trace", 2), ("empty trace", 3),
                                        ("bad first line", 3)])
def test_the_cli_failing_after_the_early_spawn_leaves_one_line_no_store_and_no_process(tmp_path, case, code):
    """`tierdiag replay` spawns its writer before these checks; each fails as before (its one line,
    its exit code: a usage or config error 2, a trace error 3), makes no store, and leaves no
    process: none is found the moment the command exits."""
    import uuid

    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 64, "output_length": 4, "hash_ids": [1]}\n')
    db = tmp_path / "s.duckdb"
    extra: list[str] = []
    if case == "bad option value":
        extra = ["--page-size", "3"]
    elif case == "db is the trace":
        db = trace
    elif case == "empty trace":
        trace.write_text("")
    else:
        trace.write_text("{not json\n")
    mark = uuid.uuid4().hex
    proc = subprocess.run(cli_argv("replay", trace, "--db", db, "--model", "tiny", "--gpu", "cpu", *extra),
                          capture_output=True, text=True, timeout=120,
                          env=cli_env(TIERDIAG_WRITER="process", **{MARK: mark}))
    assert _marked(mark) == []
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tierdiag: ") and "Traceback" not in proc.stderr
    if db != trace:
        assert not db.exists()
    else:
        assert trace.read_text().startswith('{"timestamp"')  # the trace is left as it was
