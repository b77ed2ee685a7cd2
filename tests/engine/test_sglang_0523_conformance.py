"""The engine against SGLang 0.5.23, rule by rule (issue 29): each test restates one rule in
which 0.5.23 differs from 0.5.9 (tierdiag/engine/rules.py) and names the 0.5.23 function.
tests/sglang drives 0.5.23's own tree core beside the engine; these narrate the rules the
differential tests do not reach (the tier split, admission, prefetch) and the registry itself.

Pools: device 16 pages, host 64 pages of 64 tokens unless a test says otherwise (helpers.small_config).
"""

from __future__ import annotations

import subprocess
import sys

from tests.engine import helpers
from tests.engine.helpers import PS, req
from tierdiag.config.engine import SGLANG_RULES, EngineConfig
from tierdiag.engine.engine import Engine
from tierdiag.engine.prefetch import prefetch_limit_tokens
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
    proc = subprocess.run([sys.executable, "-c", "from tierdiag.cli.main import main; main()", "replay", str(trace),
                           "--sglang", "0.5.10", "--no-probes", "--model", "tiny", "--gpu", "cpu"],
                          capture_output=True, text=True, timeout=120)
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
    assert split(9, 4, 5, 5, 2, 7) == (4, 3, 2)
    # declined load-back: nothing loaded, the prefix is the device part, all of it device
    assert split(4, 4, 5, 0, 2, 7) == (4, 0, 0)
    # 0.5.9 on the same declined load-back: the promised 5 are host/storage, device 4 - 5 -> 0
    assert RULE_SETS["0.5.9"].split_cached_prefix(4, 4, 5, 0, 2, 7) == (0, 3, 2)


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
    `per_req_token_overhead` (a page). A request needing the whole device pool can never be
    admitted and is rejected at arrival; one page less fits. 0.5.9 had no overhead."""
    whole = [req("w", 0, pages(1, 15), output=PS - 1)]  # 15 pages + 1 token + 63 output: 16 pages
    _, p23 = helpers.run(whole)
    _, p59 = helpers.run(whole, sglang_rules="0.5.9")
    assert p23.records["w"].status == "rejected" and "device memory" in p23.records["w"].reject_reason
    assert p59.records["w"].status == "finished"
    _, fits = helpers.run([req("w", 0, pages(1, 14), output=PS - 1)])
    assert fits.records["w"].status == "finished"


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
