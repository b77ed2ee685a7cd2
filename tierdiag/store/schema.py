"""The DuckDB run-store schema: the contract every reader relies on (DESIGN.md §3).

Bump SCHEMA_VERSION whenever a column is removed or changes meaning; adding columns to the
end of a table is compatible only if readers never rely on them positionally (they don't).
"""

from __future__ import annotations

import time


def new_run_id() -> str:
    """A run's id: when it started, and 6 hex digits (the replay, the writer process and the
    sweep's workers all name runs with it)."""
    import uuid  # a writer's: readers import this module (uuid loads platform; start-up, issue 41)

    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]

SCHEMA_VERSION = 7  # v2: runs.kind, runs.sweep_id (DESIGN §5); v3: requests' session columns (§6);
# v4: data-parallel ranks (dp_rank on every event table, the routing decision on requests; §6);
# v5: miss reasons (requests.miss_*_tokens; DESIGN §7, issue 40)
# v6: decode on the clock (requests.decode_wait_ns, requests.retractions; issue 43)
# v7: the miss reason prefetch_lost (requests.miss_prefetch_lost_tokens; issue 43 follow-up)

# Columns each version added to the end of a table, nothing else changing: a store of an older
# version still reads (store/reader.py shows it with these columns, NULL), and a writer adds them
# to it before its first run (store/writer.py).
# The miss reasons' columns (engine/miss.py MISS_COLUMNS, kept equal by tests/engine/test_miss_reasons.py).
MISS_REASONS: tuple[str, ...] = (
    "never_cached", "evicted_before_reuse", "lost_while_queued", "loadback_skipped", "prefetch_declined",
    "prefetch_revoked", "shared_in_batch", "routed_elsewhere", "beyond_storage", "prefetch_lost")
MISS_COLUMNS: tuple[str, ...] = tuple(f"miss_{r}_tokens" for r in MISS_REASONS)
MISS_COLUMNS_V5 = MISS_COLUMNS[:9]  # the first nine (v5); v7 added the tenth, at the table's end

ADDED_COLUMNS: dict[int, dict[str, tuple[str, ...]]] = {
    3: {"requests": ("session_id", "think_ms", "trace_arrival_ns")},
    4: {
        "requests": ("dp_rank", "route_branch", "route_reason", "route_score", "route_score_name",
                     "arrival_device_tokens", "arrival_host_tokens", "best_rank", "best_rank_device_tokens",
                     "best_rank_host_tokens", "ranks_json"),
        "evictions": ("dp_rank",),
        "transfers": ("dp_rank",),
        "batches": ("dp_rank",),
        "pool_samples": ("dp_rank",),
    },
    5: {"requests": MISS_COLUMNS_V5},
    6: {"requests": ("decode_wait_ns", "retractions")},
    7: {"requests": ("miss_prefetch_lost_tokens",)},
}
OLDEST_READABLE_VERSION = 2

