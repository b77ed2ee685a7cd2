"""The rule function the engine calls per eviction: rules.py's RuleSet field `eviction_amount`
(rules.py names it; this module imports nothing). Here, compiled (engine/compiled.py's MODULES),
not in rules.py, which is interpreted; compiled, the RuleSet field holds a native function, called
as before. The cached prefix's split (`split_cached_prefix`) is compiled in cached_split.py."""

from __future__ import annotations


def _evict_whole_need(free_pages: int, need_pages: int) -> int:
    """SGLang 0.5.9: `common.evict_from_tree_cache` evicts `num_tokens` (the whole need) when the
    allocator has fewer free; `HiRadixCache.load_back` evicts the whole load when
    `cache_controller.load` fails, `write_backup` the node's whole host room (`evict_host`)."""
    return need_pages if free_pages < need_pages else 0


def _evict_shortfall(free_pages: int, need_pages: int) -> int:
    """SGLang 0.5.23: `allocator.evict_to_free_tokens` -> `evict_for_alloc(shortfall)`,
    `_load_back_transfers` -> `evict_for_alloc`, `drive_host_eviction`: only what is missing."""
    short = need_pages - free_pages
    return short if short > 0 else 0  # a comparison: compiled, builtin max is a generic call
