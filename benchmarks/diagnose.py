"""Diagnosis timings: `explain` and `summary` wall time including interpreter start-up, on the
Mooncake conversation trace at --time-scale 2 (the run issue 12 is about), for three kinds of
request (the slowest, the most recomputed, a tiered hit). Target: explain < 0.5 s.

    .venv/bin/python benchmarks/diagnose.py [--db RUN.duckdb] [--repeats 5]

Without --db it replays ../shared/traces/conversation_trace.jsonl first (about 15 s). Prints one
table of medians; every number comes from this one invocation.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / ".." / "shared" / "traces" / "conversation_trace.jsonl"
TIERDIAG = [sys.executable, "-c", "from tierdiag.cli.main import main; main()"]


def _wall(args: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(TIERDIAG + args, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"tierdiag {' '.join(args)} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return wall


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    tmp = tempfile.TemporaryDirectory()
    db = a.db
    if db is None:
        if not TRACE.is_file():
            print(f"not available: {TRACE} is missing")
            return 0
        db = str(Path(tmp.name) / "conv.duckdb")
        _wall(["replay", str(TRACE), "--db", db, "--time-scale", "2"])
    import duckdb

    con = duckdb.connect(db, read_only=True)
    picks = {}
    for label, order in (("slowest", "ttft_ns - ideal_ttft_ns"), ("most recomputed", "recomputed_tokens"),
                         ("tiered hit", "host_hit_tokens + storage_hit_tokens")):
        picks[label] = con.execute(f"SELECT req_id FROM requests WHERE status = 'finished' ORDER BY {order} DESC "
                                   "LIMIT 1").fetchone()[0]
    con.close()
    rows = []
    for label, req in picks.items():
        for fmt in ([], ["--json"]):
            walls = [_wall(["explain", req, "--db", db, *fmt]) for _ in range(a.repeats)]
            rows.append((f"explain {req} ({label}){' --json' if fmt else ''}", statistics.median(walls)))
    walls = [_wall(["summary", "--db", db, "--json"]) for _ in range(a.repeats)]
    rows.append(("summary --json (with diagnosis)", statistics.median(walls)))
    sys.path.insert(0, str(ROOT))
    from tierdiag.diagnose.explain import explain_request
    from tierdiag.store.reader import open_store, resolve_run

    with open_store(db) as con:
        run = resolve_run(con, None)
        for label, req in picks.items():
            walls = []
            for _ in range(a.repeats):
                t0 = time.perf_counter()
                explain_request(con, run, req)
                walls.append(time.perf_counter() - t0)
            rows.append((f"explain_request {req} in-process (no start-up)", statistics.median(walls)))
    walls = [_wall(["runs", "--db", db]) for _ in range(a.repeats)]
    rows.append(("runs (start-up floor)", statistics.median(walls)))
    floor = rows[-1][1]
    width = max(len(r[0]) for r in rows)
    print(f"{'command':<{width}}  median s  vs floor  target")
    for name, wall in rows:
        target = "< 0.5 s" if name.startswith("explain") else ""
        print(f"{name:<{width}}  {wall:8.3f}  {wall / floor:7.2f}x  {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
