"""engine/emitters.py's RequestColumns (issue 41, session 24): a finished request's record appended
a column each, unboxed (librt `vec[i64]` for its ints), its other rows (rejections) as tuples in
the recorder's buffer with their places kept; handed over as one dict that probes/recorder.py's
`columns_of` (Python values) and store/columns.py's `table_columns` (Arrow arrays, the writer's)
turn back into the table's rows, in the order appended. Held here to the tuples' path (the same
rows, the same order), the compiled class to its Python source, and hostile values to errors."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine.helpers import source_twin
from tierdiag.engine import emitters
from tierdiag.engine.emitters import (REQUEST_CONSTANTS, REQUEST_INT_COLUMNS, REQUEST_OBJECT_COLUMNS, BatchColumns,
                                      EvictionColumns, PoolSampleColumns, RequestColumns, TransferColumns)
from tierdiag.native import cplane
from tierdiag.probes import events as ev
from tierdiag.probes.recorder import Recorder, columnar_order, columns_of
from tierdiag.store.columns import arrow_column, table_columns
from tierdiag.store.schema import TABLES

FIELDS = ev.RequestRecord._fields
INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
INT32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
TEXT = st.text(max_size=8)  # unicode, escapes, NUL, lone surrogates: str as the engine may hold it


TWIN = source_twin("emitters", "_emitters_source_twin")  # the source, interpreted, beside the compiled one
CLASSES = [pytest.param(RequestColumns, id="as imported"), pytest.param(TWIN.RequestColumns, id="python source")]


def _counter():
    from librt.vecs import vec
    from mypy_extensions import i64

    return vec[i64]([0])


def _inner(encoded: bool, width: int = len(FIELDS)):
    if encoded:
        if cplane.C is None:
            pytest.skip(f"_cplane: {cplane.WHY_NOT}")
        return cplane.compiled("RowBuffer")(width)
    return []


_routes = st.one_of(st.just(ev.ROUTE_NONE), st.builds(
    ev.Route, st.one_of(st.none(), TEXT), st.one_of(st.none(), TEXT),
    st.one_of(st.none(), st.floats(allow_nan=False)), st.one_of(st.none(), TEXT),
    st.one_of(st.none(), INT64), st.one_of(st.none(), INT64), st.one_of(st.none(), INT32),
    st.one_of(st.none(), INT64), st.one_of(st.none(), INT64), st.one_of(st.none(), TEXT)))

_finished = st.fixed_dictionaries({
    **{c: INT64 for c in REQUEST_INT_COLUMNS}, "dp_rank": INT32,
    "req_id": TEXT, "hit_class": st.sampled_from(["miss", "device_hit", "tiered_hit"]),
    "loadback_skipped_reason": st.one_of(st.none(), TEXT), "storage_skipped_reason": st.one_of(st.none(), TEXT),
    "first_batch_id": st.one_of(st.none(), INT64), "session_id": st.one_of(st.none(), TEXT),
    "think_ms": st.one_of(st.none(), st.floats(allow_nan=False)), "route": _routes})

# A rejected request's row as scheduler._reject emits it: NULL where it times, 0 where it counts.
_TIMED = {"queue_ns", "storage_wait_ns", "loadback_ns", "loadback_exposed_ns", "loadback_queued_ns", "storage_fetch_ns",
          "recompute_ns", "compute_ns", "prefill_ns", "ttft_ns", "ideal_ttft_ns", "ttft_if_device_resident_ns",
          "recompute_instead_ns", "first_batch_id", "first_token_ns", "finish_ns", "decode_wait_ns", "hit_class",
          "loadback_skipped_reason", "storage_skipped_reason", "think_ms", "session_id"}


def _rejected_row(rid, seq, dp, route):
    values = {f: (None if f in _TIMED or f.startswith("miss_") else 0) for f in FIELDS}
    values.update(req_id=rid, seq=seq, arrival_ns=5, input_tokens=40, output_tokens=7, status="rejected",
                  reject_reason="too_long", trace_arrival_ns=5, dp_rank=dp, **route._asdict())
    return ev.RequestRecord(**values)


_rejected = st.builds(_rejected_row, TEXT, INT64, INT32, _routes)


def _row(kw: dict) -> tuple:
    """The tuple the tuples' path stores for a `finished(**kw)` call."""
    values = {**dict(REQUEST_CONSTANTS), **{k: v for k, v in kw.items() if k != "route"},
              **kw["route"]._asdict()}
    return tuple(values[f] for f in FIELDS)


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def test_the_columns_are_the_records_fields_split_by_how_they_travel():
    """Every RequestRecord field travels one way: an int64 column, an object column, a constant,
    or the Route tuple; the record's field order is kept by the decoders, not by these."""
    split = [*REQUEST_INT_COLUMNS, *REQUEST_OBJECT_COLUMNS, *dict(REQUEST_CONSTANTS), *ev.Route._fields]
    assert sorted(split) == sorted(FIELDS) and len(split) == len(set(split))


