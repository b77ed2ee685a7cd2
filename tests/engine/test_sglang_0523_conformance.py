"""The engine against SGLang 0.5.23, rule by rule (issue 29): each test restates one rule in
which 0.5.23 differs from 0.5.9 (tierdiag/engine/rules.py) and names the 0.5.23 function.
tests/sglang drives 0.5.23's own tree core beside the engine; these narrate the rules the
differential tests do not reach (the tier split, admission, prefetch) and the registry itself.

Pools: device 16 pages, host 64 pages of 64 tokens unless a test says otherwise (helpers.small_config).
"""

from __future__ import annotations

from tests.engine import helpers
from tests.engine.helpers import PS, req
from tests.support.cli import completed_in_process
from tierdiag.config.engine import SGLANG_RULES, EngineConfig
from tierdiag.engine.engine import Engine
from tierdiag.engine.prefetch import prefetch_limit_tokens, prefetch_timeout_ns
from tierdiag.engine.request import Req
from tierdiag.engine.rules import RULE_SETS


def pages(lo: int, n: int) -> list[int]:
    return list(range(lo, lo + n))


def flood(start_ms: float, n: int = 3, size: int = 8) -> list:
    return [req(f"f{i}", start_ms + 100 * i, pages(1000 + 100 * i, size)) for i in range(n)]


def test_the_registry_is_one_rule_set_a_release_and_0523_is_the_default():
    """One RuleSet per release, named as EngineConfig accepts them; the default is 0.5.23, the
    release whose export `import sglang` reads."""
    assert tuple(RULE_SETS) == SGLANG_RULES == ("0.5.23", "0.5.9")
    assert EngineConfig().sglang_rules == "0.5.23"
    assert EngineConfig().to_json()["sglang_rules"] == "0.5.23"  # recorded with the run


