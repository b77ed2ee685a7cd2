"""The samples the README's commands run on (tierdiag/trace/samples/, issue 42): installed with the
package, and each in its format's true shape (tests/support/make_samples.py writes them)."""

from __future__ import annotations

import gzip
import json
import tomllib
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "tierdiag" / "trace" / "samples"


def test_every_sample_is_package_data():
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["tierdiag.trace"]
    files = [p.relative_to(SAMPLES.parent).as_posix() for p in SAMPLES.rglob("*") if p.is_file()]
    assert len(files) >= 5
    for f in files:
        assert any(fnmatch(f, g) and f.count("/") == g.count("/") for g in globs), f"{f} is not installed: pyproject package-data"


def test_the_sglang_export_has_dp_rank_and_timings_on_every_line():
    (path,) = (SAMPLES / "sglang").iterdir()
    assert path.name == "sglang-request-metrics-20251201_09.log.gz"  # FileRequestMetricsExporter's hourly name
    lines = [json.loads(x) for x in gzip.open(path, "rt")]
    assert len(lines) >= 40
    assert {x["dp_rank"] for x in lines} == {0, 1}
    for x in lines:
        params = json.loads(x["request_parameters"])  # JSON inside JSON, as the exporter writes it
        assert len(params["input_ids"]) == x["prompt_tokens"]
        for key in ("request_received_ts", "queue_time", "first_token_latency", "e2e_latency", "forward_entry_time"):
            assert isinstance(x[key], float), key
        d = x["cached_tokens_details"]
        assert (d is None) == (x["cached_tokens"] == 0)
        if d is not None:
            assert d["device"] + d["host"] == x["cached_tokens"]
    assert any(x["cached_tokens_details"] and x["cached_tokens_details"]["host"] for x in lines)  # load-backs to fit


def test_the_kv_cache_tester_sample_has_sub_agents_on_their_own_clock():
    doc = json.loads((SAMPLES / "kv-cache-tester" / "coding-a.json").read_text())
    subs = [r for r in doc["requests"] if r.get("type") == "subagent"]
    assert len(subs) >= 3 and len({s["t"] for s in subs}) == len(subs)  # spawned at several times
    for s in subs:
        assert s["requests"][0]["t"] == 0.0  # relative to the spawn marker's t
        assert all(len(r["hash_ids"]) == r["in"] // doc["block_size"] for r in s["requests"])
    turns = [r for r in doc["requests"] if r.get("type") != "subagent"]
    assert max(r["in"] + r["out"] for r in turns) > 131_072  # past Llama-3.1's context: the README's example


def test_the_bailian_sample_chains_sessions():
    lines = [json.loads(x) for x in (SAMPLES / "bailian.jsonl").read_text().splitlines()]
    ids = {x["chat_id"] for x in lines}
    assert sum(1 for x in lines if x["parent_chat_id"] in ids) >= 10
    assert any(x["parent_chat_id"] not in ids and x["parent_chat_id"] != -1 for x in lines)  # an orphan
    assert all(len(x["hash_ids"]) == x["input_length"] // 16 for x in lines)
