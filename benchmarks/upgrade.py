"""How long `tierdiag replay TRACE --sglang 0.5.9,0.5.23` takes, and what each rule moved.

    .venv/bin/python benchmarks/upgrade.py [--lines N] [--jobs 2] [--json FILE] [-- replay options...]

Runs the upgrade (OLD, NEW and NEW once per differing rule switched back, through the sweep
runner) on ../shared/traces/conversation_trace.jsonl (its first N lines with --lines) as a
subprocess, and prints the wall time and, per rule that moved anything, the requests whose split
and TTFT (by more than 1 s) moved, the host hit tokens and TTFT p50 it changed, and how many of
the upgrade's moved requests it alone reproduces. Nothing is asserted: the table is the result.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / ".." / "shared" / "traces" / "conversation_trace.jsonl"
CLI = [sys.executable, "-c", "from tierdiag.cli.main import main; main()"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=None, help="the first N lines of the trace only")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None, help="write the upgrade view's JSON here")
    ap.add_argument("replay_options", nargs="*", help="more replay options, after --")
    args = ap.parse_args()
    if not TRACE.is_file():
        raise SystemExit(f"{TRACE} is absent")
    with tempfile.TemporaryDirectory(prefix="tierdiag-upgrade-bench-") as tmp:
        trace = TRACE
        if args.lines:
            trace = Path(tmp) / "head.jsonl"
            with TRACE.open() as src, trace.open("w") as dst:
                dst.writelines(line for _, line in zip(range(args.lines), src))
        cmd = CLI + ["replay", str(trace), "--db", str(Path(tmp) / "up.duckdb"), "--sglang", "0.5.9,0.5.23",
                     "--jobs", str(args.jobs), "--json", *args.replay_options]
        t0 = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=3600)
        wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"the upgrade failed: {proc.stderr.strip().splitlines()[-1:]}")
    view = json.loads(proc.stdout)
    if args.json:
        args.json.write_text(json.dumps(view, indent=1))
    u = view["upgrade"]
    print(f"{len(view['runs'])} replays of {u['compared_requests']:,} requests in {wall:.1f} s (--jobs {args.jobs})")
    print(f"the upgrade: split moved {u['split_moved']:,}, TTFT moved {u['ttft_moved']:,} "
          f"(> 1 s: {u['ttft_moved_over_1s']:,}), host hit tokens {u['tokens_delta']['host']:+,}, "
          f"TTFT p50 {u['ttft_delta_ms']['p50']:+,.1f} ms")
    print(f"{'rule':<30}{'split':>7}{'> 1 s':>8}{'host':>10}{'p50 ms':>11}{'gives split':>13}{'gives TTFT':>12}")
    for r in view["rules"]:
        if not (r["split_moved"] or r["ttft_moved"]):
            continue
        print(f"{r['rule']:<30}{r['split_moved']:>7,}{r['ttft_moved_over_1s']:>8,}{r['tokens_delta']['host']:>+10,}"
              f"{r['ttft_delta_ms']['p50']:>+11,.1f}{r['reproduces_upgrade_split']:>13,}{r['reproduces_upgrade_ttft']:>12,}")


if __name__ == "__main__":
    main()
