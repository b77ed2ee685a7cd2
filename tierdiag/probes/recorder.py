"""The recorder: a probe that buffers events as columns and hands them to a sink in bulk.

No DuckDB here (the sink is the store's writer): the engine stays independent of storage,
and tests can record into plain lists.
"""

from __future__ import annotations

from array import array
from typing import Callable, Mapping, Sequence

from tierdiag import signals
from tierdiag.native import cplane
from tierdiag.probes import events as ev

Sink = Callable[[Mapping[str, Mapping[str, tuple]]], None]
RowsSink = Callable[[Mapping[str, tuple[tuple[str, ...], object]]], None]


def _list_buffer(width: int) -> list:
    """A table's rows as the tuples appended (the numpy data plane's row buffer)."""
    return []


# A rows sink's buffer a table: the compiled RowBuffer (rows encoded as they come: the tuple is
# freed at once, and a flush hands over one bytes object instead of pickling every row's objects
# again, cold) where native/cplane.py chose the compiled data plane, else a list.
new_row_buffer = cplane.choose("recorder.row_buffer", cplane.compiled("RowBuffer"), _list_buffer)
_decode_arrow = cplane.compiled("decode_arrow")


def _rows_in(buffer) -> int:
    """A ticker buffer's rows: its length, or a row counter's value (a memoryview of int64s)."""
    return buffer[0] if isinstance(buffer, memoryview) else len(buffer)


def _python_ticker(buffers: tuple, limit: int, flush: Callable[[], None]) -> Callable[[], None]:
    """The recorder's `tick`: flush() once the buffers hold `limit` rows in all (the reference
    of _cplane.FlushTicker, which does the same in one C call: the engine ticks ~8 times a
    request, and this closure's frame, map and len calls were 3 % of a probed Engine.run). A
    memoryview among them is a row counter (the columnar buffers'), its first value counted."""
    def tick() -> None:
        if sum(map(_rows_in, buffers)) >= limit:
            flush()
    return tick


new_ticker = cplane.choose("recorder.tick", cplane.compiled("FlushTicker"), _python_ticker)


def columns_of(fields: tuple[str, ...], rows) -> dict[str, tuple]:
    """A rows sink's table as columns: rows a list of tuples, or RowBuffer.take()'s
    (bytes, count, objects), decoded by the compiled data plane that encoded them, every value
    as it was appended (kind 'o' for every column), or a columnar buffer's take() (a dict:
    engine/emitters.py's RequestColumns), its rows in the order appended."""
    if isinstance(rows, dict):
        return _columnar_values(fields, rows)
    if isinstance(rows, list):
        return dict(zip(fields, zip(*rows)))
    return {f: values for f, (_, values) in zip(fields, _decode_arrow(*rows, b"o" * len(fields)))}

def columnar_order(n: int, at: bytes) -> list[int] | None:
    """A columnar hand-over's row order: positions into the finished rows (0..n-1) followed by
    the other rows (n..), in the order they were appended (`at`: each other row's count of
    finished rows before it, int64 bytes); None where there are no other rows."""
    if not at:
        return None
    places = array("q")
    places.frombytes(at)
    order: list[int] = []
    done = 0
    for k, before in enumerate(places):
        if before < done or before > n:
            raise ValueError(f"a columnar hand-over's row places are not in order: {before} after {done} of {n}")
        order.extend(range(done, before))
        order.append(n + k)
        done = before
    order.extend(range(done, n))
    return order


def _columnar_values(fields: tuple[str, ...], hand: dict) -> dict[str, tuple]:
    """`columns_of` for a columnar hand-over (engine/emitters.py's Columns.take()): every
    column as Python values, the rows in the order appended."""
    n = hand["n"]
    cols: dict[str, Sequence] = {}
    for name, value in hand["constants"]:
        cols[name] = (value,) * n
    names, block = hand["ints"]
    values = array("q")
    values.frombytes(block)
    width = len(names)
    if len(values) != n * width:
        raise ValueError(f"a columnar hand-over's ints are {len(values)} values, not {n} rows of {width}")
    for j, name in enumerate(names):
        cols[name] = values[j::width].tolist()  # its column: every width-th value from its place
    coded, dictionary = hand["coded"]
    for name in coded:  # a coded column's values from its codes
        codes = cols.get(name, ())
        if codes and (min(codes) < 0 or max(codes) >= len(dictionary)):
            raise ValueError(f"a columnar hand-over's {name} codes are not its dictionary's {len(dictionary)}")
        cols[name] = [dictionary[code] for code in codes]
    for name, values in hand["objects"].items():
        cols[name] = text_values(name, n, values) if isinstance(values, tuple) else values
    for names, rows in hand["tuples"]:
        cols.update(zip(names, zip(*rows)) if rows else ((f, ()) for f in names))
    missing = [f for f in fields if f not in cols]
    if missing:
        raise ValueError(f"a columnar hand-over without columns {missing}")
    order = columnar_order(n, hand["at"])
    if order is None:
        return {f: tuple(cols[f]) for f in fields}
    other = columns_of(fields, hand["rows"])
    out: dict[str, tuple] = {}
    for f in fields:
        both = tuple(cols[f]) + tuple(other[f])
        out[f] = tuple(both[i] for i in order)
    return out


