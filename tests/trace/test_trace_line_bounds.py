"""Trace lines under hostile values (issue 39): every field's type and bounds are declared once
(`reader.line_model`, msgspec) and worded by `trace.fields`; whatever a line holds, reading it
either takes it or names `file:line` in one line (exit 3), and `--skip-bad` skips it.

Bug 10: `think_ms` within its own bound on several turns of one session added up past int64 in
closed loop (exit 1, "internal error"). Bug 11: `think_ms` written as a 400-digit integer was an
OverflowError (`math.isfinite` of an int), even with `--skip-bad`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.cli import tierdiag_in_process
from tierdiag.errors import ExitCode, TraceError
from tierdiag.trace.reader import MAX_ARRIVAL_NS, MAX_THINK_MS, NS_PER_MS, ReadReport, read_trace

GOOD = {"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [0, 1]}
SMALL = ("--model", "tiny", "--gpu", "cpu", "--device-tokens", "4096")


def _write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _turn(ts: int, think, hash_base: int) -> str:
    body = json.dumps({"timestamp": ts, "input_length": 600, "output_length": 2, "hash_ids": [hash_base, hash_base + 1],
                       "session": "s"})
    return body[:-1] + (f', "think_ms": {think}}}' if think is not None else "}")


# --- bug 11: a 400-digit integer ----------------------------------------------------------------

@pytest.mark.parametrize("field", ["think_ms", "timestamp", "input_length", "output_length", "priority"])
def test_a_400_digit_integer_is_a_bad_line_not_an_overflow(tmp_path, field):
    big = "1" + "0" * 400
    line = json.dumps({**GOOD, "session": "s", "think_ms": 5, field: "BIG"}).replace('"BIG"', big)
    path = _write(tmp_path, [json.dumps({**GOOD, "session": "s"}), line])
    with pytest.raises(TraceError) as info:
        list(read_trace(path))
    msg = info.value.message
    assert msg.startswith(f"{path}:2: '{field}' ") and "\n" not in msg, msg
    assert "too large" in msg or "does not fit" in msg
    report = ReadReport()
    assert len(list(read_trace(path, skip_bad=True, report=report))) == 1 and report.bad_lines == 1


def test_a_400_digit_think_ms_through_the_cli(tmp_path):
    path = _write(tmp_path, [_turn(0, None, 0), _turn(10, "1" + "0" * 400, 2)])
    res = tierdiag_in_process("replay", path, "--db", tmp_path / "r.duckdb", *SMALL)
    res.fails(ExitCode.BAD_INPUT, "t.jsonl:2: 'think_ms' 1000", "too large")
    res = tierdiag_in_process("replay", path, "--db", tmp_path / "r.duckdb", *SMALL, "--skip-bad", "--json")
    assert res.code == 0, res.err


@pytest.mark.parametrize("field", ["timestamp", "think_ms", "hash_ids"])
def test_a_lone_surrogate_where_a_number_belongs_is_a_bad_line(tmp_path, field):
    """Found by the property test below: msgspec failed to encode "\\ud800" while wording its error."""
    line = json.dumps({**GOOD, "session": "s", "think_ms": 1, field: "X"}).replace('"X"', '"\\ud800"')
    path = _write(tmp_path, [json.dumps(GOOD), line])
    with pytest.raises(TraceError, match=rf"t.jsonl:2: '{field}' (must be|holds text that is not valid Unicode)"):
        list(read_trace(path))


@pytest.mark.parametrize("field", ["id", "session", "extra_key"])
def test_a_lone_surrogate_in_text_is_a_bad_line(tmp_path, field):
    """json.loads takes "\\ud800"; the run could not store it (exit 1 when the run was written)."""
    line = json.dumps({**GOOD, "session": "s", "think_ms": 1, field: "X"}).replace('"X"', '"a\\ud800"')
    path = _write(tmp_path, [json.dumps(GOOD), line])
    with pytest.raises(TraceError, match=rf"t.jsonl:2: '{field}' holds text that is not valid Unicode"):
        list(read_trace(path))
    assert [r.line for r in read_trace(path, skip_bad=True)] == [1]


def test_a_lone_surrogate_through_replay_is_exit_3(tmp_path):
    path = _write(tmp_path, [json.dumps(GOOD).replace("}", ', "id": "a\\udfff"}')])
    res = tierdiag_in_process("replay", path, "--db", tmp_path / "r.duckdb", *SMALL)
    res.fails(ExitCode.BAD_INPUT, "t.jsonl:1: 'id' holds text that is not valid Unicode")


# --- bug 10: pauses that add up past the clock ---------------------------------------------------

def test_pauses_within_their_bound_that_add_up_past_the_clock_are_a_bad_line(tmp_path):
    """Each think_ms at its documented maximum; the session's third turn would arrive past
    MAX_ARRIVAL_NS in closed loop: that line is bad (the second just fits)."""
    path = _write(tmp_path, [_turn(0, None, 0), _turn(1, MAX_THINK_MS, 2), _turn(2, MAX_THINK_MS, 4)])
    assert MAX_THINK_MS * NS_PER_MS <= MAX_ARRIVAL_NS
    with pytest.raises(TraceError, match=r"t.jsonl:3: 'think_ms': in closed loop this turn of session \"s\" would "
                                         r"arrive past the latest time"):
        list(read_trace(path))
    report = ReadReport()
    reqs = list(read_trace(path, skip_bad=True, report=report))
    assert [r.line for r in reqs] == [1, 2] and report.bad_lines == 1


def test_a_skipped_turn_adds_no_pause(tmp_path):
    """--skip-bad: a bad line is no turn, so its pause does not count toward the session's clock."""
    half = MAX_THINK_MS // 2
    lines = [_turn(0, None, 0), _turn(1, MAX_THINK_MS, 2).replace('"output_length": 2', '"output_length": -1'),
             _turn(2, half, 4), _turn(3, half, 6)]
    reqs = list(read_trace(_write(tmp_path, lines), skip_bad=True))
    assert [r.line for r in reqs] == [1, 3, 4]


