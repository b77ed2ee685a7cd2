"""The recorder: a probe that buffers events as columns and hands them to a sink in bulk.

No DuckDB here (the sink is the store's writer): the engine stays independent of storage,
and tests can record into plain lists.
"""

from __future__ import annotations

from typing import Callable, Mapping

from tierdiag.probes import events as ev

Sink = Callable[[Mapping[str, Mapping[str, tuple]]], None]

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
        self.counts: dict[str, int] = {}

    def emit(self, event) -> None:
        name = type(event).__name__
        self.counts[name] = self.counts.get(name, 0) + 1


class Recorder(Probe):
    """Keeps the events each table stores (as they come: appending a tuple is the cheapest
    thing a hook can do) and turns them into columns only when flushing, with one zip a table."""

    def __init__(self, sink: Sink, *, flush_rows: int = 250_000):
        super().__init__()
        self._sink = sink
        self._flush_rows = flush_rows
        self._rows = 0
        self._tables = {cls: table for cls, table in _TABLE_OF.items()}
        self._tables[ev.RequestRecord] = "requests"
        self._pending: dict[type, list] = {cls: [] for cls in self._tables}

    def emit(self, event) -> None:
        cls = type(event)
        if cls is ev.RequestFinished:
            event, cls = event.record, ev.RequestRecord
        pending = self._pending.get(cls)
        if pending is None:  # events that no table stores are only counted
            super().emit(event)
            return
        pending.append(event)
        self._rows += 1
        if self._rows >= self._flush_rows:
            self.flush()

    def flush(self) -> None:
        if not self._rows:
            return
        tables: dict[str, dict[str, tuple]] = {}
        for cls, events in self._pending.items():
            if events:
                tables[self._tables[cls]] = dict(zip(cls._fields, zip(*events)))  # columns as tuples
        self._sink(tables)
        # Only once the sink has them: if it raised (disk full), the events are still here.
        for events in self._pending.values():
            events.clear()
        self._rows = 0
