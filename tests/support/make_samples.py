"""Regenerate the shipped samples under tierdiag/trace/samples/ (not run by the tests: the files are
committed; run `python -m tests.support.make_samples` from the repository root after changing this).

- `sglang/sglang-request-metrics-20251201_09.log.gz`: an SGLang 0.5.23 request-metrics export
  (`--export-metrics-to-file --enable-metrics`), written by tests/importers/sglang_export.py's
  writer (RequestMetricsExporter._format_output_data's shape) from a real replay of
  tests/calibrate/server.py's workload on two data-parallel ranks (llama3-8b on an A100: a clock
  the presets do not have, so `calibrate --from` has something to fit), each request's prefill and
  decode times scattered by a few per cent (a server is never exactly a roofline), every line with
  its `dp_rank`.
- `kv-cache-tester/*.json`: two agentic-coding conversations in kv-cache-tester's format, one with
  sub-agents spawned at several times; a sub-agent's `t` is seconds from its spawn marker's `t`
  (the tester starts a sub-agent's clock when its parent reaches the marker). Contexts grow past
  131,072 tokens, so Llama-3.1 presets reject the last turns and a 262,144-token model serves them.
- `bailian.jsonl`: Qwen Bailian usage-trace lines (16-token hash-id blocks, parent_chat_id chains,
  a fork and an orphan).
"""

from __future__ import annotations

import gzip
import json
import random
import tempfile
from pathlib import Path

from tests.calibrate import server
from tests.importers.sglang_export import EPOCH, record

SAMPLES = Path(__file__).resolve().parents[2] / "tierdiag" / "trace" / "samples"
HOUR = "20251201_09"
# The server's pools (not in the export: what `replay` of the twin is told in the README), per rank;
# documents a third of tests/calibrate/server.py's, and so the pools, to keep the sample small.
DOC_TOKENS = (2048, 2688, 3456, 4096)
POOLS = {"device_tokens": 9600, "host_tokens": 65536, "page_size": 64}


def sglang_export(out: Path) -> Path:
    from tierdiag.app.replay import replay
    from tierdiag.config.engine import EngineConfig
    from tierdiag.store.reader import open_store
    from tests.support.traces import write_trace

    server.DOC_TOKENS = DOC_TOKENS  # workload() reads it when called
    lines = server.workload(seed=11, docs=4, unique=18, revisits=22, gap_s=6.0)
    tokens = {x["id"]: x["tokens"] for x in lines}
    rng = random.Random(5)
    with tempfile.TemporaryDirectory() as tmp:
        trace = write_trace(Path(tmp) / "server.jsonl", lines)
        cfg = EngineConfig(model="llama3-8b", gpu="a100", verify="off", dp=2, router="round_robin", **POOLS)
        db = Path(tmp) / "server.duckdb"
        s = replay(trace, cfg, db=db, run_name="server", probes=True, skip_bad=False)
        with open_store(db) as con:
            rows = con.execute(
                "SELECT req_id, arrival_ns, ttft_ns, prefill_ns, finish_ns, output_tokens, device_hit_tokens, "
                "host_hit_tokens, storage_hit_tokens, dp_rank FROM requests WHERE run_id = ? AND status = 'finished' "
                "ORDER BY finish_ns", [s.run_id]).fetchall()
    records = []
    for rid, arrival, ttft, prefill, finish, output, device, host, storage, rank in rows:
        queue = ttft - prefill
        decode = finish - arrival - ttft
        prefill *= rng.lognormvariate(0, 0.03)
        decode *= rng.lognormvariate(0, 0.03)
        ttft_s = (queue + prefill) / 1e9
        r = record(rid, prompt=len(tokens[rid]), completion=output, device=device, host=host,
                   storage=storage or None, arrival_s=arrival / 1e9, queue_s=queue / 1e9, ttft_s=ttft_s,
                   e2e_s=ttft_s + decode / 1e9, tokens=tokens[rid], dp_rank=rank)
        r["forward_entry_time"] = EPOCH + arrival / 1e9 + queue / 1e9
        records.append(r)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"sglang-request-metrics-{HOUR}.log.gz"
    text = "".join(json.dumps(r) + "\n" for r in records)
    with gzip.GzipFile(path, "wb", mtime=0) as fh:  # mtime 0: the same bytes on every run
        fh.write(text.encode())
    return path


