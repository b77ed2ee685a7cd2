"""The engine against SGLang 0.5.9 HiCache, rule by rule (issue 10).

Each test restates one behaviour of SGLang 0.5.9 as a narrated scenario: requests go in, and
after each step (admitted, prefilled, finished, a batch) the test asserts match lengths,
residency, locks, hit counts, backups, skip reasons and cache_protected_len. Each docstring
names the SGLang file and function it restates (sglang/srt/...). Where a later release changed
the rule, the docstring says so; the engine follows 0.5.9.

Pools: device 16 pages, host 64 pages of 64 tokens unless a test says otherwise; with block
size 64, a request's page keys are its hash ids (tests.engine.helpers.req adds one extra token,
a partial page that is never matched). State tuples are helpers.path_state's:
(pages, tiers, lock_ref, hit_count, host_ref) per node along a key path.
"""

from __future__ import annotations

import pytest

from tests.engine import helpers
from tests.engine.helpers import PS, req
from tests.support.cli import completed_in_process

# These tests narrate SGLang 0.5.9's rules and pin them on purpose (--sglang 0.5.9); 0.5.23's
# rules are narrated in tests/engine/test_sglang_0523_conformance.py.
RULES = "0.5.9"


def small_config(**kw):
    """0.5.9's rules; an eviction policy 0.5.9 does not have (slru, tlru: 0.5.23's, refused under
    --sglang 0.5.9, issue 39 item 7) runs under the release that has it."""
    rules = RULES if kw.get("eviction_policy", "lru") in RELEASE_OFFERS[RULES]["eviction_policy"] else "0.5.23"
    return helpers.small_config(**{"sglang_rules": rules, **kw})


def run(requests, cfg=None, **kw):
    return helpers.run(requests, cfg or small_config(**kw))


def watch(requests, paths, cfg=None, *, hooks=None, **kw):
    return helpers.watch(requests, paths, cfg or small_config(**kw), hooks=hooks)
from tierdiag.config.engine import EVICTION_POLICIES, RELEASE_OFFERS, EngineConfig
from tierdiag.errors import ConfigError
from tierdiag.trace.pages import output_page_keys, page_keys


def pages(lo: int, n: int) -> list[int]:
    return list(range(lo, lo + n))


def tiers(state) -> dict[str, int]:
    """Pages by residency along a path_state."""
    out: dict[str, int] = {}
    for n, tier, *_ in state:
        out[tier] = out.get(tier, 0) + n
    return out


def flood(start_ms: float, n: int = 3, size: int = 8) -> list:
    """n requests of fresh pages, 100 ms apart: each fills about half the device pool."""
    return [req(f"f{i}", start_ms + 100 * i, pages(1000 + 100 * i, size)) for i in range(n)]


# --- 1. when KV enters the tree ---------------------------------------------------------------
def test_kv_enters_the_tree_after_prefill_and_again_at_finish_with_output_pages():
    """scheduler_output_processor_mixin.py `process_batch_result_prefill` calls
    `RadixCache.cache_unfinished_req` after a request's last prefill chunk, so a request arriving
    while the first one decodes matches its prefix on device; `release_kv_cache` ->
    `cache_finished_req` inserts again at finish with input AND output tokens
    (`origin_input_ids + output_ids`, committed KV, page-aligned)."""
    a_in = pages(1, 4)
    # a: 4 pages + 1 token, 130 output tokens: 257 + 129 committed = 386 tokens = 6 full pages
    out = output_page_keys("a", a_in, 2)
    trace = [req("a", 0, a_in, output=130), req("b", 2, a_in + [9])]
    engine, w = watch(trace, {"a": a_in + out, "b": a_in + [9]})
    a, b = w.records["a"], w.records["b"]
    # step 1, a prefilled: its 4 input pages are in the tree, on device, one insert hit; locked
    # twice: by a, and by the write-through copy that insert started
    assert w.at("prefilled", "a")["a"] == [(4, "DH", 2, 1, 0)]
    # step 2, b admitted while a is still decoding: a device hit on a's pages
    assert b.arrival_ns < a.finish_ns and b.first_token_ns < a.finish_ns
    assert (b.hit_class, b.device_hit_tokens, b.cache_protected_len) == ("device_hit", 4 * PS, 4 * PS)
    assert w.at("admitted", "b")["b"] == [(4, "DH", 2, 1, 0)]  # a's lock and b's; matching is no hit
    # step 3, b prefilled: its insert passed a's node (hit 2) and added page 9 (hit 1; locked by b
    # and by its copy to host, locks that count on the parent too)
    assert w.at("prefilled", "b")["b"] == [(4, "DH", 3, 2, 0), (1, "DH", 2, 1, 0)]
    assert w.at("finished", "b")["b"] == [(4, "DH", 1, 3, 0), (1, "DH", 0, 2, 0)]  # b's finish insert
    # step 4, a finished: its finish insert adds 2 output pages (the partial input page with the
    # first output tokens, and one of output only) under synthetic keys, and starts their copy
    assert w.at("finished", "a")["a"] == [(4, "DH", 1, 4, 0), (2, "DH", 1, 1, 0)]
    # no other request carries those tokens: a later one with a's input matches only the input
    later = [req("c", 50, a_in + [77, 78])]
    _, w2 = watch(trace + later, {})
    assert w2.records["c"].device_hit_tokens == 4 * PS
    engine.check_invariants(idle=True)


