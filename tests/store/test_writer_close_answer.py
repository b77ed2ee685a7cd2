"""The writer process answers the run's close once everything is committed, and checkpoints and
lets go of the file after the answer (store/writer_serve.py `_Serve.finish`, `let_go`;
store/writer.py `RunWriter.finish(let_go_later=True)`): the replay's result does not wait for
the checkpoint (issue 41), and the engine's process reaps the writer before it exits."""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
import pytest

from tierdiag.errors import StoreError
from tierdiag.store import writer_serve
from tierdiag.store.reader import open_store
from tierdiag.store.writer import RunWriter


def _writer(db: Path) -> RunWriter:
    return RunWriter(db, name="r", trace_path="t.jsonl", trace_sha256="ab" * 32, config={"model": "tiny"},
                     hardware={"torch": "x"}, data_plane={"page_bytes": 64}, timing="modelled",
                     command_line=["tierdiag", "replay", "t.jsonl"])


def _rows(n: int) -> dict:
    return {"requests": {"req_id": [f"r{i}" for i in range(n)], "seq": list(range(n)),
                         "arrival_ns": [10 * i for i in range(n)]}}


class _Serve(writer_serve._Serve):
    """The serving side with its answers kept, and what the file looked like at each answer."""

    def __init__(self, writer: RunWriter):
        super().__init__(inbox=None, reply_fd=-1)
        self.writer = writer
        self.answers: list = []

    def reply(self, msg) -> bool:
        wal = Path(str(self.writer.db_path) + ".wal")
        self.answers.append((msg, self.writer._kept, wal.exists()))
        return True


def _finish(serve: _Serve) -> bool:
    return serve.finish({"status": "complete", "error": None, "write_pending": True, "trace_sha256": None})


def test_the_close_is_answered_committed_then_checkpointed_and_let_go(tmp_path):
    db = tmp_path / "s.duckdb"
    w = _writer(db)
    w.take(_rows(5))
    serve = _Serve(w)
    assert _finish(serve)
    ((msg, kept, wal),) = serve.answers
    assert msg[0] == "finished" and msg[1]["closed_as"] == "complete" and msg[1]["recorded"] == 5
    # Answered with the file still attached, its last commit in DuckDB's log, not yet checkpointed.
    assert kept and wal
    # Then checkpointed and let go of: no log left, and another connection opens it and reads the run.
    assert not w._kept
    assert not Path(str(db) + ".wal").exists()
    with open_store(db) as con:
        assert con.execute("SELECT status, num_requests FROM runs").fetchall() == [("complete", 5)]
        assert con.execute("SELECT count(*) FROM requests").fetchone() == (5,)
    w.close()


def test_the_rows_are_committed_when_answered(tmp_path):
    """What the answer says is in the file already: a copy of the file and its log taken at the
    answer (as a crash right after it would leave them) opens with the run closed, every row there."""
    import shutil

    db = tmp_path / "s.duckdb"
    w = _writer(db)
    w.take(_rows(7))
    copy = tmp_path / "copy.duckdb"

    class Copying(_Serve):
        def reply(self, msg) -> bool:
            shutil.copy(db, copy)
            shutil.copy(str(db) + ".wal", str(copy) + ".wal")
            return super().reply(msg)

    assert _finish(Copying(w))
    with duckdb.connect(str(copy), read_only=True) as con:
        assert con.execute("SELECT status, num_requests FROM runs").fetchall() == [("complete", 7)]
        assert con.execute("SELECT count(*) FROM requests").fetchone() == (7,)
    w.close()


def test_a_checkpoint_that_fails_after_the_answer_is_one_warning_line(tmp_path, capsys):
    db = tmp_path / "s.duckdb"
    w = _writer(db)
    w.take(_rows(3))
    serve = _Serve(w)

    def failing() -> None:
        raise StoreError(f"could not write {db} (No space left on device\nsecond line)")

    w.let_go = failing
    assert _finish(serve)  # answered as closed: the run is committed
    assert serve.answers[0][0][0] == "finished"
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tierdiag: warning: run {w.run_id} is closed")
    assert "No space left on device" in lines[0] and "second line" not in lines[0]
    del w.let_go
    w.close()  # lets go of the file still attached
    assert not w._kept
    with open_store(db) as con:
        assert con.execute("SELECT status FROM runs").fetchall() == [("complete",)]


def test_a_block_that_raises_lets_go_of_the_file_even_when_asked_to_keep_it(tmp_path):
    db = tmp_path / "s.duckdb"
    w = _writer(db)
    with pytest.raises(RuntimeError):
        with w._connect(1.0, keep=True):
            raise RuntimeError("boom")
    assert not w._kept
    with duckdb.connect(str(db)) as con:  # not held: a writer of its own opens it
        assert con.execute("SELECT count(*) FROM runs").fetchone() == (1,)
    w.close()


def test_without_let_go_later_the_close_lets_go_before_it_returns(tmp_path):
    db = tmp_path / "s.duckdb"
    w = _writer(db)
    w.take(_rows(2))
    w.finish("complete", release=False)
    assert not w._kept and not Path(str(db) + ".wal").exists()
    w.let_go()  # nothing left to let go of
    w.close()
    # release=True with let_go_later: nothing kept either (the connection itself is closed).
    db2 = tmp_path / "t.duckdb"
    w2 = _writer(db2)
    w2.finish("complete", let_go_later=True)
    assert not w2._kept and os.path.exists(db2) and not Path(str(db2) + ".wal").exists()
