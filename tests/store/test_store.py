"""The run store: schema, round trips of every table, run lifecycle, and the reader's checks."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from tierdiag.errors import StoreError
from tierdiag.store.reader import list_runs, open_store, resolve_run
from tierdiag.store.schema import EVENT_TABLES, SCHEMA_VERSION, TABLES
from tierdiag.store.writer import RunWriter

SAMPLE = {"VARCHAR": "x", "BIGINT": 2**40 + 7, "INTEGER": 7, "DOUBLE": 1.5, "BOOLEAN": True}


def writer(db, name="r"):
    return RunWriter(db, name=name, trace_path="t.jsonl", trace_sha256="ab" * 32, config={"model": "tiny"},
                     hardware={"torch": "x"}, data_plane={"page_bytes": 64}, timing="modelled",
                     command_line=["tierdiag", "replay", "t.jsonl"])


def test_every_event_table_round_trips_every_column(tmp_path):
    db = tmp_path / "s.duckdb"
    w = writer(db)
    tables = {}
    for table in EVENT_TABLES:
        cols = {c: [SAMPLE[t], None] for c, t in TABLES[table].items() if c != "run_id"}
        tables[table] = cols
    w.append(tables)
    w.finish("complete", num_requests=2)
    with open_store(db) as con:
        for table in EVENT_TABLES:
            names = [c for c in TABLES[table] if c != "run_id"]
            rows = con.execute(f"SELECT {', '.join(names)} FROM {table} WHERE run_id = ? ORDER BY 1 NULLS LAST",
                               [w.run_id]).fetchall()
            assert rows[0] == tuple(SAMPLE[TABLES[table][c]] for c in names), table
            assert rows[1] == (None,) * len(names), table


def test_append_rejects_unknown_columns_and_ragged_columns(tmp_path):
    w = writer(tmp_path / "s.duckdb")
    with pytest.raises(ValueError, match="not in the schema"):
        w.append({"requests": {"req_id": ["a"], "bogus": [1]}})
    # Rows after rows refused are given up (as the writer process gives them up: both ways the
    # run then closes as failed with what was committed before; test_writer_failure_parity.py).
    w.append({"requests": {"req_id": ["a", "b"], "seq": [1]}})
    assert w.given_up and not w.pending
    with pytest.raises(ValueError, match="expected"):
        writer(tmp_path / "t.duckdb").append({"requests": {"req_id": ["a", "b"], "seq": [1]}})


def test_run_lifecycle_and_resolution(tmp_path):
    db = tmp_path / "s.duckdb"
    first = writer(db, "first")
    first.append({"requests": {"req_id": ["a", "b", "c"], "seq": [0, 1, 2]}})
    first.finish("complete")  # its count is the request rows committed
    second = writer(db, "second")
    with open_store(db) as con:
        runs = list_runs(con)
        assert [r.name for r in runs] == ["first", "second"]
        # the second writer's process (this one) is alive: it is still running
        assert runs[1].status == "running" and runs[0].status == "complete"
        assert runs[0].num_requests == 3 and runs[0].config == {"model": "tiny"}
        assert resolve_run(con, None).run_id == second.run_id  # newest by default
        assert resolve_run(con, "first").run_id == first.run_id
        assert resolve_run(con, first.run_id).name == "first"
        with pytest.raises(StoreError, match="no run 'nope'"):
            resolve_run(con, "nope")
    second.finish("interrupted")
    with open_store(db) as con:
        assert list_runs(con)[1].status == "interrupted"


def test_a_running_run_whose_process_died_reads_interrupted(tmp_path):
    db = tmp_path / "s.duckdb"
    w = writer(db)
    con = duckdb.connect(str(db))
    con.execute("UPDATE runs SET pid = 2147483646 WHERE run_id = ?", [w.run_id])  # no such process
    con.close()
    with open_store(db) as con:
        assert list_runs(con)[0].status == "interrupted"


def test_reader_names_what_is_wrong_with_the_file(tmp_path):
    with pytest.raises(StoreError, match="no database at"):
        open_store(tmp_path / "missing.duckdb")
    junk = tmp_path / "junk.duckdb"
    junk.write_bytes(b"not a database at all" * 100)
    with pytest.raises(StoreError, match="not a DuckDB database"):
        open_store(junk)
    foreign = tmp_path / "foreign.duckdb"
    con = duckdb.connect(str(foreign))
    con.execute("CREATE TABLE t (x INT)")
    con.close()
    with pytest.raises(StoreError, match="not a tierdiag run store"):
        open_store(foreign)
    old = tmp_path / "old.duckdb"
    writer(old).finish("complete", num_requests=0)
    con = duckdb.connect(str(old))
    con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION + 1)])
    con.close()
    with pytest.raises(StoreError, match=f"schema v{SCHEMA_VERSION + 1}") as exc:
        open_store(old)
    assert "upgrade tierdiag" in exc.value.one_line()
    with pytest.raises(StoreError, match="schema v"):
        writer(old)  # a writer refuses to append to another version's store too



def test_contract_lists_the_optional_tables_too():
    import re

    from tierdiag.store.schema import OPTIONAL_TABLES

    contract = (Path(__file__).resolve().parents[2] / "docs" / "contract.md").read_text(encoding="utf-8")
    blocks = {m.group(1): m.group(2) for m in re.finditer(r"```\n(\w+)\n(.*?)```", contract, re.S)}
    for table, columns in OPTIONAL_TABLES.items():
        assert table in blocks, f"docs/contract.md has no block for table {table}"
        assert [line.split()[0] for line in blocks[table].splitlines() if line.strip()] == list(columns)


def test_a_run_whose_rows_hold_nulls_still_summarises_and_gets_its_evidence(tmp_path, capsys):
    """Eviction rows with a NULL tier and action beside an unknown tier (hand-made or foreign rows;
    the engine writes neither): summary sorts them last instead of failing to compare None with a
    string (a TypeError before), so the run's evidence is stored without a warning."""
    from tierdiag.diagnose.run.facts import stored_evidence
    from tierdiag.diagnose.run.summary import compute_run_summary

    db = tmp_path / "s.duckdb"
    w = writer(db)
    w.append({"evictions": {"eviction_id": [1, 2, 3, 4], "tier": ["host", None, "x", "device"],
                            "action": ["delete", None, "drop", "demote"], "tokens": [64, 32, 16, 128]}})
    from tierdiag.diagnose.run.close import after_commit

    w.finish("complete", num_requests=0, after_commit=after_commit)  # as a replay closes it
    assert "warning" not in capsys.readouterr().err
    with open_store(db) as con:
        run = resolve_run(con, None)
        summary = compute_run_summary(con, run)
        assert [(e.tier, e.action) for e in summary.evictions] == [("device", "demote"), ("host", "delete"),
                                                                   ("x", "drop"), (None, None)]
        assert stored_evidence(con, run) is not None
