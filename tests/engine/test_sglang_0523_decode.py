"""Issue 43's divergences from SGLang, each narrated with the SGLang function it restates: the
last output token's page, the finish's second insert at the prompt boundary (priority + 1),
the waiting-prefix refresh, and decode on the scheduler's clock with its memory and retraction.

Pools: device 16 pages, host 64 pages of 64 tokens unless a test says otherwise (helpers.small_config).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine import helpers
from tests.engine.helpers import PS, req
from tierdiag.config.engine import load_config
from tierdiag.engine.engine import Engine
from tierdiag.probes import events as ev
from tierdiag.errors import ConfigFileError
from tierdiag.trace.pages import page_keys_array
from tierdiag.trace.reader import TraceRequest


def pages(lo: int, n: int) -> list[int]:
    return list(range(lo, lo + n))


# --- 2. the last output token has no KV slot ----------------------------------------------------
@pytest.mark.parametrize("version", ["0.5.23", "0.5.9"])
def test_the_last_output_token_never_gets_a_kv_slot(version):
    """`ScheduleBatch.prepare_for_decode` -> `alloc_for_decode` (both releases) allocates, each
    decode step, the slot of the token the step reads: the previous step's output. The extend
    holds the input; output_len tokens take output_len - 1 decode steps, so a request holds
    ceil((input + output - 1) / page) pages, never ceil((input + output) / page).
    x leaves 5 evictable pages, 11 free. a's input is 9 pages + 1 token and its 64 output tokens
    fill its 10th page exactly (positions 577..639): 10 pages, with the allocation's page
    (`alloc_paged_token_slots_extend`) 11 = free, so x stays on device. Counting the last token
    (input + output = 9 pages + 65 tokens: 11 pages, 12 with the allocation's page) evicted x.
    (0.5.23's admission page, `per_req_token_overhead`, makes 11 = free there too.)"""
    x = req("x", 0, pages(1, 5), output=1)
    a = req("a", 1000, pages(100, 9), output=PS)
    engine, probe = helpers.run([x, a], sglang_rules=version)
    assert probe.evictions == []
    assert probe.records["a"].status == "finished"
    assert engine.tree.match(list(range(1, 6)), 10**12, "probe").device_pages == 5


# --- 1. the finish's second insert at the prompt boundary ----------------------------------------
def _priority_run(version):
    """a (prompt 4 pages, 1 output page) finishes, then b (4 pages, no output page), both at
    priority 0; c then needs 4 of their 9 pages under `--eviction-policy priority`."""
    a = req("a", 0, pages(1, 4), output=PS)
    b = req("b", 1000, pages(100, 4), output=1)
    c = req("c", 2000, pages(200, 9), output=1)
    engine, probe = helpers.run([a, b, c], sglang_rules=version, eviction_policy="priority")
    assert {r.status for r in probe.records.values()} == {"finished"}
    later = 10**13
    return (engine.tree.match(pages(1, 4), later, "probe").device_pages,
            engine.tree.match(pages(100, 4), later, "probe").device_pages)


def test_a_finished_prompt_is_inserted_again_one_priority_up():
    """`UnifiedRadixCache.checkpoint_into_tree` (0.5.23): after the finished request's insert of
    input + output (`token_ids[:up_to]`), "split the leaf at the prompt boundary so eviction can
    drop the output KV without the prompt": the page-aligned `origin_input_ids` are inserted again
    with `priority=min(insert_params.priority + 1, int64 max)`, `prev_prefix_len` and
    `inserted_len` at the prompt (nothing freed, no hit). So a's prompt nodes carry priority 1,
    its output page and b (whose output took no page: nothing past the prompt, no second
    insert) priority 0, and the priority policy (lowest first, then LRU) evicts a's output page
    and b for c, keeping a's prompt, which LRU alone (a finished first) would have evicted."""
    assert _priority_run("0.5.23") == (4, 0)


def _priorities(version):
    """The priority of each node under the root after a (4 prompt pages, 1 output page) finished."""
    engine, _ = helpers.run([req("a", 0, pages(1, 4), output=PS)], sglang_rules=version)
    out, node = [], engine.tree.root
    while node.children:
        (node,) = node.children.values()
        out.append((len(node.keys), node.priority))
    return out


def test_0_5_9_inserts_a_finished_request_once():
    """`RadixCache.cache_finished_req` (0.5.9, inherited by HiRadixCache): one insert of the
    committed KV at the request's priority, so every node keeps priority 0; 0.5.23 raises the
    prompt's to 1 and leaves the output page's at 0."""
    assert _priorities("0.5.9") == [(4, 0), (1, 0)]
    assert _priorities("0.5.23") == [(4, 1), (1, 0)]


# --- 4. the waiting-prefix refresh ---------------------------------------------------------------
def tiny(req_id: str, t_ms: float) -> TraceRequest:
    """Less than a page of input, one output token: a scheduling pass that caches nothing."""
    return TraceRequest(req_id=req_id, seq=0, line=1, arrival_ns=int(t_ms * 1e6), input_len=10, output_len=1,
                        hash_ids=(10**7 + int(t_ms),), tokens=None)


def _refresh_run(**kw):
    """x (4 pages) then y (4 other pages) finish and stay cached; 30 passes of tiny requests
    follow; at 2 s B (7 pages + 1 token) and w (x's 4 pages + 3 more) arrive together, B first:
    the 33rd pass. B's extend fills the prefill budget (8 pages), so w waits for the next batch;
    B's allocation needs one page more than is free: LRU evicts one whole node, x (older) or y.
    (In one batch, w's match would lock x before the batch's eviction: `_alloc_batch`.)"""
    x = req("x", 0, pages(1, 4), output=1)
    y = req("y", 1000, pages(100, 4), output=1)
    fillers = [tiny(f"t{i}", 1100 + 10 * i) for i in range(kw.pop("fillers", 30))]
    b = req("B", 2000, pages(200, 7), output=1)
    w = req("w", 2000, pages(1, 4) + pages(300, 3), output=1)
    _, probe = helpers.run([x, y, *fillers, b, w], max_prefill_tokens=8 * PS, **kw)
    return probe.records["w"]


def test_the_waiting_queue_prefixes_are_touched_every_32nd_pass():
    """`SchedulePolicy.calc_priority` -> `_touch_waiting_prefixes` (0.5.23, on by default:
    `SGLANG_ENABLE_WAITING_PREFIX_REFRESH`): under a cache-agnostic active policy (fcfs here) and
    `lru` eviction, the passes that reach it are counted (`_waiting_prefix_refresh_calls`) and on
    every 32nd, the first of them included (`calls % WAITING_PREFIX_REFRESH_INTERVAL == 0`), the
    first 128 waiting requests' prefixes are walked head last (`touch_waiting_prefix` ->
    `touch_prefix`, a match that only stamps). The pass that admits B is the 33rd: it touches
    w's prefix, x, which is then newer than y, so B's eviction takes y and w finds x on device.
    With the switch off (`waiting_prefix_refresh = false`) x is the older node and goes; one
    tiny request fewer and B's pass is the 32nd, which does not refresh."""
    on = _refresh_run()
    assert (on.device_hit_tokens, on.host_hit_tokens) == (4 * PS, 0)
    off = _refresh_run(waiting_prefix_refresh=False)
    assert (off.device_hit_tokens, off.host_hit_tokens) == (0, 4 * PS)
    assert _refresh_run(fillers=29).device_hit_tokens == 0


def test_0_5_9_has_no_waiting_prefix_refresh_nor_does_a_non_lru_policy():
    """0.5.9's `calc_priority` has no `_touch_waiting_prefixes`; in 0.5.23 it returns at once
    unless `radix_eviction_policy` is `lru`."""
    old = _refresh_run(sglang_rules="0.5.9")
    assert old.device_hit_tokens == 0
    fifo = _refresh_run(eviction_policy="fifo")
    assert fifo.device_hit_tokens == 0


@settings(max_examples=40, deadline=None)
@given(key=st.sampled_from(["waiting_prefix_refresh", "enable_mixed_chunk"]),
       value=st.one_of(st.integers(), st.floats(allow_nan=True), st.text(max_size=20),
                       st.lists(st.booleans(), max_size=2), st.booleans()))
def test_the_new_switches_take_true_or_false_only(tmp_path_factory, key, value):
    """The config keys `waiting_prefix_refresh` and `enable_mixed_chunk`: a TOML boolean;
    anything else is refused before any work, in one line naming the file and the key."""
    import tomli_w

    path = tmp_path_factory.mktemp("cfg") / "c.toml"
    path.write_text(tomli_w.dumps({key: value}), encoding="utf-8")
    if isinstance(value, bool):
        assert getattr(load_config(path, {}), key) is value
        return
    with pytest.raises(ConfigFileError) as exc:
        load_config(path, {})
    msg = str(exc.value)
    # config/schema.py's wording: "--config F: KEY VALUE must be true or false (...)"
    assert "\n" not in msg and msg.startswith(f"--config {path}: {key} ") and "must be true or false" in msg


# --- 5 and 3. decode on the clock, its memory and retraction -------------------------------------
class Batches(helpers.Collect):
    """Collect, plus the batch rows."""

    def __init__(self):
        super().__init__()
        self.batches = []
        self.steps = []

    def emit(self, event):
        super().emit(event)
        if isinstance(event, ev.BatchScheduled):
            self.batches.append(event)
        elif isinstance(event, ev.DecodeStep):
            self.steps.append(event)


def run_batches(trace, **kw):
    probe = Batches()
    engine = Engine(helpers.small_config(**kw), probe=probe)
    engine.run(helpers.numbered(trace))
    engine.check_invariants(idle=True)
    return engine, probe


@pytest.mark.parametrize("version", ["0.5.23", "0.5.9"])
def test_decode_steps_run_only_when_no_prefill_can_be_formed(version):
    """Scheduler.get_next_batch_to_run (both releases, mixed chunk off): `get_new_batch_prefill`
    first; only when it forms no batch does `update_running_batch` run a decode step of the
    running requests, each step on the GPU for `decode_step_ns` of the KV it reads. a decodes 200
    tokens (199 steps after the token its prefill samples); b arrives in the middle of one of a's
    steps: its prefill waits for that step to end (its whole queue, the record's
    `decode_wait_ns`), then runs before a's next step, which waits for it in turn."""
    a = req("a", 0, pages(1, 2), output=200)
    b = req("b", 1.5, pages(50, 2), output=1)
    engine, probe = run_batches([a, b], sglang_rules=version)
    ra, rb = probe.records["a"], probe.records["b"]
    assert ra.first_token_ns < rb.arrival_ns < rb.first_token_ns < ra.finish_ns
    assert 0 < rb.decode_wait_ns == rb.queue_ns
    assert engine.scheduler.stats.decode_steps == 199
    # each step as the harness sees it (events.DecodeStep, not stored): a alone, on the clock
    assert [x.step for x in probe.steps] == list(range(1, 200))
    assert all(x.req_ids == ("a",) and x.batch_id is None and x.t_end_ns > x.t_start_ns for x in probe.steps)
    # a's decode time: its 199 steps and b's prefill batch between two of them
    b_batch = next(x for x in probe.batches if x.batch_id == rb.first_batch_id)
    assert ra.finish_ns - ra.first_token_ns == engine.scheduler.stats.decode_ns + (b_batch.t_end_ns - b_batch.t_start_ns)
    assert b_batch.num_decoding == 1  # a held its memory meanwhile


@pytest.mark.parametrize("version", ["0.5.23", "0.5.9"])
def test_output_pages_are_allocated_a_decode_step_at_a_time(version):
    """`alloc_for_extend` allocates the extend (the input) only; `prepare_for_decode` ->
    `alloc_for_decode` allocates each step's slot, a page when it starts one
    (`new_tokens_required_next_decode`: kv_committed_len % page == 0). After its prefill, a
    (1 page + 1 token of input, 640 output tokens) holds 2 device pages, not the 11 its whole
    KV will take; at finish 11 (65 + 639 tokens) are in the tree."""
    a_in = pages(1, 1)
    w = helpers.Watch({"a": a_in})
    engine = Engine(helpers.small_config(sglang_rules=version), probe=w)
    w.engine = engine
    engine.run(helpers.numbered([req("a", 0, a_in, output=10 * PS)]))
    assert w.at("prefilled", "a")["device_used_pages"] == 2
    assert engine.tree.device_pages == 11


def _three(**kw):
    """a, b and c (a page + 1 token each; 700, 700 and 600 output tokens) on a 32-page pool,
    each admitted at a pass after the one before it, while new_token_ratio (0.7) reserves 70 %
    of what the running ones may still decode: their whole KV (12 + 12 + 11 pages) does not fit."""
    trace = [req("a", 0, [1], output=700), req("b", 1, [2], output=700), req("c", 2, [3], output=600)]
    return run_batches(trace, device_tokens=32 * PS, **kw)


@pytest.mark.parametrize("version", ["0.5.23", "0.5.9"])
def test_a_decode_step_that_does_not_fit_retracts_the_request_with_the_least_output(version):
    """`update_running_batch`: `check_decode_mem` fails (the pool is full of a's, b's and c's
    pages) -> `retract_decode`: requests ordered by (output so far, -input) descending, the last
    (c: admitted last, the least output) retracted (`release_req` -> `release_kv_cache(
    checkpoint=False)`: its own pages freed, its input page left cached, unlocked) until the
    next step fits; `new_token_ratio` becomes (generated + 20 x kept) / (max_new of the kept + 1);
    c goes back to the waiting queue (`_add_request_to_queue(is_retracted=True)`) and is
    prefilled again, input and output so far, once memory allows. Its record keeps its first
    admission (TTFT, batch, tier split) and counts the retraction."""
    engine, probe = _three(sglang_rules=version)
    r = probe.records
    assert [r[x].retractions for x in "abc"] == [0, 0, 1]
    assert engine.scheduler.stats.retractions == 1
    assert {x.status for x in r.values()} == {"finished"}
    assert (r["c"].first_batch_id, r["c"].num_chunks) == (3, 1)  # the first admission's
    assert r["c"].computed_tokens == PS + 1 and r["c"].finish_ns > max(r["a"].finish_ns, r["b"].finish_ns)
    # retracted mid-decode, so its re-prefill holds more than its input: a prefill batch of
    # c's input and output so far, less the input page it had left cached
    again = [x for x in probe.batches if x.batch_id > 3]
    assert len(again) == 1 and again[0].num_reqs == 1 and again[0].extend_tokens > 1 + PS
    assert engine.scheduler.new_token_ratio < 1


def test_retraction_frees_memory_without_a_checkpoint_and_evicts_for_the_rest():
    """`release_req`: after `release_kv_cache(checkpoint=False)`, `evict_from_tree_cache` for
    20 decode steps of each request left (SGLANG_RETRACT_DECODE_STEPS): 2 requests x 20 tokens
    fit in a page, which the retraction had just freed, so nothing is evicted while a and b
    decode; c's input page, inserted after its prefill, stays in the tree: its re-prefill
    finds it on device and computes the one input token past it and its output so far."""
    engine, probe = _three()
    r = probe.records
    assert r["c"].retractions == 1
    assert all(e.t_ns >= max(r["a"].finish_ns, r["b"].finish_ns) for e in probe.evictions)
    again = [x for x in probe.batches if x.batch_id > 3]
    generated = again[0].extend_tokens - 1  # the re-prefill: 1 input token + the output so far
    assert 0 < generated < 600


def test_mixed_chunk_carries_the_running_decodes_in_the_prefill_batch():
    """`--enable-mixed-chunk` (`is_mixed_chunk`): `_get_new_batch_prefill_raw` mixes the running
    batch into the prefill batch (`mix_with_running`) when its step fits (`check_decode_mem`),
    and the prefill budget is less a token a running request (`num_mixed_decode_tokens`). b's
    prefill batch then also takes a's decode step: a's 199 steps are the same, one of them in
    b's batch, whose time is its prefill and that step."""
    a = req("a", 0, pages(1, 2), output=200)
    b = req("b", 1.5, pages(50, 2), output=1)
    plain, p0 = run_batches([a, b])
    mixed, p1 = run_batches([a, b], enable_mixed_chunk=True)
    assert plain.scheduler.stats.decode_steps == mixed.scheduler.stats.decode_steps == 199
    b0 = next(x for x in p0.batches if x.batch_id == p0.records["b"].first_batch_id)
    b1 = next(x for x in p1.batches if x.batch_id == p1.records["b"].first_batch_id)
    assert b1.compute_ns > b0.compute_ns and b1.t_end_ns - b1.t_start_ns > b0.t_end_ns - b0.t_start_ns
    assert mixed.scheduler.stats.decode_ns < plain.scheduler.stats.decode_ns  # one step rode in b's batch
    assert [x.batch_id for x in p1.steps if x.batch_id is not None] == [b1.batch_id]


@pytest.mark.parametrize("version", ["0.5.23", "0.5.9"])
def test_a_request_out_of_memory_alone_is_aborted(version):
    """`retract_decode` always keeps one request; if even its step does not fit, 0.5.23 aborts it
    (FINISH_ABORT, "Out of memory even after retracting all other requests") and 0.5.9 raises
    (the scheduler stops): the engine records it rejected, the reason saying which. Admission
    clips the output it counts at 4096 tokens (SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION), so a
    request of 65 input and 5,000 output tokens is admitted into 70 pages and runs out at 70."""
    engine, probe = helpers.run([req("a", 0, [1], output=5000)], device_tokens=70 * PS, host_tokens=70 * PS,
                                sglang_rules=version, max_context_tokens=10_000)
    r = probe.records["a"]
    assert r.status == "rejected" and r.reject_reason.startswith("aborted: out of device memory")
    assert ("raises" in r.reject_reason) == (version == "0.5.9")
    engine.check_invariants(idle=True)


@st.composite
def decode_heavy(draw):
    """Requests with long outputs arriving close together on a small pool: decode memory runs
    out, so retraction and re-admission are exercised."""
    n = draw(st.integers(2, 8))
    out, t = [], 0.0
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.5, 1.0, 2.0]))
        shared = draw(st.integers(0, 2))
        keys = pages(1, shared) + pages(100 * (i + 1), draw(st.integers(0, 3)))
        out.append(helpers.req(f"r{i}", t, keys or [5000 + i], output=draw(st.integers(1, 700))))
    return out


