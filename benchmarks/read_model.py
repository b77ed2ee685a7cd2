"""The readers on a million requests, before and after a change to how they read a run (issue 38's
read model): `summary`, `slow --top 20`, `explain` of the slowest request and of a tiered hit,
in-process (no interpreter start-up), medians of --repeats, CPU and wall seconds.

    .venv/bin/python benchmarks/read_model.py [--requests 3000] [--copies 334] [--repeats 5]
                                              [--baseline /path/to/other/checkout]

It replays the first --requests lines of the Mooncake conversation trace (../shared/traces) once,
then copies that run's `requests` rows --copies times, each copy shifted past the last (new ids,
seq and times), into a second store: a 1M-request `requests` table in ~20 s instead of a
~11-minute 1M replay. The other tables stay the small run's (explain's per-request queries filter
on req_id, so their size is not what is timed). With --baseline, the same timings run with
the other checkout's tierdiag (its root on PYTHONPATH) on the same store, interleaved; on a
shared machine compare the CPU columns.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / ".." / "shared" / "traces" / "conversation_trace.jsonl"

# Run inside a child with the code under test first on sys.path: prints one JSON line.
_TIMER = r"""
import json, statistics, sys, time
from tierdiag.store.reader import open_store, resolve_run
from tierdiag.diagnose import views
db, reps = sys.argv[1], int(sys.argv[2])
con = open_store(db); run = resolve_run(con, None)
slowest = views.slow(con, run, top=1)[1][0].req_id
tiered = con.execute("SELECT req_id FROM requests WHERE run_id = ? AND host_hit_tokens > 0 ORDER BY seq LIMIT 1",
                     [run.run_id]).fetchone()[0]
out = {}
for name, fn in (("summary", lambda: views.summarize(con, run)), ("slow --top 20", lambda: views.slow(con, run, top=20)),
                 ("explain slowest", lambda: views.explain(con, run, slowest)),
                 ("explain tiered hit", lambda: views.explain(con, run, tiered))):
    cpu, wall = [], []
    for _ in range(reps):
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        cpu.append(time.process_time() - c0); wall.append(time.perf_counter() - w0)
    out[name] = (statistics.median(cpu), statistics.median(wall))
print(json.dumps(out))
"""


def build(tmp: Path, requests: int, copies: int) -> Path:
    trace = tmp / "slice.jsonl"
    with open(TRACE) as src, open(trace, "w") as dst:
        for i, line in enumerate(src):
            if i >= requests:
                break
            dst.write(line)
    db = tmp / "run.duckdb"
    subprocess.run([sys.executable, "-c", "import tierdiag.cli.main as m; m.entry()", "replay", str(trace),
                    "--db", str(db), "--run-name", "read-model"], check=True, cwd=ROOT, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    import duckdb

    con = duckdb.connect(str(db))
    span = con.execute("SELECT max(coalesce(finish_ns, arrival_ns)) - min(arrival_ns) + 1 FROM requests").fetchone()[0]
    n = con.execute("SELECT max(seq) + 1 FROM requests").fetchone()[0]
    shifted = ", ".join(f"r.{c} + t.k * {span} AS {c}" for c in ("arrival_ns", "first_token_ns", "finish_ns"))
    con.execute(f"INSERT INTO requests SELECT r.* REPLACE (r.req_id || '-' || CAST(t.k AS VARCHAR) AS req_id, "
                f"r.seq + t.k * {n} AS seq, {shifted}) FROM requests r, range(1, {copies}) t(k)")
    con.execute("UPDATE runs SET num_requests = (SELECT count(*) FROM requests)")
    con.close()
    return db


def timings(root: Path, db: Path, repeats: int) -> dict:
    proc = subprocess.run([sys.executable, "-c", _TIMER, str(db), str(repeats)], check=True, capture_output=True,
                          text=True, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--copies", type=int, default=334)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--baseline", type=Path, default=None, help="another checkout's root, timed beside this one")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        db = build(Path(tmp), args.requests, args.copies)
        roots = [("this", ROOT)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
        results: dict[str, list[dict]] = {label: [] for label, _ in roots}
        for _ in range(2):  # interleaved
            for label, root in roots:
                results[label].append(timings(root, db, args.repeats))
    print(f"{args.requests * args.copies:,} requests; medians of {args.repeats}, best of 2 interleaved rounds")
    print(f"{'':<20}" + "".join(f"{label + ' cpu s':>17}{label + ' wall s':>17}" for label, _ in roots))
    for name in results["this"][0]:
        cells = []
        for label, _ in roots:
            cpu = min(r[name][0] for r in results[label])
            wall = min(r[name][1] for r in results[label])
            cells.append(f"{cpu:>17.3f}{wall:>17.3f}")
        print(f"{name:<20}" + "".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
