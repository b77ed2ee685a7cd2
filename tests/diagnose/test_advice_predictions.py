"""Every rule predicts its effect with the engine's own rules before it proposes (issue 34).

The prefetch, eviction-policy and page-size rules (as the host-pool, session and storage rules
already did) say what they expect (`prediction`: "keeps ~N of the lost tokens", or the load-back
time) and are not proposed where the predicted gain is below their threshold. Each is planted
(test_advice_planted's stories), its prediction checked against what the run's rows say or, for
the page size, against a replay with the advised page size; and the same evidence with the gain
taken away (dataclasses.replace on the run's context) is not proposed."""

from __future__ import annotations

import dataclasses
import re

import pytest

from tierdiag.diagnose.advice import propose
from tierdiag.diagnose.advice.base import MIN_LOSS_SHARE
from tierdiag.diagnose.advice.rules import page_size as P
from tierdiag.diagnose.advice.rules import prefetch as F
from tierdiag.diagnose.run.run_claims import held_capacity
from tierdiag.diagnose.run.facts import run_context
from tierdiag.store.reader import open_store, resolve_run

from .test_advice_planted import Story, _pushed_out


def _ctx(db):
    with open_store(db) as con:
        return run_context(con, resolve_run(con, None))


def _item(ctx, kind: str, **kw):
    return next((a for a in propose(ctx, **kw) if a.kind == kind), None)


def _n(text: str) -> int:
    return int(text.replace(",", ""))


def test_copy_costs_are_the_cost_models():
    """The page-size rule's prediction (advice/rules/page_size.py) uses engine/costmodel.py's per-layer copy overheads."""
    from tierdiag.engine import costmodel

    assert (P.SEGMENT_OVERHEAD_NS, P.RUN_OVERHEAD_NS) == (costmodel.SEGMENT_OVERHEAD_NS, costmodel.RUN_OVERHEAD_NS)
    assert F.DISK_BYTES_PER_S == costmodel.DISK_BYTES_PER_S


# --------------------------------------------------------------------------- page size


def _fragmented(s: Story) -> None:
    """test_advice_planted's page-size story: a conversation grown one 16-token block a turn at
    page size 1, between one-off requests, its host copy in many tiny runs."""
    blocks: list[int] = []
    for k in range(32):
        blocks.append(5000 + k)
        s.add(f"c{k}", 50 * k, list(blocks), output=1)
        s.add(f"x{k}", 50 * k + 5, s.fresh(1), output=1)
    for i in range(4):
        s.add(f"f{i}", 1600 + 100 * i, s.fresh(60), output=1)
    s.add("a2", 3600, list(blocks) + s.fresh(1), output=1)


PAGE_OPTIONS = {"model": "llama3-8b", "page_size": 1, "device_tokens": 1024, "host_tokens": 65536, "overlap": False}


def test_page_size_prediction_matches_its_replay(tmp_path):
    s = Story(block=16)
    _fragmented(s)
    ctx = _ctx(s.replay(tmp_path / "before", PAGE_OPTIONS))
    item = _item(ctx, "page_size")
    assert item is not None and item.prediction
    m = re.search(r"load-backs take ~([\d.,]+ \S+) instead of ([\d.,]+ \S+), exposed load-back ~([\d.,]+ \S+)",
                  item.prediction)
    assert m is not None, item.prediction
    predicted = item.evidence["loadback_busy_after_ms"] * 1e6
    assert item.evidence["loadback_busy_ms"] * 1e6 == ctx.transfers.loadback_busy_ns
    # The replay with the advised page size: the engine's own copy costs, measured.
    after = _ctx(s.replay(tmp_path / "after", {**PAGE_OPTIONS, **item.changes})).transfers
    assert after.loadback_busy_ns < ctx.transfers.loadback_busy_ns
    assert predicted == pytest.approx(after.loadback_busy_ns, rel=0.05)


