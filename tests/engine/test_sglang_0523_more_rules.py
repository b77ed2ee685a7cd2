"""The rest of SGLang 0.5.23's rules (issue 29), each narrated with the 0.5.23 function it
restates: admission's chunk shape and its per-request overhead, hits past `cache_inserted_len`
(write-through at every chunk), LPM by device + host, shortest-prefill-first's chunk cap, tlru's
settings, the host layout and `assume_stored`. Each is a field of the rule set
(tierdiag/engine/rules.py) or of the queue-policy registry; 0.5.9 keeps its own rule.

Pools: device 16 pages, host 64 pages of 64 tokens unless a test says otherwise (helpers.small_config).
"""

from __future__ import annotations

import pytest

from tests.engine import helpers
from tests.engine.helpers import PS, req
from tests.engine.test_sglang_0523_conformance import _order
from tests.support.cli import completed_in_process
from tierdiag.config.engine import EngineConfig
from tierdiag.config.policies import EVICTION_POLICIES, configured_eviction_policy
from tierdiag.engine.engine import Engine
from tierdiag.engine.queue_policy import QUEUE_POLICIES, shortest_prefill_chunk_limit
from tierdiag.engine.request import Req
from tierdiag.engine.rules import RULE_SETS
from tierdiag.engine.tree import RadixTree
from tierdiag.errors import ConfigError
from tierdiag.trace.pages import page_keys_array


def pages(lo: int, n: int) -> list[int]:
    return list(range(lo, lo + n))


def flood(start_ms: float, n: int = 3, size: int = 8) -> list:
    return [req(f"f{i}", start_ms + 100 * i, pages(1000 + 100 * i, size)) for i in range(n)]


def by_release(trace, **kw):
    return {v: helpers.run(trace, sglang_rules=v, **kw)[1] for v in ("0.5.23", "0.5.9")}


# --- 1. admission: the chunk shape and the overhead page ---------------------------------------
def test_a_later_request_is_chunked_into_what_is_left_of_the_batch():
    """schedule_policy.py `PrefillAdder._select_prefill_admission` (0.5.23): with chunked prefill
    on, a request whose page-ceiled extend exceeds the chunk budget left is chunked into it
    (`extend_len = chunk_tokens_limit // page_size * page_size`, page-aligned end); the "allow
    the first request even above the input cap" OTHER applies only without chunking. 0.5.9's
    `add_one_req`: `real_input_tokens >= rem_input_tokens` with a request already admitted is
    OTHER. Budget 8 pages: a (4 pages ceiled) leaves 4; b (7 pages ceiled) gets them under
    0.5.23 and finishes in the next batch, and waits for the next batch under 0.5.9."""
    out = by_release([req("a", 0, pages(1, 3)), req("b", 0, pages(10, 6))], max_prefill_tokens=8 * PS)
    new, old = out["0.5.23"].records, out["0.5.9"].records
    assert (new["b"].first_batch_id, new["b"].num_chunks) == (1, 2)
    assert (old["b"].first_batch_id, old["b"].num_chunks) == (2, 1)
    assert RULE_SETS["0.5.23"].chunk_later_requests and not RULE_SETS["0.5.9"].chunk_later_requests


