"""Run evidence a reader computed because none was stored, stored by that reader (diagnose/run/
backfill.py, issue 41 session 38): the row it stores is byte for byte the close's for the same
rows (and its `request_lookup` rows the same), the next reader reads it, its answer is the same
either way; nothing is stored where the store cannot take it (a read-only file, another
process holding it, an older schema, a status that is not final), and the store's write
(store/evidence.py `store_missing_evidence`) writes exactly when it should, in one transaction.
The processes' cases (two readers at once, a signal during the write, a replay writing the
store meanwhile) are tests/reliability/test_evidence_backfill_processes.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.diagnose.conftest import RunBuilder, plant_scenarios
from tests.support.cli import tierdiag_in_process
from tests.support.evidence_rows import evidence_rows as _rows
from tests.support.mounts import read_only_folder
from tierdiag.diagnose.run import backfill as B
from tierdiag.diagnose.run import evidence as E
from tierdiag.diagnose.run import stored as S
from tierdiag.diagnose.run.close import after_commit
from tierdiag.store import evidence as SE

pytest.importorskip("tierdiag.cli.replay")


def _sql(db: Path, sql: str, params=None) -> list:
    with duckdb.connect(str(db)) as con:
        return con.execute(sql, params or []).fetchall()


def _drop(db: Path, run_id: str) -> None:
    _sql(db, "DELETE FROM run_evidence WHERE run_id = ?", [run_id])
    _sql(db, "DELETE FROM request_lookup WHERE run_id = ?", [run_id])


def _close_again(db: Path, run_id: str) -> tuple[list, list]:
    """What the writer's close (`record_run_evidence` on its own read-write connection) stores
    for the run's rows as they are in `db` (a copy: the row written there)."""
    with duckdb.connect(str(db)) as con:
        assert E.record_run_evidence(db, run_id, con=con) is None
    return _rows(db, run_id)


def _summary(db: Path, run_id: str) -> dict:
    r = tierdiag_in_process("summary", "--db", db, "--run", run_id, "--json")
    assert r.code == 0, r.err
    assert r.err == "", r.err  # stored or not, the reader says nothing of it
    return json.loads(r.out)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> dict:
    """A store of three real replays of one 400-request synthetic trace (small pools, a storage
    tier, a load-back threshold: every section has something in it): one rank, `--dp 2`, and
    one rank without the storage tier; and a planted run interrupted before any request."""
    folder = tmp_path_factory.mktemp("backfill")
    trace = folder / "mixed.jsonl"
    assert tierdiag_in_process("synth", trace, "--requests", 400, "--rate", 8).code == 0
    db = folder / "runs.duckdb"
    common = ["--model", "llama3-8b", "--gpu", "h100", "--device-tokens", 65536, "--host-tokens", 98304]
    for extra in (["--storage-tokens", 1048576, "--load-back-threshold", 1024, "--prefetch-policy", "best_effort"],
                  ["--dp", 2, "--router", "cache_aware"], []):
        r = tierdiag_in_process("replay", trace, "--db", db, *common, *extra)
        assert r.code == 0, r.err
    from tierdiag.store.writer import RunWriter

    b = plant_scenarios(RunBuilder(db, name="nothing yet"))
    w = RunWriter(db, name=b.name, trace_path=str(trace), trace_sha256="", config=b.config, hardware={},
                  data_plane={}, timing="modelled")
    w.finish("interrupted", after_commit=after_commit)  # interrupted before its first request
    with duckdb.connect(str(db), read_only=True) as con:
        ids = [r[0] for r in con.execute("SELECT run_id FROM runs ORDER BY created_at, run_id").fetchall()]
        assert con.execute("SELECT count(*) FROM run_evidence").fetchall() == [(4,)]
    return {"db": db, "trace": trace, "ids": dict(zip(("one", "dp2", "nostorage", "empty"), ids))}


def _closed_summary(store: dict, run_id: str) -> dict:
    """`summary --json` over the fixture's store (each run with the close's own row), read once a
    run: the store is never written, so every case compares with the same answer."""
    answers = store.setdefault("closed summaries", {})
    if run_id not in answers:
        answers[run_id] = _summary(store["db"], run_id)
    return answers[run_id]


