"""One `requests` row, typed: a frozen record with the table's columns as attributes (units in
their names: `_ns` virtual nanoseconds, `_tokens`, `_bytes`, `think_ms`), NULL as None.

`RequestRow.of(mapping)` is the boundary: a row read by `queries.request` is one already, a dict
of columns (a test's hand-made row, a partial SELECT) becomes one with its missing columns None
and keys that are no column of `requests` left out (a SELECT's computed `excess_ns`, say).
tests/diagnose/test_read_model.py checks the fields against the schema (store/schema.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True, slots=True)
class RequestRow:
    run_id: str | None = None
    req_id: str | None = None
    seq: int | None = None
    arrival_ns: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    status: str | None = None
    reject_reason: str | None = None
    hit_class: str | None = None
    device_hit_tokens: int | None = None
    host_hit_tokens: int | None = None
    storage_hit_tokens: int | None = None
    computed_tokens: int | None = None
    recomputed_tokens: int | None = None
    host_match_tokens: int | None = None
    storage_match_tokens: int | None = None
    loadback_skipped_reason: str | None = None
    loadback_skipped_tokens: int | None = None
    storage_skipped_reason: str | None = None
    prefix_indices_len: int | None = None
    cache_protected_len: int | None = None
    extend_input_len: int | None = None
    queue_ns: int | None = None
    storage_wait_ns: int | None = None
    loadback_ns: int | None = None
    loadback_exposed_ns: int | None = None
    loadback_queued_ns: int | None = None
    loadback_bytes: int | None = None
    loadback_pages: int | None = None
    loadback_runs: int | None = None
    storage_bytes: int | None = None
    storage_fetch_ns: int | None = None
    recompute_ns: int | None = None
    compute_ns: int | None = None
    prefill_ns: int | None = None
    ttft_ns: int | None = None
    ideal_ttft_ns: int | None = None
    ttft_if_device_resident_ns: int | None = None
    recompute_instead_ns: int | None = None
    first_batch_id: int | None = None
    num_chunks: int | None = None
    first_token_ns: int | None = None
    finish_ns: int | None = None
    session_id: str | None = None
    think_ms: float | None = None
    trace_arrival_ns: int | None = None
    dp_rank: int | None = None
    route_branch: str | None = None
    route_reason: str | None = None
    route_score: float | None = None
    route_score_name: str | None = None
    arrival_device_tokens: int | None = None
    arrival_host_tokens: int | None = None
    best_rank: int | None = None
    best_rank_device_tokens: int | None = None
    best_rank_host_tokens: int | None = None
    ranks_json: str | None = None
    miss_never_cached_tokens: int | None = None
    miss_evicted_before_reuse_tokens: int | None = None
    miss_lost_while_queued_tokens: int | None = None
    miss_loadback_skipped_tokens: int | None = None
    miss_prefetch_declined_tokens: int | None = None
    miss_prefetch_revoked_tokens: int | None = None
    miss_shared_in_batch_tokens: int | None = None
    miss_routed_elsewhere_tokens: int | None = None
    miss_beyond_storage_tokens: int | None = None
    decode_wait_ns: int | None = None
    retractions: int | None = None
    miss_prefetch_lost_tokens: int | None = None

    @classmethod
    def of(cls, row: "RequestRow | Mapping[str, Any]") -> "RequestRow":
        """`row` as a RequestRow (itself where it is one)."""
        if isinstance(row, RequestRow):
            return row
        try:
            return cls(**row)  # a dict of columns only (a `SELECT *` row): the fast way
        except TypeError:
            return cls(**{name: row[name] for name in COLUMNS if name in row})

    @classmethod
    def from_tuple(cls, values: tuple) -> "RequestRow":
        """From a `SELECT {SELECT_COLUMNS}` result row (the columns in COLUMNS' order)."""
        return cls(*values)

    def to_dict(self) -> dict[str, Any]:
        """The row as the dict of its columns `SELECT *` gives (for a caller that still wants one)."""
        return {name: getattr(self, name) for name in COLUMNS}


COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(RequestRow))
SELECT_COLUMNS = ", ".join(COLUMNS)
RowLike = RequestRow | Mapping[str, Any]  # what a function that reads one request row accepts
