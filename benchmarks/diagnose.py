"""Diagnosis timings: `explain` and `summary` wall time including interpreter start-up, on the
Mooncake conversation trace at --time-scale 2 (the run issue 12 is about), for three kinds of
request (the slowest, the most recomputed, a tiered hit). Target: explain < 0.5 s.

    .venv/bin/python benchmarks/diagnose.py [--db RUN.duckdb] [--repeats 5]

Without --db it replays ../shared/traces/conversation_trace.jsonl first (about 15 s). Prints one
table of medians, wall and CPU seconds; every number comes from this one invocation. tierdiag's
modules are byte-compiled first (`compileall`), as an installed package is: where
PYTHONDONTWRITEBYTECODE is set, a stale .pyc would otherwise be recompiled by every start-up.
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
TRACE = ROOT / ".." / "shared" / "traces" / "conversation_trace.jsonl"
TIERDIAG = [sys.executable, "-c", "from tierdiag.cli.main import main; main()"]


CPU: dict[str, list[float]] = {}  # command label -> CPU seconds (user + sys) per run


def _cpu_of_children() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _wall(args: list[str], label: str | None = None) -> float:
    """Wall seconds of one `tierdiag ARGS` subprocess; its CPU seconds go to CPU[label]. On a
    shared machine the wall time also counts waiting for a core; the CPU time does not."""
    t0, c0 = time.perf_counter(), _cpu_of_children()
    proc = subprocess.run(TIERDIAG + args, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"tierdiag {' '.join(args)} failed: {proc.stderr.strip().splitlines()[-1:]}")
    if label is not None:
        CPU.setdefault(label, []).append(_cpu_of_children() - c0)
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
    import compileall

    compileall.compile_dir(str(ROOT / "tierdiag"), quiet=1)
    import duckdb

    con = duckdb.connect(db, read_only=True)
    # The oldest replay outside any sweep: the run itself, not the runs `advise` added beside it.
    run_id = con.execute("SELECT run_id FROM runs WHERE kind = 'replay' AND sweep_id IS NULL "
                         "ORDER BY created_at, run_id LIMIT 1").fetchone()[0]
    picks = {}
    for label, order in (("slowest", "ttft_ns - ideal_ttft_ns"), ("most recomputed", "recomputed_tokens"),
                         ("tiered hit", "host_hit_tokens + storage_hit_tokens")):
        picks[label] = con.execute(f"SELECT req_id FROM requests WHERE run_id = ? AND status = 'finished' ORDER BY {order} DESC "
                                   "LIMIT 1", [run_id]).fetchone()[0]
    con.close()
    rows = []
    load_before = os.getloadavg()
    for label, req in picks.items():
        for fmt in ([], ["--json"]):
            name = f"explain {req} ({label}){' --json' if fmt else ''}"
            walls = [_wall(["explain", req, "--db", db, "--run", run_id, *fmt], name) for _ in range(a.repeats)]
            rows.append((name, statistics.median(walls)))
    name = "summary --json (with diagnosis)"
    walls = [_wall(["summary", "--db", db, "--run", run_id, "--json"], name) for _ in range(a.repeats)]
    rows.append((name, statistics.median(walls)))
    name = "--help (start-up, no command module)"
    walls = [_wall(["--help"], name) for _ in range(a.repeats)]
    rows.append((name, statistics.median(walls)))
    sys.path.insert(0, str(ROOT))
    from tierdiag.diagnose.explain import explain_request
    from tierdiag.store.reader import open_store, resolve_run

    with open_store(db) as con:
        run = resolve_run(con, run_id)
        for label, req in picks.items():
            walls = []
            for _ in range(a.repeats):
                t0 = time.perf_counter()
                explain_request(con, run, req)
                walls.append(time.perf_counter() - t0)
            rows.append((f"explain_request {req} in-process (no start-up)", statistics.median(walls)))
    name = "runs (start-up floor)"
    walls = [_wall(["runs", "--db", db], name) for _ in range(a.repeats)]
    rows.append((name, statistics.median(walls)))
    load_after = os.getloadavg()
    floor = rows[-1][1]
    width = max(len(r[0]) for r in rows)
    print(f"{'command':<{width}}  median s  CPU s  vs floor  target")
    for name, wall in rows:
        target = "< 0.5 s" if name.startswith("explain") else ""
        cpu = f"{statistics.median(CPU[name]):6.3f}" if name in CPU else f"{'':6}"
        print(f"{name:<{width}}  {wall:8.3f} {cpu}  {wall / floor:7.2f}x  {target}")
    print(f"CPU s: user + sys of the process (in-process rows: none); wall above CPU is time spent waiting for a "
          f"core. Load average (1/5/15 min) before {load_before[0]:.1f}/{load_before[1]:.1f}/{load_before[2]:.1f}, "
          f"after {load_after[0]:.1f}/{load_after[1]:.1f}/{load_after[2]:.1f} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
