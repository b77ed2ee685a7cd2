"""Self-consistent fake run stores written through RunWriter, so the report can be tested
without the engine (and without torch).

The fake run keeps the contract's invariants (COLUMNS.md): token conservation per request, the
TTFT decomposition summing to ttft_ns, skipped load-backs counted as computed, rejected rows
with NULL times, and one load-back transfer per tiered hit.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tierdiag.store.schema import TABLES
from tierdiag.store.writer import RunWriter
from tierdiag.diagnose.run.close import after_commit

PAGE = 64
KV_BYTES_PER_TOKEN = 128 * 1024
LINK_BYTES_PER_S = 50e9
NS_PER_TOKEN = 40_000  # modelled prefill cost of one new token


def fake_columns(n: int, seed: int = 0, *, num_rejected: int = 2,
                 ids: list[str] | None = None) -> dict[str, dict[str, list]]:
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(50e6, n)).astype(np.int64)
    inp = rng.integers(2 * PAGE, 300 * PAGE, n)
    cls = rng.choice(np.array(["device_hit", "tiered_hit", "miss"]), n, p=[0.35, 0.4, 0.25])
    pages = (inp - 1) // PAGE  # matching never covers the last token
    reused = (rng.uniform(0.2, 1.0, n) * pages).astype(np.int64) * PAGE
    dev = np.where(cls == "miss", 0, reused)
    lb = np.where(cls == "tiered_hit", (rng.uniform(0.1, 0.9, n) * dev / PAGE).astype(np.int64) * PAGE, 0)
    lb = np.where((cls == "tiered_hit") & (lb == 0), PAGE, lb)
    dev = np.where(cls == "tiered_hit", np.maximum(dev - lb, 0), dev)
    storage = np.where((cls == "tiered_hit") & (rng.uniform(size=n) < 0.2), (lb // PAGE // 2) * PAGE, 0)
    host = lb - storage
    # Some misses found a short host part that was skipped and recomputed.
    skipped = (cls == "miss") & (rng.uniform(size=n) < 0.3)
    skipped_tokens = np.where(skipped, PAGE // 8, 0)
    computed = inp - dev - host - storage
    recomputed = np.minimum(computed - 1, skipped_tokens + (rng.uniform(size=n) < 0.2) * PAGE)
    new = computed - recomputed
    lb_bytes = (host + storage) * KV_BYTES_PER_TOKEN
    lb_ns = (lb_bytes / LINK_BYTES_PER_S * 1e9).astype(np.int64) + np.where(lb_bytes > 0, 20_000, 0)
    lb_exposed = (lb_ns * rng.uniform(0, 1, n)).astype(np.int64)
    storage_wait = np.where(storage > 0, rng.integers(1_000_000, 30_000_000, n), 0)
    queue = rng.exponential(20e6, n).astype(np.int64)
    recompute_ns = recomputed * NS_PER_TOKEN
    compute_ns = new * NS_PER_TOKEN
    ttft = queue + storage_wait + lb_exposed + recompute_ns + compute_ns
    prefix = dev + host + storage
    status = np.array(["finished"] * n, dtype=object)
    rejected = rng.choice(n, num_rejected, replace=False) if num_rejected else np.array([], dtype=int)
    status[rejected] = "rejected"
    fin = status == "finished"

    def times(a):  # rejected rows carry NULL times
        return [int(v) if ok else None for v, ok in zip(a, fin)]

    req_ids = list(ids) if ids is not None else [f"r{i}" for i in range(n)]
    requests = {
        "req_id": req_ids, "seq": list(range(n)), "arrival_ns": arrival.tolist(),
        "input_tokens": inp.tolist(), "output_tokens": rng.integers(1, 500, n).tolist(),
        "status": status.tolist(),
        "reject_reason": [None if ok else "larger_than_device_pool" for ok in fin],
        "hit_class": cls.tolist(), "device_hit_tokens": dev.tolist(), "host_hit_tokens": host.tolist(),
        "storage_hit_tokens": storage.tolist(), "computed_tokens": computed.tolist(),
        "recomputed_tokens": recomputed.tolist(),
        "host_match_tokens": (host + skipped_tokens).tolist(), "storage_match_tokens": storage.tolist(),
        "loadback_skipped_reason": ["below_threshold" if s else None for s in skipped],
        "loadback_skipped_tokens": skipped_tokens.tolist(),
        "prefix_indices_len": prefix.tolist(), "cache_protected_len": prefix.tolist(),
        "extend_input_len": (inp - prefix).tolist(),
        "queue_ns": times(queue), "storage_wait_ns": times(storage_wait), "loadback_ns": times(lb_ns),
        "loadback_exposed_ns": times(lb_exposed), "loadback_queued_ns": times(np.zeros(n, np.int64)),
        "loadback_bytes": lb_bytes.tolist(), "loadback_pages": (lb // PAGE).tolist(),
        "loadback_runs": np.where(lb > 0, 1, 0).tolist(),
        "recompute_ns": times(recompute_ns), "compute_ns": times(compute_ns),
        "prefill_ns": times(ttft - queue), "ttft_ns": times(ttft),
        "ideal_ttft_ns": times(np.maximum(new, 1) * NS_PER_TOKEN),
        "ttft_if_device_resident_ns": times(ttft - lb_exposed - storage_wait),
        "recompute_instead_ns": times(ttft - lb_exposed + (host + storage) * NS_PER_TOKEN),
        "first_token_ns": times(arrival + ttft), "finish_ns": times(arrival + ttft + 100_000_000),
    }
    tiered = np.flatnonzero((lb_bytes > 0) & fin)
    t0 = arrival[tiered] + queue[tiered]
    transfers = {
        "transfer_id": list(range(len(tiered))), "t_start_ns": t0.tolist(),
        "t_end_ns": (t0 + lb_ns[tiered]).tolist(), "kind": ["load_back"] * len(tiered),
        "req_id": [req_ids[i] for i in tiered], "pages": (lb[tiered] // PAGE).tolist(),
        "runs": [1] * len(tiered), "bytes": lb_bytes[tiered].tolist(),
        "data_plane_bytes": (lb[tiered] * 1024).tolist(), "queued_ns": [0] * len(tiered),
        "wall_ns": [5_000] * len(tiered), "verified": [True] * len(tiered),
    }
    # Pool occupancy sampled at every arrival; evictions whenever the device pool is near full.
    cap = {"device": 200_000, "host": 800_000}
    pool = {"t_ns": [], "tier": [], "used_tokens": [], "capacity_tokens": [], "locked_tokens": []}
    used_dev = np.clip(np.cumsum(rng.integers(-3000, 4000, n)) + 100_000, 0, cap["device"])
    used_host = np.clip(np.cumsum(rng.integers(-2000, 4000, n)), 0, cap["host"])
    for tier, used in (("device", used_dev), ("host", used_host)):
        pool["t_ns"] += arrival.tolist()
        pool["tier"] += [tier] * n
        pool["used_tokens"] += used.tolist()
        pool["capacity_tokens"] += [cap[tier]] * n
        pool["locked_tokens"] += (used * rng.uniform(0, 0.3, n)).astype(np.int64).tolist()
    full = np.flatnonzero(used_dev > 0.9 * cap["device"])
    evictions = {
        "eviction_id": list(range(len(full))), "t_ns": arrival[full].tolist(),
        "tier": ["device"] * len(full), "node_id": full.tolist(), "tokens": [PAGE * 4] * len(full),
        "action": ["demote"] * len(full), "cause_req_id": [req_ids[i] for i in full],
        "owner_req_id": [req_ids[max(i - 1, 0)] for i in full],
        "pool_used_tokens": used_dev[full].tolist(), "pool_capacity_tokens": [cap["device"]] * len(full),
        "locked_tokens": [0] * len(full), "node_hit_count": [1] * len(full),
        "node_last_access_ns": arrival[full].tolist(),
    }
    # One prefill batch per finished request: from the end of its queueing to its first token.
    done = np.flatnonzero(fin)
    b0 = arrival[done] + queue[done]
    batches = {
        "batch_id": list(range(len(done))), "t_start_ns": b0.tolist(), "t_end_ns": (arrival + ttft)[done].tolist(),
        "num_reqs": [1] * len(done), "extend_tokens": computed[done].tolist(),
        "loadback_bytes": lb_bytes[done].tolist(),
        "compute_ns": (recompute_ns + compute_ns)[done].tolist(),
        "loadback_exposed_ns": (lb_exposed + storage_wait)[done].tolist(), "num_decoding": [0] * len(done),
    }
    if "recompute_ns" in TABLES["batches"]:  # the split, where the schema records it
        batches["recompute_ns"] = recompute_ns[done].tolist()
    return {"requests": requests, "transfers": transfers, "pool_samples": pool, "evictions": evictions,
            "batches": batches}


def write_fake_run(db: Path, n: int = 300, seed: int = 0, *, name: str = "fake", **kw) -> RunWriter:
    writer = RunWriter(
        db, name=name, trace_path="fake.jsonl", trace_sha256="0" * 64,
        config={"model": "llama3-8b", "gpu": "h200", "device_tokens": 200_000, "host_tokens": 800_000,
                "page_size": PAGE, "write_policy": "write_through", "eviction_policy": "lru",
                "load_back_threshold": 10},
        hardware={"gpu": "none (CPU data plane)", "cpu_cores": 2},
        data_plane={"link_bytes_per_s": LINK_BYTES_PER_S, "kv_bytes_per_token": KV_BYTES_PER_TOKEN},
        timing="modelled", command_line=["tierdiag", "replay", "fake.jsonl"])
    writer.append(fake_columns(n, seed, **kw))
    writer.finish("complete", num_requests=n, after_commit=after_commit)  # as a replay closes it
    return writer
