"""After a write that fails mid-run and would succeed if tried again (the disk freed between the
failure and the close), the inline writer and the writer process record the same thing
(docs/contract.md, TIERDIAG_WRITER): the run `failed` with the same error line and exit code,
the rows committed before the failed write, and none of that write's rows nor of any row
handed over after it, every table alike (store/writer.py `RunWriter._give_up`; the writer
process gave them up already: writer_serve.py `fail`). Before, inline kept the failed write's
rows pending and its close wrote them, with the rows after them."""

from __future__ import annotations

import contextlib
import functools
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.reliability.harness import ROOMY, WRITERS, disk_full_once_at, on_request_flush, sql
from tests.support.cli import cli_env, tierdiag_in_process
from tierdiag.errors import TierdiagError
from tierdiag.store.schema import TABLES

EVENT_TABLES = sorted(t for t, cols in TABLES.items() if "run_id" in cols and t != "runs")


def _stored(db, run_id: str) -> dict:
    """Everything the store holds of run `run_id`: its runs row's status, count and error (the
    run id masked), and every event table's rows in insertion order (run_id left out)."""
    (status, n, error), = sql(db, "SELECT status, num_requests, error FROM runs WHERE run_id = ?", [run_id])
    rows = {}
    for table in EVENT_TABLES:
        cols = [c for c in TABLES[table] if c != "run_id"]
        rows[table] = sql(db, f"SELECT {', '.join(cols)} FROM {table} WHERE run_id = ? ORDER BY rowid", [run_id])
    return {"status": status, "num_requests": n, "error": error and error.replace(run_id, "RUN"), "rows": rows}


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("parity") / "t.jsonl"
    assert tierdiag_in_process("synth", path, "--requests", "600", "--seed", "5").code == 0
    return path


def test_a_replay_whose_first_write_fails_once_records_the_same_either_way(tmp_path, monkeypatch, trace):
    """The CLI's replay, flushing as often as it can (TIERDIAG_FLUSH_EVERY_S=0: inline, the
    engine's first flush fails mid-run and stops it; the writer process writes each hand-over),
    the disk full for the first insert of any table only. Both ways: exit 6 (OutputError), the
    same one stderr line (the run id masked), the run failed with that line, no row of any table
    (the failed write's rows, and the engine's later ones, given up: not written by the close
    once the disk is free again)."""
    db = tmp_path / "r.duckdb"
    seen = {}
    for writer in WRITERS:
        with monkeypatch.context() as mp:
            mp.setenv("TIERDIAG_FLUSH_EVERY_S", "0")
            (tmp_path / "flushes.count").unlink(missing_ok=True)
            on_request_flush(mp, functools.partial(disk_full_once_at, 1), writer=writer, tmp_path=tmp_path,
                             table=None)
            # The settings just made, for the CLI in this process (which starts from `cli_env`).
            r = tierdiag_in_process("replay", trace, "--db", db, *ROOMY,
                                    env=cli_env(TIERDIAG_WRITER=writer, TIERDIAG_FLUSH_EVERY_S="0"))
        line = r.fails(6, "no space left")
        run_id, = sql(db, "SELECT run_id FROM runs ORDER BY created_at DESC LIMIT 1")[0]
        stored = _stored(db, run_id)
        seen[writer] = (r.code, line.replace(run_id, "RUN"), stored)
        assert stored["status"] == "failed" and stored["num_requests"] == 0, writer
        assert all(rows == [] for rows in stored["rows"].values()), (writer, {t: len(v) for t, v in stored["rows"].items()})
        assert "no space left" in stored["error"] and "0 requests recorded" in line
    assert seen["inline"] == seen["process"]


def _batches(sizes: list[dict[str, int]]) -> list[dict]:
    """Hand-overs of up to three tables' columns, the given rows of each, numbered on per table."""
    out, first = [], {"requests": 0, "batches": 0, "evictions": 0}
    for size in sizes:
        batch = {}
        for table, n in size.items():
            ids = list(range(first[table], first[table] + n))
            first[table] += n
            batch[table] = {"requests": {"req_id": [f"r{i}" for i in ids], "seq": ids, "status": ["finished"] * n},
                            "batches": {"batch_id": ids, "num_reqs": ids},
                            "evictions": {"eviction_id": ids, "tokens": ids}}[table]
        out.append(batch)
    return out