def test_output_pages_occupy_device_memory_until_evicted():
    """`cache_finished_req` keeps the output KV in the tree: it holds device pages (and host
    pages under write-through) like any prefix, so it takes room others then evict."""
    trace = [req("a", 0, pages(1, 2), output=6 * PS)]  # 129 + 383 committed = 512 tokens = 8 pages
    engine, w = watch(trace, {"a": pages(1, 2) + output_page_keys("a", pages(1, 2), 6)})
    # (the lock left is the output pages' copy to host, still in flight at a's finish)
    assert w.at("finished", "a")["a"] == [(2, "DH", 1, 2, 0), (6, "DH", 1, 1, 0)]
    assert engine.tree.device_pages == 8 and engine.device.used_pages == 8
    engine.check_invariants(idle=True)


# --- 2. hit counting ------------------------------------------------------------------------------
def test_hits_grow_per_insert_and_selective_write_through_backs_up_at_the_second():
    """hiradix_cache.py `HiRadixCache.insert` -> `_inc_hit_count`: hit_count grows by one per
    insert that passes a node (not per `match_prefix`); write_through_selective
    (`write_through_threshold` 2) backs a node up when an insert takes it to 2, so a lone
    request's prefix is backed up at its finish (its second insert)."""
    a_in = pages(1, 4)
    trace = [req("a", 0, a_in), req("b", 50, a_in + [9])]
    engine, w = watch(trace, {"a": a_in}, write_policy="write_through_selective")
    a, b = w.records["a"], w.records["b"]
    assert w.at("prefilled", "a")["a"] == [(4, "D", 1, 1, 0)]  # one insert: no backup yet
    backups = [t for t in w.transfers if t.kind == "backup"]
    assert (backups[0].req_id, backups[0].pages, backups[0].t_start_ns) == ("a", 4, a.finish_ns)
    assert w.at("finished", "a")["a"] == [(4, "DH", 1, 2, 0)]  # still locked by the backup copy
    assert w.at("admitted", "b")["a"] == [(4, "DH", 1, 2, 0)]  # b's match is not a hit
    assert w.at("prefilled", "b")["a"][0][3] == 3 and w.at("finished", "b")["a"][0][3] == 4
    # b's own page 9: inserted once at prefill (1), backed up at finish (2)
    assert [(t.req_id, t.pages, t.t_start_ns) for t in backups[1:]] == [("b", 1, b.finish_ns)]
    engine.check_invariants(idle=True)


