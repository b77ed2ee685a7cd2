"""How much of the engine's probe overhead is the writer process competing with it (issue 41's
probe-overhead row, item 3 of h41rec6): the CPU seconds of `Engine.run` (and its last
hand-over) in a fresh process pinned to CPU 0, the writer's child process pinned by `taskset`'s
call (`os.sched_setaffinity`) as each layout says, the layouts interleaved a round, medians.

    .venv/bin/python benchmarks/writer_contention.py [--trace FILE] [--requests N] [--rounds 3]

Layouts (benchmarks/core.py's modes):
  none          no probe
  pipe          the recorder handing over into a pipe a `cat` drains (pinned to CPU 1): the
                engine's own cost of the probes and of the hand-over, no writer
  writer-other  the replay's real writer process on CPU 1 (the quiet machine's layout: each
                process a vCPU): what it costs the engine beyond `pipe` is the writer sharing
                the machine (caches, memory bandwidth, the host's sibling threads)
  writer-same   the writer on CPU 0 beside the engine: the two take turns on one vCPU (the
                engine's CPU seconds exclude the writer's; what is left is the switching)
On this VM the two vCPUs are what the engine and its writer share on a quiet machine; a loaded
machine's other processes move every column (say the load average beside the numbers).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT_TRACE = ROOT / ".." / "shared" / "traces" / "conversation_trace.jsonl"
LAYOUTS = {"none": ("none", None), "pipe": ("pipe", 1), "writer-other": ("writer", 1), "writer-same": ("writer", 0)}

_DRIVER = """
import gc, os, sys, json, time, tempfile
os.sched_setaffinity(0, {{0}})
sys.path.insert(0, {root!r})
from benchmarks.core import make_probe
from tierdiag.config.engine import EngineConfig
from tierdiag.trace.reader import ReadReport, read_trace
from tierdiag.engine.engine import Engine
from tierdiag.engine import compiled
cfg = EngineConfig()
reqs = list(read_trace({trace!r}, block_size=cfg.block_size, skip_bad=False, report=ReadReport()))
reqs = reqs[:{requests!r}] if {requests!r} else reqs
gc.set_threshold(50_000, 20, 100)
probe = make_probe({mode!r})
child_cpu = {child_cpu!r}
children = []
for task in os.listdir("/proc/self/task"):
    with open(f"/proc/self/task/{{task}}/children") as f:
        children += [int(p) for p in f.read().split()]
if child_cpu is not None:
    for pid in children:
        os.sched_setaffinity(pid, {{child_cpu}})
with tempfile.TemporaryDirectory() as storage:
    engine = Engine(cfg, probe=probe, storage_dir=storage)
    c0, w0 = time.process_time(), time.perf_counter()
    engine.run(reqs)
    if probe is not None:
        probe.flush()
    c1, w1 = time.process_time(), time.perf_counter()
print(json.dumps({{"cpu": c1 - c0, "wall": w1 - w0, "children": len(children), "core": compiled.describe()["mode"]}}))
"""


def run_layout(layout: str, trace: Path, requests: int | None) -> dict:
    mode, child_cpu = LAYOUTS[layout]
    driver = _DRIVER.format(root=str(ROOT), trace=str(trace), requests=requests, mode=mode, child_cpu=child_cpu)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", driver], cwd=ROOT, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise SystemExit(f"{layout}: {proc.stderr.strip().splitlines()[-3:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if out["core"] != "compiled":
        raise SystemExit(f"the engine core is not compiled ({out['core']}): build it in place first")
    if child_cpu is not None and not out["children"]:
        raise SystemExit(f"{layout}: no child process to pin")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    args = ap.parse_args(argv)
    layouts = [x for x in args.layouts.split(",") if x]
    if args.rounds < 1 or (args.requests is not None and args.requests < 1) or not layouts \
            or any(x not in LAYOUTS for x in layouts):
        raise SystemExit(f"--rounds, --requests positive; --layouts of {', '.join(LAYOUTS)}")
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("needs two CPUs to pin the engine and its writer apart")
    cpu: dict[str, list[float]] = {x: [] for x in layouts}
    loads = []
    for r in range(args.rounds):
        for layout in (layouts if r % 2 == 0 else layouts[::-1]):
            cpu[layout].append(run_layout(layout, args.trace.resolve(), args.requests)["cpu"])
            loads.append(os.getloadavg()[0])
    med = {x: sorted(v)[len(v) // 2] for x, v in cpu.items()}
    base = med.get("none")
    print(f"{args.trace.name}{f'[:{args.requests}]' if args.requests else ''}, {args.rounds} interleaved rounds, "
          f"CPU seconds of Engine.run (+ the last hand-over) pinned to CPU 0, medians; "
          f"load average {min(loads):.1f}-{max(loads):.1f}")
    print("| layout | CPU (rounds) | / none |")
    print("|---|---|---|")
    for x in layouts:
        ratio = f"{med[x] / base:.3f}x" if base else "n/a"
        print(f"| {x} | {med[x]:.3f} s ({' / '.join(f'{v:.2f}' for v in cpu[x])}) | {ratio} |")


if __name__ == "__main__":
    main()
