"""`summary`: one run at a glance, weighted by tokens, not by requests, with its diagnosis.

Why tokens: in the Mooncake conversation trace every request shares block 0, so nearly every
request "hits" while the median hit is 512 tokens; a request-count hit rate says ~100 % and
means little. The split is of tokens (device / host / storage / computed), with the
request-count view beside it only to show the gap.

The numbers are numbers.py's (stored with the run at its close, read through facts.py); the
diagnosis is made here from the run context and advice/'s rules, either way (its advice
carries what `advise` verified since the run was closed).
"""

from __future__ import annotations

from dataclasses import replace

import duckdb

from tierdiag.config.names import Cause
from tierdiag.diagnose.advice.verify import run_advice
from tierdiag.diagnose.run.diagnosis import diagnose_run
from tierdiag.diagnose.run.facts import RunFacts
from tierdiag.diagnose.run.numbers import (  # noqa: F401 - the types summary's callers render
    CauseShare,
    ClassStats,
    EvictionCount,
    LoadBackTotals,
    ReasonCount,
    RequestCount,
    RunSummary,
    SkipCount,
    TierSplit,
    compute_run_summary,
)
from tierdiag.store.reader import RunInfo


def run_summary(con: duckdb.DuckDBPyConnection, run: RunInfo, *, diagnose: bool = True, ctx=None,
                facts: RunFacts | None = None) -> RunSummary:
    """The run at a glance; `diagnose=False` leaves out the run diagnosis (diagnosis None), the
    costly part, for callers that show only the numbers (compare, a sweep's headlines).
    `ctx` / `facts`: the run's context / facts when the caller has them already (the report)."""
    facts = facts if facts is not None else RunFacts(con, run)
    numbers = replace(facts.summary_numbers(), sessions=facts.session_summary(), ranks=facts.rank_summary(),
                      miss_reasons=facts.miss_reasons())
    if not diagnose:
        return numbers
    ctx = ctx if ctx is not None else facts.context()
    parts = {c.cause: c.excess_part_ns or 0 for c in numbers.time_by_cause if c.cause != Cause.NONE}
    return replace(numbers, diagnosis=diagnose_run(ctx, parts, run_advice(con, run, ctx, facts=facts),
                                                   miss_reasons=numbers.miss_reasons),
                   size_curves=facts.size_curves())
