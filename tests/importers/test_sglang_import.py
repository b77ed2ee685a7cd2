"""`tierdiag import sglang`: an export of two hours, read back row by row.

The export (finish order within each file; arrivals out of order across them)::

    20251201_09.log      a   miss (details null)        arrives 1.0 s, non-streaming
                         b   device hit 64 of 96        arrives 0.5 s (the first arrival)
    20251201_10.log.gz   c   tiered: 32 device, 64 host arrives 2.0 s, streaming
                         d   storage hit (backend)      arrives 3.0 s, prefetch wait 0.02 s
                         e   text only (no input_ids)   arrives 3.5 s
                         f   aborted, no first token    arrives 4.0 s
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from tests.importers.sglang_export import record, write_export
from tests.support.cli import completed_in_process
from tierdiag.errors import TraceError
from tierdiag.importers.load import import_sglang
from tierdiag.importers.sglang_export import read_export
from tierdiag.trace.reader import read_trace

MS = 1_000_000
SYS = list(range(1000, 1064))  # a 64-token system prompt every request starts with


def toks(n: int, salt: int) -> list[int]:
    return SYS + [salt * 1000 + i for i in range(n - len(SYS))]


def scenario(folder: Path) -> Path:
    write_export(folder, "20251201_09", [
        record("a", prompt=80, tokens=toks(80, 1), arrival_s=1.0, queue_s=0.002, ttft_s=0.040, e2e_s=0.3),
        record("b", prompt=96, device=64, tokens=toks(96, 2), arrival_s=0.5, queue_s=0.0, ttft_s=0.020, e2e_s=1.0),
    ])
    write_export(folder, "20251201_10", [
        record("c", prompt=112, device=32, host=64, tokens=toks(112, 3), arrival_s=2.0, stream=True,
               queue_s=0.004, ttft_s=0.060),
        record("d", prompt=128, device=0, host=0, storage=64, backend="HiCacheFile", tokens=toks(128, 4),
               arrival_s=3.0, prefetch_wait_s=0.02, ttft_s=0.080),
        record("e", prompt=70, device=64, text="hello " * 10, arrival_s=3.5),
        record("f", prompt=90, tokens=toks(90, 6), arrival_s=4.0, ttft_s=None,
               finish={"type": "abort", "message": "client disconnected", "status_code": 499}),
    ], gz=True)
    return folder


def rows(db: Path) -> dict[str, dict]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        cur = con.execute("SELECT * FROM requests")
        names = [d[0] for d in cur.description]
        return {row[names.index("req_id")]: dict(zip(names, row)) for row in cur.fetchall()}
    finally:
        con.close()


def test_import_records_one_row_per_request_with_the_servers_numbers(tmp_path):
    export = scenario(tmp_path / "export")
    db = tmp_path / "obs.duckdb"
    s = import_sglang([export], db=db, run_name="prod")
    assert (s.num_requests, s.num_aborted, s.num_with_ttft) == (6, 1, 5)
    assert [Path(f).name for f in s.files] == ["sglang-request-metrics-20251201_09.log",
                                              "sglang-request-metrics-20251201_10.log.gz"]
    r = rows(db)
    assert set(r) == set("abcdef")
    # Arrival is relative to b, the first to arrive (it finished second, in the first file).
    assert r["b"]["arrival_ns"] == 0 and r["a"]["arrival_ns"] == 500 * MS
    assert [k for k, _ in sorted(r.items(), key=lambda kv: kv[1]["seq"])] == list("bacdef")
    # a: a miss reported as null details -> all computed.
    a = r["a"]
    assert (a["hit_class"], a["device_hit_tokens"], a["host_hit_tokens"], a["storage_hit_tokens"],
            a["computed_tokens"]) == ("miss", 0, 0, 0, 80)
    assert (a["queue_ns"], a["ttft_ns"], a["first_token_ns"]) == (2 * MS, 40 * MS, 540 * MS)
    assert a["finish_ns"] == 800 * MS
    # c: tiered; d: storage hit with its prefetch wait.
    c, d = r["c"], r["d"]
    assert (c["hit_class"], c["device_hit_tokens"], c["host_hit_tokens"], c["computed_tokens"],
            c["prefix_indices_len"], c["extend_input_len"]) == ("tiered_hit", 32, 64, 16, 96, 16)
    assert (d["hit_class"], d["storage_hit_tokens"], d["computed_tokens"], d["storage_wait_ns"]) == \
        ("tiered_hit", 64, 64, 20 * MS)
    assert r["b"]["hit_class"] == "device_hit"
    # f: aborted before its first token: TTFT NULL, never 0.
    f = r["f"]
    assert (f["status"], f["reject_reason"], f["ttft_ns"], f["first_token_ns"]) == \
        ("aborted", "client disconnected", None, None)
    # What SGLang does not report stays NULL.
    for row in r.values():
        for col in ("loadback_ns", "loadback_bytes", "loadback_exposed_ns", "recomputed_tokens",
                    "cache_protected_len", "ideal_ttft_ns", "compute_ns", "host_match_tokens"):
            assert row[col] is None, (row["req_id"], col)
    con = duckdb.connect(str(db), read_only=True)
    kind, timing, status, n = con.execute("SELECT kind, timing, status, num_requests FROM runs").fetchone()
    con.close()
    assert (kind, timing, status, n) == ("observed", "observed", "complete", 6)
    assert s.storage_backends == ["HiCacheFile"]


def test_trace_out_is_in_arrival_order_and_leaves_text_only_requests_out(tmp_path):
    export = scenario(tmp_path / "export")
    trace = tmp_path / "twin.jsonl"
    s = import_sglang([export], db=tmp_path / "obs.duckdb", trace_out=trace)
    assert (s.trace_requests, s.trace_text_only) == (5, 1)
    assert any("text only" in w and "--skip-tokenizer-init" in w and "--log-requests-level" in w
               for w in s.warnings)
    lines = [json.loads(x) for x in trace.read_text().splitlines()]
    assert [x["id"] for x in lines] == list("bacdf")
    assert [x["timestamp"] for x in lines] == [0, 500, 1500, 2500, 3500]
    assert lines[2]["tokens"] == toks(112, 3) and lines[2]["input_length"] == 112
    assert lines[0]["output_length"] == 8
    # The trace is one tierdiag replay reads as it is.
    reqs = list(read_trace(trace))
    assert [q.req_id for q in reqs] == list("bacdf")
    assert not list(trace.parent.glob(".twin.jsonl*")), "spool and temp files are removed"


def test_an_export_without_enable_metrics_has_no_times_and_says_so(tmp_path):
    folder = tmp_path / "export"
    write_export(folder, "20251201_09", [
        record("x", prompt=80, device=64, tokens=toks(80, 1), metrics=False),
        record("y", prompt=80, tokens=toks(80, 2), metrics=False),
    ])
    s = import_sglang([folder], db=tmp_path / "obs.duckdb", trace_out=tmp_path / "t.jsonl")
    r = rows(tmp_path / "obs.duckdb")
    assert all(r[k][c] is None for k in "xy" for c in ("arrival_ns", "queue_ns", "ttft_ns", "finish_ns"))
    assert r["x"]["device_hit_tokens"] == 64 and r["y"]["computed_tokens"] == 80
    assert not s.metrics_enabled and s.trace_requests == 0 and s.trace_no_arrival == 2
    assert any("--enable-metrics" in w for w in s.warnings)


def test_details_absent_leaves_the_split_null_but_not_the_computed_tokens(tmp_path):
    folder = tmp_path / "export"
    write_export(folder, "20251201_09", [record("x", prompt=80, device=64, details="absent", tokens=toks(80, 1))])
    import_sglang([folder], db=tmp_path / "obs.duckdb")
    x = rows(tmp_path / "obs.duckdb")["x"]
    assert (x["device_hit_tokens"], x["host_hit_tokens"], x["computed_tokens"], x["hit_class"]) == \
        (None, None, 16, None)


@pytest.mark.parametrize("line, message", [
    ("{not json", "bad JSON"),
    ('["a list"]', "expected a JSON object"),
    (json.dumps(record("z", prompt="80")), "prompt_tokens"),  # type: ignore[arg-type]
    (json.dumps({**record("z", prompt=80), "cached_tokens": 90}), "exceeds 'prompt_tokens'"),
    (json.dumps(record("z", prompt=80, device=64, host=32, cached=80)), "more than 'prompt_tokens'"),
    (json.dumps({**record("z", prompt=80), "first_token_latency": -1.0}), "first_token_latency"),
    (json.dumps(record("a", prompt=80)), "duplicate request id 'a'"),
])
def test_a_malformed_line_is_named_by_file_and_line_or_skipped(tmp_path, line, message):
    folder = tmp_path / "export"
    path = write_export(folder, "20251201_09", [record("a", prompt=80, tokens=toks(80, 1)), line,
                                                record("b", prompt=80, tokens=toks(80, 2))])
    with pytest.raises(TraceError) as exc:
        list(read_export([folder], with_tokens=True))
    assert exc.value.message.startswith(f"{path}:2: ") and message in exc.value.message
    s = import_sglang([folder], db=tmp_path / "obs.duckdb", skip_bad=True)
    assert (s.num_requests, s.bad_lines) == (2, 1) and s.first_bad[0].startswith(f"{path}:2: ")


def test_bad_request_parameters_only_matter_when_tokens_are_read(tmp_path):
    rec = record("z", prompt=80, tokens=toks(79, 1))  # 79 ids for 80 prompt tokens
    path = write_export(tmp_path / "e", "20251201_09", [rec])
    assert len(list(read_export([path]))) == 1
    with pytest.raises(TraceError, match=r":1: 'request_parameters' has 79 input_ids but 'prompt_tokens' is 80"):
        list(read_export([path], with_tokens=True))


def test_nan_written_by_pythons_json_dump_is_a_bad_value_not_a_crash(tmp_path):
    line = json.dumps(record("z", prompt=80, tokens=toks(80, 1))).replace('"e2e_latency": 0.2', '"e2e_latency": NaN')
    path = write_export(tmp_path / "e", "20251201_09", [line])
    with pytest.raises(TraceError, match=r":1: 'e2e_latency' is nan"):
        list(read_export([path]))


def test_a_file_that_is_not_an_export_says_so(tmp_path):
    trace = tmp_path / "mooncake.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n')
    with pytest.raises(TraceError) as exc:
        import_sglang([trace], db=tmp_path / "x.duckdb", skip_bad=True)
    assert "not an SGLang request-metrics export" in exc.value.one_line()
    assert "replay it with `tierdiag replay`" in exc.value.one_line()
    text = tmp_path / "notes.log"
    text.write_text("INFO server started\n")
    with pytest.raises(TraceError, match="first line is not JSON"):
        import_sglang([text], db=tmp_path / "x.duckdb", skip_bad=True)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TraceError, match="no sglang-request-metrics-"):
        import_sglang([empty], db=tmp_path / "x.duckdb")
    assert not (tmp_path / "x.duckdb").exists(), "a bad export creates no database"


def test_cli_exit_codes_and_one_line_errors(tmp_path):
    folder = tmp_path / "export"
    path = write_export(folder, "20251201_09", [record("a", prompt=80, tokens=toks(80, 1)), "{oops"])
    cmd = ["import", "sglang", str(folder), "--db", str(tmp_path / "o.duckdb")]
    bad = completed_in_process(*cmd)  # the CLI in this process: its lines and codes, not its start
    assert bad.returncode == 3 and bad.stderr.count("\n") == 1 and f"{path}:2: bad JSON" in bad.stderr
    ok = completed_in_process(*cmd, "--skip-bad", "--json", "--trace-out", str(tmp_path / "t.jsonl"))
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["num_requests"] == 1 and "skipped 1 bad line" in ok.stderr


@pytest.mark.parametrize("ids", [[1, -2, 3], [1, 2.5, 3], [[1, 2], 3]])
def test_input_ids_must_be_a_flat_list_of_non_negative_integers(tmp_path, ids):
    rec = record("z", prompt=3, tokens=ids)  # type: ignore[arg-type]
    path = write_export(tmp_path / "e", "20251201_09", [rec])
    with pytest.raises(TraceError, match=r":1: 'request_parameters' input_ids must be a flat list"):
        list(read_export([path], with_tokens=True))


def test_files_are_read_in_the_hour_order_of_their_names_whatever_the_arguments(tmp_path):
    late = write_export(tmp_path / "e", "20251201_23", [record("late", prompt=80)])
    early = write_export(tmp_path / "e", "20251130_02", [record("early", prompt=80)], gz=True)
    other = tmp_path / "renamed.log"
    other.write_text(json.dumps(record("other", prompt=80)) + "\n")
    from tierdiag.importers.sglang_export import export_files

    assert export_files([other, late, tmp_path / "e", early]) == [early, late, other]
    assert [r.req_id for r in read_export([tmp_path / "e"])] == ["early", "late"]


def test_the_fast_path_and_the_full_parse_read_the_same_record(tmp_path):
    """SGLang's key order takes the fast path; any other order (or spacing) the full parse."""
    rec = record("x", prompt=80, device=64, tokens=toks(80, 1), arrival_s=1.0)
    reordered = {k: rec[k] for k in reversed(list(rec))}
    compact = json.dumps(rec, separators=(",", ":"))
    for i, line in enumerate((json.dumps(rec), json.dumps(reordered), compact)):
        path = write_export(tmp_path / str(i), "20251201_09", [line])
        (r,) = read_export([path], with_tokens=True)
        assert (r.req_id, r.device_tokens, r.ttft_s, json.loads(r.input_ids)) == ("x", 64, 0.05, toks(80, 1))