@pytest.mark.parametrize("policy,first_victims", [("lfu", ["x", "z"]), ("lru", ["y", "x"])])
def test_lfu_ranks_by_insert_hits_then_last_access(policy, first_victims):
    """evict_policy.py `LFUStrategy.get_priority` = (hit_count, last_access_time), hit_count as
    counted by `_inc_hit_count`: y asked twice (4 insert hits) outlives x and z (2 each) under
    LFU although it is the least recently used; LRU takes y first."""
    trace = [req("y", 0, pages(10, 4)), req("y2", 50, pages(10, 4)), req("x", 100, pages(20, 4)),
             req("z", 200, pages(30, 4)), req("f", 300, pages(40, 8))]
    engine, w = watch(trace, {"x": pages(20, 4), "y": pages(10, 4), "z": pages(30, 4)},
                      eviction_policy=policy, write_policy="write_through_selective")
    before = w.at("admitted", "f")
    assert [before[k][0][3] for k in ("x", "y", "z")] == [2, 4, 2]
    owners = [e.owner_req_id for e in w.evictions if e.tier == "device"]
    assert [o.rstrip("2") for o in owners[:2]] == first_victims
    assert all(e.action == "demote" for e in w.evictions)  # all were backed up at their 2nd insert
    engine.check_invariants(idle=True)


# --- 3. write-through timing and retries ----------------------------------------------------------
def test_write_through_starts_at_the_insert_after_prefill_not_at_chunk_inserts():
    """hiradix_cache.py `_inc_hit_count(node, chunked)`: chunk inserts
    (`Scheduler.stash_chunked_request` -> `cache_unfinished_req(chunked=True)`) count no hit and
    start no backup; the insert after the last chunk does, for every node of the path."""
    engine, w = watch([req("long", 0, pages(1, 6))], {"long": pages(1, 6)}, max_prefill_tokens=2 * PS)
    rec = w.records["long"]
    assert rec.num_chunks == 4  # 385 tokens in chunks of 128
    # after chunk 1 and chunk 2 (snapshots at batches 2 and 3): nodes on device, hit 0, no host copy
    assert w.at("batch", "2")["long"] == [(2, "D", 1, 0, 0)]
    assert w.at("batch", "3")["long"] == [(2, "D", 1, 0, 0), (2, "D", 1, 0, 0)]
    # the insert after the last chunk: one hit each, each backed up, the copies started then
    # (locks: the request's, plus one per copy in flight at or below each node)
    assert w.at("prefilled", "long")["long"] == [(2, "DH", 4, 1, 0), (2, "DH", 3, 1, 0), (2, "DH", 2, 1, 0)]
    backups = [t for t in w.transfers if t.kind == "backup"]
    assert [t.pages for t in backups] == [2, 2, 2]
    assert {t.t_start_ns - t.queued_ns for t in backups} == {rec.first_token_ns}
    engine.check_invariants(idle=True)


def test_every_insert_retries_a_missing_backup_so_the_node_is_demoted_not_dropped():
    """hiradix_cache.py `_inc_hit_count` -> `write_backup`: a node not backed up is retried at
    each insert that reaches the threshold again (`write_backup` evicts host room and gives up
    when there is none). Here 60 of the 64 host pages are held elsewhere when a's prefill insert
    tries; they are released after it, and a's finish insert backs a up, so the flood that
    follows demotes a (host copy kept) instead of dropping it, and b loads it back."""
    held = {}

    def pin(engine):
        held["slots"] = engine.host.alloc(60)

    def release(engine):
        engine.host.free(held.pop("slots"))

    a_in = pages(1, 8)
    trace = [req("p", 0, pages(500, 1), output=1), req("a", 10, a_in)] + flood(100) + [req("b", 1000, a_in + [90])]
    engine, w = watch(trace, {"a": a_in}, hooks={("finished", "p"): pin, ("prefilled", "a"): release})
    a, b = w.records["a"], w.records["b"]
    assert w.at("prefilled", "a")["a"] == [(8, "D", 1, 1, 0)]  # the backup found no host room
    assert engine.stats.backups_skipped >= 1
    a_backup = [t for t in w.transfers if t.kind == "backup" and t.req_id == "a"]
    assert [(t.pages, t.t_start_ns) for t in a_backup] == [(8, a.finish_ns)]  # retried at finish
    assert w.at("finished", "a")["a"] == [(8, "DH", 1, 2, 0)]
    demoted = [e for e in w.evictions if e.owner_req_id == "a"]
    assert demoted and {e.action for e in demoted} == {"demote"}
    assert (b.hit_class, b.host_hit_tokens) == ("tiered_hit", 8 * PS)
    engine.check_invariants(idle=True)