def test_a_declined_load_back_is_selected_again_as_recompute():
    """`add_one_req` (0.5.23): the shape is first selected assuming the host hit loads
    (`_select_prefill_admission(host_hit_length=req.host_hit_length)`); when `init_load_back`
    loads nothing it is selected again with `host_hit_length=0` ("No FULL was loaded;
    recomputation may no longer fit"). b's 4 host pages would leave a 3-page extend, which fits
    the 4 pages f leaves in the batch; under a load-back threshold above them nothing loads, b's
    extend is 7 pages and it is chunked into the 4 (0.5.9: it waits for the next batch)."""
    trace = [req("a", 0, pages(1, 4))] + flood(100) + [req("f", 1000, pages(500, 3)),
                                                       req("b", 1000, pages(1, 4) + [50, 51])]
    loaded = helpers.run(trace, max_prefill_tokens=8 * PS)[1].records
    assert (loaded["b"].host_hit_tokens, loaded["b"].num_chunks) == (4 * PS, 1)
    assert loaded["b"].first_batch_id == loaded["f"].first_batch_id
    out = by_release(trace, max_prefill_tokens=8 * PS, load_back_threshold=100 * PS)
    new, old = out["0.5.23"].records, out["0.5.9"].records
    assert (new["b"].loadback_skipped_reason, new["b"].host_hit_tokens) == ("below_threshold", 0)
    assert (new["b"].first_batch_id, new["b"].num_chunks) == (new["f"].first_batch_id, 2)
    assert (old["b"].first_batch_id, old["b"].num_chunks) == (old["f"].first_batch_id + 1, 1)


def test_the_overhead_page_stays_reserved_for_the_rest_of_the_batch():
    """`PrefillAdder._update_prefill_budget` (0.5.23) -> `PrefillBudget.reserve(extra_tokens=
    per_req_token_overhead - page_size)`, which charges a page itself: each admitted request keeps
    `ceil(extend) + page + max_new` in `total_offset` for the rest of the pass, so the next
    request's `total_tokens < remaining_total` sees it. The compute budget (`rem_input_tokens`,
    `rem_chunk_tokens`) is charged the page-ceiled extend only. a (193 input tokens, 63 output)
    takes 4 of 16 device pages (its extend: output pages come with decode steps) and reserves
    its page and its 63 output tokens: 768 - 127 = 641 tokens left. b with 9 pages + 1 token:
    577 + 63 + its page 64 = 704, not below 641, so b waits for a to leave (0.5.9, no page either
    side: 640 < 705, admitted beside a); without a's reserved page (705) it would fit. With 8
    pages (640 < 641) it fits."""
    def first_batches(n):
        out = by_release([req("a", 0, pages(1, 3), output=63), req("b", 0, pages(10, n), output=63)],
                         max_prefill_tokens=64 * PS)
        return {v: (p.records["a"].first_batch_id, p.records["b"].first_batch_id) for v, p in out.items()}
    assert first_batches(9) == {"0.5.23": (1, 2), "0.5.9": (1, 1)}
    assert first_batches(8) == {"0.5.23": (1, 1), "0.5.9": (1, 1)}


# --- 2. hits past cache_inserted_len: write-through at every chunk -------------------------------
def test_an_insert_counts_hits_only_past_what_the_request_inserted():
    """unified_tree_core.py `_finish_insert_walk_node` ("Nodes this request already inserted were
    counted back then": `node_end > params.inserted_len`) and `_should_backup_after_insert`
    (`leaf_end > inserted_len`) for a new leaf; `inserted_len` is `req.kv.cache_inserted_len`."""
    tree = RadixTree(PS, "lru", RULE_SETS["0.5.23"])
    _, _, _, hit = tree.insert([1, 2, 3], 0, [0, 1, 2], now_ns=1)
    assert [(n.keys, n.hit_count) for n in hit] == [([1, 2, 3], 1)]
    # the same request's next insert: [1, 2, 3] ends at 3 = inserted, not counted again
    _, _, _, hit = tree.insert([1, 2, 3, 4, 5], 3, [3, 4], now_ns=2, inserted=3)
    assert [(n.keys, n.hit_count) for n in hit] == [([4, 5], 1)]
    # its finish with nothing new: nothing counted
    assert tree.insert([1, 2, 3, 4, 5], 5, [], now_ns=3, inserted=5)[3] == []
    # another request (inserted 0) counts the whole path
    _, _, _, hit = tree.insert([1, 2, 3, 4, 5], 0, [9, 9, 9, 9, 9], now_ns=4)
    assert [(n.keys, n.hit_count) for n in hit] == [([1, 2, 3], 2), ([4, 5], 2)]


