"""`python -m tests.sglang.drive TRACE ...` (issue 43: the harness driven with a workload it does not
have): bad options and bad traces are one line with the documented exit code before anything runs
(Hypothesis, hostile values for every option and hostile trace lines, the trace reader's own errors);
end to end on a small workload (sessions in closed loop, token ids over SGLang's output ids, an
`extra_key`, gzip) both sides agree and the command exits 0; a switch that makes SGLang differ
exits 1 with the first diverging step."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.sglang import drive
from tests.sglang import scheduler_harness as H
from tierdiag.errors import TraceError
from tierdiag.trace.reader import read_trace

ROOT = Path(__file__).resolve().parents[2]
SMALL = [  # two requests sharing a block, a third alone (block 512, Mooncake lines)
    {"timestamp": 0, "input_length": 700, "output_length": 3, "hash_ids": [1, 2]},
    {"timestamp": 0, "input_length": 900, "output_length": 5, "hash_ids": [1, 3]},
    {"timestamp": 5, "input_length": 300, "output_length": 2, "hash_ids": [4]},
]
# every option that takes a value, and what a valid one looks like
OPTIONS = ("--requests", "--time-scale", "--speedup", "--page-size", "--block-size", "--device-tokens",
           "--host-tokens", "--storage-tokens", "--write-policy", "--schedule-policy", "--eviction-policy",
           "--prefetch-policy", "--max-prefill-tokens", "--chunked-prefill-size", "--max-running-requests",
           "--arrivals", "--model", "--gpu", "--core", "--switch")


def _write(path: Path, lines: list) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def _outcome(argv: list[str]):
    """(exit code, message) of a refused command line; None when it would run."""
    try:
        drive.prepare(argv)
    except drive.DriveError as exc:
        return exc.code, str(exc)
    return None


hostile_text = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["", " ", "-1", "0", "1e400", "nan", "inf", "-inf", "9" * 40, "0x10", "1.5", "é", "\x1b[31m",
                     "[red]x[/red]", "--help", "-h", "1_000", "+7", "write_back ", "LRU", "\u0660"]),
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(option=st.sampled_from(OPTIONS), value=hostile_text)
def test_a_hostile_option_value_is_one_line_or_runs(tmp_path, option, value):
    """Any value of any option: refused with one line naming it (exit 2), or a workload that runs."""
    trace = _write(tmp_path / "t.jsonl", SMALL)
    got = _outcome([str(trace), f"{option}={value}", "--device-tokens=8192"]
                   if option != "--device-tokens" else [str(trace), f"{option}={value}"])
    if got is None:
        return
    code, message = got
    if code == drive.BAD_INPUT:  # another block size: the trace's hash ids no longer cover its lines
        assert option == "--block-size" and "'hash_ids' has" in message, message
    else:
        assert code == drive.USAGE, message
    assert "\n" not in message and "\x1b" not in message and message.strip()


@pytest.mark.parametrize("argv,code,says", [
    (["{t}", "--page-size=48"], 2, "--page-size 48 must be a power of two"),
    (["{t}", "--requests=0"], 2, "--requests"),
    (["{t}", "--speedup=0"], 2, "--speedup 0 must be above 0"),
    (["{t}", "--speedup=2", "--time-scale=0.5"], 2, "give one"),
    (["{t}", "--time-scale=0"], 2, "--time-scale"),
    (["{t}", "--host-tokens=64", "--device-tokens=8192"], 2, "HiCache needs host >= device"),
    (["{t}", "--device-tokens=256"], 2, "does not fit the device pool"),
    (["{t}", "--switch=nope"], 2, "--switch"),
    (["{t}", "--max-running-requests=0"], 2, "--max-running-requests 0 must be at least 1"),
    (["{t}", "--max-running-requests=2.5"], 2, "--max-running-requests"),
    (["{t}", "--json={t}"], 2, "is the trace itself"),
    (["{t}", "--bogus"], 2, "unrecognized arguments"),
    (["{t}", "--json={dir}"], 6, "is a folder"),
    (["{t}", "--json={t}/under/a/file.json"], 6, "--json"),
    (["{missing}"], 3, "no such trace file"),
    (["{dir}"], 3, "is a directory"),
])
def test_bad_input_is_one_line_with_its_exit_code(tmp_path, capsys, argv, code, says):
    t = _write(tmp_path / "t.jsonl", SMALL)
    argv = [a.format(t=t, missing=tmp_path / "nope.jsonl", dir=tmp_path) for a in argv]
    assert drive.main(argv) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and says in err[0], err


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.text(min_size=1, max_size=20).filter(lambda n: n not in (".", "..")))
def test_a_hostile_json_path_is_one_line_or_writable(tmp_path, name):
    """--json OUT is checked before the run: refused in one line (2, or 6 when it cannot be
    written), or writable, and nothing is left behind by the check."""
    trace = _write(tmp_path / "t.jsonl", SMALL)
    out = tmp_path / "out" / name
    got = _outcome([str(trace), f"--json={out}", "--device-tokens=8192"])
    if got is not None:
        code, message = got
        assert code in (drive.USAGE, drive.IO) and message.startswith("--json") and "\n" not in message
    else:
        assert not out.exists()  # the check created it and took it away again


def test_the_cap_is_the_one_both_sides_derive_and_no_more_than_the_requests(tmp_path):
    """--max-running-requests as replay takes it: derived for the harness's context (the longest
    request + 64) when not given, capped at half the device pool (SGLang 0.5.23), and given to
    both sides as at most the number of requests replayed (a cap they cannot reach)."""
    t = _write(tmp_path / "t.jsonl", SMALL)
    _, w = drive.prepare([str(t), "--device-tokens=8192"])
    assert w.max_running == 3  # derived: min(2048 .. 4096 estimate, 4096) = 2048, no more than the 3 requests
    _, w = drive.prepare([str(t), "--device-tokens=8192", "--max-running-requests=2"])
    assert w.max_running == 2 and w.engine_config()["max_running_requests"] == 2
    _, w = drive.prepare([str(t), "--device-tokens=2048", "--max-running-requests=1"])
    assert w.max_running == 1


def test_a_request_longer_than_the_req_to_token_pool_allows_is_refused(tmp_path):
    """SGLang's ReqToTokenPool (max_running x context int32 on the CPU): a config it cannot hold."""
    n = 2**24
    line = {"timestamp": 0, "input_length": n, "output_length": 1, "hash_ids": list(range(n // 512))}
    t = _write(tmp_path / "long.jsonl", [dict(line, id=str(i), timestamp=i) for i in range(80)])
    code, message = _outcome([str(t), f"--device-tokens={2 * n}"])
    assert code == drive.USAGE and "req_to_token" in message


_field_values = st.one_of(st.none(), st.booleans(), st.integers(-(2**65), 2**65), st.floats(allow_nan=True),
                          st.text(max_size=8), st.lists(st.integers(-3, 2**64), max_size=4))
hostile_line = st.one_of(
    st.text(max_size=40),
    st.builds(lambda d: json.dumps(d), st.dictionaries(st.sampled_from(
        ["timestamp", "input_length", "output_length", "hash_ids", "tokens", "id", "session", "think_ms", "priority",
         "extra_key", "other"]), _field_values, max_size=6)),
    st.builds(lambda k, v: json.dumps(dict(SMALL[0], **{k: v})),
              st.sampled_from(["timestamp", "input_length", "output_length", "hash_ids", "tokens", "session",
                               "think_ms", "priority", "id"]), _field_values),
)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bad=hostile_line, where=st.integers(0, 3), gz=st.booleans())
def test_a_hostile_trace_line_gets_the_readers_own_error(tmp_path, bad, where, gz):
    """A trace line replay refuses is refused here with the reader's words (`file:line: field ...`,
    exit 3); a trace replay reads, this reads."""
    lines = [json.dumps(x) for x in SMALL]
    lines.insert(where, bad)
    path = tmp_path / ("t.jsonl.gz" if gz else "t.jsonl")
    data = ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")
    path.write_bytes(gzip.compress(data) if gz else data)
    try:
        list(read_trace(path, block_size=512))
        expected = None
    except TraceError as exc:
        expected = " ".join(exc.one_line().split())
    got = _outcome([str(path), "--device-tokens=65536"])
    if expected is None:
        assert got is None or (got[0] == drive.USAGE and "device pool" in got[1]), got
    else:
        assert got == (drive.BAD_INPUT, expected)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tokens=st.lists(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=6), min_size=1, max_size=5),
       keys=st.lists(st.sampled_from([None, "a", "b"]), min_size=5, max_size=5))
