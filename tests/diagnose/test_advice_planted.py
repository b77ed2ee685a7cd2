"""Planted causes, one per advice kind: a replay built to have the cause gets that advice, and
replaying with the advice applied makes the planted request ('a2') faster.

Each story is a tiny trace (hash ids = pages) replayed through `tierdiag replay`; the advice is
read from the run (`propose(run_context(...))`), its `changes` are turned into replay options
exactly as a user would apply them, and a2's TTFT is compared before and after.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tierdiag.diagnose.advice import propose
from tierdiag.diagnose.run.facts import run_context
from tierdiag.store.reader import open_store, resolve_run

pytest.importorskip("tierdiag.cli.replay")
from tierdiag.cli.main import app  # noqa: E402

KV_8B = 131_072
KV_70B = 327_680


class Story:
    def __init__(self, block: int = 64) -> None:
        self.block = block
        self.lines: list[dict] = []
        self._next = 1_000_000

    def fresh(self, n: int) -> list[int]:
        ids = list(range(self._next, self._next + n))
        self._next += n
        return ids

    def add(self, req_id: str, t_ms: int, hash_ids: list[int], output: int = 4) -> None:
        self.lines.append({"id": req_id, "timestamp": t_ms, "input_length": self.block * len(hash_ids),
                           "output_length": output, "hash_ids": hash_ids})

    def replay(self, folder: Path, options: dict) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        trace = folder / "trace.jsonl"
        trace.write_text("".join(json.dumps(line) + "\n" for line in self.lines))
        db = folder / "run.duckdb"
        options = {"gpu": "h100", **options}
        args = ["replay", str(trace), "--db", str(db), "--block-size", str(self.block)]
        for key, value in options.items():
            flag = "--" + key.replace("_", "-")
            args += [flag] if value is True else ["--no-" + key.replace("_", "-")] if value is False else [flag, str(value)]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, (result.output, result.exception)
        return db


def _advice_and_ttft(db: Path, **kw):
    with open_store(db) as con:
        run = resolve_run(con, None)
        advice = propose(run_context(con, run), **kw)
        ttft = con.execute("SELECT ttft_ns FROM requests WHERE run_id = ? AND req_id = 'a2'", [run.run_id]).fetchone()[0]
    return advice, ttft


def _check(story: Story, tmp_path: Path, options: dict, kind: str, **kw):
    """The planted run gets advice `kind`; applying its changes lowers a2's TTFT."""
    advice, before = _advice_and_ttft(story.replay(tmp_path / "before", options), **kw)
    item = next((a for a in advice if a.kind == kind), None)
    assert item is not None, [a.kind for a in advice]
    assert item.option in item.changes and item.reason
    _, after = _advice_and_ttft(story.replay(tmp_path / "after", {**options, **item.changes}))
    assert after < before, (kind, item.changes, before, after)
    return item, before, after


def _pushed_out(story: Story, prefix_pages: int = 24, floods: int = 6, t_a2: int = 2000, a1_output: int = 4) -> None:
    """'a1' caches a prefix; floods of 32 fresh pages push it out of device and host; 'a2' wants it back."""
    prefix = list(range(prefix_pages))
    story.add("a1", 0, prefix, output=a1_output)
    for i in range(floods):
        story.add(f"f{i}", 100 + 100 * i, story.fresh(32))
    story.add("a2", t_a2, prefix + story.fresh(1))


def test_capacity_host_pool_from_reuse_distance(tmp_path):
    s = Story()
    _pushed_out(s)
    item, _, _ = _check(s, tmp_path, {"model": "llama3-8b", "device_tokens": 4096, "host_tokens": 4096}, "capacity")
    assert item.option == "host_tokens" and item.value > 4096
    assert item.evidence["reuse_distance_p90_tokens"] > 4096  # write_through: the host pool alone bounds it
    assert item.cost_gib == pytest.approx((item.value - 4096) * KV_8B / 2**30)


def test_storage_tier_when_host_memory_would_exceed_the_server(tmp_path):
    """The same story, on a server whose host memory (limit lowered for the test) cannot hold the
    reuse distance: a storage tier with wait_complete instead (70B: disk beats recompute per token)."""
    s = Story()
    _pushed_out(s, t_a2=20000)  # after the floods are done (70B prefills take a while)
    item, _, _ = _check(s, tmp_path, {"model": "llama3-70b", "device_tokens": 4096, "host_tokens": 8192},
                        "storage_tier", host_limit_bytes=8192 * KV_70B)
    assert item.changes["prefetch_policy"] == "wait_complete" and item.cost_kind == "disk"


def test_prefetch_wait_complete_for_incomplete_prefetches(tmp_path):
    s = Story()
    _pushed_out(s, t_a2=20000)  # arrives at an idle GPU: scheduled before its prefetch is done
    # best_effort (0.5.9's default): 0.5.23's default, timeout, waits up to 1 s + 0.25 s per 1024
    # tokens, longer than this read, so only best_effort plants a late prefetch.
    item, _, _ = _check(s, tmp_path, {"model": "llama3-70b", "device_tokens": 4096, "host_tokens": 8192,
                                      "storage_tokens": 65536, "prefetch_policy": "best_effort"}, "prefetch")
    assert item.changes == {"prefetch_policy": "wait_complete"}


