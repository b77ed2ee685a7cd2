"""Issue 42, items 3 and 4: replay's closing table says why requests were rejected, with the option
that changes each reason, and replay and `summary` count the run's requests the same way
("N requests (S served, R rejected)")."""

from __future__ import annotations

import json
import re

from hypothesis import given, settings, strategies as st

from tests.support.cli import tierdiag_in_process
from tests.support.traces import line, write_trace
from tierdiag.config.engine import EngineConfig
from tierdiag.config.presets import MODELS
from tierdiag.engine.scheduler import reject_kind
from tierdiag.report.terminal import requests_line

BLOCK = 512


def _session_trace(path, *, long_input: int):
    """Two sessions of three turns; session a's second turn is `long_input` tokens long."""
    lines = []
    for s, sizes in (("a", (2_000, long_input, 3_000)), ("b", (1_000, 1_500, 2_000))):
        for k, n in enumerate(sizes):
            lines.append(line(1000 * k + (0 if s == "a" else 10), n, list(range(-(-n // BLOCK))), id=f"{s}#{k + 1}",
                              session=s, think_ms=100.0 if k else None))
    lines.sort(key=lambda x: json.loads(x)["timestamp"])
    return write_trace(path, [x.replace(', "think_ms": null', "") for x in lines])


def test_closing_table_and_summary_agree_and_name_the_flag(tmp_path):
    trace = _session_trace(tmp_path / "t.jsonl", long_input=140_000)
    db = tmp_path / "r.duckdb"
    r = tierdiag_in_process("replay", trace, "--db", db, "--verify", "off")
    assert r.code == 0, r.err
    # a's 140k-token turn is past Llama-3.1's 131,072 tokens; a's third turn ends with it
    assert "6 requests (4 served, 2 rejected)" in r.out
    flat = " ".join(r.out.split())
    assert "context_length 1: over llama3-8b's 131,072-token context · --max-context N" in flat
    longer = [m.name for m in MODELS.values() if m.max_context_tokens >= 200_000]
    assert longer and all(name in flat.replace("| ", "|") for name in longer)
    assert "session_ended 1:" in flat
    s = tierdiag_in_process("summary", "--db", db)
    assert s.code == 0, s.err
    assert "6 requests (4 served, 2 rejected)" in " ".join(s.out.split())
    # JSON: the kinds add up to the rejected count
    j = tierdiag_in_process("replay", trace, "--db", db, "--verify", "off", "--json").json()
    assert j["rejected"] == {"context_length": 1, "session_ended": 1} and j["num_rejected"] == 2


def test_a_long_context_preset_serves_the_same_trace(tmp_path):
    trace = _session_trace(tmp_path / "t.jsonl", long_input=140_000)
    r = tierdiag_in_process("replay", trace, "--db", tmp_path / "r.duckdb", "--verify", "off", "--model",
                            "qwen3-30b-a3b")
    assert r.code == 0, r.err
    assert re.search(r"replay t: 6 requests in ", r.out) and "rejected" not in r.out


def test_max_context_is_named_when_it_set_the_limit(tmp_path):
    trace = _session_trace(tmp_path / "t.jsonl", long_input=9_000)
    r = tierdiag_in_process("replay", trace, "--db", tmp_path / "r.duckdb", "--verify", "off", "--max-context", "8192")
    assert r.code == 0, r.err
    assert "context_length 1: over the --max-context 8,192-token context" in " ".join(r.out.split())


@settings(max_examples=40, deadline=None)
@given(total=st.integers(0, 10**12), data=st.data())
def test_requests_line_adds_up(total, data):
    rejected = data.draw(st.integers(0, total))
    text = requests_line(total, rejected)
    assert text.startswith(f"{total:,} request")
    if rejected:
        assert text.endswith(f"({total - rejected:,} served, {rejected:,} rejected)")
    else:
        assert "rejected" not in text


@settings(max_examples=50, deadline=None)
@given(reason=st.text(max_size=60))
def test_reject_kind_is_one_of_three(reason):
    kind = reject_kind(reason)
    assert kind in ("context_length", "session_ended", "device_memory")
    assert (kind == "context_length") == reason.startswith("context_length:")


def test_long_context_presets_shapes():
    """The config.json numbers cited in config/presets.py: KV bytes a token (GQA: KV heads, not
    attention heads) and MoE weights (every expert in memory, the active ones computed)."""
    q30 = MODELS["qwen3-30b-a3b"]
    assert q30.kv_bytes_per_token == 2 * 48 * 4 * 128 * 2 == 98_304
    assert q30.weight_bytes == 30.5e9 * 2 and q30.num_params == 3.3e9
    assert MODELS["qwen3-4b"].kv_bytes_per_token == 2 * 36 * 8 * 128 * 2
    assert MODELS["qwen3-coder-30b-a3b"].kv_bytes_per_token == q30.kv_bytes_per_token
    for name in ("qwen3-4b", "qwen3-30b-a3b", "qwen3-coder-30b-a3b"):
        m = MODELS[name]
        assert m.max_context_tokens == 262_144
        # fits one H200 beside its weights, with room for more than one full context
        assert EngineConfig(model=name, gpu="h200").resolved_device_tokens() > 262_144
