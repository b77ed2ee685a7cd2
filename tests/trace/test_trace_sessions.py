"""Sessions in the trace format: `session` / `think_ms` per line, each turn's predecessor, and
what synth writes for them."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierdiag.errors import TraceError
from tierdiag.trace.reader import MAX_SESSION_CHARS, MAX_THINK_MS, ReadReport, TraceRequest, read_trace
from tierdiag.trace.sessions import predecessors
from tierdiag.trace.synth import DECODE_MS_PER_TOKEN, DEMO_TRACE, SynthConfig, generate

MS = 1_000_000
BASE = {"input_length": 600, "output_length": 4, "hash_ids": [0, 1]}


def write(tmp_path, *lines) -> object:
    path = tmp_path / "t.jsonl"
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def line(ts: int, **extra) -> dict:
    return {"timestamp": ts, **BASE, **extra}


def test_session_and_think_ms_parse_and_default_to_none(tmp_path):
    path = write(tmp_path, line(0, session="a"), line(1), line(2, session="a", think_ms=1500),
                 line(3, session="b", think_ms=0.25), line(4, session=None, think_ms=None))
    got = [(r.session, r.think_ns) for r in read_trace(path)]
    assert got == [("a", None), (None, None), ("a", 1500 * MS), ("b", 250_000), (None, None)]
    report = ReadReport()
    list(read_trace(path, report=report))
    assert not report.unknown_keys


def test_trace_request_keeps_its_positional_fields():
    # Callers that build TraceRequests without the new fields keep working.
    r = TraceRequest("x", 0, 1, 0, 10, 1, (0,), None)
    assert (r.session, r.think_ns, r.priority, r.extra_key) == (None, None, 0, None)


@pytest.mark.parametrize(("extra", "words"), [
    ({"session": 7}, "'session' must be a string"),
    ({"session": ""}, "'session' is empty"),
    ({"session": "  "}, "'session' is empty"),
    ({"session": "s" * (MAX_SESSION_CHARS + 1)}, f"'session' is .* characters long \\(at most {MAX_SESSION_CHARS}\\)"),
    ({"session": "a", "think_ms": "5"}, "'think_ms' must be a number"),
    ({"session": "a", "think_ms": True}, "'think_ms' must be a number"),
    ({"session": "a", "think_ms": -1}, "'think_ms' is negative"),
    ({"session": "a", "think_ms": MAX_THINK_MS + 1}, "'think_ms' .* is too large"),
    ({"think_ms": 5}, "'think_ms' without a 'session'"),
])
def test_bad_session_fields_name_the_line(tmp_path, extra, words):
    path = write(tmp_path, line(0, session="a"), line(1, **extra))
    with pytest.raises(TraceError, match=f"t.jsonl:2: {words}"):
        list(read_trace(path))


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_think_ms_must_be_finite(tmp_path, literal):
    bad = json.dumps(line(1, session="a"))[:-1] + f', "think_ms": {literal}}}'
    path = write(tmp_path, line(0, session="a"), bad)
    with pytest.raises(TraceError, match="t.jsonl:2: 'think_ms' (must be a finite number|is negative)"):
        list(read_trace(path))


def test_bad_session_lines_are_skipped_with_skip_bad(tmp_path):
    path = write(tmp_path, line(0, session="a"), line(1, think_ms=3), line(2, session="a", think_ms=3))
    report = ReadReport()
    reqs = list(read_trace(path, skip_bad=True, report=report))
    assert [r.line for r in reqs] == [1, 3] and report.bad_lines == 1
    # The skipped line is no turn: line 3's predecessor is line 1.
    assert list(predecessors(reqs)) == [None, 0]


def test_predecessor_is_the_previous_line_of_the_same_session(tmp_path):
    path = write(tmp_path, line(0, session="a"), line(1), line(2, session="a", think_ms=10),
                 line(3, session="b"), line(4, session="a", think_ms=0), line(5, session="b", think_ms=2))
    assert list(predecessors(read_trace(path))) == [None, None, 0, None, 2, 3]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.sampled_from("abc")), max_size=30))
def test_predecessors_chain_each_session_in_order(sessions):
    reqs = [TraceRequest(str(i), i, i + 1, i, 10, 1, (i,), None, session=s) for i, s in enumerate(sessions)]
    preds = list(predecessors(reqs))
    by_session = defaultdict(list)
    for r in reqs:
        if r.session is not None:
            by_session[r.session].append(r.seq)
    want = [None] * len(reqs)
    for seqs in by_session.values():
        for prev, cur in zip(seqs, seqs[1:]):
            want[cur] = prev
    assert preds == want


# --- synth ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["agent", "multi-turn", "mixed"])
def test_synth_sessions_carry_the_pause_that_placed_their_timestamps(kind):
    reqs = generate(SynthConfig(kind=kind, num_requests=400, seed=4))
    by_session = defaultdict(list)
    for r in reqs:
        if r.req_id.startswith("sys"):
            assert r.session_id is None and r.think_ms is None
        else:
            assert r.session_id == r.req_id.rsplit("-", 1)[0]
            by_session[r.session_id].append(r)
    assert len(by_session) > 10
    pauses = []
    for turns in by_session.values():
        assert turns[0].think_ms is None
        for prev, cur in zip(turns, turns[1:]):
            # timestamps are whole ms (rounded down), the pause rounded: within 2 ms.
            gap = cur.timestamp_ms - prev.timestamp_ms - prev.output_tokens * DECODE_MS_PER_TOKEN
            assert abs(gap - cur.think_ms) <= 2, (cur.req_id, gap, cur.think_ms)
            pauses.append(cur.think_ms)
    # A long tail: quick turns of a few seconds and pauses of minutes.
    assert min(pauses) < 5_000 and max(pauses) > 60_000


def test_synth_lines_round_trip_through_the_reader(tmp_path):
    from tierdiag.trace.synth import write_trace

    reqs = generate(SynthConfig(kind="multi-turn", num_requests=60, seed=2))
    path = tmp_path / "mt.jsonl"
    write_trace(path, reqs)
    got = list(read_trace(path))
    assert [(g.session, g.think_ns) for g in got] == \
           [(r.session_id, None if r.think_ms is None else r.think_ms * MS) for r in reqs]
    assert list(predecessors(got)).count(None) == len({r.session_id for r in reqs})


def test_demo_has_sessions_and_system_prompt_questions_without():
    reqs = list(read_trace(DEMO_TRACE))
    with_session = [r for r in reqs if r.session is not None]
    assert 0 < len(with_session) < len(reqs)
    assert all(r.req_id.startswith(("sess", "agent")) for r in with_session)
    assert all(r.req_id.startswith("sys") for r in reqs if r.session is None)
