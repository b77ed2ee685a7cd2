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


# The console script with the collector watched: at the end (atexit, which `_leave` runs) how
# many objects were frozen, how many of the dead engine's ranks (its cycle: each `Scheduler` holds
# the deployment's callbacks) are among them, and whether any pass after the replay returned
# collected anything.
ENTRY_GC = ("import atexit, gc, sys, time\n"
            "import tierdiag.app.replay as app_replay\n"
            "after = []\n"
            "plain = app_replay.replay\n"
            "def replay(*a, **kw):\n"
            "    try:\n"
            "        return plain(*a, **kw)\n"
            "    finally:\n"
            "        gc.callbacks.append(lambda phase, info: after.append(info['collected']) if phase == 'stop' else None)\n"
            "app_replay.replay = replay\n"
            "def seen():\n"
            "    frozen = gc.get_freeze_count()\n"
            "    gc.unfreeze()\n"
            "    from tierdiag.engine.scheduler import Scheduler\n"
            "    engines = sum(type(o) is Scheduler for o in gc.get_objects())\n"
            "    sys.stderr.write(f'frozen {frozen} engines {engines} collected after {sum(after)}\\n')\n"
            "atexit.register(seen)\n"
            "from tierdiag.cli.main import entry\n"
            "entry()\n")


def test_the_console_scripts_replay_leaves_its_dead_engine_frozen_not_traversed_by_the_collector(tmp_path):
    """The engine is a reference cycle, dead once the replay returns; with the collector's
    default thresholds back, the next pass would traverse it whole (0.05-0.22 s at `--dp 8` on
    the conversation trace) just before the process ends unfreed. `replay(process_ends=True)`
    freezes the heap first: the engine is still there at the end (in the permanent generation),
    and no pass after the replay collected it."""
    trace = write_late_trace(tmp_path / "t.jsonl", num_requests=40)
    args = ("replay", trace, "--db", tmp_path / "r.duckdb", *REPLAY_ARGS, "--dp", 2, "--router", "cache_aware", "--json")
    r = subprocess.run([sys.executable, "-c", ENTRY_GC, *map(str, args)],
                       capture_output=True, text=True, timeout=300, env=_env(COLUMNS="80"))
    assert r.returncode == 0, r.stderr
    last = r.stderr.rstrip().splitlines()[-1].split()
    assert last[0] == "frozen" and int(last[1]) > 1000, r.stderr
    assert last[2:4] == ["engines", "2"], r.stderr  # the two ranks' schedulers, kept
    assert last[4:7] == ["collected", "after", "0"], r.stderr  # the engine was never collected


def test_a_library_replay_leaves_its_engine_to_the_collector_and_freezes_nothing(tmp_path):
    """`replay()` called by a library (or Typer's test runner, which runs the CLI inside a longer
    process: `process_ends_unfreed` is false there) restores the thresholds without freezing:
    the caller's dead engine is collected like any other cycle."""
    import gc

    from typer.testing import CliRunner

    from tierdiag.app.replay import replay
    from tierdiag.cli.exits import process_ends_unfreed
    from tierdiag.cli.main import _build_app
    from tierdiag.config.engine import EngineConfig
    from tierdiag.engine.scheduler import Scheduler

    def engines() -> int:  # the ranks' schedulers: the engine's cycle
        return sum(type(o) is Scheduler for o in gc.get_objects())

    trace = write_late_trace(tmp_path / "t.jsonl", num_requests=40)
    cfg = EngineConfig(model="tiny", gpu="cpu", device_tokens=12288, host_tokens=20480, dp=2, router="cache_aware")
    gc.collect()
    frozen, before = gc.get_freeze_count(), engines()
    threshold = gc.get_threshold()
    gc.disable()  # no pass of its own between the replay's end and the count below
    try:
        res = replay(trace, cfg, db=None, run_name=None, probes=False, skip_bad=False)
        assert engines() == before + 2  # dead, not yet collected
    finally:
        gc.enable()
    assert res.num_requests == 40
    assert gc.get_freeze_count() == frozen and gc.get_threshold() == threshold
    gc.collect()
    assert engines() == before  # the replay's engine was collected
    # The CLI under the test runner: the process goes on, so nothing is frozen either.
    assert not process_ends_unfreed()
    out = CliRunner().invoke(_build_app(), ["replay", str(trace), "--no-probes", *map(str, REPLAY_ARGS), "--json"])
    assert out.exit_code == 0, out.output
    assert gc.get_freeze_count() == frozen
    gc.collect()
    assert engines() == before