SPOILS = {
    "none stored": None,  # a close cut short (a second signal), or whose evidence failed
    "old version": f"UPDATE run_evidence SET evidence_version = {S.EVIDENCE_VERSION - 1} WHERE run_id = ?",
    "not JSON": "UPDATE run_evidence SET evidence_json = '{\"context\": ' WHERE run_id = ?",
    "config edited": "UPDATE runs SET config_json = replace(config_json, '{', '{\"note\": \"edited\", ') WHERE run_id = ?",
}


@pytest.mark.parametrize("which", ["one", "dp2", "nostorage", "empty"])
@pytest.mark.parametrize("spoil", list(SPOILS))
def test_the_first_reader_stores_what_the_close_stores(store, tmp_path, which, spoil):
    run_id = store["ids"][which]
    db, ref = tmp_path / "r.duckdb", tmp_path / "ref.duckdb"
    for path in (db, ref):
        shutil.copy(store["db"], path)
        if SPOILS[spoil] is None:
            _drop(path, run_id)
        else:
            _sql(path, SPOILS[spoil], [run_id])
    expected = _close_again(ref, run_id)
    if spoil != "config edited":  # the same inputs: the close at replay stored this very row
        assert expected == _rows(store["db"], run_id)
    first = _summary(db, run_id)
    assert _rows(db, run_id) == expected  # byte for byte: version, JSON text, the lookup's rows
    assert B.pending() == []
    with duckdb.connect(str(db), read_only=True) as con:  # the other runs untouched
        others = con.execute("SELECT run_id, evidence_json FROM run_evidence WHERE run_id <> ? ORDER BY 1",
                             [run_id]).fetchall()
    with duckdb.connect(str(store["db"]), read_only=True) as con:
        assert others == con.execute("SELECT run_id, evidence_json FROM run_evidence WHERE run_id <> ? ORDER BY 1",
                                     [run_id]).fetchall()
    # The next reader reads it (computes nothing: the row is there) and says the same.
    assert _summary(db, run_id) == first
    if spoil != "config edited":
        assert first == _closed_summary(store, run_id)  # and the same as over the close's own row
    explain = tierdiag_in_process("slow", "--db", db, "--run", run_id, "--json", "--top", 3)
    assert explain.code == 0 and _rows(db, run_id) == expected


def test_every_read_command_stores_it_once(store, tmp_path):
    run_id = store["ids"]["one"]
    expected = _rows(store["db"], run_id)
    (req,) = _sql(store["db"], "SELECT req_id FROM requests WHERE run_id = ? ORDER BY seq LIMIT 1", [run_id])[0]
    for argv in (["explain", req, "--run", run_id], ["slow", "--top", 2, "--run", run_id],
                 ["compare", run_id, store["ids"]["nostorage"]], ["report", "--run", run_id, "-o", tmp_path / "r.html"]):
        db = tmp_path / f"{argv[0]}.duckdb"
        shutil.copy(store["db"], db)
        _drop(db, run_id)
        r = tierdiag_in_process(*argv, "--db", db)
        assert r.code == 0, r.err
        assert _rows(db, run_id) == expected, argv[0]


def test_a_read_only_store_is_read_as_before_and_left_as_it_is(store, tmp_path):
    run_id = store["ids"]["one"]
    missing = tmp_path / "missing.duckdb"
    shutil.copy(store["db"], missing)
    _drop(missing, run_id)
    with read_only_folder(tmp_path, missing) as folder:
        db = folder / missing.name
        before = db.read_bytes()
        first = _summary(db, run_id)
        assert B.pending() == []  # not computed for storing: only what the reader needs, as before
        assert db.read_bytes() == before and not Path(str(db) + ".wal").exists()
    assert first == _closed_summary(store, run_id)