def test_write_policy_when_lost_tokens_were_never_backed_up(tmp_path):
    """write_through_selective backs a prefix up on its second insert (HiRadixCache's
    write_through_threshold 2). A request that decodes goes in twice, at the end of its prefill
    and at its finish, so its prefix is backed up before it can be dropped; one finished by its
    first token (output 1) goes in once, at finish. a1 is such a request: the floods drop its
    prefix from device with no host copy, and a2 recomputes it. write_through backs a1 up at
    that one insert: a2 loads it back from host instead."""
    s = Story()
    _pushed_out(s, floods=3, a1_output=1)
    options = {"model": "llama3-8b", "device_tokens": 4096, "host_tokens": 65536,
               "write_policy": "write_through_selective"}
    item, _, _ = _check(s, tmp_path, options, "write_policy")
    assert item.changes == {"write_policy": "write_through"}
    assert item.evidence["dropped_unbacked_tokens"] >= 24 * s.block  # a1's whole prefix


def test_eviction_policy_when_hot_prefixes_were_evicted(tmp_path):
    """A prefix hit five times, then one-off floods: LRU evicts it behind them, LFU keeps it."""
    s = Story()
    hot = list(range(16))
    for i in range(5):
        s.add(f"h{i}", 50 * i, hot + s.fresh(1))
    for i in range(8):
        s.add(f"f{i}", 300 + 100 * i, s.fresh(24))
    s.add("a2", 2000, hot + s.fresh(1))
    item, _, _ = _check(s, tmp_path, {"model": "llama3-8b", "device_tokens": 4096, "host_tokens": 4096},
                        "eviction_policy")
    assert item.changes == {"eviction_policy": "lfu"}


def test_page_size_when_load_backs_are_fragmented(tmp_path):
    """A conversation grown one 16-token block a turn at --page-size 1, interleaved with one-off
    requests: its host copy is 32 runs of 16 tiny pages, loaded back far below the link's peak."""
    s = Story(block=16)
    blocks: list[int] = []
    for k in range(32):
        blocks.append(5000 + k)
        s.add(f"c{k}", 50 * k, list(blocks), output=1)
        s.add(f"x{k}", 50 * k + 5, s.fresh(1), output=1)
    for i in range(4):
        s.add(f"f{i}", 1600 + 100 * i, s.fresh(60), output=1)
    s.add("a2", 3600, list(blocks) + s.fresh(1), output=1)
    item, _, _ = _check(s, tmp_path, {"model": "llama3-8b", "page_size": 1, "device_tokens": 1024,
                                      "host_tokens": 65536, "overlap": False}, "page_size")
    assert item.value == 4


def test_nothing_to_change_when_the_cache_was_fine(tmp_path):
    """The capacity story with a host pool that holds everything: the prefix comes back by a
    fast load-back, and the advice is that there is nothing to change in the cache."""
    s = Story()
    _pushed_out(s)
    advice, _ = _advice_and_ttft(s.replay(tmp_path, {"model": "llama3-8b", "device_tokens": 4096,
                                                     "host_tokens": 65536}))
    assert [a.kind for a in advice] == ["none"] and advice[0].option is None
    assert advice[0].reason.startswith("nothing to change in the cache")


def test_advice_prefetch_room_share_is_the_engines():
    """The capacity rule (advice/rules/capacity.py) names 0.5.9's prefetch room (0.8 x (host - device)) and reads the run's own rule
    set for the limit (RuleSet.prefetch_room_tokens: 0.5 x host under 0.5.23)."""
    from tierdiag.diagnose.advice.rules.capacity import PREFETCH_ROOM_SHARE
    from tierdiag.engine.rules import RULE_SETS

    assert PREFETCH_ROOM_SHARE == RULE_SETS["0.5.9"].prefetch_capacity_share
    assert RULE_SETS["0.5.23"].prefetch_room_tokens(4096, 4096) == 2048
    assert RULE_SETS["0.5.9"].prefetch_room_tokens(4096, 4096) == 0


def test_a_storage_tier_whose_prefetches_would_be_rate_limited_is_not_proposed(tmp_path):
    """Advice predicted with the engine's own rules (issue 34 item 3): a storage tier is proposed
    only where its prefetches would be admitted. With every lost prefix larger than the room
    SGLang leaves prefetches (0.8 x (host - device)) and no host memory to widen it, each would be
    skipped rate_limited: predicted to keep nothing, it is not proposed; with the prefixes within
    the room, it is, saying what it predicts."""
    import dataclasses

    from .test_advise_cli import _cycle

    s = Story()
    _cycle(s, prefixes=10, pages=32)
    # 0.5.9's room, 0.8 x (host - device) (0.5.23's is 0.5 x host)
    db = s.replay(tmp_path, {"model": "tiny", "gpu": "cpu", "device_tokens": 4096, "host_tokens": 4096,
                             "sglang": "0.5.9"})
    with open_store(db) as con:
        ctx = run_context(con, resolve_run(con, None))
    fits = ctx.losses.lost_request_deciles_tokens
    assert fits and max(fits) <= 0.8 * (8192 - 4096)  # 2,048-token prefixes: within the room of an 8,192 host
    kinds = [a.kind for a in propose(ctx, host_limit_bytes=8 << 20)]
    assert kinds == ["storage_tier"]
    big = dataclasses.replace(ctx, losses=dataclasses.replace(ctx.losses, lost_request_deciles_tokens=(5000,) * 11))
    assert [a.kind for a in propose(big, host_limit_bytes=8 << 20)] == ["none"]
    # With the server's memory for the room (16,384 tokens of host: room 9,830), it is proposed again.
    item = next(a for a in propose(big, host_limit_bytes=16 << 20) if a.kind == "storage_tier")
    assert item.changes["host_tokens"] == 16384 and "keeps ~" in item.prediction
