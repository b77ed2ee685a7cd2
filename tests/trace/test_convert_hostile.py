"""`tierdiag convert` under hostile input (issue 39): both formats' records are typed models
(`convert.records.record`, msgspec); whatever a record holds, convert writes a trace replay takes
or fails in one line naming `file:line` (exit 3) or the option (exit 2), leaving no output.

Bugs covered here: 3 (a file id equal to another file's sub-agent session merged two
conversations), 4 (sub-agent `t` counts from its spawn marker), 10 (think_time pauses adding up
past the clock), 11 (a 400-digit time), 23 (`--start-spread 1e9` blamed an innocent file), 24
(the `next:` command of `--block-size 16` failed; the unchained-blocks count).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.cli import tierdiag_in_process
from tierdiag.errors import ConfigError, ExitCode, TraceError
from tierdiag.trace.convert import ConvertOptions, convert, replay_options
from tierdiag.trace.convert.records import MAX_SECONDS
from tierdiag.trace.reader import MAX_ARRIVAL_NS, read_trace

REQ = {"t": 0.0, "in": 128, "out": 2, "hash_ids": [1, 2]}


def _kv(folder: Path, name: str, requests: list, **top) -> Path:
    path = folder / name
    path.write_text(json.dumps({"block_size": 64, **top, "requests": requests}, indent=1))
    return path


def _by_id(path: Path) -> dict[str, dict]:
    return {r["id"]: r for r in map(json.loads, path.read_text().splitlines())}


# --- bug 4: sub-agents at their markers ----------------------------------------------------------

def test_sub_agents_start_at_their_markers(tmp_path):
    """Markers at 10 s and 100 s, and one nested in the second at 5 s on its parent's clock: each
    sub-agent's t counts from its own marker (kv-cache-tester's replayer spawns a sub-agent when
    its parent reaches the marker). Before: every sub-agent request at its bare t (0, 2, ...)."""
    sub = lambda *ts: [{**REQ, "t": t, "hash_ids": [7, 8]} for t in ts]  # noqa: E731
    nested = {"t": 5.0, "type": "subagent", "requests": sub(0.0, 1.0)}
    src = _kv(tmp_path, "c.json", [
        REQ, {"t": 10.0, "type": "subagent", "requests": sub(0.0, 2.0)},
        {**REQ, "t": 50.0}, {"t": 100.0, "type": "subagent", "requests": [*sub(0.5), nested, *sub(30.0)]},
        {**REQ, "t": 200.0}], id="c")
    out = tmp_path / "o.jsonl"
    convert("kv-cache-tester", [src], out, ConvertOptions(block_size=64))
    ts = {k: v["timestamp"] for k, v in _by_id(out).items()}
    assert ts == {"c#1": 0, "c#2": 50_000, "c#3": 200_000,
                  "c/sa1#1": 10_000, "c/sa1#2": 12_000,
                  "c/sa2#1": 100_500, "c/sa2#2": 130_000,
                  "c/sa2/sa1#1": 105_000, "c/sa2/sa1#2": 106_000}
    # and each session's turns keep their order in the (sorted) output
    assert list(read_trace(out, block_size=64))


def test_a_sub_agent_marker_needs_its_time(tmp_path):
    src = _kv(tmp_path, "c.json", [REQ, {"type": "subagent", "requests": [REQ]}], id="c")
    with pytest.raises(TraceError, match=r"c.json:\d+: sub-agent entry: missing field 't'"):
        convert("kv-cache-tester", [src], tmp_path / "o.jsonl")
    assert not (tmp_path / "o.jsonl").exists()


# --- bug 3: one owner per session name -----------------------------------------------------------

@pytest.mark.parametrize("order", ["parent first", "id first"])
def test_a_file_id_equal_to_a_sub_agent_session_names_both_files(tmp_path, order):
    parent = _kv(tmp_path, "p.json", [REQ, {"t": 1.0, "type": "subagent", "requests": [REQ]}], id="x")
    clash = _kv(tmp_path, "q.json", [REQ], id="x/sa1")
    files = [parent, clash] if order == "parent first" else [clash, parent]
    with pytest.raises(TraceError) as info:
        convert("kv-cache-tester", files, tmp_path / "o.jsonl")
    msg = info.value.message
    assert str(files[1]) in msg and str(files[0]) in msg and '"x/sa1"' in msg and "\n" not in msg
    assert info.value.exit_code == ExitCode.BAD_INPUT and not (tmp_path / "o.jsonl").exists()


# --- bugs 10 and 11 in convert --------------------------------------------------------------------

def test_think_times_adding_up_past_the_clock_are_a_bad_record(tmp_path):
    """Each think_time is 1e9 s (under the bound); the session's pauses pass the clock at the
    5th turn. Before: exit 0, and the replay of the output failed (BIGINT overflow)."""
    reqs = [{**REQ, "t": float(i), "think_time": 1e9} for i in range(8)]
    src = _kv(tmp_path, "c.json", reqs, id="c")
    with pytest.raises(TraceError, match=r"c.json:\d+: 'think_time': in closed loop this turn of session \"c\""):
        convert("kv-cache-tester", [src], tmp_path / "o.jsonl")
    assert not (tmp_path / "o.jsonl").exists()


@pytest.mark.parametrize("fmt", ["kv-cache-tester", "bailian"])
def test_a_400_digit_time_is_a_bad_record_not_an_overflow(tmp_path, fmt):
    big = "1" + "0" * 400
    if fmt == "kv-cache-tester":
        src = tmp_path / "c.json"
        src.write_text('{"id": "c", "requests": [\n{"t": 0, "in": 64, "out": 1, "hash_ids": [1]},\n'
                       f'{{"t": 1, "in": 64, "out": 1, "hash_ids": [1], "think_time": {big}}}\n]}}\n')
        where, field = "c.json:3", "think_time"
    else:
        src = tmp_path / "u.jsonl"
        src.write_text('{"chat_id": 1, "timestamp": 0, "input_length": 16, "output_length": 1, "hash_ids": [1]}\n'
                       f'{{"chat_id": 2, "timestamp": {big}, "input_length": 16, "output_length": 1, "hash_ids": [1]}}\n')
        where, field = "u.jsonl:2", "timestamp"
    res = tierdiag_in_process("convert", fmt, src, "-o", tmp_path / "o.jsonl")
    res.fails(ExitCode.BAD_INPUT, f"{where}: '{field}' 1000", "too large")
    assert not (tmp_path / "o.jsonl").exists()


def test_a_lone_surrogate_in_a_session_name_is_a_bad_record(tmp_path):
    src = tmp_path / "c.json"
    src.write_text('{"id": "c\\ud800", "requests": [{"t": 0, "in": 64, "out": 1, "hash_ids": [1]}]}')
    with pytest.raises(TraceError, match=r"c.json:1: session name c\\ud800 is not valid Unicode"):
        convert("kv-cache-tester", [src], tmp_path / "o.jsonl")


# --- bug 23: --start-spread names itself ----------------------------------------------------------

def test_a_start_spread_too_wide_for_the_files_names_the_option(tmp_path):
    files = [_kv(tmp_path, f"f{i}.json", [REQ], id=f"c{i}") for i in range(8)]
    with pytest.raises(ConfigError, match=r"--start-spread 1e\+09 over 8 files places the last conversation start"):
        convert("kv-cache-tester", files, tmp_path / "o.jsonl", ConvertOptions(start_spread_s=1e9))
    res = tierdiag_in_process("convert", "kv-cache-tester", *files, "-o", tmp_path / "o.jsonl", "--start-spread", "1e9")
    line = res.fails(ExitCode.USAGE, "--start-spread")
    assert ".json:" not in line  # no innocent file blamed
    assert not (tmp_path / "o.jsonl").exists()


@pytest.mark.parametrize("spread", ["nan", "inf", "-1", "1e300"])
def test_start_spread_out_of_range(tmp_path, spread):
    src = _kv(tmp_path, "c.json", [REQ], id="c")
    tierdiag_in_process("convert", "kv-cache-tester", src, "-o", tmp_path / "o.jsonl", "--start-spread", spread).fails(
        ExitCode.USAGE, "--start-spread")


# --- bug 24: the next: command runs, the warning counts ids ---------------------------------------

@pytest.mark.parametrize("block_size", [16, 48, 64, 512, 1024])
def test_the_printed_next_command_runs(tmp_path, block_size):
    src = _kv(tmp_path, "c.json", [REQ, {**REQ, "t": 1.0, "in": 192, "hash_ids": [1, 2, 3], "think_time": 0.5}],
              id="c")
    res = tierdiag_in_process("convert", "kv-cache-tester", src, "-o", tmp_path / "out dir" / "o.jsonl",
                              "--block-size", block_size)
    assert res.code == 0, res.err
    (next_line,) = [ln for ln in res.out.splitlines() if ln.strip().startswith("next: ")]
    argv = shlex.split(next_line.strip()[len("next: "):])
    assert argv[:2] == ["tierdiag", "replay"]
    # exactly as printed (its store: tierdiag.duckdb in the current folder)
    ran = tierdiag_in_process(*argv[1:], cwd=tmp_path)
    assert ran.code == 0, ran.err
    assert (tmp_path / "tierdiag.duckdb").exists()


def test_replay_options_divide_the_block():
    assert replay_options(512) == []
    assert replay_options(16) == ["--block-size", "16", "--page-size", "16"]
    assert replay_options(64) == ["--block-size", "64"]
    assert replay_options(96) == ["--block-size", "96", "--page-size", "32"]
    assert replay_options(7) == ["--block-size", "7", "--page-size", "1"]


def test_unchained_blocks_count_distinct_ids(tmp_path):
    """Source id 5 follows 1 first, then 2 in nine more requests: one id, nine places."""
    reqs = [{**REQ, "t": 0.0, "hash_ids": [1, 5]}] + [{**REQ, "t": float(i), "hash_ids": [2, 5]} for i in range(1, 10)]
    src = _kv(tmp_path, "c.json", reqs, id="c")
    res = tierdiag_in_process("convert", "kv-cache-tester", src, "-o", tmp_path / "o.jsonl", "--block-size", "64",
                              "--json")
    assert res.code == 0, res.err
    got = json.loads(res.out)
    assert (got["unchained_blocks"], got["unchained_block_uses"]) == (1, 9)
    assert "1 distinct source block id(s) follow a different block than where first seen, at 9 place(s)" in res.err


# --- property: hostile values in every field, both formats ----------------------------------------

HOSTILE = st.one_of(
    st.sampled_from([None, True, False, "", " ", "12", [], {}, -1, -0.0, 0, 1e308, 10**400, -(10**400), 2**63,
                     float("nan"), float("inf"), MAX_SECONDS, MAX_SECONDS + 1, [1, True], [1.5], ["x"], [10**30]]),
    st.integers(), st.floats(), st.text(max_size=6), st.lists(st.integers(-3, 10), max_size=4))
KV_FIELDS = ["t", "in", "out", "hash_ids", "think_time", "type", "requests"]
BAILIAN_FIELDS = ["chat_id", "parent_chat_id", "timestamp", "input_length", "output_length", "hash_ids"]


def _dumps(obj) -> str:
    # Python's json writes NaN/Infinity literals, which both readers meet in the wild
    return json.dumps(obj)


def _check_outcome(tmp_path: Path, fmt: str, src: Path, bad_line: int | None) -> None:
    out = tmp_path / "o.jsonl"
    out.unlink(missing_ok=True)
    try:
        convert(fmt, [src], out, ConvertOptions(block_size=16))
    except (TraceError, ConfigError) as exc:
        assert exc.exit_code == ExitCode.BAD_INPUT, exc.message
        assert exc.message.startswith(f"{src}:") and "\n" not in exc.message, exc.message
        assert not out.exists()
        return
    reqs = list(read_trace(out, block_size=16))  # what convert writes, replay takes
    assert reqs and all(0 <= r.arrival_ns <= MAX_ARRIVAL_NS for r in reqs)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(KV_FIELDS), value=HOSTILE, nested=st.booleans())
def test_kv_cache_tester_any_value_in_any_field(tmp_path, field, value, nested):
    bad = {**REQ, "t": 1.0, "think_time": 0.5, field: value}
    second = {"t": 1.0, "type": "subagent", "requests": [REQ, bad]} if nested else bad
    src = tmp_path / "c.json"
    src.write_text(_dumps({"id": "c", "block_size": 64, "requests": [REQ, second]}))
    _check_outcome(tmp_path, "kv-cache-tester", src, None)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(BAILIAN_FIELDS), value=HOSTILE)
def test_bailian_any_value_in_any_field(tmp_path, field, value):
    first = {"chat_id": 1, "parent_chat_id": -1, "timestamp": 0.0, "input_length": 32, "output_length": 4,
             "hash_ids": [1, 2]}
    bad = {**first, "chat_id": 2, "parent_chat_id": 1, "timestamp": 5.0, "hash_ids": [1, 2, 3], "input_length": 48,
           field: value}
    src = tmp_path / "u.jsonl"
    src.write_text(_dumps(first) + "\n" + _dumps(bad) + "\n")
    _check_outcome(tmp_path, "bailian", src, 2)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(top=st.sampled_from(["id", "block_size", "hash_id_scope", "requests"]), value=HOSTILE)
def test_kv_cache_tester_any_top_level_value(tmp_path, top, value):
    src = tmp_path / "c.json"
    src.write_text(_dumps({"id": "c", "block_size": 64, "requests": [REQ], top: value}))
    _check_outcome(tmp_path, "kv-cache-tester", src, None)
