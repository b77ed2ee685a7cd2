"""The store's writer process against the inline writer and no probes, interleaved.

    .venv/bin/python benchmarks/writer_process.py [--repeats N] [--traces conversation,synthetic]

For each Mooncake trace (../shared/traces): `tierdiag replay` with --no-probes, with probes
written inline (TIERDIAG_WRITER=inline) and with probes through the writer process
(TIERDIAG_WRITER=process), in turn, N times. Prints medians of the replay's own wall_s, the
process's wall time, and CPU seconds split into the engine's process and its children (the
writer process): on a shared machine the CPU columns say what the wall clock cannot.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / ".." / "shared" / "traces"
FILES = {"conversation": "conversation_trace.jsonl", "synthetic": "synthetic_trace.jsonl"}
# The CLI, reporting its own CPU and its children's (the writer process) at exit on stderr.
ENTRY = ("import atexit, json, resource, sys\n"
         "def _cpu():\n"
         "    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)\n"
         "    sys.stderr.write('CPU ' + json.dumps([s.ru_utime + s.ru_stime, c.ru_utime + c.ru_stime]) + '\\n')\n"
         "atexit.register(_cpu)\n"
         "from tierdiag.cli.main import main; main()\n")
MODES = {"no_probes": {}, "inline": {"TIERDIAG_WRITER": "inline"}, "process": {"TIERDIAG_WRITER": "process"}}


def run_once(trace: Path, db: Path, mode: str) -> dict:
    args = [sys.executable, "-c", ENTRY, "replay", str(trace), "--db", str(db), "--json"]
    if mode == "no_probes":
        args.append("--no-probes")
    env = {k: v for k, v in os.environ.items() if k != "TIERDIAG_WRITER"}
    env.update(MODES[mode], PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"replay {mode} failed: {proc.stderr.strip().splitlines()[-1:]}")
    engine_cpu, writer_cpu = json.loads(next(ln[4:] for ln in proc.stderr.splitlines() if ln.startswith("CPU ")))
    return {"wall_s": json.loads(proc.stdout)["wall_s"], "process_s": wall, "engine_cpu_s": engine_cpu,
            "writer_cpu_s": writer_cpu}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--traces", default="conversation,synthetic")
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="tierdiag-wp-") as tmp:
        for name in args.traces.split(","):
            trace = TRACES / FILES[name]
            if not trace.is_file():
                print(f"{name}: {trace} is absent, skipped")
                continue
            got: dict[str, list[dict]] = {m: [] for m in MODES}
            for i in range(args.repeats):
                for mode in MODES:
                    r = run_once(trace, Path(tmp) / f"{name}-{mode}-{i}.duckdb", mode)
                    got[mode].append(r)
                    print(f"{name} {mode} #{i + 1}: {json.dumps({k: round(v, 2) for k, v in r.items()})}",
                          file=sys.stderr)
            med = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in got.items()}
            base = med["no_probes"]["wall_s"]
            print(f"\n{name} (medians of {args.repeats}; load average now {os.getloadavg()[0]:.2f})")
            print(f"{'mode':<10} {'wall_s':>7} {'overhead':>9} {'process':>8} {'engine CPU':>11} {'writer CPU':>11}")
            for mode, m in med.items():
                print(f"{mode:<10} {m['wall_s']:>7.2f} {m['wall_s'] / base - 1:>+9.1%} {m['process_s']:>8.2f} "
                      f"{m['engine_cpu_s']:>11.2f} {m['writer_cpu_s']:>11.2f}")


if __name__ == "__main__":
    main()
