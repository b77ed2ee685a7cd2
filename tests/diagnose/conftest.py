"""Hand-built run stores for the diagnose tests, written through the real RunWriter.

`RunBuilder` collects rows that obey the store's invariants (COLUMNS.md): the token split sums
to input_tokens, the TTFT parts sum to ttft_ns, hit_class follows from the split. Tests add
the requests / evictions / transfers a scenario needs and `write()` them as one run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tierdiag.store.writer import RunWriter
from tierdiag.diagnose.run.close import after_commit

US = 1_000  # ns
MS = 1_000_000  # ns
KV_BYTES_PER_TOKEN = 131_072  # llama3-8b geometry
PAGE = 64
LINK_BYTES_PER_S = 25e9

CONFIG = {"model": "llama3-8b", "gpu": "h200", "device_tokens": 4096, "host_tokens": 16384,
          "storage_tokens": 65536, "page_size": PAGE, "load_back_threshold": 256}


@dataclass
class RunBuilder:
    path: Path
    name: str = "planted"
    config: dict = field(default_factory=lambda: dict(CONFIG))
    requests: list[dict] = field(default_factory=list)
    evictions: list[dict] = field(default_factory=list)
    request_evictions: list[dict] = field(default_factory=list)
    transfers: list[dict] = field(default_factory=list)

    def request(self, req_id: str, *, arrival_ns: int, input_tokens: int, output_tokens: int = 16,
                device: int = 0, host: int = 0, storage: int = 0, recomputed: int = 0,
                host_match: int | None = None, storage_match: int | None = None,
                skipped_reason: str | None = None, skipped_tokens: int = 0,
                storage_skipped_reason: str | None = None,
                queue_ns: int = 0, storage_wait_ns: int = 0, loadback_exposed_ns: int = 0,
                recompute_ns: int = 0, compute_ns: int = 100 * US, ideal_ttft_ns: int | None = None,
                loadback_ns: int | None = None, loadback_queued_ns: int = 0, loadback_runs: int = 1,
                storage_fetch_ns: int = 0, num_chunks: int = 1) -> dict:
        computed = input_tokens - device - host - storage
        assert computed >= 1 and 0 <= recomputed <= computed
        loaded = host + storage
        hit_class = "tiered_hit" if loaded else ("device_hit" if device else "miss")
        ttft = queue_ns + storage_wait_ns + loadback_exposed_ns + recompute_ns + compute_ns
        lb_bytes = loaded * KV_BYTES_PER_TOKEN
        if loadback_ns is None:
            loadback_ns = int(lb_bytes / LINK_BYTES_PER_S * 1e9) if lb_bytes else 0
        row = dict(
            req_id=req_id, seq=len(self.requests), arrival_ns=arrival_ns, input_tokens=input_tokens,
            output_tokens=output_tokens, status="finished", reject_reason=None, hit_class=hit_class,
            device_hit_tokens=device, host_hit_tokens=host, storage_hit_tokens=storage,
            computed_tokens=computed, recomputed_tokens=recomputed,
            host_match_tokens=host if host_match is None else host_match,
            storage_match_tokens=storage if storage_match is None else storage_match,
            loadback_skipped_reason=skipped_reason, loadback_skipped_tokens=skipped_tokens,
            storage_skipped_reason=storage_skipped_reason,
            prefix_indices_len=device + loaded, cache_protected_len=device + loaded,
            extend_input_len=computed, queue_ns=queue_ns, storage_wait_ns=storage_wait_ns,
            loadback_ns=loadback_ns, loadback_exposed_ns=loadback_exposed_ns,
            loadback_queued_ns=loadback_queued_ns, loadback_bytes=lb_bytes, loadback_pages=loaded // PAGE,
            loadback_runs=loadback_runs if loaded else 0, storage_bytes=storage * KV_BYTES_PER_TOKEN,
            storage_fetch_ns=storage_fetch_ns, recompute_ns=recompute_ns, compute_ns=compute_ns,
            prefill_ns=ttft - queue_ns, ttft_ns=ttft,
            ideal_ttft_ns=compute_ns if ideal_ttft_ns is None else ideal_ttft_ns,
            ttft_if_device_resident_ns=ttft - loadback_exposed_ns - storage_wait_ns,
            recompute_instead_ns=ttft - loadback_exposed_ns - storage_wait_ns + loaded * 50 * US // PAGE,
            first_batch_id=len(self.requests), num_chunks=num_chunks, first_token_ns=arrival_ns + ttft,
            finish_ns=arrival_ns + ttft + output_tokens * 10 * US,
        )
        self.requests.append(row)
        if loaded:
            self.transfer("load_back", req_id, t_start_ns=arrival_ns + queue_ns + storage_wait_ns, duration_ns=loadback_ns,
                          tokens=loaded, runs=loadback_runs)
        return row

    def rejected(self, req_id: str, *, arrival_ns: int, input_tokens: int, reason: str) -> dict:
        row = dict(req_id=req_id, seq=len(self.requests), arrival_ns=arrival_ns, input_tokens=input_tokens,
                   output_tokens=1, status="rejected", reject_reason=reason, hit_class="miss",
                   device_hit_tokens=0, host_hit_tokens=0, storage_hit_tokens=0, computed_tokens=input_tokens,
                   recomputed_tokens=0, host_match_tokens=0, storage_match_tokens=0,
                   loadback_skipped_tokens=0, prefix_indices_len=0, cache_protected_len=0,
                   extend_input_len=input_tokens)
        self.requests.append(row)
        return row

    def transfer(self, kind: str, req_id: str | None, *, t_start_ns: int, duration_ns: int, tokens: int,
                 runs: int = 1) -> None:
        self.transfers.append(dict(
            transfer_id=len(self.transfers), t_start_ns=t_start_ns, t_end_ns=t_start_ns + duration_ns,
            kind=kind, req_id=req_id, pages=tokens // PAGE, runs=runs, bytes=tokens * KV_BYTES_PER_TOKEN,
            data_plane_bytes=tokens * 64, queued_ns=0, wall_ns=duration_ns // 100, verified=True))

    def evict(self, *, t_ns: int, tier: str, action: str, tokens: int, cause: str | None, owner: str | None,
              victims: dict[str, int] | None = None, pool_used: int = 4096, locked: int = 0,
              last_access_ns: int = 0) -> int:
        """One eviction; `victims` maps req_id -> tokens of its prefix this eviction had taken."""
        eid = len(self.evictions)
        capacity = {"device": self.config["device_tokens"], "host": self.config["host_tokens"]}.get(
            tier, self.config["storage_tokens"])
        self.evictions.append(dict(
            eviction_id=eid, t_ns=t_ns, tier=tier, node_id=1000 + eid, tokens=tokens, action=action,
            cause_req_id=cause, owner_req_id=owner, pool_used_tokens=pool_used, pool_capacity_tokens=capacity,
            locked_tokens=locked, node_hit_count=1, node_last_access_ns=last_access_ns))
        for req_id, n in (victims or {}).items():
            self.request_evictions.append(dict(req_id=req_id, eviction_id=eid, tokens=n))
        return eid

    def write(self) -> Path:
        writer = RunWriter(self.path, name=self.name, trace_path="planted.jsonl", trace_sha256="0" * 64,
                           config=self.config, hardware={"gpu": "h200"},
                           data_plane={"link_bytes_per_s": LINK_BYTES_PER_S,
                                       "kv_bytes_per_token": KV_BYTES_PER_TOKEN},
                           timing="modelled", command_line=["tierdiag", "replay", "planted.jsonl"])
        tables = {"requests": self.requests, "evictions": self.evictions,
                  "request_evictions": self.request_evictions, "transfers": self.transfers}
        writer.append({name: _columns(rows) for name, rows in tables.items() if rows})
        # Closed as a replay closes its run: with the run evidence (diagnose.run.close).
        writer.finish("complete", num_requests=len(self.requests), after_commit=after_commit)
        self.run_id = writer.run_id
        return self.path


def _columns(rows: list[dict]) -> dict[str, list]:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    return {k: [r.get(k) for r in rows] for k in keys}


def plant_scenarios(b: RunBuilder) -> RunBuilder:
    """One request per primary cause, plus the context that explains it.

    Timeline (ms): 0 'warm' caches prefix A; 10-12 floods 'f1','f2' push A to host (demote)
    and demote prefix B, then B is deleted from host; 20 'tier' comes back for A (load-back); 30 'dev' device hit; 40 'miss';
    50 'stor' from storage; 60 'recomp' recomputes dropped B; 70 'skip' skips a short host part;
    80 'queued' device hit stuck behind a burst; 90 'chunky' compute beyond ideal; 95 'rej'.
    """
    b.request("warm", arrival_ns=0, input_tokens=2112, compute_ns=900 * US)
    b.request("f1", arrival_ns=10 * MS, input_tokens=2048, compute_ns=850 * US)
    b.request("f2", arrival_ns=12 * MS, input_tokens=2048, compute_ns=850 * US)
    b.evict(t_ns=10 * MS, tier="device", action="demote", tokens=1024, cause="f1", owner="warm",
            victims={"tier": 1024}, pool_used=4032, locked=2048, last_access_ns=1 * MS)
    b.evict(t_ns=12 * MS, tier="device", action="demote", tokens=1024, cause="f2", owner="warm",
            victims={"tier": 1024}, pool_used=4096, locked=2048, last_access_ns=1 * MS)
    b.evict(t_ns=12 * MS, tier="device", action="demote", tokens=512, cause="f2", owner="warm",
            victims={"recomp": 512}, pool_used=4096, locked=1024, last_access_ns=1 * MS)
    b.evict(t_ns=12 * MS, tier="device", action="demote", tokens=192, cause="f1", owner="warm",
            victims={"skip": 192}, pool_used=4096, locked=1024, last_access_ns=2 * MS)
    b.evict(t_ns=13 * MS, tier="host", action="delete", tokens=512, cause="f2", owner="warm",
            victims={"recomp": 512}, pool_used=16384, locked=0, last_access_ns=1 * MS)
    # 2048 tokens loaded back: ~10.7 ms on the link, 8 ms of it exposed.
    b.request("tier", arrival_ns=20 * MS, input_tokens=2112, device=0, host=2048, loadback_exposed_ns=8 * MS,
              compute_ns=60 * US, loadback_runs=8)
    b.request("dev", arrival_ns=30 * MS, input_tokens=2112, device=2048, compute_ns=60 * US, queue_ns=5 * US)
    b.request("miss", arrival_ns=40 * MS, input_tokens=1024, compute_ns=450 * US)
    b.request("stor", arrival_ns=50 * MS, input_tokens=1088, storage=1024, storage_wait_ns=4 * MS,
              storage_fetch_ns=5 * MS, loadback_exposed_ns=1 * MS, compute_ns=60 * US)
    b.transfer("prefetch", "stor", t_start_ns=50 * MS, duration_ns=5 * MS, tokens=1024)
    b.request("recomp", arrival_ns=60 * MS, input_tokens=576, recomputed=512, recompute_ns=250 * US,
              compute_ns=30 * US)
    b.request("skip", arrival_ns=70 * MS, input_tokens=256, recomputed=192, host_match=192,
              skipped_reason="below_threshold", skipped_tokens=192, recompute_ns=90 * US, compute_ns=30 * US)
    b.request("queued", arrival_ns=80 * MS, input_tokens=2112, device=2048, queue_ns=910 * US, compute_ns=90 * US)
    b.request("chunky", arrival_ns=90 * MS, input_tokens=3000, compute_ns=2 * MS, ideal_ttft_ns=1 * MS,
              num_chunks=3)
    b.rejected("rej", arrival_ns=95 * MS, input_tokens=9000, reason="larger than the device pool")
    return b


@pytest.fixture
def planted(tmp_path) -> RunBuilder:
    b = plant_scenarios(RunBuilder(tmp_path / "planted.duckdb"))
    b.write()
    return b
