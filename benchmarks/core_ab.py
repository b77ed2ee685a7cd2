"""`Engine.run` of two checkouts, before and after, side by side (issue 41): each run in a fresh
process (the trace read first and not counted), `time.process_time()` around `Engine.run` alone
(no probe, gc thresholds as a replay sets them), the two checkouts interleaved round by round
with the order flipped every round, so a slow phase of this shared machine falls on both.

    .venv/bin/python benchmarks/core_ab.py BASE_CHECKOUT [--trace FILE] [--requests N] [--rounds 12]
        [--storage-tokens N]

BASE_CHECKOUT is a checkout with its extensions built in place (setup.py build_ext --inplace);
the other side is this checkout. Prints each side's median and minimum CPU seconds, the ratio of
the medians, and in how many rounds this checkout was the faster. Instructions (deterministic,
where this machine's load makes seconds noise): benchmarks/core.py --instructions --code BASE.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = ROOT / ".." / "shared" / "traces" / "conversation_trace.jsonl"

_DRIVER = """
import gc, json, sys, tempfile, time
sys.path.insert(0, {code!r})
from tierdiag.config.engine import EngineConfig
from tierdiag.engine import compiled
from tierdiag.engine.engine import Engine
from tierdiag.trace.reader import ReadReport, read_trace
cfg = EngineConfig(**{overrides!r})
reqs = list(read_trace({trace!r}, block_size=cfg.block_size, skip_bad=False, report=ReadReport()))
reqs = reqs[:{requests!r}] if {requests!r} else reqs
gc.set_threshold(50_000, 20, 100)
with tempfile.TemporaryDirectory() as storage:
    engine = Engine(cfg, probe=None, storage_dir=storage)
    gc.collect()
    t0 = time.process_time()
    engine.run(reqs)
    cpu = time.process_time() - t0
print(json.dumps({{"cpu": cpu, "core": compiled.describe()["mode"]}}))
"""


def run_once(code: Path, trace: Path, requests: int | None, overrides: dict | None = None) -> tuple[float, str]:
    driver = _DRIVER.format(code=str(code), trace=str(trace), requests=requests, overrides=overrides or {})
    proc = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, cwd=code,
                          env={"PYTHONPATH": str(code), "PATH": "/usr/bin:/bin", "OPENBLAS_NUM_THREADS": "1"})
    if proc.returncode:
        raise SystemExit(f"{code}: the run failed: {proc.stderr.strip().splitlines()[-3:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return out["cpu"], str(out["core"])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", type=Path, help="the checkout to compare with (built in place)")
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--requests", type=int, default=None, help="the first N requests (default: all)")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--storage-tokens", type=int, default=None,
                    help="the storage tier's tokens (EngineConfig checks it; default: none)")
    args = ap.parse_args(argv)
    sides = {"before": args.base.resolve(), "after": ROOT}
    cpu: dict[str, list[float]] = {"before": [], "after": []}
    overrides = {} if args.storage_tokens is None else {"storage_tokens": args.storage_tokens}
    cores = {}
    for r in range(args.rounds):
        order = ("before", "after") if r % 2 == 0 else ("after", "before")
        for side in order:
            seconds, cores[side] = run_once(sides[side], args.trace, args.requests, overrides)
            cpu[side].append(seconds)
        print(f"round {r + 1}: before {cpu['before'][-1]:.3f} s, after {cpu['after'][-1]:.3f} s", flush=True)
    for side in ("before", "after"):
        print(f"{side}: {sides[side]}: median {statistics.median(cpu[side]):.3f} s, min {min(cpu[side]):.3f} s "
              f"({cores[side]})")
    faster = sum(a < b for a, b in zip(cpu["after"], cpu["before"]))
    print(f"before / after, medians: {statistics.median(cpu['before']) / statistics.median(cpu['after']):.3f}x; "
          f"after faster in {faster} of {args.rounds} rounds")


if __name__ == "__main__":
    main()
