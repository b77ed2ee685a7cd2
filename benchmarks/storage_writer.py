"""The storage tier's page writes on the writer's thread (issue 41, session 25, h41stor12): two
checkouts, before and after, side by side on the storage row's replay, interleaved round by
round with the order flipped every round.

    .venv/bin/python benchmarks/storage_writer.py BASE_CHECKOUT [--trace FILE] [--rounds 5]
        [--storage-tokens 50000000] [--modes replay,engine]

replay: the row's whole process (`tierdiag replay TRACE --db D --storage-tokens N --json`,
probes on, as benchmarks/targets41.py runs it): its wall, and the CPU (user + sys) of the
process tree (the engine process, its page-write thread and the recording's writer process).
engine: `Engine.run` alone in a fresh process (no probe; the trace read first, not counted): its
wall, the engine thread's own CPU (`time.thread_time`: the run's critical path), of it the
kernel's, its minor page faults, and the process's CPU (every thread: the page writes' thread's
included).

BASE_CHECKOUT is a checkout with its extensions built in place (setup.py build_ext --inplace),
or `off`: this checkout with the writer's thread turned off (`storage._PageWriter = None`: the
pages written in the engine's thread, the reference), the same binary on both sides. The other
side is this checkout. Prints each side's medians and the ratios; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = ROOT / ".." / "shared" / "traces" / "conversation_trace.jsonl"

_ENGINE = """
import gc, json, resource, sys, tempfile, time
sys.path.insert(0, {code!r})
if {off!r}:
    from tierdiag.engine import storage as _storage
    _storage._PageWriter = None
from tierdiag.config.engine import EngineConfig
from tierdiag.engine.engine import Engine
from tierdiag.trace.reader import ReadReport, read_trace
cfg = EngineConfig(storage_tokens={tokens!r})
reqs = list(read_trace({trace!r}, block_size=cfg.block_size, skip_bad=False, report=ReadReport()))
gc.set_threshold(50_000, 20, 100)
with tempfile.TemporaryDirectory() as storage:
    engine = Engine(cfg, probe=None, storage_dir=storage)
    gc.collect()
    r0 = resource.getrusage(resource.RUSAGE_THREAD)
    w0, t0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
    engine.run(reqs)
    w1, t1, p1 = time.perf_counter(), time.thread_time(), time.process_time()
    r1 = resource.getrusage(resource.RUSAGE_THREAD)
    engine.storage.close()
print(json.dumps({{"wall_s": w1 - w0, "thread_cpu_s": t1 - t0, "thread_sys_s": r1.ru_stime - r0.ru_stime,
                  "cpu_s": p1 - p0, "thread_minflt": r1.ru_minflt - r0.ru_minflt}}))
"""


def _env(code: Path) -> dict[str, str]:
    return {"PYTHONPATH": str(code), "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "OPENBLAS_NUM_THREADS": "1"}


_OFF_CLI = ("from tierdiag.engine import storage; storage._PageWriter = None\n"
            "import sys; sys.argv[0] = 'tierdiag'\nfrom tierdiag.cli.main import entry; entry()")


def engine_once(code: Path, trace: Path, tokens: int, off: bool = False) -> dict[str, float]:
    proc = subprocess.run([sys.executable, "-c", _ENGINE.format(code=str(code), trace=str(trace), tokens=tokens,
                                                                off=off)],
                          capture_output=True, text=True, cwd=code, env=_env(code))
    if proc.returncode:
        raise SystemExit(f"{code}: the run failed: {proc.stderr.strip().splitlines()[-3:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def replay_once(code: Path, trace: Path, tokens: int, tmp: Path, off: bool = False) -> dict[str, float]:
    db = tmp / "r.duckdb"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    head = ["-c", _OFF_CLI] if off else ["-m", "tierdiag"]
    proc = subprocess.run([sys.executable, *head, "replay", str(trace), "--db", str(db),
                           "--storage-tokens", str(tokens), "--json"],
                          capture_output=True, text=True, cwd=code, env=_env(code))
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"{code}: the replay failed: {proc.stderr.strip().splitlines()[-3:]}")
    for p in tmp.iterdir():
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink()
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "sys_s": after.ru_stime - before.ru_stime}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", help="the checkout to compare with (built in place), or off (this one, no thread)")
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--storage-tokens", type=int, default=50_000_000)
    ap.add_argument("--modes", default="replay,engine", help="replay, engine or both (comma-separated)")
    args = ap.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in ("replay", "engine") for m in modes):
        raise SystemExit(f"--modes: replay and/or engine, got {args.modes!r}")
    if args.rounds < 1:
        raise SystemExit(f"--rounds must be >= 1, got {args.rounds}")
    off = args.base == "off"
    sides = {"before": ROOT if off else Path(args.base).resolve(), "after": ROOT}
    runs: dict[tuple[str, str], list[dict[str, float]]] = {(m, s): [] for m in modes for s in sides}
    with tempfile.TemporaryDirectory(prefix="storage-writer-") as tmp:
        for r in range(args.rounds):
            order = ("before", "after") if r % 2 == 0 else ("after", "before")
            for mode in modes:
                for side in order:
                    off_now = off and side == "before"
                    if mode == "engine":
                        out = engine_once(sides[side], args.trace, args.storage_tokens, off_now)
                    else:
                        out = replay_once(sides[side], args.trace, args.storage_tokens, Path(tmp), off_now)
                    runs[(mode, side)].append(out)
                    print(f"round {r + 1} {mode} {side}: " + ", ".join(f"{k} {v:.3f}" for k, v in out.items()),
                          flush=True)
    print(f"load average now: {os.getloadavg()}")
    for mode in modes:
        keys = list(runs[(mode, "before")][0])
        for key in keys:
            b = statistics.median(x[key] for x in runs[(mode, "before")])
            a = statistics.median(x[key] for x in runs[(mode, "after")])
            faster = sum(x[key] < y[key] for x, y in zip(runs[(mode, "after")], runs[(mode, "before")]))
            print(f"{mode} {key}: before {b:.3f}, after {a:.3f} (medians of {args.rounds}); "
                  f"before / after {b / a:.3f}x; after lower in {faster} of {args.rounds}")


if __name__ == "__main__":
    main()
