"""The writer's memory through its mid-run writes, the engine aside (issue 41's 1M row: <= 1 GB).

    .venv/bin/python benchmarks/write_memory.py STORE [--writes K] [--share F] [--code BASE]
        [--repeats N] [--work DIR] [--sql STATEMENTS]

A 1M-request replay's peak is a mid-run write of the writer process (benchmarks/README.md,
session 24: +220-430 MB over the run's ~560 MB): ~5 s of rows pending as Arrow, then inserted
and committed in one transaction. A replay of it takes minutes and its writes' size follows the
engine's speed (a loaded machine's are small), so this drives the writer's own code
(store/writer.py RunWriter: take, write) with the rows of a recorded run (STORE, e.g. a 1M run's
store: copied, read only) at a fixed size: K writes, each of F of the store's rows (default 5/85:
a quiet 1M replay's 5 s write), handed over as the engine does (8,192 rows of its largest table a
hand-over, the others in proportion), each column's buffers Python bytes objects (what the
writer process's decode makes: glibc's heap, not Arrow's pool), every VACUUM_EVERY-th write
vacuuming as writer_serve's do. The writer is set up as the writer process sets it (`let_rows_go`
where the code has it). Each side runs in a process of its own (PYTHONPATH its checkout);
--code BASE interleaves a built checkout's runs with this one's.

Printed per run: for each write the resident set before it (the pending rows in), its peak
during the write (sampled every 5 ms) and after it, and its CPU; then the largest write's rise
and the process's peak. The anonymous resident set (RssAnon) is what is sampled: the rows' source
is memory-mapped Arrow IPC (a file's pages are not the writer's memory).
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

ROOT = Path(__file__).resolve().parent.parent

TABLES = ("requests", "evictions", "pool_samples", "transfers", "batches", "request_evictions")
HAND_OVER = 8192

_CHILD = r'''
import json, os, sys, threading, time
import pyarrow as pa, pyarrow.ipc as ipc
work, db, k, vacuum_every = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
tables = json.loads(sys.argv[5])
hand_over = int(sys.argv[6])

def anon():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) // 1024
    return -1

def bytes_backed(arr):
    arr = pa.concat_arrays([arr])  # the slice's own rows only
    bufs = [None if b is None else pa.py_buffer(b.to_pybytes()) for b in arr.buffers()]
    return pa.Array.from_buffers(arr.type, len(arr), bufs, null_count=arr.null_count)

from tierdiag.store import duckdb_core
from tierdiag.store.writer import RunWriter

if hasattr(duckdb_core, "purge_from_now"):
    duckdb_core.purge_from_now()  # as the writer process's read-ahead sets it when recording starts
w = RunWriter(db, name="w", trace_path="t.jsonl", trace_sha256="", config={}, hardware={}, data_plane={},
              timing="modelled", command_line=["write_memory"])
w.let_rows_go = True  # as writer_serve sets it where the code has it (an attribute nothing reads otherwise)
for stmt in filter(None, (x.strip() for x in os.environ.get("WM_SQL", "").split(";"))):
    w._host.execute(stmt)  # --sql: settings tried on the writer's instance
peak = [0]
stop = [False]

def sample():
    while not stop[0]:
        peak[0] = max(peak[0], anon())
        time.sleep(0.005)

threading.Thread(target=sample, daemon=True).start()
out = []
try:  # the writer process's vacuum policy where the code has it (session 30), else every vacuum_every-th
    from tierdiag.store.writer_serve import vacuum_due
except ImportError:
    vacuum_due = None
since_writes, since_rows, taken_rows = 0, {}, {}
for i in range(k):
    src = {t: ipc.open_file(pa.memory_map(f"{work}/w{i}.{t}.arrow")).read_all() for t in tables}
    big = max(len(tb) for tb in src.values())
    for a in range(0, big, hand_over):
        h = {}
        for t, tb in src.items():
            lo, hi = a * len(tb) // big, min(a + hand_over, big) * len(tb) // big
            if hi > lo:
                s = tb.slice(lo, hi - lo)
                h[t] = {c: bytes_backed(s.column(c).combine_chunks()) for c in s.column_names}
        w.take(h)
    for t, tb in src.items():
        since_rows[t] = since_rows.get(t, 0) + len(tb)
        taken_rows[t] = taken_rows.get(t, 0) + len(tb)
    since_writes += 1
    if vacuum_due is None:
        vac = (i + 1) % vacuum_every == 0
    else:
        vac = vacuum_due(since_writes, max(since_rows.values(), default=0), max(taken_rows.values(), default=0))
    if vac:
        since_writes, since_rows = 0, {}
    del src, h, s
    pa.default_memory_pool().release_unused()
    time.sleep(0.2)
    before = anon()
    peak[0] = before
    c0, t0 = time.process_time(), time.monotonic()
    w.write(vacuum=vac)
    c1, t1 = time.process_time(), time.monotonic()
    during = peak[0]
    time.sleep(0.5)
    out.append({"before": before, "peak": during, "after": anon(), "cpu": c1 - c0, "wall": t1 - t0, "vacuum": vac})
stop[0] = True
with open("/proc/self/status") as fh:
    hwm = [int(l.split()[1]) // 1024 for l in fh if l.startswith("VmHWM:")][0]
print(json.dumps({"writes": out, "hwm": hwm, "recorded": w.recorded, "file_bytes": os.path.getsize(db)}))
'''


def prepare(store: Path, work: Path, writes: int, share: float) -> None:
    """Each write's rows of each table as Arrow IPC files (run_id aside): consecutive slices from
    the middle of the recorded run."""
    import duckdb

    if (work / "done.json").exists() and json.loads((work / "done.json").read_text()) == [str(store), writes, share]:
        return
    import pyarrow.ipc as ipc

    con = duckdb.connect(str(store), read_only=True)
    for t in TABLES:
        n = con.sql(f"SELECT count(*) FROM {t}").fetchall()[0][0]
        per = int(n * share)
        for i in range(writes):
            tb = con.sql(f"SELECT * EXCLUDE (run_id) FROM {t} LIMIT {per} OFFSET {n // 4 + i * per}").to_arrow_table()
            with ipc.new_file(str(work / f"w{i}.{t}.arrow"), tb.schema) as fh:
                fh.write_table(tb)
    con.close()
    (work / "done.json").write_text(json.dumps([str(store), writes, share]))


def run_once(code: Path, work: Path, writes: int, vacuum_every: int, sql: str = "") -> dict:
    db = work / f"db-{os.getpid()}.duckdb"
    for p in (db, Path(str(db) + ".wal")):
        p.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(code), "WM_SQL": sql}
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(work), str(db), str(writes), str(vacuum_every),
                           json.dumps(TABLES), str(HAND_OVER)], env=env, capture_output=True, text=True, cwd=code)
    for p in (db, Path(str(db) + ".wal")):
        p.unlink(missing_ok=True)
    if proc.returncode != 0:
        raise SystemExit(f"{code}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("store", type=Path, help="a recorded run's store (read only)")
    ap.add_argument("--writes", type=int, default=6)
    ap.add_argument("--share", type=float, default=5 / 85, help="each write's share of the store's rows")
    ap.add_argument("--code", type=Path, default=None, help="a built checkout to interleave (base)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--work", type=Path, default=None, help="where the rows' IPC files are kept (reused)")
    ap.add_argument("--sql", default="", help="statements run on the writer's DuckDB instance first (settings tried)")
    args = ap.parse_args()
    if args.writes < 1 or not 0 < args.share <= 1 or args.repeats < 1:
        raise SystemExit("write_memory.py: --writes and --repeats at least 1, --share in (0, 1]")
    sys.path.insert(0, str(ROOT))
    from tierdiag.store.writer_process import VACUUM_EVERY

    work = args.work or Path(tempfile.gettempdir()) / "write_memory"
    work.mkdir(parents=True, exist_ok=True)
    prepare(args.store, work, args.writes, args.share)
    sides = [("this", ROOT)] + ([("base", args.code.resolve())] if args.code else [])
    rises: dict[str, list] = {name: [] for name, _ in sides}
    for r in range(args.repeats):
        for name, code in (sides if r % 2 == 0 else sides[::-1]):
            res = run_once(code, work, args.writes, VACUUM_EVERY, args.sql)
            ws = res["writes"]
            print(f"round {r + 1} {name}: recorded {res['recorded']}, process peak (VmHWM) {res['hwm']} MB, "
                  f"load {os.getloadavg()[0]:.1f}")
            for i, x in enumerate(ws):
                print(f"  write {i + 1}{' (vacuum)' if x.get('vacuum', (i + 1) % VACUUM_EVERY == 0) else ''}: before {x['before']} MB,"
                      f" peak {x['peak']} (+{x['peak'] - x['before']}), after {x['after']} MB; cpu {x['cpu']:.2f} s,"
                      f" wall {x['wall']:.2f} s")
            rises[name].append((max(x["peak"] - x["before"] for x in ws), max(x["peak"] for x in ws),
                                sum(x["cpu"] for x in ws), res["hwm"], res.get("file_bytes", 0)))
    for name, vals in rises.items():
        print(f"{name}: largest write's rise median {statistics.median(v[0] for v in vals)} MB, writes' peak "
              f"median {statistics.median(v[1] for v in vals)} MB, writes' CPU median "
              f"{statistics.median(v[2] for v in vals):.2f} s, process peak median {statistics.median(v[3] for v in vals)} MB, "
              f"file {statistics.median(v[4] for v in vals) / 2**20:.1f} MB")


if __name__ == "__main__":
    main()
