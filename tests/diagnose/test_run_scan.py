"""The run-wide sums in one query (diagnose/read/run_scan.py, issue 41 session 26): each of
`run_scan`'s parts is what the query it replaces at the close returns (values and types), on a
real replay's rows and on those rows made hostile (NULLs, other statuses, negative and huge
values, another run's rows beside, no rows at all); where one of those queries refuses the rows
(an overflow), the scan is not held to anything."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from tierdiag.diagnose.read import run_context as read_ctx
from tierdiag.diagnose.read import totals as read_totals
from tierdiag.diagnose.read.queries import run_span_ns
from tierdiag.diagnose.read.run_scan import RunScan, run_scan
from tierdiag.store.reader import open_store, resolve_run
from tierdiag.store.schema import MISS_COLUMNS


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """A real replay (agent sessions, two ranks, a storage tier: every column of the sums in use)."""
    from tests.support.cli import cli_env, completed_in_process as run  # the CLI in this process: ~0.45 s a start

    folder = tmp_path_factory.mktemp("run_scan")
    trace = folder / "t.jsonl"
    assert run("synth", trace, "--requests", "200", "--kind", "agent", "--seed", "5").returncode == 0
    db = folder / "run.duckdb"
    done = run("replay", trace, "--db", db, "--device-tokens", "65536", "--dp", "2", "--storage-tokens", "2000000",
               env=cli_env(TIERDIAG_WRITER="inline"))
    assert done.returncode == 0, done.stderr
    return db


def _separately(con, run_id: str) -> RunScan:
    """What each query the scan replaces returns, one query each (as before the scan)."""
    lb = read_ctx.loadback_transfers(con, run_id)
    return RunScan(
        totals=read_totals.request_totals(con, run_id), transfers=read_totals.transfer_totals(con, run_id),
        finished=read_ctx.finished_totals(con, run_id), own=read_ctx.own_parts(con, run_id),
        tokens=read_ctx.finished_token_totals(con, run_id), loadback=read_ctx.loadback_requests(con, run_id),
        loadback_transfers=lb, loadback_count_bytes=read_ctx.loadback_count_bytes(con, run_id),
        arrival_spread_ns=read_ctx.trace_arrival_spread_ns(con, run_id), named_ranks=read_ctx.named_ranks(con, run_id),
        span_ns=run_span_ns(con, run_id, "all"), miss_sums=read_ctx.miss_reason_sums(con, run_id))


def _same(got: RunScan, want: RunScan) -> None:
    for field, a, b in zip(RunScan._fields, got, want):
        assert a == b, field
        # the types too (int, float, None), part by part: what is stored is their JSON
        flat_a = tuple(a) if isinstance(a, tuple) else (a,)
        flat_b = tuple(b) if isinstance(b, tuple) else (b,)
        assert [type(x) for x in flat_a] == [type(x) for x in flat_b], field


def _copy(db: Path) -> tuple[duckdb.DuckDBPyConnection, str]:
    con = duckdb.connect(":memory:")
    con.execute(f"ATTACH '{db}' AS src (READ_ONLY)")
    for table in ("requests", "transfers"):
        con.execute(f"CREATE TABLE {table} AS SELECT * FROM src.{table}")
    run_id = con.execute("SELECT DISTINCT run_id FROM requests").fetchall()[0][0]
    con.execute("DETACH src")
    return con, run_id


def test_the_scan_is_each_query_on_a_replay(recorded):
    with open_store(recorded) as con:
        run_id = resolve_run(con, None).run_id
        got, want = run_scan(con, run_id, miss=True), _separately(con, run_id)
        assert want.totals.requests == 200 and want.named_ranks == 2 and want.miss_sums is not None
        assert want.transfers.loadbacks and want.totals.storage_tokens is not None
        _same(got, want)
        assert run_scan(con, run_id).miss_sums is None  # not asked for
        _same(run_scan(con, "no such run", miss=True), _separately(con, "no such run"))


_REQUEST_COLUMNS = ("status", "ttft_ns", "arrival_ns", "trace_arrival_ns", "finish_ns", "first_token_ns", "queue_ns",
                    "input_tokens", "device_hit_tokens", "host_hit_tokens", "storage_hit_tokens", "computed_tokens",
                    "recomputed_tokens", "loadback_skipped_tokens", "loadback_exposed_ns", "loadback_queued_ns",
                    "storage_wait_ns", "recompute_ns", "compute_ns", "ideal_ttft_ns", "decode_wait_ns", "loadback_ns",
                    "recompute_instead_ns", "ttft_if_device_resident_ns", "dp_rank", "best_rank",
                    "best_rank_device_tokens", "arrival_device_tokens", "storage_match_tokens", MISS_COLUMNS[0],
                    MISS_COLUMNS[-1])
_TRANSFER_COLUMNS = ("kind", "bytes", "pages", "runs", "t_start_ns", "t_end_ns")

_ints = st.one_of(st.none(), st.integers(-3, 3), st.integers(-(2 ** 62), 2 ** 62),
                  st.sampled_from([2 ** 63 - 1, -(2 ** 63), 0]))
_texts = st.one_of(st.none(), st.sampled_from(["finished", "rejected", "load_back", "prefetch", "", "FINISHED"]))


def _value(column: str):
    return _texts if column in ("status", "kind") else _ints


@st.composite
def _edits(draw, columns: tuple[str, ...]):
    column = draw(st.sampled_from(columns))
    return draw(st.integers(0, 10 ** 6)), column, draw(_value(column))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests=st.lists(_edits(_REQUEST_COLUMNS), max_size=12),
       transfers=st.lists(_edits(_TRANSFER_COLUMNS), max_size=6),
       other_run=st.booleans(), empty=st.sampled_from(["", "requests", "transfers", "both"]))
def test_the_scan_is_each_query_on_hostile_rows(recorded, requests, transfers, other_run, empty):
    con, run_id = _copy(recorded)
    try:
        if other_run:  # another run's rows beside, changed: not the scan's
            for table in ("requests", "transfers"):
                con.execute(f"INSERT INTO {table} SELECT * REPLACE ('other' AS run_id) FROM {table}")
            con.execute("UPDATE requests SET input_tokens = 7, dp_rank = 9 WHERE run_id = 'other'")
        for table, edits in (("requests", requests), ("transfers", transfers)):
            n = con.execute(f"SELECT count(*) FROM {table} WHERE run_id = ?", [run_id]).fetchall()[0][0]
            for at, column, value in edits:
                try:
                    con.execute(f"UPDATE {table} SET {column} = ? WHERE rowid = (SELECT rowid FROM {table} "
                                f"WHERE run_id = ? ORDER BY rowid LIMIT 1 OFFSET ?)", [value, run_id, at % n])
                except duckdb.ConversionException:  # past the column's type (an INTEGER): no store holds it
                    event("a value the column cannot hold")
        for table in ("requests", "transfers"):
            if empty in (table, "both"):
                con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
        try:
            want = _separately(con, run_id)
        except duckdb.Error:  # a query refused these rows (an overflow): the scan is held to nothing here
            event("a query refused the rows")
            return
        event("every query answered")
        _same(run_scan(con, run_id, miss=True), want)
    finally:
        con.close()
