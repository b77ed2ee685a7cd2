"""tests/support/replays.py: one replay per (trace, options) per suite run, whoever asks."""

from __future__ import annotations

import duckdb

from tests.support.replays import shared_replay
from tests.support.traces import good_lines, write_trace


def test_the_same_trace_and_options_replay_once_and_other_options_again(tmp_path_factory):
    trace = write_trace(tmp_path_factory.mktemp("shared") / "t.jsonl", good_lines(5))
    db, first = shared_replay(tmp_path_factory, trace, "--json")
    assert first.returncode == 0, first.stderr
    stamp = db.stat().st_mtime_ns
    again_db, again = shared_replay(tmp_path_factory, trace, "--json")
    assert (again_db, again.returncode, again.stdout, again.stderr) == (db, 0, first.stdout, first.stderr)
    assert db.stat().st_mtime_ns == stamp  # not replayed a second time
    other_db, other = shared_replay(tmp_path_factory, trace, "--json", "--run-name", "other")
    assert other_db != db and other.returncode == 0, other.stderr
    for path in (db, other_db):
        with duckdb.connect(str(path), read_only=True) as con:
            assert con.execute("SELECT count(*) FROM runs").fetchone() == (1,)
            assert con.execute("SELECT count(*) FROM requests").fetchone() == (5,)
