"""`tierdiag import sglang` at its edges (issue 32): numbers past what int64 ns can hold, lines
nested 100k deep, lone surrogates, invalid strings wherever the keys sit, exports through a
pipe, and an import interrupted or failing while it writes (all or nothing).

Every bad line is a TraceError naming `file:line` (exit 3), skipped and counted with --skip-bad;
never an internal error.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from tests.importers.sglang_export import record, write_export
from tierdiag import signals
from tierdiag.errors import RunInterrupted, TraceError
from tierdiag.importers.load import import_sglang
from tierdiag.importers.sglang_export import read_export

from tests.support.cli import ENTRY  # noqa: E402 - the one CLI entry
from tests.support.cli import completed_in_process


def good(rid: str = "g") -> dict:
    return record(rid, prompt=4, tokens=[1, 2, 3, 4], arrival_s=1.0)


def _reversed_keys(rec: dict) -> dict:
    return dict(reversed(list(rec.items())))


_PLAIN = json.dumps(record("b", prompt=4, tokens=[1, 2, 3, 4], text="hi"))
BAD_LINES = [
    # numbers whose ns (or token counts) do not fit int64 with what is added to them
    (json.dumps({**good("b"), "request_received_ts": 1e10}), "'request_received_ts' is 10000000000.0"),
    (json.dumps({**good("b"), "request_received_ts": 1e300}), "'request_received_ts' is 1e+300"),
    (json.dumps({**good("b"), "request_finished_ts": 1e300}), "'request_finished_ts'"),
    (json.dumps({**good("b"), "e2e_latency": 1e12}), "'e2e_latency' is 1000000000000.0"),
    (json.dumps({**good("b"), "first_token_latency": 1e300}), "'first_token_latency'"),
    (json.dumps({**good("b"), "queue_time": 1e12}), "'queue_time'"),
    (json.dumps({**good("b"), "completion_tokens": 2**63}), "'completion_tokens' is 9,223,372,036,854,775,808"),
    (json.dumps({**good("b"), "completion_tokens": 2**64}), "'completion_tokens'"),
    (json.dumps({**good("b"), "prompt_tokens": 2**63}), "'prompt_tokens'"),
    (json.dumps({**good("b"), "cached_tokens_details": {"device": 2**63, "host": 0}}), "cached_tokens_details.device"),
    (json.dumps({**good("b"), "num_retractions": 2**63}), "'num_retractions'"),
    # nesting past any parser's depth, as the object's value and as the line itself
    ('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    ('{"request_parameters": "{}", "id": "b", "prompt_tokens": 4, "x": ' + "{\"y\": " * 100_000 + "1"
     + "}" * 100_000 + "}", "nested too deeply"),
    # a lone surrogate (JSON's \ud800 escape) in any string that is stored
    (json.dumps(good("b\ud800")), "'id' holds \\ud800"),
    (json.dumps({**good("b"), "finish_reason": {"type": "abort", "message": "x\udfff"}}), "'finish_reason.message'"),
    (json.dumps({**good("b"), "cached_tokens": 2,
                 "cached_tokens_details": {"device": 2, "host": 0, "storage_backend": "\ud800"}}),
     "storage_backend"),
    # an invalid escape or a raw control character inside request_parameters, request_parameters
    # first (the layout SGLang writes) and last: refused the same either way
    (_PLAIN.replace("hi", "h\\qi", 1), "bad JSON"),
    (_PLAIN.replace("hi", "h\x01i", 1), "bad JSON"),
    (json.dumps(_reversed_keys(json.loads(_PLAIN))).replace("hi", "h\\qi", 1), "bad JSON"),
    (json.dumps(_reversed_keys(json.loads(_PLAIN))).replace("hi", "h\x01i", 1), "bad JSON"),
]


@pytest.mark.parametrize(("line", "message"), BAD_LINES, ids=range(len(BAD_LINES)))
def test_a_line_out_of_range_is_named_by_file_and_line_or_skipped(tmp_path, line, message):
    folder = tmp_path / "export"
    path = write_export(folder, "20251201_09", [good("a"), line, good("c")])
    for with_tokens in (False, True):
        with pytest.raises(TraceError) as exc:
            list(read_export([folder], with_tokens=with_tokens))
        assert exc.value.message.startswith(f"{path}:2: ") and message in exc.value.message, exc.value.message
    s = import_sglang([folder], db=tmp_path / "obs.duckdb", trace_out=tmp_path / "t.jsonl", skip_bad=True)
    assert (s.num_requests, s.bad_lines, s.trace_requests) == (2, 1, 2)


def test_the_cli_says_file_and_line_for_out_of_range_numbers(tmp_path):
    folder = tmp_path / "export"
    path = write_export(folder, "20251201_09", [good("a"), json.dumps({**good("b"), "request_received_ts": 1e300})])
    bad = completed_in_process("import", "sglang", str(folder), "--db", str(tmp_path / "o.duckdb"))
    assert bad.returncode == 3 and bad.stderr.count("\n") == 1 and f"{path}:2: " in bad.stderr, bad.stderr
    assert not (tmp_path / "o.duckdb").exists()


@pytest.mark.parametrize("gz", [False, True])
def test_an_export_read_through_a_pipe(tmp_path, gz):
    path = write_export(tmp_path / "export", "20251201_09", [good("a"), good("b")], gz=gz)
    cmd = [sys.executable, "-c", ENTRY, "import", "sglang", "/dev/stdin", "--db", str(tmp_path / "o.duckdb"),
           "--trace-out", str(tmp_path / "t.jsonl"), "--json"]
    with open(path, "rb") as fh:
        proc = subprocess.run(cmd, input=fh.read(), capture_output=True)
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)
    assert (s["num_requests"], s["trace_requests"]) == (2, 2)


# --- all or nothing -------------------------------------------------------------------------------

def _runs(db: Path) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("SELECT run_id, status, num_requests, (SELECT count(*) FROM requests) FROM runs").fetchall()
    finally:
        con.close()


@pytest.fixture
def handlers():
    """The CLI's signal handlers, in this process, for one test."""
    before = {s: signal.getsignal(s) for s in signals.HANDLED}
    signals.reset()
    signals.install()
    yield
    signals.reset()
    for s, h in before.items():
        signal.signal(s, h)


