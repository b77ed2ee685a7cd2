"""The writer process's mid-run writes split by DuckDB call (issue 41, probe overhead: the writes
were ~0.36 s of the writer's ~1.3 s of CPU on the conversation trace; session 36, h46writes).

    .venv/bin/python benchmarks/write_split.py CAPTURE [--rounds N] [--baseline DIR] [--close]
        [--json FILE]

CAPTURE is a pickle of what one replay's writer process took and when it wrote, made by
running the replay with `PYTHONPATH=benchmarks/capture_writes` (that folder's
sitecustomize.py) and `H46_CAPTURE=FILE` in the environment, `TIERDIAG_WRITER=process`:
[("open", arg), ("take", {table: {column: Arrow array}}), ..., ("write", {"vacuum": bool}),
..., ("finish", arg)].

Each round runs, in a fresh process of each code (this checkout's, and with --baseline that
checkout's, the order flipped every round), a `RunWriter` as the writer process opens it
(`let_rows_go=True`) on a fresh store, its taken batches handed to it as captured (no take:
the Arrow arrays as the writer made them), and each captured write made as `_Serve.write`
makes it (`RunWriter.write(vacuum=...)`), then, with --close, the close's write
(`RunWriter.finish`, no hook). Every DuckDB call on the writer's connection is timed
(`time.thread_time`: the connection runs on one DuckDB thread, the caller's) and booked by its
statement (ATTACH, USE, SET/RESET name, BEGIN, insert:TABLE, COMMIT, CHECKPOINT, DETACH, ...);
what the write's own Python costs is its thread CPU less its calls'. Printed: each write's
split, the sums over the writes by call, and medians over rounds.
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

_CHILD = r'''
import json, os, pickle, sys, time, collections
from pathlib import Path
cap_path, out_path, db_path, close = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
log = pickle.load(open(cap_path, "rb"))
from tierdiag.store import writer as W
from tierdiag.store.writer_serve import _Serve
cpu = collections.defaultdict(float)   # by call, this write
calls = collections.defaultdict(int)


def _key(sql):
    words = sql.split()
    head = words[0].upper() if words else ""
    if head in ("SET", "RESET") and len(words) > 1:
        return head + " " + words[1]
    return head


class Rel:
    def __init__(self, rel): self.rel = rel
    def insert_into(self, table):
        t = time.thread_time()
        try:
            return self.rel.insert_into(table)
        finally:
            cpu["insert:" + table] += time.thread_time() - t; calls["insert:" + table] += 1
    def __getattr__(self, k): return getattr(self.rel, k)


class Con:
    def __init__(self, con): self.con = con
    def execute(self, sql, *a, **k):
        key = _key(sql)
        t = time.thread_time()
        try:
            return self.con.execute(sql, *a, **k)
        finally:
            cpu[key] += time.thread_time() - t; calls[key] += 1
    def from_arrow(self, *a, **k):
        t = time.thread_time()
        try:
            return Rel(self.con.from_arrow(*a, **k))
        finally:
            cpu["from_arrow"] += time.thread_time() - t; calls["from_arrow"] += 1
    def __getattr__(self, k): return getattr(self.con, k)


opened = log[0][1]
t0 = time.thread_time()
w = W.RunWriter(**{**opened["writer"], "db_path": db_path}, let_rows_go=True)
open_cpu = time.thread_time() - t0
w._host = Con(w._host)
writes = []
for kind, arg in log[1:]:
    if kind == "take":
        w._pending.append(arg)
    elif kind == "write":
        cpu.clear(); calls.clear()
        t = time.thread_time()
        w.write(vacuum=arg["vacuum"])
        total = time.thread_time() - t
        writes.append({"vacuum": arg["vacuum"], "total": total, "cpu": dict(cpu), "calls": dict(calls)})
    elif kind == "finish" and close:
        cpu.clear(); calls.clear()
        t = time.thread_time()
        w.finish(arg["status"], error=arg["error"], write_pending=arg["write_pending"],
                 trace_sha256=arg["trace_sha256"], release=False, let_go_later=True)
        w.let_go()
        total = time.thread_time() - t
        writes.append({"close": True, "total": total, "cpu": dict(cpu), "calls": dict(calls)})
json.dump({"open": open_cpu, "writes": writes, "file": os.path.getsize(db_path),
           "process_cpu": time.process_time()}, open(out_path, "w"))
'''


def run_once(code: Path, cap: Path, tmp: Path, tag: str, close: bool) -> dict:
    db = tmp / f"{tag}.duckdb"
    out = tmp / f"{tag}.json"
    for p in (db, Path(str(db) + ".wal")):
        p.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(code)}
    subprocess.run([str(code / ".venv/bin/python"), "-c", _CHILD, str(cap), str(out), str(db), "1" if close else "0"],
                   check=True, env=env, cwd=code)
    return json.loads(out.read_text())


def _split(res: dict) -> tuple[dict, float, float]:
    """The mid-run writes' CPU by call, summed; their total; the Python left (total less calls)."""
    by: dict[str, float] = {}
    total = 0.0
    for wr in res["writes"]:
        if wr.get("close"):
            continue
        total += wr["total"]
        for k, v in wr["cpu"].items():
            by[k] = by.get(k, 0.0) + v
    return by, total, total - sum(by.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("capture", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", type=Path, default=None)
    ap.add_argument("--close", action="store_true", help="the close's write too (RunWriter.finish, no hook)")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    codes = {"this": ROOT}
    if a.baseline is not None:
        codes["base"] = a.baseline.resolve()
    runs: dict[str, list[dict]] = {k: [] for k in codes}
    with tempfile.TemporaryDirectory(prefix="write_split-") as td:
        tmp = Path(td)
        for r in range(a.rounds):
            order = list(codes) if r % 2 == 0 else list(codes)[::-1]
            for k in order:
                res = run_once(codes[k], a.capture.resolve(), tmp, f"{k}{r}", a.close)
                runs[k].append(res)
                by, total, rest = _split(res)
                each = " ".join(f"{w['total'] * 1e3:.1f}{'v' if w.get('vacuum') else ''}{'c' if w.get('close') else ''}"
                                for w in res["writes"])
                print(f"round {r + 1} {k}: mid-run writes {total * 1e3:.1f} ms (each, ms: {each}), "
                      f"Python {rest * 1e3:.1f} ms, file {res['file'] / 1e6:.2f} MB")
                print("   " + ", ".join(f"{kk} {v * 1e3:.1f}" for kk, v in sorted(by.items(), key=lambda kv: -kv[1])))
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for k, rs in runs.items():
        splits = [_split(r) for r in rs]
        keys = sorted({kk for s in splits for kk in s[0]}, key=lambda kk: -statistics.median(s[0].get(kk, 0.0) for s in splits))
        print(f"{k}: medians over {len(rs)} rounds (ms): mid-run writes {statistics.median(s[1] for s in splits) * 1e3:.1f} "
              f"(min {min(s[1] for s in splits) * 1e3:.1f}, max {max(s[1] for s in splits) * 1e3:.1f}), "
              f"Python {statistics.median(s[2] for s in splits) * 1e3:.1f}")
        print("   " + ", ".join(f"{kk} {statistics.median(s[0].get(kk, 0.0) for s in splits) * 1e3:.1f}" for kk in keys))
        if a.close:
            closes = [w["total"] for r in rs for w in r["writes"] if w.get("close")]
            print(f"   the close's write (finish, no hook, and let_go): {statistics.median(closes) * 1e3:.1f} ms")
    if a.json:
        a.json.write_text(json.dumps(runs))


if __name__ == "__main__":
    sys.exit(main())