# --- 4. admission before load-back ----------------------------------------------------------------
def test_a_request_that_does_not_fit_waits_then_loads_back():
    """schedule_policy.py `PrefillAdder.add_one_req`: `total_tokens` (input beyond the device
    prefix, host part included, plus max_new_tokens) >= `rem_total_tokens` (free + evictable,
    less the decode reservation) is NO_TOKEN: the request waits in the queue, before any
    `init_load_back`. When admitted, it loads its host part back."""
    a_in = pages(1, 12)
    trace = [req("a", 0, a_in), req("f", 100, pages(100, 12)),
             req("c", 300, pages(200, 4), output=200), req("b", 301, a_in + [50])]
    # The amounts below are the shortfall's (0.5.23, and the engine before 0.5.9's whole-need
    # eviction was followed); the waiting and the load-back are both releases' rule.
    engine, w = watch(trace, {"a": a_in}, max_prefill_tokens=2 * PS, sglang_rules="0.5.23")
    b, c = w.records["b"], w.records["c"]
    # before b: f pushed a's pages (6 chunk nodes of 2) to host but the first node, which c's
    # allocation took (its eviction asks for a page more: alloc_paged_token_slots_extend) once
    # c was admitted (0.5.23 allocates with the batch, after admission: prepare_for_extend); c
    # holds 8 device pages while decoding
    assert tiers(w.at("admitted", "c")["a"]) == {"DH": 2, "H": 10}
    assert tiers(w.at("prefilled", "c")["a"]) == {"H": 12}
    # b arrived 1 ms after c but is admitted only once c has finished, and loads back
    assert b.arrival_ns + b.queue_ns >= c.finish_ns
    assert (b.loadback_skipped_reason, b.host_hit_tokens, b.computed_tokens) == (None, 12 * PS, PS + 1)
    assert tiers(w.at("admitted", "b")["a"]) == {"DH": 12}
    # each of a's chunk nodes counted one hit, from the chunk insert that made it: 0.5.23's
    # `_finish_insert_walk_node` skips what the request inserted before (`cache_inserted_len`);
    # 0.5.9 would count 2 (its prefill-end insert and its finish insert, chunk inserts none)
    assert {(lock, hits) for _, _, lock, hits, _ in w.at("admitted", "b")["a"]} == {(1, 1)}
    assert b.cache_protected_len == b.prefix_indices_len == 12 * PS
    assert not w.skips
    engine.check_invariants(idle=True)


def test_a_host_hit_below_the_threshold_is_recomputed():
    """hiradix_cache.py `HiRadixCache.load_back`: `len(host_indices) < self.load_back_threshold`
    declines the load-back (the other SGLang reason being no device room for the host part)."""
    trace = [req("a", 0, [1])] + flood(100) + [req("b", 1000, [1, 50, 51])]
    engine, w = watch(trace, {"a": [1]}, load_back_threshold=100)
    b = w.records["b"]
    # 0.5.9 reports the promised host hit as host even though it was recomputed (cached_split.split_promised)
    assert (b.host_match_tokens, b.host_hit_tokens, b.loadback_skipped_reason) == (PS, PS, "below_threshold")
    assert [(s.req_id, s.reason, s.tokens) for s in w.skips] == [("b", "below_threshold", PS)]
    assert b.recomputed_tokens == PS and b.computed_tokens == b.input_tokens
    engine.check_invariants(idle=True)


