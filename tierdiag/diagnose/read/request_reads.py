"""explain's reads that need only the request's row, read beside the rest of its answer.

`explain` on a 1M-request run spends most of its query time in five reads that depend on
nothing it computes but the request's row: its evictions (a scan of `request_evictions` by id),
the run's prefill-busy time (every batch of the run summed), its session's previous turn (a scan
of `requests` by session), the queue at its arrival and its transfers. `RequestReads` runs them on a second cursor of the same database,
on a thread of its own, while the caller's thread goes on with the other steps (DuckDB runs a
query without the GIL); each answer is the same query's answer, handed over when asked for. Where
no second core is free this saves nothing and costs a thread; the CPU is the same.

A store of an older schema is read through temporary views of its connection
(store/reader.py), which a second cursor does not see: there each read is made on the caller's
thread when it is asked for, as before.

The thread imports nothing (tests/reliability/test_thread_imports.py): what it calls is imported
here, on the caller's thread, and the caller has run parameterised queries on the connection
before it starts. `close()` waits for it and closes its cursor: the caller calls it before the
connection is closed, on every path (explain: `try`/`finally`).
"""

from __future__ import annotations

import threading
from contextlib import ExitStack
from typing import Any, Callable

import duckdb

from tierdiag.diagnose.read import queries
from tierdiag.diagnose.read.request_context import queue_depth_at_arrival
from tierdiag.diagnose.read.request_steps import request_evictions, request_transfers, run_prefill_busy_ns
from tierdiag.diagnose.read.requests import RequestRow
from tierdiag.diagnose.read.rows import second_cursor
from tierdiag.store.reader import views_shown
from tierdiag.threads import OnThread, idle


def has_previous_turn(row: RequestRow) -> bool:
    """Whether explain's session step reads the previous turn (sessions.session_step's test)."""
    return row.think_ms is not None and row.session_id is not None


def transfer_bounds(row: RequestRow) -> tuple[int | None, int | None]:
    """The times a request's load-backs and prefetches start between (explain's step 3)."""
    return (int(row.arrival_ns) if row.arrival_ns is not None else None), row.finish_ns


def asks_queue_depth(row: RequestRow, finished: bool) -> bool:
    """Whether explain's context reads the queue at its arrival (request/context.py's test)."""
    return finished and row.seq is not None


def shadowed(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether `con` has temporary views: a store of an older schema read as the current one
    (store/reader.py `show_added_columns`: its tables shadowed, on this connection only). Where
    open_store opened it, it says (`views_shown`); DuckDB is asked for any other connection."""
    known = views_shown(con)
    if known is not None:
        return known
    return bool(con.execute("SELECT count(*) FROM duckdb_views() WHERE temporary AND NOT internal").fetchall()[0][0])


class RequestReads:
    """The five reads of `row` (module doc), on a second cursor and a thread, started at once, in
    the order explain asks for them; `get(name)` waits for that one alone: "queue_depth"
    (request_context.queue_depth_at_arrival; None where `finished` or the row's seq says explain
    does not ask), "transfers" (request_steps.request_transfers over [arrival, finish]),
    "evictions" (request_steps.request_evictions), "run_busy_ns" (request_steps.run_prefill_busy_ns),
    "previous" (queries.previous_turn; None where the row is no later session turn)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, run, row: RequestRow, finished: bool):
        rid = run.run_id
        self._plan: dict[str, Callable[[duckdb.DuckDBPyConnection], Any]] = {
            "queue_depth": lambda c: (queue_depth_at_arrival(c, rid, row.req_id, int(row.arrival_ns or 0), int(row.seq),
                                                             int(row.dp_rank or 0))
                                      if asks_queue_depth(row, finished) else None),
            "transfers": lambda c: request_transfers(c, rid, row.req_id, *transfer_bounds(row)),
            "evictions": lambda c: request_evictions(c, rid, str(row.req_id)),
            "run_busy_ns": lambda c: run_prefill_busy_ns(c, rid),
            "previous": lambda c: queries.previous_turn(c, run, row) if has_previous_turn(row) else None,
        }
        self._values: dict[str, Any] = {}
        self._done = {name: threading.Event() for name in self._plan}
        self._stack = ExitStack()
        self._con: duckdb.DuckDBPyConnection | None = None
        self._job: OnThread | None = None
        if shadowed(con):  # a second cursor would not see them: each read on the caller's thread, when asked
            self._con = con
            return
        cursor = self._stack.enter_context(second_cursor(con))
        self._job = OnThread(self._read, cursor, name="tierdiag-explain-reads")

    def _read(self, con: duckdb.DuckDBPyConnection) -> None:
        try:
            for name, read in self._plan.items():
                if name not in self._values:  # not given (`give`) before the thread came to it
                    self._values[name] = read(con)
                self._done[name].set()
        finally:  # a read that raised: every wait ends, and get() raises it
            for done in self._done.values():
                done.set()

    def give(self, name: str, value: Any) -> None:
        """The answer of read `name`, known to the caller another way (explain: the run's
        prefill-busy time from the stored run context, the same sum): the thread skips that read
        if it has not begun it, and get(name) answers `value` (a read begun already answers the
        same)."""
        if name not in self._plan:
            raise KeyError(name)
        self._values.setdefault(name, value)
        if self._job is None:
            return
        self._done[name].set()

    def get(self, name: str) -> Any:
        """One read's answer, once it is there (what the thread raised, raised here)."""
        if self._job is None:
            if name not in self._values:
                self._values[name] = self._plan[name](self._con)
            return self._values[name]
        if not self._done[name].is_set():
            idle()  # the caller's deferred work (threads.idle_work) before it blocks
            self._done[name].wait()
        if name not in self._values:
            self._job.result()
        return self._values[name]

    def close(self) -> None:
        """Wait for the thread and close its cursor; what a read raised is raised by get() only
        (a caller that stops on an error of its own does not see this one instead)."""
        with self._stack:
            if self._job is not None:
                self._job.join()
