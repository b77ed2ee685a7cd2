"""Issue 43's workload list against the harness's CI cases (no SGLang run here): every cell of the
matrix (seeded bursts, shared prefixes arriving together, long prompts that chunk, memory pressure,
the conversation trace at its rate and at 4x, agent sessions in closed loop; against fcfs, lpm,
each write policy, with and without storage, pages 1 and 64, SGLang's Rust and Python tree cores)
has a case test_scheduler_0523.py / test_scheduler_long.py run against SGLang 0.5.23's Scheduler,
and tests/sglang/README.md prints that matrix as the harness computes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.sglang import scheduler_harness as H

pytestmark = pytest.mark.shared  # the conversation cases read ../shared/traces


@pytest.fixture(scope="module")
def ci_matrix():
    if not H.CONVERSATION.exists():
        pytest.skip("needs ../shared/traces/conversation_trace.jsonl")
    return H.matrix(H.ci_cases())


def test_every_cell_has_a_ci_case(ci_matrix):
    empty = [cell for cell, ids in ci_matrix.items() if not ids]
    assert not empty, f"cells of issue 43's workload list no CI case covers: {empty}"


def test_the_readme_prints_the_matrix(ci_matrix):
    if H.LONG:
        pytest.skip("the README prints CI's matrix (TIERDIAG_HARNESS_LONG=1 runs more cases)")
    readme = (Path(__file__).parent / "README.md").read_text()
    table = H.matrix_table(ci_matrix, H.matrix(H.long_cases()))
    assert table in readme, "tests/sglang/README.md's matrix is stale: python -m tests.sglang.scheduler_harness"


def test_the_ci_cases_are_the_ones_the_tests_run():
    """ci_cases is what test_scheduler_0523.py parametrizes plus test_scheduler_long.py's chunk_host."""
    from tests.sglang import test_scheduler_0523 as T

    ran = {p.id for p in T._cases()} | {f"chunk_host-s{s}" for s in range(4)}
    assert {cid for cid, _, _ in H.ci_cases()} == ran