def test_an_unknown_release_exits_2_listing_the_known_ones(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n')
    proc = completed_in_process("replay", str(trace), "--sglang", "0.5.10", "--no-probes", "--model", "tiny", "--gpu",
                                "cpu")
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "'0.5.10'" in line and "known: 0.5.23, 0.5.9" in line


def test_tier_split_host_is_what_was_loaded_storage_by_position():
    """schedule_batch.py `split_cached_prefix_by_tier` (0.5.20+): host = min(host_hit_length,
    host_loaded_length) capped at prefix_len; storage = [storage_hit_start, +len) within
    [0, prefix_len); device = prefix - host - storage. 0.5.9 (`prepare_for_extend`) reported the
    promised host hit, and took it off the device part."""
    split = RULE_SETS["0.5.23"].split_cached_prefix
    # loaded: 4 device, 3 host, 2 storage pages after them
    assert split(9, 4, 5, 5, 2, 7, 2, 7) == (4, 3, 2)
    # declined load-back: nothing loaded, the prefix is the device part, all of it device
    assert split(4, 4, 5, 0, 2, 7, 2, 7) == (4, 0, 0)
    # 0.5.9 on the same declined load-back: the promised 5 are host/storage, device 4 - 5 -> 0
    assert RULE_SETS["0.5.9"].split_cached_prefix(4, 4, 5, 0, 2, 7, 2, 7) == (0, 3, 2)


def test_a_declined_load_back_reports_no_host_tokens():
    """`split_cached_prefix_by_tier` end to end: b's host hit (1 page) is under the load-back
    threshold, recomputed, and reported as computed, not host (0.5.9 reported it as host)."""
    trace = [req("a", 0, [1])] + flood(100) + [req("b", 1000, [1, 50, 51])]
    by_rules = {v: helpers.run(trace, load_back_threshold=100, sglang_rules=v)[1].records["b"] for v in SGLANG_RULES}
    new, old = by_rules["0.5.23"], by_rules["0.5.9"]
    assert (new.host_match_tokens, new.loadback_skipped_reason) == (PS, "below_threshold")
    assert (new.device_hit_tokens, new.host_hit_tokens, new.computed_tokens) == (0, 0, 3 * PS + 1)
    assert (old.host_hit_tokens, old.computed_tokens) == (PS, 3 * PS + 1)


def test_admission_reserves_a_page_a_request():
    """schedule_policy.py `PrefillAdder.add_one_req` (0.5.23): total_tokens = extend + max_new +
    `per_req_token_overhead` (a page), admitted only when less than `rem_total_tokens` (an empty
    pool: all of it). A request that can never be admitted is rejected at arrival. 0.5.9 had no
    overhead, and the same strict test (`total_tokens >= rem_total_tokens`: NO_TOKEN): 15 pages
    + 1 token + 63 output tokens are the whole pool, never admitted under either release (issue
    43: before decode memory was modelled 0.5.9's page count admitted it); 14 pages + 1 token +
    62 output tokens + the page are one token less than the pool, and fit under 0.5.23."""
    whole = [req("w", 0, pages(1, 15), output=PS - 1)]  # 15 pages + 1 token + 63 output: 16 pages
    _, p23 = helpers.run(whole)
    _, p59 = helpers.run(whole, sglang_rules="0.5.9")
    assert p23.records["w"].status == "rejected" and "device memory" in p23.records["w"].reject_reason
    assert p59.records["w"].status == "rejected"
    _, fits59 = helpers.run([req("w", 0, pages(1, 15), output=PS - 2)], sglang_rules="0.5.9")
    assert fits59.records["w"].status == "finished"
    _, fits = helpers.run([req("w", 0, pages(1, 14), output=PS - 2)])
    assert fits.records["w"].status == "finished"
    _, one_more = helpers.run([req("w", 0, pages(1, 14), output=PS - 1)])
    assert one_more.records["w"].status == "rejected"


def test_the_allocation_evicts_for_a_page_more_but_only_the_shortfall():
    """allocation.py `alloc_paged_token_slots_extend` asks for the extend plus a page a request
    (`conservative_num_tokens`); allocator `evict_to_free_tokens` -> `evict_for_alloc` evicts
    only the shortfall of that (0.5.9's `evict_from_tree_cache` evicted the whole amount)."""
    # a and f fill the device pool (7 input pages + a page of input tail and output each)
    trace = [req("a", 0, pages(1, 7)), req("f", 100, pages(100, 7)), req("x", 200, pages(200, 1))]
    e23, p23 = helpers.run(trace)
    e59, p59 = helpers.run(trace, sglang_rules="0.5.9")
    dev23 = [e for e in p23.evictions if e.tier == "device"]
    dev59 = [e for e in p59.evictions if e.tier == "device"]
    free_before = 16 - 8 - 8  # a's and f's 7 input pages + 1 page of input tail and output each
    assert free_before == 0
    # x needs 2 pages (1 input page, its tail + output): 0.5.23 evicts 3 - 0 = 3 pages' worth,
    # the LRU leaf a (8 pages: its input node, then its output node); 0.5.9 asks for 3 too
    # and evicts whole nodes until 3 pages went: the same victims here
    assert dev23 and dev23[0].owner_req_id == "a"
    assert [e.node_id for e in dev23] == [e.node_id for e in dev59]
    e23.check_invariants(idle=True)


def test_prefetch_capacity_is_half_the_host_pool():
    """cache_controller.py `HiCacheController.__init__` (0.5.23): `prefetch_capacity_limit =
    0.5 * mem_pool_host.logical_size` ("leave half the pool for write-back"); 0.5.9's
    `prefetch_rate_limited` allowed 0.8 x (host - device)."""
    assert prefetch_limit_tokens(RULE_SETS["0.5.23"], 64, 16, PS) == 32 * PS
    assert prefetch_limit_tokens(RULE_SETS["0.5.9"], 64, 16, PS) == int(0.8 * 48 * PS)
    engine = Engine(helpers.small_config(storage_tokens=128 * PS))
    assert engine.scheduler.prefetch_limit_tokens == 32 * PS


# --- the storage prefetch (scheduler._prefetch_kvcache, unified_radix_cache.py) ----------------
def test_prefetch_allocates_host_only_for_the_hit(tmp_path):
    """unified_radix_cache.py `_try_alloc_storage_hit` -> `allocate_storage_hit(hit_tokens,
    allow_partial=True, min_tokens=prefetch_threshold)`: host memory comes after the query and
    only for the hit (0.5.9's `prefetch_from_storage` allocated the whole remaining input first).
    b asks for a's 8 stored pages and 4 pages nobody has, with the host full (24 pages: f3 on
    device and host, f1 and f2 host-only): 0.5.23 host-evicts one flood (8 pages) for the 8 hits,
    where 0.5.9 evicted both (16) to reserve 12."""
    trace = [req("a", 0, pages(1, 8))] + flood(100, n=4) + [req("b", 2000, pages(1, 8) + pages(60, 4))]
    deleted = {}
    for v in SGLANG_RULES:
        cfg = helpers.small_config(host_tokens=24 * PS, storage_tokens=128 * PS, prefetch_threshold=PS,
                                   prefetch_policy="wait_complete", storage_dir=str(tmp_path / v), sglang_rules=v)
        engine, probe = helpers.run(trace, cfg)
        assert [(t.req_id, t.pages) for t in probe.transfers if t.kind == "prefetch"] == [("b", 8)]
        assert probe.records["b"].storage_hit_tokens == 8 * PS
        deleted[v] = sorted(e.owner_req_id for e in probe.evictions
                            if e.tier == "host" and e.cause_req_id == "b" and e.t_ns == probe.records["b"].arrival_ns)
        engine.check_invariants(idle=True)
    assert deleted == {"0.5.23": ["f1"], "0.5.9": ["f1", "f2"]}


def test_prefetch_gate_is_the_best_match_node_backed_up_or_the_root(tmp_path):
    """scheduler.py `_prefetch_kvcache` (0.5.23): a prefetch is issued when
    `is_backuped(last_host_node) or is_root(last_host_node)`, last_host_node being
    `best_match_node` (`_match_post_processor`: the deepest node on device or backed up). A cold
    request (nothing matched: the root) queries storage; under write_back, b's match ends at
    d's device node [1, 2], never backed up, so no prefetch starts (0.5.9 gated on the last
    device node, `req.last_node.backuped`: the same here)."""
    trace = ([req("a", 0, pages(1, 8))] + flood(100, n=4)
             + [req("d", 1900, [1, 2, 50, 51]), req("b", 2000, pages(1, 8) + [91])])
    cfg = helpers.small_config(host_tokens=24 * PS, storage_tokens=128 * PS, prefetch_threshold=3 * PS,
                               prefetch_policy="wait_complete", write_policy="write_back",
                               storage_dir=str(tmp_path / "st"))
    engine, probe = helpers.run(trace, cfg)
    b = probe.records["b"]
    assert (b.storage_skipped_reason, b.storage_match_tokens, b.storage_hit_tokens) == ("not_backed_up", 6 * PS, 0)
    assert b.device_hit_tokens == 2 * PS
    engine.check_invariants(idle=True)
    cold = [req("a", 0, pages(1, 8))] + flood(100, n=4) + [req("b", 2000, pages(1, 8) + [91])]
    cfg = helpers.small_config(host_tokens=24 * PS, storage_tokens=128 * PS, prefetch_threshold=3 * PS,
                               prefetch_policy="wait_complete", storage_dir=str(tmp_path / "cold"))
    _, probe = helpers.run(cold, cfg)
    assert [(t.req_id, t.pages) for t in probe.transfers if t.kind == "prefetch"] == [("b", 8)]
    assert RULE_SETS["0.5.23"].prefetch_gate_on_best_match and not RULE_SETS["0.5.9"].prefetch_gate_on_best_match


def test_a_partial_hit_is_kept_when_it_reaches_the_threshold(tmp_path):
    """`allocate_storage_hit(allow_partial=True, min_tokens=prefetch_threshold)`: when the host
    cannot take the whole hit, even after `evict_host`, what it can take (`available_size`,
    page-aligned) is fetched if at least the threshold; the rest is declined
    (`_resolve_storage_prefetch_tokens`, reason host_capacity: the engine's `host_full`).

    Host 16 pages. a's 8 pages reach storage; L (11 pages, decoding 4 pages of output) pushes
    them off device and host and holds 11 host pages (its copies, on device too: not
    host-evictable). b, arriving while L decodes, hits a's 8 pages in storage: 5 fit, at least
    the 4-page threshold, so 5 are fetched. (L's finish then needs host room for its output
    and host-evicts them, unlocked, before b is admitted.) A request arriving after L's finish
    finds 1 page free, under the threshold: no prefetch."""
    def b_at(dt_ms):
        trace = [req("a", 0, pages(1, 8)), req("L", 100, pages(200, 11), output=4 * PS - 2),
                 req("b", 100 + dt_ms, pages(1, 8))]
        cfg = helpers.small_config(host_tokens=16 * PS, storage_tokens=128 * PS, prefetch_threshold=4 * PS,
                                   prefetch_policy="wait_complete", storage_dir=str(tmp_path / str(dt_ms)))
        engine, probe = helpers.run(trace, cfg)
        engine.check_invariants(idle=True)
        assert probe.records["L"].first_token_ns < (100 + 5) * 10**6 < probe.records["L"].finish_ns
        return [(t.req_id, t.pages) for t in probe.transfers if t.kind == "prefetch"], probe.records["b"]
    fetched, b = b_at(5)
    assert fetched == [("b", 5)]
    assert (b.storage_match_tokens, b.storage_skipped_reason) == (8 * PS, "host_full")
    fetched, b = b_at(20)
    assert fetched == [] and (b.storage_match_tokens, b.storage_skipped_reason) == (8 * PS, "host_full")


def test_the_default_prefetch_policy_is_the_releases():
    """arg_groups/fields/memory.py (0.5.23): `hicache_storage_prefetch_policy` defaults to
    `timeout` (0.5.9: `best_effort`). The config key stays; unset, the release's default applies
    and the run's config records the one used."""
    assert EngineConfig().to_json()["prefetch_policy"] == "timeout"
    assert EngineConfig(sglang_rules="0.5.9").to_json()["prefetch_policy"] == "best_effort"
    assert EngineConfig(prefetch_policy="wait_complete").to_json()["prefetch_policy"] == "wait_complete"
    assert {v: r.prefetch_policy_default for v, r in RULE_SETS.items()} == {"0.5.23": "timeout", "0.5.9": "best_effort"}


def test_the_timeout_starts_at_the_first_blocked_admission_poll():
    """unified_radix_cache.py `check_prefetch_progress`: while `_can_terminate_prefetch` says no,
    `_start_storage_prefetch_wait` arms `timeout_s = prefetch_timeout_base (1) +
    pages x prefetch_timeout_per_page (page_size / 1024 x 0.25)` on the requested span, once, at
    the first poll that finds the prefetch running; `_prefetch_deadline_expired` then ends it,
    once `elapsed() > timeout_s`: from the first nanosecond past the budget (found by the
    scheduler harness with storage on the clock: 1 ns of TTFT). No cap. (0.5.9, as the engine
    had it: from the prefetch's start, on the hit.)"""
    assert prefetch_timeout_ns(0) == 1_000_000_000
    assert prefetch_timeout_ns(2048) == 1_500_000_000
    assert prefetch_timeout_ns(1024 * 1024) == int((1 + 256) * 1e9)  # no cap
    engine = Engine(helpers.small_config(storage_tokens=128 * PS))
    s = engine.scheduler
    r = Req(req("r", 0, pages(1, 4)), 0)
    r.hold_until_ns = 10 * 10**9  # the read ends at 10 s
    r.prefetch_wait_ns = prefetch_timeout_ns(8 * PS)  # 1.125 s, armed by _start_prefetch
    assert s._prefetch_holds(r, 3 * 10**9)  # first blocked poll at 3 s: the budget starts now
    assert (r.prefetch_deadline_ns, r.hold_until_ns, r.prefetch_wait_ns) == (4_125_000_001, 4_125_000_001, None)
    assert s._prefetch_holds(r, 4 * 10**9)  # a later poll does not restart it
    assert s._prefetch_holds(r, 4_125_000_000)  # the budget's end: elapsed == timeout_s, not past it
    assert not s._prefetch_holds(r, 4_125_000_001)  # expired: admitted with what arrived


@helpers.patches_the_engine  # replaces the scheduler's _start_prefetch
def test_a_miss_is_queried_again_every_8_passes_up_to_8_times(monkeypatch):
    """scheduler.py `_process_storage_prefetch_retries` -> storage_prefetch.py
    `StoragePrefetchRetries.pop_ready(waiting, interval=8, max_attempts=8)`
    (`hicache_storage_prefetch_retry_poll_interval`, `..._max_attempts`): a request whose query
    missed or was rate-limited (`poll_miss`) is queried again 8 passes after the first pass that
    sees it armed, in queue order; the queue head's is dropped ("a speculative miss must never
    delay the queue head"); after 8 re-queries none is made. 0.5.9 never re-queries."""
    engine = Engine(helpers.small_config(storage_tokens=128 * PS))
    s = engine.scheduler
    head, r = Req(req("h", 0, pages(1, 4)), 0), Req(req("r", 0, pages(9, 4), seq=1), 0)
    s.waiting[:] = [head, r]
    queried = []
    def requery(q, now):  # the storage still misses: poll_miss again
        queried.append((s.prefetch_pass, q.req_id))
        s._arm_prefetch_retry(q)
    monkeypatch.setattr(s, "_start_prefetch", requery)
    s._arm_prefetch_retry(head)
    s._arm_prefetch_retry(r)
    for _ in range(100):
        s._retry_prefetches(0)
    # first seen at pass 1: due at 9; each re-query re-arms, due 8 passes after the next pass
    assert queried == [(9, "r"), (18, "r"), (27, "r"), (36, "r"), (45, "r"), (54, "r"), (63, "r"), (72, "r")]
    assert r.prefetch_retries == 8 and head.prefetch_retries == 0 and not len(s.requeries)
    old = Engine(helpers.small_config(storage_tokens=128 * PS, sglang_rules="0.5.9")).scheduler
    old._arm_prefetch_retry(r)
    assert not len(old.requeries)


# --- queue policies (schedule_policy.py `SchedulePolicy.calc_priority`) --------------------------
class _Match:
    """A tree stand-in for the queue policies: per request, the (device, host) pages it matches."""

    def __init__(self, hits: dict[str, tuple[int, int]]):
        self.hits: dict[str, tuple[int, int]] = hits
        self.by_keys: dict[tuple[int, ...], str] = {}

    def __call__(self, keys, now):
        dev, host = self.hits.get(self.by_keys[tuple(keys)], (0, 0))
        return _Pages(dev, host)


class _Pages:
    def __init__(self, device_pages, host_pages):
        self.device_pages, self.host_pages = device_pages, host_pages


def _queue(spec, hits):
    """Waiting requests from (req_id, arrival ms, input pages, first page id); each input is its
    pages plus one token, so input_len = pages * 64 + 1 and the last page is never matchable."""
    waiting, match = [], _Match(hits)
    for seq, (rid, t_ms, n, lo) in enumerate(spec):
        r = Req(req(rid, t_ms, pages(lo, n), seq=seq), int(t_ms * 1e6))
        r.keys = pages(lo, n)
        r.max_match_pages = min(n, (r.input_len - 1) // PS)
        match.by_keys[tuple(r.keys[:r.max_match_pages])] = rid
        match.by_keys[tuple(r.keys)] = rid
        waiting.append(r)
    return waiting, match


def _order(policy, spec, hits, processed, arrived, release="0.5.23"):
    from tierdiag.engine.queue_policy import queue_policy

    waiting, match = _queue(spec, hits)
    queue_policy(policy, release).order(waiting, match, PS, 0, processed,
                                        {r.seq: arrived[r.req_id] for r in waiting})
    return [r.req_id for r in waiting]


def test_the_queue_policies_are_a_registry_of_sglangs_names():
    """`CacheAwarePolicy` / `CacheAgnosticPolicy` (0.5.23): the engine's --schedule-policy values
    are registry entries named as SGLang names them; hrrn and shortest-prefill-first are 0.5.23's
    only, so 0.5.9 refuses them; the default stays fcfs."""
    from tierdiag.config.engine import SCHEDULE_POLICIES
    from tierdiag.engine.queue_policy import QUEUE_POLICIES, queue_policy
    from tierdiag.errors import ConfigError

    assert tuple(QUEUE_POLICIES) == SCHEDULE_POLICIES == ("fcfs", "lpm", "hrrn", "shortest-prefill-first")
    assert EngineConfig().schedule_policy == "fcfs"
    for name in SCHEDULE_POLICIES:
        assert queue_policy(name, "0.5.23").name == name
    for name in ("hrrn", "shortest-prefill-first"):
        try:
            queue_policy(name, "0.5.9")
        except ConfigError as e:
            assert f"--schedule-policy {name} is not in SGLang 0.5.9 (it has fcfs, lpm)" in str(e)
        else:
            raise AssertionError(f"{name} accepted under 0.5.9")


# Four waiting requests at processed_tokens = 10,000 (the token clock: prefill tokens run so far):
#   id  arrival  input (tokens)  cached (device+host)  uncached  arrived at clock  waited  ratio-1
#   a   0 ms     8*64+1 = 513    0                     513       1,000             9,000   17.5
#   b   1 ms     2*64+1 = 129    0                     129       8,000             2,000   15.5
#   c   2 ms     6*64+1 = 385    4 dev + 1 host = 320   65       9,500               500    7.7
#   d   3 ms     2*64+1 = 129    0                     129       8,000             2,000   15.5
_SPEC = [("a", 0, 8, 100), ("b", 1, 2, 200), ("c", 2, 6, 300), ("d", 3, 2, 400)]
_HITS = {"c": (4, 1)}
_ARRIVED = {"a": 1_000, "b": 8_000, "c": 9_500, "d": 8_000}


def test_hrrn_admits_the_highest_response_ratio_first():
    """schedule_policy.py `SchedulePolicy._sort_by_hrrn` (0.5.23): key (-(processed_tokens -
    arrival_processed_tokens) / `_uncached_len`, rid), uncached = input - num_matched_prefix_tokens
    (device and host both cached, `common.match_kv_cache`). a waited 9,000 tokens for 513 (17.5);
    b and d tie at 15.5 and go by rid; c, waiting least, is last even though it is the shortest."""
    assert _order("hrrn", _SPEC, _HITS, 10_000, _ARRIVED) == ["a", "b", "d", "c"]
    # ties go by rid, not by arrival: rename b -> z and it goes after d
    spec = [("z" if s[0] == "b" else s[0],) + s[1:] for s in _SPEC]
    arrived = {("z" if k == "b" else k): v for k, v in _ARRIVED.items()}
    assert _order("hrrn", spec, _HITS, 10_000, arrived) == ["a", "d", "z", "c"]
    # at the moment all arrived (clock = their arrival) every ratio is 1: the order is by rid
    assert _order("hrrn", _SPEC, _HITS, 0, _ARRIVED) == ["a", "b", "c", "d"]


def test_hrrn_drains_a_fully_cached_request_first_and_is_fcfs_past_128():
    """`_sort_by_hrrn`: the match is capped at input - 1 (`_compute_max_prefix_len`), so a
    whole-input hit leaves one token to prefill (the uncached <= 0 case, "drain immediately", is
    not reached) and e (all 3 pages cached, 1 token uncached) goes first at 2,000. And
    `_determine_active_policy` turns HRRN into FCFS past WAITING_QUEUE_PREFIX_MATCH_MAX (128)."""
    spec = _SPEC + [("e", 4, 3, 500)]
    assert _order("hrrn", spec, {"c": (4, 1), "e": (3, 0)}, 10_000, {**_ARRIVED, "e": 8_000})[0] == "e"
    spec = [(f"w{i:03d}", i, 1, 10 * i + 1000) for i in range(128)] + [("k", 999, 4, 5)]
    arrived = {s[0]: 0 for s in spec}
    arrived["k"] = -100_000  # k waited longest by far
    assert _order("hrrn", spec, {}, 0, arrived)[-1] == "k"  # 129 waiting: FCFS, k stays last
    assert _order("hrrn", spec[1:], {}, 0, arrived)[0] == "k"  # 128: sorted


def test_shortest_prefill_first_admits_the_fewest_uncached_tokens_first():
    """schedule_policy.py `SchedulePolicy._sort_by_shortest_prefill` (0.5.23): key (in-batch
    deprioritized, `_shortest_prefill_work`, wait_queue_entry_time), work = max(1, input -
    num_matched_prefix_tokens): the *uncached* part, so c (385 tokens, 320 cached on device and
    host) goes before b and d (129, none cached). Ties go to the earlier queue entry (not the
    rid); the token clock plays no part, and there is no FCFS fallback past 128 (not in
    `_determine_active_policy`)."""
    assert _order("shortest-prefill-first", _SPEC, _HITS, 10_000, _ARRIVED) == ["c", "b", "d", "a"]
    # z entered the queue before d and goes first, though "d" < "z": entry time, not rid
    spec = [("a", 0, 8, 100), ("z", 1, 2, 200), ("d", 2, 2, 300)]
    assert _order("shortest-prefill-first", spec, {}, 0, {"a": 0, "z": 0, "d": 0}) == ["z", "d", "a"]
    spec = [(f"w{i:03d}", i, 2, 10 * i + 1000) for i in range(128)] + [("k", 999, 4, 5)]
    assert _order("shortest-prefill-first", spec, {"k": (3, 0)}, 0, {s[0]: 0 for s in spec})[0] == "k"


def test_new_policies_defer_in_batch_duplicates_like_lpm():
    """`SchedulePolicy._compute_prefix_matches` runs for every cache-aware policy: p2 (device
    match <= 32 tokens, sharing its first page with p1, ahead of it in the queue) is
    `temporary_deprioritized`, last under both new policies though it is shortest / waited longest."""
    spec = [("p1", 0, 6, 600), ("p2", 1, 2, 600), ("q", 2, 8, 700)]
    arrived = {"p1": 500, "p2": 0, "q": 500}
    assert _order("shortest-prefill-first", spec, {}, 1_000, arrived) == ["p1", "q", "p2"]
    assert _order("hrrn", spec, {}, 1_000, arrived) == ["p1", "q", "p2"]


def test_hrrn_end_to_end_ages_by_processed_prefill_tokens():
    """Scheduler end to end (`processed_tokens_counter += batch.extend_num_tokens` per batch,
    snapshot into `arrival_processed_tokens` at `_add_request_to_queue`): x (30 pages) prefills in
    chunks of 896 tokens; big (769 tokens, arrived first) and small (129) join the queue during the
    first chunk (clock 896). At the third batch (clock 1,792) both waited 896 tokens: small's ratio
    (896/129) beats big's (896/769), so HRRN admits small beside x's last chunk (the 704 tokens
    left hold it) and big after it, chunked into the 512 left (`_select_prefill_admission`
    chunks a later request with chunked prefill on); FCFS puts big first, chunked into the 704
    left, and small waits behind it for the fourth batch."""
    trace = [req("x", 0, pages(300, 30)), req("big", 0.001, pages(600, 12)), req("small", 0.002, pages(700, 2))]
    kw = dict(max_prefill_tokens=14 * PS, device_tokens=64 * PS, host_tokens=64 * PS)
    _, h = helpers.run(trace, schedule_policy="hrrn", **kw)
    _, f = helpers.run(trace, schedule_policy="fcfs", **kw)
    h, f = h.records, f.records
    assert (h["x"].first_batch_id, h["small"].first_batch_id, h["big"].first_batch_id) == (1, 3, 3)
    assert (h["small"].num_chunks, h["big"].num_chunks) == (1, 2)
    assert (f["x"].first_batch_id, f["big"].first_batch_id, f["small"].first_batch_id) == (1, 3, 4)
    assert h["small"].ttft_ns < f["small"].ttft_ns


def test_a_0523_policy_under_0_5_9_exits_2(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n')
    proc = completed_in_process("replay", str(trace), "--sglang", "0.5.9", "--schedule-policy", "hrrn", "--db",
                                str(tmp_path / "r.duckdb"), "--model", "tiny", "--gpu", "cpu")
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "--schedule-policy hrrn is not in SGLang 0.5.9" in line
    assert not (tmp_path / "r.duckdb").exists()  # refused with the config: no run, no store