def test_interrupted_while_reading_records_nothing_and_says_so(tmp_path, handlers, monkeypatch):
    folder = tmp_path / "export"
    write_export(folder, "20251201_09", [good(f"r{i}") for i in range(3000)])
    monkeypatch.setattr("tierdiag.importers.load.PROGRESS_EVERY", 1000)
    calls = []

    def progress(records, done, total):
        calls.append(records)
        os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(BaseException) as exc:  # a bare KeyboardInterrupt would not say what was kept
        import_sglang([folder], db=tmp_path / "o.duckdb", trace_out=tmp_path / "t.jsonl", progress=progress)
    assert isinstance(exc.value, RunInterrupted), repr(exc.value)
    assert re.fullmatch(r"interrupted while reading the export; nothing recorded in .*o\.duckdb, no .*t\.jsonl written",
                        exc.value.message), exc.value.message
    assert calls == [1000]
    assert not (tmp_path / "o.duckdb").exists() and not (tmp_path / "t.jsonl").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["export"], "no spool left behind"


def test_interrupted_while_writing_records_the_whole_run_and_says_so(tmp_path, handlers, monkeypatch):
    """The issue's case: Ctrl-C while the rows go in left 16,384 of 32,000 requests as a failed run."""
    import tierdiag.store.copy_run as copy_run

    folder = tmp_path / "export"
    n = 20_000  # more than one chunk of rows (CHUNK_ROWS)
    write_export(folder, "20251201_09", [good(f"r{i}") for i in range(n)])
    real = copy_run.write_run_tables

    def interrupted_midway(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # lands inside the write: held until it is committed
        return real(*args, **kwargs)

    monkeypatch.setattr(copy_run, "write_run_tables", interrupted_midway)
    db = tmp_path / "o.duckdb"
    with pytest.raises(BaseException) as exc:
        import_sglang([folder], db=db)
    assert isinstance(exc.value, RunInterrupted), repr(exc.value)
    assert re.fullmatch(rf"interrupted after the import was recorded: run \S+ is complete in .*o\.duckdb "
                        rf"\({n:,} requests\)", exc.value.message), exc.value.message
    [(_, status, num, rows)] = _runs(db)
    assert (status, num, rows) == ("complete", n, n)


def test_a_failure_while_writing_records_nothing(tmp_path, monkeypatch):
    """The run row and the requests are one transaction: a failure half-way leaves no run at all."""
    import pyarrow as pa

    import tierdiag.store.copy_run as copy_run

    db = tmp_path / "o.duckdb"
    import_sglang([write_export(tmp_path / "first", "20251201_09", [good("a")])], db=db)
    before = _runs(db)
    folder = tmp_path / "export"
    write_export(folder, "20251201_09", [good(f"r{i}") for i in range(100)])
    real = copy_run.write_run_tables

    def broken_requests(db_, tables, *args, **kwargs):
        # the requests insert fails after the runs row went in (a column DuckDB cannot cast)
        bad = tables["requests"].set_column(tables["requests"].schema.get_field_index("seq"), "seq",
                                            pa.array(["x"] * tables["requests"].num_rows))
        return real(db_, {**tables, "requests": bad}, *args, **kwargs)

    monkeypatch.setattr(copy_run, "write_run_tables", broken_requests)
    with pytest.raises(Exception):
        import_sglang([folder], db=db)
    assert _runs(db) == before, "nothing of the failed import is in the store"
