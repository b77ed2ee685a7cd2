"""A replay's process ends without the interpreter's teardown (cli/main.py `entry`, the console
script, and `_leave`): the
engine's objects are left to the OS instead of being freed one by one. What an ordinary exit
does that anyone can see must still happen: every line is written (to a pipe too), the exit code
is the command's, the atexit functions run (a library's, or a weakref finalizer's), and the run
is closed in the file."""

from __future__ import annotations

import subprocess
import sys

import duckdb

from tests.cli.cli_helpers import REPLAY_ARGS, _env, write_late_trace

# The console script behind an atexit function registered before it, as a library would.
ENTRY = ("import atexit, sys\n"
         "atexit.register(lambda: sys.stderr.write('atexit ran\\n'))\n"
         "from tierdiag.cli.main import entry\n"
         "entry()\n")


def _run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", ENTRY, *map(str, args)], capture_output=True, text=True,
                          timeout=300, env=_env(COLUMNS="80"))


def test_a_replay_leaves_with_its_output_written_its_atexit_functions_run_and_its_run_closed(tmp_path):
    trace = write_late_trace(tmp_path / "t.jsonl", num_requests=40)
    db = tmp_path / "r.duckdb"
    r = _run("replay", trace, "--db", db, *REPLAY_ARGS)
    assert r.returncode == 0, r.stderr
    # The closing table's last line is the hint, printed last: the pipe got everything.
    assert r.stdout.rstrip().splitlines()[-1].startswith("next: "), r.stdout
    assert r.stderr.rstrip().endswith("atexit ran"), r.stderr
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT status, num_requests FROM runs").fetchall() == [("complete", 40)]


def test_a_failed_replay_leaves_with_its_error_line_and_exit_code(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}\n{"timestamp": \n')
    r = _run("replay", bad, "--db", tmp_path / "r.duckdb", *REPLAY_ARGS)
    assert r.returncode == 3, (r.returncode, r.stderr)
    lines = r.stderr.rstrip().splitlines()
    assert lines[-1] == "atexit ran" and lines[-2].startswith("tierdiag: error: ") and ":2:" in lines[-2], lines
