"""The run evidence a reader computed, stored by it (diagnose/run/backfill.py, issue 41 session
38), as processes: two readers at once on a run without it (both answer the same, one row is
stored, the close's), a signal while the reader writes it (the command ends with the signal's
code and one line after its whole answer, nothing of the row or its lookup written, the next
reader stores it), a replay writing the same store meanwhile (it finishes whole; the row, where
stored, is the close's), and none of it imports torch. tests/diagnose/test_evidence_backfill.py
has the row's bytes against the close's, read-only and held stores, statuses and schemas."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from harness import cli_env, sql, synth_and_store, wait_for_recorded_rows
from test_signals import CODE, ENGINE
from tests.support.evidence_rows import evidence_rows as _rows

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc (Linux)")

# The CLI as its console script runs it, with a prelude first; at its exit, whether torch was
# imported (stderr's last line).
CLI = ("import atexit, sys\n"
       "atexit.register(lambda: print('torch imported:', 'torch' in sys.modules, file=sys.stderr))\n"
       "from tierdiag.cli.main import entry; entry()")

# The reader's write held inside its transaction (the lookup's rows written), a marker made.
HELD_WRITE = """
import time
from tierdiag.store import evidence as _ev
_real = _ev.write_request_lookup
def _held(con, run_id):
    _real(con, run_id)
    open({marker!r}, "w").close()
    time.sleep(120)
_ev.write_request_lookup = _held
"""


def _reader(db: Path, run_id: str, *args: str, prelude: str = "") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", prelude + CLI, *args, "--db", str(db), "--run", run_id],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(),
                            start_new_session=True)


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> dict:
    """A complete 6,000-request run (the signal tests' synth trace, its close's row kept as the
    reference) and the same store with that row and its lookup deleted (as a close a second
    signal ended leaves it)."""
    root = tmp_path_factory.mktemp("backfill")
    out = synth_and_store(root, seed=5, long=6000)
    db = root / "full.duckdb"
    r = subprocess.run([sys.executable, "-c", CLI, "replay", str(out["long"]), "--db", str(db), *ENGINE],
                       capture_output=True, text=True, env=cli_env(TIERDIAG_WRITER="process"), timeout=600)
    assert r.returncode == 0, r.stderr
    ((run_id,),) = sql(db, "SELECT run_id FROM runs")
    missing = root / "missing.duckdb"
    shutil.copy(db, missing)
    with duckdb.connect(str(missing)) as con:
        con.execute("DELETE FROM run_evidence")
        con.execute("DELETE FROM request_lookup")
    reference = _rows(db, run_id)
    assert len(reference[0]) == 1 and len(reference[1]) == 6000
    busy = root / "busy.jsonl"  # a replay long enough to be seen writing (the signal tests' size)
    r = subprocess.run([sys.executable, "-c", CLI, "synth", str(busy), "--requests", "40000", "--seed", "11"],
                       capture_output=True, text=True, env=cli_env(), timeout=300)
    assert r.returncode == 0, r.stderr
    return {"db": db, "missing": missing, "run_id": run_id, "reference": reference, "busy": busy, **out}


def _whole(out: str, err: str) -> dict:
    assert err.splitlines()[-1] == "torch imported: False", err
    return json.loads(out)


@pytest.mark.parametrize("trial", range(2))
def test_two_readers_at_once_answer_the_same_and_one_row_is_stored(stored, tmp_path, trial):
    db = tmp_path / "two.duckdb"
    shutil.copy(stored["missing"], db)
    procs = [_reader(db, stored["run_id"], "summary", "--json") for _ in range(2)]
    answers = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        assert err.splitlines()[:-1] == [], err  # nothing said of storing, by either
        answers.append(_whole(out, err))
    assert answers[0] == answers[1]
    assert _rows(db, stored["run_id"]) == stored["reference"]  # one row, the close's; the lookup once
    p = _reader(stored["db"], stored["run_id"], "summary", "--json")  # the same as over the close's own row
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0 and _whole(out, err) == answers[0]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_reader_stores_it_leaves_nothing_half_written(stored, tmp_path, sig):
    db = tmp_path / "sig.duckdb"
    shutil.copy(stored["missing"], db)
    marker = tmp_path / "held"
    p = _reader(db, stored["run_id"], "summary", "--json", prelude=HELD_WRITE.format(marker=str(marker)))
    deadline = time.monotonic() + 300
    while not marker.exists():
        assert p.poll() is None, p.communicate()
        assert time.monotonic() < deadline, "the reader never reached its write"
        time.sleep(0.02)
    os.kill(p.pid, sig)
    out, err = p.communicate(timeout=60)
    assert p.returncode == CODE[sig], err
    lines = err.splitlines()
    assert len(lines) == 2 and lines[0].startswith("tierdiag: interrupted while storing run ") and \
        "none of it stored" in lines[0], err
    answer = _whole(out, err)  # the answer came first, whole
    assert _rows(db, stored["run_id"]) == ([], [])  # neither the row nor the lookup's rows
    p = _reader(db, stored["run_id"], "summary", "--json")
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0 and _whole(out, err) == answer
    assert _rows(db, stored["run_id"]) == stored["reference"]


def test_a_replay_writing_the_store_meanwhile_finishes_whole(stored, tmp_path):
    db = tmp_path / "busy.duckdb"
    shutil.copy(stored["missing"], db)
    replay = subprocess.Popen([sys.executable, "-c", CLI, "replay", str(stored["busy"]), "--db", str(db), *ENGINE],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=cli_env(TIERDIAG_WRITER="process", TIERDIAG_FLUSH_EVERY_S="0.2"),
                              start_new_session=True)
    wait_for_recorded_rows(replay, db, runs_before=1)
    codes = []
    while replay.poll() is None and len(codes) < 6:  # readers while it writes
        p = _reader(db, stored["run_id"], "summary", "--json")
        out, err = p.communicate(timeout=300)
        codes.append(p.returncode)
        # Answered, or the one line a store busy past the readers' wait has always given.
        assert p.returncode == 0 or (p.returncode == 4 and "is busy" in err), err
        if p.returncode == 0:
            _whole(out, err)
        ev, lk = _rows(db, stored["run_id"])
        assert (ev, lk) in (([], []), stored["reference"])
    out, err = replay.communicate(timeout=600)
    assert replay.returncode == 0, err
    ((status, n),) = sql(db, "SELECT status, num_requests FROM runs WHERE run_id <> ?", [stored["run_id"]])
    assert status == "complete" and n == 40000 == sql(db, "SELECT count(*) FROM requests WHERE run_id <> ?",
                                                     [stored["run_id"]])[0][0]
    assert codes, "no reader ran while the replay wrote"
    p = _reader(db, stored["run_id"], "summary", "--json")
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    assert _rows(db, stored["run_id"]) == stored["reference"]