@pytest.mark.parametrize("bad", ["[1,,2]", "[01, 2]", "[1 2]"])
def test_malformed_input_ids_are_caught_on_the_fast_path_too(tmp_path, bad):
    line = json.dumps(record("z", prompt=2, tokens=[7, 8])).replace("[7, 8]", bad)
    path = write_export(tmp_path / "e", "20251201_09", [line])
    with pytest.raises(TraceError, match=r":1: 'request_parameters' (does not hold a request: JSON is malformed|input_ids)"):
        list(read_export([path], with_tokens=True))


def test_progress_reports_records_and_bytes(tmp_path, monkeypatch):
    import tierdiag.importers.load as load

    monkeypatch.setattr(load, "PROGRESS_EVERY", 2)
    export = scenario(tmp_path / "export")
    calls: list[tuple[int, int, int]] = []
    import_sglang([export], db=tmp_path / "o.duckdb", progress=lambda *a: calls.append(a))
    assert [c[0] for c in calls] == [2, 4, 6]
    assert calls[0][1] > 0 and calls[0][2] == sum(f.stat().st_size for f in export.iterdir())


def test_a_last_line_cut_short_is_left_out_with_a_warning_not_an_error(tmp_path):
    """An export read while SGLang is still writing its last record (or after a crash)."""
    path = write_export(tmp_path / "e", "20251201_09", [record("a", prompt=80), record("b", prompt=80)])
    cut = json.dumps(record("c", prompt=80))[:-40]
    with open(path, "a") as fh:
        fh.write(cut)  # no newline: the write is still going on
    s = import_sglang([path], db=tmp_path / "o.duckdb")
    assert s.num_requests == 2 and s.bad_lines == 0
    assert any(f"incomplete last line(s) (the server still writing, or a crash), first at {path}:3" in w
               for w in s.warnings)
