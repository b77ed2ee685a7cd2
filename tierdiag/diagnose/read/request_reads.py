"""explain's reads that need only the request's row, read beside the rest of its answer.

`explain` on a 1M-request run spends ~60 % of its query time in three reads that depend on
nothing it computes: the request's evictions (a scan of `request_evictions` by id), the run's
prefill-busy time (every batch of the run summed) and its session's previous turn (a scan of
`requests` by session). `RequestReads.start` runs them on a second cursor of the same database,
on a thread of its own, while the caller's thread goes on with the other steps (DuckDB runs a
query without the GIL); each answer is the same query's answer, handed over when asked for. Where
no second core is free this saves nothing and costs a thread; the CPU is the same.

The thread imports nothing (tests/reliability/test_thread_imports.py): what it calls is imported
here, on the caller's thread, and the caller has run parameterised queries on the connection
before it starts. `close()` waits for it and closes its cursor: the caller calls it before the
connection is closed, on every path (explain: `try`/`finally`).
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import NamedTuple

import duckdb

from tierdiag.diagnose.read import queries
from tierdiag.diagnose.read.request_steps import EvictionRecord, request_evictions, run_prefill_busy_ns
from tierdiag.diagnose.read.requests import RequestRow
from tierdiag.diagnose.read.rows import second_cursor
from tierdiag.threads import OnThread


class Read(NamedTuple):
    evictions: list[EvictionRecord]  # request_steps.request_evictions
    run_busy_ns: int  # request_steps.run_prefill_busy_ns
    previous: RequestRow | None  # queries.previous_turn; None where the row names no session turn


def has_previous_turn(row: RequestRow) -> bool:
    """Whether explain's session step reads the previous turn (sessions.session_step's test)."""
    return row.think_ms is not None and row.session_id is not None


def _read(con: duckdb.DuckDBPyConnection, run, row: RequestRow) -> Read:
    evictions = request_evictions(con, run.run_id, str(row.req_id))
    busy = run_prefill_busy_ns(con, run.run_id)
    previous = queries.previous_turn(con, run, row) if has_previous_turn(row) else None
    return Read(evictions, busy, previous)


class RequestReads:
    """The three reads of `row` (module doc), on a second cursor and a thread, started at once."""

    def __init__(self, con: duckdb.DuckDBPyConnection, run, row: RequestRow):
        self._stack = ExitStack()
        cursor = self._stack.enter_context(second_cursor(con))
        self._job = OnThread(_read, cursor, run, row, name="tierdiag-explain-reads")
        self._value: Read | None = None

    def result(self) -> Read:
        """The reads' answers (what a query raised, raised here)."""
        if self._value is None:
            self._value = self._job.result()
        return self._value

    def close(self) -> None:
        """Wait for the thread and close its cursor; what a query raised is raised by result()
        only (a caller that stops on an error of its own does not see this one instead)."""
        with self._stack:
            self._job.join()
