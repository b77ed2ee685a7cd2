"""The recorder: stored events become columns at flush, in order; the others are only counted."""

from __future__ import annotations

from tierdiag.probes import events as ev
from tierdiag.probes.recorder import Probe, Recorder


def test_recorder_columns_stored_events_and_counts_the_rest_by_name():
    flushed = []
    r = Recorder(flushed.append, flush_rows=3)
    r.emit(ev.FirstToken(5, "a", 7))
    r.emit(ev.PrefixLostPages("a", 1, 64))
    r.emit(ev.FirstToken(6, "b", 8))
    r.emit(ev.PrefixLostPages("b", 2, 128))
    assert flushed == []  # two rows buffered: below flush_rows
    r.emit(ev.PrefixLostPages("c", 3, 192))  # the third row: flushed at once
    assert flushed == [{"request_evictions": {"req_id": ("a", "b", "c"), "eviction_id": (1, 2, 3),
                                              "tokens": (64, 128, 192)}}]
    assert r.counts == {"FirstToken": 2}
    r.flush()  # nothing buffered: nothing handed over
    assert len(flushed) == 1
    base = Probe()
    base.emit(ev.FirstToken(1, "x", 2))
    base.emit(ev.PrefixLostPages("x", 1, 1))
    assert base.counts == {"FirstToken": 1, "PrefixLostPages": 1}