# Column name -> DuckDB type, in table order. Times are ns of *virtual* time unless the name
# says wall; sizes are tokens or bytes as the name says.
TABLES: dict[str, dict[str, str]] = {
    "meta": {
        "key": "VARCHAR",
        "value": "VARCHAR",
    },
    "runs": {
        "run_id": "VARCHAR",
        "name": "VARCHAR",
        "created_at": "TIMESTAMP",
        "finished_at": "TIMESTAMP",
        "status": "VARCHAR",  # running | complete | interrupted | failed
        "schema_version": "INTEGER",
        "tierdiag_version": "VARCHAR",
        "command_line": "VARCHAR",
        "pid": "INTEGER",
        "hostname": "VARCHAR",
        "trace_path": "VARCHAR",
        "trace_sha256": "VARCHAR",
        "config_json": "VARCHAR",
        "hardware_json": "VARCHAR",
        "data_plane_json": "VARCHAR",  # reduced-width data plane, scale factor, verify mode
        "timing": "VARCHAR",  # modelled | measured
        "num_requests": "BIGINT",
        "wall_s": "DOUBLE",
        "error": "VARCHAR",
        "kind": "VARCHAR",  # replay | observed (imported from a server's own per-request export)
        "sweep_id": "VARCHAR",  # NULL outside a sweep; one id for every run of a sweep / advise
    },
    # One row per request. Token split: device + host + storage + computed == input_tokens.
    # TTFT decomposition: queue + storage_wait + loadback_exposed + recompute + compute == ttft.
    "requests": {
        "run_id": "VARCHAR",
        "req_id": "VARCHAR",
        "seq": "BIGINT",  # order in the trace, 0-based
        "arrival_ns": "BIGINT",
        "input_tokens": "BIGINT",
        "output_tokens": "BIGINT",
        "status": "VARCHAR",  # finished | rejected
        "reject_reason": "VARCHAR",
        "hit_class": "VARCHAR",  # device_hit | tiered_hit | miss
        "device_hit_tokens": "BIGINT",
        "host_hit_tokens": "BIGINT",  # loaded back from host (used)
        "storage_hit_tokens": "BIGINT",  # fetched from storage, then loaded back (used)
        "computed_tokens": "BIGINT",
        "recomputed_tokens": "BIGINT",  # computed tokens that had been cached once
        "host_match_tokens": "BIGINT",  # host part found by match_prefix (incl. skipped)
        "storage_match_tokens": "BIGINT",  # storage part found (incl. not prefetched in time)
        "loadback_skipped_reason": "VARCHAR",  # NULL | below_threshold | device_full
        "loadback_skipped_tokens": "BIGINT",
        "storage_skipped_reason": "VARCHAR",  # NULL | below_threshold | prefetch_incomplete | host_full
        "prefix_indices_len": "BIGINT",
        "cache_protected_len": "BIGINT",
        "extend_input_len": "BIGINT",
        "queue_ns": "BIGINT",  # waiting + sharing a batch with others
        "storage_wait_ns": "BIGINT",  # held back waiting for a storage prefetch
        "loadback_ns": "BIGINT",  # this request's load-back transfer time (link busy)
        "loadback_exposed_ns": "BIGINT",  # part of it not hidden behind prefill compute
        "loadback_queued_ns": "BIGINT",  # waited behind other load-backs on the link
        "loadback_bytes": "BIGINT",  # modelled bytes (full model geometry)
        "loadback_pages": "BIGINT",
        "loadback_runs": "BIGINT",  # contiguous host-slot runs (fragmentation)
        "storage_bytes": "BIGINT",
        "storage_fetch_ns": "BIGINT",
        "recompute_ns": "BIGINT",
        "compute_ns": "BIGINT",
        "prefill_ns": "BIGINT",  # first batch start -> first token
        "ttft_ns": "BIGINT",
        "ideal_ttft_ns": "BIGINT",  # all reused tokens device-resident, no queueing
        "ttft_if_device_resident_ns": "BIGINT",
        "recompute_instead_ns": "BIGINT",  # modelled TTFT had the host/storage part been recomputed
        "first_batch_id": "BIGINT",
        "num_chunks": "BIGINT",
        "first_token_ns": "BIGINT",
        "finish_ns": "BIGINT",
        "session_id": "VARCHAR",  # the trace line's session (NULL: none)
        "think_ms": "DOUBLE",  # pause after the predecessor's answer (NULL: no predecessor)
        "trace_arrival_ns": "BIGINT",  # the trace's own arrival (x time_scale); arrival_ns is the replay's
        # v4, data-parallel ranks (docs/contract.md "Deployments"). dp_rank: the rank that served it
        # (0 in a one-rank replay; an import's export value, NULL where it has none). The rest are
        # NULL in a one-rank run: the router's decision, and the request's prefix as every rank's own
        # tree held it at arrival (a match with no side effect, before routing).
        "dp_rank": "INTEGER",
        "route_branch": "VARCHAR",  # the router's rule that decided (RouteDecision.branch)
        "route_reason": "VARCHAR",  # its one line
        "route_score": "DOUBLE",  # the deciding number (NULL where there is none)
        "route_score_name": "VARCHAR",  # what it measures ("approx match", "in flight")
        "arrival_device_tokens": "BIGINT",  # the prefix on this request's own rank at arrival: device
        "arrival_host_tokens": "BIGINT",  # ... and host only (not also on device)
        "best_rank": "INTEGER",  # the rank holding most of the prefix (device + host) at arrival; ties: own rank, else lowest
        "best_rank_device_tokens": "BIGINT",
        "best_rank_host_tokens": "BIGINT",
        "ranks_json": "VARCHAR",  # [{"rank","device_tokens","host_tokens","in_flight","score"}, ...] one per rank
        # v5: a finished request's computed tokens by why they were not reused (engine/miss.py,
        # DESIGN §7): one reason a token, summing to computed_tokens; NULL for rejected rows.
        **{col: "BIGINT" for col in MISS_COLUMNS_V5},
        "decode_wait_ns": "BIGINT",  # v6: of queue_ns, the GPU running decode steps (NULL: older runs, rejected)
        "retractions": "BIGINT",  # v6: times retracted for decode memory (retract_decode) and prefilled again
        # v7: the tenth miss reason, prefetch_lost (NULL: older runs, where beyond_storage held it)
        "miss_prefetch_lost_tokens": "BIGINT",
    },
    "evictions": {
        "run_id": "VARCHAR",
        "eviction_id": "BIGINT",
        "t_ns": "BIGINT",
        "tier": "VARCHAR",  # device | host | storage
        "node_id": "BIGINT",
        "tokens": "BIGINT",
        "action": "VARCHAR",  # demote | drop | delete
        "cause_req_id": "VARCHAR",  # whose allocation forced it
        "owner_req_id": "VARCHAR",  # last request that used the evicted pages
        "pool_used_tokens": "BIGINT",
        "pool_capacity_tokens": "BIGINT",
        "locked_tokens": "BIGINT",
        "node_hit_count": "BIGINT",
        "node_last_access_ns": "BIGINT",
        "dp_rank": "INTEGER",  # v4: the rank whose pool / link / GPU it was (0 in a one-rank run)
    },
    # Which requests later came back for pages an eviction had taken (request -> eviction).
    "request_evictions": {
        "run_id": "VARCHAR",
        "req_id": "VARCHAR",
        "eviction_id": "BIGINT",
        "tokens": "BIGINT",
    },
    "transfers": {
        "run_id": "VARCHAR",
        "transfer_id": "BIGINT",
        "t_start_ns": "BIGINT",
        "t_end_ns": "BIGINT",
        "kind": "VARCHAR",  # load_back | backup | prefetch | write_back | storage_write
        "req_id": "VARCHAR",
        "pages": "BIGINT",
        "runs": "BIGINT",
        "bytes": "BIGINT",  # modelled bytes
        "data_plane_bytes": "BIGINT",  # bytes the real kernel moved
        "queued_ns": "BIGINT",
        "wall_ns": "BIGINT",  # measured wall time of the real copy
        "verified": "BOOLEAN",
        "dp_rank": "INTEGER",  # v4: the rank whose pool / link / GPU it was (0 in a one-rank run)
    },
    "batches": {
        "run_id": "VARCHAR",
        "batch_id": "BIGINT",
        "t_start_ns": "BIGINT",
        "t_end_ns": "BIGINT",
        "num_reqs": "BIGINT",
        "extend_tokens": "BIGINT",
        "loadback_bytes": "BIGINT",
        "compute_ns": "BIGINT",
        "loadback_exposed_ns": "BIGINT",
        "num_decoding": "BIGINT",
        "recompute_ns": "BIGINT",  # of compute_ns: recomputing once-cached tokens
        "dp_rank": "INTEGER",  # v4: the rank whose pool / link / GPU it was (0 in a one-rank run)
    },
    "pool_samples": {
        "run_id": "VARCHAR",
        "t_ns": "BIGINT",
        "tier": "VARCHAR",
        "used_tokens": "BIGINT",
        "capacity_tokens": "BIGINT",
        "locked_tokens": "BIGINT",
        "dp_rank": "INTEGER",  # v4: the rank whose pool / link / GPU it was (0 in a one-rank run)
    },
}