@settings(max_examples=30, deadline=None)
@given(trace=decode_heavy(), device=st.integers(12, 40), version=st.sampled_from(["0.5.23", "0.5.9"]),
       mixed=st.booleans())
def test_decode_memory_invariants_hold_through_retraction(trace, device, version, mixed):
    """Whatever the retractions: every request finishes or is rejected (never lost), a finished
    one conserves its input tokens (its record: its first admission), its decode wait is part of
    its queue, the pools account for every page and every lock is back at rest; the same run
    twice gives the same records."""
    kw = dict(device_tokens=device * PS, host_tokens=2 * device * PS, sglang_rules=version,
              enable_mixed_chunk=mixed, max_context_tokens=10_000)
    engine, probe = helpers.run(trace, **kw)
    engine.check_invariants(idle=True)
    assert len(probe.records) == len(trace)
    for r in probe.records.values():
        if r.status != "finished":
            continue
        assert r.prefix_indices_len + r.computed_tokens == r.input_tokens
        assert 0 <= r.decode_wait_ns <= r.queue_ns and r.finish_ns >= r.first_token_ns
    assert helpers.run(trace, **kw)[1].records == probe.records


def test_the_property_workloads_do_retract():
    """The strategy above reaches retract_decode (not only the happy path): a draw like it."""
    trace = [helpers.req(f"r{i}", 1.0 * i, pages(100 * (i + 1), 1), output=(700, 700, 600)[i]) for i in range(3)]
    engine, probe = helpers.run(trace, device_tokens=32 * PS, host_tokens=64 * PS)
    assert engine.scheduler.stats.retractions > 0
    assert any(r.retractions for r in probe.records.values())
    engine.check_invariants(idle=True)


