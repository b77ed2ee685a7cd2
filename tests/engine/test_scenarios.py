"""Narrated replays: each test walks a short sequence of requests and asserts every number.

Pools are tiny (device 16 pages, host 64 pages of 64 tokens) so a handful of requests is
enough to push a prefix off the device.
"""

from __future__ import annotations

import pytest

from tests.engine.helpers import PS, req, run, small_config
from tierdiag.config.engine import EngineConfig
from tierdiag.engine.engine import Engine


def flood(start_ms: float, n: int = 3, pages: int = 8) -> list:
    """n requests of fresh pages, 100 ms apart: each fills about half the device pool."""
    return [req(f"f{i}", start_ms + 100 * i, list(range(1000 + 100 * i, 1000 + 100 * i + pages))) for i in range(n)]


def conserved(rec) -> bool:
    return rec.device_hit_tokens + rec.host_hit_tokens + rec.storage_hit_tokens + rec.computed_tokens == rec.input_tokens


def test_first_request_is_a_miss_and_the_last_token_is_always_computed():
    engine, probe = run([req("a", 0, list(range(1, 9)), extra_tokens=0)])
    a = probe.records["a"]
    assert (a.hit_class, a.device_hit_tokens, a.computed_tokens) == ("miss", 0, 8 * PS)
    assert a.status == "finished" and conserved(a)
    engine.check_invariants(idle=True)


def test_same_prefix_soon_after_is_a_device_hit():
    engine, probe = run([req("a", 0, list(range(1, 9))), req("b", 50, list(range(1, 9)) + [77, 78])])
    b = probe.records["b"]
    # b's 8 shared pages were on device; its 2 new pages and the trailing token are computed.
    assert (b.hit_class, b.device_hit_tokens, b.host_hit_tokens) == ("device_hit", 8 * PS, 0)
    assert b.computed_tokens == 2 * PS + 1
    assert b.prefix_indices_len == b.cache_protected_len == 8 * PS
    assert b.loadback_bytes == 0 and b.loadback_exposed_ns == 0
    assert not probe.evictions
    engine.check_invariants(idle=True)


def test_prefix_pushed_to_host_by_a_flood_is_loaded_back():
    engine, probe = run([req("a", 0, list(range(1, 9)))] + flood(100) + [req("b", 1000, list(range(1, 9)) + [90])])
    # write_through backed a's pages up; f0's allocation demoted them (device -> host only).
    demotes = [e for e in probe.evictions if e.tier == "device"]
    assert demotes[0].action == "demote" and demotes[0].cause_req_id == "f0"
    assert demotes[0].owner_req_id == "a" and demotes[0].tokens == 8 * PS
    b = probe.records["b"]
    assert (b.hit_class, b.device_hit_tokens, b.host_hit_tokens, b.computed_tokens) == ("tiered_hit", 0, 8 * PS, PS + 1)
    assert b.prefix_indices_len == 8 * PS and b.loadback_pages == 8
    assert b.loadback_bytes == 8 * PS * engine.cost.kv_bytes_per_token
    assert b.loadback_skipped_reason is None
    # the load-back was real and checked byte for byte
    lb = [t for t in probe.transfers if t.kind == "load_back"]
    assert [(t.req_id, t.pages, t.verified) for t in lb] == [("b", 8, True)]
    # explain's step 4 can name who evicted b's prefix
    lost = {(x.req_id, x.eviction_id) for x in probe.lost}
    assert ("b", demotes[0].eviction_id) in lost
    # TTFT decomposition is exact
    assert b.queue_ns + b.storage_wait_ns + b.loadback_exposed_ns + b.recompute_ns + b.compute_ns == b.ttft_ns
    assert b.ttft_if_device_resident_ns == b.ttft_ns - b.loadback_exposed_ns
    engine.check_invariants(idle=True)


def test_host_hit_below_threshold_is_recomputed_not_counted_as_a_hit():
    trace = [req("a", 0, [1])] + flood(100) + [req("b", 1000, [1, 50, 51])]
    engine, probe = run(trace, load_back_threshold=100)
    b = probe.records["b"]
    # one host page (64 tokens) < threshold 100: skipped, recorded, and computed
    assert b.host_match_tokens == PS and b.host_hit_tokens == 0
    # the usable prefix is empty, and so is the protected one: a declined host part falls back
    # to the device part (init_load_back), which is nothing here
    assert (b.prefix_indices_len, b.cache_protected_len) == (0, 0)
    assert (b.loadback_skipped_reason, b.loadback_skipped_tokens) == ("below_threshold", PS)
    assert b.hit_class == "miss" and b.computed_tokens == b.input_tokens
    assert b.recomputed_tokens == PS
    assert [(s.req_id, s.reason) for s in probe.skips] == [("b", "below_threshold")]
    assert not [t for t in probe.transfers if t.kind == "load_back"]
    engine.check_invariants(idle=True)


