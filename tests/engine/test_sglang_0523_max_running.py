"""Issue 43's last known gap: SGLang caps the requests running at once at `max_running_requests`,
and the engine now does too.

Where the number comes from. SGLang 0.5.23 `KVCacheConfigurator.resolve_max_num_reqs(
token_capacity)` (mem_cache/kv_cache_configurator.py): with no `--max-running-requests`,
`int(token_capacity / context_len * 512)` clamped to [2048, 4096], then at most
`token_capacity // 2`; with one, `max(1, N // attn_dp_size)`, also at most `token_capacity // 2`.
The ReqToTokenPool gets that many rows, `tp_worker.get_worker_info` hands it to the scheduler as
`max_running_requests`, and `pp_max_micro_batch_size` defaults to it. 0.5.9
(`ModelRunner.init_memory_pool`) derives the same default and takes a given N as it is (rule
`max_running_capped_by_pool`). The engine: `EngineConfig.resolved_max_running_requests`, from
the device pool and `max_context` (`--max-context`), per scheduler (each `--dp` rank is a
scheduler of its own behind the router: no attention-DP division).

Where it is tested. `Scheduler.get_num_allocatable_reqs` is the cap less the running batch
(`pp_max_micro_batch_size - running_bs`; in 0.5.23 also at most the ReqToTokenPool's free rows
plus the row a continuing chunk holds, the same number). 0.5.23 `_get_new_batch_prefill_raw`:
none allocatable and no chunked request -> `running_batch.batch_is_full = True`, no prefill
batch (the pass decodes); in the loop over the waiting queue, `len(adder.can_run_list) >=
get_num_allocatable_reqs(...)` -> `batch_is_full`, break. Only a request leaving the running
batch clears the flag (`running_batch.filter_batch()` in `get_next_batch_to_run`).

Pools: page 64 (helpers.PS), device 64 pages (memory never binds here), the tiny model.
"""

from __future__ import annotations

import pytest

from tests.engine import helpers
from tests.engine.helpers import PS, req
from tierdiag.config.engine import EngineConfig
from tierdiag.config.releases import resolve_max_running_requests
from tierdiag.engine.engine import Engine
from tierdiag.probes import events as ev


class Batches(helpers.Collect):
    def __init__(self):
        super().__init__()
        self.batches: dict[int, list[str]] = {}

    def emit(self, event):
        super().emit(event)
        if isinstance(event, ev.PrefillDone):
            self.batches.setdefault(event.batch_id, []).append(event.req_id)


def _run(version: str, cap: int | None):
    # six requests at one instant, a page and a token each (distinct prefixes), 20 output tokens
    reqs = [req(n, 0, [10 * i + 1], output=20) for i, n in enumerate("abcdef")]
    probe = Batches()
    cfg = helpers.small_config(device_tokens=64 * PS, host_tokens=64 * PS, max_running_requests=cap,
                               sglang_rules=version)
    engine = Engine(cfg, probe=probe)
    engine.run(helpers.numbered(reqs))
    engine.check_invariants(idle=True)
    return engine, probe


@pytest.mark.parametrize("version", ["0.5.23", "0.5.9"])
def test_requests_past_the_cap_wait_for_a_running_one_to_leave(version):
    """Cap 4, six requests arriving together. The first pass admits a-d and stops at e
    (`len(can_run_list)` 4 >= 4 allocatable: batch_is_full). a-d then run; every later pass finds
    none allocatable (4 - 4 running) and decodes. a-d finish at one decode step; the pass after
    it (filter_batch: the running batch empty) admits e and f. Without a cap (derived: 2,048 here,
    the estimate's floor, under half the pool) all six go in the first batch."""
    engine, probe = _run(version, 4)
    assert engine.scheduler.max_running == 4
    batches = list(probe.batches.values())
    assert batches == [list("abcd"), list("ef")]
    rec = probe.records
    first_out = max(rec[n].finish_ns for n in "abcd")
    assert min(rec[n].first_token_ns for n in "ef") > first_out
    # e and f waited the whole of a-d's decode: their TTFT is a-d's time to finish and more
    assert all(rec[n].ttft_ns > rec["a"].finish_ns - rec["a"].arrival_ns for n in "ef")

    free_engine, free = _run(version, None)
    assert free_engine.scheduler.max_running == 2048
    assert list(free.batches.values()) == [list("abcdef")]
    assert all(free.records[n].ttft_ns < rec[n].ttft_ns for n in "ef")


def test_the_derived_cap_follows_the_pool_and_the_context():
    """resolve_max_num_reqs on the engine's own sizes: the default llama3-8b on an h200 (824,064
    device tokens, 131,072 context) gets int(824064 / 131072 * 512) = 3,219; a 32k context 4,096
    (the estimate's ceiling); a pool of 2,048 tokens half of it, 1,024; a given cap above half
    the pool is lowered to it in 0.5.23 (with the warning SGLang logs) and kept in 0.5.9."""
    assert EngineConfig().resolved_max_running_requests() == 3219
    assert EngineConfig(max_context_tokens=32768).resolved_max_running_requests() == 4096
    assert EngineConfig(device_tokens=2048, host_tokens=4096).resolved_max_running_requests() == 1024
    big = EngineConfig(device_tokens=2048, host_tokens=4096, max_running_requests=5000)
    assert big.resolved_max_running_requests() == 1024
    assert any("--max-running-requests 5,000 is reduced to 1,024" in w for w in big.warnings())
    old = EngineConfig(device_tokens=2048, host_tokens=4096, max_running_requests=5000, sglang_rules="0.5.9")
    assert old.resolved_max_running_requests() == 5000 and not old.warnings()
    back = EngineConfig(device_tokens=2048, host_tokens=4096, max_running_requests=5000,
                        sglang_switched_back="max_running_capped_by_pool")
    assert back.resolved_max_running_requests() == 5000
    assert resolve_max_running_requests(None, 10**9, 1, True) == 4096
    assert EngineConfig(max_running_requests=7).to_json()["max_running_requests"] == 7
    assert EngineConfig().to_json()["max_running_requests"] == 3219