def test_a_decode_step_waits_for_the_write_back_its_eviction_needs():
    """Under write_back a device node without a host copy is written back before it is evicted
    (`HiRadixCache` / `drive_host_eviction`); when `check_decode_mem` evicts for a decode step,
    the step waits for that copy, as a prefill batch does (the harness prices SGLang's decode
    step with the same blocking). a (12 pages, 130 output tokens) fills the pool beside x's 2
    cached pages: its pages at steps 1 and 65 take the last free ones; at step 66
    `alloc_paged_token_slots_decode` evicts for a page anyway ("assume each request needs a
    new page"): x, written back first, and that step lasts the copy's wait plus `decode_step_ns`
    of its KV (768 + 66 tokens)."""
    x = req("x", 0, pages(1, 2), output=1)
    a = TraceRequest(req_id="a", seq=0, line=1, arrival_ns=10**9, input_len=12 * PS, output_len=130,
                     hash_ids=tuple(pages(100, 12)), tokens=None)
    engine, probe = run_batches([x, a], write_policy="write_back")
    (wb,) = [t for t in probe.transfers if t.kind == "write_back"]
    step = next(s for s in probe.steps if s.t_start_ns == wb.t_start_ns)
    assert step.step == 66
    assert step.t_end_ns - step.t_start_ns == (wb.t_end_ns - step.t_start_ns) + engine.scheduler.cost.decode_step_ns(
        12 * PS + step.step)


