"""KV memory per rank and in all (issue 39 item 8): with `--dp N` each rank (a scheduler process
beside its GPU) has its own device and host pools, and the storage tier is one, shared
(docs/contract.md "Deployments"). `compare` reported one rank's memory for a run of four
(`memory_bytes` 60 GiB for 4 ranks of 60 GiB). `runs`, `compare`, `summary` and the report state
per rank and in all; advice sizes a host pool per rank (the config key is per rank) and says so."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.cli import invoke, invoke_json
from tierdiag.diagnose.run.kv_memory import KvMemory, kv_memory

pytest.importorskip("tierdiag.cli.replay")

DEVICE, HOST, STORAGE = 8192, 16384, 32768


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    d = tmp_path_factory.mktemp("rankmem")
    trace, db = d / "t.jsonl", d / "r.duckdb"
    invoke("synth", "--kind", "agent", "--requests", "120", str(trace))
    pools = ["--device-tokens", DEVICE, "--host-tokens", HOST, "--storage-tokens", STORAGE]
    invoke("replay", str(trace), "--db", str(db), "--run-name", "four", "--dp", "4", *pools)
    invoke("replay", str(trace), "--db", str(db), "--run-name", "one", *pools)
    return db


def _runs(db) -> list:
    return json.loads(invoke("runs", "--db", str(db), "--json"))


def _kv(db) -> int:
    return _runs(db)[0]["data_plane"]["kv_bytes_per_token"]


def test_compare_states_every_ranks_memory_and_one_ranks(store):
    kv = _kv(store)
    rows = {r["name"]: r for r in invoke_json("compare", "four", "one", "--db", str(store))["runs"]}
    four, one = rows["four"], rows["one"]
    assert four["num_ranks"] == 4 and one["num_ranks"] == 1
    assert four["memory_rank_bytes"] == one["memory_rank_bytes"] == (DEVICE + HOST) * kv
    # Each rank its own device and host pools; the storage tier once.
    assert four["memory_bytes"] == 4 * (DEVICE + HOST) * kv + STORAGE * kv
    assert one["memory_bytes"] == (DEVICE + HOST + STORAGE) * kv
    text = invoke("compare", "four", "one", "--db", str(store))
    assert "(4 × " in text and "every rank's device + host" in " ".join(text.split())


def test_runs_and_summary_state_per_rank_and_total(store):
    kv = _kv(store)
    runs = {r["name"]: r for r in _runs(store)}
    assert runs["four"]["kv_memory"] == {"ranks": 4, "rank_bytes": (DEVICE + HOST) * kv,
                                         "storage_bytes": STORAGE * kv,
                                         "total_bytes": 4 * (DEVICE + HOST) * kv + STORAGE * kv}
    assert runs["one"]["kv_memory"]["ranks"] == 1
    s = invoke_json("summary", "--db", str(store), "--run", "four")
    assert s["kv_memory"] == runs["four"]["kv_memory"]
    flat = " ".join(invoke("runs", "--db", str(store)).replace("│", " ").split())
    assert "per rank" in flat and "in all: 4 ranks ×" in flat
    flat = " ".join(invoke("summary", "--db", str(store), "--run", "four").split())
    assert "each rank's own" in flat and "in all: 4 ranks ×" in flat and "storage, shared" in flat
    one = " ".join(invoke("summary", "--db", str(store), "--run", "one").split())
    assert "each rank's own" not in one


@settings(max_examples=50, deadline=None)
@given(st.one_of(st.none(), st.integers(-3, 300), st.booleans(), st.text(max_size=3), st.floats()),
       st.integers(0, 2**40), st.integers(0, 2**40), st.integers(0, 2**40), st.integers(1, 2**20))
def test_kv_memory_of_any_recorded_config(dp, device, host, storage, kv):
    """A recorded config is data (a hand-edited or older store): a `dp` that is not a positive
    integer reads as one rank; the arithmetic is exact (Python integers)."""
    m = kv_memory({"dp": dp, "device_tokens": device, "host_tokens": host, "storage_tokens": storage}, kv)
    ranks = dp if isinstance(dp, int) and not isinstance(dp, bool) and dp >= 1 else 1
    assert m == KvMemory(ranks, (device + host) * kv, storage * kv, ranks * (device + host) * kv + storage * kv)
    assert kv_memory({"dp": dp, "host_tokens": host}, kv) is None  # no device pool recorded


def test_the_report_states_per_rank_and_total(store, tmp_path):
    out = tmp_path / "four.html"
    invoke("report", "--db", str(store), "--run", "four", "-o", str(out))
    page = out.read_text()
    assert "KV memory <b>" in page and "in all: 4 ranks × " in page
    one = tmp_path / "one.html"
    invoke("report", "--db", str(store), "--run", "one", "-o", str(one))
    assert "in all: 4 ranks" not in one.read_text()


def test_host_pool_advice_is_per_rank_and_capped_by_a_servers_memory_per_gpu(tmp_path):
    """An agent workload on four ranks whose host pools are too small: the host pool items cost
    each rank their GiB (the config key is per rank, each scheduler allocating its own), say so
    with the total over the ranks, and never exceed the host memory beside one GPU of a real
    8-GPU server (2 TiB: 256 GiB each), which they state."""
    from tierdiag.diagnose.advice import HOST_POOL_LIMIT_BYTES

    trace, db = tmp_path / "t.jsonl", tmp_path / "r.duckdb"
    invoke("synth", "--kind", "agent", str(trace))
    invoke("replay", str(trace), "--db", str(db), "--dp", "4", "--device-tokens", "8192", "--host-tokens", "16384")
    kv = _kv(db)
    items = [a for a in invoke_json("summary", "--db", str(db))["diagnosis"]["advice"] if a["cost_kind"] == "host_memory"]
    assert items
    assert HOST_POOL_LIMIT_BYTES == 256 << 30
    for a in items:
        assert a["cost_ranks"] == 4
        assert a["host_limit_words"] == "a GPU has in an 8-GPU server with 2 TiB of host memory (256 GiB per GPU)"
        assert a["changes"]["host_tokens"] * kv <= HOST_POOL_LIMIT_BYTES
        assert a["cost_gib"] == pytest.approx((a["changes"]["host_tokens"] - 16384) * kv / 2**30)
    flat = " ".join(invoke("summary", "--db", str(db)).replace("│", " ").split())
    gib = items[0]["cost_gib"]
    assert f"costs {gib:,.0f} GiB of host memory per rank, {gib * 4:,.0f} GiB over the 4 ranks" in flat
    assert "capped by the host memory a GPU has in an 8-GPU server with 2 TiB" in flat
