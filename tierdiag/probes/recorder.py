"""The recorder: a probe that buffers events as columns and hands them to a sink in bulk.

No DuckDB here (the sink is the store's writer): the engine stays independent of storage,
and tests can record into plain lists.
"""

from __future__ import annotations

from typing import Callable, Mapping

from tierdiag.probes import events as ev

Sink = Callable[[Mapping[str, Mapping[str, list]]], None]

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
    def __init__(self, sink: Sink, *, flush_rows: int = 250_000):
        super().__init__()
        self._sink = sink
        self._flush_rows = flush_rows
        self._rows = 0
        self._columns: dict[type, tuple[str, tuple[str, ...], list[list]]] = {}
        for cls, table in _TABLE_OF.items():
            names = ev.field_names(cls)
            self._columns[cls] = (table, names, [[] for _ in names])
        rec_names = ev.field_names(ev.RequestRecord)
        self._columns[ev.RequestRecord] = ("requests", rec_names, [[] for _ in rec_names])

    def emit(self, event) -> None:
        cls = type(event)
        if cls is ev.RequestFinished:
            event, cls = event.record, ev.RequestRecord
        entry = self._columns.get(cls)
        if entry is None:  # events that no table stores are only counted
            super().emit(event)
            return
        _, names, cols = entry
        for name, col in zip(names, cols):
            col.append(getattr(event, name))
        self._rows += 1
        if self._rows >= self._flush_rows:
            self.flush()

    def flush(self) -> None:
        if not self._rows:
            return
        tables: dict[str, dict[str, list]] = {}
        for table, names, cols in self._columns.values():
            if cols[0]:
                tables[table] = dict(zip(names, cols))
        self._sink(tables)
        for _, names, cols in self._columns.values():
            for col in cols:
                col.clear()
        self._rows = 0