class _Ids:
    """kv-cache-tester's `local` hash ids: numbered per file, one per full block of a context that
    grows by appending (so a turn's ids start with its predecessor's)."""

    def __init__(self):
        self.next = 1

    def grow(self, ids: list[int], blocks: int) -> list[int]:
        while len(ids) < blocks:
            ids.append(self.next)
            self.next += 1
        return ids


def _turns(rng: random.Random, ids: _Ids, *, start_in: int, turns: int, grow: tuple[int, int], t0: float,
           block: int) -> list[dict]:
    reqs, ctx, chain, t = [], start_in, [], t0
    for k in range(turns):
        out = rng.randint(40, 600)
        think = 0.0 if k == 0 else round(rng.uniform(0.5, 20.0), 2)
        api = round(1.0 + out / 60, 2)
        t = round(t + (0 if k == 0 else reqs[-1]["api_time"] + think), 2)
        reqs.append({"t": t, "type": "s", "in": ctx, "out": out,
                     "hash_ids": list(ids.grow(chain, ctx // block)[: ctx // block]),
                     "model": "claude-sonnet", "api_time": api, "think_time": think,
                     "stop": "tool_use" if k < turns - 1 else "end_turn"})
        ctx += out + rng.randint(*grow)
    return reqs


def kv_cache_tester(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(3)
    paths = []
    block = 64
    # A long coding session: 22 turns from 18k tokens past 131,072, three sub-agents.
    ids = _Ids()
    main = _turns(rng, ids, start_in=18_000, turns=22, grow=(4_000, 12_000), t0=0.0, block=block)
    for after, turns in ((3, 4), (9, 3), (15, 5)):  # spawned once the parent's turn `after` has answered
        marker_t = round(main[after]["t"] + main[after]["api_time"] + 0.5, 2)
        sub = _turns(rng, ids, start_in=rng.randint(9_000, 14_000), turns=turns, grow=(800, 3_000), t0=0.0, block=block)
        main.append({"t": marker_t, "type": "subagent", "requests": sub})
    main.sort(key=lambda r: r["t"])
    doc = {"id": "coding-a", "block_size": block, "hash_id_scope": "local", "requests": main}
    paths.append(out / "coding-a.json")
    paths[-1].write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    # A short one, no sub-agents.
    ids = _Ids()
    doc = {"id": "coding-b", "block_size": block, "hash_id_scope": "local",
           "requests": _turns(rng, ids, start_in=12_000, turns=8, grow=(1_000, 4_000), t0=0.0, block=block)}
    paths.append(out / "coding-b.json")
    paths[-1].write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    return paths


def bailian(path: Path) -> Path:
    rng = random.Random(9)
    block = 16
    next_id = [1]

    def grow(chain: list[int], n: int) -> list[int]:
        while len(chain) < n:
            chain.append(next_id[0])
            next_id[0] += 1
        return chain[:n]

    system = grow([], 60)  # a shared 960-token system prompt
    lines, chat = [], 100
    for s in range(8):
        t = round(s * 7.5 + rng.uniform(0, 3), 3)
        chain = list(system)
        parent = -1
        for turn in range(1, rng.randint(2, 6) + 1):
            n_in = len(chain) * block + rng.randint(100, 900)
            ids = grow(chain, n_in // block)
            out = rng.randint(30, 400)
            lines.append({"chat_id": chat, "parent_chat_id": parent, "timestamp": t, "input_length": n_in,
                          "output_length": out, "type": "text", "turn": turn, "hash_ids": ids})
            chain = list(ids)
            parent = chat
            chat += 1
            t = round(t + out * 0.025 + rng.uniform(2, 30), 3)
    # a fork (a regenerated answer: a second child of chat 100) and an orphan (parent not in the file)
    first = lines[0]
    lines.append({**first, "chat_id": chat, "parent_chat_id": first["chat_id"], "timestamp": round(first["timestamp"] + 40, 3),
                  "turn": 2, "input_length": first["input_length"] + 300,
                  "hash_ids": grow(list(first["hash_ids"]), (first["input_length"] + 300) // block)})
    lines.append({**first, "chat_id": chat + 1, "parent_chat_id": 99999, "timestamp": 75.0, "turn": 3})
    lines.sort(key=lambda x: x["timestamp"])
    path.write_text("".join(json.dumps(x, separators=(",", ":")) + "\n" for x in lines))
    return path


if __name__ == "__main__":
    print(sglang_export(SAMPLES / "sglang"))
    print(*kv_cache_tester(SAMPLES / "kv-cache-tester"), sep="\n")
    print(bailian(SAMPLES / "bailian.jsonl"))