def text_values(name: str, n: int, sent: tuple) -> list:
    """An object column sent as text (store/frames.py's out_of_band: (TEXT, int32 offsets, UTF-8
    data, validity bitmap or None, nulls)) as its values, str or None, as they were appended
    (store/columns.py's `text_column` makes the Arrow array instead); a ValueError naming the
    column where the buffers are not `n` such values."""
    if len(sent) != 5 or sent[0] != "text":
        raise ValueError(f"a columnar hand-over's {name} is not (text, offsets, data, valid, nulls)")
    _, offsets, data, valid, nulls = sent
    at = array("i")
    at.frombytes(bytes(offsets))
    data = bytes(data)
    bits = bytes(valid) if valid is not None else None
    if len(at) != n + 1 or (bits is not None and len(bits) != (n + 7) // 8) or (bits is None) != (nulls == 0):
        raise ValueError(f"a columnar hand-over's {name} is not {n} values")
    out: list = []
    for i in range(n):
        a, b = at[i], at[i + 1]
        if not 0 <= a <= b <= len(data) or (i == 0 and a != 0):
            raise ValueError(f"a columnar hand-over's {name} offsets are not in order")
        if bits is not None and not bits[i >> 3] >> (i & 7) & 1:
            if a != b:
                raise ValueError(f"a columnar hand-over's {name} has data at a null")
            out.append(None)
        else:
            try:
                out.append(data[a:b].decode("utf-8"))
            except UnicodeDecodeError:
                raise ValueError(f"a columnar hand-over's {name} is not UTF-8 at row {i}") from None
    if bits is not None and out.count(None) != nulls:
        raise ValueError(f"a columnar hand-over's {name} says {nulls} nulls")
    return out


# event type -> (table, fields copied as columns)
_TABLE_OF = {
    ev.Eviction: "evictions",
    ev.PrefixLostPages: "request_evictions",
    ev.Transfer: "transfers",
    ev.BatchScheduled: "batches",
    ev.PoolSample: "pool_samples",
}


class Probe:
    """What the engine calls. The base probe counts events and keeps nothing."""

    def __init__(self) -> None:
        self._unstored: dict[type, int] = {}  # event class -> count (by class: no name built per event)

    def emit(self, event) -> None:
        cls = type(event)
        self._unstored[cls] = self._unstored.get(cls, 0) + 1

    @property
    def counts(self) -> dict[str, int]:
        """Events counted and not kept, by name."""
        return {cls.__name__: n for cls, n in self._unstored.items()}


class Recorder(Probe):
    """Keeps the events each table stores (as they come: appending a tuple is the cheapest
    thing a hook can do) and turns them into columns only when flushing, with one zip a table.
    The engine appends straight to the buffers (`emitter`) and calls `tick` once a batch,
    where buffers holding `flush_rows` rows in all are flushed (and `emit` checks at every event)."""

    def __init__(self, sink: Sink | None = None, *, flush_rows: int = 250_000, rows_sink: RowsSink | None = None):
        """`sink` takes columns; `rows_sink` (instead) takes each table's rows as buffered,
        {table: (field names, rows)}, rows a list of tuples or RowBuffer.take()'s encoding
        (`columns_of` makes either columns), and must be done with them when it returns (the
        lists are cleared then, and a columnar buffer's int block, handed over as a view of
        itself, is written over by the next rows): the store's writer process makes the columns
        on its own core."""
        super().__init__()
        if (sink is None) == (rows_sink is None):
            raise TypeError("Recorder takes one of sink and rows_sink")
        self._sink = sink
        self._rows_sink = rows_sink
        self._flush_rows = flush_rows
        self._tables = {cls: table for cls, table in _TABLE_OF.items()}
        self._tables[ev.RequestRecord] = "requests"
        # For a rows sink, each table's rows go to the chosen row buffer (new_row_buffer).
        self._pending: dict = {cls: new_row_buffer(len(cls._fields)) if rows_sink is not None else []
                               for cls in self._tables}
        self._buffers = tuple(self._pending.values())
        self._adopted: dict = {}  # table class -> the buffer its columnar buffer's other rows go to
        self._counter = None  # the columnar buffers' rows (a librt vec[i64] of one, made at the first adopt)
        # tick(): flush once `flush_rows` rows are buffered (the engine calls it once a batch)
        self.tick = new_ticker(self._buffers, flush_rows, self.flush)

    def adopt_columns(self, cls, make):
        """The engine's columnar buffer of `cls`'s rows (engine/emitters.py's Columns: a finished
        request's record, evictions ...): `make(buffer, counter)` wrapping this table's buffer,
        made once (the engine's Emitters ask for it more than once: the controller's, the
        scheduler's, every rank's) and flushed in its place; `counter`, one for the recorder (a
        librt vec[i64] of one int), is the columnar buffers' rows in all, which they keep and the
        ticker reads. None for a columns `sink`, which takes Python values (its buffers stay
        tuples)."""
        if self._rows_sink is None:
            return None
        cur = self._pending[cls]
        if isinstance(cur, make):
            return cur
        if self._counter is None:
            from librt.vecs import vec
            from mypy_extensions import i64

            self._counter = vec[i64]([0])
        cols = self._pending[cls] = make(cur, self._counter)
        self._adopted[cls] = cur
        self._buffers = tuple(self._pending.values())
        # the ticker counts the columnar buffers' rows by their shared counter (read in place),
        # their other rows by the buffers those went to
        tick_buffers = [self._adopted.get(c, b) for c, b in self._pending.items()] + [memoryview(self._counter)]
        self.tick = new_ticker(tuple(tick_buffers), self._flush_rows, self.flush)
        return cols

    def wants(self, cls) -> bool:
        """Only the events a table stores: the engine builds no others (events.Emitters)."""
        return cls in self._pending

    def emitter(self, cls):
        """The buffer's own append, handed the event's fields as a tuple: what `flush` zips
        into columns (the event itself is never built: a NamedTuple costs ~3x a plain tuple,
        and a Python function an event costs as much again)."""
        return self._pending[cls].append

    def pairs_emitter(self, cls):
        """For a table of 3 columns, the buffer's `append_pairs(first, pairs)` (the compiled
        RowBuffer's: a row (first, key, value) for each item of the dict `pairs`, in its order, as
        `emitter(cls)` appending each as a tuple would), or None where the buffer has none (a
        list: the numpy data plane or a columns `sink`) or the table is no such table."""
        if len(cls._fields) != 3 or cls not in self._pending:
            return None
        return getattr(self._pending[cls], "append_pairs", None)

    @property
    def buffered_rows(self) -> int:
        return sum(map(len, self._buffers))

    def emit(self, event) -> None:
        cls = type(event)
        pending = self._pending.get(cls)
        if pending is None:
            if cls is not ev.RequestFinished:  # events that no table stores are only counted
                self._unstored[cls] = self._unstored.get(cls, 0) + 1
                return
            event, pending = event.record, self._pending[ev.RequestRecord]
        pending.append(event)
        self.tick()

    def flush(self) -> None:
        """Hand everything buffered to the sink, once. The sink owns the rows from the call on
        (the store's writer keeps what it could not write yet, and commits each row once), so
        the buffers are cleared whether it returns or raises; SIGINT/SIGTERM wait until they
        are, so an interrupt never leaves rows both handed over and still here."""
        if not self.buffered_rows:
            return
        with signals.deferred():
            try:
                if self._rows_sink is not None:
                    self._rows_sink({self._tables[cls]: (cls._fields, events if isinstance(events, list) else events.take())
                                     for cls, events in self._pending.items() if len(events)})
                else:
                    self._sink({self._tables[cls]: dict(zip(cls._fields, zip(*events)))  # columns as tuples
                                for cls, events in self._pending.items() if events})
            finally:
                for events in self._buffers:
                    events.clear()
