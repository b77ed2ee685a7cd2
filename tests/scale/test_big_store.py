"""benchmarks/big_store.py: a run copied N times inside DuckDB is one consistent run of N x the
requests (the readers' 1M-request stand-in, issue 41): every id unique, every link between tables
still resolving, its evidence stored, and its numbers N x the source's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import big_store  # noqa: E402

COPIES = 3


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    from typer.testing import CliRunner

    from tierdiag.cli.main import app

    folder = tmp_path_factory.mktemp("big-store")
    trace = folder / "mixed.jsonl"
    assert CliRunner().invoke(app, ["synth", str(trace), "--requests", "120", "--rate", "8"]).exit_code == 0
    db = folder / "src.duckdb"
    result = CliRunner().invoke(app, ["replay", str(trace), "--db", str(db), "--device-tokens", "65536",
                                      "--host-tokens", "98304"])
    assert result.exit_code == 0, (result.output, result.exception)
    return db


@pytest.fixture(scope="module")
def built(source, tmp_path_factory) -> dict:
    return big_store.build(source, tmp_path_factory.mktemp("big-out") / "big.duckdb", COPIES)


def _one(con, sql, *params):
    return con.execute(sql, list(params)).fetchone()


def test_the_copies_are_one_consistent_run(source, built):
    with duckdb.connect(str(source), read_only=True) as src, duckdb.connect(built["db"], read_only=True) as big:
        assert _one(big, "SELECT count(*) FROM runs") == (1,)
        (run_id, n) = _one(big, "SELECT run_id, num_requests FROM runs")
        for table, (count,) in ((t, _one(src, f"SELECT count(*) FROM {t}")) for t in big_store.TABLES_COPIED):
            assert _one(big, f"SELECT count(*) FROM {table} WHERE run_id = ?", run_id) == (COPIES * count,), table
        assert n == COPIES * _one(src, "SELECT count(*) FROM requests")[0]
        for col in ("req_id", "seq"):
            assert _one(big, f"SELECT count(DISTINCT {col}) = count(*) FROM requests") == (True,), col
        for table, col in (("batches", "batch_id"), ("evictions", "eviction_id"), ("transfers", "transfer_id")):
            assert _one(big, f"SELECT count(DISTINCT {col}) = count(*) FROM {table}") == (True,), table
        # Every link still resolves to a row of the same copy.
        assert _one(big, "SELECT count(*) FROM request_evictions re ANTI JOIN requests q USING (run_id, req_id)") == (0,)
        assert _one(big, "SELECT count(*) FROM request_evictions re ANTI JOIN evictions e USING (run_id, eviction_id)") == (0,)
        assert _one(big, "SELECT count(*) FROM requests q WHERE first_batch_id IS NOT NULL AND first_batch_id NOT IN "
                         "(SELECT batch_id FROM batches)") == (0,)
        # Sessions stay within their copy: as many sessions, COPIES times.
        s = _one(src, "SELECT count(DISTINCT session_id) FROM requests")[0]
        assert _one(big, "SELECT count(DISTINCT session_id) FROM requests") == (COPIES * s,)
        # Copies follow one another in time.
        assert _one(big, "SELECT max(arrival_ns) FILTER (WHERE req_id NOT LIKE '%@c%') < "
                         "min(arrival_ns) FILTER (WHERE req_id LIKE '%@c1') FROM requests") == (True,)
        stored = json.loads(_one(big, "SELECT evidence_json FROM run_evidence WHERE run_id = ?", run_id)[0])
        assert stored["summary"]["num_requests"] == n


def test_the_stand_in_reads_as_copies_of_the_source(source, built):
    from tierdiag.diagnose.run.summary import run_summary
    from tierdiag.store.reader import open_store, resolve_run

    with open_store(source) as con:
        a = run_summary(con, resolve_run(con, None), diagnose=False)
    with open_store(built["db"]) as con:
        b = run_summary(con, resolve_run(con, None), diagnose=False)
    assert b.num_requests == COPIES * a.num_requests
    assert b.tokens.input_tokens == COPIES * a.tokens.input_tokens
    assert b.tokens.device_tokens == COPIES * a.tokens.device_tokens
    assert b.sessions.num_sessions == COPIES * a.sessions.num_sessions


@settings(max_examples=25, deadline=None)
@given(copies=st.integers(max_value=0) | st.sampled_from([-(2**63), -1, 0]))
def test_no_copies_is_refused_before_anything_is_written(tmp_path_factory, copies):
    out = tmp_path_factory.mktemp("refused") / "big.duckdb"
    with pytest.raises(ValueError, match="--copies"):
        big_store.build(Path("unused.duckdb"), out, copies)
    assert not out.exists()
    with pytest.raises(SystemExit):
        big_store.main(["src.duckdb", str(out), "--copies", str(copies)])
    assert not out.exists()


def test_an_existing_output_is_never_overwritten(source, tmp_path):
    out = tmp_path / "taken.duckdb"
    out.write_bytes(b"not ours")
    with pytest.raises(FileExistsError):
        big_store.build(source, out, 2)
    assert out.read_bytes() == b"not ours"
    with pytest.raises(FileExistsError):
        big_store.build(source, source, 2)  # an output is never one of its inputs