def test_the_batch_allocation_leaves_a_page_a_request_free():
    """allocation.py `alloc_paged_token_slots_extend` (0.5.23) evicts once for the batch, in
    `prepare_for_extend` after every member was admitted: `conservative_num_tokens` =
    `extend_num_tokens` (the sum of the members' extends, not page-ceiled:
    `sum(len(ids) for ids in input_ids)`) plus a page a request, only the shortfall against the
    free tokens (`evict_to_free_tokens`). x1 and x2 leave a cached page each (14 of 16 pages
    free, 896 tokens); a and b (6 pages + 1 token: 385 tokens, 7 pages each) come in one batch:
    770 + 2 x 64 = 898 tokens, 2 short, so one node goes (x1, the older) and 15 pages are free
    for their 14. Counting page-ceiled extends (14 pages + 2 = 16) would take x2 too.
    (SGLang 0.5.23's Scheduler evicts x1 alone on this workload: tests/sglang harness.)"""
    x1, x2 = req("x1", 0, pages(1, 1), output=1), req("x2", 100, pages(2, 1), output=1)
    a, b = req("a", 1000, pages(100, 6), output=1), req("b", 1000, pages(200, 6), output=1)
    engine, probe = run_batches([x1, x2, a, b])
    assert [e.owner_req_id for e in probe.evictions if e.tier == "device"] == ["x1"]
    assert probe.records["a"].first_batch_id == probe.records["b"].first_batch_id


