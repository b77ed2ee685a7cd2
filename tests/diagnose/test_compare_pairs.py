"""`compare A B --requests` pairs requests by id; ids only name the same request in runs of the
same trace (issue 32). Most pairs of different input lengths: refused, exit 2. A few: a warning
line on stderr and `num_input_mismatch` in --json."""

from __future__ import annotations

import pytest

from tests.diagnose.conftest import MS, RunBuilder
from tierdiag.diagnose.comparison.compare import compare_requests
from tierdiag.errors import ConfigError, ExitCode
from tierdiag.store.reader import open_store, resolve_run


def _run(db, name: str, lengths: dict[str, int]) -> str:
    b = RunBuilder(db, name=name)
    for i, (rid, n) in enumerate(lengths.items()):
        b.request(rid, arrival_ns=i * 100 * MS, input_tokens=n, compute_ns=(10 + i) * MS)
    b.write()
    return b.run_id


def test_runs_of_two_traces_are_refused(tmp_path):
    db = tmp_path / "runs.duckdb"
    a = _run(db, "a", {"1": 100, "2": 200, "3": 300, "4": 400})
    b = _run(db, "b", {"1": 150, "2": 250, "3": 300, "4": 450})  # 3 of 4 differ: another trace
    with open_store(db) as con:
        with pytest.raises(ConfigError, match="not of the same trace: 3 of 4 requests") as err:
            compare_requests(con, resolve_run(con, a), resolve_run(con, b))
    assert err.value.exit_code == ExitCode.USAGE == 2


def test_a_few_unrelated_pairs_are_counted_and_warned(tmp_path, capsys):
    db = tmp_path / "runs.duckdb"
    a = _run(db, "a", {"1": 100, "2": 200, "3": 300, "4": 400})
    b = _run(db, "b", {"1": 100, "2": 200, "3": 300, "4": 999})
    with open_store(db) as con:
        rc = compare_requests(con, resolve_run(con, a), resolve_run(con, b))
    assert (rc.num_common, rc.num_input_mismatch) == (4, 1)
    assert rc.to_json()["num_input_mismatch"] == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "1 of 4 requests paired by id have different input lengths" in err


def test_the_same_trace_pairs_quietly(tmp_path, capsys):
    db = tmp_path / "runs.duckdb"
    lengths = {"1": 100, "2": 200}
    a, b = _run(db, "a", lengths), _run(db, "b", lengths)
    with open_store(db) as con:
        rc = compare_requests(con, resolve_run(con, a), resolve_run(con, b))
    assert rc.num_input_mismatch == 0 and capsys.readouterr().err == ""
