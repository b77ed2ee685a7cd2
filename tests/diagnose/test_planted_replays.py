"""End to end: tiny traces written here, replayed through `tierdiag replay`, then explained.

Each scenario plants one story and asserts what `explain` says about the request it is
about: class, tier split, primary cause and who evicted its prefix. With `--block-size 64
--page-size 64` every hash id is one page, so the token counts below are pages x 64.

Model llama3-8b on an h100 (128 KiB of KV per token, 55 GB/s link): load-backs and
recomputes cost enough there to be seen next to the ~5.8 ms floor of a prefill.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tierdiag.diagnose.request.explain import explain_request
from tierdiag.store.reader import open_store, resolve_run

pytest.importorskip("tierdiag.cli.replay")
from tierdiag.cli.main import app  # noqa: E402

PAGE = 64
COMMON = ("--model", "llama3-8b", "--gpu", "h100", "--block-size", "64", "--page-size", "64")


class Trace:
    """Requests as JSONL lines; `fresh(n)` hands out hash ids nobody else uses."""

    def __init__(self) -> None:
        self.lines: list[dict] = []
        self._next = 1_000_000

    def fresh(self, pages: int) -> list[int]:
        ids = list(range(self._next, self._next + pages))
        self._next += pages
        return ids

    def add(self, req_id: str, t_ms: int, hash_ids: list[int], output: int = 4) -> None:
        self.lines.append({"id": req_id, "timestamp": t_ms, "input_length": PAGE * len(hash_ids),
                           "output_length": output, "hash_ids": hash_ids})

    def replay(self, folder: Path, *options: str):
        trace = folder / "trace.jsonl"
        trace.write_text("".join(json.dumps(line) + "\n" for line in self.lines))
        db = folder / "run.duckdb"
        result = CliRunner().invoke(app, ["replay", str(trace), "--db", str(db), *COMMON, *options])
        assert result.exit_code == 0, (result.output, result.exception)
        return Replayed(db)


class Replayed:
    def __init__(self, db: Path) -> None:
        self.db = db

    def explain(self, req_id: str):
        with open_store(self.db) as con:
            return explain_request(con, resolve_run(con, None), req_id)


def _split(e) -> tuple[int, int, int, int]:
    t = e.tokens
    return t.device_tokens, t.host_tokens, t.storage_tokens, t.computed_tokens


@pytest.fixture(scope="module")
def pushed_to_host(tmp_path_factory):
    """'a1' caches 48 pages; three floods of 32 fresh pages push them out of a 4,096-token device
    pool (backed up on host by write_through); 'a2' asks for them again plus one new page.
    Overlap is off, so the whole load-back is exposed in a2's TTFT."""
    t = Trace()
    prefix = list(range(48))
    t.add("a1", 0, prefix)
    for i in range(3):
        t.add(f"f{i + 1}", 100 + 100 * i, t.fresh(32))
    t.add("a2", 1000, prefix + t.fresh(1))
    return t.replay(tmp_path_factory.mktemp("pushed"), "--device-tokens", "4096", "--host-tokens", "16384",
                    "--no-overlap")


def test_prefix_pushed_to_host_is_a_slow_tiered_hit(pushed_to_host):
    e = pushed_to_host.explain("a2")
    assert e.hit_class == "tiered_hit"
    assert _split(e) == (0, 48 * PAGE, 0, PAGE)
    assert e.primary_cause == "load_back"
    assert e.evicted_by and set(e.evicted_by) <= {"f1", "f2", "f3"}
    lb = e.steps[2].evidence
    assert lb.loaded_tokens == 48 * PAGE and lb.loadback_bytes > 0
    assert lb.exposed_ns == lb.loadback_ns  # nothing to hide behind with overlap off
    assert e.ttft_if_device_resident_ns < e.ttft_ns
    prefix = e.steps[1].evidence
    assert prefix.restored_share == 1.0 and prefix.cache_protected_len == 48 * PAGE
    assert all(ev.action == "demote" for ev in e.steps[3].evidence.events)


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """'b1' caches 20 pages; 'b2' asks for them again once b1 has finished (so they are in the
    tree) and nothing has pushed them out; 'c1' shares nothing with anyone."""
    t = Trace()
    prefix = list(range(100, 120))
    t.add("b1", 0, prefix)
    t.add("b2", 200, prefix + t.fresh(1))
    t.add("c1", 400, t.fresh(12))
    return t.replay(tmp_path_factory.mktemp("warm"), "--device-tokens", "4096", "--host-tokens", "16384")