def test_page_size_not_proposed_when_the_copies_are_mostly_fixed_cost(tmp_path):
    """The same run, its copies' overhead all per transfer (which a page size does not change):
    predicted to save nothing, not proposed."""
    s = Story(block=16)
    _fragmented(s)
    ctx = _ctx(s.replay(tmp_path, PAGE_OPTIONS))
    tr = ctx.transfers
    fixed = int(tr.loadback_busy_ns * (1 - tr.link_peak_share) / tr.num_loadbacks) + 1
    mostly_fixed = dataclasses.replace(ctx, transfers=dataclasses.replace(tr, transfer_overhead_ns=fixed))
    assert _item(ctx, "page_size") is not None and _item(mostly_fixed, "page_size") is None
    unknown = dataclasses.replace(ctx, transfers=dataclasses.replace(tr, transfer_overhead_ns=None))
    assert _item(unknown, "page_size") is None  # nothing to predict with: not proposed


# --------------------------------------------------------------------------- eviction policy


def _hot_then_floods(s: Story) -> None:
    hot = list(range(16))
    for i in range(5):
        s.add(f"h{i}", 50 * i, hot + s.fresh(1))
    for i in range(8):
        s.add(f"f{i}", 300 + 100 * i, s.fresh(24))
    s.add("a2", 2000, hot + s.fresh(1))


def test_eviction_policy_prediction_from_the_hot_re_references(tmp_path):
    s = Story()
    _hot_then_floods(s)
    ctx = _ctx(s.replay(tmp_path, {"model": "llama3-8b", "device_tokens": 4096, "host_tokens": 4096}))
    lo = ctx.losses
    item = _item(ctx, "eviction_policy")
    assert item is not None and item.prediction
    m = re.search(r"keeps ~([\d,]+) of the ([\d,]+) hot tokens lost", item.prediction)
    assert m is not None, item.prediction
    # One hot prefix (16 pages of 64) re-referenced once: nothing else hot competes with it.
    assert _n(m[2]) == lo.hot_removed_tokens == 16 * 64
    assert lo.hot_competing_deciles_tokens == (16 * 64,) * 11
    held, _ = held_capacity(ctx.config, lo.device_capacity_tokens, lo.host_capacity_tokens)
    assert held == 4096 and _n(m[1]) == lo.hot_removed_tokens
    # The hot prefixes live at once outgrow the pools: lfu would evict them too; not proposed.
    big = dataclasses.replace(ctx, losses=dataclasses.replace(lo, hot_competing_deciles_tokens=(held + 1,) * 11))
    assert _item(big, "eviction_policy") is None
    # Half of them fit: 512 tokens kept, below 5 % of this run's input: not proposed either.
    half = dataclasses.replace(ctx, losses=dataclasses.replace(
        lo, hot_competing_deciles_tokens=(held,) * 6 + (held + 1,) * 5))
    assert lo.hot_removed_tokens // 2 < MIN_LOSS_SHARE * lo.input_tokens <= lo.hot_removed_tokens
    assert _item(half, "eviction_policy") is None


# --------------------------------------------------------------------------- prefetch


def test_prefetch_prediction_and_when_a_read_would_cost_more(tmp_path):
    s = Story()
    _pushed_out(s, t_a2=20000)
    ctx = _ctx(s.replay(tmp_path, {"model": "llama3-70b", "device_tokens": 4096, "host_tokens": 8192,
                                   "storage_tokens": 65536, "prefetch_policy": "best_effort"}))
    late = ctx.losses.storage_unused_tokens["prefetch_incomplete"]
    item = _item(ctx, "prefetch")
    assert item is not None and f"keeps ~{late:,} of the lost tokens" in item.prediction
    disk = ctx.kv_bytes_per_token * 1e9 / F.DISK_BYTES_PER_S
    assert disk < ctx.recompute_ns / ctx.losses.recomputed_tokens  # 70B: a read beats a recompute
    # Were a recompute cheaper than a read, on a GPU with room, waiting would only slow it down.
    cheap = dataclasses.replace(ctx, recompute_ns=int(disk * ctx.losses.recomputed_tokens / 2),
                                prefill_busy_share=0.1)
    assert _item(cheap, "prefetch") is None
    # ... unless the GPU was busy: the wait frees it for others.
    busy = dataclasses.replace(cheap, prefill_busy_share=0.9)
    assert "busy: the wait frees it" in _item(busy, "prefetch").reason
