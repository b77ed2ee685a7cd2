"""The storage row's wall beyond its instructions (issue 41, session 39, h49swall): `Engine.run`
with and without the storage tier, each in a fresh process, interleaved (the order flipped every
round), split by where the time goes:

    .venv/bin/python benchmarks/storage_wall.py [--code DIR] [--rounds 5] [--storage-tokens 50000000]
                                                [--trace FILE]

Per run (the trace read first, not counted): the wall; the engine thread's own time by
/proc/self/task/TID/schedstat: on a CPU, waiting on a run queue (the machine's load), and the
rest, blocked (asleep: a page writer's fence or a full queue); of its CPU, user and sys
(`RUSAGE_THREAD`), and its minor faults; the other threads' CPU (the page writes' thread, the
index's populate thread: the process's `RUSAGE_SELF` less the engine thread's) and of it sys;
the page writer's stats; `/proc/self/io`'s write_bytes (dirtied_mb: the page cache's bytes the
run made dirty, to be written back) and cancelled_write_bytes (cancelled_mb: of them, those the
removal dropped before any writeback: dirtied - cancelled is what can reach the disk from the
run, counted to the folder's removal); then the tier's close and the folder's removal, apart. Prints each mode's medians (min .. max) and the ratios;
nothing is asserted. Run with PYTHONHASHSEED=0; OPENBLAS_NUM_THREADS=1 is set (an idle BLAS
thread spins otherwise, ~50 ms counted as another thread's CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = ROOT / ".." / "shared" / "traces" / "conversation_trace.jsonl"

_RUN = r"""
import gc, json, os, resource, shutil, sys, tempfile, threading, time
sys.path.insert(0, {code!r})
from tierdiag.config.engine import EngineConfig
from tierdiag.engine.engine import Engine
from tierdiag.trace.reader import ReadReport, read_trace
tokens = {tokens!r}
cfg = EngineConfig(storage_tokens=tokens) if tokens else EngineConfig()
reqs = list(read_trace({trace!r}, block_size=cfg.block_size, skip_bad=False, report=ReadReport()))
gc.set_threshold(50_000, 20, 100)
folder = tempfile.mkdtemp(prefix="storage-wall-")
tid = threading.get_native_id()

def sched():
    run, queued = open(f"/proc/self/task/{{tid}}/schedstat").read().split()[:2]
    return int(run) / 1e9, int(queued) / 1e9

def io():
    return dict((k, int(v)) for k, v in (line.split(": ") for line in open("/proc/self/io").read().splitlines()))

engine = Engine(cfg, probe=None, storage_dir=folder)
gc.collect()
self0, thr0, s0, io0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_THREAD), sched(), io()
w0 = time.perf_counter()
engine.run(reqs)
w1 = time.perf_counter()
self1, thr1, s1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_THREAD), sched()
tier = engine.storage
writer = tier._writer.stats() if tier is not None and tier._writer is not None else {{}}
if tier is not None:
    tier.close()
w2 = time.perf_counter()
rm0 = resource.getrusage(resource.RUSAGE_SELF)
shutil.rmtree(folder)
w3 = time.perf_counter()
rm1, io1 = resource.getrusage(resource.RUSAGE_SELF), io()
d = lambda a, b, f: getattr(b, f) - getattr(a, f)
thr_cpu = d(thr0, thr1, "ru_utime") + d(thr0, thr1, "ru_stime")
print(json.dumps({{
    "wall_s": w1 - w0, "on_cpu_s": s1[0] - s0[0], "run_queue_s": s1[1] - s0[1],
    "blocked_s": (w1 - w0) - (s1[0] - s0[0]) - (s1[1] - s0[1]),
    "user_s": d(thr0, thr1, "ru_utime"), "sys_s": d(thr0, thr1, "ru_stime"), "faults": d(thr0, thr1, "ru_minflt"),
    "others_cpu_s": d(self0, self1, "ru_utime") + d(self0, self1, "ru_stime") - thr_cpu,
    "others_sys_s": d(self0, self1, "ru_stime") - d(thr0, thr1, "ru_stime"),
    "writer_waits": writer.get("waits", 0), "written_mb": writer.get("bytes", 0) / 1e6,
    "dirtied_mb": (io1["write_bytes"] - io0["write_bytes"]) / 1e6,
    "cancelled_mb": (io1["cancelled_write_bytes"] - io0["cancelled_write_bytes"]) / 1e6,
    "close_s": w2 - w1, "remove_s": w3 - w2, "remove_sys_s": d(rm0, rm1, "ru_stime")}}))
"""


def run_once(code: Path, trace: Path, tokens: int) -> dict[str, float]:
    env = {"PYTHONPATH": str(code), "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "OPENBLAS_NUM_THREADS": "1",
           "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", "0")}
    proc = subprocess.run([sys.executable, "-c", _RUN.format(code=str(code), trace=str(trace), tokens=tokens)],
                          capture_output=True, text=True, cwd=code, env=env)
    if proc.returncode:
        raise SystemExit(f"{code}: the run failed: {proc.stderr.strip().splitlines()[-3:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", type=Path, default=ROOT, help="the checkout to run (built in place)")
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--storage-tokens", type=int, default=50_000_000)
    args = ap.parse_args(argv)
    if args.rounds < 1:
        raise SystemExit(f"--rounds must be >= 1, got {args.rounds}")
    if args.storage_tokens < 1:
        raise SystemExit(f"--storage-tokens must be >= 1, got {args.storage_tokens}")
    modes = {"none": 0, "storage": args.storage_tokens}
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    for r in range(args.rounds):
        for mode in (list(modes) if r % 2 == 0 else list(reversed(modes))):
            out = run_once(args.code.resolve(), args.trace, modes[mode])
            runs[mode].append(out)
            print(f"round {r + 1} {mode}: " + ", ".join(f"{k} {v:.3f}" for k, v in out.items()), flush=True)
    print(f"load average now: {os.getloadavg()}")
    for key in runs["none"][0]:
        cells = []
        for mode in modes:
            xs = [x[key] for x in runs[mode]]
            cells.append(f"{mode} {statistics.median(xs):.3f} ({min(xs):.3f} .. {max(xs):.3f})")
        a, b = (statistics.median(x[key] for x in runs[m]) for m in modes)
        ratio = f"; storage / none {b / a:.3f}x" if a > 0 else ""
        print(f"{key}: " + ", ".join(cells) + ratio)


if __name__ == "__main__":
    main()
