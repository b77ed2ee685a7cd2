"""The slow tier (pyproject.toml's `slow` marker): `make test` and CI run every test; `make
test-fast` (`pytest -m "not slow"`) leaves out the tests that take seconds each on a quiet
2-core machine.

Marked by hand (`@pytest.mark.slow`) where a test is slow on its own, and here for every test
marked `shared`: those replay the whole Mooncake traces of ../shared/traces (12,031 and 3,993
requests) or a long slice of them, each a replay of seconds to a minute.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("shared") is not None and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)
