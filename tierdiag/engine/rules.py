"""The SGLang rule sets: every rule in which the engine's SGLang releases differ, one object per
release (`RULE_SETS`, chosen by `EngineConfig.sglang_rules`). The tree, the controller, the
scheduler and the prefetch read their rule from here and never ask which version runs.

Each field names the SGLang function it restates; tests/engine/test_sglang_conformance.py
narrates each one and tests/sglang drives SGLang's own code beside the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from tierdiag.config.engine import SGLANG_RULES


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
                    storage_start: int) -> tuple[int, int, int]:
    """SGLang 0.5.9 (`ScheduleBatch.prepare_for_extend`, cached-token breakdown): host =
    `host_hit_length`, the hit *promised* at match, loaded or not (storage pages counted in it);
    device = len(prefix_indices) - host_hit_length, at least 0. A declined load-back therefore
    counts its recomputed tokens as host (and takes them off the device part)."""
    storage = min(host_hit, storage_hit)
    return max(0, prefix - host_hit), host_hit - storage, storage


def _split_by_tier(prefix: int, device: int, host_hit: int, host_loaded: int, storage_hit: int,
                   storage_start: int) -> tuple[int, int, int]:
    """SGLang 0.5.20+ `schedule_batch.split_cached_prefix_by_tier`: host = min(host_hit_length,
    host_loaded_length) capped at the prefix; storage by position, [storage_hit_start, +len) within
    [0, prefix_len); device = prefix - host - storage.

        prefix  |---- device ----|------ host (materialized) ------|
                                 |   |-- storage (by position) --| |
    """
    host_total = min(prefix, min(host_hit, host_loaded))
    host_start = prefix - host_total
    storage_end = storage_start + storage_hit
    storage = max(0, min(prefix, storage_end) - max(0, storage_start))
    storage_in_host = max(0, min(prefix, storage_end) - max(host_start, storage_start))
    host = host_total - storage_in_host
    return prefix - host - storage, host, storage


@dataclass(frozen=True)
class ExplainVocabulary:
    """The request fields of the release, as `explain` names them (its steps say which it uses)."""
    prefix: str  # the matched prefix the request starts from
    host_hit: str  # what the host tier holds of it
    match_node: str  # the node the host part hangs from
    protected: str  # the prefix the tree protects for the request


@dataclass(frozen=True)
class RuleSet:
    version: str
    # --- the tree (RadixTree) ---
    # HiRadixCache._split_node (0.5.9) makes the upper half a new TreeNode: created at the split.
    # UnifiedTreeCore._split_node (0.5.23) keeps the node's creation time on the upper half.
    split_upper_created_at_split: bool
    # HiRadixCache.insert (0.5.9) raises `priority` before `_split_node`: the lower half gets it
    # too; _insert_walk_step (0.5.23) sets it on the upper half after the split.
    insert_priority_before_split: bool
    # The order of access stamps within an instant. 0.5.9 stamps each node as the match or insert
    # walks it, a split's lower half before the new upper one. 0.5.23's match stamps split lower
    # halves during the walk and the best-match path after it, deepest newest
    # (`_match_post_processor`); its insert stamps a split's lower half after the upper one.
    stamp_path_after_walk: bool
    # UnifiedTreeCore._insert_walk_step -> _unevict_node_on_insert, then
    # _finish_insert_walk_node (0.5.23): a host-only node the insert refills counts a hit.
    unevict_counts_hit: bool
    # --- the controller (CacheController) ---
    # pages to evict for `need` with `free` free (device and host alike)
    eviction_amount: Callable[[int, int], int]
    # UnifiedTreeCore._reclaim_full_host_duplicates (0.5.23, write_back only): host pressure first
    # frees host copies of nodes also on device, in registration order.
    reclaim_host_duplicates: bool
    # --- the scheduler ---
    # alloc_paged_token_slots_extend (both): the allocation's eviction asks for a page a request
    # more than the extend (`conservative_num_tokens`); the page is not allocated.
    alloc_overhead_pages: int
    # PrefillAdder.add_one_req (0.5.23): `per_req_token_overhead`, one page, in total_tokens.
    admission_overhead_pages: int
    # (prefix, device, host_hit, host_loaded, storage_hit, storage_start) -> (device, host, storage)
    split_cached_prefix: Callable[[int, int, int, int, int, int], tuple[int, int, int]]
    # --- the storage prefetch ---
    # HiCacheController.prefetch_rate_limited: tokens in flight at most share x (host - device)
    # (0.5.9) or share x host (0.5.23, `_start_storage_prefetch_wait`'s capacity).
    prefetch_capacity_share: float
    prefetch_capacity_of_host_minus_device: bool
    vocabulary: ExplainVocabulary
    doc: str


RULE_SETS: dict[str, RuleSet] = {r.version: r for r in (
    RuleSet(
        version="0.5.23",
        split_upper_created_at_split=False,
        insert_priority_before_split=False,
        stamp_path_after_walk=True,
        unevict_counts_hit=True,
        eviction_amount=_evict_shortfall,
        reclaim_host_duplicates=True,
        alloc_overhead_pages=1,
        admission_overhead_pages=1,
        split_cached_prefix=_split_by_tier,
        prefetch_capacity_share=0.5,
        prefetch_capacity_of_host_minus_device=False,
        vocabulary=ExplainVocabulary("prefix_len", "host_loaded_length", "best_match_node", "kv.cache_protected_len"),
        doc="SGLang 0.5.23 (October): UnifiedRadixCache on the unified tree core",
    ),
    RuleSet(
        version="0.5.9",
        split_upper_created_at_split=True,
        insert_priority_before_split=True,
        stamp_path_after_walk=False,
        unevict_counts_hit=False,
        eviction_amount=_evict_whole_need,
        reclaim_host_duplicates=False,
        alloc_overhead_pages=1,
        admission_overhead_pages=0,
        split_cached_prefix=_split_promised,
        prefetch_capacity_share=0.8,
        prefetch_capacity_of_host_minus_device=True,
        vocabulary=ExplainVocabulary("prefix_indices", "host_hit_length", "last_host_node", "cache_protected_len"),
        doc="SGLang 0.5.9 (February): HiRadixCache",
    ),
)}

assert tuple(RULE_SETS) == SGLANG_RULES, "config.engine.SGLANG_RULES names the rule sets, in this order"


def rule_set(version: str) -> RuleSet:
    return RULE_SETS[version]  # EngineConfig has checked the name


# A replay recorded before rule sets existed has no `sglang_rules` in its config: the engine
# followed SGLang 0.5.9 then (docs/contract.md).
UNRECORDED_RULES = "0.5.9"


def recorded_rules(config: dict) -> str:
    """The SGLang release whose rules a replay followed, from its recorded config."""
    version = config.get("sglang_rules")
    return str(version) if version else UNRECORDED_RULES
