"""SGLang's own wheels at test time, for the `sglang` marker's tests (never committed, never
installed with their dependencies).

Each version is fetched (tests/support/sglang_wheels.py) with `pip download --no-deps sglang==<v>` into
$TMPDIR/tierdiag-sglang-<v>/wheel (reused between runs), unzipped into
$TMPDIR/tierdiag-sglang-<v>/root, and run in a worker process of its own (worker.py): the two
versions' `sglang` packages never share a namespace, and the GPU stubs they need never reach
this process, where tierdiag's own Triton tests import the real triton. No network, no wheel:
the tests skip with one line.
"""

from __future__ import annotations

import json

import pytest

from tests.sglang.differential import Worker
from tests.support.sglang_wheels import unpacked_wheel


@pytest.fixture(scope="session")
def sglang_059():
    worker = Worker("0.5.9", unpacked_wheel("0.5.9"))
    yield worker
    worker.close()


@pytest.fixture(scope="session")
def sglang_0523():
    worker = Worker("0.5.23", unpacked_wheel("0.5.23"))
    yield worker
    worker.close()


class _Answered:
    """A worker that runs each scenario once a session: the same scenario again (a workload
    test_agrees_with_sglang ran, asked again by the switch and cap tests as the agreeing baseline
    beside their own runs) gets the first answer back, parsed afresh (a test may change what it
    gets). SGLang's Scheduler on the virtual clock answers a scenario the same every time."""

    def __init__(self, worker: Worker):
        self.worker, self.version = worker, worker.version
        self._answers: dict[str, str] = {}

    def run(self, scenario: dict) -> dict:
        key = json.dumps(scenario, sort_keys=True)
        if key not in self._answers:
            self._answers[key] = json.dumps(self.worker.run(scenario))
        return json.loads(self._answers[key])

    def close(self) -> None:
        self.worker.close()


@pytest.fixture(scope="session")
def sglang_0523_scheduler():
    """A worker of its own for the Scheduler harness (test_scheduler_0523.py): each workload
    publishes its server args process-wide, which the cache-only scenarios must not see."""
    worker = _Answered(Worker("0.5.23", unpacked_wheel("0.5.23")))
    yield worker
    worker.close()
