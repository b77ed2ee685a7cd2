"""A "server" whose clock is known: the engine itself under other constants than the presets,
its requests written as SGLang 0.5.23 exports (tests/importers/sglang_export.py's writer).

The workload (small: a few dozen requests, seconds to replay) is built so that every part of
the clock shows in some requests' times:
- unique prompts of 128..2048 tokens (misses): the linear and attention terms, the overhead;
- re-visits of long documents with a short new part: device hits attend to a long prefix
  (attention term), and a 64-token new part runs at the floor (the weights read once);
- documents pushed out of a small device pool come back from host: 8k-token load-backs behind a
  64-token prefill, long enough to show (the load-back shows only when it outlasts compute);
- decode runs on the engine's clock as SGLang's does (output - 1 steps, interleaved with prefill
  batches): requests far apart decode alone, their prompts of 128..12k tokens giving the
  per-context decode term; some arrivals close together, so some requests decode beside others
  (left out of the decode fit) and some queue, behind a prefill or a decode step (left out of
  the prefill fit, as they must be).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from tests.importers.sglang_export import EPOCH, record, write_export
from tierdiag.config.engine import EngineConfig
from tests.support.traces import write_trace  # noqa: F401 - the one trace writer (tests import it from here too)

PAGE = 64
DOC_TOKENS = (6144, 8192, 10240, 12288)  # documents' lengths, in turn
# The pools of server and twin alike: two or three documents fit on device, all of them on host.
POOLS = {"device_tokens": 28672, "host_tokens": 16 * 12288, "page_size": PAGE}


def workload(seed: int = 7, *, docs: int = 6, unique: int = 24, revisits: int = 30,
             gap_s: float = 12.0) -> list[dict]:
    """Trace lines (ours, with tokens) in arrival order."""
    rng = random.Random(seed)
    doc_tokens = [[100_000 * (d + 1) + i for i in range(DOC_TOKENS[d % len(DOC_TOKENS)])] for d in range(docs)]
    reqs: list[tuple[str, list[int], int]] = []
    salt = 0

    def fresh(n: int) -> list[int]:
        nonlocal salt
        salt += 1
        return [10_000_000 + salt * 10_000 + i for i in range(n)]

    for d in range(docs):  # first visits: misses of 8k+ tokens
        reqs.append((f"doc{d}-0", doc_tokens[d] + fresh(64), rng.randint(4, 12)))
    kinds = ["unique"] * unique + ["revisit"] * revisits
    rng.shuffle(kinds)
    for i, kind in enumerate(kinds):
        if kind == "unique":
            reqs.append((f"u{i}", fresh(rng.choice([128, 256, 512, 1024, 1536, 2048]) + rng.randint(0, 63)),
                         rng.randint(2, 16)))
        else:
            d = rng.randrange(docs)
            reqs.append((f"doc{d}-r{i}", doc_tokens[d] + fresh(rng.choice([64, 64, 128, 512, 1024])),
                         rng.randint(2, 16)))
    lines, t_ms = [], 0
    for i, (rid, toks, out) in enumerate(reqs):
        lines.append({"timestamp": t_ms, "id": rid, "input_length": len(toks), "output_length": out, "tokens": toks})
        # mostly far apart (no queueing); every 7th pair close together (decode overlaps, queues)
        t_ms += 300 if i % 7 == 3 else int(gap_s * 1000) + rng.randint(0, 999)
    return lines


def run_server(tmp: Path, lines: list[dict], *, model: str = "llama3-70b", gpu: str = "a100",
               profile: str | None = None) -> tuple[Path, str]:
    """Replay `lines` as the server would have run them; (db, run id)."""
    from tierdiag.app.replay import replay

    trace = write_trace(tmp / "server-trace.jsonl", lines)
    cfg = EngineConfig(model=model, gpu=gpu, profile=profile, verify="off", **POOLS)
    db = tmp / "server.duckdb"
    s = replay(trace, cfg, db=db, run_name="server", probes=True, skip_bad=False)
    return db, s.run_id


def export_server(db: Path, run_id: str, out: Path, lines: list[dict], *, noise: float = 0.0, seed: int = 1,
                  queue_all: bool = False) -> Path:
    """Write the server run's requests as SGLang's export (timings from the rows; `noise`: relative
    scatter, as a log-normal factor on each request's prefill and decode times)."""
    from tierdiag.store.reader import open_store

    tokens = {x["id"]: x["tokens"] for x in lines}
    rng = random.Random(seed)
    with open_store(db) as con:
        rows = con.execute(
            "SELECT req_id, arrival_ns, ttft_ns, prefill_ns, finish_ns, output_tokens, device_hit_tokens, "
            "host_hit_tokens, storage_hit_tokens FROM requests WHERE run_id = ? AND status = 'finished' "
            "ORDER BY finish_ns", [run_id]).fetchall()
    records = []
    for rid, arrival, ttft, prefill, finish, output, device, host, storage in rows:
        queue = ttft - prefill
        decode = finish - arrival - ttft
        if noise:
            prefill = prefill * rng.lognormvariate(0, noise)
            decode = decode * rng.lognormvariate(0, noise)
        if queue_all:
            queue += 50_000_000
        ttft_s = (queue + prefill) / 1e9
        r = record(rid, prompt=len(tokens[rid]), completion=output, device=device, host=host,
                   storage=storage or None, arrival_s=arrival / 1e9, queue_s=queue / 1e9, ttft_s=ttft_s,
                   e2e_s=ttft_s + decode / 1e9, tokens=tokens[rid])
        r["forward_entry_time"] = EPOCH + arrival / 1e9 + queue / 1e9  # SGLang: when its first batch ran
        records.append(r)
    write_export(out, "20251201_09", records)
    return out
