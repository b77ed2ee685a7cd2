"""Diagnosis timings: `explain` and `summary` wall time including interpreter start-up, on the
Mooncake conversation trace at --time-scale 2 (the run issue 12 is about), for three kinds of
request (the slowest, the most recomputed, a tiered hit). Target: explain < 0.5 s.

    .venv/bin/python benchmarks/diagnose.py [--db RUN.duckdb] [--repeats 5] [--baseline REF]

Without --db it replays ../shared/traces/conversation_trace.jsonl first (about 15 s). Prints one
table of medians, wall and CPU seconds; every number comes from this one invocation. tierdiag's
modules are byte-compiled first (`compileall`), as an installed package is: where
PYTHONDONTWRITEBYTECODE is set, a stale .pyc would otherwise be recompiled by every start-up.

--baseline REF also runs every command with the code of git ref REF (a detached worktree, removed
at the end), interleaved with this code's runs on the same store, and prints before/after columns
and their CPU ratio: on a shared machine the CPU seconds are the comparable number.
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


def _wall(args: list[str], label: str | None = None, root: Path = ROOT) -> float:
    """Wall seconds of one `tierdiag ARGS` subprocess (tierdiag imported from `root`); its CPU
    seconds go to CPU[label]. On a shared machine the wall time also counts waiting for a core;
    the CPU time does not."""
    env = {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0, c0 = time.perf_counter(), _cpu_of_children()
    proc = subprocess.run(TIERDIAG + args, capture_output=True, text=True, cwd=root, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"tierdiag {' '.join(args)} failed: {proc.stderr.strip().splitlines()[-1:]}")
    if label is not None:
        CPU.setdefault(label, []).append(_cpu_of_children() - c0)
    return wall


def _measure(name: str, args: list[str], repeats: int, base: Path | None) -> tuple[str, float, float | None]:
    """Median wall of `repeats` runs of this code (and of the baseline's, interleaved)."""
    walls, before = [], []
    for _ in range(repeats):
        if base is not None:
            before.append(_wall(args, name + " @before", root=base))
        walls.append(_wall(args, name))
    return name, statistics.median(walls), statistics.median(before) if before else None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--baseline", metavar="REF", help="also time the code of this git ref, interleaved")
    a = ap.parse_args()
    tmp = tempfile.TemporaryDirectory()
    base = None
    if a.baseline:
        base = Path(tmp.name) / "baseline"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(base), a.baseline],
                       check=True, capture_output=True, text=True)
    try:
        return _main(a, tmp, base)
    finally:
        if base is not None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], capture_output=True)


def _main(a, tmp, base: Path | None) -> int:
    db = a.db
    if db is None:
        if not TRACE.is_file():
            print(f"not available: {TRACE} is missing")
            return 0
        db = str(Path(tmp.name) / "conv.duckdb")
        _wall(["replay", str(TRACE), "--db", db, "--time-scale", "2"])
    import compileall

    for root in (ROOT, base) if base is not None else (ROOT,):
        compileall.compile_dir(str(root / "tierdiag"), quiet=1)
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
            rows.append(_measure(f"explain {req} ({label}){' --json' if fmt else ''}",
                                 ["explain", req, "--db", db, "--run", run_id, *fmt], a.repeats, base))
    rows.append(_measure("summary --json (with diagnosis)", ["summary", "--db", db, "--run", run_id, "--json"],
                         a.repeats, base))
    rows.append(_measure("summary (with diagnosis)", ["summary", "--db", db, "--run", run_id], a.repeats, base))
    rows.append(_measure("--help (start-up, no command module)", ["--help"], a.repeats, base))
    sys.path.insert(0, str(ROOT))
    from tierdiag.diagnose.request.explain import explain_request
    from tierdiag.store.reader import open_store, resolve_run

    with open_store(db) as con:
        run = resolve_run(con, run_id)
        for label, req in picks.items():
            walls = []
            for _ in range(a.repeats):
                t0 = time.perf_counter()
                explain_request(con, run, req)
                walls.append(time.perf_counter() - t0)
            rows.append((f"explain_request {req} in-process (no start-up)", statistics.median(walls), None))
    rows.append(_measure("runs (start-up floor)", ["runs", "--db", db], a.repeats, base))
    load_after = os.getloadavg()
    floor = rows[-1][1]
    width = max(len(r[0]) for r in rows)

    def cpu(name: str) -> str:
        return f"{statistics.median(CPU[name]):6.3f}" if name in CPU else f"{'':6}"

    extra = "  before s  CPU s  CPU after/before" if base is not None else ""
    print(f"{'command':<{width}}  median s  CPU s  vs floor  target{extra}")
    for name, wall, before in rows:
        target = "< 0.5 s" if name.startswith("explain") else ""
        line = f"{name:<{width}}  {wall:8.3f} {cpu(name)}  {wall / floor:7.2f}x  {target:7}"
        if before is not None:
            b = name + " @before"
            ratio = statistics.median(CPU[name]) / statistics.median(CPU[b]) if CPU.get(b) else float("nan")
            line += f"  {before:8.3f} {cpu(b)}  {ratio:6.2f}"
        print(line)
    if base is not None:
        print(f"before: the code of {a.baseline} (a detached worktree), run interleaved with this code's")
    print(f"CPU s: user + sys of the process (in-process rows: none); wall above CPU is time spent waiting for a "
          f"core. Load average (1/5/15 min) before {load_before[0]:.1f}/{load_before[1]:.1f}/{load_before[2]:.1f}, "
          f"after {load_after[0]:.1f}/{load_after[1]:.1f}/{load_after[2]:.1f} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
