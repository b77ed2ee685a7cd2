"""`summary` at 80 columns: rejections that differ only in their numbers are one line."""

from __future__ import annotations

from tierdiag.diagnose.run.summary import ReasonCount
from tierdiag.report.terminal import grouped_reasons


def test_rejections_differing_only_in_numbers_are_one_line_with_ranges():
    reasons = [ReasonCount(f"needs {n} tokens of device memory; the pool holds 29952", k, n * k)
               for n, k in ((30400, 2), (119360, 1), (31552, 3))]
    reasons.append(ReasonCount("too long for the model (131072 tokens)", 1, 140_000))
    assert grouped_reasons(reasons) == [
        ("needs 30,400 to 119,360 tokens of device memory; the pool holds 29,952", 6,
         30400 * 2 + 119360 + 31552 * 3),
        ("too long for the model (131072 tokens)", 1, 140_000),
    ]
