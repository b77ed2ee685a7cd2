"""The close's last checkpoint against leaving the WAL (issue 41, probe overhead: the detach's
CHECKPOINT is part of the close a probed replay waits for): what the close would save, and what
every reader would pay next, until some writer checkpoints.

    .venv/bin/python benchmarks/close_checkpoint.py RUN.duckdb [--last 0.3] [--rounds 5]

Each round, per side, copies RUN.duckdb (a recorded run, its evidence stored) and writes into the
copy, through an attached file as the writer does (store/writer.py), a close's worth: `--last` of
every table's rows again (under another run id) in one transaction, then the run's evidence row
again (its JSON) in another; then lets go of the file:

    checkpoint  CHECKPOINT, then DETACH (store/reader.py `detach`: what the close does)
    wal         DETACH with `checkpoint_on_detach = 'DISABLED'` (the WAL left beside the file)

Measured: the let-go's wall and process CPU (what the close would save), the WAL's size, and then
what a reader pays: a read-only open and one count (the store's open: a WAL is replayed into the
reader's memory each time, never written back by a read-only connection), and `tierdiag summary
--json` as a whole process. Printed: medians over the rounds, the sides interleaved.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TABLES = ("requests", "batches", "evictions", "pool_samples", "request_evictions", "transfers")


def close_once(src: Path, dst: Path, side: str, last: float) -> dict:
    for p in (dst, Path(f"{dst}.wal")):
        if p.exists():
            p.unlink()
    shutil.copy(src, dst)
    host = duckdb.connect(":memory:")
    if side == "wal":
        host.execute("SET checkpoint_on_detach = 'DISABLED'")
    host.execute(f"ATTACH '{dst}' AS s")
    host.execute("BEGIN")
    for t in TABLES:
        n = host.execute(f"SELECT count(*) FROM s.{t}").fetchone()[0]
        host.execute(f"INSERT INTO s.{t} SELECT * REPLACE ('again' AS run_id) FROM s.{t} LIMIT {int(n * last)}")
    host.execute("COMMIT")
    host.execute("INSERT INTO s.run_evidence SELECT * REPLACE ('again' AS run_id) FROM s.run_evidence LIMIT 1")
    w, c = time.perf_counter(), time.process_time()
    if side == "checkpoint":
        host.execute("CHECKPOINT")
    host.execute("USE memory")
    host.execute("DETACH s")
    out = {"let_go_s": time.perf_counter() - w, "let_go_cpu": time.process_time() - c}
    host.close()
    wal = Path(f"{dst}.wal")
    out["wal_bytes"] = wal.stat().st_size if wal.exists() else 0
    return out


def read_once(dst: Path) -> dict:
    w, c = time.perf_counter(), time.process_time()
    con = duckdb.connect(str(dst), read_only=True)
    con.execute("SELECT count(*) FROM requests").fetchone()
    con.close()
    out = {"open_s": time.perf_counter() - w, "open_cpu": time.process_time() - c}
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    w = time.perf_counter()
    before = os.times()
    subprocess.run([sys.executable, "-m", "tierdiag", "summary", "--db", str(dst), "--json"], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = os.times()
    out["summary_s"] = time.perf_counter() - w
    out["summary_cpu"] = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path, help="a store holding one recorded run with its evidence")
    ap.add_argument("--last", type=float, default=0.3, help="share of each table's rows the close writes")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    got: dict[str, list[dict]] = {"checkpoint": [], "wal": []}
    with tempfile.TemporaryDirectory(prefix="close_checkpoint_") as tmp:
        for r in range(a.rounds):
            sides = ("checkpoint", "wal") if r % 2 == 0 else ("wal", "checkpoint")
            for side in sides:
                dst = Path(tmp) / f"{side}.duckdb"
                row = close_once(a.run, dst, side, a.last)
                row.update(read_once(dst))
                got[side].append(row)
                print(f"round {r + 1} {side:>10}: " + " ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                                                            for k, v in row.items()), flush=True)
    print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; medians of {a.rounds} rounds")
    keys = list(got["checkpoint"][0])
    print(f"{'side':>10} " + " ".join(f"{k:>12}" for k in keys))
    for side, rows in got.items():
        print(f"{side:>10} " + " ".join(f"{statistics.median(r[k] for r in rows):12.4f}" for k in keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
