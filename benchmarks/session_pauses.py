"""The session advice's stack distances (diagnose/session/session_pool.py) on one long session: CPU seconds
of `session_pauses` and of a `summary` view, per number of turns (issue 39 item 16).

    PYTHONPATH=. .venv/bin/python benchmarks/session_pauses.py [--turns 25000,50000,100000] [--baseline REF]

Each size is a trace of one closed-loop session of N turns (1,024 input tokens each: a shared
first block and one of its own, 8 output tokens, think_ms 50), replayed once into a temporary store.
Columns (process CPU seconds, the median of --repeats; a shared machine's wall time is noise):

    distances   session_pauses() computed from the rows (linear: sorted searches, numpy group-by)
    summary     run_summary() with the diagnosis, as `tierdiag summary` computes it: the distances
                are read from the run evidence stored at close
    baseline    with --baseline REF, session_pauses as of that git ref, computed from the rows (before
                issue 39: an inequality join of turns x requests, planned as a piecewise merge join,
                which every summary and explain ran)

Nothing here asserts on timings; the tests check that both compute the same distances.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

def _baseline(ref: str):
    """session_pool.session_pauses as of git ref `ref` (loaded from `git show`, not checked out)."""
    import importlib.util
    import subprocess

    root = Path(__file__).resolve().parents[1]
    src = subprocess.run(["git", "-C", str(root), "show", f"{ref}:tierdiag/diagnose/session/session_pool.py"],
                         capture_output=True, text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / "session_pool_baseline.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("session_pool_baseline", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.session_pauses


def _trace(path: Path, turns: int) -> None:
    with path.open("w") as f:
        for i in range(turns):
            line = {"id": f"t{i}", "timestamp": i * 100, "input_length": 1024, "output_length": 8,
                    "hash_ids": [0, i + 1], "session": "s0"}
            if i:
                line["think_ms"] = 50
            f.write(json.dumps(line) + "\n")


def _cpu(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", default="25000,50000,100000")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--baseline", metavar="REF", help="also time session_pauses as of git ref REF (before: 5912685, "
                                                      "the inequality join; 22 s at 100k turns)")
    a = ap.parse_args()
    from typer.testing import CliRunner

    from tierdiag.cli.main import app
    from tierdiag.diagnose.session.session_pool import session_pauses
    from tierdiag.diagnose.run.summary import run_summary
    from tierdiag.store.reader import open_store, resolve_run

    rows = []
    with tempfile.TemporaryDirectory() as d:
        for n in (int(x) for x in a.turns.split(",")):
            trace, db = Path(d) / f"s{n}.jsonl", Path(d) / f"s{n}.duckdb"
            _trace(trace, n)
            t = time.perf_counter()
            r = CliRunner().invoke(app, ["replay", str(trace), "--db", str(db), "--json"])
            assert r.exit_code == 0, r.output
            replay_s = time.perf_counter() - t
            with open_store(db) as con:
                run = resolve_run(con, None)
                found = session_pauses(con, run)
                row = {"turns": n, "later_turns": found.num_turns, "replay_wall_s": replay_s,
                       "distances_cpu_s": _cpu(lambda: session_pauses(con, run), a.repeats),
                       "summary_cpu_s": _cpu(lambda: run_summary(con, run), a.repeats)}
                if a.baseline:
                    before = _baseline(a.baseline)
                    row["baseline_cpu_s"] = _cpu(lambda: before(con, run), 1)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    cols = ["turns", "distances_cpu_s", "summary_cpu_s"] + (["baseline_cpu_s"] if a.baseline else []) + ["replay_wall_s"]
    print(" | ".join(cols))
    for row in rows:
        print(" | ".join(f"{row[c]:,}" if c == "turns" else f"{row[c]:.2f}" for c in cols))


if __name__ == "__main__":
    main()