def test_write_through_backs_up_at_every_prefill_chunk():
    """0.5.23: a chunk's insert (`cache_unfinished_req` -> `checkpoint_into_tree` with
    `inserted_len = cache_inserted_len`) counts its new pages a hit, and write_through
    (threshold 1) queues their backup then: x's three chunks (14, 14, 2 pages) are backed up one
    batch later, with the next batch's backups (`flush_pending_backups` at its end, issue 43's
    long mode: tests/engine/test_sglang_0523_long.py): chunk 1's copy when chunk 2's batch ends,
    chunk 2's and the last chunk's, one after the other, when the prefill ends. 0.5.9 (`_inc_hit_count(node, chunked=True)` returns at once): nothing until
    the prefill ends, then all three, one after the other on the link."""
    out = by_release([req("x", 0, pages(300, 30))], max_prefill_tokens=14 * PS, device_tokens=64 * PS,
                     host_tokens=64 * PS)
    new, old = out["0.5.23"], out["0.5.9"]
    b23 = [(t.pages, t.t_start_ns) for t in new.transfers if t.kind == "backup"]
    b59 = [(t.pages, t.t_start_ns) for t in old.transfers if t.kind == "backup"]
    assert [p for p, _ in b23] == [p for p, _ in b59] == [14, 14, 2]
    x23, x59 = new.records["x"], old.records["x"]
    assert b23[0][1] < b23[1][1] == x23.first_token_ns < b23[2][1]  # each with the next batch's
    assert b59[0][1] == x59.first_token_ns  # all after the prefill


def test_write_through_selective_counts_a_request_once():
    """`_inc_hit_count_and_check` at `write_through_threshold` 2 (`write_through_selective`):
    under 0.5.23 a request's own inserts count each node once (`cache_inserted_len`), so a lone
    request's prefix is never backed up; a second request walking it makes the second hit. Under
    0.5.9 its insert after prefill and its finish insert are two hits: backed up at its finish."""
    out = by_release([req("a", 0, pages(1, 4)), req("z", 500, pages(50, 2))], write_policy="write_through_selective")
    assert [t.req_id for t in out["0.5.23"].transfers if t.kind == "backup"] == []
    assert [t.req_id for t in out["0.5.9"].transfers if t.kind == "backup"] == ["a", "z"]
    out = by_release([req("a", 0, pages(1, 4)), req("a2", 500, pages(1, 4) + [60])],
                     write_policy="write_through_selective")
    assert [(t.req_id, t.pages) for t in out["0.5.23"].transfers if t.kind == "backup"] == [("a2", 4)]


# --- 3. LPM by device + host ---------------------------------------------------------------------
def test_lpm_ranks_by_device_and_host_under_0523():
    """schedule_policy.py `SchedulePolicy._sort_by_longest_prefix` (0.5.23) sorts by
    -`num_matched_prefix_tokens` = min(prefix_len + host_hit_length, input - 1)
    (`common.match_kv_cache`); 0.5.9's by -len(prefix_indices), the device prefix. d has 2 pages
    on device and 4 on host, e 4 on device: e first under 0.5.9, d first under 0.5.23; ties keep
    queue order (a stable sort), the in-batch duplicate (p2) still last."""
    spec = [("d", 0, 8, 100), ("e", 1, 8, 200), ("n", 2, 8, 300)]
    hits = {"d": (2, 4), "e": (4, 0)}
    assert _order("lpm", spec, hits, 0, {s[0]: 0 for s in spec}, release="0.5.23") == ["d", "e", "n"]
    assert _order("lpm", spec, hits, 0, {s[0]: 0 for s in spec}, release="0.5.9") == ["e", "d", "n"]
    spec = [("p1", 0, 6, 600), ("p2", 1, 2, 600), ("q", 2, 8, 700)]
    assert _order("lpm", spec, {"q": (0, 1)}, 0, {s[0]: 0 for s in spec}, release="0.5.23") == ["q", "p1", "p2"]
    assert RULE_SETS["0.5.23"].lpm_counts_host_hit and not RULE_SETS["0.5.9"].lpm_counts_host_hit


