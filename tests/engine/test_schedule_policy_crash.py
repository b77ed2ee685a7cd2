"""A continuing chunk whose pages cannot be freed (the crash of `--schedule-policy
shortest-prefill-first` on the first 2,000 requests of the Mooncake conversation trace:
"request 350: admitted with 63 device pages needed, but eviction could not free them").

SGLang 0.5.23, Scheduler.get_new_batch_prefill: `SchedulePolicy.shortest_prefill_chunk_limit`
caps the chunked request's next chunk (`adder.chunked_req_limit`) so shorter waiting requests
run beside it. `PrefillAdder.add_chunked_req` reserves only that chunk
(`_update_prefill_budget(0, req.extend_len, 0)`), and `add_one_req` checks each shorter request
against `rem_total_tokens` without the chunked request's later chunks: they may take the memory
those chunks need. At the chunked request's next pass `PrefillBudget.available_chunk_tokens`
returns the whole `chunk_limit` when `remaining_total` is spent ("Single-pool continuation
must make progress to release its KV"), and `alloc_paged_token_slots_extend` finds too few free
and evictable tokens: SGLang raises RuntimeError("Prefill out of memory") and the scheduler
dies. FCFS and LPM never get here: a continuing chunk spends the pass's budget, so nobody is
admitted beside it, and the whole request was within `rem_total_tokens` at its admission.

The engine departs from SGLang only there: the continuing chunk whose pages free and evictable
memory cannot cover waits for a later pass (the engine's 0.5.9 path already does:
`_continue_chunk` returns None), decode steps run and free memory as requests finish.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine.helpers import PS, Collect, numbered, req, small_config
from tests.engine.test_invariants import workloads
from tierdiag.config.engine import SCHEDULE_POLICIES, SCHEDULE_POLICY_RELEASES
from tierdiag.engine.engine import Engine


def pages(lo: int, n: int) -> list[int]:
    return list(range(lo, lo + n))


def _replay(trace, **kw):
    probe = Collect()
    engine = Engine(small_config(**kw), probe=probe)
    engine.run(numbered(trace))
    return engine, probe


def test_a_continuing_chunk_that_memory_cannot_hold_waits_instead_of_crashing():
    """The crash in miniature (SGLang 0.5.23 rules, device 40 pages, budget 16 pages, page 64).
    x (30 pages + 1 token, 1 output token) is admitted alone: 1,921 + 1 + a page < 40 pages.
    Batch 1: x's first chunk, 16 pages. s (12 pages + 1 token, 400 output tokens) arrives
    during it; its work (769) is shorter than what x has left (897), so at batch 2
    `shortest_prefill_chunk_limit` reserves s's 13 pages and caps x's chunk at 3 pages; s is
    admitted beside it (`add_one_req`: 769 + 400 + 64 < 24 pages - (3 pages + a page)), and both
    extends are allocated: 8 pages free. Batch 3: `remaining_total` = 512 - 0.7 x 399 (s's
    decode reservation) = 233 tokens, x takes them (4 pages): 4 free. Batch 4: `remaining_total`
    < 0, so `available_chunk_tokens` gives the whole chunk (x's last 472 tokens, 8 pages) and
    nothing is evictable (x's and s's paths are locked): SGLang's alloc_paged_token_slots_extend
    raises "Prefill out of memory"; the engine raised EngineError. Now x's chunk waits, s
    decodes until its next step does not fit even alone (`retract_decode`'s last request:
    aborted, its inserted input stays cached, unlocked), and the scheduler polls again at once:
    x finishes. FCFS never caps: x runs its two chunks alone, s after."""
    trace = [req("x", 0, pages(100, 30), output=1), req("s", 0.002, pages(500, 12), output=400)]
    kw = dict(sglang_rules="0.5.23", device_tokens=40 * PS, host_tokens=80 * PS, max_prefill_tokens=16 * PS)
    engine, probe = _replay(trace, schedule_policy="shortest-prefill-first", **kw)
    engine.check_invariants(idle=True)
    x, s = probe.records["x"], probe.records["s"]
    assert x.status == "finished" and x.computed_tokens == 30 * PS + 1
    assert s.status == "rejected" and s.reject_reason.startswith("aborted: out of device memory")
    assert engine.device.free_pages + engine.device.used_pages == engine.device.capacity
    engine, probe = _replay(trace, schedule_policy="fcfs", **kw)
    engine.check_invariants(idle=True)
    assert [probe.records[r].status for r in ("x", "s")] == ["finished", "finished"]
    assert (probe.records["x"].num_chunks, probe.records["s"].first_batch_id) == (2, 3)


@st.composite
def _configs(draw):
    """Every --schedule-policy with a release that has it, small device pools and budgets (a
    continuing chunk beside shorter requests), mixed chunk on and off."""
    policy = draw(st.sampled_from(SCHEDULE_POLICIES))
    release = draw(st.sampled_from(SCHEDULE_POLICY_RELEASES[policy]))
    device = draw(st.integers(4, 40))
    return small_config(device_tokens=device * PS, host_tokens=draw(st.integers(device, 80)) * PS,
                        max_prefill_tokens=draw(st.integers(1, 16)) * PS, schedule_policy=policy,
                        sglang_rules=release, enable_mixed_chunk=draw(st.booleans()),
                        load_back_threshold=draw(st.sampled_from([0, 2 * PS])),
                        write_policy=draw(st.sampled_from(["write_through", "write_back"])))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=workloads(), cfg=_configs())
def test_every_schedule_policy_replays_small_pools_without_engine_error(reqs, cfg):
    """Random small traces x every --schedule-policy x small pools: no EngineError, every
    request finishes or is rejected, pool accounting and residency hold, and every lock is
    back to zero once idle (check_invariants(idle=True))."""
    probe = Collect()
    engine = Engine(cfg, probe=probe)
    engine.run(numbered(reqs))
    engine.check_invariants(idle=True)
    assert len(probe.records) == len(reqs)
    for r in probe.records.values():
        if r.status == "finished":  # token conservation
            assert r.prefix_indices_len + r.computed_tokens == r.input_tokens
            assert r.computed_tokens >= 1
    assert engine.device.used_pages + engine.device.free_pages == engine.device.capacity
