"""The cached prefix's split by tier, as each SGLang release reports it (rules.RuleSet's
`split_cached_prefix`, read once a finished request by RequestRecords.rules_split): plain int
arithmetic, compiled with the engine core (compiled.MODULES). In rules.py, which is not
compiled, each was an interpreted function of up to 9 builtin min/max calls: ~13k instructions
a request's record, with a probe or without (issue 41). Comparisons, not min/max: compiled,
those builtins are generic calls (docs/engine.md). The Python source is its twin."""

from __future__ import annotations


def _min(a: int, b: int) -> int:
    return a if a <= b else b


def _max(a: int, b: int) -> int:
    return a if a >= b else b


def split_promised(prefix: int, device: int, host_hit: int, host_loaded: int, storage_hit: int,
                   storage_start: int, span: int, span_start: int) -> tuple[int, int, int]:
    """SGLang 0.5.9 (`ScheduleBatch.prepare_for_extend`, cached-token breakdown): host =
    `host_hit_length`, the hit *promised* at match, loaded or not (storage pages counted in it);
    device = len(prefix_indices) - host_hit_length, at least 0. A declined load-back therefore
    counts its recomputed tokens as host (and takes them off the device part)."""
    storage = _min(host_hit, storage_hit)
    return _max(0, prefix - host_hit), host_hit - storage, storage


def split_by_tier(prefix: int, device: int, host_hit: int, host_loaded: int, storage_hit: int,
                  storage_start: int, span: int, span_start: int) -> tuple[int, int, int]:
    """SGLang 0.5.20+ `schedule_batch.split_cached_prefix_by_tier`: host = min(host_hit_length,
    host_loaded_length) capped at the prefix; storage by position, [storage_hit_start, +len) within
    [0, prefix_len); device = prefix - host - storage. The storage span is the one the request's
    prefetch put into the tree (`pop_prefetch_loaded_span` -> `req.storage_hit_length`,
    `storage_hit_start`: `span`, `span_start`), all of it, pages another request's prefill or
    load-back put on device before this admission included (those are storage, not device);
    the part of the host hit it covers is not host.

        prefix  |---- device ----|------ host (materialized) ------|
                       |------ storage (the prefetched span) ------|
    """
    host_total = _min(prefix, _min(host_hit, host_loaded))
    host_start = prefix - host_total
    storage_start, storage_hit = span_start, span
    storage_end = storage_start + storage_hit
    storage = _max(0, _min(prefix, storage_end) - _max(0, storage_start))
    storage_in_host = _max(0, _min(prefix, storage_end) - _max(host_start, storage_start))
    host = host_total - storage_in_host
    return prefix - host - storage, host, storage