# Tables with one row per event, written by the recorder in bulk.
EVENT_TABLES = ("requests", "evictions", "request_evictions", "transfers", "batches", "pool_samples")

# Tables a v2 store may lack: added later without changing what any other table means, so a
# store written before them is read as before (readers fall back to what the table would have
# saved them), and a writer creates them when it first needs them (CREATE TABLE IF NOT EXISTS).
OPTIONAL_TABLES: dict[str, dict[str, str]] = {
    # The run-wide evidence every reader would otherwise recompute from all of a run's rows
    # (run context, summary numbers, explain's run totals), written once when the run is closed
    # as complete or interrupted (tierdiag/diagnose/run/evidence.py). One row per run; a reader uses
    # it only when evidence_version is the code's EVIDENCE_VERSION, else computes it as before.
    "run_evidence": {
        "run_id": "VARCHAR",
        "evidence_version": "INTEGER",
        "created_at": "TIMESTAMP",
        "evidence_json": "VARCHAR",
    },
    # Each request's id by bucket (hash(req_id) % 4096), sorted by bucket, written with the run
    # evidence at the close: `explain REQ_ID` finds one request of a big run without comparing
    # every id (tierdiag/store/lookup.py). An index, never the truth: a reader that finds nothing
    # in it reads `requests` as before.
    "request_lookup": {
        "run_id": "VARCHAR",
        "bucket": "INTEGER",
        "req_id": "VARCHAR",
        "seq": "BIGINT",
    },
}


def columns_missing_in(version: int) -> dict[str, tuple[str, ...]]:
    """table -> the columns a store of schema `version` lacks (added by later versions)."""
    missing: dict[str, tuple[str, ...]] = {}
    for v, tables in sorted(ADDED_COLUMNS.items()):
        if v > version:
            for table, cols in tables.items():
                missing[table] = missing.get(table, ()) + cols
    return missing


def create_table_sql(name: str, cols: dict[str, str]) -> str:
    return f"CREATE TABLE IF NOT EXISTS {name} (" + ", ".join(f"{col} {typ}" for col, typ in cols.items()) + ")"


def create_statements() -> list[str]:
    return [create_table_sql(name, cols) for name, cols in {**TABLES, **OPTIONAL_TABLES}.items()]