def test_token_ids_are_renumbered_keeping_every_shared_prefix(tmp_path, tokens, keys):
    """Token ids past SGLang's output ids (2^30) and extra keys: renumbered below them, so that two
    requests share a token prefix on SGLang's side exactly where (same key) they share one in the trace."""
    lines = [{"id": f"r{i}", "timestamp": i, "input_length": len(t), "output_length": 1, "tokens": t,
              **({"extra_key": keys[i]} if keys[i] else {})} for i, t in enumerate(tokens)]
    t = _write(tmp_path / "tok.jsonl", lines)
    _, w = drive.prepare([str(t), "--page-size=1", "--device-tokens=64"])
    for a, ra in zip(lines, w.requests):
        assert all(0 < x < drive.OUTPUT_TOKEN_BASE for x in ra["tokens"])
        for b, rb in zip(lines, w.requests):
            for n in range(1, min(len(a["tokens"]), len(b["tokens"])) + 1):
                same = a.get("extra_key") == b.get("extra_key") and a["tokens"][:n] == b["tokens"][:n]
                assert (ra["tokens"][:n] == rb["tokens"][:n]) == same


@settings(max_examples=40, deadline=None)
@given(text=st.text(max_size=30))
def test_printed_trace_text_carries_no_control_character(text):
    """Request ids and file names reach the report: escaped, never a raw terminal escape."""
    out = drive.printable(text + "\n" + text)
    assert all(c.isprintable() for line in out.split("\n") for c in line)
    assert out.count("\n") == 1 + 2 * text.count("\n")  # the lines stay the lines


