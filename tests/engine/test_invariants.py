"""Property tests of the engine: whatever the workload and configuration, the invariants hold.

- token conservation per request: device + host + storage + computed == input;
- pool accounting: free + used == capacity, no slot owned twice, no leak once idle;
- device-resident nodes form a root-connected prefix;
- lock refs return to zero (the root to its resting 1) when all requests finish;
- every loaded-back byte equals what was written for that page (verify="all");
- the TTFT decomposition adds up exactly;
- determinism: the same trace and config give the same records and eviction order;
- decode on the clock: decode pages come back (no leak once idle) through finishes and
  retractions alike, the decode wait is part of the queue, a retracted request still conserves
  its tokens (its record keeps its first admission).

Workloads carry output tokens (their pages are inserted at finish), `priority` and `extra_key`
(a conversation asked under two keys); configurations draw every eviction policy.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine.helpers import PS, Collect, numbered, small_config
from tierdiag.config.engine import RELEASE_OFFERS, SGLANG_RULES
from tierdiag.engine.engine import Engine
from tierdiag.trace.reader import TraceRequest


@st.composite
def workloads(draw):
    """Requests that share prefixes of a few 'conversations', arriving in bursts and gaps."""
    num_convs = draw(st.integers(1, 5))
    convs = [[c * 10_000 + p for p in range(draw(st.integers(1, 12)))] for c in range(1, num_convs + 1)]
    n = draw(st.integers(1, 40))
    t_ns = 0
    reqs = []
    fresh = 900_000
    for i in range(n):
        t_ns += draw(st.sampled_from([0, 10_000, 1_000_000, 50_000_000, 500_000_000]))
        conv = convs[draw(st.integers(0, num_convs - 1))]
        shared = conv[: draw(st.integers(0, len(conv)))]
        new = list(range(fresh, fresh + draw(st.integers(0, 6))))
        fresh += 10
        pages = shared + new
        extra = draw(st.integers(0, PS - 1))
        if not pages and not extra:
            extra = 1
        hash_ids = tuple(pages) + ((fresh + 5,) if extra else ())
        fresh += 10
        reqs.append(TraceRequest(f"r{i}", i, i + 1, t_ns, len(pages) * PS + extra,
                                 draw(st.integers(0, 200)), hash_ids, None,
                                 priority=draw(st.sampled_from([0, 0, 1, 7])),
                                 extra_key=draw(st.sampled_from([None, None, "lora-a"]))))
    return reqs


@st.composite
def configs(draw):
    storage = draw(st.sampled_from([0, 0, 48 * PS]))
    device = draw(st.integers(4, 40))
    rules = draw(st.sampled_from(SGLANG_RULES))
    return small_config(
        device_tokens=device * PS,
        host_tokens=draw(st.integers(device, 80)) * PS,  # HiCache: host >= device
        storage_tokens=storage,
        write_policy=draw(st.sampled_from(["write_through", "write_through_selective", "write_back"])),
        eviction_policy=draw(st.sampled_from(RELEASE_OFFERS[rules]["eviction_policy"])),  # what the release has
        prefetch_policy=draw(st.sampled_from(["best_effort", "wait_complete", "timeout"])),
        prefetch_threshold=draw(st.sampled_from([0, PS, 4 * PS])),
        load_back_threshold=draw(st.sampled_from([0, 10, 2 * PS, 10 * PS])),
        max_prefill_tokens=draw(st.integers(1, 16)) * PS,
        layerwise_overlap=draw(st.booleans()),
        schedule_policy=draw(st.sampled_from(["fcfs", "lpm"])),
        sglang_rules=rules,
        enable_mixed_chunk=draw(st.booleans()),
        waiting_prefix_refresh=draw(st.booleans()),
    )


def replay(reqs, cfg, tmp_path, tag):
    probe = Collect()
    cfg = cfg if not cfg.storage_tokens else type(cfg)(**{**cfg.__dict__, "storage_dir": str(tmp_path / tag)})
    engine = Engine(cfg, probe=probe)
    engine.run(numbered(reqs))
    return engine, probe


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reqs=workloads(), cfg=configs())
def test_invariants_hold_for_any_workload(reqs, cfg, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("inv")
    engine, probe = replay(reqs, cfg, tmp_path, "a")
    engine.check_invariants(idle=True)
    assert len(probe.records) == len(reqs), "every request finishes or is rejected"
    loaded_pages = 0
    for r in probe.records.values():
        if r.status == "rejected":
            if r.reject_reason.startswith("aborted"):  # retract_decode's last request, out of memory alone
                assert r.retractions >= 0
                continue
            overhead = engine.scheduler.rules.admission_overhead_pages  # 0.5.23: a page a request
            # PrefillAdder.add_one_req into an empty pool: input + min(output, 4096) + overhead < pool
            assert r.reject_reason and (r.input_tokens + min(r.output_tokens, 4096) + overhead * PS
                                        >= engine.device.capacity * PS)
            continue
        # Decode on the clock: of the queue, the decode steps it waited behind; retractions counted
        assert 0 <= r.decode_wait_ns <= r.queue_ns and r.retractions >= 0
        assert r.finish_ns >= r.first_token_ns
        assert r.prefix_indices_len + r.computed_tokens == r.input_tokens
        assert r.computed_tokens >= 1, "the last input token is always computed"
        if cfg.sglang_rules != "0.5.9" or not r.loadback_skipped_reason:
            # 0.5.9 reports a declined load-back's promised host hit as host (cached_split.split_promised)
            assert r.prefix_indices_len == r.device_hit_tokens + r.host_hit_tokens + r.storage_hit_tokens
        assert r.prefix_indices_len % PS == 0, "matching is page-aligned"
        parts = (r.queue_ns, r.storage_wait_ns, r.loadback_exposed_ns, r.recompute_ns, r.compute_ns)
        assert min(parts) >= 0 and sum(parts) == r.ttft_ns
        assert 0 <= r.recomputed_tokens <= r.computed_tokens
        if r.loadback_skipped_reason:
            if cfg.sglang_rules != "0.5.9":  # 0.5.9 reports the promised host hit as host
                assert r.host_hit_tokens == r.storage_hit_tokens == 0
            # a declined load-back leaves the device part as the protected prefix
            assert r.cache_protected_len == r.prefix_indices_len  # the device part: nothing was loaded
            if cfg.sglang_rules != "0.5.9":
                assert r.cache_protected_len == r.device_hit_tokens
        else:
            assert r.cache_protected_len == r.prefix_indices_len
        loaded_pages += r.loadback_pages
    # loaded-back bytes equal written bytes: every load-back was compared with the page content
    assert engine.stats.verified_data_plane_bytes == engine.stats.loaded_data_plane_bytes
    lb_transfers = [t for t in probe.transfers if t.kind == "load_back"]
    assert all(t.verified for t in lb_transfers)
    transferred = sum(t.pages for t in lb_transfers)
    assert engine.stats.loaded_data_plane_bytes == transferred * engine.plane.page_bytes
    # a retracted request's record keeps its first admission; its re-admission may load back too
    retracted = any(r.retractions for r in probe.records.values())
    assert transferred == loaded_pages if not retracted else transferred >= loaded_pages
    # determinism
    _, again = replay(reqs, cfg, tmp_path, "b")
    assert again.records == probe.records
    assert [(e.node_id, e.action, e.cause_req_id, e.t_ns) for e in again.evictions] == \
           [(e.node_id, e.action, e.cause_req_id, e.t_ns) for e in probe.evictions]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reqs=workloads(), cfg=configs())
def test_an_eviction_row_reads_its_pool_at_its_moment(reqs, cfg, tmp_path_factory):
    """The eviction loops hand their read of the pool's free pages to the victim's row where
    nothing was allocated or freed in that pool since (issue 41, session 36: a generic
    attribute read a row less); with a hook on the controller (`on_eviction`) every row reads
    the pool itself, as before. The rows are the same either way, write-backs, host pressure,
    subtrees and storage included."""
    tmp_path = tmp_path_factory.mktemp("evrow")
    _, handed = replay(reqs, cfg, tmp_path, "handed")
    probe = Collect()
    cfg_b = cfg if not cfg.storage_tokens else type(cfg)(**{**cfg.__dict__, "storage_dir": str(tmp_path / "read")})
    engine = Engine(cfg_b, probe=probe)
    for rank in engine.ranks:
        rank.ctrl.on_eviction = lambda node, tier, action: None
    engine.run(numbered(reqs))
    assert probe.evictions == handed.evictions
