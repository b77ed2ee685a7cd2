"""The rule functions the engine calls per eviction and per finished request: rules.py's RuleSet
fields `eviction_amount` and `split_cached_prefix` (rules.py names them; this module imports
nothing). Here, compiled (engine/compiled.py's MODULES), not in rules.py, which is interpreted:
there one split of a request's cached prefix took ~12k instructions of min/max calls (callgrind,
issue 41); compiled, the RuleSet field holds a native function, called as before."""

from __future__ import annotations


def _evict_whole_need(free_pages: int, need_pages: int) -> int:
    """SGLang 0.5.9: `common.evict_from_tree_cache` evicts `num_tokens` (the whole need) when the
    allocator has fewer free; `HiRadixCache.load_back` evicts the whole load when
    `cache_controller.load` fails, `write_backup` the node's whole host room (`evict_host`)."""
    return need_pages if free_pages < need_pages else 0


def _evict_shortfall(free_pages: int, need_pages: int) -> int:
    """SGLang 0.5.23: `allocator.evict_to_free_tokens` -> `evict_for_alloc(shortfall)`,
    `_load_back_transfers` -> `evict_for_alloc`, `drive_host_eviction`: only what is missing."""
    return max(0, need_pages - free_pages)


def _split_promised(prefix: int, device: int, host_hit: int, host_loaded: int, storage_hit: int,
                    storage_start: int, span: int, span_start: int) -> tuple[int, int, int]:
    """SGLang 0.5.9 (`ScheduleBatch.prepare_for_extend`, cached-token breakdown): host =
    `host_hit_length`, the hit *promised* at match, loaded or not (storage pages counted in it);
    device = len(prefix_indices) - host_hit_length, at least 0. A declined load-back therefore
    counts its recomputed tokens as host (and takes them off the device part)."""
    storage = min(host_hit, storage_hit)
    return max(0, prefix - host_hit), host_hit - storage, storage


def _split_by_tier(prefix: int, device: int, host_hit: int, host_loaded: int, storage_hit: int,
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
    host_total = min(prefix, min(host_hit, host_loaded))
    host_start = prefix - host_total
    storage_start, storage_hit = span_start, span
    storage_end = storage_start + storage_hit
    storage = max(0, min(prefix, storage_end) - max(0, storage_start))
    storage_in_host = max(0, min(prefix, storage_end) - max(host_start, storage_start))
    host = host_total - storage_in_host
    return prefix - host - storage, host, storage