# The other tables' columnar buffers: (class name, event, table, its add's values by column).
def _value(table: str, column: str, nullable: bool):
    kind = TABLES[table][column]
    base = {"BIGINT": INT64, "INTEGER": INT32, "VARCHAR": TEXT, "DOUBLE": st.floats(allow_nan=False),
            "BOOLEAN": st.booleans()}[kind]
    return st.one_of(st.none(), base) if nullable else base


_OTHER_TABLES = [("EvictionColumns", ev.Eviction, "evictions"), ("PoolSampleColumns", ev.PoolSample, "pool_samples"),
                 ("BatchColumns", ev.BatchScheduled, "batches"), ("TransferColumns", ev.Transfer, "transfers")]


def _spec(name: str, event, table: str, module):
    ints = getattr(module, name.replace("Columns", "").replace("PoolSample", "Pool_Sample").upper() + "_INT_COLUMNS")
    column_row = st.fixed_dictionaries({f: _value(table, f, f not in ints) for f in event._fields})
    other_row = st.builds(lambda d: tuple(d[f] for f in event._fields),
                          st.fixed_dictionaries({f: _value(table, f, True) for f in event._fields}))
    return column_row, other_row, lambda kw: tuple(kw[f] for f in event._fields)


def _request_spec(module):
    return _finished, _rejected, _row


def _check_take(hand, table, fields, want):
    py = columns_of(fields, hand)
    assert list(zip(*(py[f] for f in fields))) == want or (not want and all(py[f] == () for f in fields))
    arrow = table_columns(table, fields, hand)
    for i, f in enumerate(fields):
        got = arrow_column(table, f, arrow[f]).to_pylist()
        assert len(got) == len(want)
        assert all(_same(g, w[i]) for g, w in zip(got, want)), f


_EVERY = ([pytest.param(m, "RequestColumns", ev.RequestRecord, "requests", id=f"requests, {k}")
           for k, m in (("as imported", emitters), ("python source", TWIN))]
          + [pytest.param(m, n, e, t, id=f"{t}, {k}") for n, e, t in _OTHER_TABLES
             for k, m in (("as imported", emitters), ("python source", TWIN))])


@pytest.mark.parametrize("module, name, event, table", _EVERY)
@pytest.mark.parametrize("encoded", [True, False], ids=["row buffer", "list"])
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_column_rows_and_other_rows_come_back_in_the_order_appended(module, name, event, table, encoded, data):
    """Every columnar buffer (requests, evictions, pool samples, batches; the compiled class and
    its Python source): rows appended by columns and other rows (a rejection, an event built
    by a probe's `emit`) interleaved, taken at random points: each take gives, through
    columns_of and table_columns alike, exactly the rows appended since the last, in order (the
    Arrow arrays are arrow_column's of those values); the buffer is empty after."""
    cls = getattr(module, name)
    column_row, other_row, as_row = (_request_spec(module) if name == "RequestColumns"
                                     else _spec(name, event, table, module))
    add = "finished" if name == "RequestColumns" else "add"
    cols = cls(_inner(encoded, len(event._fields)), _counter())
    ops = data.draw(st.lists(st.one_of(st.tuples(st.just("columns"), column_row),
                                       st.tuples(st.just("other"), other_row),
                                       st.tuples(st.just("take"), st.none())), max_size=12))
    want: list[tuple] = []
    by_columns = 0  # rows appended by columns since the last take: the shared counter's
    for op, arg in ops + [("take", None)]:
        if op == "columns":
            getattr(cols, add)(**arg)
            want.append(as_row(arg))
            by_columns += 1
        elif op == "other":
            cols.append(tuple(arg))
            want.append(tuple(arg))
        else:
            assert len(cols) == len(want)
            assert cols.counter[0] == by_columns
            hand = cols.take()
            assert len(cols) == 0 and cols.counter[0] == 0
            _check_take(hand, table, event._fields, want)
            want, by_columns = [], 0