# --- 5. after a declined load-back ----------------------------------------------------------------
def test_declined_load_back_protects_and_locks_the_device_part_only():
    """hiradix_cache.py `HiRadixCache.init_load_back`: when `load_back` returns None, last_node
    walks up to the last device node; schedule_policy.py `add_one_req` then sets
    `cache_protected_len = len(prefix_indices)` (the device part) and `_req_inc_lock_ref` locks
    only that path: the host nodes stay unlocked. The insert after prefill revives them with the
    recomputed pages (no hit: `insert` on an evicted node swaps its value)."""
    # a: pages 1-4; b shares 1-2, splitting a's node; a flood demotes [3, 4] (least recent leaf)
    trace = [req("a", 0, pages(1, 4)), req("b", 100, [1, 2, 7, 8]), req("f", 200, pages(100, 11)),
             req("c", 300, pages(1, 4) + [9])]
    # 0.5.23's eviction of the shortfall keeps this story to one flood victim; the protection
    # and the lock of a declined load-back are both releases' rule.
    engine, w = watch(trace, {"c": pages(1, 4) + [9]}, load_back_threshold=200, sglang_rules="0.5.23")
    c = w.records["c"]
    # [1, 2]: one hit from a's first insert and one from b's; [3, 4]: a's (0.5.23's inserts
    # count only past `cache_inserted_len`, so a request's finish insert does not count its
    # input again; 0.5.9 counted 4 and 2). c locks [1, 2] only
    assert w.at("admitted", "c")["c"] == [(2, "DH", 1, 2, 0), (2, "H", 0, 1, 0)]
    assert (c.device_hit_tokens, c.host_match_tokens, c.loadback_skipped_reason) == (2 * PS, 2 * PS, "below_threshold")
    assert c.cache_protected_len == c.prefix_indices_len == 2 * PS
    assert c.computed_tokens == 3 * PS + 1 and c.recomputed_tokens == 2 * PS
    # prefilled: [3, 4] back on device (revived with c's pages: 0.5.23 counts it a hit,
    # _unevict_node_on_insert then _finish_insert_walk_node), [9] new; locks: c's (now at the
    # end of its path) and [9]'s copy to host; c's insert adds one hit to each (3, 2, 1)
    assert w.at("prefilled", "c")["c"] == [(2, "DH", 2, 3, 0), (2, "DH", 2, 2, 0), (1, "DH", 2, 1, 0)]
    engine.check_invariants(idle=True)


# --- 6. prefetch --------------------------------------------------------------------------------
@pytest.mark.parametrize("write_policy", ["write_through", "write_back"])
def test_prefetch_protects_the_host_copy_only_and_needs_the_device_node_backed_up(write_policy, tmp_path):
    """scheduler.py `Scheduler._prefetch_kvcache`: a prefetch starts only `if
    req.last_node.backuped` (the last device node; "otherwise, the allocated GPU memory must be
    locked for integrity"); hiradix_cache.py `prefetch_from_storage` then calls
    `last_host_node.protect_host()` (host tier only, no lock_ref) and allocates host room for the
    whole remaining input; `check_prefetch_progress` inserts what arrived and `release_host`s."""
    cfg = small_config(host_tokens=24 * PS, storage_tokens=128 * PS, prefetch_threshold=3 * PS,
                       prefetch_policy="wait_complete", write_policy=write_policy, storage_dir=str(tmp_path / "st"))
    # a's 8 pages reach storage; four floods push them out of device and host; d recomputes
    # pages 1-2 onto the device (2 stored pages are below the prefetch threshold); b asks for 1-8
    trace = ([req("a", 0, pages(1, 8))] + flood(100, n=4)
             + [req("d", 1900, [1, 2, 50, 51]), req("b", 2000, pages(1, 8) + [91])])
    engine, w = watch(trace, {"b": pages(1, 8) + [91]}, cfg)
    b = w.records["b"]
    if write_policy == "write_through":
        # the prefetch: anchored at d's node [1, 2] (device, backed up): protected, not locked
        at_fetch = w.at("prefetch", "b")
        assert at_fetch["b"] == [(2, "DH", 0, 2, 1)] and at_fetch["locked_device_pages"] == 0
        # admitted: the 6 fetched pages hang below [1, 2] and are loaded back; protection released
        assert w.at("admitted", "b")["b"] == [(2, "DH", 1, 2, 0), (6, "DH", 1, 0, 0)]
        assert (b.device_hit_tokens, b.storage_hit_tokens, b.host_hit_tokens) == (2 * PS, 6 * PS, 0)
        assert b.storage_wait_ns > 0 and b.storage_skipped_reason is None
    else:
        # write_back backs nothing up before eviction: d's device node [1, 2] has no host copy,
        # so no prefetch starts, and b recomputes what storage held
        assert ("prefetch", "b") not in w.snaps
        assert (b.storage_skipped_reason, b.storage_match_tokens, b.storage_hit_tokens) == ("not_backed_up", 6 * PS, 0)
        assert b.device_hit_tokens == 2 * PS and b.storage_wait_ns == 0
    engine.check_invariants(idle=True)