def test_a_store_another_process_holds_is_not_written_and_the_answer_is_whole(store, tmp_path):
    from tests.reliability.harness import holder

    run_id = store["ids"]["dp2"]
    db = tmp_path / "held.duckdb"
    shutil.copy(store["db"], db)
    _drop(db, run_id)
    with holder(db, read_only=True):  # another reader, open past STORE_WAIT_S
        first = _summary(db, run_id)
        assert B.pending() == []  # tried, given up: nothing kept for later in this process
    assert _rows(db, run_id)[0] == []
    assert first == _summary(db, run_id) == _closed_summary(store, run_id)  # the next reader stores it
    assert _rows(db, run_id) == _rows(store["db"], run_id)


def test_a_running_run_is_never_stored(store, tmp_path):
    run_id = store["ids"]["one"]
    db = tmp_path / "s.duckdb"
    shutil.copy(store["db"], db)
    _drop(db, run_id)
    # `running` with a process that is gone: readers take it as interrupted, but nothing says its
    # writer is done (its rows may still grow).
    _sql(db, "UPDATE runs SET status = 'running', pid = 2147483646 WHERE run_id = ?", [run_id])
    r = tierdiag_in_process("summary", "--db", db, "--run", run_id, "--json")
    assert r.code == 0, r.err
    assert _rows(db, run_id) == ([], [])


@pytest.mark.parametrize("which", ["one", "dp2", "empty"])
def test_a_failed_runs_evidence_is_stored_as_an_interrupted_runs(store, tmp_path, monkeypatch, which):
    """A failed run (its close stores none: the writer or its disk failed there) gets the row a
    close would store for its rows, byte for byte, from its first reader; the next reader reads
    it and answers the same as the first, as one over the close's row and as one that computes
    each fact from the rows (where it cannot store)."""
    run_id = store["ids"][which]
    db, ref, computed = tmp_path / "f.duckdb", tmp_path / "ref.duckdb", tmp_path / "c.duckdb"
    for path in (db, ref, computed):
        shutil.copy(store["db"], path)
        _drop(path, run_id)
        _sql(path, "UPDATE runs SET status = 'failed', error = 'the writer process died' WHERE run_id = ?", [run_id])
    expected = _close_again(ref, run_id)
    assert expected[0] and json.loads(expected[0][0][1])  # the close's row for these rows
    first = _summary(db, run_id)
    assert first["status"] == "failed"
    assert _rows(db, run_id) == expected  # byte for byte: version, JSON text, the lookup's rows
    assert B.pending() == []
    assert _summary(db, run_id) == first == _summary(ref, run_id)  # read back; over the close's row
    with monkeypatch.context() as m:
        m.setattr(B, "_storable_path", lambda con, run: None)  # as a store it cannot write
        assert _summary(computed, run_id) == first
    assert _rows(computed, run_id) == ([], [])


def test_the_writers_own_reads_are_left_as_they_were(store, tmp_path):
    """The writer's close reads the summary back where its evidence failed (close.py
    `closing_numbers`, on its read-write connection): computed as before, nothing queued."""
    from tierdiag.diagnose.run.close import closing_numbers
    from tierdiag.diagnose.run.facts import RunFacts
    from tierdiag.store.reader import resolve_run

    run_id = store["ids"]["one"]
    db = tmp_path / "w.duckdb"
    shutil.copy(store["db"], db)
    _drop(db, run_id)
    with duckdb.connect(str(db)) as con:
        assert RunFacts(con, resolve_run(con, run_id)).stored is None
        assert closing_numbers(con, run_id)["ttft_ns"] is not None
    assert B.pending() == [] and _rows(db, run_id) == ([], [])


