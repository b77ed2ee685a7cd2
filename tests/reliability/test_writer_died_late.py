"""The writer process killed once it had recorded the run whole (issue 41, session 39 h49rel).

Session 38 (h48kill) kept such a run `complete`, every row with it, but the replay then exited 4
with the writer's line alone: the closing numbers, which the close reads back from the store
after its evidence, were never printed, though all they come from was in the store. Now the
replay reads them back itself (diagnose/run/close.py `numbers_read_back`: the stored evidence's
summary where the writer got to store it, else the summary's numbers from the rows) and prints
its result as ever, then the writer's line, exit 4 (docs/contract.md section 7).

Each window is held still by a prelude in the writer's entry (tests/reliability/
test_writer_killed.py), so the kill lands in it every time:

- d2: the status `complete` committed, while the evidence is computed (no evidence row)
- d2b: the evidence stored, before the writer answered the close
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from pathlib import Path

import pytest

from harness import Result, sql
from test_signals import ENGINE, listed_runs
from test_writer_killed import _cli, _writer_pid
from test_writer_process import MARK, assert_no_process_left
from tests.support.cli import tierdiag_in_process

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc (Linux)")

# What differs between two replays of one trace into two stores (the rest must not).
PER_RUN = ("run_id", "db_path", "wall_s", "wall_phases", "writer")  # the undisturbed one written inline


def _replay_killed(tmp_path: Path, trace: Path, db: Path, window: str, *args: str) -> Result:
    """The CLI (`TIERDIAG_WRITER=process`) with its writer killed in `window`."""
    mark = uuid.uuid4().hex
    proc, marker = _cli(tmp_path, trace, db, mark, window, (*ENGINE, *args))
    os.kill(_writer_pid(proc, marker, mark), signal.SIGKILL)
    out, err = proc.communicate(timeout=180)
    assert_no_process_left(mark)
    assert not any((tmp_path / "tmp").iterdir())
    return Result(proc.returncode, out, err)


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory) -> dict:
    """The same trace replayed with nothing killed: what the replay prints (JSON), and its store."""
    root = tmp_path_factory.mktemp("late")
    trace = root / "t.jsonl"
    assert tierdiag_in_process("synth", trace, "--requests", 400, "--seed", 7).code == 0
    db = root / "ok.duckdb"
    r = tierdiag_in_process("replay", trace, "--db", db, *ENGINE, "--json")
    assert r.code == 0, r.err
    return {"trace": trace, "db": db, "json": json.loads(r.out)}


def _evidence_rows(db: Path) -> int:
    return sql(db, "SELECT count(*) FROM run_evidence")[0][0]


@pytest.mark.slow
@pytest.mark.parametrize("window", ["d2", "d2b"])
def test_the_result_is_printed_from_the_store_then_the_writers_death(tmp_path, undisturbed, window):
    """--json: stdout is the replay's JSON, every number as the undisturbed replay's (they are
    read back from the store: the same rows); stderr one line, the writer's death and where the
    run is; exit 4. The run complete with every row once; its evidence stored by the writer
    (d2b) or by the first reader (d2), the same row as the undisturbed close's."""
    db = tmp_path / "r.duckdb"
    r = _replay_killed(tmp_path, undisturbed["trace"], db, window, "--json")
    line = r.fails(4, "writer process", "SIGKILL", "after it had closed the run", "as complete")
    assert ("before its evidence was stored" in line) == (window == "d2"), line
    got, want = json.loads(r.out), undisturbed["json"]
    assert got["status"] == "complete" and got["writer"] == "process" and got["db_path"] == str(db)
    assert {k: v for k, v in got.items() if k not in PER_RUN} == {k: v for k, v in want.items() if k not in PER_RUN}
    (run,) = listed_runs(db)
    assert run["run_id"] == got["run_id"] in line and run["status"] == "complete"
    n, distinct = sql(db, "SELECT count(*), count(DISTINCT seq) FROM requests")[0]
    assert n == distinct == run["num_requests"] == got["num_requests"] + got["num_rejected"]
    assert _evidence_rows(db) == (0 if window == "d2" else 1)
    s = tierdiag_in_process("summary", "--db", db, "--json")
    assert s.code == 0 and s.err == "", s.err
    every = next(c for c in json.loads(s.out)["classes"] if c["hit_class"] == "all")
    assert every["ttft_p50_ms"] == got["ttft_p50_ms"] and every["ttft_p99_ms"] == got["ttft_p99_ms"]
    assert _evidence_rows(db) == 1  # stored by the writer (d2b) or by that reader (d2)
    ours = sql(db, "SELECT evidence_version, replace(evidence_json, run_id, 'R') FROM run_evidence")
    theirs = sql(undisturbed["db"], "SELECT evidence_version, replace(evidence_json, run_id, 'R') FROM run_evidence")
    assert ours == theirs  # byte for byte, but for the run's id


@pytest.mark.slow
def test_the_text_view_too(tmp_path, undisturbed):
    """The closing table on stdout, as an undisturbed replay prints it (but for the run's id, its
    store and its wall times), then the line."""
    db = tmp_path / "r.duckdb"
    r = _replay_killed(tmp_path, undisturbed["trace"], db, "d2")
    r.fails(4, "after it had closed the run", "before its evidence was stored", "as complete")
    ok = tierdiag_in_process("replay", undisturbed["trace"], "--db", tmp_path / "ok.duckdb", *ENGINE)
    assert ok.code == 0, ok.err
    (run,) = listed_runs(db)
    assert r.out.strip() and run["run_id"] in r.out
    keep = lambda text: [ln for ln in text.splitlines() if not any(w in ln for w in ("wall", "run-", "duckdb"))]  # noqa: E731
    assert keep(r.out) == keep(ok.out)


def test_numbers_read_back_equal_the_closes(undisturbed, tmp_path):
    """`numbers_read_back` with the evidence stored and without it (computed from the rows): the
    numbers the close gave the replay (its JSON), each way."""
    import shutil

    from tierdiag.diagnose.run.close import numbers_read_back
    from tierdiag.units import ns_to_ms

    want = undisturbed["json"]
    db = tmp_path / "n.duckdb"
    shutil.copy(undisturbed["db"], db)
    for drop in (False, True):
        if drop:
            import duckdb

            with duckdb.connect(str(db)) as con:
                con.execute("DELETE FROM run_evidence")
        got = numbers_read_back(db, want["run_id"])
        assert got["span_ns"] / 1e9 == want["virtual_s"]
        assert [ns_to_ms(v) for v in got["ttft_ns"]] == [want["ttft_p50_ms"], want["ttft_p90_ms"], want["ttft_p99_ms"]]
    assert _evidence_rows(db) == 0  # read back: nothing stored by it
