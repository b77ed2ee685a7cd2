"""How much of the engine's probe overhead is the writer process competing with it (issue 41's
probe-overhead row, h41rec6's item 3): the CPU seconds of `Engine.run` (and its last hand-over),
benchmarks/recording.py's fresh process a run, pinned to CPU 0 (core.pin, BENCH_PIN), the
hand-over's child pinned as each layout says; the layouts interleaved a round, medians.

    .venv/bin/python benchmarks/writer_contention.py [--trace FILE] [--requests N] [--rounds 3]
                                                     [--layouts none,pipe,writer-other,writer-same]

Layouts (benchmarks/core.py's modes):
  none          no probe
  pipe          the recorder handing over into a pipe a `cat` drains (on CPU 1): the engine's
                own cost of the probes and of the hand-over, no writer
  writer-other  the replay's real writer process on CPU 1 (the quiet machine's layout: each
                process a vCPU): what it costs the engine beyond `pipe` is the writer sharing
                the machine (caches, memory bandwidth, the host's sibling threads)
  writer-same   the writer on CPU 0 beside the engine: the two take turns on one vCPU (the
                engine's CPU seconds exclude the writer's; what is left is the switching)
A loaded machine's other processes move every column: say the load average beside the numbers.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT_TRACE = ROOT / ".." / "shared" / "traces" / "conversation_trace.jsonl"
LAYOUTS = {"none": ("none", "0:"), "pipe": ("pipe", "0:1"), "writer-other": ("writer", "0:1"),
           "writer-same": ("writer", "0:0")}


def main(argv: list[str] | None = None) -> None:
    from benchmarks.recording import run_mode

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
            mode, spec = LAYOUTS[layout]
            out = run_mode(ROOT, mode, args.trace.resolve(), args.requests, {}, {"BENCH_PIN": spec})
            cpu[layout].append(out["cpu"])
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