def test_prefetch_reserves_host_room_for_the_remaining_input(tmp_path):
    """hiradix_cache.py `prefetch_from_storage`: `mem_pool_host.alloc(prefetch_length)` for all of
    `new_input_tokens` (page-aligned), before the storage hit query; cache_controller.py
    `prefetch_thread_func` then releases the pages that were not hits. The reservation host-evicts
    for the remaining input, not just for the hits."""
    cfg = small_config(host_tokens=24 * PS, storage_tokens=128 * PS, prefetch_threshold=PS,
                       prefetch_policy="wait_complete", storage_dir=str(tmp_path / "st"))
    # b: the 8 stored pages of a, then 4 pages nobody has: 12 full pages to reserve
    trace = [req("a", 0, pages(1, 8))] + flood(100, n=4) + [req("b", 2000, pages(1, 8) + pages(60, 4))]
    engine, w = watch(trace, {}, cfg)
    fetch = [t for t in w.transfers if t.kind == "prefetch"]
    assert [(t.req_id, t.pages) for t in fetch] == [("b", 8)]
    # the host was full (24 pages: f3 on device and host, f1 and f2 host-only); reserving 12
    # pages deleted both host-only floods (16 pages), where the 8 hits alone needed one
    assert w.at("finished", "f3")["host_used_pages"] == 24
    deleted = [e.owner_req_id for e in w.evictions if e.tier == "host" and e.cause_req_id == "b"
               and e.t_ns == w.records["b"].arrival_ns]
    assert sorted(deleted) == ["f1", "f2"]
    assert w.at("prefetch", "b")["host_used_pages"] == 24 - 16 + 8  # the 4 misses were released
    assert w.records["b"].storage_hit_tokens == 8 * PS
    engine.check_invariants(idle=True)


# --- 7. LPM -------------------------------------------------------------------------------------
def _lpm_order(trace, **kw):
    _, w = watch(trace, {}, **kw)
    return sorted((r for r in w.records if r != "x"), key=lambda r: w.records[r].first_token_ns), w


def test_lpm_ranks_by_the_device_prefix_only():
    """schedule_policy.py `SchedulePolicy._sort_by_longest_prefix` sorts by
    `len(r.prefix_indices)`, the device part of the match (`host_hit_length` is not in it): c's
    2 device pages go before b's 8 host pages."""
    # a's 8 pages are pushed to host by a flood; e2 puts [20, 21] back on device; while x runs,
    # b (a's 8 pages + 1) and c ([20, 21] + 6 new) queue, and a 512-token budget takes one of them
    trace = ([req("a", 0, pages(1, 8)), req("e", 10, [20, 21])] + flood(100)
             + [req("e2", 500, [20, 21, 22]), req("x", 1000, pages(300, 7)),
                req("b", 1000.001, pages(1, 8) + [90]), req("c", 1000.002, [20, 21] + pages(500, 6))])
    order, w = _lpm_order(trace, schedule_policy="lpm", max_prefill_tokens=8 * PS)
    assert w.records["b"].host_hit_tokens == 8 * PS and w.records["c"].device_hit_tokens == 2 * PS
    assert order[-2:] == ["c", "b"]
    assert w.records["b"].first_batch_id > w.records["c"].first_batch_id > w.records["x"].first_batch_id
    fcfs, _ = _lpm_order(trace, schedule_policy="fcfs", max_prefill_tokens=8 * PS)
    assert fcfs[-2:] == ["b", "c"]