def test_the_batch_evicts_after_every_member_locked_its_prefix():
    """`Scheduler.get_new_batch_prefill` (0.5.23): PrefillAdder admits every member first (each
    `match_prefix` + `inc_lock_ref` of its device prefix, no allocation), then
    `ScheduleBatch.prepare_for_extend` -> `alloc_for_extend` evicts once for the batch. So a
    later member's cached prefix is locked when the batch evicts, even if LRU would take it
    first. x (4 pages, older) and y (4 pages) are cached, 8 of 16 pages free (512 tokens); a (7
    pages + 1 token: 8 pages) and w (x's 4 pages + 1 token) come in one batch: 449 + 1 + 2 x 64
    = 578 tokens, 66 short. x is w's prefix, locked: y goes, and w hits x on device. Evicting
    at a's admission, for its 8 pages and the page beside them, before w matched (the engine
    did) took x, the older, and w recomputed it."""
    x = req("x", 0, pages(1, 4), output=1)
    y = req("y", 100, pages(50, 4), output=1)
    a = req("a", 1000, pages(100, 7), output=1)
    w = req("w", 1000, pages(1, 4), output=1)
    engine, probe = run_batches([x, y, a, w], max_prefill_tokens=4096)
    assert probe.records["a"].first_batch_id == probe.records["w"].first_batch_id
    assert [e.owner_req_id for e in probe.evictions if e.tier == "device"] == ["y"]
    assert probe.records["w"].device_hit_tokens == 4 * PS