@pytest.mark.parametrize("mixed", [False, True])
def test_a_continuing_chunk_goes_on_at_the_cap(mixed):
    """0.5.23 skips the early return for a chunked request ("A chunked request skips this check:
    it keeps its req_to_token row across chunks"): cap 2, a running (long output), b chunked over
    several passes beside it. b's chunks go on while a runs (a and b hold the two rows); c, which
    arrives meanwhile, waits for a row: the loop finds `len(can_run_list)` (b) >= 2 - 1."""
    a = req("a", 0, [1], output=300)
    b = req("b", 0.001, list(range(100, 140)), output=2)  # 40 pages: chunks of 16 pages
    c = req("c", 0.002, [500], output=2)
    probe = Batches()
    cfg = helpers.small_config(device_tokens=128 * PS, host_tokens=128 * PS, max_prefill_tokens=16 * PS,
                               max_running_requests=2, enable_mixed_chunk=mixed)
    engine = Engine(cfg, probe=probe)
    engine.run(helpers.numbered([a, b, c]))
    engine.check_invariants(idle=True)
    rec = probe.records
    assert all(rec[n].status == "finished" for n in "abc")
    c_batch = next(i for i, m in probe.batches.items() if "c" in m)
    b_batches = [i for i, m in probe.batches.items() if "b" in m]
    assert len(b_batches) >= 3 and c_batch > max(b_batches)
    assert rec["c"].first_token_ns > min(rec[n].finish_ns for n in "ab")


def test_at_the_cap_0_5_9_still_sorts_the_queue():
    """Rule `max_running_check_returns_early`. y leaves page 1 cached, z pages 5-7; then a, b, c
    arrive together, a on y's page, b and c on 2 and 3 of z's, under lpm with cap 2: the first
    pass admits c and b (longest prefixes first) and stops at a. Their batch started the running batch, so the next
    pass starts with `batch_is_full` clear and two running: 0.5.23 returns at
    `get_num_allocatable_reqs <= 0` before `calc_priority`; 0.5.9's early return tests
    `chunked_req is not None` instead, so it sorts the queue (`calc_priority`: lpm matches a's
    prefix, stamping page 1's node at that pass) and only then meets the cap in the loop."""
    def stamps(back: str | None) -> list[int]:
        reqs = [req("y", 0, [1], output=2), req("z", 0, [5, 6, 7], output=2), req("a", 50, [1, 90], output=30),
                req("b", 50, [5, 6, 91], output=30), req("c", 50, [5, 6, 7, 92], output=30)]
        cfg = helpers.small_config(device_tokens=64 * PS, host_tokens=64 * PS, max_running_requests=2,
                                   schedule_policy="lpm", sglang_switched_back=back)
        engine = Engine(cfg, probe=helpers.Collect())
        sched = engine.scheduler
        form = sched.schedule_pass
        seen = []

        def watched(now):  # page 1's node (y's, a's prefix): stamped at this pass?
            end = form(now)
            node = sched.tree.root.children.get(1)
            seen.append(node is not None and node.last_access_ns == now)
            return end

        sched.pass_fn = watched
        engine.run(helpers.numbered(reqs))
        engine.check_invariants(idle=True)
        return seen

    new, old = stamps(None), stamps("max_running_check_returns_early")
    assert new != old
    # the pass after c and b's batch: stamped by 0.5.9's calc_priority only
    first = next(i for i, (n, o) in enumerate(zip(new, old)) if n != o)
    assert old[first] and not new[first]


def test_a_recorded_run_keeps_a_derived_cap_derived():
    """The run's config records the cap used (`max_running_requests`) and the one given
    (`max_running_requests_given`, None when derived). advise's candidates start from the
    recorded config: a derived cap stays derived (from the candidate's own pools), a given one
    stays given, and a run recorded before the cap derives it."""
    from types import SimpleNamespace

    from tierdiag.app.advise import replayed_config

    derived = EngineConfig(device_tokens=2048, host_tokens=4096).to_json()
    assert derived["max_running_requests"] == 1024 and derived["max_running_requests_given"] is None
    base = replayed_config(SimpleNamespace(config=derived))
    assert base["max_running_requests"] is None
    bigger = EngineConfig(**{**base, "device_tokens": 8192, "host_tokens": 16384})
    assert bigger.resolved_max_running_requests() == 2048  # its own pool's, not the recorded 1,024
    given = replayed_config(SimpleNamespace(config=EngineConfig(max_running_requests=16).to_json()))
    assert given["max_running_requests"] == 16
    old = {k: v for k, v in derived.items() if not k.startswith("max_running")}
    assert replayed_config(SimpleNamespace(config=old))["max_running_requests"] is None
