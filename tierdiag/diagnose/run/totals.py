"""The run-wide numbers `explain` compares one request with: the run's bounds (where every
view's clock starts), its load-backs and its device evictions. Computed from the rows here;
stored with the run at its close (evidence.py) and read back through facts.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import duckdb

from tierdiag.diagnose.read import run_context as read_ctx
from tierdiag.diagnose.read.queries import run_span_ns
from tierdiag.diagnose.read.run_scan import RunScan


@dataclass(frozen=True)
class RunTotals:
    start_ns: int
    end_ns: int
    loadbacks: int
    loadback_bytes: int
    device_evictions: int
    device_evicted_tokens: int
    device_rereferenced_tokens: int  # of those, tokens some request later came back for

    @property
    def bounds(self) -> tuple[int, int]:
        return self.start_ns, self.end_ns


def run_bounds_ns(con: duckdb.DuckDBPyConnection, run_id: str) -> tuple[int, int]:
    """First arrival and last finish of the run (virtual time), over all its requests: its span,
    where every view's clock starts (`summary`'s span_ms is the difference)."""
    return run_span_ns(con, run_id, "all")


def run_totals(con: duckdb.DuckDBPyConnection, run_id: str, *, scan: Callable[[], RunScan] | None = None,
               evictions: Callable[[], Any] | None = None) -> RunTotals:
    """`RunTotals` from the run's rows; `scan`, if given, gives the run's bounds and load-backs
    (read/run_scan.py: one query for these and the summary's and the context's sums; issue 41);
    `evictions`, if given, the eviction queries' results folded while the run was recorded
    (diagnose/run/eviction_rows.py `EvictionResults`: here its device evictions; None: queried)."""
    s = scan() if scan is not None else None
    start, end = run_bounds_ns(con, run_id) if s is None else s.span_ns
    loadbacks, loadback_bytes = read_ctx.loadback_count_bytes(con, run_id) if s is None else s.loadback_count_bytes
    folded = evictions() if evictions is not None else None
    dev = read_ctx.device_evictions(con, run_id) if folded is None else folded.device
    return RunTotals(start_ns=start, end_ns=end, loadbacks=loadbacks, loadback_bytes=loadback_bytes,
                     device_evictions=dev.evictions, device_evicted_tokens=dev.tokens,
                     device_rereferenced_tokens=dev.rereferenced_tokens)
