"""The tests that patch the engine's classes (helpers.patches_the_engine), which a compiled core's
are not open to (mypyc's native classes): where the core is compiled, each runs here on the
Python twin (TIERDIAG_PURE_ENGINE=1), in a subprocess; where it is not, in the suite itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tierdiag.engine import compiled

REPO = Path(__file__).resolve().parents[2]
PATCHING = [
    "tests/engine/test_fast_paths.py",  # the fast paths against the reference loop (class attributes swapped)
    "tests/engine/test_pools.py::test_a_load_back_of_a_corrupted_host_copy_is_caught",  # wraps load_back
    # replaces _new_prefill for one pass
    "tests/engine/test_sglang_0523_long.py::test_a_pass_that_runs_nothing_while_requests_wait_keeps_the_new_token_ratio",
    "tests/engine/test_sglang_0523_conformance.py::test_a_miss_is_queried_again_every_8_passes_up_to_8_times",  # _start_prefetch
    "tests/engine/test_sglang_0523_more_rules.py::test_a_hit_the_host_cannot_take_arms_a_requery_with_its_end",  # alloc_host
    # the storage pass tests wrap the scheduler's prefetch steps and the controller's storage writes
    "tests/engine/test_sglang_0523_storage_timing.py::test_a_storage_write_is_in_the_tier_from_its_end",
    "tests/engine/test_sglang_0523_storage_passes.py::test_a_read_is_seen_at_the_pass_after_its_hit_is_allocated",
    "tests/engine/test_sglang_0523_storage_passes.py::test_best_effort_polled_before_the_read_is_seen_gets_nothing",
    "tests/engine/test_sglang_0523_storage_passes.py::test_a_storage_write_starts_at_the_host_copys_ack_and_holds_it_a_pass",
    "tests/engine/test_sglang_0523_storage_requery.py",  # replaces _start_prefetch
    "tests/engine/test_held_release_run_ahead.py",  # swaps decode_ahead, wraps _drain_held_releases
    # the storage re-queries' memo refused against taken (wraps prefetch._memo_holds)
    "tests/engine/test_requery_memo.py::test_requeries_through_the_memo_change_no_event",
    "tests/engine/test_requery_memo.py::test_a_queue_of_misses_requeries_through_the_memo",
    # the --dp loop's idle passes gated against every idle pass called (wraps idle_pass, swaps the gate)
    "tests/engine/test_deployment.py::test_an_idle_rank_passes_only_where_its_pass_changes_something",
    "tests/engine/test_deployment.py::test_skipping_the_idle_passes_that_change_nothing_keeps_every_event",
    # the steps run ahead timed when asked against the decode loop's wakes (wraps run_decode_ahead)
    "tests/engine/test_deployment.py::test_steps_run_ahead_are_timed_when_asked_as_the_decode_loop_times_them",
    "tests/engine/test_deployment.py::test_steps_run_ahead_are_timed_as_the_decode_loop_times_them_on_any_workload",
]


@pytest.mark.skipif(not compiled.is_compiled(), reason="the engine here is the Python twin: these run in the "
                                                       "suite itself")
def test_on_the_python_twin():
    """All of them in one pytest process (one start-up, not one a target); its summary names any
    that fails."""
    proc = subprocess.run([sys.executable, "-m", "pytest", *PATCHING, "-q", "-p", "no:cacheprovider"],
                          capture_output=True, text=True, timeout=1200, cwd=REPO, env={**os.environ, compiled.ENV: "1"})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert " passed" in last and "skipped" not in last, last