def test_a_chunk_that_ends_mid_page_leaves_its_page_to_the_next_chunk():
    """PrefillAdder.add_chunked_req: a chunk limited by memory (`available_chunk_tokens` =
    `rem_total_tokens`) is not page-floored, so it can end mid-page; the next chunk completes that
    page and must write its content (else its backup copies nothing and a load-back of it fails
    verification). A request's first chunk stopped at token 10; the next one (100 tokens) ends
    at 110 and completes page 0."""
    from tierdiag.engine.request import Req as EngineReq
    from tierdiag.engine.content import verify_content

    engine = Engine(helpers.small_config())
    sched = engine.scheduler
    r = EngineReq(req("r", 0, pages(1, 3), output=1), 0, 0, None)
    r.keys_np = page_keys_array(req("r", 0, pages(1, 3)), page_size=PS, block_size=PS)
    r.keys = r.keys_np.tolist()
    r.own_slots, r.own_from_page, r.done_tokens = engine.device.alloc(2), 0, 10
    sched._write_chunk(r, 100)
    assert verify_content(engine.device, r.own_slots[:1], r.keys_np[:1])


@pytest.mark.parametrize("version", ["0.5.23", "0.5.9"])
def test_a_request_finished_in_its_prefill_batch_reopens_admission(version):
    """`Scheduler.get_next_batch_to_run` (both releases): the last prefill batch is filtered
    before it merges into the running batch (`last_batch.filter_batch(...)`, which drops the
    requests that finished in it and the batch's chunked request), and "if
    last_batch.batch_size() < last_bs: running_batch.batch_is_full = False". r decodes 200
    tokens; a (4 pages + 1 token, one output token) and b (7 pages + 1 token) arrive together:
    a is admitted, b does not fit beside a's reservation (NO_TOKEN with a admitted:
    `batch_is_full`). a finishes in its prefill batch, so the next pass tries b again, which
    fits now that a's pages are cached: b's batch starts when a's ends, no decode step of r
    between. Keeping batch_is_full until a running request leaves made b wait for r's 199
    decode steps."""
    r = req("r", 0, [1], output=200)
    a = req("a", 1.5, pages(10, 4), output=1)
    b = req("b", 1.5, pages(20, 7), output=1)
    engine, probe = run_batches([r, a, b], sglang_rules=version)
    rec = probe.records
    a_batch = next(x for x in probe.batches if x.batch_id == rec["a"].first_batch_id)
    b_batch = next(x for x in probe.batches if x.batch_id == rec["b"].first_batch_id)
    assert a_batch.batch_id != b_batch.batch_id  # b waited for a pass of its own
    assert b_batch.t_start_ns == a_batch.t_end_ns
    assert rec["b"].first_token_ns < rec["r"].finish_ns
    assert not [s for s in probe.steps if a_batch.t_end_ns <= s.t_start_ns < b_batch.t_start_ns]