@pytest.mark.parametrize("module", [pytest.param(emitters, id="as imported"), pytest.param(TWIN, id="python source")])
def test_rows_past_the_first_room_grow_the_block_and_come_back_whole(module):
    """A buffer's rows past its first room (`_FIRST_ROWS`), and past the room doubled again,
    each its own values (every int column distinct by row and place), with other rows and takes
    between: every row comes back whole and in order (its ints from their places in the rows'
    block, its objects from their lists), and a take leaves room for as many again (the block
    reused, fresh object lists). The compiled class and its Python source alike."""
    first = module._FIRST_ROWS
    cols = module.EvictionColumns([], _counter())
    ints = module.EVICTION_INT_COLUMNS
    want: list[tuple] = []
    for batch in (first * 2 + 3, 5, first * 4 + 1):
        for i in range(batch):
            kw = {c: (len(want) + 1) * 100 + j for j, c in enumerate(ints)}
            kw.update(tier="device" if i % 2 else "host", action="evict", cause_req_id=f"r{i}", owner_req_id=None)
            cols.add(**kw)
            want.append(tuple(kw[f] for f in ev.Eviction._fields))
            if i == batch // 2:
                other = tuple(None if f not in ints else -i for f in ev.Eviction._fields)
                cols.append(other)
                want.append(other)
        assert cols.cap >= cols.n >= batch and len(cols) == len(want)
        _check_take(cols.take(), "evictions", ev.Eviction._fields, want)
        assert cols.n == 0 and cols.counter[0] == 0 and cols.dictionary == []
        want = []


@pytest.mark.parametrize("module", [pytest.param(emitters, id="as imported"), pytest.param(TWIN, id="python source")])
def test_the_ints_handed_over_are_a_view_of_the_block_until_the_next_row(module):
    """A take's ints are the block's own bytes (session 38: no copy a hand-over), read-only, as
    many as its rows' ints, and read back as those rows while no row is written after it (a rows
    sink is done with them when it returns); the next rows go into the same block from its
    start, and the take after them is those rows alone."""
    cols = module.EvictionColumns([], _counter())
    kw = dict(eviction_id=1, t_ns=2, tier="device", node_id=3, tokens=4, action="demote", cause_req_id="a",
              owner_req_id=None, pool_used_tokens=5, pool_capacity_tokens=6, locked_tokens=7, node_hit_count=8,
              node_last_access_ns=9, dp_rank=0)
    for i in range(300):  # past the first room: the block grown once
        cols.add(**{**kw, "eviction_id": i})
    hand = cols.take()
    names, block = hand["ints"]
    assert isinstance(block, memoryview) and block.readonly and block.format == "B"
    assert block.nbytes == 8 * 300 * len(names)
    ints = columns_of(ev.Eviction._fields, hand)
    assert list(ints["eviction_id"]) == list(range(300)) and set(ints["tokens"]) == {4}
    first = bytes(block)
    cols.add(**{**kw, "eviction_id": 1000})
    assert bytes(block[8:]) == first[8:] and bytes(block[:8]) != first[:8]  # the same memory, written over
    assert list(columns_of(ev.Eviction._fields, cols.take())["eviction_id"]) == [1000]


