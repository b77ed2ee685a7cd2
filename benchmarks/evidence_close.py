"""The run evidence a probed replay's close computes (diagnose/run/evidence.py `compute_evidence`),
timed alone on a recorded run: this tree against the code of a git ref, interleaved (issue 41's
probe overhead: the close is what a replay with a writer process waits for).

    .venv/bin/python benchmarks/evidence_close.py RUN.duckdb [--baseline REF] [--repeats N] [--rounds R]

Each round runs one process per side (the ref's code in a detached worktree, as
probe_timeline.py's --baseline); each process opens the store read-only, computes the evidence
once to warm up (imports, the file's pages), then N times, and reports the median wall and CPU
(its own process: every thread of it) of those, and the CPU of its busiest thread: what the
close takes where each thread has a core (a quiet machine; the GIL aside). With this tree it also times the close as a
writer process makes it: the trace's pages read ahead (`read_ahead`, finished before the close
starts, as while the engine runs), then the evidence; and (`fed`) as a writer process makes it
since the curves' pass is fed while recording (diagnose/run/live_curves.py): the run's request
rows handed to the read-ahead in the order they were written, 700 at a time (about a flush's),
each batch walked before the next is handed (as while the engine runs), then the evidence. Printed: medians over the rounds. On a
loaded machine prefer the CPU column; the wall of three threads is what the load leaves them.
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

from probe_timeline import baseline_worktree  # benchmarks/ is the script's folder: first on sys.path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

_TIME = r"""
import json, resource, statistics, sys, time
import duckdb
from tierdiag.store.reader import run_info
import tierdiag.diagnose.run.evidence as E
import tierdiag.diagnose.run.size_curves as sc

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

# Each thread's own CPU (the evidence's helper threads, and this one's): the slowest is what the
# close takes where every thread has a core and the GIL is rarely held (a quiet machine).
import threading
threads_cpu = []
_run = threading.Thread.run
def _timed_run(self):
    t = time.thread_time()
    try:
        _run(self)
    finally:
        threads_cpu.append(time.thread_time() - t)
threading.Thread.run = _timed_run

con = duckdb.connect(sys.argv[1], read_only=True)
run = run_info(con, con.execute("SELECT run_id FROM runs ORDER BY created_at LIMIT 1").fetchone()[0])
ahead = sys.argv[3] in ("ahead", "fed")
fed = sys.argv[3] == "fed"
rows = None
if fed:
    cur = con.execute("SELECT * FROM requests WHERE run_id = ? ORDER BY rowid", [run.run_id])
    rows = cur.to_arrow_table() if hasattr(cur, "to_arrow_table") else cur.fetch_arrow_table()

def feed_rows(hand):
    live_of = sc._READ_AHEAD[0]
    live_of._thread.join()
    for i in range(0, rows.num_rows, 700):
        part = rows.slice(i, 700)
        hand({"requests": {c: part.column(c).combine_chunks() for c in part.column_names}})
        while not live_of._rows.empty():  # walked before the next batch, as while the engine runs
            time.sleep(0.001)
    time.sleep(0.05)

E.compute_evidence(con, run)
walls, cpus, paths = [], [], []
for _ in range(int(sys.argv[2])):
    if ahead:
        hand = sc.read_ahead(run.trace_path, run.trace_sha256, run.config)
        sc._READ_AHEAD[0]._thread.join()
        if fed:
            feed_rows(hand)
    threads_cpu.clear()
    t, c, own = time.perf_counter(), cpu(), time.thread_time()
    E.compute_evidence(con, run)
    walls.append(time.perf_counter() - t)
    cpus.append(cpu() - c)
    paths.append(max([time.thread_time() - own] + threads_cpu))
print(json.dumps({"wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus),
                  "longest_thread_cpu_s": statistics.median(paths)}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("db", type=Path)
    ap.add_argument("--baseline", default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tierdiag-evidence-") as td:
        sides = [("this", ROOT, "close"), ("this, read ahead", ROOT, "ahead"), ("this, fed", ROOT, "fed")]
        if a.baseline:
            base, label = baseline_worktree(a.baseline, Path(td)), Path(a.baseline).name or a.baseline
            sides[:0] = [(label, base, "close"), (f"{label}, read ahead", base, "ahead")]
        got: dict[str, list[dict]] = {name: [] for name, _, _ in sides}
        try:
            for rnd in range(a.rounds):
                for name, root, how in (sides if rnd % 2 == 0 else sides[::-1]):
                    env = {**os.environ, "PYTHONPATH": str(root)}
                    # cwd: `python -c` puts it first on sys.path, before PYTHONPATH
                    out = subprocess.run([sys.executable, "-c", _TIME, str(a.db.absolute()), str(a.repeats), how],
                                         env=env, cwd=root, capture_output=True, text=True, check=True)
                    got[name].append(json.loads(out.stdout))
                    print(f"round {rnd + 1} {name:>18}: {got[name][-1]}", file=sys.stderr, flush=True)
        finally:
            if a.baseline and not Path(a.baseline).is_dir():
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                str(Path(td) / f"baseline-{a.baseline.replace('/', '_')}")], capture_output=True)
    with open("/proc/loadavg") as fh:
        load = " ".join(fh.read().split()[:3])
    print(f"\n{a.db}: compute_evidence, medians of {a.rounds} rounds x {a.repeats}; load average at the end {load}")
    print(f"{'code':>18} {'wall s':>8} {'CPU s':>8} {'longest thread CPU s':>21}")
    for name, rs in got.items():
        print(f"{name:>18} {statistics.median(r['wall_s'] for r in rs):8.3f} {statistics.median(r['cpu_s'] for r in rs):8.3f}"
              f" {statistics.median(r['longest_thread_cpu_s'] for r in rs):21.3f}")


if __name__ == "__main__":
    main()