def _record(mode: str, db, tmp_path, batches: list[dict], table: str | None, at: int) -> tuple:
    """Hand `batches` over one write each (flush_every_s=0: inline each append writes, the writer
    process writes each hand-over) through the replay's strategy (app/replay_writers.py), the
    disk full once at `table`'s `at`-th insert (None: no injection); then close as the replay
    does after an error (app/replay.py `_on_failure`: the batches not handed over yet handed over
    by the close's flush, then closed as failed with the error's line; a process writer's error
    may come only at the close asked as complete, which then closes as failed itself). Returns (the
    error's type and line, the run id masked; what the store holds of the run)."""
    from tierdiag.app.replay_writers import for_mode
    from tierdiag.store.writer_process import new_run_id

    run_id = new_run_id()
    run = dict(run_id=run_id, name=mode, trace_path="t.jsonl", trace_sha256="", config={}, hardware={},
               data_plane={}, timing="modelled", command_line=["t"])
    with pytest.MonkeyPatch.context() as mp, contextlib.ExitStack() as cleanup:
        (tmp_path / "flushes.count").unlink(missing_ok=True)
        if table is not None:
            on_request_flush(mp, functools.partial(disk_full_once_at, at), writer=mode, tmp_path=tmp_path, table=table)
        else:
            mp.setenv("TIERDIAG_WRITER", mode)
        strategy = for_mode(mode).start(cleanup)
        assert strategy.kind == mode
        strategy.open(db, run, flush_every_s=0.0)
        handed = 0
        try:
            for batch in batches:
                handed += 1
                strategy.writer.append(batch)
            problem = strategy.close("complete", None)
        except Exception as exc:  # noqa: BLE001 - as _on_failure: a TierdiagError's line, else a bug's type and line
            problem = exc if isinstance(exc, TierdiagError) else TierdiagError(
                f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
            if strategy.writer.closed_as is None:  # a process writer's close asked as complete closed it already
                # The close's flush hands over what the engine recorded since (the rest).
                for batch in batches[handed:]:
                    strategy.writer.append(batch)
                assert strategy.close("failed", problem.one_line()) is None
        strategy.finished()
    assert problem is not None
    return (type(problem).__name__, problem.one_line().replace(run_id, "RUN")), _stored(db, run_id)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_wherever_a_write_fails_both_ways_record_the_same_whole_writes_before_it(tmp_path, data):
    """Any write failing at any of its tables (its first, or one after another table's insert
    of the same transaction): both ways record the same, and every table holds exactly the rows
    of the writes before the failed one, the run's count their requests (whole writes: never a
    table's rows of a write without the others')."""
    tables = ["requests", "batches", "evictions"]
    sizes = data.draw(st.lists(st.fixed_dictionaries({}, optional={t: st.integers(1, 40) for t in tables}),
                               min_size=1, max_size=5).filter(lambda s: any(s)), label="sizes")
    table = data.draw(st.sampled_from(sorted({t for size in sizes for t in size})), label="table")
    holding = [i for i, size in enumerate(sizes) if table in size]
    at = data.draw(st.integers(1, len(holding)), label="at")
    failed_write = holding[at - 1]
    batches = _batches(sizes)
    db = tmp_path / f"p{data.draw(st.integers(0, 10**9), label='db')}.duckdb"
    got = {mode: _record(mode, db, tmp_path, batches, table, at) for mode in WRITERS}
    assert got["inline"] == got["process"]
    (kind, line), stored = got["inline"]
    assert kind == "OutputError" and "no space left" in line
    assert stored["status"] == "failed" and stored["error"] == line
    before = batches[:failed_write]
    id_col = {"requests": "seq", "batches": "batch_id", "evictions": "eviction_id"}
    for t in tables:
        n = sum(len(next(iter(b[t].values()))) for b in before if t in b)
        at_col = [c for c in TABLES[t] if c != "run_id"].index(id_col[t])
        assert [row[at_col] for row in stored["rows"][t]] == list(range(n)), t  # in order, no gap
    assert stored["num_requests"] == len(stored["rows"]["requests"])


def test_rows_that_cannot_be_taken_give_up_every_row_after_them_both_ways(tmp_path):
    """A hand-over whose values cannot be stored at all (an integer past int64: refused as it is
    taken, before any of it is) fails the run the same both ways: the writes before it committed,
    it and every hand-over after it given up (the writer process gave them up already:
    writer_serve.py `rows`, `fail`), the error line the same."""
    batches = _batches([{"requests": 3, "batches": 2}, {"requests": 2}, {"requests": 4, "evictions": 1}])
    batches[1]["requests"]["seq"][1] = 2 ** 64
    db = tmp_path / "v.duckdb"
    got = {mode: _record(mode, db, tmp_path, batches, None, 0) for mode in WRITERS}
    assert got["inline"] == got["process"]
    (kind, line), stored = got["inline"]
    assert stored["status"] == "failed" and stored["error"] == line and stored["num_requests"] == 3
    assert [len(stored["rows"][t]) for t in ("requests", "batches", "evictions")] == [3, 2, 0]