def test_the_first_running_batch_starts_with_admission_open():
    """`Scheduler.get_next_batch_to_run` (both releases): "if running_batch.is_empty():
    running_batch = last_batch", the prefill batch itself, whose `batch_is_full` was never set:
    the NO_TOKEN that set it (`get_new_batch_prefill`: "running_batch.batch_is_full =
    len(adder.can_run_list) > 0 or ...") marked the empty running batch, which is dropped. a
    (4 pages + 1 token, 200 output tokens) and b (5 pages + 1 token, 100) arrive together on
    the 16-page pool with nothing running: a is admitted, b is NO_TOKEN beside a's reservation
    (0.5.23: 321 + 100 + 64 = 485 tokens against 1,024 - (320 + 64 + 200) = 440). After a's
    batch the running batch is a's, flag clear: b is tried again and fits (1,024 - a's 5 pages
    - 199 x 0.7 = 565), its batch starting when a's ends. Keeping the flag made b wait for a's
    199 decode steps."""
    a = req("a", 0, pages(1, 4), output=200)
    b = req("b", 0, pages(20, 5), output=100)
    engine, probe = run_batches([a, b])
    rec = probe.records
    a_batch = next(x for x in probe.batches if x.batch_id == rec["a"].first_batch_id)
    b_batch = next(x for x in probe.batches if x.batch_id == rec["b"].first_batch_id)
    assert a_batch.num_reqs == 1 and b_batch.batch_id != a_batch.batch_id
    assert b_batch.t_start_ns == a_batch.t_end_ns
    assert rec["b"].first_token_ns < rec["a"].finish_ns


@pytest.mark.parametrize("version", ["0.5.23", "0.5.9"])
def test_at_page_1_the_extend_evicts_for_itself_alone(version):
    """`alloc_for_extend` (both releases): at page 1 "out_cache_loc = alloc_token_slots(
    batch.tree_cache, batch.extend_num_tokens)", whose `evict_from_tree_cache` asks for the
    extend alone; the page a request more is `alloc_paged_token_slots_extend`'s (page > 1). x's
    64 tokens are cached, 960 of 1,024 slots free; a's 960 tokens fit exactly: nothing is
    evicted and x stays on device (asking one slot more evicted it). SGLang 0.5.23's Scheduler
    evicts nothing on this workload (tests/sglang harness)."""
    x = req("x", 0, [1], extra_tokens=0, output=1)
    a = req("a", 1000, pages(100, 15), extra_tokens=0, output=1)
    engine, probe = run_batches([x, a], page_size=1, sglang_rules=version)
    assert probe.records["a"].input_tokens == 960
    assert probe.evictions == []
    assert engine.tree.device_pages == 64 + 960  # x's tokens and a's, all still on device


