"""Data-parallel replay speed (issue 31): `--dp 8 --router cache_aware` against today's `--dp 1`
on the same trace at its real rate, with probes and with `--no-probes`, interleaved, medians of
N runs made side by side in one invocation. Target: dp 8 within 2x dp 1's wall time.

    .venv/bin/python benchmarks/dp.py [--repeats 3] [--trace PATH] [--dp 8] [--router cache_aware]

`wall_s` is the replay's own (in-process, start-up imports included); nothing asserts on it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "traces" / "conversation_trace.jsonl"


def replay(trace: Path, db: Path, *args: str) -> dict:
    cmd = [sys.executable, "-c", "from tierdiag.cli.main import main; main()", "replay", str(trace), "--db", str(db),
           "--json", *args]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=3600)
    if res.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed: {res.stderr.strip()}")
    return json.loads(res.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--dp", type=int, default=8)
    ap.add_argument("--router", default="cache_aware")
    a = ap.parse_args()
    if not a.trace.exists():
        print(f"not available: {a.trace} is absent")
        return 0
    modes = {("1", "no probes"): ["--no-probes"], (str(a.dp), "no probes"): ["--no-probes", "--dp", str(a.dp), "--router", a.router],
             ("1", "probes"): [], (str(a.dp), "probes"): ["--dp", str(a.dp), "--router", a.router]}
    walls: dict = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="tierdiag-dp-bench-") as tmp:
        for i in range(a.repeats):
            for m, args in modes.items():
                db = Path(tmp) / f"{m[0]}-{m[1].replace(' ', '')}-{i}.duckdb"
                walls[m].append(replay(a.trace, db, *args)["wall_s"])
                print(f"  run {i + 1}: dp {m[0]:>2} {m[1]:<9} {walls[m][-1]:6.2f} s", file=sys.stderr)
    print(f"{a.trace.name}, {a.repeats} runs each, interleaved; router {a.router}")
    print(f"| probes | dp 1 wall (median) | dp {a.dp} wall (median) | ratio | target <= 2x |")
    print("|---|---|---|---|---|")
    for probes in ("no probes", "probes"):
        one = statistics.median(walls[("1", probes)])
        many = statistics.median(walls[(str(a.dp), probes)])
        print(f"| {probes} | {one:.2f} s | {many:.2f} s | {many / one:.2f}x | {'met' if many <= 2 * one else 'NOT met'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