def _session_trace(path: Path) -> Path:
    """Three sessions of three turns (closed loop, think times), token ids up to 2^32 - 1, one session
    under an extra_key, gzip: what the harness's own case builders never produce."""
    import random

    rnd = random.Random(7)
    system = [rnd.randrange(2**32) for _ in range(300)]
    lines = []
    for s in range(3):
        hist = system + [rnd.randrange(2**32) for _ in range(rnd.randint(50, 300))]
        for k in range(3):
            lines.append({"id": f"s{s}-t{k}", "timestamp": 7 * s + 10 * k, "input_length": len(hist),
                          "output_length": rnd.randint(1, 12), "tokens": hist, "session": f"s{s}",
                          "think_ms": rnd.randint(0, 20), **({"extra_key": "lora"} if s == 2 else {})})
            hist = hist + [rnd.randrange(2**32) for _ in range(rnd.randint(30, 200))]
    lines.sort(key=lambda d: d["timestamp"])
    path.write_bytes(gzip.compress("".join(json.dumps(x) + "\n" for x in lines).encode()))
    return path


@pytest.mark.sglang
def test_end_to_end_on_a_small_workload(tmp_path):
    """The command as the steering team runs it, in a process of its own: both sides agree, exit 0,
    the JSON says so step by step and request by request."""
    from tests.support.sglang_wheels import unpacked_wheel

    unpacked_wheel(drive.VERSION)  # skips without the wheel, as the other harness tests
    trace = _session_trace(tmp_path / "agents.jsonl.gz")
    out = tmp_path / "out" / "cmp.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "tests.sglang.drive", str(trace), "--page-size=1",
                           "--device-tokens=2048", "--schedule-policy=lpm", "--json", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert doc["agree"] and doc["num_requests"] == 9 and len(doc["requests"]) == 9
    assert len(doc["steps"]) == doc["num_steps"] >= 3 and all(s["agree"] for s in doc["steps"])
    assert all(r["agree"] and r["sglang"]["ttft_ns"] > 0 for r in doc["requests"])
    assert "TTFT SGLang / engine: p50 1.0, p90 1.0, max 1.0" in proc.stdout