# --- 4. shortest-prefill-first's chunk cap -------------------------------------------------------
def _waiting(works):
    out = []
    for i, w in enumerate(works):
        r = Req(req(f"w{i}", 0, pages(10 * i + 100, 1), seq=i + 1), 0)
        r.prefill_work_tokens = w
        out.append(r)
    return out


def test_the_chunk_cap_reserves_room_for_shorter_waiting_requests():
    """schedule_policy.py `SchedulePolicy.shortest_prefill_chunk_limit` (0.5.23), called by
    `Scheduler.get_new_batch_prefill` as `adder.chunked_req_limit` before `add_chunked_req`:
    in queue order each waiting request with work shorter than what the chunked request has left
    reserves its page-ceiled work while the reservations stay within budget - a page; the chunk
    gets (budget - reserved) page-floored; nothing reserved or a budget under two pages: no cap."""
    chunked = Req(req("x", 0, pages(300, 30)), 0)
    chunked.done_tokens = 14 * PS  # 1,921 - 896 = 1,025 tokens left
    budget = 14 * PS
    assert shortest_prefill_chunk_limit(chunked, _waiting([129, 200]), budget, PS) == budget - 3 * PS - 4 * PS
    assert shortest_prefill_chunk_limit(chunked, _waiting([129, 2000, 5]), budget, PS) == budget - 3 * PS  # stops at the first too long
    assert shortest_prefill_chunk_limit(chunked, _waiting([13 * PS + 1]), budget, PS) is None  # over budget - a page
    assert shortest_prefill_chunk_limit(chunked, _waiting([]), budget, PS) is None
    assert shortest_prefill_chunk_limit(chunked, _waiting([5]), PS + 1, PS) is None  # budget < 2 pages
    assert QUEUE_POLICIES["shortest-prefill-first"].chunk_limit is shortest_prefill_chunk_limit
    assert all(p.chunk_limit is None for n, p in QUEUE_POLICIES.items() if n != "shortest-prefill-first")


def test_a_short_request_runs_beside_the_capped_chunk():
    """End to end: x (30 pages) prefills in chunks of 14 pages; small (2 pages + 1 token) arrives
    during the first. At the second batch the cap keeps 3 pages for small (its 129 tokens,
    page-ceiled): x's chunk is 11 pages and small runs beside it (`add_one_req` with
    `has_chunked_req`: it needs no chunking). FCFS gives x the whole budget and small waits for
    the third batch."""
    trace = [req("x", 0, pages(300, 30)), req("small", 0.002, pages(700, 2))]
    kw = dict(max_prefill_tokens=14 * PS, device_tokens=64 * PS, host_tokens=64 * PS)
    spf = helpers.run(trace, schedule_policy="shortest-prefill-first", **kw)[1].records
    fcfs = helpers.run(trace, schedule_policy="fcfs", **kw)[1].records
    assert (spf["small"].first_batch_id, fcfs["small"].first_batch_id) == (2, 3)
    assert spf["x"].num_chunks == fcfs["x"].num_chunks == 3
    assert spf["small"].ttft_ns < fcfs["small"].ttft_ns