@pytest.mark.parametrize("cut", [-8, 8, 1, -1])
def test_a_hand_over_whose_ints_are_not_its_rows_is_refused(cut):
    """A columnar hand-over's ints block that is not `n` rows of its columns (bytes short or over,
    a part of an int) is a ValueError saying so, from the writer's decode and the Python one,
    never columns shifted into each other."""
    cols = RequestColumns([], _counter())
    kw = {**{c: 1 for c in REQUEST_INT_COLUMNS}, **{c: None for c in REQUEST_OBJECT_COLUMNS}, "route": ev.ROUTE_NONE}
    cols.finished(**kw)
    cols.finished(**kw)
    hand = cols.take()
    names, block = hand["ints"]
    hand["ints"] = (names, bytes(block)[:cut] if cut < 0 else bytes(block) + b"\0" * cut)
    with pytest.raises(ValueError, match="not 2 rows of"):
        table_columns("requests", FIELDS, hand)
    if cut % 8 == 0:  # (array("q") refuses a part of an int itself)
        with pytest.raises(ValueError, match="not 2 rows of"):
            columns_of(FIELDS, hand)


@pytest.mark.parametrize("cls", CLASSES)
@given(kw=_finished, column=st.sampled_from(REQUEST_INT_COLUMNS),
       bad=st.one_of(st.integers(min_value=2**63), st.integers(max_value=-(2**63) - 1)))
@settings(max_examples=25, deadline=None)
def test_an_int_past_int64_is_refused_and_the_row_is_not_kept(cls, kw, column, bad):
    """A value past int64 (the columns' type) is refused at the call, and nothing of the row is
    kept: the buffer's rows stay whole (the RowBuffer's 'O' objects path is gone for a finished
    record; the engine's ints are times in ns and token counts). The Python twin's vec says
    OverflowError; the compiled method's argument check, called from Python, TypeError ("i64
    object expected"); called from the compiled record, the conversion's OverflowError."""
    cols = cls([], _counter())
    cols.finished(**kw)
    with pytest.raises((OverflowError, TypeError)):
        cols.finished(**{**kw, column: bad})
    assert len(cols) == 1
    assert list(zip(*columns_of(FIELDS, cols.take()).values())) == [_row(kw)]


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("bad", [1.5, float("nan"), "7", None, b"7"])
def test_a_value_that_is_no_int_in_an_int_column_is_a_type_error(cls, bad):
    kw = {**{c: 1 for c in REQUEST_INT_COLUMNS}, **{c: None for c in REQUEST_OBJECT_COLUMNS}, "route": ev.ROUTE_NONE}
    cols = cls([], _counter())
    with pytest.raises(TypeError):
        cols.finished(**{**kw, "queue_ns": bad})
    assert len(cols) == 0 and cols.take()["n"] == 0


@given(dp=st.one_of(st.integers(min_value=2**31, max_value=2**63 - 1), st.integers(min_value=-(2**63), max_value=-(2**31) - 1)))
@settings(max_examples=10, deadline=None)
def test_a_dp_rank_past_its_integer_column_is_the_writers_overflow_error_naming_it(dp):
    kw = {**{c: 1 for c in REQUEST_INT_COLUMNS}, **{c: None for c in REQUEST_OBJECT_COLUMNS},
          "route": ev.ROUTE_NONE, "dp_rank": dp}
    cols = RequestColumns([], _counter())
    cols.finished(**kw)
    columns = table_columns("requests", FIELDS, cols.take())
    with pytest.raises(OverflowError, match="requests.dp_rank"):
        arrow_column("requests", "dp_rank", columns["dp_rank"])


@pytest.mark.parametrize("at, n", [((1, 0), 2), ((3,), 2), ((-1,), 2), ((0, 1, 0), 1)])
def test_other_rows_places_out_of_order_are_refused(at, n):
    import array

    with pytest.raises(ValueError, match="not in order"):
        columnar_order(n, array.array("q", at).tobytes())


