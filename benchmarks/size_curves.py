"""Size curves (diagnose/run/size_curves.py) at scale: CPU seconds of the one pass a run's close adds
(the trace read again, the page references' LRU stack depths, the three curves), on a real trace.

    PYTHONPATH=. .venv/bin/python benchmarks/size_curves.py [--trace PATH] [--requests N] [--repeats 3]

The trace (default: the Mooncake conversation trace in ../shared/traces) is replayed once into a
temporary store (its first N lines with --requests), then `compute_size_curves` is timed on the
recorded run (process CPU seconds, the median of --repeats; a shared machine's wall time is
noise), with the compiled depths and, with --python, the Python reference too (slow: minutes on
the whole trace). Printed: requests, page touches, the curves' time, and what the model predicts
at the run's own sizes beside what the run found (the model's error on the run itself).

Nothing here asserts on timings; tests/diagnose/test_size_curves.py checks the depths.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "conversation_trace.jsonl"


def _replay(trace: Path, db: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = "import sys; from tierdiag.cli.main import entry; sys.argv[0] = 'tierdiag'; sys.exit(entry())"
    subprocess.run([sys.executable, "-c", code, "replay", str(trace), "--db", str(db), "--model", "llama3-8b",
                    "--gpu", "h100"], check=True, env=env, stdout=subprocess.DEVNULL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--requests", type=int, default=None, help="the trace's first N lines only")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--python", action="store_true", help="time the Python reference depths too")
    a = ap.parse_args()
    from tierdiag.diagnose.run import size_curves as sc
    from tierdiag.store.reader import open_store, resolve_run

    with tempfile.TemporaryDirectory() as tmp:
        trace = a.trace
        if a.requests is not None:
            trace = Path(tmp) / "head.jsonl"
            with open(a.trace) as src, open(trace, "w") as dst:
                for i, line in zip(range(a.requests), src):
                    dst.write(line)
        db = Path(tmp) / "run.duckdb"
        t = time.perf_counter()
        _replay(trace, db)
        replay_s = time.perf_counter() - t
        backends = [("compiled", sc._depths_c)] + ([("python", sc._depths_python)] if a.python else [])
        with open_store(db) as con:
            run = resolve_run(con, None)
            n = con.execute("SELECT count(*) FROM requests WHERE run_id = ?", [run.run_id]).fetchone()[0]
            print(f"trace {a.trace.name}" + (f" (first {a.requests} lines)" if a.requests else "")
                  + f": {n:,} requests, replay {replay_s:,.1f} s wall (its close included)")
            for name, fn in backends:
                sc.depths_of = fn
                times = []
                for _ in range(a.repeats):
                    t = time.process_time()
                    curves = sc.compute_size_curves(con, run)
                    times.append(time.process_time() - t)
                print(f"  size curves, {name} depths: {statistics.median(times):,.2f} s CPU "
                      f"(median of {a.repeats}; {curves.looked_up_tokens // curves.page_size:,} pages looked up)")
            for c in curves.curves:
                print(f"  {c.tier:8s} run's size {c.run_size_tokens:>12,}: predicted {c.reused_at(c.run_size_tokens):>12,}"
                      f" found {c.found_tokens:>12,} tokens; knee {c.knee_tokens or 0:>12,}; "
                      f"unbounded {c.unbounded_reused_tokens:,}")


if __name__ == "__main__":
    main()