def test_prefix_that_fell_to_storage_is_prefetched_then_loaded_back(tmp_path):
    # host holds only 24 pages, so the flood deletes a's host copy; storage still has it.
    # (host > device: SGLang lets prefetches hold 0.8 x (host - device) tokens, none when equal.)
    cfg = small_config(host_tokens=24 * PS, storage_tokens=128 * PS, prefetch_threshold=PS,
                       prefetch_policy="wait_complete", storage_dir=str(tmp_path / "st"))
    trace = [req("a", 0, list(range(1, 9)))] + flood(100, n=4) + [req("b", 2000, list(range(1, 9)) + [91])]
    engine, probe = run(trace, cfg)
    assert any(e.tier == "host" and e.action == "delete" for e in probe.evictions)
    b = probe.records["b"]
    assert (b.hit_class, b.storage_hit_tokens, b.host_hit_tokens) == ("tiered_hit", 8 * PS, 0)
    assert b.storage_match_tokens == 8 * PS and b.storage_wait_ns > 0
    kinds = [t.kind for t in probe.transfers if t.req_id == "b"]
    assert "prefetch" in kinds and "load_back" in kinds
    assert conserved(b)
    # real pages on disk: more than a's 8 in the segment files (one file a page no longer)
    on_disk = sum(f.stat().st_size for f in (tmp_path / "st").rglob("*.kvseg"))
    assert on_disk > 8 * engine.storage.page_bytes > 0
    engine.check_invariants(idle=True)


def test_best_effort_prefetch_that_has_not_arrived_is_computed(tmp_path):
    cfg = small_config(host_tokens=24 * PS, storage_tokens=128 * PS, prefetch_threshold=PS,
                       prefetch_policy="best_effort", storage_dir=str(tmp_path / "st"))
    trace = [req("a", 0, list(range(1, 9)))] + flood(100, n=4) + [req("b", 2000, list(range(1, 9)) + [91])]
    engine, probe = run(trace, cfg)
    b = probe.records["b"]
    # the GPU was idle, so b was admitted the moment it arrived: nothing had been read yet
    assert b.storage_hit_tokens == 0 and b.storage_skipped_reason == "prefetch_incomplete"
    assert b.recomputed_tokens == 8 * PS and conserved(b)
    engine.check_invariants(idle=True)


@pytest.mark.parametrize("policy", ["write_through", "write_through_selective", "write_back"])
def test_write_policies(policy):
    # a is asked twice, then flooded off the device.
    trace = ([req("a", 0, list(range(1, 9))), req("a2", 50, list(range(1, 9)) + [60])]
             + flood(200) + [req("b", 1000, list(range(1, 9)) + [90])])
    engine, probe = run(trace, write_policy=policy)
    kinds = [t.kind for t in probe.transfers]
    b = probe.records["b"]
    backups = [t for t in probe.transfers if t.kind == "backup"]
    a = probe.records["a"]
    if policy == "write_through":
        # every inserted node is backed up at its first insert: a's 8 pages when its prefill ends
        assert kinds.count("backup") >= 1 + 3 and "write_back" not in kinds
        assert (backups[0].req_id, backups[0].pages, backups[0].t_start_ns) == ("a", 8, a.first_token_ns)
    elif policy == "write_through_selective":
        # the second hit of a node backs it up. SGLang 0.5.23 (the default) counts a request's
        # nodes once (`cache_inserted_len`): a's prefix reaches 2 hits at a2's insert after its
        # prefill, and a lone request's nodes are never backed up (a2's own page, the flood)
        a2 = probe.records["a2"]
        assert (backups[0].req_id, backups[0].pages, backups[0].t_start_ns) == ("a2", 8, a2.first_token_ns)
        assert [t.req_id for t in backups] == ["a2"]
        # 0.5.9: its prefill insert is the first hit, its finish insert the second, so even a
        # lone request's prefix is backed up, at its finish
        _, p59 = run(trace, write_policy=policy, sglang_rules="0.5.9")
        a59, backups59 = p59.records["a"], [t for t in p59.transfers if t.kind == "backup"]
        assert (backups59[0].req_id, backups59[0].pages, backups59[0].t_start_ns) == ("a", 8, a59.finish_ns)
        assert [t.req_id for t in backups59[:5]] == ["a", "a2", "f0", "f1", "f2"]
        assert all(t.t_start_ns == p59.records[t.req_id].finish_ns for t in backups59)
    else:
        # nothing is copied until eviction, and then synchronously
        assert "backup" not in kinds and "write_back" in kinds
    # in all three, a's prefix survived on host and b loaded it back
    assert b.hit_class == "tiered_hit" and b.host_hit_tokens == 8 * PS
    engine.check_invariants(idle=True)


def test_chunked_prefill_splits_a_long_input_and_conserves_tokens():
    engine, probe = run([req("long", 0, list(range(1, 41)))], max_prefill_tokens=16 * PS, device_tokens=64 * PS)
    rec = probe.records["long"]
    assert rec.num_chunks == 3  # 2561 tokens in chunks of 1024
    assert conserved(rec) and rec.computed_tokens == 40 * PS + 1
    engine.check_invariants(idle=True)


