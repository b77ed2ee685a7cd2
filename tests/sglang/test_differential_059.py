"""The engine against SGLang 0.5.9's own HiRadixCache and HiCacheController, step by step
(issue 29, item 4; tests/sglang/differential.py says what a step is and what is compared).

SGLang's code runs in a worker process with only the byte-moving layer stubbed. The five known
differences of the engine from 0.5.9 are switched off on SGLang's side (`compat`) for the tests
that must agree; each has its own strict xfail here, run without its switch, naming the SGLang
function: when the engine is fixed the xfail passes, and the switch goes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.sglang.differential import KNOWN_059, first_divergence, mooncake_scenario, random_scenario, shrink

pytestmark = pytest.mark.sglang

POLICIES = ("lru", "lfu", "fifo", "mru", "filo", "priority")
CONVERSATION = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces" / "conversation_trace.jsonl"


def check(worker, scenario: dict) -> None:
    scenario = {**scenario, "rules": "0.5.9"}  # the engine's 0.5.9 rule set, once it has rule sets
    found = first_divergence(worker, scenario)
    if found is not None:
        small, found = shrink(worker, scenario, found)
        pytest.fail(f"engine and SGLang {worker.version} differ; shrunk to {len(small['ops'])} ops:\n"
                    f"{small['ops']}\n{found}", pytrace=False)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("policy", POLICIES)
def test_random_sequences_agree_step_by_step(sglang_059, seed, policy):
    """Shared prefixes, splits, repeats, held locks, priorities; device 24 pages, host 40: both
    tiers evict. Every step agrees once the five known differences are switched off."""
    sc = random_scenario(seed, eviction_policy=policy,
                         write_policy=("write_through", "write_through_selective")[seed % 2])
    check(sglang_059, {**sc, "compat": list(KNOWN_059)})


@pytest.mark.shared
@pytest.mark.skipif(not CONVERSATION.exists(), reason="needs ../shared/traces/conversation_trace.jsonl")
@pytest.mark.parametrize("device_pages,host_pages", [(64, 96), (64, 400)])
def test_mooncake_slice_agrees_step_by_step(sglang_059, device_pages, host_pages):
    """The first 200 requests of the conversation trace, one a step."""
    sc = mooncake_scenario(CONVERSATION, 200, device_pages=device_pages, host_pages=host_pages)
    check(sglang_059, {**sc, "compat": list(KNOWN_059)})


def _without(name: str, seed: int, policy: str) -> dict:
    sc = random_scenario(seed, eviction_policy=policy, write_policy=("write_through", "write_through_selective")[seed % 2])
    return {**sc, "compat": [k for k in KNOWN_059 if k != name]}


def test_a_split_touches_both_halves(sglang_059):
    check(sglang_059, _without("split_access", 0, "lru"))


def test_a_split_upper_half_is_created_at_the_split(sglang_059):
    check(sglang_059, _without("split_creation", 0, "filo"))


def test_eviction_takes_the_whole_need(sglang_059):
    check(sglang_059, _without("evict_amount", 0, "lru"))