# --- 6. tlru's settings ----------------------------------------------------------------------------
def test_tlru_settings_are_config_keys_checked_as_sglang_checks_them():
    """arg_groups/kv_cache_hook.py (0.5.23): `--radix-eviction-policy tlru` with
    `--radix-eviction-policy-config '{"threshold": T, "next_prompt_estimate": E}'` needs both
    non-negative and T > E; `get_eviction_strategy` passes the object as keyword arguments, so a
    key its policy does not take fails at startup. Unset (both None) keeps 0 and 0."""
    cfg = EngineConfig(eviction_policy="tlru", tlru_threshold=4096, tlru_next_prompt_estimate=512)
    assert cfg.to_json()["tlru_threshold"] == 4096 and cfg.resolved_eviction_policy().key_can_shrink
    assert EngineConfig(eviction_policy="tlru").resolved_eviction_policy() is EVICTION_POLICIES["tlru"]
    for kw, words in ((dict(eviction_policy="tlru", tlru_threshold=-1), "--tlru-threshold -1 must be at least 0"),
                      (dict(eviction_policy="tlru", tlru_threshold=512, tlru_next_prompt_estimate=512),
                       "--tlru-threshold 512 must be greater than --tlru-next-prompt-estimate 512"),
                      (dict(eviction_policy="tlru", tlru_next_prompt_estimate=1),
                       "--tlru-threshold 0 must be greater"),
                      (dict(tlru_threshold=100), "--tlru-threshold applies to --eviction-policy tlru only, not lru")):
        with pytest.raises(ConfigError) as info:
            EngineConfig(**kw)
        assert words in info.value.one_line()


def test_a_tlru_threshold_makes_the_tel_safe_tail_leave_first():
    """evict_policy.py `TLRUStrategy(threshold, next_prompt_estimate).get_priority` with the
    settings: B = [7..10] (t=0), A = [1, 2] then [1, 2, 3, 4] (t=1, 2). Threshold 128: A's tail
    [3, 4] (history 256, budget 128, 128 cached above it) is TEL-safe and leaves first; with the
    settings unset the order is LRU's and B leaves first."""
    def first_victim(policy):
        tree = RadixTree(PS, policy)
        slots = iter(range(100))
        for t, keys in enumerate(([7, 8, 9, 10], [1, 2], [1, 2, 3, 4])):
            tree.insert(keys, 0, [next(slots) for _ in keys], now_ns=t)
        return tree.pop_device_victim().keys
    assert first_victim(configured_eviction_policy("tlru", 128, 0)) == [3, 4]
    assert first_victim(configured_eviction_policy("tlru")) == [7, 8, 9, 10]


@pytest.mark.parametrize("how, code", [("config", 3), ("set", 2), ("option", 2)])
def test_a_bad_tlru_setting_exits_with_the_documented_code(tmp_path, how, code):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n')
    args = ["replay", str(trace), "--db", str(tmp_path / "r.duckdb")]
    if how == "config":
        (tmp_path / "c.toml").write_text('eviction_policy = "tlru"\ntlru_threshold = 100\ntlru_next_prompt_estimate = 200\n')
        args += ["--config", str(tmp_path / "c.toml")]
    elif how == "set":
        args = ["sweep", str(trace), "--db", str(tmp_path / "r.duckdb"), "--set", "tlru_threshold=10,20"]
    else:
        args += ["--eviction-policy", "tlru", "--tlru-threshold=-5"]
    proc = completed_in_process(*args)  # the CLI in this process: its line and code, not its start
    assert proc.returncode == code
    (line,) = proc.stderr.strip().splitlines()
    # Named as it was given: the option, or the key of the --config file or --set (issue 39, item 17).
    assert ("--tlru-" if how == "option" else "tlru_") in line
    assert not (tmp_path / "r.duckdb").exists()


# --- 5. the host layout ----------------------------------------------------------------------------
def test_the_host_layout_is_the_releases_and_recorded():
    """`hicache_mem_layout`: layer_first in 0.5.9 (server_args.py), page_first in 0.5.23
    (arg_groups/fields/memory.py); recorded in the run's config. It moves nothing in the engine's
    transfer model (docs/engine.md: "The host layout")."""
    assert EngineConfig().to_json()["host_layout"] == "page_first"
    assert EngineConfig(sglang_rules="0.5.9").to_json()["host_layout"] == "layer_first"


