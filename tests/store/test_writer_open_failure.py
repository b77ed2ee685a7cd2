"""A RunWriter whose runs row was committed but whose let-go of the file failed (the checkpoint
on a full disk: tests/reliability/test_store_cli.py meets a real one) raises, so no caller will
close that run: it closes it as failed itself before the error goes up. A replay in a process
that lives on (a library caller, `tierdiag_in_process`, a sweep worker) then reads `failed` right
after it returns, not `running` (a reader shows a running run as interrupted only once its
process is gone)."""

from __future__ import annotations

import duckdb
import pytest

from tierdiag.errors import OutputError
from tierdiag.store import writer as writer_module
from tierdiag.store.reader import list_runs, open_store
from tierdiag.store.writer import RunWriter

RUN = dict(name="r", trace_path="t.jsonl", trace_sha256="", config={}, hardware={}, data_plane={}, timing="modeled")


def _full_disk_at_first_let_go(monkeypatch) -> list[int]:
    """`detach` fails once, as DuckDB's CHECKPOINT does on a full disk; later calls are real."""
    real, calls = writer_module.detach, []

    def detach(host):
        calls.append(1)
        if len(calls) == 1:
            raise duckdb.IOException("IO Error: Could not write file \"r.duckdb\": No space left on device")
        real(host)

    monkeypatch.setattr(writer_module, "detach", detach)
    return calls


def _statuses(db) -> list[tuple[str, str | None]]:
    with open_store(db) as con:
        return [(r.status, r.error) for r in list_runs(con)]


def test_a_run_whose_file_cannot_be_let_go_is_closed_failed_before_the_error(tmp_path, monkeypatch):
    db = tmp_path / "r.duckdb"
    calls = _full_disk_at_first_let_go(monkeypatch)
    with pytest.raises(OutputError) as raised:
        RunWriter(db, **RUN)
    assert calls == [1]
    line = raised.value.one_line()
    assert "no space left" in line and "could not be marked failed" not in line
    # This process is alive: without the close the row would read `running` here.
    assert _statuses(db) == [("failed", line)]


def test_a_run_that_cannot_be_closed_either_says_so_in_the_error(tmp_path, monkeypatch):
    db = tmp_path / "r.duckdb"
    _full_disk_at_first_let_go(monkeypatch)

    def close_run_row(*args):
        raise OutputError(f"cannot write {db}: no space left on the disk")

    monkeypatch.setattr(writer_module, "close_run_row", close_run_row)
    with pytest.raises(OutputError) as raised:
        RunWriter(db, **RUN)
    assert "no space left" in raised.value.one_line()
    assert raised.value.one_line().endswith("the run could not be marked failed)")
    assert [status for status, _ in _statuses(db)] == ["running"]


def test_a_failure_before_the_runs_row_leaves_no_run_to_close(tmp_path, monkeypatch):
    db = tmp_path / "r.duckdb"
    closes = []
    monkeypatch.setattr(writer_module, "close_run_row", lambda *args: closes.append(args))

    def append(con, table, columns):
        raise duckdb.IOException("IO Error: No space left on device")

    monkeypatch.setattr(RunWriter, "_append", staticmethod(append))
    with pytest.raises(OutputError, match="no space left"):
        RunWriter(db, **RUN)
    assert closes == []
