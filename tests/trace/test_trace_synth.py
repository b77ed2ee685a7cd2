"""Synthetic workloads: valid traces, chained prefixes that grow per session, determinism, the demo, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import OrderedDict, defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tests.support.cli import completed_in_process
from tierdiag.cli.main import app
from tierdiag.errors import ConfigError
from tierdiag.trace.reader import ReadReport, read_trace
from tierdiag.trace.synth import (DEMO_TRACE, KINDS, MAX_INPUT_TOKENS, SynthConfig, SynthRequest, generate,
                                  summarize, synth_to_file, write_trace)

SESSION_KINDS = {"sess": "turn", "agent": "step"}


def split_id(req_id: str) -> tuple[str, str, int]:
    """"sess3-turn2" -> ("sess3", "turn", 2)."""
    group, counter = req_id.rsplit("-", 1)
    word = counter.rstrip("0123456789")
    return group, word, int(counter[len(word):])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(KINDS), seed=st.integers(0, 2**32), n=st.integers(1, 80),
       block_size=st.sampled_from([64, 256, 512]), rate=st.sampled_from([0.5, 2.0, 20.0]),
       gz=st.booleans())
def test_round_trip_through_the_reader(tmp_path, kind, seed, n, block_size, rate, gz):
    cfg = SynthConfig(kind=kind, num_requests=n, seed=seed, rate_per_s=rate, block_size=block_size)
    path = tmp_path / ("t.jsonl.gz" if gz else "t.jsonl")
    summary = synth_to_file(path, cfg)
    report = ReadReport()
    got = list(read_trace(path, block_size=block_size, report=report))
    want = generate(cfg)
    assert len(got) == len(want) == summary.num_requests == n
    assert [(r.req_id, r.input_len, r.output_len, r.hash_ids) for r in got] == \
           [(w.req_id, w.input_tokens, w.output_tokens, w.hash_ids) for w in want]
    assert report.bad_lines == 0 and not report.unknown_keys
    assert all(1_000 <= r.input_len <= MAX_INPUT_TOKENS and r.output_len > 0 for r in got)


@pytest.fixture(scope="module")
def mixed() -> list[SynthRequest]:
    return generate(SynthConfig(kind="mixed", num_requests=1500, seed=3))


def test_block_ids_chain_like_mooncake(mixed):
    # A hash id names its block and everything before it: it always sits at the same position
    # behind the same predecessor. Ids are numbered by first appearance.
    where: dict[int, tuple[int, int | None]] = {}
    next_new = 0
    for r in mixed:
        for pos, h in enumerate(r.hash_ids):
            here = (pos, r.hash_ids[pos - 1] if pos else None)
            assert where.setdefault(h, here) == here, f"{r.req_id}: block {h} reused under another prefix"
            if h >= next_new:
                assert h == next_new
                next_new += 1


def test_sessions_grow_their_prefix_and_reuse_it(mixed):
    by_session: dict[str, list[SynthRequest]] = defaultdict(list)
    for r in mixed:
        group, word, _ = split_id(r.req_id)
        if group.rstrip("0123456789") in SESSION_KINDS:
            by_session[group].append(r)
    assert len(by_session) > 20
    block = 512
    for group, reqs in by_session.items():
        word = SESSION_KINDS[group.rstrip("0123456789")]
        assert [split_id(r.req_id)[1:] for r in reqs] == [(word, i) for i in range(1, len(reqs) + 1)]
        for prev, cur in zip(reqs, reqs[1:]):
            # input = previous input + previous output + something new
            assert cur.input_tokens > prev.input_tokens + prev.output_tokens
            keep = prev.input_tokens // block
            assert cur.hash_ids[:keep] == prev.hash_ids[:keep]
            # The previous partial block grew, so it is a new block from there on.
            assert not set(cur.hash_ids[keep:]) & set(prev.hash_ids)
            assert cur.timestamp_ms > prev.timestamp_ms


def test_system_prompt_questions_share_their_apps_prompt(mixed):
    by_app: dict[str, list[SynthRequest]] = defaultdict(list)
    for r in mixed:
        if r.req_id.startswith("sys"):
            by_app[split_id(r.req_id)[0]].append(r)
    assert len(by_app) >= 3
    firsts = set()
    for app_reqs in by_app.values():
        # Prompts are >= 1,500 tokens: at least two full 512-token blocks common to every question.
        assert len({r.hash_ids[:2] for r in app_reqs}) == 1
        firsts.add(app_reqs[0].hash_ids[0])
    assert len(firsts) == len(by_app)


def test_mixed_interleaves_all_kinds_and_single_kinds_stay_pure(mixed):
    prefixes = {split_id(r.req_id)[0].rstrip("0123456789") for r in mixed}
    assert prefixes == {"sys", "sess", "agent"}
    for kind, prefix in [("system-prompt", "sys"), ("multi-turn", "sess"), ("agent", "agent")]:
        reqs = generate(SynthConfig(kind=kind, num_requests=50, seed=1))
        assert {split_id(r.req_id)[0].rstrip("0123456789") for r in reqs} == {prefix}


def test_timestamps_follow_the_rate_in_the_long_run():
    for rate in (0.5, 5.0):
        reqs = generate(SynthConfig(num_requests=3000, seed=11, rate_per_s=rate))
        span_s = (reqs[-1].timestamp_ms - reqs[0].timestamp_ms) / 1000
        assert 0.7 * rate <= len(reqs) / span_s <= 1.3 * rate
        assert all(a.timestamp_ms <= b.timestamp_ms for a, b in zip(reqs, reqs[1:]))


def test_same_config_same_bytes_other_seed_other_trace(tmp_path):
    a, b, c = tmp_path / "a.jsonl.gz", tmp_path / "b.jsonl.gz", tmp_path / "c.jsonl.gz"
    synth_to_file(a, SynthConfig(num_requests=200, seed=5))
    synth_to_file(b, SynthConfig(num_requests=200, seed=5))
    synth_to_file(c, SynthConfig(num_requests=200, seed=6))
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"kind": "chat"}, "unknown workload kind 'chat'; known: agent, mixed, multi-turn, system-prompt"),
    ({"num_requests": 0}, "--requests must be at least 1"),
    ({"rate_per_s": 0.0}, "--rate must be a positive"),
    ({"rate_per_s": float("nan")}, "--rate must be a positive"),
    ({"rate_per_s": float("inf")}, "--rate must be a positive"),
    ({"block_size": 8}, "--block-size must be at least 16"),
])
def test_bad_config(kwargs, fragment):
    with pytest.raises(ConfigError) as info:
        SynthConfig(**kwargs)
    assert fragment in info.value.message


def test_summary_counts_reusable_full_blocks():
    reqs = [SynthRequest("a", 0, 1100, 1, (0, 1, 2), 0), SynthRequest("b", 5, 1030, 1, (0, 1, 3), 1)]
    s = summarize(reqs, path="x", cfg=SynthConfig(num_requests=2))
    assert (s.total_input_tokens, s.reusable_tokens, s.num_sessions, s.span_s) == (2130, 1024, 2, 0.005)


# --- the bundled demo --------------------------------------------------------------------------

def test_demo_is_the_default_synth_output(tmp_path):
    regenerated = tmp_path / "demo.jsonl"
    synth_to_file(regenerated, SynthConfig())
    assert DEMO_TRACE.read_bytes() == regenerated.read_bytes(), "regenerate with `tierdiag synth " \
        "tierdiag/trace/samples/demo.jsonl`"
    assert 400 <= len(list(read_trace(DEMO_TRACE))) <= 800
    assert DEMO_TRACE.stat().st_size < 400_000


def _returning_sessions_by_tier(reqs: list[SynthRequest], device_tokens: int, host_tokens: int,
                                block: int = 512) -> dict[str, int]:
    """Where a returning session finds the deepest block it reuses from its own previous request.

    A two-level LRU over blocks, inclusive like HiCache write-through (everything on device is
    backed up on host). Blocks are touched deepest first so ancestors are always more recent than
    descendants, as with leaf-first eviction in a radix tree. Concurrency is ignored.
    """
    device: OrderedDict[int, None] = OrderedDict()
    host: OrderedDict[int, None] = OrderedDict()
    previous: dict[str, set[int]] = {}
    found = {"device": 0, "host": 0, "gone": 0}
    for r in reqs:
        group = split_id(r.req_id)[0]
        full = r.hash_ids[: r.input_tokens // block]
        if group in previous:
            own = [h for h in full if h in previous[group]]
            if own:
                deepest = own[-1]
                found["device" if deepest in device else "host" if deepest in host else "gone"] += 1
        if not group.startswith("sys"):
            previous[group] = set(full)
        for h in reversed(full):
            for pool in (device, host):
                pool[h] = None
                pool.move_to_end(h)
        for pool, cap in ((device, device_tokens // block), (host, host_tokens // block)):
            while len(pool) > cap:
                pool.popitem(last=False)
    return found


@pytest.mark.parametrize("device_tokens", [64_000, 96_000, 128_000])
def test_demo_sends_returning_sessions_to_every_tier(device_tokens):
    reqs = generate(SynthConfig())
    found = _returning_sessions_by_tier(reqs, device_tokens, 4 * device_tokens)
    returning = sum(found.values())
    assert returning > 200
    assert found["device"] >= 0.25 * returning
    assert found["host"] >= 0.25 * returning
    if device_tokens < 128_000:
        assert found["gone"] >= 0.03 * returning


# --- the CLI -----------------------------------------------------------------------------------

def test_cli_synth_writes_a_readable_trace(tmp_path):
    out = tmp_path / "agents.jsonl"
    result = CliRunner().invoke(app, ["synth", str(out), "--kind", "agent", "--requests", "30", "--seed", "3",
                                      "--rate", "4", "--block-size", "256"])
    assert result.exit_code == 0, result.output
    assert "wrote 30 requests (agent, seed 3)" in result.output
    reqs = list(read_trace(out, block_size=256))
    assert len(reqs) == 30 and all(r.req_id.startswith("agent") for r in reqs)


def test_cli_synth_json(tmp_path):
    out = tmp_path / "t.jsonl.gz"
    result = CliRunner().invoke(app, ["synth", str(out), "--requests", "25", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["num_requests"] == 25 and summary["kind"] == "mixed" and summary["path"] == str(out)
    assert 0 < summary["reusable_share"] < 1


def _main(*args: str) -> subprocess.CompletedProcess:
    """The console script's error handling in this process (tests/support/cli.py): its one line
    and exit code, not its start (~0.45 s of CPU)."""
    return completed_in_process(*args)


@pytest.mark.parametrize(("args", "code", "fragment"), [
    (["--kind", "chat"], 2, "unknown workload kind 'chat'"),
    (["--requests", "0"], 2, "--requests must be at least 1"),
    (["--rate", "-1"], 2, "--rate must be a positive"),
])
def test_cli_synth_bad_options_are_one_line_errors(tmp_path, args, code, fragment):
    proc = _main("synth", str(tmp_path / "x.jsonl"), *args)
    assert proc.returncode == code
    assert proc.stderr.count("\n") == 1 and fragment in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "x.jsonl").exists()


def test_cli_synth_unwritable_output(tmp_path):
    # Missing folders are created (the rule for every output); a file in the way is exit 6.
    (tmp_path / "blocker").write_text("x")
    proc = _main("synth", str(tmp_path / "blocker" / "dir" / "x.jsonl"), "--requests", "5")
    assert proc.returncode == 6
    assert proc.stderr.startswith("tierdiag: error: cannot write") and proc.stderr.count("\n") == 1
    assert not list(tmp_path.rglob("*.tmp"))


def test_write_trace_replaces_atomically(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("old\n")
    reqs = generate(SynthConfig(num_requests=3))
    write_trace(path, reqs)
    assert [json.loads(line)["id"] for line in path.read_text().splitlines()] == [r.req_id for r in reqs]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl"]
