"""Where a sweep's workers come from (app/sweep_fork.py, app/sweep_forkserver.py): a fork server
that imported the replay once, readied by its first preloaded module (the collector held off
through the imports and their objects frozen, the sweep's dataclass table, one BLAS thread),
started by `tierdiag sweep` as its process starts; and what of it a process that is not a fork
server gets when it imports the same module (nothing)."""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import cli_env
from tierdiag.app import sweep, sweep_fork
from tierdiag.errors import ExitCode

BLAS = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
HAS_FORKSERVER = "forkserver" in multiprocessing.get_all_start_methods()
needs_forkserver = pytest.mark.skipif(not HAS_FORKSERVER, reason="no fork server on this platform")


def _python(code: str, *args: str, timeout: float = 180, **extra_env: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in cli_env(**extra_env).items() if k not in BLAS or k in extra_env}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def test_workers_come_warm_from_a_fork_server_that_imported_the_replay():
    """Issue 41: a sweep's workers are forked from one fork server that imported the replay
    once (its start-up was paid once per worker before, ~0.5 s of CPU each); spawn where the
    platform has no fork server. The preloaded modules exist (a typo would only warn there)."""
    ctx = sweep.worker_context()
    assert ctx.get_start_method() == ("forkserver" if HAS_FORKSERVER else "spawn")
    assert sweep.worker_context is sweep_fork.worker_context and sweep.warm_up_workers is sweep_fork.warm_up_workers
    assert sweep_fork.WORKER_PRELOAD[0] == "tierdiag.app.sweep_forkserver"
    assert sweep_fork.WORKER_PRELOAD[1:] == list(sweep_fork.PRELOAD_MODULES)
    assert all(importlib.util.find_spec(m) is not None for m in sweep_fork.WORKER_PRELOAD)
    sweep.warm_up_workers()
    sweep.warm_up_workers()  # twice: the same server, nothing else


def test_the_warm_up_imports_nothing_of_the_store():
    """`tierdiag sweep` starts the fork server from sweep_fork before the driver imports its
    merge's store code (duckdb, pyarrow, numpy: ~0.2 s of CPU that the server's start waited
    for): the module itself brings none of it."""
    out = _python("import sys; import tierdiag.app.sweep_fork; "
                  "print(json.dumps([m in sys.modules for m in ('duckdb', 'pyarrow', 'numpy', 'tierdiag.store.writer')]))"
                  .replace("import sys;", "import sys, json;"))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [False, False, False, False]


# What a process forked from the sweep's fork server sees, read in it (Pool.apply of eval: a
# builtin, pickled by name, so the probe needs no module of its own).
_PROBE = ("(__import__('gc').get_freeze_count(), __import__('gc').isenabled(), "
          "__import__('os').environ.get('OPENBLAS_NUM_THREADS'), "
          "__import__('os').path.basename(__import__('tierdiag.dataclass_code', fromlist=['_']).__dict__['_state'].get('path', '')), "
          "[m in __import__('sys').modules for m in ('tierdiag.engine.engine', 'tierdiag.diagnose.run.close', "
          "'tierdiag.app.replay', 'pyarrow', 'torch')])")
_FORKED = f"""
import gc, json, sys
from tierdiag.app.sweep_fork import worker_context

if __name__ == "__main__":
    with worker_context().Pool(1) as pool:
        child = pool.apply(eval, ({_PROBE!r},))
    print(json.dumps({{"child": child, "parent_frozen": gc.get_freeze_count(),
                       "parent_engine": "tierdiag.engine.engine" in sys.modules}}))
"""


@needs_forkserver
def test_a_forked_worker_inherits_a_readied_server():
    out = _python(_FORKED)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    frozen, enabled, blas, table, (engine, close, replay, pyarrow, torch) = got["child"]
    assert frozen > 10_000, "the preload's objects are frozen in the server, so in its workers"
    assert enabled, "the collector is back on once the imports are done"
    assert blas == "1", "numpy was loaded in the server with one BLAS thread"
    assert table.startswith("dataclass_code_sweep."), table
    assert (engine, close, replay) == (True, True, True)
    assert (pyarrow, torch) == (False, False), "the server never imports what starts threads at import"
    # The driver keeps none of it: it imported only what starts the server.
    assert got["parent_frozen"] == 0 and got["parent_engine"] is False


