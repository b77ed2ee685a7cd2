"""RunWriter's mid-run writes checkpoint at their commit (store/writer.py `_checkpoint_at_commit`:
DuckDB's checkpoint_threshold 0, the rows written into the file once, not into the WAL first and
again by the detach's checkpoint); the close keeps DuckDB's default (its WAL, checkpointed after
the replay's answer by `let_go`)."""

from __future__ import annotations

from pathlib import Path

import duckdb
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.reliability.harness import sql
from tierdiag.store.writer import RunWriter, _checkpoint_at_commit


def _writer(db: Path) -> RunWriter:
    return RunWriter(db, name="c", trace_path="t.jsonl", trace_sha256="", config={}, hardware={}, data_plane={},
                     timing="modelled", command_line=["t"])


def _rows(lo: int, hi: int) -> dict:
    seq = range(lo, hi)
    return {"requests": {"req_id": [f"r{i}" for i in seq], "seq": list(seq), "status": ["finished"] * (hi - lo)},
            "evictions": {"eviction_id": list(seq), "tier": ["device"] * (hi - lo)}}


def test_the_setting_is_asked_for_and_reset_and_an_older_duckdb_is_left_as_it_is():
    class Con:
        def __init__(self, known=True):
            self.asked, self.known = [], known

        def execute(self, statement):
            self.asked.append(statement)
            if not self.known:
                raise duckdb.CatalogException('Catalog Error: unrecognized configuration parameter "checkpoint_threshold"')

    con = Con()
    _checkpoint_at_commit(con, True)
    _checkpoint_at_commit(con, False)
    assert con.asked == ["SET checkpoint_threshold = '0b'", "RESET checkpoint_threshold"]
    older = Con(known=False)
    _checkpoint_at_commit(older, True)  # no such setting: the WAL and the detach's checkpoint, as before
    _checkpoint_at_commit(older, False)
    assert len(older.asked) == 2


def test_a_mid_run_write_writes_no_wal_and_the_close_keeps_its_own_for_let_go(tmp_path, monkeypatch):
    from tierdiag.store import writer as W

    db = tmp_path / "c.duckdb"
    wal = Path(str(db) + ".wal")
    w = _writer(db)
    at_detach = []
    real = W.detach
    monkeypatch.setattr(W, "detach", lambda con: at_detach.append(wal.exists()) or real(con))
    w.append(_rows(0, 3_000))
    assert at_detach == [False] and not wal.exists()  # committed into the file: nothing in a WAL at the detach
    assert sql(db, "SELECT count(*), min(seq), max(seq) FROM requests") == [(3_000, 0, 2_999)]
    seen = []

    def hook(con, path, run_id, status):
        seen.append((wal.exists(), con.execute("SELECT current_setting('checkpoint_threshold')").fetchone()[0]))

    w.take(_rows(3_000, 5_000))
    w.finish("complete", release=False, let_go_later=True, after_commit=hook)
    default = duckdb.connect().execute("SELECT current_setting('checkpoint_threshold')").fetchone()[0]
    assert seen == [(True, default)]  # the close's rows in the WAL, DuckDB's threshold for its hook
    w.let_go()
    w.close()
    assert not wal.exists() and w.recorded == 5_000
    assert sql(db, "SELECT count(*), count(DISTINCT seq), min(seq), max(seq) FROM requests") == [(5_000, 5_000, 0, 4_999)]
    assert sql(db, "SELECT status, num_requests FROM runs") == [("complete", 5_000)]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=st.lists(st.tuples(st.integers(0, 2_500), st.booleans(), st.booleans()), min_size=0, max_size=6))
def test_whatever_the_writes_every_row_is_there_once_in_order(tmp_path_factory, plan):
    """Writes of any size (none included), vacuuming or not, some rows left to the close: every
    row reads back once, in the order handed over; no WAL after any mid-run write."""
    db = tmp_path_factory.mktemp("w") / "c.duckdb"
    wal = Path(str(db) + ".wal")
    w = _writer(db)
    n = 0
    for rows, write, vacuum in plan:
        w.take(_rows(n, n + rows))
        n += rows
        if write:
            w.write(vacuum=vacuum)
            assert not wal.exists()
    w.finish("complete")
    assert not wal.exists() and w.recorded == n
    assert sql(db, "SELECT count(*), coalesce(list(seq ORDER BY rowid) = range(0, count(*)), true) FROM requests") \
        == [(n, True)]
    assert sql(db, "SELECT count(*) FROM evictions") == [(n,)]
