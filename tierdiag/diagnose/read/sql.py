"""The two row sets every view counts over, written once.

    finished     a request that produced a first token: its status is 'finished' (NULL, in a
                 store hand-made without the column's value, counts as finished) and it has a TTFT
    run span     first arrival -> last event of a request (finish, else first token, else arrival);
                 over which requests is a parameter, because the views differ on purpose:
                   "all"       every request of the run: the clock every view starts at (summary's
                               span_ms, explain's times, the report's axes)
                   "finished"  only finished ones: the run context's span (what a prefill busy
                               share is a share of; rejected requests did no work)

`summary`, `explain`, `slow`, `compare`, the run context and the report all take these from here,
so their populations and spans cannot drift apart.
"""

from __future__ import annotations

from typing import Literal

SpanOver = Literal["all", "finished"]


def finished_sql(alias: str = "") -> str:
    """SQL: the row is a finished request (`alias`: the table alias to qualify columns with)."""
    p = f"{alias}." if alias else ""
    return f"coalesce({p}status, 'finished') = 'finished' AND {p}ttft_ns IS NOT NULL"


FINISHED_SQL = finished_sql()

SPAN_START_SQL = "min(arrival_ns)"
# The span ends at the last served finish (or first token, for one cut short): a rejected
# request's row is stamped when it was turned away, which for a turn dropped after its session
# ended (session_ended) is when the trace reached its line, possibly long after the last request
# was served. Only a run that served nothing ends at its last record.
SPAN_END_SQL = "coalesce(max(coalesce(finish_ns, first_token_ns)), max(arrival_ns))"


def span_columns_sql(over: SpanOver) -> tuple[str, str]:
    """SQL aggregates (start, end) of the run's span over the `over` requests, for a query over
    the run's `requests` rows (FILTER keeps them exact inside a wider aggregate)."""
    if over == "all":
        return SPAN_START_SQL, SPAN_END_SQL
    if over == "finished":
        where = f"FILTER (WHERE {FINISHED_SQL})"
        return (f"{SPAN_START_SQL} {where}",
                f"coalesce(max(coalesce(finish_ns, first_token_ns)) {where}, max(arrival_ns) {where})")
    raise ValueError(f"span over {over!r}: 'all' or 'finished'")
