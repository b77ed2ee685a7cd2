"""The run-wide numbers `explain` compares one request with: the run's bounds (where every
view's clock starts), its load-backs and its device evictions. Computed from the rows here;
stored with the run at its close (evidence.py) and read back through facts.py."""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from tierdiag.diagnose.sql import run_span_ns


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


def run_totals(con: duckdb.DuckDBPyConnection, run_id: str) -> RunTotals:
    """`RunTotals` from the run's rows."""
    start, end = run_bounds_ns(con, run_id)
    lb = con.execute("SELECT count(*), coalesce(sum(bytes), 0) FROM transfers WHERE run_id = ? AND kind = 'load_back'",
                     [run_id]).fetchone()
    dev = con.execute(
        "SELECT count(*), coalesce(sum(tokens), 0), "
        "       coalesce(sum(tokens) FILTER (WHERE eviction_id IN "
        "           (SELECT eviction_id FROM request_evictions WHERE run_id = ?)), 0) "
        "FROM evictions WHERE run_id = ? AND tier = 'device'", [run_id, run_id]).fetchone()
    return RunTotals(start_ns=start, end_ns=end, loadbacks=int(lb[0] or 0), loadback_bytes=int(lb[1] or 0),
                     device_evictions=int(dev[0] or 0), device_evicted_tokens=int(dev[1] or 0),
                     device_rereferenced_tokens=int(dev[2] or 0))
