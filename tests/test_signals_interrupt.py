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
