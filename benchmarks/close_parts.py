"""The writer process's close, part by part, on a recorded run (issue 41's probe overhead: the
close is what a probed replay waits for after `Engine.run`), this tree against a baseline's code,
interleaved.

    .venv/bin/python benchmarks/close_parts.py RUN.duckdb [--baseline REF_OR_BUILT_FOLDER] [--rounds N]
        [--last 0.3] [--settle 8]

Each round runs one process per side. A process makes a fresh store with a `RunWriter` and hands
it the recorded run's rows as the writer process does (its collector thresholds, switch interval
and preloaded close modules; `take` in 20 batches, the size curves'
read-ahead handed each batch as `writer_serve` hands it, a write every 4 batches), all but the
last `--last` of them committed; it waits `--settle` seconds (the read-ahead's thread reads the
trace and walks the pass, as while the engine runs), hands the last two batches (the engine's last
flushes) and closes the run through `writer_serve._Serve.finish` with the replay's close hook
(app/writer_child.py's: the run evidence, the closing numbers). Measured in the close, as the CPU
of the thread that ran each part (a quiet machine's wall, where each thread has a core, is about
that): the last rows' write (`write_pending`), the evidence's threads (run context, its story
where it has a thread of its own, the summary and the other sections, the session pauses (a
thread of their own since session 20; in `rest`'s thread before), the size curves), the
evidence's write, the closing numbers, the file's let-go (detach: the checkpoint); the close's
process CPU and wall (what the load leaves, on a loaded machine). `model` is the close a 2-core
quiet machine would take by these parts: the serial parts plus the evidence's longest thread (its
parts' CPU summed by the thread that ran them) or half its threads' CPU, whichever is more (threads without the GIL, DuckDB's queries mostly);
`model_answer` the same up to the answer the engine's process waits for (the detach left out where
it comes after it: session 25), `answer` the wall to that answer.
Printed: medians over the rounds.
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

# The start of each measuring process (close_parts.py's and writer_writes.py's): the recorded
# run's rows (`load_run`), one of `n` batches of them as the writer takes them (`batch`), and
# `timed` (a function's thread CPU added to `parts` under a label, its calls to `calls`; `also`,
# if given, is told each (label, CPU)).
PRELUDE = r"""
import json, os, sys, threading, time
import duckdb

def load_run(src):
    with duckdb.connect(src, read_only=True) as s:
        run = s.sql("SELECT * FROM runs").to_arrow_table().to_pylist()[0]
        tables = {t: s.sql(f"SELECT * EXCLUDE (run_id) FROM {t} ORDER BY rowid").to_arrow_table()
                  for t in ("requests", "batches", "evictions", "pool_samples", "request_evictions", "transfers")}
    return run, tables

def batch(tables, i, n):
    out = {}
    for t, a in tables.items():
        lo, hi = a.num_rows * i // n, a.num_rows * (i + 1) // n
        out[t] = {c: a.column(c).slice(lo, hi - lo).combine_chunks() for c in a.column_names}
    return out

parts, calls = {}, {}

def timed(owner, name, label, also=None):
    f = getattr(owner, name)
    def g(*a, **k):
        c = time.thread_time()
        try:
            return f(*a, **k)
        finally:
            dt = time.thread_time() - c
            parts[label] = parts.get(label, 0.0) + dt
            calls[label] = calls.get(label, 0) + 1
            if also is not None:
                also(label, dt)
    setattr(owner, name, g)
"""

_CLOSE = PRELUDE + r"""
from tierdiag.store.writer import RunWriter
import tierdiag.store.writer as W
from tierdiag.store import writer_serve
from tierdiag.diagnose.run import close
from tierdiag.diagnose.run import evidence as E
from tierdiag.diagnose.run.size_curves import read_ahead

src, dst, last, settle = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
# As the writer process runs (writer_serve.main: its collector thresholds and switch interval; the
# close hook's modules imported while the engine runs, `close.PRELOAD`, session 23): without them
# the parts counted the collector's passes and the engine's rule sets' import (~8 ms of the context).
import gc, importlib
gc.set_threshold(50_000, 20, 100)
sys.setswitchinterval(0.001)
for name in getattr(close, "PRELOAD", ()):
    importlib.import_module(name)
run, tables = load_run(src)
config = json.loads(run["config_json"])
w = RunWriter(dst, name=run["name"], trace_path=run["trace_path"], trace_sha256=run["trace_sha256"], config=config,
              hardware=json.loads(run["hardware_json"]), data_plane=json.loads(run["data_plane_json"]),
              timing=run["timing"])
try:  # what the writer process starts while recording (its close's preparations), as writer_child passes it
    from tierdiag.app.writer_child import while_recording
    on_rows = while_recording({"run_id": w.run_id, "trace_path": run["trace_path"],
                               "trace_sha256": run["trace_sha256"], "config": config})
except ImportError:
    on_rows = read_ahead(run["trace_path"], run["trace_sha256"], config)
N, LAST = 20, 2
cut = int(N * (1 - last))

def hand(i):
    taken = w.take(batch(tables, i, N))
    if on_rows is not None:
        on_rows(taken)

for i in range(N - LAST):
    hand(i)
    if i < cut and (i % 4 == 3 or i == cut - 1):
        w.write()
time.sleep(settle)
for i in range(N - LAST, N):
    hand(i)
threads = {}  # the evidence's parts' CPU by the thread that ran them (the model's threads)
EVIDENCE = ("context", "story", "rest", "sessions", "curves", "lookup")