def test_an_older_schema_store_is_not_written(store, tmp_path):
    from tierdiag.store.schema import SCHEMA_VERSION

    run_id = store["ids"]["one"]
    db = tmp_path / "old.duckdb"
    shutil.copy(store["db"], db)
    _drop(db, run_id)
    _sql(db, "UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION - 1)])
    r = tierdiag_in_process("summary", "--db", db, "--run", run_id, "--json")
    assert r.code == 0, r.err
    assert _rows(db, run_id) == ([], [])


def test_curves_the_trace_cannot_give_now_are_stored_as_a_close_now_stores_them(store, tmp_path):
    run_id = store["ids"]["nostorage"]
    db, ref = tmp_path / "gone.duckdb", tmp_path / "ref.duckdb"
    moved = tmp_path / "moved.jsonl"
    for path in (db, ref):
        shutil.copy(store["db"], path)
        _drop(path, run_id)
    shutil.move(store["trace"], moved)
    try:
        expected = _close_again(ref, run_id)
        _summary(db, run_id)
    finally:
        shutil.move(moved, store["trace"])
    assert json.loads(expected[0][0][1])["size_curves"] is None
    assert _rows(db, run_id) == expected


RUN = "r-1"

@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    b = plant_scenarios(RunBuilder(tmp_path_factory.mktemp("tiny") / "tiny.duckdb"))
    b.write()
    _sql(b.path, "UPDATE runs SET run_id = ?", [RUN])
    for table in ("requests", "run_evidence", "request_lookup"):
        _sql(b.path, f"UPDATE {table} SET run_id = ?", [RUN])
    return b.path


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(status=st.sampled_from(["complete", "interrupted", "failed", "running", None]),
       before=st.sampled_from(["none", "same", "other version", "other text", "no table"]),
       payload=st.text(max_size=40))
def test_the_store_writes_exactly_where_it_should_in_one_transaction(tiny, tmp_path_factory, status, before, payload):
    db = tmp_path_factory.mktemp("h") / "t.duckdb"
    shutil.copy(tiny, db)
    with duckdb.connect(str(db)) as con:
        if status is None:
            con.execute("DELETE FROM runs")  # deleted meanwhile (`runs --delete`)
        else:
            con.execute("UPDATE runs SET status = ?", [status])
        con.execute("DELETE FROM request_lookup")
        if before == "no table":
            con.execute("DROP TABLE run_evidence")
        elif before == "none":
            con.execute("DELETE FROM run_evidence")
        elif before == "same":
            con.execute("UPDATE run_evidence SET evidence_version = ?, evidence_json = ?", [S.EVIDENCE_VERSION, payload])
        elif before == "other version":
            con.execute("UPDATE run_evidence SET evidence_version = ?, evidence_json = ?",
                        [S.EVIDENCE_VERSION + 1, payload])
        else:
            con.execute("UPDATE run_evidence SET evidence_version = ?, evidence_json = ?",
                        [S.EVIDENCE_VERSION, payload + "x"])
        had = con.execute("SELECT * FROM run_evidence").fetchall() if before != "no table" else None
        wrote = SE.store_missing_evidence(con, RUN, S.EVIDENCE_VERSION, payload)
        should = status in ("complete", "interrupted", "failed") and before != "same"
        assert wrote == should
        lookup = con.execute("SELECT count(*) FROM request_lookup WHERE run_id = ?", [RUN]).fetchall()[0][0]
        requests = con.execute("SELECT count(*) FROM requests WHERE run_id = ? AND req_id IS NOT NULL",
                               [RUN]).fetchall()[0][0]
        if should:
            assert con.execute("SELECT evidence_version, evidence_json FROM run_evidence").fetchall() == [
                (S.EVIDENCE_VERSION, payload)]
            assert lookup == requests > 0
        else:
            assert lookup == 0
            if had is not None:
                assert con.execute("SELECT * FROM run_evidence").fetchall() == had
        con.execute("SELECT 1").fetchall()  # no transaction left open: the connection goes on
        con.execute("BEGIN")
        con.execute("ROLLBACK")


def test_a_failure_inside_the_write_rolls_all_of_it_back(tiny, tmp_path, monkeypatch):
    db = tmp_path / "t.duckdb"
    shutil.copy(tiny, db)
    _sql(db, "DELETE FROM run_evidence")
    _sql(db, "DELETE FROM request_lookup")

    def boom(con, run_id):
        raise KeyboardInterrupt  # as a signal landing there would, the lookup's rows written
    monkeypatch.setattr(SE, "_clear_row", boom)
    with duckdb.connect(str(db)) as con:
        with pytest.raises(KeyboardInterrupt):
            SE.store_missing_evidence(con, RUN, S.EVIDENCE_VERSION, "{}")
        assert con.execute("SELECT count(*) FROM request_lookup").fetchall() == [(0,)]  # its rows gone with it
        assert con.execute("SELECT count(*) FROM run_evidence").fetchall() == [(0,)]