def test_request_larger_than_the_device_pool_is_rejected_not_waited_on():
    engine, probe = run([req("huge", 0, list(range(1, 40))), req("ok", 10, [1, 2])])
    assert probe.records["huge"].status == "rejected"
    assert "device memory" in probe.records["huge"].reject_reason
    assert probe.records["ok"].status == "finished"
    engine.check_invariants(idle=True)


def test_same_trace_and_config_give_identical_results():
    trace = [req("a", 0, list(range(1, 9)))] + flood(100) + [req("b", 1000, list(range(1, 9)) + [90])]
    _, p1 = run(trace)
    _, p2 = run(trace)
    assert p1.records == p2.records
    strip = lambda evs: [(e.eviction_id, e.t_ns, e.node_id, e.action, e.cause_req_id) for e in evs]  # noqa: E731
    assert strip(p1.evictions) == strip(p2.evictions)


def test_layerwise_overlap_hides_part_of_the_load_back():
    # b fills the device pool less a page: 0.5.23 admits a request with a page of overhead
    # (PrefillAdder.add_one_req, per_req_token_overhead)
    trace = [req("a", 0, list(range(1, 9)))] + flood(100) + [req("b", 1000, list(range(1, 9)) + list(range(200, 206)))]
    _, on = run(trace, layerwise_overlap=True)
    _, off = run(trace, layerwise_overlap=False)
    b_on, b_off = on.records["b"], off.records["b"]
    assert b_on.loadback_ns == b_off.loadback_ns > 0
    assert b_off.loadback_exposed_ns == b_off.loadback_ns
    assert b_on.loadback_exposed_ns < b_off.loadback_exposed_ns


def test_default_sizes_come_from_the_presets():
    cfg = EngineConfig()
    # llama3-8b on h200: 141 GB * 0.88 - 16 GB of weights, 128 KiB per token
    assert 700_000 < cfg.resolved_device_tokens() < 900_000
    assert cfg.resolved_host_tokens() == 2 * cfg.resolved_device_tokens()
    engine = Engine(EngineConfig(data_plane_mib=16))
    assert engine.plane.reduced and engine.plane.page_bytes < engine.plane.modelled_page_bytes


def test_lpm_admits_the_request_with_the_longest_cached_prefix_first():
    # a is cached; while the miss x runs, c (15 new pages) and b (a's 8 pages + 1) queue up in
    # that order, and the 1,024-token budget cannot take both in one batch
    trace = [req("a", 0, list(range(1, 9))), req("x", 100, list(range(300, 314))),
             req("c", 100.001, list(range(500, 515))), req("b", 100.002, list(range(1, 9)) + [90])]
    _, fcfs = run(trace, schedule_policy="fcfs", max_prefill_tokens=16 * PS, device_tokens=64 * PS)
    _, lpm = run(trace, schedule_policy="lpm", max_prefill_tokens=16 * PS, device_tokens=64 * PS)
    order = lambda p: sorted(("b", "c"), key=lambda r: p.records[r].first_token_ns)  # noqa: E731
    assert order(fcfs) == ["c", "b"] and order(lpm) == ["b", "c"]
    assert lpm.records["b"].device_hit_tokens == 8 * PS


def test_request_that_does_not_fit_waits_for_memory_then_loads_back():
    # a's 12 pages are pushed to host by f; c holds 8 of the 16 device pages while it decodes.
    # b then matches a's 12 host pages: b as a whole (13 pages + output) does not fit beside c,
    # so it waits (PrefillAdder.add_one_req: NO_TOKEN), and loads back once c has finished
    # (not "recompute, device_full", which chunking would have allowed).
    trace = [req("a", 0, list(range(1, 13))), req("f", 100, list(range(100, 112))),
             req("c", 300, list(range(200, 204)), output=200), req("b", 301, list(range(1, 13)) + [50])]
    engine, probe = run(trace, max_prefill_tokens=2 * PS)
    b, c = probe.records["b"], probe.records["c"]
    assert (b.host_match_tokens, b.loadback_skipped_reason, b.loadback_skipped_tokens) == (12 * PS, None, 0)
    assert (b.hit_class, b.host_hit_tokens, b.computed_tokens, b.recomputed_tokens) == ("tiered_hit", 12 * PS, PS + 1, 0)
    assert b.num_chunks == 1 and b.cache_protected_len == b.prefix_indices_len == 12 * PS
    assert b.arrival_ns + b.queue_ns >= c.finish_ns  # it was admitted only after c had finished
    assert not probe.skips
    engine.check_invariants(idle=True)


def test_a_device_pool_larger_than_the_gpu_is_allowed_but_called_out():
    assert EngineConfig().warnings() == []
    (warning,) = EngineConfig(device_tokens=2_000_000, data_plane_mib=128).warnings()
    assert "244.1 GiB" in warning and "h200" in warning  # binary units, as every size view