def test_lpm_deprioritises_in_batch_duplicates_of_a_prefix():
    """schedule_policy.py `SchedulePolicy._compute_prefix_matches`: a waiting request with a short
    device match (<= IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD, 32) that shares >= 32 tokens with
    an earlier waiting request is `temporary_deprioritized` (sorted last), so the shared prefix is
    computed once and p2 then hits it on device."""
    # while x runs, p1, p2 (p1's 6 pages + 1) and q queue; a 1,024-token budget takes two
    trace = [req("x", 0, pages(300, 14)), req("p1", 0.001, pages(600, 6)),
             req("p2", 0.002, pages(600, 6) + [610]), req("q", 0.003, pages(700, 6))]
    kw = dict(max_prefill_tokens=16 * PS, device_tokens=64 * PS, host_tokens=64 * PS)
    _, lpm = watch(trace, {}, schedule_policy="lpm", **kw)
    r = lpm.records
    # p2 is held back: p1 and q share a batch, p2 follows and finds p1's pages on device
    assert r["p1"].first_batch_id == r["q"].first_batch_id < r["p2"].first_batch_id
    assert r["p2"].device_hit_tokens == 6 * PS
    _, fcfs = watch(trace, {}, schedule_policy="fcfs", **kw)
    r = fcfs.records
    # FCFS puts p1 and p2 in one batch: both compute the shared pages
    assert r["p1"].first_batch_id == r["p2"].first_batch_id < r["q"].first_batch_id
    assert r["p2"].device_hit_tokens == 0


@pytest.mark.parametrize("fillers,cached_first", [(127, True), (128, False)])
def test_lpm_is_fcfs_past_128_waiting(fillers, cached_first):
    """schedule_policy.py `SchedulePolicy._determine_active_policy`: LPM turns into FCFS when more
    than 128 requests wait. The cached request arrives last: with 128 waiting it goes first, with
    129 it keeps its place."""
    trace = [req("k", 0, [5, 6]), req("x", 100, pages(300, 14))]
    trace += [req(f"w{i}", 100.001 + i * 1e-4, [10_000 + i]) for i in range(fillers)]
    trace += [req("kk", 100.5, [5, 6, 7])]
    _, w = watch(trace, {}, schedule_policy="lpm", max_prefill_tokens=4 * PS, device_tokens=64 * PS,
                 host_tokens=64 * PS)
    waiting_first = min(w.records[f"w{i}"].first_token_ns for i in range(fillers))
    assert (w.records["kk"].first_token_ns < waiting_first) is cached_first


# --- 8. eviction policies -----------------------------------------------------------------------
# x: t=0, again at 250 (4 insert hits); w: t=50, priority 9 (2 hits); y: t=100, again at 150
# (4 hits); z: t=200, output 1 so only its finish inserts it (1 hit). Then f needs one 3-page node.
VICTIM = {"lru": "w", "lfu": "z", "fifo": "x", "mru": "x", "filo": "z", "priority": "y"}


@pytest.mark.parametrize("policy", RELEASE_OFFERS[RULES]["eviction_policy"])
def test_each_eviction_policy_picks_its_victim(policy):
    """evict_policy.py (0.5.9) `LRUStrategy`, `LFUStrategy`, `FIFOStrategy`, `MRUStrategy`,
    `FILOStrategy`, `PriorityStrategy` (priority from the request, max along the path in
    `RadixCache._insert_helper`), chosen in `RadixCache.__init__` by eviction_policy: the
    policies 0.5.9 has (slru and tlru are 0.5.23's, refused under --sglang 0.5.9; their keys are
    tests/engine/test_tree.py's and test_tlru.py's)."""
    trace = [req("x", 0, pages(10, 3)), req("w", 50, pages(20, 3), priority=9), req("y", 100, pages(30, 3)),
             req("y2", 150, pages(30, 3)), req("z", 200, pages(40, 3), output=1), req("x2", 250, pages(10, 3)),
             req("f", 300, pages(100, 6))]
    engine, w = watch(trace, {"x": pages(10, 3), "w": pages(20, 3), "y": pages(30, 3), "z": pages(40, 3)},
                      eviction_policy=policy)
    before = w.at("finished", "x2")  # everything on device and host, unlocked
    assert [before[k] for k in ("x", "w", "y", "z")] == [[(3, "DH", 0, h, 0)] for h in (4, 2, 4, 1)]
    demoted = [e for e in w.evictions if e.tier == "device"]
    # 0.5.9 evicts the whole need when it does not fit (evict_from_tree_cache): the policy's
    # victim goes first, then the next ones in the same order.
    assert demoted and all(e.action == "demote" and e.cause_req_id == "f" for e in demoted)
    victim = VICTIM[policy]
    assert demoted[0].owner_req_id.rstrip("2") == victim
    after = w.at("admitted", "f")
    gone = {e.owner_req_id.rstrip("2") for e in demoted}
    assert {k: after[k][0][1] for k in VICTIM.values()} == {k: ("H" if k in gone else "DH") for k in VICTIM.values()}
    engine.check_invariants(idle=True)