@pytest.mark.sglang
def test_a_difference_exits_1_with_the_first_diverging_step(tmp_path, capsys, sglang_0523_scheduler):
    """A workload the CI matrix checks (chunking at page 1, write_back), written as a trace file: as it
    is, it agrees; with SGLang switched back to allocating every output page at admission
    (`alloc_output`, issue 43's divergence 2/3) it differs, exit 1, both sides' first diverging request
    printed."""
    w = H.seeded(1, page_size=1, shape="chunk", write_policy="write_back")
    lines = [{"id": r["id"], "timestamp": r["arrival_ns"] // 1_000_000, "input_length": r["input_len"],
              "output_length": r["output_len"], "hash_ids": r["hash_ids"]} for r in w.requests]
    t = _write(tmp_path / "chunk.jsonl", lines)
    argv = [str(t), "--block-size=64", "--page-size=1", f"--device-tokens={w.device_pages}",
            f"--host-tokens={w.host_pages}", "--max-prefill-tokens=512", "--write-policy=write_back"]
    assert drive.main(argv, worker=sglang_0523_scheduler) == drive.AGREE, capsys.readouterr().out
    capsys.readouterr()
    assert drive.main(argv + ["--switch=alloc_output"], worker=sglang_0523_scheduler) == drive.DIFFER
    out = capsys.readouterr().out
    # every step agrees here; four requests' TTFTs move (the decode pages taken at admission)
    assert "requests: 20 of 24 agree (tier splits differ in 0, TTFT in 4)" in out
    assert "first diverging request" in out and "sglang=" in out and "engine=" in out


@pytest.mark.sglang
def test_a_small_cap_reaches_both_sides(tmp_path, capsys, sglang_0523_scheduler):
    """`--max-running-requests 3` on a burst workload whose 40 requests would otherwise run at once
    (scheduler_harness.crowd): both sides get the cap (SGLang's ReqToTokenPool rows through its
    own resolve_max_num_reqs) and agree on every step, exit 0."""
    w = H.crowd(0, page_size=64)
    lines = [{"id": r["id"], "timestamp": r["arrival_ns"] // 1_000_000, "input_length": r["input_len"],
              "output_length": r["output_len"], "hash_ids": r["hash_ids"]} for r in w.requests]
    t = _write(tmp_path / "crowd.jsonl", lines)
    argv = [str(t), "--block-size=64", "--page-size=64", f"--device-tokens={w.device_pages * 64}",
            f"--host-tokens={w.host_pages * 64}", "--max-prefill-tokens=1024", "--max-running-requests=3"]
    _, prepared = drive.prepare(argv)
    assert prepared.max_running == 3
    assert drive.main(argv, worker=sglang_0523_scheduler) == drive.AGREE, capsys.readouterr().out
    assert "requests: 40 of 40 agree" in capsys.readouterr().out


class _RaisingWorker:
    """Stands in for SGLang's worker where its Scheduler raised (as `worker.py` answers it: the
    error's text and its traceback), e.g. the hunt's "Prefill out of memory" workloads."""

    def run(self, spec):
        return {"error": "RuntimeError: Prefill out of memory. Try to lower your batch size.\nTry to allocate 497 "
                         "tokens.\n\x1b[31mAvailable tokens: 384\x1b[0m", "trace": "Traceback (most recent call last): ..."}


def test_sglang_failing_is_exit_5_not_a_difference(tmp_path, capsys):
    """When SGLang's own Scheduler raises (`alloc_paged_token_slots_extend`'s "Prefill out of memory"
    on a few hunt workloads: a real server's scheduler dies there), the driver says so in one line and
    exits 5, apart from 1 (the engine differs): the engine does not model SGLang failing. The JSON
    carries the error; no terminal escape reaches the screen."""
    w = H.seeded(1, page_size=1, shape="chunk", write_policy="write_back")
    lines = [{"id": r["id"], "timestamp": r["arrival_ns"] // 1_000_000, "input_length": r["input_len"],
              "output_length": r["output_len"], "hash_ids": r["hash_ids"]} for r in w.requests]
    t = _write(tmp_path / "chunk.jsonl", lines)
    out = tmp_path / "cmp.json"
    argv = [str(t), "--block-size=64", "--page-size=1", f"--device-tokens={w.device_pages}",
            f"--host-tokens={w.host_pages}", "--max-prefill-tokens=512", "--json", str(out)]
    assert drive.main(argv, worker=_RaisingWorker()) == drive.SGLANG_FAILED == 5
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "raised on this workload" in line]
    assert said == [f"SGLang {drive.VERSION}'s Scheduler raised on this workload: RuntimeError: Prefill out of "
                    "memory. Try to lower your batch size."]
    assert "\x1b" not in err
    doc = json.loads(out.read_text())
    assert doc["agree"] is False and doc["error"].startswith("RuntimeError: Prefill out of memory")
