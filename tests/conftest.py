"""The slow tier (pyproject.toml's `slow` marker): `make test` and CI run every test; `make
test-fast` (`pytest -m "not slow"`) leaves out the tests that take seconds each on a quiet
2-core machine.

Marked by hand (`@pytest.mark.slow`) where a test is slow on its own, and here for every test
marked `shared`: those replay the whole Mooncake traces of ../shared/traces (12,031 and 3,993
requests) or a long slice of them, each a replay of seconds to a minute.

Bytecode: the suite starts Python thousands of times (each CLI call, sweep worker and writer
process). Where PYTHONDONTWRITEBYTECODE is set (this machine's environment, and so CI's), no
start writes `__pycache__`, so every one compiled tierdiag's modules from source again (about
0.1 s of CPU each). The controller compiles them once here; reading a .pyc is allowed with the
variable set, and one whose source changed is compiled afresh in memory as before. The test
modules' asserts are rewritten by pytest at collection, in every xdist worker; the variable kept
pytest from writing its rewritten .pyc, so each worker rewrote all ~250 modules (~6.5 s of CPU a
worker). Collection now writes them (`pytest_collection` below): the workers collect the same
modules in the same order, so each reads those the other has written, and a second run reads them
all. SGLang's modules in the worker processes of tests/sglang: tests/sglang/worker.py.

Work shares (pytest-xdist, `--dist loadfile`, the Makefile's): a file runs whole on one worker,
so its module fixtures are built once. Files that share an expensive session fixture run on one
worker too (`SHARED_SESSION`): otherwise the second worker builds the fixture again (a SGLang
Scheduler worker process, ~4 s of CPU to start; the sweep folder's 4 replays and 4-run sweep).
"""

from __future__ import annotations

import compileall
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A test file (its path from the repository root) -> the work share it runs in, with the other
# files of that share, on one xdist worker: they use the same session fixture.
SHARED_SESSION = {
    # tests/sglang/conftest.py's sglang_0523_scheduler
    **dict.fromkeys(("tests/sglang/test_scheduler_0523.py", "tests/sglang/test_scheduler_long.py",
                     "tests/sglang/test_drive.py"), "sglang_0523_scheduler"),
    # tests/sweep/conftest.py's trace, singles and swept
    **dict.fromkeys(("tests/sweep/test_sweep_cli.py", "tests/sweep/test_compare_report.py"), "sweep singles and swept"),
    # README.md's `--ray` line (tests/support/shared_commands.py RAY_SWEEP): run by whichever comes
    # first, the other waiting on its lock; on one worker neither waits.
    "tests/sweep/test_sweep_ray.py": "tests/test_readme_blocks.py",
}


# The heaviest work units (a file, or a SHARED_SESSION share), heaviest first, from a fresh-clone CI
# run's JUnit walls (session 27, `--junitxml`, 2 workers; benchmarks/README.md). xdist hands out
# files with the most tests first, so a heavy file of few tests (test_python_twin.py: one test,
# ~47 s loaded) went last while the other worker had finished. These go first, in this order; the
# rest as xdist orders them. A name no longer collected is passed over: only the order changes.
HEAVIEST_FIRST = (
    "sglang_0523_scheduler", "tests/test_readme_blocks.py", "tests/test_doctor_calibrate.py",
    "tests/diagnose/test_claims.py", "sweep singles and swept", "tests/cli/test_upgrade.py",
    "tests/diagnose/test_evidence.py", "tests/diagnose/test_story_rows.py",
    "tests/reliability/test_hostile_text.py", "tests/report/test_report_chromium.py",
    "tests/reliability/test_store_cli.py", "tests/diagnose/test_size_curves.py",
    "tests/cli/test_direct_commands.py", "tests/reliability/test_signals.py", "tests/reliability/test_faults.py",
    "tests/store/test_writer_paths.py", "tests/report/test_tables_80.py", "tests/cli/test_replay_start.py",
    "tests/engine/test_storage_index.py", "tests/reliability/test_store_recovery.py",
    "tests/diagnose/test_request_evictions_once.py", "tests/calibrate/test_calibrate_from.py",
    "tests/diagnose/test_live_curves.py", "tests/reliability/test_thread_imports.py",
    "tests/reliability/test_trace_cli.py", "tests/cli/test_views_piped_and_help.py",
    "tests/sweep/test_run_file_copier.py", "tests/cli/test_runs.py", "tests/engine/test_compiled_engine.py",
    "tests/reliability/test_engine_errors.py", "tests/test_replay_cli.py", "tests/engine/test_python_twin.py",
    "tests/reliability/test_writer_process.py", "tests/cli/test_next_hints.py",
    "tests/diagnose/test_wait_sentences.py", "tests/diagnose/test_session_pauses_linear.py",
    "tests/cli/test_hostile_options.py", "tests/importers/test_dp_ranks.py", "tests/reliability/test_config_cli.py",
    "tests/diagnose/test_run_story.py",
)


def pytest_configure(config: pytest.Config) -> None:
    # No piped progress lines from the CLI run in this process (CliRunner, tierdiag_in_process), as
    # tests/support/cli.py's cli_env has it for the CLI's processes: a command that ran past 10 s
    # on a loaded machine printed "tierdiag: advise: 0 of at most 2 replays, 10s elapsed" into the
    # output a test parsed as JSON (test_advise_cli failed so in a loaded suite run, session 23).
    # Tests of the lines set the variable themselves (tests/cli/test_progress.py).
    os.environ.setdefault("TIERDIAG_PROGRESS_EVERY_S", "0")
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller has done it
        return
    for package in ("tierdiag", "tests"):
        if not compileall.compile_dir(ROOT / package, quiet=2):
            config.issue_config_time_warning(pytest.PytestConfigWarning(
                f"could not byte-compile all of {package}/ (a read-only checkout?): each Python the "
                "tests start compiles those modules again"), stacklevel=2)


@pytest.hookimpl(hookwrapper=True)
def pytest_collection(session: pytest.Session):
    """Let pytest write the test modules' rewritten .pyc (`__pycache__/*-pytest-*.pyc`, atomic: a
    temporary file renamed) while it collects; the tests themselves run with the setting as it was."""
    was, sys.dont_write_bytecode = sys.dont_write_bytecode, False
    try:
        yield
    finally:
        sys.dont_write_bytecode = was


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("shared") is not None and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # optional: a run without pytest-xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`--dist loadfile`, where files of one SHARED_SESSION share are one unit of work."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedSessionScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return SHARED_SESSION.get(path, path)

        def _assign_work_unit(self, node) -> None:
            """The next unit: the first of HEAVIEST_FIRST still waiting, else xdist's next."""
            first = next((unit for unit in HEAVIEST_FIRST if unit in self.workqueue), None)
            if first is not None:
                self.workqueue.move_to_end(first, last=False)
            super()._assign_work_unit(node)

    return SharedSessionScheduling(config, log)