def test_a_hand_over_without_a_column_is_refused_naming_it():
    cols = RequestColumns([], _counter())
    cols.finished(**{**{c: 1 for c in REQUEST_INT_COLUMNS}, **{c: None for c in REQUEST_OBJECT_COLUMNS},
                     "route": ev.ROUTE_NONE})
    hand = cols.take()
    names, block = hand["ints"]
    j = names.index("ttft_ns")
    kept = np.delete(np.frombuffer(block, dtype=np.int64).reshape(1, len(names)), j, axis=1)
    hand["ints"] = (names[:j] + names[j + 1:], kept.tobytes())
    with pytest.raises(ValueError, match="ttft_ns"):
        table_columns("requests", FIELDS, hand)
    with pytest.raises(ValueError, match="ttft_ns"):
        columns_of(FIELDS, hand)


@pytest.mark.parametrize("encoded", [True, False], ids=["row buffer", "list"])
def test_the_engines_rows_by_columns_are_the_tuples_rows_in_the_same_order(encoded, monkeypatch):
    """A run with finished and rejected requests interleaved, flushed several times on the way:
    a rows-sink recorder (the replay's: it adopts RequestColumns, one for the probe however many
    Emitters ask) hands over the same requests rows, in the same order, as a columns-sink
    recorder (the tuples' path); the other tables are untouched."""
    from tests.engine.helpers import numbered, req, small_config
    from tierdiag.engine.engine import Engine

    if encoded and cplane.C is None:
        pytest.skip(f"_cplane: {cplane.WHY_NOT}")
    if not encoded:  # the recorder's buffers as lists (the numpy data plane's)
        from tierdiag.probes import recorder

        monkeypatch.setattr(recorder, "new_row_buffer", recorder._list_buffer)
    trace = numbered([req(f"r{i}", 10 * i, list(range(1000 * (i % 4), 1000 * (i % 4) + (40 if i % 5 == 3 else 6)))
                          + [9000 + i], output=30) for i in range(30)])  # every fifth too big: rejected
    by_rows: list = []
    rows_probe = Recorder(rows_sink=lambda tables: by_rows.append({t: columns_of(f, r) for t, (f, r) in tables.items()}),
                          flush_rows=40)
    by_tuples: list = []
    tuples_probe = Recorder(by_tuples.append, flush_rows=40)
    stats = [Engine(small_config(dp=2), probe=p).run(trace) for p in (rows_probe, tuples_probe)]
    rows_probe.flush()
    tuples_probe.flush()
    assert stats[0] == stats[1] and stats[0].requests_rejected == 6
    assert isinstance(rows_probe._pending[ev.RequestRecord], RequestColumns)
    assert isinstance(rows_probe._pending[ev.Eviction], EvictionColumns)
    assert isinstance(rows_probe._pending[ev.Transfer], TransferColumns)
    assert not isinstance(tuples_probe._pending[ev.RequestRecord], RequestColumns)

    def rows(flushed, table):
        return [r for t in flushed if table in t for r in zip(*(t[table][f] for f in t[table]))]

    for table in ("requests", "evictions", "transfers", "batches", "pool_samples", "request_evictions"):
        a, b = rows(by_rows, table), rows(by_tuples, table)
        if table == "transfers":  # measured copy time: differs run to run
            wall = ev.Transfer._fields.index("wall_ns")
            a, b = ([r[:wall] + r[wall + 1:] for r in x] for x in (a, b))
        assert a == b, table
    # the ticker counts the columnar buffers' rows by their shared counter: the same flushes
    assert [sum(len(next(iter(cols.values()))) for cols in t.values()) for t in by_rows] == \
        [sum(len(next(iter(cols.values()))) for cols in t.values()) for t in by_tuples]
    statuses = [r[FIELDS.index("status")] for r in rows(by_rows, "requests")]
    assert statuses.count("rejected") == 6 and statuses.count("finished") == 24
    assert len(by_rows) > 1  # flushed on the way


