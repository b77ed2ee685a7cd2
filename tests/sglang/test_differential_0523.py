"""The engine against SGLang 0.5.23's own UnifiedRadixCache on its Python tree core
(`unified_cache/unified_tree_core.py`, the fallback of the Rust core), step by step (issue 29,
item 4; tests/sglang/differential.py says what a step is and what is compared).

The engine follows 0.5.9 today. Every rule in which 0.5.23 differs from it has a switch in the
worker (`KNOWN_0523`, tests/sglang/sglang0523.py) that makes SGLang behave as the engine does:
the agreeing tests run with all of them on (and the engine on its 0.5.9 rules), and see every
other difference. Each rule also has a strict xfail, run without its switch and with the engine
asked for its 0.5.23 rules, naming the 0.5.23 function: it passes when the 0.5.23 rule set
implements the rule, and then the switch goes. docs/engine.md, "What 0.5.23 changes, measured",
is the table of these rules with what each one moves.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.sglang.differential import KNOWN_0523, first_divergence, mooncake_scenario, random_scenario, shrink

pytestmark = pytest.mark.sglang

POLICIES = ("lru", "lfu", "fifo", "mru", "filo", "priority")
WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
CONVERSATION = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces" / "conversation_trace.jsonl"


def check(worker, scenario: dict) -> None:
    found = first_divergence(worker, scenario)
    if found is not None:
        small, found = shrink(worker, scenario, found)
        pytest.fail(f"engine and SGLang {worker.version} differ; shrunk to {len(small['ops'])} ops:\n"
                    f"{small['ops']}\n{found}", pytrace=False)


def agreeing(sc: dict) -> dict:
    return {**sc, "rules": "0.5.23", "compat": list(KNOWN_0523)}


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("policy", POLICIES)
def test_random_sequences_agree_step_by_step(sglang_0523, seed, policy):
    """Shared prefixes, splits, repeats, held locks, priorities; device 24 pages, host 40: both
    tiers evict; write_back too (0.5.23 backs up, waits and demotes per victim, as the engine
    does). Every step agrees once the four 0.5.23 rules are switched off."""
    sc = random_scenario(seed, eviction_policy=policy, write_policy=WRITE_POLICIES[seed % 3])
    check(sglang_0523, agreeing(sc))


@pytest.mark.shared
@pytest.mark.skipif(not CONVERSATION.exists(), reason="needs ../shared/traces/conversation_trace.jsonl")
@pytest.mark.parametrize("write_policy", ("write_through", "write_back"))
@pytest.mark.parametrize("device_pages,host_pages", [(64, 96), (64, 400)])
def test_mooncake_slice_agrees_step_by_step(sglang_0523, device_pages, host_pages, write_policy):
    """The first 200 requests of the conversation trace, one a step."""
    sc = mooncake_scenario(CONVERSATION, 200, device_pages=device_pages, host_pages=host_pages,
                           write_policy=write_policy)
    check(sglang_0523, agreeing(sc))


def rule_scenario(rule: str, seed: int, policy: str, write_policy: str, ids: tuple[str, ...]) -> dict:
    """A random sequence cut to the requests (and their releases) that the shrinker kept, run
    with every switch but the rule's, the engine on its 0.5.23 rules."""
    sc = random_scenario(seed, eviction_policy=policy, write_policy=write_policy)
    ops = [op for op in sc["ops"] if op["id"] in ids]
    return {**sc, "ops": ops, "rules": "0.5.23", "compat": [k for k in KNOWN_0523 if k != rule]}


def test_allocation_evicts_a_page_more_per_request(sglang_0523):
    """Four requests leave 6 of 24 pages free; r6 needs 6: 0.5.23 asks for 7 and demotes the
    LRU leaf [8, 9, 10], the engine evicts nothing."""
    check(sglang_0523, rule_scenario("alloc_page", 0, "lru", "write_through", ("r2", "r3", "r4", "r5", "r6")))


def test_a_split_stamps_the_lower_half(sglang_0523):
    """r4 splits r0's [1..5] at [1, 2]: 0.5.23 stamps [3, 4, 5] then, so under LRU r6's eviction
    takes [8, 9, 10] (stamped at step 2) where the engine takes [3, 4, 5] (step 1)."""
    check(sglang_0523, rule_scenario("split_access", 0, "lru", "write_through",
                                     ("r0", "r2", "r3", "r4", "r5", "r6")))


def test_an_insert_restoring_a_node_counts_a_hit(sglang_0523):
    """r32's page 41 is host-only and too short to load back (4 tokens < 10): recomputed, the
    insert puts it back on device and 0.5.23 counts a third hit where the engine counts two."""
    check(sglang_0523, rule_scenario("unevict_hit", 1, "lru", "write_through_selective",
                                     ("r19", "r22", "r27", "r28", "r30", "r32")))


def test_write_back_host_pressure_frees_duplicate_host_copies_first(sglang_0523):
    """r23 loads [8, 9, 10] back (device and host); r24's write-backs need host room: 0.5.23
    frees [8, 9, 10]'s host copy, the engine deletes the LRU host leaf [14, 15, 16]."""
    check(sglang_0523, rule_scenario("host_duplicates", 0, "lru", "write_back",
                                     ("r2", "r3", "r4", "r5", "r7", "r8", "r10", "r12", "r16", "r17", "r19",
                                      "r21", "r23", "r24")))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("write_policy", ("write_through", "write_through_selective"))
def test_chunked_inserts_count_hits_past_what_the_request_inserted(sglang_0523, seed, write_policy):
    """Half the requests inserted a chunk (1-3 pages) at a time, as a chunked prefill's
    `cache_unfinished_req` -> `checkpoint_into_tree` does, with `inserted_len` =
    `req.kv.cache_inserted_len`: `_finish_insert_walk_node` / `_should_backup_after_insert`
    count only what ends past it, so every chunk's new pages gain a hit and write-through backs
    them up at once (the rule set's `hits_past_inserted`). Every step agrees."""
    sc = random_scenario(seed, eviction_policy=POLICIES[seed], write_policy=write_policy, chunks=True)
    assert any(op.get("chunk") for op in sc["ops"])
    check(sglang_0523, agreeing(sc))
