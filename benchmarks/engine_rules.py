"""Replay throughput of two checkouts side by side (issue 10: the SGLang rules must not cost
more than 10 % speed).

    .venv/bin/python benchmarks/engine_rules.py --before /path/to/old/checkout [--repeats 3]
        [--no-probes] [--lines N] [--json FILE]

Runs `tierdiag replay TRACE --json` on ../shared/traces/{conversation,synthetic}_trace.jsonl with
PYTHONPATH set to the `--before` checkout and to this one, interleaved (before, after, before,
after, ...) so both see the same machine, and prints medians of the in-process `wall_s` and
their ratio. Nothing is asserted: the table is the result.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / ".." / "shared" / "traces"
TRACE_FILES = {"conversation": "conversation_trace.jsonl", "synthetic": "synthetic_trace.jsonl"}
CLI = [sys.executable, "-c", "from tierdiag.cli.main import main; main()"]


def replay(checkout: Path, trace: Path, db: Path, probes: bool) -> tuple[float, int]:
    env = dict(os.environ, PYTHONPATH=str(checkout))
    args = CLI + ["replay", str(trace), "--db", str(db), "--json"] + ([] if probes else ["--no-probes"])
    proc = subprocess.run(args, capture_output=True, text=True, env=env, cwd=checkout, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"replay with {checkout} failed: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
    summary = json.loads(proc.stdout)
    return float(summary["wall_s"]), int(summary["num_requests"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="checkout to compare against (e.g. /work/main)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-probes", action="store_true", help="replay with --no-probes")
    ap.add_argument("--lines", type=int, default=None, help="replay only the first N lines of each trace")
    ap.add_argument("--json", type=Path, default=None, help="write every number here")
    args = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="tierdiag-rules-bench-") as tmp:
        for name, file in TRACE_FILES.items():
            trace = TRACES / file
            if not trace.is_file():
                print(f"{name}: {trace} is absent, skipped", file=sys.stderr)
                continue
            if args.lines:
                head = Path(tmp) / f"{name}.jsonl"
                with trace.open() as src, head.open("w") as dst:
                    for i, line in zip(range(args.lines), src):
                        dst.write(line)
                trace = head
            walls: dict[str, list[float]] = {"before": [], "after": []}
            n = 0
            for i in range(args.repeats):
                for side, checkout in (("before", args.before.resolve()), ("after", ROOT)):
                    wall, n = replay(checkout, trace, Path(tmp) / f"{name}-{side}-{i}.duckdb", not args.no_probes)
                    walls[side].append(wall)
                    print(f"{name} {side} #{i + 1}: {wall:.2f} s", file=sys.stderr, flush=True)
            med = {side: statistics.median(v) for side, v in walls.items()}
            results[name] = {"requests": n, "wall_s": walls, "median_s": med,
                             "requests_per_s": {s: n / m for s, m in med.items()}, "ratio": med["after"] / med["before"]}
    print(f"{'trace':<14}{'requests':>10}{'before s':>10}{'after s':>10}{'before req/s':>14}{'after req/s':>13}"
          f"{'after/before':>14}")
    for name, r in results.items():
        print(f"{name:<14}{r['requests']:>10,}{r['median_s']['before']:>10.2f}{r['median_s']['after']:>10.2f}"
              f"{r['requests_per_s']['before']:>14,.0f}{r['requests_per_s']['after']:>13,.0f}{r['ratio']:>14.3f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
