"""Closed-loop arrivals (engine/arrivals.py): a session's later turn arrives at its predecessor's
finish + think_ms; a rejected turn ends its session; a request past the model's context is
rejected as SGLang rejects it."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.engine.helpers import PS, Collect, small_config
from tierdiag.config.profile import CLOCK_PARAMS, write_profile
from tierdiag.engine.arrivals import ArrivalSource
from tierdiag.engine.engine import Engine
from tierdiag.trace.reader import TraceRequest

MS = 1_000_000


def run(trace: list[TraceRequest], cfg) -> tuple[Engine, Collect]:
    """The trace as given (helpers.run renumbers and rebuilds requests without their session)."""
    probe = Collect()
    engine = Engine(cfg, probe=probe)
    engine.run(trace)
    return engine, probe


def turn(req_id: str, seq: int, t_ms: float, pages: tuple[int, ...], *, session: str | None = None,
         think_ms: float | None = None, output: int = 4, extra_tokens: int = 1) -> TraceRequest:
    return TraceRequest(req_id=req_id, seq=seq, line=seq + 1, arrival_ns=int(t_ms * MS),
                        input_len=len(pages) * PS + extra_tokens, output_len=output,
                        hash_ids=pages + ((10**9 + seq,) if extra_tokens else ()), tokens=None,
                        session=session, think_ns=None if think_ms is None else int(think_ms * MS))


def session_workload(draw_sessions: list[list[int]], singles: list[int]) -> list[TraceRequest]:
    """Sessions whose turn n+1 is stamped at turn n's timestamp + think (a trace taken from an
    infinitely fast server), each turn re-sending the session's context plus 1-2 new pages;
    plus requests without a session. Sorted by timestamp, seq in that order."""
    raw = []
    for s, thinks in enumerate(draw_sessions):
        t = 7.0 * s
        pages: tuple[int, ...] = ()
        for n, think in enumerate(thinks):
            if n:
                t += think
            pages = pages + tuple(1000 * (s + 1) + len(pages) + i for i in range(1 + n % 2))
            raw.append((t, f"s{s}-t{n}", pages, f"s{s}", None if n == 0 else float(think)))
    for i, t in enumerate(singles):
        raw.append((float(t), f"x{i}", (900_000 + i,), None, None))
    raw.sort(key=lambda r: r[0])
    return [turn(rid, seq, t, pages, session=session, think_ms=think)
            for seq, (t, rid, pages, session, think) in enumerate(raw)]


sessions_st = st.lists(st.lists(st.integers(0, 400), min_size=1, max_size=6), min_size=1, max_size=6)
singles_st = st.lists(st.integers(0, 300), max_size=8)


@settings(max_examples=25, deadline=None)
@given(sessions_st, singles_st, st.sampled_from([16, 64]))
def test_closed_loop_turn_never_arrives_before_its_predecessor_finish_plus_pause(sessions, singles, device_pages):
    trace = session_workload(sessions, singles)
    engine, probe = run(trace, small_config(device_tokens=device_pages * PS, arrivals="closed"))
    recs = probe.records
    assert len(recs) == len(trace)
    engine.check_invariants(idle=True)
    last: dict[str, object] = {}
    for t in trace:
        r = recs[t.req_id]
        assert r.trace_arrival_ns == t.arrival_ns
        if t.session is None or t.session not in last:
            assert r.arrival_ns == t.arrival_ns and r.think_ms is None  # open loop: its timestamp
        else:
            prev = last[t.session]
            assert r.think_ms == t.think_ns / MS
            # Exactly finish + pause: never earlier, and never later (nothing read too late).
            assert r.arrival_ns == prev.finish_ns + t.think_ns
            assert r.arrival_ns >= prev.finish_ns + t.think_ns
        last[t.session] = r if t.session is not None else None
    assert engine.scheduler.arrivals.late_turns == 0


@pytest.fixture(scope="module")
def instant_profile(tmp_path_factory):
    """A fitted clock with every time 0 and links at 10^15 B/s: an infinitely fast server."""
    clock = {k: (1e15 if k.endswith("_bytes_per_s") else 0.0) for k in CLOCK_PARAMS}
    return str(write_profile(tmp_path_factory.mktemp("p") / "instant.toml", model="tiny", gpu="h200",
                             clock=clock, fit={"source_run": "test"}))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sessions=sessions_st, singles=singles_st)
def test_an_infinitely_fast_server_replays_closed_as_the_trace(instant_profile, sessions, singles):
    """The trace's turns are stamped as from a server with no service time (turn n+1 = turn n +
    think); replayed on a server whose service time is 0, closed arrivals are the trace's own,
    to the nanosecond the pause is rounded to (think_ms as ns)."""
    trace = session_workload(sessions, singles)
    kw = dict(device_tokens=256 * PS, host_tokens=512 * PS, gpu="h200", profile=instant_profile)
    _, closed = run(trace, small_config(arrivals="closed", **kw))
    _, open_ = run(trace, small_config(arrivals="trace", **kw))
    turns: dict[str, int] = {}
    for t in trace:
        c, o = closed.records[t.req_id], open_.records[t.req_id]
        assert o.arrival_ns == c.trace_arrival_ns == t.arrival_ns
        assert c.finish_ns - c.arrival_ns <= 1, "the instant clock still takes time"
        n = turns[t.session] = turns.get(t.session, -1) + 1 if t.session else 0
        assert 0 <= c.arrival_ns - t.arrival_ns <= n, (t.req_id, c.arrival_ns - t.arrival_ns)


def test_open_loop_ignores_the_predecessor_and_keeps_timestamps():
    # s0-t1 is stamped 1 ms after s0-t0: open loop it arrives then, while t0 still runs.
    trace = [turn("a", 0, 0, tuple(range(1, 9)), session="s0", output=400),
             turn("b", 1, 1, tuple(range(1, 10)), session="s0", think_ms=5)]
    _, open_ = run(trace, small_config(arrivals="trace"))
    _, closed = run(trace, small_config(arrivals="closed"))
    assert open_.records["b"].arrival_ns == 1 * MS < open_.records["a"].finish_ns
    assert closed.records["b"].arrival_ns == closed.records["a"].finish_ns + 5 * MS
    assert open_.records["b"].think_ms == closed.records["b"].think_ms == 5.0  # the pause, either way
    assert closed.records["b"].trace_arrival_ns == 1 * MS


def test_default_is_closed_and_a_turn_without_think_ms_follows_at_once():
    trace = [turn("a", 0, 0, (1, 2), session="s", output=50), turn("b", 1, 0.5, (1, 2, 3), session="s")]
    engine, probe = run(trace, small_config())  # arrivals unset
    assert engine.cfg.arrivals is None and engine.scheduler.arrivals.closed
    assert probe.records["b"].arrival_ns == probe.records["a"].finish_ns
    assert probe.records["b"].think_ms == 0.0


def test_a_rejected_turn_ends_its_session_and_the_rest_are_recorded_not_served():
    # Turn 1 of s is longer than the context (--max-context 1000): rejected; turns 2 and 3 of s
    # are never served (rejected, session_ended); s2 and the lone request go on.
    big = tuple(range(100, 117))  # 17 pages = 1,089 tokens
    trace = [turn("s-0", 0, 0, (1, 2), session="s"),
             turn("s2-0", 1, 1, (50,), session="s2"),
             turn("s-1", 2, 2, big, session="s", think_ms=1),
             turn("s-2", 3, 3, (1, 2, 3), session="s", think_ms=1),
             turn("x", 4, 4, (70,)),
             turn("s2-1", 5, 5, (50, 51), session="s2", think_ms=2),
             turn("s-3", 6, 6, (1, 2, 3, 4), session="s", think_ms=1)]
    engine, probe = run(trace, small_config(max_context_tokens=1000, arrivals="closed"))
    recs = probe.records
    assert recs["s-1"].status == "rejected" and recs["s-1"].reject_reason.startswith("context_length")
    for rid in ("s-2", "s-3"):
        assert recs[rid].status == "rejected" and recs[rid].reject_reason.startswith("session_ended")
        assert recs[rid].finish_ns is None and recs[rid].session_id == "s"
    assert all(recs[r].status == "finished" for r in ("s-0", "s2-0", "x", "s2-1"))
    src = engine.scheduler.arrivals
    assert src.ended_turns == 2 and src.ended_sessions == {"s": 2}
    assert engine.stats.requests_rejected == 3
    engine.check_invariants(idle=True)
    # Open loop replays every line at its timestamp: only the long one is rejected.
    _, open_ = run(trace, small_config(max_context_tokens=1000, arrivals="trace"))
    assert [r for r, rec in open_.records.items() if rec.status == "rejected"] == ["s-1"]


def test_context_length_rejection_mirrors_sglang():
    """TokenizerManager._validate_one_request: input >= context or input + max_new_tokens >
    context is refused; Scheduler validate_input_length: input >= context - 1 - 5 is aborted."""
    ctx = 1000

    def fate(input_len: int, output: int) -> str:
        pages = tuple(range(1, input_len // PS + 1))
        t = turn("r", 0, 0, pages, output=output, extra_tokens=input_len - len(pages) * PS)
        # A device pool with room beside a whole context: under 0.5.23's admission a request also
        # needs one page of overhead (engine/rules.py), which must not be what refuses it here.
        _, probe = run([t], small_config(max_context_tokens=ctx, device_tokens=32 * PS))
        rec = probe.records["r"]
        return rec.status if rec.status == "finished" else rec.reject_reason.split(":")[0]

    assert fate(990, 10) == "finished"  # 1,000 = the context: fits
    assert fate(990, 11) == "context_length"  # input + output past it
    assert fate(993, 1) == "finished"  # below context - 6
    assert fate(994, 1) == "context_length"  # input >= context - 6 (max_req_input_len)
    assert fate(1000, 0) == "context_length"


def test_preset_context_and_override():
    assert small_config(model="llama3-8b", device_tokens=None, host_tokens=None,
                        data_plane_mib=64).resolved_max_context() == 131_072
    assert small_config(model="qwen2.5-7b", device_tokens=None, host_tokens=None,
                        data_plane_mib=64).resolved_max_context() == 32_768
    assert small_config(max_context_tokens=4096).resolved_max_context() == 4096


def test_read_ahead_finds_a_turn_due_before_its_timestamp():
    """A turn stamped far later than its predecessor's finish + pause (the trace's server was
    slow) is read ahead of the clock and arrives on time; with no read-ahead it would be read
    only at its timestamp (counted as late)."""
    trace = [turn("a", 0, 0, (1,), session="s")] + [turn(f"x{i}", i + 1, 10 + i, (500 + i,)) for i in range(5)] + \
            [turn("b", 6, 60_000, (1, 2), session="s", think_ms=3)]
    _, probe = run(trace, small_config())
    assert probe.records["b"].arrival_ns == probe.records["a"].finish_ns + 3 * MS
    src = ArrivalSource(iter(trace), 1.0, closed=True, read_ahead=1)
    got = list(src.due(0))
    assert [r.req_id for r, *_ in got] == ["a"]
    src.finished("s", 5 * MS)
    assert src.next_ns(5 * MS) == 10 * MS  # one line in hand at most: "b" is not read yet


@settings(max_examples=15, deadline=None)
@given(sessions_st, singles_st)
def test_a_finished_session_is_held_as_one_int(sessions, singles):
    """Every session ends waiting for a turn nothing says will not come, so the source keeps it
    for the rest of the run: as its last finish (an int in `_idle`), not an object with a deque
    (~0.7 KB a session, ~70 MB of a 1M-request synth replay's ~95k sessions). Once the engine
    is done no session is busy, and each idle one holds its last turn's finish."""
    trace = session_workload(sessions, singles)
    engine, probe = run(trace, small_config(device_tokens=64 * PS, arrivals="closed"))
    src = engine.scheduler.arrivals
    assert src._busy == {}
    last = {t.session: probe.records[t.req_id].finish_ns for t in trace if t.session is not None}
    assert src._idle == last
    assert all(type(v) is int for v in src._idle.values())


def _state(src: ArrivalSource) -> tuple:
    """What `due` and the read-ahead move: the line in hand, the heap, the sessions' maps."""
    return (src._peek, src._peek_ns, list(src._heap), src._in_hand, dict(src._idle),
            {s: None if q is None else list(q) for s, q in src._busy.items()}, set(src._ended), src.late_turns)


@settings(max_examples=40, deadline=None)
@given(sessions_st, singles_st, st.booleans(), st.integers(0, 4),
       st.lists(st.tuples(st.integers(0, 3_000), st.booleans()), min_size=1, max_size=40))
def test_has_due_says_whether_due_does_anything(sessions, singles, closed, read_ahead, steps):
    """`has_due(now)` is what lets the loops skip `due(now)` (a generator a call, compiled): where
    it says no, `due` yields nothing and moves nothing; where it says yes, `due` delivers a turn
    or reads a line. Driven through a closed or open loop's clock, with finishes releasing turns
    and the read-ahead asked in between (`next_ns`), as the scheduler drives it."""
    trace = session_workload(sessions, singles)
    src = ArrivalSource(iter(trace), 1.0, closed=closed, read_ahead=read_ahead)
    now = 0
    delivered: list[str] = []
    for dt_ms, finish in steps:
        now += dt_ms * MS
        said = src.has_due(now)
        before = _state(src)
        got = list(src.due(now))
        if said:
            assert got or _state(src) != before, "has_due said yes, due did nothing"
        else:
            assert not got and _state(src) == before, "has_due said no, due did something"
        delivered += [r.req_id for r, *_ in got]
        for r, *_ in got:
            if finish and r.session is not None:
                src.finished(r.session, now)
        src.next_ns(now)
    assert len(delivered) == len(set(delivered))


def _next_ns_reference(src: ArrivalSource, now: int) -> int | None:
    """`next_ns` as it read before session 32 (the read-ahead, then the earlier of the heap's
    top and the line in hand): the answer the object-typed reads must give."""
    if src._idle and src._peek is not None:
        src._read_ahead_lines(now)
    heap = src._heap
    if heap:
        if src._peek_ns is not None and src._peek_ns < heap[0][0]:
            return src._peek_ns
        return heap[0][0]
    return src._peek_ns


def _has_due_reference(src: ArrivalSource, now: int) -> bool:
    if src._peek_ns is not None and src._peek_ns <= now:
        return True
    return bool(src._heap) and src._heap[0][0] <= now


# Clocks a replay never reaches but an int holds: past int64 and the tagged ints' 62 bits (a
# compiled read of one unboxes it as a big int), zero and the far side of a session's timestamps
hostile_scales = st.sampled_from([1.0, 1e-9, 3.0, 2.0 ** 40, 2.0 ** 70])


@settings(max_examples=40, deadline=None)
@given(sessions_st, singles_st, st.booleans(), st.integers(0, 4), hostile_scales,
       st.lists(st.tuples(st.integers(-5, 3_000), st.booleans(), st.sampled_from([1, 2 ** 62, 2 ** 64])),
                min_size=1, max_size=40))
def test_next_ns_and_has_due_answer_as_the_reference(sessions, singles, closed, read_ahead, scale, steps):
    """`next_ns(now)` and `has_due(now)` read the heap's top and the line in hand as objects, the
    two times alone unboxed to compare (session 32): at every step of a closed or open loop's
    clock, with the read-ahead full or not, finishes releasing turns, and times past int64 (a
    --time-scale that large, a clock asked far ahead), both answer what the typed reads did,
    the same int (value and type), and move the source as they did (a twin driven alike)."""
    trace = session_workload(sessions, singles)
    src = ArrivalSource(iter(trace), scale, closed=closed, read_ahead=read_ahead)
    twin = ArrivalSource(iter(trace), scale, closed=closed, read_ahead=read_ahead)
    now = 0
    for dt_ms, finish, far in steps:
        now = max(0, now + dt_ms * MS)
        for ask in (now, now * far):
            assert src.has_due(ask) == _has_due_reference(twin, ask)
            got, want = src.next_ns(ask), _next_ns_reference(twin, ask)
            assert got == want and type(got) is type(want)
            assert _state(src) == _state(twin)
        done = list(src.due(now))
        assert [r.req_id for r, *_ in done] == [r.req_id for r, *_ in twin.due(now)]
        for r, *_ in done:
            if finish and r.session is not None:
                src.finished(r.session, now)
                twin.finished(r.session, now)
