"""The SGLang rule sets: every rule in which the engine's SGLang releases differ, one object per
release (`RULE_SETS`, chosen by `EngineConfig.sglang_rules`). The tree, the controller, the
scheduler and the prefetch read their rule from here and never ask which version runs.

Each field names the SGLang function it restates; tests/engine/test_sglang_conformance.py
narrates each one and tests/sglang drives SGLang's own code beside the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import lru_cache
from typing import Callable

from tierdiag.config.releases import (NOT_RULES, RULE_NAMES, SGLANG_HOST_LAYOUT, SGLANG_MAX_RUNNING_CAPPED_BY_POOL,
                                      SGLANG_PREFETCH_POLICY,
                                      release_before, switched_back_names)
# The rule functions the engine calls per eviction and per finished request live in compiled
# modules: interpreted, one split of a request's cached prefix took ~12-13k instructions of min/max
# calls (callgrind, issue 41). The eviction amount in rule_functions.py; the cached prefix's split
# by tier (0.5.9: the promised host hit; 0.5.20+: by tier) in cached_split.py. Named here as before.
from tierdiag.engine.cached_split import split_by_tier, split_promised
from tierdiag.engine.rule_functions import _evict_shortfall, _evict_whole_need


@dataclass(frozen=True)
class ExplainVocabulary:
    """The request fields of the release, as `explain` names them (its steps say which it uses)."""
    prefix: str  # the matched prefix the request starts from
    host_hit: str  # what the host tier holds of it
    match_node: str  # the node the host part hangs from
    protected: str  # the prefix the tree protects for the request


@dataclass(frozen=True)
class RuleSet:
    """The cache rules of one SGLang release, one field a rule (RULES below: each release's)."""

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
    # UnifiedTreeCore.insert_host (0.5.23, a storage read's pages going into the tree): under a
    # non-write-back policy a node on the read's path that is on device without a host copy
    # takes the read's pages as its host copy (`full_data.host_value = matched_host_value`), and
    # `InsertResult.prefix_len` is `host_prefix_len` (the pages whose nodes already had one): the
    # refilled pages count as loaded from storage (`prefetch_loaded_tokens_by_reqid`). 0.5.9's
    # `_insert_helper_host` refills nothing and counts every matched page as already there.
    insert_host_refills_host: bool
    # --- the controller (CacheController) ---
    # pages to evict for `need` with `free` free (device and host alike)
    eviction_amount: Callable[[int, int], int]
    # UnifiedTreeCore._reclaim_full_host_duplicates (0.5.23, write_back only): host pressure first
    # frees host copies of nodes also on device, in registration order.
    reclaim_host_duplicates: bool
    # A write_back device eviction whose node found no host room for its write-back: 0.5.9's
    # `HiRadixCache.evict` asserts it backed up (the engine drops the node and the host-only
    # nodes below it). 0.5.23 `UnifiedTreeCore.drop_subtree_no_host` drops that subtree only when
    # nothing in it is pinned (a lock, a host lock: a prefetch's anchor or a storage write's host
    # copy, a load-back pending); else the node stays on device and the walk goes on.
    write_back_drop_spares_pinned: bool
    # --- the scheduler ---
    # alloc_paged_token_slots_extend (both): the allocation's eviction asks for a page a request
    # more than the extend (`conservative_num_tokens`); the page is not allocated.
    alloc_overhead_pages: int
    # alloc_paged_token_slots_extend (0.5.23) evicts once for the whole batch, its extend plus a
    # page a request (`conservative_num_tokens`, the shortfall of it): after the batch's
    # allocation a page a request is free when anything was evicted. The engine allocates
    # request by request (each evicting for its extend and a page); with this rule it then evicts
    # for the rest of those pages. 0.5.9 (whole-need eviction) keeps the per-request one.
    batch_alloc_page_per_request: bool
    # PrefillAdder.add_one_req (0.5.23): `per_req_token_overhead`, one page, in total_tokens, and
    # `_update_prefill_budget` -> `PrefillBudget.reserve` keeps it reserved (`total_offset`) for
    # the rest of the batch: the k-th request admitted in a batch finds the pages of the k - 1
    # before it taken too. The compute budget (`rem_input_tokens`, `rem_chunk_tokens`) is charged
    # the page-ceiled extend only, never the overhead. 0.5.9 has none.
    admission_overhead_pages: int
    # PrefillAdder._select_prefill_admission (0.5.23): with chunked prefill on, a request after
    # the first that does not fit what is left of the batch budget is chunked into it (the chunk
    # shape chosen assuming the host hit loads; re-selected as recompute when nothing loaded).
    # 0.5.9's add_one_req returns OTHER for it (`real_input_tokens >= rem_input_tokens` with a
    # request already in the batch): it waits for the next batch.
    chunk_later_requests: bool
    # --- hits and write-through ---
    # 0.5.23 `_finish_insert_walk_node` / `_should_backup_after_insert`: every insert, a chunk's
    # included, counts a hit on each node ending past `req.kv.cache_inserted_len` (what this
    # request's earlier inserts covered), so a backup can start at every prefill chunk. 0.5.9
    # `_inc_hit_count(node, chunked)`: chunk inserts count nothing, every other insert counts its
    # whole path.
    hits_past_inserted: bool
    # `UnifiedRadixCache.checkpoint_into_tree` (0.5.23): after a finished request's insert of
    # input + output, its prompt (page-aligned `origin_input_ids`) is inserted a second time at
    # `priority + 1`, with `prev_prefix_len` = `inserted_len` = the prompt ("split the leaf at the
    # prompt boundary so eviction can drop the output KV without the prompt"): no duplicate is
    # freed and no hit counted, but the walk stamps the prompt's nodes again and raises their
    # priority. 0.5.9's `RadixCache.cache_finished_req` inserts once.
    finish_reinserts_prompt: bool
    # When a write-through backup's copy starts and when its node unlocks. 0.5.23
    # (`UnifiedRadixCache._execute_kv_backup`: `cache_controller.write(..., flush=False)`) queues
    # it; `flush_pending_backups` submits the queue at the end of the batch's result processing
    # (`Scheduler.process_batch_result`) or at the next pass's `writing_check`, as ONE copy
    # (`CacheOperation.merge_ops`) with one ack: every node in it stays locked until the whole copy
    # ends. A chunk's backup, queued by `stash_chunked_request` at a pass's start, waits for the end
    # of the batch that pass runs. 0.5.9 (`CacheController.write` -> `start_writing`): each node's
    # copy starts at its insert and is acknowledged alone.
    backups_flush_per_batch: bool
    # A write-through backup of a node whose ancestors are not all on host: 0.5.9 backs up the
    # node alone (`HiRadixCache.write_backup`); 0.5.23 chains the ancestors not backed up, root
    # side first (`UnifiedTreeCore._build_backup_kv_action`: "Ancestors first to preserve backup
    # invariant"), and stops at the first that finds no host room
    # (`UnifiedRadixCache._execute_and_commit_kv_backup`). An ancestor is left unbacked when its
    # own backup found the host full; its next counted insert (a finish's) retries it first.
    backup_chains_ancestors: bool
    # ScheduleBatch.retract_decode, the last running request out of memory even alone: 0.5.23
    # aborts it (FINISH_ABORT "Out of memory even after retracting all other requests"); 0.5.9
    # raises ValueError there (the scheduler dies). The engine records it rejected either way;
    # the reason says which.
    decode_oom_aborts: bool
    # --- the queue ---
    # `_sort_by_longest_prefix` ranks by `num_matched_prefix_tokens` = min(device + host hit,
    # input - 1) (0.5.23, `common.match_kv_cache`); 0.5.9 by `len(prefix_indices)`, device only.
    lpm_counts_host_hit: bool
    # `SchedulePolicy._touch_waiting_prefixes` (0.5.23, `SGLANG_ENABLE_WAITING_PREFIX_REFRESH`, on
    # by default): every `WAITING_PREFIX_REFRESH_INTERVAL`-th (32) `calc_priority` that gets past
    # its conditions (a cache-agnostic active policy, a non-empty queue, `lru` eviction) walks
    # the cached prefix of the first `WAITING_QUEUE_PREFIX_MATCH_MAX` (128) waiting requests,
    # head last (`touch_waiting_prefix` -> `touch_prefix`: a match, stamps only). 0: none (0.5.9).
    waiting_prefix_refresh_interval: int
    waiting_prefix_refresh_max: int
    # --- the running-requests cap (`max_running_requests`) ---
    # An explicit cap above half the device pool: 0.5.23 `resolve_max_num_reqs` lowers it to
    # token_capacity // 2; 0.5.9 keeps it. Read by the config (EngineConfig.
    # resolved_max_running_requests; config.releases.SGLANG_MAX_RUNNING_CAPPED_BY_POOL).
    max_running_capped_by_pool: bool
    # Where `get_new_batch_prefill` tests it (`get_num_allocatable_reqs`: the cap less the
    # running batch). 0.5.23 `_get_new_batch_prefill_raw`: none allocatable and no chunked
    # request -> `batch_is_full`, return before `calc_priority`; in the loop, after the budget's
    # `budget_state() == OTHER` break, `len(can_run_list) >= allocatable` -> `batch_is_full`,
    # break. 0.5.9 `get_new_batch_prefill`: its early return tests `chunked_req is not None`
    # (which cannot meet a full cap: the chunked request's row counts in the cap it was admitted
    # under), so `calc_priority` runs and the loop's first request shuts admission; the loop
    # tests the cap first, before the budget.
    max_running_check_returns_early: bool
    # (prefix, device, host_hit, host_loaded, storage_hit, storage_start, prefetched span,
    # its start) -> (device, host, storage): storage_hit is the part of the host hit this request's
    # prefetch brought (0.5.9's `min(host_hit, storage_hit)`), the span all its prefetch put in
    # the tree (0.5.23's by position)
    split_cached_prefix: Callable[[int, int, int, int, int, int, int, int], tuple[int, int, int]]
    # --- the storage prefetch ---
    # HiCacheController.prefetch_rate_limited: tokens in flight at most share x (host - device)
    # (0.5.9) or share x host (0.5.23, `_start_storage_prefetch_wait`'s capacity).
    prefetch_capacity_share: float
    prefetch_capacity_of_host_minus_device: bool
    # Scheduler._prefetch_kvcache: whose host copy gates a prefetch (the root always passes).
    # 0.5.9: `req.last_node.backuped`, the last device node. 0.5.23: `is_backuped(last_host_node)
    # or is_root(last_host_node)`, where last_host_node is `best_match_node` (the deepest node on
    # device or backed up, `_match_post_processor`).
    prefetch_gate_on_best_match: bool
    # Where host memory comes from. 0.5.9 `HiRadixCache.prefetch_from_storage`: room for the whole
    # requested span before the query (none: no prefetch), non-hits released after it. 0.5.23
    # `_try_alloc_storage_hit` -> `allocate_storage_hit(allow_partial=True,
    # min_tokens=prefetch_threshold)`: only the hit, after the query; what fits when the whole hit
    # does not, kept when at least the threshold. The requested span then ends at the longest
    # prefix (`_compute_max_prefix_len`: input - 1) rather than the input's last full page.
    prefetch_alloc_hit_only: bool
    # `hicache_storage_prefetch_policy` when the config sets none: best_effort (0.5.9),
    # timeout (0.5.23, arg_groups/fields/memory.py). Named in config.releases.SGLANG_PREFETCH_POLICY.
    prefetch_policy_default: str
    # The `timeout` policy's clock. 0.5.9 (engine as it was): from the prefetch's start, on the
    # hit. 0.5.23 `_start_storage_prefetch_wait`: from the first admission poll that finds the
    # prefetch running (`check_prefetch_progress` -> not `_can_terminate_prefetch`), on the
    # requested span (`stats_requested_tokens`); `prefetch_timeout_base` 1 s + 0.25 s
    # (`prefetch_timeout_per_ki_token`) per 1024 tokens, no cap.
    prefetch_timer_at_first_poll: bool
    # `StoragePrefetchRetries` (0.5.23; 0.5.9 has none): a storage miss (hit below the threshold),
    # a rate-limited decline or a hit the host cannot take (`poll_miss`) is queried again after
    # `hicache_storage_prefetch_retry_poll_interval` (8) scheduling passes, at most
    # `hicache_storage_prefetch_retry_max_attempts` (8) times (`_process_storage_prefetch_retries`).
    prefetch_retry_interval_passes: int
    prefetch_retry_max_attempts: int
    # 0.5.23 `prefetch_from_storage(storage_hit_end=...)`: a hit the host could not take
    # (`_try_alloc_storage_hit`: `poll_miss(rid, storage_start + storage_hit_count)`) is re-queried
    # for the span up to where that hit ended, assumed stored (`assume_stored`: the existence query
    # is skipped, `_storage_hit_query`) when it still lies past the new match. 0.5.9: no re-query.
    prefetch_assume_stored: bool
    # When a prefetch's read is seen. 0.5.23: `_drain_storage_control_queues_impl` takes the
    # read acks it counted (`_sync_hicache_ready_counts`) before it allocates host memory for
    # the hits and queues their reads (`_drain_and_alloc_storage_hit` -> `prefetch_buffer`), and
    # `operation.completed_tokens` only moves as acks are drained (`_drain_ack_prefetch`): a
    # read is seen, at the earliest, at the scheduling pass after the one whose drain allocated
    # its hit, the pass after its query (at arrival: the first pass after it). Until then
    # `check_prefetch_progress` finds it running (held under wait_complete / timeout; under
    # best_effort it ends with nothing read). Storage writes the same way: a node's write to
    # storage starts when its host copy is acknowledged (`writing_check` ->
    # `_finish_write_through_ack` -> `write_backup_storage`), which holds the node's host copy
    # (`inc_host_lock_ref`) until the write's ack is drained (`_drain_backup`) at the pass after.
    # 0.5.9 (engine as it was): reads on their time only, writes at the backup, no host lock.
    storage_acks_per_pass: bool
    # --- the host pool ---
    # `hicache_mem_layout` default: layer_first (0.5.9 server_args), page_first (0.5.23
    # arg_groups/fields/memory.py). Recorded in the run's config (`host_layout`); what it changes
    # in the transfer model: nothing (docs/engine.md, "The host layout").
    host_layout: str
    vocabulary: ExplainVocabulary
    doc: str

    def prefetch_room_tokens(self, host_tokens: int, device_tokens: int) -> int:
        """Tokens prefetches in flight may hold (`prefetch_rate_limited`): 0.8 x (host - device)
        in 0.5.9, 0.5 x host in 0.5.23."""
        pool = host_tokens - device_tokens if self.prefetch_capacity_of_host_minus_device else host_tokens
        return max(0, int(self.prefetch_capacity_share * pool))


RULE_SETS: dict[str, RuleSet] = {r.version: r for r in (
    RuleSet(
        version="0.5.23",
        split_upper_created_at_split=False,
        insert_priority_before_split=False,
        stamp_path_after_walk=True,
        unevict_counts_hit=True,
        insert_host_refills_host=True,
        eviction_amount=_evict_shortfall,
        reclaim_host_duplicates=True,
        write_back_drop_spares_pinned=True,
        alloc_overhead_pages=1,
        admission_overhead_pages=1,
        batch_alloc_page_per_request=True,
        chunk_later_requests=True,
        hits_past_inserted=True,
        finish_reinserts_prompt=True,
        backups_flush_per_batch=True,
        backup_chains_ancestors=True,
        decode_oom_aborts=True,
        lpm_counts_host_hit=True,
        waiting_prefix_refresh_interval=32,
        waiting_prefix_refresh_max=128,
        split_cached_prefix=split_by_tier,
        prefetch_capacity_share=0.5,
        prefetch_capacity_of_host_minus_device=False,
        prefetch_gate_on_best_match=True,
        prefetch_alloc_hit_only=True,
        prefetch_policy_default=SGLANG_PREFETCH_POLICY["0.5.23"],
        prefetch_timer_at_first_poll=True,
        prefetch_retry_interval_passes=8,
        prefetch_retry_max_attempts=8,
        prefetch_assume_stored=True,
        storage_acks_per_pass=True,
        host_layout=SGLANG_HOST_LAYOUT["0.5.23"],
        max_running_capped_by_pool=SGLANG_MAX_RUNNING_CAPPED_BY_POOL["0.5.23"],
        max_running_check_returns_early=True,
        vocabulary=ExplainVocabulary("prefix_len", "host_loaded_length", "best_match_node", "kv.cache_protected_len"),
        doc="SGLang 0.5.23 (October): UnifiedRadixCache on the unified tree core",
    ),
    RuleSet(
        version="0.5.9",
        split_upper_created_at_split=True,
        insert_priority_before_split=True,
        stamp_path_after_walk=False,
        unevict_counts_hit=False,
        insert_host_refills_host=False,
        eviction_amount=_evict_whole_need,
        reclaim_host_duplicates=False,
        write_back_drop_spares_pinned=False,
        alloc_overhead_pages=1,
        admission_overhead_pages=0,
        batch_alloc_page_per_request=False,
        chunk_later_requests=False,
        hits_past_inserted=False,
        finish_reinserts_prompt=False,
        backups_flush_per_batch=False,
        backup_chains_ancestors=False,
        decode_oom_aborts=False,
        lpm_counts_host_hit=False,
        waiting_prefix_refresh_interval=0,
        waiting_prefix_refresh_max=0,
        split_cached_prefix=split_promised,
        prefetch_capacity_share=0.8,
        prefetch_capacity_of_host_minus_device=True,
        prefetch_gate_on_best_match=False,
        prefetch_alloc_hit_only=False,
        prefetch_policy_default=SGLANG_PREFETCH_POLICY["0.5.9"],
        prefetch_timer_at_first_poll=False,
        prefetch_retry_interval_passes=0,
        prefetch_retry_max_attempts=0,
        prefetch_assume_stored=False,
        storage_acks_per_pass=False,
        host_layout=SGLANG_HOST_LAYOUT["0.5.9"],
        max_running_capped_by_pool=SGLANG_MAX_RUNNING_CAPPED_BY_POOL["0.5.9"],
        max_running_check_returns_early=False,
        vocabulary=ExplainVocabulary("prefix_indices", "host_hit_length", "last_host_node", "cache_protected_len"),
        doc="SGLang 0.5.9 (February): HiRadixCache",
    ),
)}

# One rule set a name of config/releases.py RELEASES (tests/test_registries.py checks both ways).


def rule_set(version: str) -> RuleSet:
    return RULE_SETS[version]  # EngineConfig has checked the name


def config_rules(cfg) -> RuleSet:
    """The rule set a config's replay follows: its release's, with the rules it names in
    `sglang_switched_back` taken from the release before (`replay --sglang OLD,NEW`)."""
    return switched_back(cfg.sglang_rules, switched_back_names(cfg.sglang_switched_back))


@lru_cache(maxsize=None)
def switched_back(version: str, names: tuple[str, ...]) -> RuleSet:
    """`version`'s rule set with each named rule's fields (config/releases.py RULE_NAMES) from
    the release before it; `version` and its explain vocabulary stay the newer release's."""
    base = RULE_SETS[version]
    if not names:
        return base
    before = RULE_SETS[release_before(version)]
    return replace(base, **{f: getattr(before, f) for n in names for f in RULE_NAMES[n].fields})


def differing_rules(a: str, b: str) -> tuple[str, ...]:
    """The named rules (config/releases.py RULE_NAMES order) in which releases `a` and `b` differ."""
    differ = set(differing_fields(a, b))
    return tuple(n for n, r in RULE_NAMES.items() if differ & set(r.fields))


def unnamed_fields(a: str, b: str) -> tuple[str, ...]:
    """Fields in which `a` and `b` differ that no rule name covers: no run can isolate them."""
    named = {f for r in RULE_NAMES.values() for f in r.fields}
    return tuple(f for f in differing_fields(a, b) if f not in named)


def differing_fields(a: str, b: str) -> tuple[str, ...]:
    """The RuleSet fields (rules, not names or words) in which releases `a` and `b` differ."""
    ra, rb = RULE_SETS[a], RULE_SETS[b]
    return tuple(f.name for f in fields(RuleSet)
                 if f.name not in NOT_RULES and getattr(ra, f.name) != getattr(rb, f.name))


# A replay recorded before rule sets existed has no `sglang_rules` in its config: the engine
# followed SGLang 0.5.9 then (docs/contract.md).
UNRECORDED_RULES = "0.5.9"


def recorded_rules(config: dict) -> str:
    """The SGLang release whose rules a replay followed, from its recorded config."""
    version = config.get("sglang_rules")
    return str(version) if version else UNRECORDED_RULES