@needs_forkserver
def test_a_blas_thread_count_the_user_set_is_kept():
    out = _python(_FORKED, OPENBLAS_NUM_THREADS="3")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["child"][2] == "3"


def test_importing_the_server_module_elsewhere_does_nothing():
    """Only a fork server's own preload runs `boot`: a process that imports the module otherwise
    (a test, a tool walking the package) keeps its collector, its dataclasses and its environment."""
    out = _python("import gc, json, os, sys, dataclasses\n"
                  "import tierdiag.app.sweep_forkserver as s\n"
                  "from tierdiag import dataclass_code\n"
                  "print(json.dumps([gc.get_freeze_count(), gc.isenabled(), os.environ.get('OPENBLAS_NUM_THREADS'),"
                  " bool(dataclass_code._state), 'tierdiag.engine.engine' in sys.modules,"
                  " s._imported_by_fork_server()]))")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [0, True, None, False, False, False]


@pytest.mark.parametrize("enabled", [True, False])
def test_boot_freezes_its_imports_and_leaves_the_collector_as_it_was(enabled):
    code = ("import gc, json, os, sys\n"
            f"{'' if enabled else 'gc.disable()'}\n"
            "from tierdiag.app.sweep_forkserver import boot\n"
            "boot()\n"
            "print(json.dumps([gc.get_freeze_count() > 10_000, gc.isenabled(), len(os.listdir('/proc/self/task')),"
            " [m in sys.modules for m in ('pyarrow', 'torch')]]))")
    if not Path("/proc/self/task").is_dir():
        pytest.skip("no /proc: threads not countable here")
    out = _python(code)
    assert out.returncode == 0, out.stderr
    frozen, now_enabled, threads, (pyarrow, torch) = json.loads(out.stdout)
    assert frozen and now_enabled is enabled
    # A fork server forks with the threads its imports started: none (numpy's OpenBLAS is loaded
    # with one thread, the caller's own).
    assert threads == 1 and (pyarrow, torch) == (False, False)


def test_boot_lets_an_import_error_through_with_the_collector_restored():
    code = ("import gc\n"
            "from tierdiag.app.sweep_forkserver import boot\n"
            "try:\n"
            "    boot(('tierdiag.no_such_module',))\n"
            "except ImportError:\n"
            "    print(gc.isenabled(), gc.get_freeze_count() > 0)\n")
    out = _python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]


# `tierdiag sweep` starts the server as its process starts (cli/main.py `entry`), except where
# the command line asks for no local workers; what becomes of the server is checked by its pid.
_ENTRY = """
import json, sys
from multiprocessing import forkserver
import tierdiag.cli.main as m
sys.argv = ["tierdiag", *sys.argv[1:]]
code = 0
try:
    m.entry()
except SystemExit as exc:
    code = exc.code
from tierdiag import dataclass_code
table = dataclass_code._state.get("path", "").rsplit("/", 1)[-1].split(".")[0]
print(json.dumps([forkserver._forkserver._forkserver_pid is not None, code, table]), file=sys.__stderr__)
"""


@needs_forkserver
@pytest.mark.parametrize("args, started", [
    (["sweep", "--help"], False),
    (["sweep", "-h"], False),
    (["sweep", "--resume", "kept.duckdb"], False),
    (["sweep", "t.jsonl", "--ray", "--set", "host_tokens=1M,2M"], False),
    (["sweep", "missing.jsonl", "--set", "host_tokens=1M,2M"], True),
])
def test_the_sweep_command_starts_its_fork_server_at_once(tmp_path, args, started):
    """Typer, the command's modules and the plan (~0.17 s of CPU) come after the server's start;
    a command line that fails is the same one-line error, and the server ends with it."""
    proc = subprocess.run([sys.executable, "-c", _ENTRY, *args], capture_output=True, text=True, timeout=180,
                          env=cli_env(), cwd=tmp_path)
    here, code, table = json.loads(proc.stderr.strip().splitlines()[-1])
    assert here is started, proc.stderr
    # The driver's own dataclass table (tierdiag/dataclass_code.py) goes with the early start.
    assert table == ("dataclass_code_sweep_driver" if started else ""), table
    if started:
        assert code == ExitCode.BAD_INPUT and "missing.jsonl: no such trace file" in proc.stderr, proc.stderr
