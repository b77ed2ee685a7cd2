"""`signals.interrupt`: another module's signal handler (the sweep worker's) hands a stop to the
CLI's one interrupt path, which holds it inside a store write and raises it outside one."""

from __future__ import annotations

import signal

import pytest
from hypothesis import given, settings, strategies as st

from tierdiag import signals


@pytest.fixture(autouse=True)
def _forget():
    signals.reset()
    yield
    signals.reset()


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([signal.SIGINT, signal.SIGTERM]))
def test_outside_a_write_it_raises_at_once(signum):
    signals.reset()
    with pytest.raises(signals.Interrupted) as caught:
        signals.interrupt(signum)
    assert caught.value.signum == signum and signals.received() == signum


def test_inside_a_write_it_waits_for_the_write_to_end():
    done = []
    with pytest.raises(signals.Interrupted):
        with signals.deferred():
            signals.interrupt(signal.SIGINT)
            assert signals.pending() == signal.SIGINT
            done.append("write finished")
    assert done == ["write finished"]


def test_a_second_stop_while_the_first_is_on_its_way_out_is_ignored():
    with pytest.raises(signals.Interrupted):
        signals.interrupt(signal.SIGINT)
    signals.interrupt(signal.SIGTERM)  # returns: the first is already raised
    assert signals.received() == signal.SIGINT


# A second signal once an interrupted run's status is committed (`second_stops`; issue 41,
# session 37 h47sig): it ends the close there; anywhere else it is dropped, as before.

def test_a_second_stop_inside_second_stops_raises_at_once_even_in_a_deferred_block():
    with pytest.raises(signals.Interrupted):
        signals.interrupt(signal.SIGTERM)
    with pytest.raises(signals.StoppedAgain) as caught:
        with signals.deferred(reraise=False):
            with signals.second_stops():
                signals.interrupt(signal.SIGINT)
            raise AssertionError("not reached: the second stop raised")
    assert caught.value.signum == signal.SIGINT
    assert signals.received() == signal.SIGTERM  # the exit code stays the first's
    assert signals.pending() is None


def test_second_stops_does_not_turn_a_first_signal_into_a_second():
    with pytest.raises(signals.Interrupted) as caught:
        with signals.second_stops():
            signals.interrupt(signal.SIGINT)
    assert not isinstance(caught.value, signals.StoppedAgain)


@settings(max_examples=80, deadline=None)
@given(events=st.lists(st.tuples(st.sampled_from([signal.SIGINT, signal.SIGTERM]), st.booleans()),
                       min_size=1, max_size=8))
def test_only_a_signal_after_the_first_and_inside_second_stops_raises_stopped_again(events):
    """Any sequence of signals, each landing inside or outside `second_stops`, all inside an
    interrupted close (a deferred block that drops what it held): StoppedAgain exactly for the
    first one that lands after the first signal inside the window; the others are recorded or
    dropped; `received()` is always the first."""
    signals.reset()
    first = events[0][0]
    stopped = None
    with signals.deferred(reraise=False):
        for i, (signum, armed) in enumerate(events):
            try:
                if armed:
                    with signals.second_stops():
                        signals.interrupt(signum)
                else:
                    signals.interrupt(signum)
            except signals.StoppedAgain as exc:
                stopped = (i, exc.signum)
                break
    expected = next(((i, s) for i, (s, armed) in enumerate(events) if i > 0 and armed), None)
    assert stopped == expected
    assert signals.received() == first


# `second_stops(leave=...)` (issue 41, session 38 h48kill): the inline writer's interrupted close
# ends the process from the handler instead of raising through the evidence's threads.

class _Left(BaseException):
    """What the test's `leave` raises in place of ending the process."""


@settings(max_examples=80, deadline=None)
@given(events=st.lists(st.tuples(st.sampled_from([signal.SIGINT, signal.SIGTERM]), st.sampled_from(["out", "raise", "leave", "returns"])),
                       min_size=1, max_size=8))
def test_leave_is_called_exactly_where_stopped_again_would_be_raised(events):
    """Any sequence of signals, each outside the window, inside a plain `second_stops`, or inside one
    with a `leave` (that ends the process: here it raises; or that returns): `leave` is called,
    once, with the signal, exactly for the first signal after the first that lands inside a
    window with one; a `leave` that returns is followed by StoppedAgain; a window without one
    raises StoppedAgain as before; `received()` is always the first."""
    signals.reset()
    first = events[0][0]
    calls: list = []
    outcome = None

    def leave_by_raising(signum):
        calls.append(signum)
        raise _Left(signum)

    with signals.deferred(reraise=False):
        for i, (signum, where) in enumerate(events):
            try:
                if where == "out":
                    signals.interrupt(signum)
                else:
                    leave = {"raise": None, "leave": leave_by_raising, "returns": calls.append}[where]
                    with signals.second_stops(leave=leave):
                        signals.interrupt(signum)
            except _Left:
                outcome = (i, "left")
                break
            except signals.StoppedAgain as exc:
                outcome = (i, "stopped", exc.signum)
                break
    hit = next(((i, s, w) for i, (s, w) in enumerate(events) if i > 0 and w != "out"), None)
    if hit is None:
        assert outcome is None and calls == []
    elif hit[2] == "leave":
        assert outcome == (hit[0], "left") and calls == [hit[1]]
    else:
        assert outcome == (hit[0], "stopped", hit[1]) and calls == ([hit[1]] if hit[2] == "returns" else [])
    assert signals.received() == first
    assert signals._leaves == []  # every window's `leave` taken off as it ended