# --- 7. storage_hit_end / assume_stored ------------------------------------------------------------
def _stored_request(tmp_path, rules="0.5.23"):
    """An engine whose storage tier holds the 8 input pages of r, nothing on device or host."""
    cfg = helpers.small_config(storage_tokens=128 * PS, prefetch_threshold=PS, prefetch_policy="wait_complete",
                               storage_dir=str(tmp_path / rules), sglang_rules=rules)
    engine = Engine(cfg)
    s = engine.scheduler
    t = req("r", 0, pages(1, 8))
    r = Req(t, 0)
    r.keys_np = page_keys_array(t, page_size=PS, block_size=PS)
    r.keys = r.keys_np.tolist()
    r.max_match_pages = 8
    slots = s.ctrl.host.alloc(8).tolist()  # (the storage tier takes slot lists)
    s.ctrl.storage.write_from(s.ctrl.host.array, slots, r.keys, rows=s.ctrl.host.rows)
    s.ctrl.host.free(slots)
    return s, r


def test_a_requery_after_a_hit_the_host_could_not_take_assumes_it_stored(tmp_path):
    """unified_radix_cache.py `prefetch_from_storage(storage_hit_end=...)` (0.5.23): the re-query
    armed by `_try_alloc_storage_hit`'s `poll_miss(rid, storage_start + storage_hit_count)` asks
    for the span up to that end when it lies past the new match (`assume_stored`, the
    existence query skipped in `_storage_hit_query`), so it holds that span, not the whole
    remaining input, against the in-flight limit; each query consumes the end."""
    s, r = _stored_request(tmp_path)
    r.storage_hit_end = 5  # a 5-page hit the host could not take, 8 pages stored by now
    s._start_prefetch(r, 0)
    s.drain_prefetch_queries(0)  # the hit's host memory and read: the next drain (storage_acks_per_pass)
    assert r.prefetch[:2] == (0, 5) and r.prefetch_tokens == 5 * PS and r.storage_hit_end is None
    s2, r2 = _stored_request(tmp_path / "plain")
    s2._start_prefetch(r2, 0)  # no known end: the whole span is queried
    s2.drain_prefetch_queries(0)
    assert r2.prefetch[:2] == (0, 8) and r2.prefetch_tokens == 8 * PS
    s3, r3 = _stored_request(tmp_path / "behind")
    r3.storage_hit_end = 0  # not past the match (0 pages): an ordinary query
    s3._start_prefetch(r3, 0)
    s3.drain_prefetch_queries(0)
    assert r3.prefetch[:2] == (0, 8)


@helpers.patches_the_engine  # replaces the controller's alloc_host
def test_a_hit_the_host_cannot_take_arms_a_requery_with_its_end(tmp_path, monkeypatch):
    """`_try_alloc_storage_hit`: `allocate_storage_hit` returns nothing -> `poll_miss(rid,
    storage_start + storage_hit_count)`: the re-query knows where the hit ended (0.5.23); 0.5.9
    has no re-query."""
    s, r = _stored_request(tmp_path)
    monkeypatch.setattr(s.ctrl, "alloc_host", lambda pages, cause, now: None)
    monkeypatch.setattr(s.ctrl.host, "alloc", lambda pages: None)
    s._start_prefetch(r, 0)
    s.drain_prefetch_queries(0)  # the hit's host memory: the next drain (storage_acks_per_pass)
    # armed: due `interval` passes after the next pass (the first to see it; none ran here)
    due = s.prefetch_pass + 1 + s.rules.prefetch_retry_interval_passes
    assert (r.storage_skip_reason, r.storage_hit_end, s.requeries.items()) == ("host_full", 8, [(r, due)])
    assert RULE_SETS["0.5.23"].prefetch_assume_stored and not RULE_SETS["0.5.9"].prefetch_assume_stored
