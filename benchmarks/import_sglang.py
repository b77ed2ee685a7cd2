"""Benchmark `tierdiag import sglang` on a generated SGLang metrics export (target >= 5,000 requests/s).

    .venv/bin/python benchmarks/import_sglang.py [--requests 100000] [--prompt-tokens 8192] [--repeats 3]

Generates an export in a temp folder (never committed; ~57 KB a line at 8k tokens, so ~5.7 GB
for 100k requests) the way SGLang writes it (json.dumps of the request inside json.dump of the
line, hourly files, finish order), then imports it in fresh processes and prints one table of
medians: requests/s and MB/s without and with --trace-out, and each run's peak RSS (bounded: it
must not grow with the prompt size). The folder is removed afterwards unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EPOCH = 1_764_579_600.0
TARGET_RPS = 5_000

_CHILD = """
import json, resource, sys, time
from pathlib import Path
from tierdiag.importers.load import import_sglang
folder, db, trace = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
t0 = time.perf_counter()
s = import_sglang([folder], db=db, trace_out=Path(trace) if trace else None)
wall = time.perf_counter() - t0
print(json.dumps({"wall_s": wall, "requests": s.num_requests, "trace_requests": s.trace_requests,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def generate(folder: Path, n: int, prompt_tokens: int, seed: int = 7) -> tuple[int, float]:
    """Write `n` requests into hourly files; (bytes written, seconds). Prompts are built from a
    pool of pre-encoded 512-token blocks (shared system prompts and sessions, as in real
    traffic), so writing is I/O-bound rather than JSON-encoding-bound."""
    rng = random.Random(seed)
    block = 512
    pool = [", ".join(str(rng.randrange(32_000)) for _ in range(block)) for _ in range(512)]
    per_file = max(n // 10, 1)
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    written = 0
    fh = None
    for i in range(n):
        if i % per_file == 0:
            if fh:
                fh.close()
            fh = open(folder / f"sglang-request-metrics-20251201_{i // per_file:02d}.log", "w", encoding="utf-8")
        blocks = prompt_tokens // block
        system = rng.randrange(16)  # 16 system prompts of 2 blocks, then the session's own blocks
        chosen = [pool[system * 2], pool[system * 2 + 1]] + [pool[rng.randrange(32, 512)] for _ in range(blocks - 2)]
        rid = f"{i:08x}{rng.getrandbits(64):016x}"
        params = ('{"input_ids": [' + ", ".join(chosen) + '], "sampling_params": {"max_new_tokens": 64, '
                  '"temperature": 0.0}, "rid": "' + rid + '", "return_logprob": false, "stream": false, '
                  '"log_metrics": true}')
        # Lines are in finish order (as SGLang writes them); arrivals are not: a request that
        # decodes longer arrived earlier, so --trace-out has to sort.
        e2e = 0.3 + rng.random() * 5.0
        finish = EPOCH + 10.0 + i * 0.05
        arrival = finish - e2e
        device = (2 + rng.randrange(blocks - 2)) * block if rng.random() < 0.7 else 0
        host = min(rng.randrange(4) * block, device - block) if device else 0
        details = "null" if not device else f'{{"device": {device - host}, "host": {host}}}'
        ttft = 0.05 + rng.random() * 0.2
        line = (f'{{"request_parameters": {json.dumps(params)}, "id": "{rid}", "finish_reason": {{"type": '
                f'"length", "length": 64}}, "prompt_tokens": {prompt_tokens}, "weight_version": "default", '
                f'"num_retractions": 0, "forward_entry_time": {arrival + 0.01}, "prefill_finished_time": '
                f'{arrival + ttft}, "queue_time": 0.009, "reasoning_tokens": 0, "completion_tokens": 64, '
                f'"cached_tokens": {device}, "cached_tokens_details": {details}, "e2e_latency": {e2e}, '
                f'"request_received_ts": {arrival}, "first_token_latency": {ttft}, '
                f'"request_finished_ts": {finish}, "response_sent_to_client_ts": {finish + 0.0001}}}\n')
        fh.write(line)
        written += len(line)
    if fh:
        fh.close()
    return written, time.perf_counter() - t0


def run_import(folder: Path, tmp: Path, trace: bool, k: int) -> dict:
    db = tmp / f"bench-{k}-{int(trace)}.duckdb"
    out = tmp / f"trace-{k}.jsonl" if trace else None
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(folder), str(db), str(out or "")],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    total = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"import failed: {proc.stderr.strip().splitlines()[-1:]}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["process_s"] = total
    db.unlink(missing_ok=True)
    if out is not None:
        res["trace_bytes"] = out.stat().st_size
        out.unlink(missing_ok=True)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--prompt-tokens", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=3, help="plain imports (the median is reported)")
    ap.add_argument("--trace-repeats", type=int, default=1, help="imports with --trace-out")
    ap.add_argument("--dir", type=Path, default=None, help="where to generate (default: a temp folder)")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="tierdiag-import-bench-", dir=args.dir))
    try:
        folder = tmp / "export"
        size, gen_s = generate(folder, args.requests, args.prompt_tokens)
        print(f"generated {args.requests:,} requests of {args.prompt_tokens:,} tokens: {size / 2**30:.2f} GiB "
              f"in {gen_s:.1f} s ({folder})", file=sys.stderr)
        results = {False: [], True: []}
        load_before = os.getloadavg()[0]
        # Plain imports first: a --trace-out run writes as much again as the export holds, which
        # pushes the export out of the page cache and would make the next run measure the disk.
        for trace, repeats in ((False, args.repeats), (True, args.trace_repeats)):
            for k in range(repeats):
                r = run_import(folder, tmp, trace, k)
                results[trace].append(r)
                print(f"  run {k + 1} {'with' if trace else 'without'} --trace-out: {r['wall_s']:.1f} s, "
                      f"peak RSS {r['peak_rss_mib']:.0f} MiB", file=sys.stderr)
        # Bounded memory: peak RSS of one hour's file (a tenth of the requests) beside the whole.
        first = sorted(folder.iterdir())[0]
        small = run_import(first, tmp, False, 99)
        mib = size / 2**20
        print(f"\nimport sglang: {args.requests:,} requests x {args.prompt_tokens:,} tokens, {mib:,.0f} MiB, "
              f"median of {args.repeats} (--trace-out: {args.trace_repeats}); cpus {os.cpu_count()}, "
              f"load {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
        print(f"{'mode':<22}{'wall s':>9}{'req/s':>10}{'MiB/s':>9}{'peak RSS MiB':>14}{'target':>12}{'ok':>5}")
        base = None
        for trace in (False, True):
            if not results[trace]:
                continue
            wall = statistics.median(r["wall_s"] for r in results[trace])
            rps = args.requests / wall
            rss = max(r["peak_rss_mib"] for r in results[trace])
            target = f">= {TARGET_RPS:,}" if not trace else "-"
            ok = ("yes" if rps >= TARGET_RPS else "NO") if not trace else ""
            print(f"{'import' if not trace else 'import + --trace-out':<22}{wall:>9.1f}{rps:>10,.0f}"
                  f"{mib / wall:>9,.0f}{rss:>14,.0f}{target:>12}{ok:>5}")
            base = base or wall
        print(f"peak RSS grows {max(r['peak_rss_mib'] for r in results[False]) - small['peak_rss_mib']:,.0f} MiB "
              f"from {small['requests']:,} requests ({small['peak_rss_mib']:,.0f} MiB) to {args.requests:,}; "
              f"prompts are never held")
        if not results[True]:
            return 0
        ratio = statistics.median(r["wall_s"] for r in results[True]) / base
        print(f"--trace-out costs {ratio:.2f}x the plain import (finds and checks every token id, spools "
              f"them, then copies them out in arrival order, since the export is in finish order: the "
              f"prompts are written twice)")
    finally:
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
