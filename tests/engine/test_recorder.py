"""The recorder: stored events become columns at flush, in order; the others are only counted."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierdiag.engine.emitters import Emitters
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


class _EveryEvent(Probe):
    """A plain probe: the engine builds every event and hands it to `emit`."""

    def __init__(self):
        super().__init__()
        self.events = []

    def emit(self, event):
        self.events.append(event)


def test_the_recorders_fast_path_stores_what_a_plain_probe_is_handed():
    """The engine gives a Recorder each stored event's fields without building the event, and
    skips the events no table stores; a plain probe gets every event built. The same workload
    must leave the same rows either way, and the plain probe also sees the unstored kinds."""
    from tests.engine.helpers import numbered, req, small_config
    from tierdiag.engine.engine import Engine

    trace = numbered([req(f"r{i}", 10 * i, list(range(100 * (i % 3), 100 * (i % 3) + 6)) + [9000 + i], output=70)
                      for i in range(24)]  # three prefixes: load-backs
                     + [req(f"s{i}", 300 + 10 * i, list(range(5000 + 100 * (i % 9), 5000 + 100 * (i % 9) + 8))
                            + [9500 + i], output=70) for i in range(36)])  # nine: the host thrashes, recompute
    plain = _EveryEvent()
    plain_stats = Engine(small_config(write_policy="write_through"), probe=plain).run(trace)
    flushed = []
    recorder = Recorder(flushed.append, flush_rows=50)  # several flushes on the way
    recorded_stats = Engine(small_config(write_policy="write_through"), probe=recorder).run(trace)
    recorder.flush()
    # Without a probe the engine skips what only probes need (counterfactuals, which eviction
    # took what); its own numbers stay the same.
    bare_stats = Engine(small_config(write_policy="write_through")).run(trace)
    assert bare_stats == recorded_stats == plain_stats
    assert bare_stats.recomputed_tokens > 0 and bare_stats.load_backs > 0

    got: dict[str, list] = {}
    for tables in flushed:
        for table, cols in tables.items():
            got.setdefault(table, []).extend(zip(*cols.values()))
    tables = {ev.Eviction: "evictions", ev.PrefixLostPages: "request_evictions", ev.Transfer: "transfers",
              ev.BatchScheduled: "batches", ev.PoolSample: "pool_samples"}
    want: dict[str, list] = {}
    for e in plain.events:
        if isinstance(e, ev.RequestFinished):
            want.setdefault("requests", []).append(tuple(e.record))
        elif type(e) in tables:
            want.setdefault(tables[type(e)], []).append(tuple(e))
    wall = ev.Transfer._fields.index("wall_ns")  # measured copy time: differs run to run
    for rows in (got["transfers"], want["transfers"]):
        rows[:] = [r[:wall] + r[wall + 1:] for r in rows]
    assert got == want
    assert {"requests", "evictions", "request_evictions", "transfers", "batches", "pool_samples"} <= set(got)
    assert {type(e) for e in plain.events} >= {ev.RequestArrived, ev.PrefixMatched, ev.PrefillDone, ev.FirstToken}
    assert recorder.counts == {}  # nothing unstored was built for it


def test_a_trace_of_rejections_flushes_on_the_way():
    """Rejected requests run no batch, where the engine lets the recorder flush (Emitters.tick):
    their records are flushed as they come all the same, so a trace of them is held in bounded
    memory, and every one of them is handed over once."""
    from tests.engine.helpers import numbered, req, small_config
    from tierdiag.engine.engine import Engine

    too_big = numbered([req(f"r{i}", i, list(range(1000 * i, 1000 * i + 40))) for i in range(12)])  # 40 > 16 pages
    flushed = []
    recorder = Recorder(flushed.append, flush_rows=5)
    stats = Engine(small_config(), probe=recorder).run(too_big)
    recorder.flush()
    assert stats.requests_rejected == 12
    assert [len(t["requests"]["req_id"]) for t in flushed] == [5, 5, 2]
    assert [s for t in flushed for s in t["requests"]["status"]] == ["rejected"] * 12


@pytest.mark.parametrize("encoded", [True, False], ids=["compiled row buffers", "lists"])
def test_a_rows_sink_gets_each_tables_rows_with_their_field_names_and_the_buffers_are_emptied(encoded, monkeypatch):
    """Recorder(rows_sink=...): what the store's writer process takes (it makes the columns on
    its own core): each table's field names and its rows, encoded by the compiled row buffers
    where they are built, else the tuples as buffered; `columns_of` gives the columns a column
    sink gets, either way."""
    from tierdiag.native import cplane
    from tierdiag.probes.recorder import columns_of

    if encoded and cplane.C is None:
        pytest.skip(f"_cplane: {cplane.WHY_NOT}")
    if not encoded:
        monkeypatch.setattr(cplane, "C", None)
    got, columns = [], []
    by_rows = Recorder(rows_sink=lambda tables: got.append({t: (f, columns_of(f, r)) for t, (f, r) in tables.items()}),
                       flush_rows=10**9)
    by_columns = Recorder(columns.append, flush_rows=10**9)
    for r in (by_rows, by_columns):
        emit = r.emitter(ev.PoolSample)
        emit((1, "device", 10, 100, 0, 0))  # every field, dp_rank last
        emit((2, "host", 20, 400, 5, 1))
        r.emit(ev.Eviction(7, 3, "host", 9, 64, "delete", None, "req-1", 10, 20, 0, 2, 1))  # a built event too
        r.flush()
        assert r.buffered_rows == 0
        r.flush()  # nothing left to hand over
    assert len(got) == len(columns) == 1
    assert got[0] == {t: (tuple(cols), cols) for t, cols in columns[0].items()}
    assert got[0]["pool_samples"][1]["tier"] == ("device", "host")
    with pytest.raises(TypeError):
        Recorder()


_EVENT_CLASSES = sorted(ev.EMITTED.values(), key=lambda c: c.__name__)
_VALUES = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(allow_nan=False), st.text(max_size=8), st.tuples(st.integers()))


@settings(max_examples=60, deadline=None)
@given(cls=st.sampled_from(_EVENT_CLASSES), data=st.data())
def test_an_event_built_by_keyword_is_the_tuple_of_its_fields_in_order(cls, data):
    """events.by_keyword (issue 38: records built by name, not by position): every field given
    by keyword, in any order, whatever its value, reaches the emitter as the tuple of the
    class's fields in order, exactly what the positional emitter took; a field the class gives
    a default may be left out (its default then), and a missing field or a name the class has
    not is a TypeError naming it, nothing emitted."""
    fields = cls._fields
    values = data.draw(st.lists(_VALUES, min_size=len(fields), max_size=len(fields)))
    order = data.draw(st.permutations(range(len(fields))))
    out: list = []
    emit = ev.by_keyword(cls, out.append)
    emit(**{fields[i]: values[i] for i in order})
    assert out == [tuple(values)] == [tuple(cls(*values))]
    left_out = data.draw(st.sets(st.sampled_from(fields)))
    given_ = {f: v for f, v in zip(fields, values) if f not in left_out}
    if all(f in cls._field_defaults for f in left_out):
        emit(**given_)
        assert out[-1] == tuple(cls(**given_))
    else:
        missing = next(f for f in fields if f in left_out and f not in cls._field_defaults)
        with pytest.raises(TypeError, match=missing):
            emit(**given_)
        assert len(out) == 1
    hostile = data.draw(st.text(min_size=1, max_size=12).filter(lambda n: n not in fields))
    with pytest.raises(TypeError):
        emit(**{**dict(zip(fields, values)), hostile: 1})
    assert len(out) <= 2


def test_the_engine_emits_its_request_records_by_name_through_the_same_emitter():
    """Emitters.request is the `record` emitter taking every column by keyword: None exactly
    where `record` is (no probe, or a probe that keeps no requests), else the same buffer."""
    assert Emitters(None).request is None
    no_requests = Recorder(lambda tables: None)
    no_requests.wants = lambda cls: cls is ev.Eviction
    assert Emitters(no_requests).request is None
    flushed = []
    recorder = Recorder(flushed.append)
    emitters = Emitters(recorder)
    row = ev.RequestRecord(*(f"v{i}" for i in range(len(ev.RequestRecord._fields))))
    emitters.request(**row._asdict())
    recorder.flush()
    assert flushed == [{"requests": {f: (v,) for f, v in row._asdict().items()}}]


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_request_row_takes_the_records_fields_by_name_and_gives_them_in_order(data):
    """request.request_row (issue 41: the record built by name in compiled code, its keywords
    resolved when compiled): its keyword-only parameters are RequestRecord's fields, each
    required; any values, given in any order, come back as the tuple of the fields in order,
    exactly what the recorder's positional emitter takes; a missing field or a name the record
    has not is a TypeError, on the compiled core and its Python twin alike."""
    from tierdiag.engine.request import request_row

    fields = ev.RequestRecord._fields
    values = data.draw(st.lists(_VALUES, min_size=len(fields), max_size=len(fields)))
    order = data.draw(st.permutations(range(len(fields))))
    assert request_row(**{fields[i]: values[i] for i in order}) == tuple(values) == tuple(ev.RequestRecord(*values))
    left_out = data.draw(st.sampled_from(fields))
    with pytest.raises(TypeError):
        request_row(**{f: v for f, v in zip(fields, values) if f != left_out})
    hostile = data.draw(st.text(min_size=1, max_size=12).filter(lambda n: n not in fields))
    with pytest.raises(TypeError):
        request_row(**dict(zip(fields, values)), **{hostile: 1})
    with pytest.raises(TypeError):
        request_row(*values)  # by keyword only


class _Plain:
    """A probe with only `emit`: it gets every event built."""

    def __init__(self):
        self.events = []

    def emit(self, event):
        self.events.append(event)


def test_the_emitters_are_one_attribute_a_kind_and_none_where_nothing_is_kept():
    """engine/emitters.py's Emitters (compiled with the engine core where it is built): one
    attribute a kind of events.EMITTED, `tick` and `request`. No probe: every one None. The
    recorder: its buffer's own append for the kinds a table stores, None for the others (the
    engine builds none of their fields), its tick. A plain probe: every kind, each event built."""
    names = set(ev.EMITTED)
    none = Emitters(None)
    assert all(getattr(none, n) is None for n in (*names, "tick", "request"))
    recorder = Recorder(lambda tables: None)
    emitters = Emitters(recorder)
    for name, cls in ev.EMITTED.items():
        if recorder.wants(cls):
            assert getattr(emitters, name) == recorder._pending[cls].append, name
        else:
            assert getattr(emitters, name) is None, name
    assert emitters.tick is recorder.tick
    plain = _Plain()
    emitters = Emitters(plain)
    assert emitters.tick is None
    for name, cls in ev.EMITTED.items():
        fields = tuple(range(len(cls._fields)))
        getattr(emitters, name)(fields)
        want = ev.RequestFinished(cls(*fields)) if cls is ev.RequestRecord else cls(*fields)
        assert plain.events[-1] == want and type(plain.events[-1]) is type(want), name