# --- 9. extra_key -------------------------------------------------------------------------------
def test_identical_tokens_under_different_extra_keys_never_share_a_prefix():
    """radix_cache.py `get_child_key` keys a child by (extra_key, tokens) and `_key_match_*` only
    compare within one extra_key: identical tokens under different keys (LoRA id, cache salt) are
    disjoint; under the same key they share."""
    ids = pages(1, 6)
    trace = [req("a", 0, ids, extra_key="lora-a"), req("b", 50, ids, extra_key="lora-b"), req("c", 100, ids),
             req("a2", 150, ids + [9], extra_key="lora-a")]
    engine, w = watch(trace, {}, device_tokens=32 * PS)
    r = w.records
    assert [r[i].device_hit_tokens for i in ("a", "b", "c", "a2")] == [0, 0, 0, 6 * PS]
    keys = {i: page_keys(t, page_size=PS, block_size=PS) for i, t in zip(("a", "b", "c"), trace)}
    assert not (set(keys["a"]) & set(keys["b"])) and not (set(keys["a"]) & set(keys["c"]))
    assert engine.tree.device_pages == 3 * 6 + 1  # three disjoint copies, plus a2's page 9
    engine.check_invariants(idle=True)


# --- 10. host pool sizing -----------------------------------------------------------------------
def test_a_host_pool_smaller_than_the_device_pool_is_refused(tmp_path):
    """mem_cache/memory_pool_host.py `HostKVCache.__init__`: "The host memory should be larger
    than the device memory with the current protocol" (hicache_ratio > 1; SGLang rounds the host
    pool up by a page, so equal sizes pass). The CLI says so in one line, exit 2."""
    with pytest.raises(ConfigError, match="smaller than the device pool"):
        EngineConfig(model="tiny", gpu="cpu", device_tokens=4096, host_tokens=2048)
    assert EngineConfig(model="tiny", gpu="cpu", device_tokens=4096, host_tokens=4096).resolved_host_tokens() == 4096
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 70, "output_length": 2, "hash_ids": [1]}\n')
    proc = completed_in_process("replay", str(trace), "--db", str(tmp_path / "r.duckdb"), "--model", "tiny", "--gpu",
                                "cpu", "--device-tokens", "4096", "--host-tokens", "2048")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--host-tokens 2,048 is smaller than the device pool (4,096 tokens)" in lines[0]
    assert not (tmp_path / "r.duckdb").exists() or proc.stdout == ""


def test_the_invariants_hold_on_a_mixed_workload_with_every_new_rule():
    """Not one SGLang function: the same workload through every eviction policy, with priorities,
    extra keys and output pages, keeps token conservation, pool accounting and locks."""
    trace = ([req("a", 0, pages(1, 8), output=200, priority=3), req("b", 1, pages(1, 8) + [40], extra_key="k")]
             + flood(100, n=4) + [req("c", 900, pages(1, 8) + [90], output=70)])
    for policy in EVICTION_POLICIES:
        engine, probe = run(trace, eviction_policy=policy, write_policy="write_through_selective")
        for rec in probe.records.values():
            assert rec.device_hit_tokens + rec.host_hit_tokens + rec.storage_hit_tokens + rec.computed_tokens \
                == rec.input_tokens
        engine.check_invariants(idle=True)
