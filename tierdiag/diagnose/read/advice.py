"""What advice reads to verify itself (diagnose/advice/verify.py): a run's headline numbers and
target shares over its finished requests, one request's TTFT, and the runs `advise` replayed.
"""

from __future__ import annotations

from typing import NamedTuple

import duckdb

from tierdiag.diagnose.read.sql import FINISHED_SQL

# The tokens reused in a tier or above it.
_FOUND_SQL = {"device": "device_hit_tokens", "host": "device_hit_tokens + host_hit_tokens",
              "storage": "device_hit_tokens + host_hit_tokens + storage_hit_tokens"}

# Served and with a first token: `advise`'s population (status NULL is no served request here).
_SERVED = "status = 'finished' AND ttft_ns IS NOT NULL"


def found_and_input_tokens(con: duckdb.DuckDBPyConnection, run_id: str, tier: str) -> tuple[int | None, int | None]:
    """(tokens reused in `tier` or above, input tokens) over the run's finished requests."""
    row = con.execute(f"SELECT sum({_FOUND_SQL[tier]}), sum(input_tokens) FROM requests "
                      f"WHERE run_id = ? AND {FINISHED_SQL}", [run_id]).fetchall()[0]
    return row[0], row[1]


class TargetNumbers(NamedTuple):
    ttft_p50_ns: int | None
    ttft_p99_ns: int | None
    targets: tuple  # each target's value, in the order asked


def target_numbers(con: duckdb.DuckDBPyConnection, run_id: str, target_sqls: list[str]) -> TargetNumbers:
    """TTFT p50 and p99 and each of `target_sqls` (an aggregate over `requests`) over the run's served requests."""
    r = con.execute(
        "SELECT quantile_disc(ttft_ns, 0.5), quantile_disc(ttft_ns, 0.99), "
        + ", ".join(target_sqls)
        + f" FROM requests WHERE run_id = ? AND {_SERVED}", [run_id]).fetchall()[0]
    return TargetNumbers(r[0], r[1], tuple(r[2:]))


def complete_sweep_runs(con: duckdb.DuckDBPyConnection, sweep_id: str) -> list[tuple[str, str | None]]:
    """(run id, config JSON) of the sweep's complete runs, oldest first."""
    return con.execute(
        "SELECT run_id, config_json FROM runs WHERE sweep_id = ? AND status = 'complete' ORDER BY created_at",
        [sweep_id]).fetchall()


def request_ttft_ns(con: duckdb.DuckDBPyConnection, run_id: str, req_id: str) -> int | None:
    """The request's TTFT in the run (None: not there, or none)."""
    found = next(iter(con.execute("SELECT ttft_ns FROM requests WHERE run_id = ? AND req_id = ?",
                                  [run_id, req_id]).fetchall()), None)
    return (found or [None])[0]


class Headline(NamedTuple):
    """Over the run's served requests (None where no row says)."""
    ttft_p50_ns: int | None
    ttft_p99_ns: int | None
    recomputed_tokens: int | None
    device_tokens: int | None
    host_tokens: int | None
    storage_tokens: int | None
    input_tokens: int | None
    ttft_mean_ns: float | None


def headline(con: duckdb.DuckDBPyConnection, run_id: str) -> Headline:
    return Headline(*con.execute(
        "SELECT quantile_disc(ttft_ns, 0.5), quantile_disc(ttft_ns, 0.99), sum(recomputed_tokens), "
        "sum(device_hit_tokens), sum(host_hit_tokens), sum(storage_hit_tokens), sum(input_tokens), avg(ttft_ns) "
        f"FROM requests WHERE run_id = ? AND {_SERVED}", [run_id]).fetchall()[0])