def test_pauses_past_the_clock_through_the_cli_are_exit_3(tmp_path):
    """Before: exit 1 "internal error" (BIGINT out of range) in closed loop."""
    path = _write(tmp_path, [_turn(0, None, 0)] + [_turn(i, MAX_THINK_MS // 2, 2 * i) for i in range(1, 5)])
    res = tierdiag_in_process("replay", path, "--db", tmp_path / "r.duckdb", *SMALL, "--arrivals", "closed")
    res.fails(ExitCode.BAD_INPUT, "t.jsonl:4: 'think_ms'", "would arrive past")


def test_a_time_scale_that_pushes_a_session_past_the_clock_names_the_line(tmp_path):
    """The reader bounds first timestamp + pauses unscaled; --time-scale 2 doubles the first
    arrival (not the pauses): the second turn would arrive past 2^62 ns in closed loop, the
    bound every arrival keeps so that what the engine adds stays in int64 (before: taken)."""
    half = MAX_THINK_MS // 2
    path = _write(tmp_path, [_turn(half, None, 0), _turn(half, half, 2)])
    res = tierdiag_in_process("replay", path, "--db", tmp_path / "r.duckdb", *SMALL, "--time-scale", "2")
    res.fails(ExitCode.BAD_INPUT, "t.jsonl:2: session \"s\": its first arrival times --time-scale 2 plus its pauses")
    res = tierdiag_in_process("replay", path, "--db", tmp_path / "r2.duckdb", *SMALL, "--time-scale", "2",
                              "--arrivals", "trace")
    assert res.code == 0, res.err  # open loop: the pauses place nothing


# --- property: any value in any field ------------------------------------------------------------

FIELDS = ["timestamp", "input_length", "output_length", "hash_ids", "tokens", "id", "priority", "extra_key",
          "session", "think_ms"]
HOSTILE_LITERALS = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1" + "0" * 400, "-" + "9" * 400, "true",
                    "false", "null", '""', '" "', "[]", "{}", "-0", "-0.0", "1e308", "0.5", "9223372036854775808",
                    "[1, 2.5]", "[true]", "[-1]", "[" + "1" + "0" * 30 + "]", '"\\u0000"', '"\\ud800"',
                    json.dumps("x" * 2000), "4611686018427", "4611686018428", "16777217"]
VALUES = st.one_of(st.sampled_from(HOSTILE_LITERALS),
                   st.integers().map(str),
                   st.floats(allow_nan=False, allow_infinity=False).map(json.dumps),
                   st.text(max_size=8).map(json.dumps),
                   st.lists(st.integers(-3, 2**64), max_size=4).map(json.dumps))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(FIELDS), literal=VALUES, drop=st.booleans())
def test_any_value_in_any_field_is_taken_or_named_by_file_and_line(tmp_path, field, literal, drop):
    base = {**GOOD, "timestamp": 5, "session": "s", "think_ms": 1}
    if drop:
        base.pop(field, None)
    body = json.dumps({k: v for k, v in base.items() if k != field})
    line = body[:-1] + f', "{field}": {literal}}}'
    path = tmp_path / "h.jsonl"
    path.write_text(json.dumps({**GOOD, "session": "s"}) + "\n" + line + "\n")
    try:
        reqs = list(read_trace(path))
    except TraceError as exc:
        assert exc.message.startswith(f"{path}:2: ") and "\n" not in exc.message, exc.message
        report = ReadReport()
        assert [r.line for r in read_trace(path, skip_bad=True, report=report)] == [1]
        assert report.bad_lines == 1
        return
    assert [r.line for r in reqs] == [1, 2]
    taken = reqs[1]
    assert 0 <= taken.arrival_ns <= MAX_ARRIVAL_NS and 1 <= taken.input_len
    if taken.think_ns is not None:
        assert 0 <= taken.think_ns <= MAX_ARRIVAL_NS
        assert math.isfinite(taken.think_ns)