def test_a_load_back_is_no_host_duplicate_to_reclaim_before_its_ack():
    """Under write_back, 0.5.23's host pressure first frees host copies of nodes also on device
    (`UnifiedTreeCore._reclaim_full_host_duplicates`), but only those
    `_can_reclaim_full_host_duplicate` allows: not `load_back_pending`. A load-back's nodes stay
    pending until its ack at the next scheduling pass (`check_hicache_events` -> `loading_check`
    -> `finish_load_back`, which clears the pin and registers them as duplicates,
    `_update_duplicate_tracking`). a's 4 pages went to host (written back when f's allocation
    evicted them); loading them back makes them duplicates, yet host pressure in the same pass
    cannot free their host copies; after the ack (the next pass) it can."""
    a = req("a", 0, pages(1, 4), extra_tokens=0, output=1)
    f = req("f", 100, pages(100, 11), output=1)
    engine, _ = run_batches([a, f], write_policy="write_back")
    ctrl, tree = engine.scheduler.ctrl, engine.tree
    keys = page_keys_array(a, page_size=PS, block_size=PS).tolist()
    match = tree.match(keys, 10**12, "probe")
    assert (match.device_pages, match.host_pages) == (0, 4) and engine.host.free_pages == 60
    slots = engine.device.alloc(4)
    ctrl.load_back(match.host_nodes, slots, "probe", 10**12, keys)
    ctrl.evict_host(64, "probe", 10**12)  # this pass: a's copies are pending, nothing to free
    assert engine.host.free_pages == 60
    ctrl.ack_loads()  # the next pass's check_hicache_events
    ctrl.evict_host(64, "probe", 10**12)
    assert engine.host.free_pages == 64


def test_a_mixed_batch_inserts_its_new_requests_before_its_finishing_decoders():
    """`--enable-mixed-chunk`: `mix_with_running` appends the running requests to the new
    prefill batch, and `process_batch_result_prefill` walks the batch in that order, so the new
    requests' inserts come first and the decoders that finish in the batch (`cache_finished_req`)
    after them: at one instant, LRU sees the finishing decoder's pages as the more recent. r (2
    pages, 2 output tokens) decodes its last token in the mixed batch that prefills n (2 pages,
    one output token); both finish at its end. x (13 pages) then needs 14 pages with its page
    (`alloc_paged_token_slots_extend`), 2 more than free: LRU evicts n's node, r's stays."""
    r = req("r", 0, pages(1, 2), extra_tokens=0, output=2)
    n = req("n", 0.001, pages(10, 2), extra_tokens=0, output=1)
    x = req("x", 1000, pages(20, 13), extra_tokens=0, output=1)
    engine, probe = run_batches([r, n, x], enable_mixed_chunk=True)
    assert probe.records["r"].finish_ns == probe.records["n"].finish_ns
    assert [s.batch_id for s in probe.steps] == [probe.records["n"].first_batch_id]  # r's step rode in n's batch
    assert [e.owner_req_id for e in probe.evictions if e.tier == "device"] == ["n"]
    keys = lambda t: page_keys_array(t, page_size=PS, block_size=PS).tolist()  # noqa: E731
    assert engine.tree.match(keys(r), 10**13, "probe").device_pages == 2


def test_after_a_mixed_batch_its_new_requests_lead_the_running_batch():
    """`--enable-mixed-chunk`: the mixed batch is the new requests followed by the running ones
    (`mix_with_running`), and it becomes the running batch at the next pass
    (`get_next_batch_to_run`: "running_batch = last_batch"), so the new requests lead it; a
    decode step's results are processed in that order (`process_batch_result_decode`), and so
    are the finish inserts of the requests that end in the same step. r (2 pages, 3 output
    tokens) decodes one token in the mixed batch that prefills m (2 pages, 2 output tokens);
    both finish in the next decode step, m first, so r's pages are the more recent: x (13
    pages, 14 with its page, 2 more than free) evicts m's node."""
    r = req("r", 0, pages(1, 2), extra_tokens=0, output=3)
    m = req("m", 0.001, pages(10, 2), extra_tokens=0, output=2)
    x = req("x", 1000, pages(20, 13), extra_tokens=0, output=1)
    engine, probe = run_batches([r, m, x], enable_mixed_chunk=True)
    assert probe.records["r"].finish_ns == probe.records["m"].finish_ns
    assert [s.req_ids for s in probe.steps] == [("r",), ("m", "r")]  # the mixed step, then m leading
    assert [e.owner_req_id for e in probe.evictions if e.tier == "device"] == ["m"]