def test_prefix_asked_again_soon_is_a_device_hit(warm):
    e = warm.explain("b2")
    assert e.hit_class == "device_hit"
    assert _split(e) == (20 * PAGE, 0, 0, PAGE)
    assert e.primary_cause == "none" and e.evicted_by == ()
    assert "device hit" in e.headline or "device hit" in e.verdict


def test_full_miss_is_not_the_caches_fault(warm):
    e = warm.explain("c1")
    assert e.hit_class == "miss"
    assert _split(e) == (0, 0, 0, 12 * PAGE)
    assert e.primary_cause == "none" and e.evicted_by == ()
    assert e.tokens.recomputed_tokens == 0


def test_prefix_that_fell_to_storage(tmp_path):
    """'s1' caches 16 pages; six floods of 16 pages overflow both a 2,048-token device pool and a
    2,560-token host pool, so s1's pages survive only in storage; 's2' asks for them again and
    waits for the prefetch (wait_complete). The host pool is larger than the device pool: SGLang
    lets prefetches hold only 0.8 x (host - device) tokens, none when the two are equal."""
    t = Trace()
    prefix = list(range(200, 216))
    t.add("s1", 0, prefix)
    for i in range(6):
        t.add(f"f{i + 1}", 100 + 100 * i, t.fresh(16))
    t.add("s2", 2000, prefix + t.fresh(1))
    run = t.replay(tmp_path, "--device-tokens", "2048", "--host-tokens", "2560", "--storage-tokens", "65536",
                   "--prefetch-policy", "wait_complete")
    e = run.explain("s2")
    assert e.hit_class == "tiered_hit"
    assert _split(e) == (0, 0, 16 * PAGE, PAGE)
    assert e.primary_cause == "storage_fetch"
    assert e.evicted_by and set(e.evicted_by) <= {f"f{i}" for i in range(1, 7)}
    assert {ev.tier for ev in e.steps[3].evidence.events} >= {"device", "host"}


@pytest.fixture(scope="module")
def burst(tmp_path_factory):
    """'v1' caches 10 pages; at t=1 s eight 30-page misses and then 'v2' (v1's prefix + 1 page)
    arrive within the same millisecond; one 2,048-token prefill batch fits one miss at a time,
    so v2 waits for all of them although its own prefix is on device."""
    t = Trace()
    prefix = list(range(300, 310))
    t.add("v1", 0, prefix)
    for i in range(8):
        t.add(f"x{i + 1}", 1000, t.fresh(30))
    t.add("v2", 1000, prefix + t.fresh(1))
    t.add("late", 1001, t.fresh(1))
    return t.replay(tmp_path_factory.mktemp("burst"), "--device-tokens", "32768", "--host-tokens", "65536",
                    "--max-prefill-tokens", "2048")


def test_request_stuck_behind_a_burst(burst):
    e = burst.explain("v2")
    assert e.hit_class == "device_hit"
    assert _split(e) == (10 * PAGE, 0, 0, PAGE)
    assert e.primary_cause == "queueing"
    # 10 of its 11 pages on device, one new: "a full device hit" only where at most 5 % is new
    # (issue 40: a request computing a sizeable part of its input is no full hit), so shares.
    assert e.headline.startswith("queueing: ") and e.headline.endswith("; its input was 91 % device, 9 % new")
    assert e.decomposition.queue_ns > 0.9 * e.ttft_ns


@pytest.fixture(scope="module")
def below_threshold(tmp_path_factory):
    """'p1' caches 3 pages (192 tokens); two 30-page floods push them to host; 'p2' asks for them
    again, but 192 tokens are below --load-back-threshold 256, so they are recomputed."""
    t = Trace()
    prefix = list(range(400, 403))
    t.add("p1", 0, prefix)
    for i in range(2):
        t.add(f"f{i + 1}", 100 + 100 * i, t.fresh(30))
    t.add("p2", 1000, prefix + t.fresh(1))
    return t.replay(tmp_path_factory.mktemp("threshold"), "--device-tokens", "2048", "--host-tokens", "8192",
                    "--load-back-threshold", "256")


def test_host_hit_below_the_load_back_threshold(below_threshold):
    e = below_threshold.explain("p2")
    assert e.hit_class == "miss"  # a skipped load-back is never counted as a hit
    assert _split(e) == (0, 0, 0, 4 * PAGE)
    assert e.tokens.recomputed_tokens == 3 * PAGE
    assert e.primary_cause == "recompute"
    step1 = e.steps[0].evidence
    assert (step1.loadback_skipped_reason, step1.loadback_skipped_tokens) == ("below_threshold", 3 * PAGE)
    assert step1.host_match_tokens == 3 * PAGE
    assert e.evicted_by and set(e.evicted_by) <= {"f1", "f2"}
