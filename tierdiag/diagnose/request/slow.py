"""`slow`: finished requests ranked by excess TTFT over their ideal, with their primary cause.

Only requests with some excess are listed: one at its ideal is not slow, whatever its class.

Ideal = all reused (and once-cached) tokens device-resident, no queueing (`ideal_ttft_ns`).
The cause comes from the same SQL rule `explain` applies to one row (causes.py), so a
request's cause here and in `explain` never disagree. One query over the run's rows
(read/queries.py `slowest`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import duckdb

from tierdiag.config.names import Cause, HitClass, values
from tierdiag.diagnose.request.causes import TtftParts, check_cause
from tierdiag.diagnose.read.query import dataclass_json
from tierdiag.diagnose.read import queries
from tierdiag.diagnose.request.tokens import TokenSplit
from tierdiag.errors import ConfigError, unknown_name
from tierdiag.store.reader import RunInfo

HIT_CLASSES: tuple[str, ...] = values(HitClass)  # config/names.py


@dataclass(frozen=True)
class SlowRequest:
    rank: int
    req_id: str
    seq: int | None
    hit_class: str | None
    arrival_ns: int
    ttft_ns: int
    ideal_ttft_ns: int
    excess_ns: int
    # the request's TokenSplit, field by field (its JSON keeps them flat)
    input_tokens: int
    device_tokens: int
    host_tokens: int
    storage_tokens: int
    computed_tokens: int
    recomputed_tokens: int
    loadback_skipped_reason: str | None
    primary_cause: str
    cause_ns: int  # the part of the excess the primary cause owns, at most the excess (0 for none)

    @property
    def tokens(self) -> TokenSplit:
        return TokenSplit.of(self)

    def to_json(self) -> dict:
        return dataclass_json(self)


def check_hit_class(name: str | None) -> str | None:
    if name is None or name in HIT_CLASSES:
        return name
    raise unknown_name("hit class", name, HIT_CLASSES)


def slow_requests(con: duckdb.DuckDBPyConnection, run: RunInfo, *, top: int = 20,
                  hit_class: str | None = None, cause: str | None = None, by_rank: bool = False,
                  dp_rank: int | None = None) -> list[SlowRequest]:
    """The `top` finished requests of `run` with the largest excess TTFT (ties: trace order).

    Requests at (or under) their ideal are not slow and are left out, whatever the filters.
    `by_rank`: only those of data-parallel rank `dp_rank` (None: no rank recorded; ranks.py).
    """
    if top < 1:
        raise ConfigError(f"--top must be at least 1, got {top}")
    check_hit_class(hit_class)
    check_cause(cause)
    result = []
    for rank, (r, primary) in enumerate(queries.slowest(con, run, top=top, hit_class=hit_class, cause=cause,
                                                        by_rank=by_rank, dp_rank=dp_rank), start=1):
        parts = TtftParts.from_row(r)
        assert parts is not None, f"request {r.req_id}: finished but no ttft_ns (engine bug?)"
        result.append(SlowRequest(
            rank=rank, req_id=r.req_id, seq=r.seq, hit_class=r.hit_class,
            arrival_ns=int(r.arrival_ns or 0), ttft_ns=parts.ttft_ns, ideal_ttft_ns=parts.ideal_ttft_ns,
            excess_ns=parts.excess_ns, **asdict(TokenSplit.from_row(r)),
            loadback_skipped_reason=r.loadback_skipped_reason, primary_cause=primary,
            # A part can exceed the excess when the request's own compute came out below its
            # ideal (recompute and compute split one memory-bound prefill): cap it there.
            cause_ns=0 if primary == Cause.NONE else min(parts.excess_parts_ns()[primary], parts.excess_ns),
        ))
    return result
