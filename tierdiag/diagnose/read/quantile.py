"""The one percentile definition every view uses: nearest rank.

    p-th quantile of n values = the value at 1-based rank ceil(q * n) of the sorted values

It is always one of the recorded values (never an interpolation between two requests), which
is what a user checks a view against: "p50 33.0 ms" names a request's TTFT. DuckDB's
`quantile_disc` computes exactly this (tests/diagnose check it value for value), so SQL readers
use `QUANTILE_SQL` and Python callers holding a list (replay's closing table) use
`nearest_rank`; replay, `summary`, `report` and `compare` therefore print the same numbers.
"""

from __future__ import annotations

import math
from typing import Sequence

QUANTILE_SQL = "quantile_disc"


def nearest_rank_index(n: int, q: float) -> int:
    """0-based index of the q-quantile in n sorted values (n >= 1)."""
    # round() first: q * n in floating point can land a hair above an integer (0.29 * 100).
    return min(max(math.ceil(round(q * n, 9)) - 1, 0), n - 1)


def nearest_rank(values: Sequence[float], q: float, *, presorted: bool = False) -> float | None:
    """The q-quantile of `values` by nearest rank; None for no values."""
    if not values:
        return None
    s = values if presorted else sorted(values)
    return s[nearest_rank_index(len(s), q)]


def quantile_sql(column: str, q: float) -> str:
    return f"{QUANTILE_SQL}({column}, {q!r})"
