"""explain on the planted store: each request gets the class, split, cause and evictors it was built with."""

from __future__ import annotations

import pytest

from tierdiag.diagnose.request.explain import explain_request
from tierdiag.errors import NotFoundError
from tierdiag.store.reader import open_store, resolve_run

from .conftest import MS


@pytest.fixture
def explain(planted):
    con = open_store(planted.path)
    run = resolve_run(con, None)

    def _explain(req_id: str):
        return explain_request(con, run, req_id)

    yield _explain
    con.close()


# req_id -> (class, device, host, storage, computed, recomputed, primary cause, evicted_by)
EXPECTED = {
    "tier": ("tiered_hit", 0, 2048, 0, 64, 0, "load_back", ("f1", "f2")),
    "dev": ("device_hit", 2048, 0, 0, 64, 0, "none", ()),
    "miss": ("miss", 0, 0, 0, 1024, 0, "none", ()),
    "stor": ("tiered_hit", 0, 0, 1024, 64, 0, "storage_fetch", ()),
    "recomp": ("miss", 0, 0, 0, 576, 512, "recompute", ("f2",)),
    "skip": ("miss", 0, 0, 0, 256, 192, "recompute", ("f1",)),
    "queued": ("device_hit", 2048, 0, 0, 64, 0, "queueing", ()),
    "chunky": ("miss", 0, 0, 0, 3000, 0, "compute", ()),
}


@pytest.mark.parametrize("req_id", sorted(EXPECTED))
def test_class_split_cause_and_evictors(explain, req_id):
    cls, device, host, storage, computed, recomputed, cause, evicted_by = EXPECTED[req_id]
    e = explain(req_id)
    assert (e.hit_class, e.primary_cause, e.evicted_by) == (cls, cause, evicted_by)
    t = e.tokens
    assert (t.device_tokens, t.host_tokens, t.storage_tokens, t.computed_tokens, t.recomputed_tokens) == (
        device, host, storage, computed, recomputed)
    assert [s.name for s in e.steps] == ["host_hit_length", "prefix_indices", "load_back", "eviction"]
    assert e.headline.startswith(cause + ":")


def test_json_has_the_design_shape(explain):
    j = explain("tier").to_json()
    for key in ("run_id", "req_id", "class", "ttft_ms", "tokens", "steps", "primary_cause", "counterfactual",
                "evicted_by"):
        assert key in j
    assert set(j["tokens"]) >= {"input", "device", "host", "storage", "computed"}
    assert [s["step"] for s in j["steps"]] == [1, 2, 3, 4]
    assert all(set(s) == {"step", "name", "finding", "evidence"} for s in j["steps"])
    assert set(j["counterfactual"]) == {"ttft_if_device_resident_ms", "recompute_instead_ms",
                                        "ttft_if_never_evicted_ms"}
    # DESIGN §5: context, queue attribution (null without batch rows) and advice.
    assert set(j["context"]) >= {"queue_depth_at_arrival", "prefill_busy_share", "recompute_share_of_prefill",
                                 "window_ms"}
    assert "queue_attribution_ms" in j and isinstance(j["advice"], list) and j["advice"]
    assert all(set(a) >= {"option", "value", "reason", "verified"} for a in j["advice"])
    assert j["ttft_ms"] == pytest.approx(8.06)
    assert j["counterfactual"]["ttft_if_device_resident_ms"] == pytest.approx(0.06)
    assert j["evicted_by"] == ["f1", "f2"]
    # Durations leave as milliseconds, never as raw ns.
    assert not any(k.endswith("_ns") for s in j["steps"] for k in s["evidence"])


def test_tiered_hit_evidence(explain):
    e = explain("tier")
    prefix = e.steps[1].evidence
    assert (prefix.prefix_indices_len, prefix.device_original_tokens, prefix.restored_tokens) == (2048, 0, 2048)
    assert prefix.restored_share == 1.0 and prefix.cache_protected_len == 2048
    lb = e.steps[2].evidence
    assert lb.loaded_tokens == 2048 and lb.loadback_bytes == 2048 * 131_072
    assert lb.exposed_ns == 8 * MS and lb.overlapped_ns == lb.loadback_ns - 8 * MS
    assert lb.achieved_bytes_per_s == pytest.approx(25e9, rel=1e-3)
    assert lb.link_peak_share == pytest.approx(1.0, rel=1e-3)
    assert [t.kind for t in lb.transfers] == ["load_back"]
    ev = e.steps[3].evidence
    assert ev.num_events == 2 and ev.demoted_tokens == 2048 and ev.dropped_tokens == 0
    assert [x.cause_req_id for x in ev.events] == ["f1", "f2"]
    assert ev.events[0].pool_used_share == pytest.approx(4032 / 4096) and ev.events[0].locked_tokens == 2048
    # Between warm's last use (1 ms) and tier's arrival (20 ms) f1 and f2 allocated 2 x (2048 + 16).
    assert ev.reuse_distance_tokens == 2 * (2048 + 16)
    assert "f1, f2" in e.verdict and "loaded back" in e.verdict


def test_skipped_load_back_is_shown_as_such(explain):
    e = explain("skip")
    step1 = e.steps[0]
    assert step1.evidence.loadback_skipped_reason == "below_threshold"
    assert step1.evidence.loadback_skipped_tokens == 192 and step1.evidence.host_hit_length == 0
    assert "skipped (below_threshold)" in step1.finding and "256" in step1.finding
    assert "skipped" in e.steps[2].finding


def test_queueing_says_the_cache_was_fine(explain):
    assert explain("queued").headline == "queueing: 91 % of TTFT; the cache was a full device hit"


def test_storage_and_recompute_evidence(explain):
    stor = explain("stor")
    assert stor.steps[2].evidence.storage_wait_ns == 4 * MS
    assert [t.kind for t in stor.steps[2].evidence.transfers] == ["prefetch", "load_back"]
    recomp = explain("recomp").steps[3].evidence
    assert recomp.demoted_tokens == 512 and recomp.host_deleted_tokens == 512
    assert [(x.tier, x.action) for x in recomp.events] == [("device", "demote"), ("host", "delete")]


def test_rejected_request_is_explained_without_a_cause(explain):
    e = explain("rej")
    assert e.status == "rejected" and e.primary_cause is None and e.decomposition is None
    assert "larger than the device pool" in e.verdict
    assert e.to_json()["ttft_ms"] is None


def test_unknown_id_names_the_run_and_suggests(explain, planted):
    with pytest.raises(NotFoundError) as info:
        explain("tierr")
    msg = info.value.one_line()
    assert planted.run_id in msg and "planted" in msg and "did you mean tier" in msg
    assert "\n" not in msg


def test_decomposition_adds_up(explain):
    for req_id in EXPECTED:
        d = explain(req_id).decomposition
        assert d.queue_ns + d.storage_wait_ns + d.loadback_exposed_ns + d.recompute_ns + d.compute_ns == d.ttft_ns
        assert d.excess_ns == d.ttft_ns - d.ideal_ttft_ns