def test_the_emitters_adopt_one_buffer_a_probe_and_its_append_is_the_record_emitter():
    rec = Recorder(rows_sink=lambda tables: None)
    first, second = emitters.Emitters(rec), emitters.Emitters(rec)
    cols = rec._pending[ev.RequestRecord]
    assert isinstance(cols, RequestColumns)
    assert first.request_columns is cols and second.request_columns is cols
    assert first.record == cols.append and second.tick is rec.tick is first.tick
    for attr, kind, event, cls in (("eviction_columns", "eviction", ev.Eviction, EvictionColumns),
                                   ("pool_sample_columns", "pool_sample", ev.PoolSample, PoolSampleColumns),
                                   ("batch_columns", "batch", ev.BatchScheduled, BatchColumns),
                                   ("transfer_columns", "transfer", ev.Transfer, TransferColumns)):
        buf = rec._pending[event]
        assert isinstance(buf, cls) and getattr(first, attr) is buf is getattr(second, attr)
        assert getattr(first, kind) == buf.append
    # a request's lost rows in one call: the lost table's row buffer's append_pairs (compiled plane)
    lost_buf = rec._pending[ev.PrefixLostPages]
    if cplane.C is not None:
        assert first.lost == lost_buf.append and first.lost_pairs == lost_buf.append_pairs
    else:
        assert first.lost_pairs is None
    assert rec.pairs_emitter(ev.Eviction) is None  # (no table of three columns)
    column_sink = Recorder(lambda tables: None)
    for probe in (column_sink, None):
        made = emitters.Emitters(probe)
        assert (made.request_columns, made.eviction_columns, made.pool_sample_columns, made.batch_columns,
                made.transfer_columns, made.lost_pairs) == (None,) * 6


def test_the_writers_arrow_columns_are_zero_copy_int64_for_bigint_columns():
    """The writer builds a BIGINT column from the hand-over's bytes as they came (no Python int)."""
    cols = RequestColumns([], _counter())
    kw = {**{c: 3 for c in REQUEST_INT_COLUMNS}, **{c: None for c in REQUEST_OBJECT_COLUMNS}, "route": ev.ROUTE_NONE}
    for i in range(5):
        cols.finished(**{**kw, "ttft_ns": 10**15 + i})
    out = table_columns("requests", FIELDS, cols.take())
    assert isinstance(out["ttft_ns"], pa.Array) and out["ttft_ns"].type == pa.int64()
    assert out["ttft_ns"].to_pylist() == [10**15 + i for i in range(5)]


def test_the_inline_writer_and_the_writer_process_store_the_same_rows(tmp_path, monkeypatch):
    """TIERDIAG_WRITER=inline (the recorder's hand-overs made Arrow columns on the engine's
    thread) and =process (in the writer process) both decode the columnar hand-overs: a replay
    with rejections among its requests stores the same rows, in every table, either way."""
    import duckdb

    from tierdiag.app.replay import replay
    from tierdiag.config.engine import EngineConfig

    trace = tmp_path / "t.jsonl"
    lines = []
    for i in range(40):
        big = i % 7 == 3  # more than the device pool holds: rejected
        ids = [1000 * i + k for k in range(16)] if big else [i % 3, 100 + i]
        lines.append(f'{{"timestamp": {i * 10}, "input_length": {8192 if big else 1024}, "output_length": 4, '
                     f'"hash_ids": {ids}}}\n')
    trace.write_text("".join(lines))
    got = {}
    for mode in ("inline", "process"):
        monkeypatch.setenv("TIERDIAG_WRITER", mode)
        db = tmp_path / f"{mode}.duckdb"
        result = replay(trace, EngineConfig(model="tiny", gpu="cpu", device_tokens=4096), db=db, run_name=mode,
                        probes=True, skip_bad=False)
        assert result.writer == mode
        with duckdb.connect(str(db), read_only=True) as con:
            got[mode] = {t: sorted(map(repr, con.execute(f"SELECT * EXCLUDE (run_id) FROM {t}").fetchall()))
                         for t in ("requests", "evictions", "batches", "pool_samples")}
            got[mode]["status"] = con.execute("SELECT status, count(*) FROM requests GROUP BY ALL ORDER BY 1").fetchall()
    assert got["inline"] == got["process"]
    assert dict(got["inline"]["status"]).get("rejected", 0) > 0 and dict(got["inline"]["status"])["finished"] > 0
