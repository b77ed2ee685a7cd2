"""Sweep parallel efficiency: an 8-combination `tierdiag sweep --jobs N` against the same 8
configurations replayed one by one with `tierdiag replay` (each a fresh process, as a user would).

    .venv/bin/python benchmarks/sweep.py [--jobs 2] [--repeats 1] [--lines N] [--trace PATH]

Target (issue 11): sweep wall <= 0.6 x the sum of the single replays on a 2-core machine.
Prints one table: per round the sweep's wall, the singles' sum, the ratio; medians at the end;
the load average before and after, since a shared machine moves these numbers.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TRACE = ROOT / ".." / "shared" / "traces" / "conversation_trace.jsonl"
TIERDIAG = [sys.executable, "-c", "from tierdiag.cli.main import main; main()"]
SETS = (("host_tokens", ("2M", "8M")), ("write_policy", ("write_through", "write_back")),
        ("load_back_threshold", ("10", "256")))
TARGET_RATIO = 0.6


CPU_S = [0.0]  # CPU seconds (user + sys) of every tierdiag process run so far, workers included


def _cpu_of_children() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _run(args: list[str]) -> float:
    t0, c0 = time.perf_counter(), _cpu_of_children()
    proc = subprocess.run(TIERDIAG + args, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark failed: tierdiag {' '.join(args[:2])}: {proc.stderr.strip()[-500:]}")
    CPU_S[0] += _cpu_of_children() - c0  # a sweep's workers are its children, waited for: counted
    return time.perf_counter() - t0


def _singles(trace: Path, db: Path) -> float:
    from itertools import product

    total = 0.0
    for values in product(*(v for _, v in SETS)):
        opts = []
        for (key, _), value in zip(SETS, values):
            opts += [f"--{key.replace('_', '-')}", str(_tokens(value))]
        total += _run(["replay", str(trace), "--db", str(db), *opts])
    return total


def _tokens(value: str) -> int | str:
    from tierdiag.config.sweep_spec import parse_size

    try:
        return parse_size(value)
    except ValueError:
        return value


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--lines", type=int, default=None, help="only the first N lines of the trace (quick)")
    ap.add_argument("--trace", type=Path, default=TRACE)
    args = ap.parse_args()
    if not args.trace.exists():
        print(f"sweep benchmark: not available ({args.trace} is missing)")
        return 0
    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="tierdiag-bench-sweep-") as tmp:
        trace = args.trace
        if args.lines:
            trace = Path(tmp) / "trace.jsonl"
            with open(args.trace) as src, open(trace, "w") as dst:
                for _, line in zip(range(args.lines), src):
                    dst.write(line)
        sets = [a for key, values in SETS for a in ("--set", f"{key}={','.join(values)}")]
        for i in range(args.repeats):
            # Alternate which goes first, so a change in the machine's load hits both alike.
            order = ("sweep", "singles") if i % 2 == 0 else ("singles", "sweep")
            times, cpu = {}, {}
            for what in order:
                db = Path(tmp) / f"{what}-{i}.duckdb"
                c0 = CPU_S[0]
                if what == "sweep":
                    times[what] = _run(["sweep", str(trace), *sets, "--jobs", str(args.jobs), "--db", str(db)])
                else:
                    times[what] = _singles(trace, db)
                cpu[what] = CPU_S[0] - c0
            rows.append((times["sweep"], times["singles"], cpu["sweep"], cpu["singles"]))
            print(f"  round {i + 1}: sweep {times['sweep']:.1f} s ({cpu['sweep']:.1f} s CPU), 8 single replays "
                  f"{times['singles']:.1f} s ({cpu['singles']:.1f} s CPU)", file=sys.stderr, flush=True)
    load_after = os.getloadavg()
    sweep_med = statistics.median(r[0] for r in rows)
    singles_med = statistics.median(r[1] for r in rows)
    ratio = sweep_med / singles_med
    print(f"\nsweep benchmark: 8 combinations of {args.trace.name}"
          + (f" (first {args.lines:,} lines)" if args.lines else "") + f", --jobs {args.jobs}, "
          f"{os.cpu_count()} cores, {len(rows)} round{'s' if len(rows) != 1 else ''}")
    cpu_sweep = statistics.median(r[2] for r in rows)
    cpu_singles = statistics.median(r[3] for r in rows)
    print(f"{'':28} {'wall':>10} {'CPU':>10}")
    print(f"{'sweep':28} {sweep_med:>9.1f}s {cpu_sweep:>9.1f}s")
    print(f"{'sum of 8 single replays':28} {singles_med:>9.1f}s {cpu_singles:>9.1f}s")
    verdict = "ok" if ratio <= TARGET_RATIO else "MISSED"
    print(f"{'ratio (target <= 0.60)':28} {ratio:>10.2f}  {verdict}   parallel efficiency "
          f"{singles_med / sweep_med / args.jobs:.0%}")
    print(f"{'CPU ratio (overhead)':28} {cpu_sweep / cpu_singles:>10.2f}   the sweep's own cost; the wall ratio "
          "also depends on the cores other processes leave free")
    print(f"load average (1/5/15 min) before {load_before[0]:.1f}/{load_before[1]:.1f}/{load_before[2]:.1f}, "
          f"after {load_after[0]:.1f}/{load_after[1]:.1f}/{load_after[2]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
