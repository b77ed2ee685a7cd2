"""CPU seconds by test file, the suite's processes included (`-p tests.support.cpu_durations`).

`--durations` gives walls, which on a loaded machine are mostly other processes' time. This
plugin charges each test the CPU its worker spent (user + system) plus that of the processes it
started and waited for (RUSAGE_CHILDREN: each CLI call, writer, sweep worker, Chromium), setup
and teardown included, and at the end prints the files by CPU (the heaviest 40) and the total.
Under pytest-xdist each worker reports its tests to the controller, which prints the table.
A process that outlives a test (a session fixture's SGLang worker, a fork server) is read live
(psutil: its CPU and that of the processes it reaped), so each test is charged what it made it
spend, not the test that happens to reap it; its own children still running are not seen."""

from __future__ import annotations

import resource
from collections import defaultdict

import pytest

_KEY = "cpu_s"


def _cpu() -> float:
    """This process, the children it reaped, and its live children with those they reaped: a child
    reaped between two reads moves from the last term to the second, so the sum only grows."""
    import psutil

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    live = 0.0
    for child in psutil.Process().children():
        try:
            t = child.cpu_times()
        except psutil.Error:  # ended (or became a zombie's record) since it was listed
            continue
        live += t.user + t.system + t.children_user + t.children_system
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime + live


class _CpuDurations:
    def __init__(self) -> None:
        self.by_file: dict[str, float] = defaultdict(float)
        self.tests: dict[str, int] = defaultdict(int)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        if report.when == "teardown":  # the last report of a test: what it spent so far
            spent = _cpu() - item.config.stash.get(_STARTS, {}).get(item.nodeid, _cpu())
            report.user_properties.append((_KEY, spent))

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item):
        item.config.stash.setdefault(_STARTS, {})[item.nodeid] = _cpu()

    def pytest_runtest_logreport(self, report):
        for key, value in report.user_properties:
            if key == _KEY and report.when == "teardown":
                path = report.nodeid.split("::", 1)[0]
                self.by_file[path] += value
                self.tests[path] += 1

    def pytest_terminal_summary(self, terminalreporter, exitstatus, config):
        if hasattr(config, "workerinput"):
            return
        total = sum(self.by_file.values())
        terminalreporter.write_sep("=", f"CPU by test file (the processes the tests started included): {total:.1f} s")
        for path, spent in sorted(self.by_file.items(), key=lambda kv: -kv[1])[:40]:
            terminalreporter.write_line(f"{spent:8.1f} s {self.tests[path]:5d} tests  {path}")


_STARTS = pytest.StashKey[dict]()


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_CpuDurations(), "tierdiag-cpu-durations")