def by_thread(label, dt):
    if label in EVIDENCE:
        ident = threading.get_ident()
        threads[ident] = threads.get(ident, 0.0) + dt

timed(W.RunWriter, "_write_pending", "write_pending")
timed(W, "detach", "detach")
real_detach = W.detach

def detach_at(*a, **k):  # when the let-go began (after the answer since session 25: not waited for)
    parts.setdefault("detach_at", time.perf_counter() - t0)
    return real_detach(*a, **k)

W.detach = detach_at
timed(E, "write_evidence", "ev_write")
timed(close, "closing_numbers", "closing")
if hasattr(E, "begin_run_evidence"):  # the request lookup's rows beside the sections (session 21); in ev_write before
    timed(E, "begin_run_evidence", "lookup", by_thread)
for name, label in [("compute_run_context", "context"), ("size_curves", "curves"), ("compute_run_summary", "rest"),
                    ("run_totals", "rest"), ("session_summary", "rest"), ("rank_summary", "rest"),
                    ("run_miss_reasons", "rest"), ("session_pauses", "sessions"), ("run_story", "story"),
                    ("folded_rows", "story")]:  # the folds' check and results, on the story's thread
    if hasattr(E, name):
        timed(E, name, label, by_thread)
r, wfd = os.pipe()
serve = writer_serve._Serve(inbox=None, reply_fd=wfd, after_commit=close.after_commit)
serve.writer, serve.on_rows = w, on_rows
real_reply = serve.reply

def reply(msg):  # the answer the engine's process waits for: the close's wall to it
    parts["answer"] = time.perf_counter() - t0
    return real_reply(msg)

serve.reply = reply
t0, c0 = time.perf_counter(), time.process_time()
assert serve.finish({"status": "complete", "error": None, "write_pending": True, "trace_sha256": None})
parts["wall"], parts["cpu"] = time.perf_counter() - t0, time.process_time() - c0
parts["threads"] = sorted(threads.values(), reverse=True)
print(json.dumps(parts))
os._exit(0)
"""

KEYS = ("write_pending", "context", "story", "rest", "sessions", "curves", "lookup", "ev_write", "closing", "detach")


def _model(p: dict) -> float:
    # The evidence's threads as they ran: the parts' CPU summed by the thread that ran them (the
    # session pauses have a thread of their own since session 20; a baseline before it runs them
    # on the rest's).
    threads = p["threads"] or [0.0]
    serial = p.get("write_pending", 0.0) + p.get("ev_write", 0.0) + p.get("closing", 0.0) + p.get("detach", 0.0)
    return serial + max(max(threads), sum(threads) / 2)


def _model_answer(p: dict) -> float:
    # `_model` up to the answer: the detach left out where it began after it (session 25).
    after = p.get("answer") is not None and p.get("detach_at", 0.0) >= p["answer"]
    return _model(p) - (p.get("detach", 0.0) if after else 0.0)


def interleaved(baseline: str | None, rounds: int, tmp: Path, measure) -> dict[str, list[dict]]:
    """{side: [measure(name, root, round) of each round]}: "baseline" (a git ref or a built
    checkout's folder, where given) and "this", their order flipped every round."""
    sides = [("this", ROOT)]
    if baseline:
        sides.insert(0, ("baseline", baseline_worktree(baseline, tmp)))
    got: dict[str, list[dict]] = {name: [] for name, _ in sides}
    for i in range(rounds):
        for name, root in (sides if i % 2 == 0 else sides[::-1]):
            got[name].append(measure(name, root, i))
    return got


def run_in(root: Path, code: str, *args) -> dict:
    """`python -c code args` on the code of `root`; the JSON its last line prints."""
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code, *map(str, args)], cwd=root,
                         env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def print_medians(got: dict[str, list[dict]], cols, what: str, fmt: str = "13.4f") -> None:
    rounds = len(next(iter(got.values())))
    print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; medians of {rounds} "
          f"interleaved rounds, {what}\n")
    print(f"{'code':>9} " + " ".join(f"{c:>13}" for c in cols))
    for name, rows in got.items():
        print(f"{name:>9} " + " ".join(f"{statistics.median(r.get(c, 0.0) for r in rows):{fmt}}" for c in cols))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path, help="a store holding one recorded replay (its trace still there)")
    ap.add_argument("--baseline", default=None, help="a git ref or a built checkout's folder, timed in the same rounds")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--last", type=float, default=0.3, help="share of the rows still pending at the close")
    ap.add_argument("--settle", type=float, default=8.0, help="seconds the read-ahead gets before the close")
    a = ap.parse_args()

    def measure(name: str, root: Path, i: int) -> dict:
        p = run_in(root, _CLOSE, a.run, tmp / f"{name}-{i}.duckdb", a.last, a.settle)
        p["model"] = _model(p)
        p["model_answer"] = _model_answer(p)
        print(f"round {i + 1} {name}: " + " ".join(f"{k} {v:.4f}" for k, v in p.items() if k != "threads")
              + " threads " + " ".join(f"{t:.4f}" for t in p["threads"]), flush=True)
        return p

    with tempfile.TemporaryDirectory(prefix="tierdiag-close-") as td:
        tmp = Path(td)
        got = interleaved(a.baseline, a.rounds, tmp, measure)
    print_medians(got, (*KEYS, "model", "model_answer", "cpu", "answer", "wall"), "thread CPU per part (s)")


if __name__ == "__main__":
    main()
