"""What holds the writer process's memory over a probed replay (issue 41's 1M row: <= 1 GB).

    .venv/bin/python benchmarks/writer_memory.py TRACE [--repeats N] [--baseline DIR] [--json FILE]
        [--every S] [-- REPLAY OPTIONS...]

Runs `tierdiag replay TRACE --db FRESH --json` with the writer forced to its own process
(TIERDIAG_WRITER=process), under probe_timeline.py's launcher (its hooks: each function of
interest marked at its start and end), and records in both processes the resident set
(/proc/self/status VmRSS) at every mark and every `--every` seconds (a sampler thread), and in the
writer DuckDB's own accounting (`duckdb_memory()`, by tag) just before each detach of the store
(store/reader.py `detach`: the checkpoint of each write, and the close's). tracemalloc cannot see
DuckDB's nor numpy's C allocations; the resident set sees everything.

Printed per run: each process's peak (VmHWM: the kernel's), the writer's resident set at its
marks (the writes, the read-ahead, the live pass, the close's sections) and DuckDB's memory at each
detach, and the samples' peak with the mark before it. With --baseline DIR (a checkout already
built) the same runs of that code are interleaved. Peak RSS of the whole replay as scale.py measures
it (os.wait4's ru_maxrss of the replay) is the larger of the two processes', not their sum:
the kernel keeps the largest of a process's and its reaped children's peaks.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import probe_timeline as pt  # noqa: E402  (benchmarks/probe_timeline.py: the launcher and its hooks)

ROOT = HERE.parent

# What this script adds to probe_timeline's hook: a mark carries the resident set; a sampler
# thread; DuckDB's memory before each detach.
_MEMORY = r'''
def _rss():
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return -1
def _hwm():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) // 1024
    return -1
def mark(name): _marks.append((name, time.monotonic(), _rss()))
_samples = []
_duck = []
if _ROLE == "writer" and os.environ.get("TL_MALLOPT"):  # glibc settings tried in the writer: "param:value,..."
    import ctypes
    for _kv in os.environ["TL_MALLOPT"].split(","):
        _k, _v = _kv.split(":")
        ctypes.CDLL("libc.so.6").mallopt(int(_k), int(_v))
def _sample():
    every = float(os.environ.get("TL_EVERY", "0.25"))
    while True:
        _samples.append((time.monotonic(), _rss()))
        time.sleep(every)
import threading as _threading
_threading.Thread(target=_sample, daemon=True, name="tl-rss").start()
_plain_wrap = None
'''

_DETACH = r'''
_plain_wrap = _wrap
def _wrap(fn, label):
    if label != "detach":
        return _plain_wrap(fn, label)
    def w(host, *a, **k):
        if os.environ.get("TL_DUCK_SQL") and not _duck:  # settings tried on the writer's instance
            for stmt in os.environ["TL_DUCK_SQL"].split(";"):
                if stmt.strip():
                    host.execute(stmt)
        try:
            rows = host.execute("SELECT tag, memory_usage_bytes, temporary_storage_bytes FROM duckdb_memory()").fetchall()
            _duck.append((time.monotonic(), _rss(), {t: [int(m), int(s)] for t, m, s in rows if m or s}))
        except Exception as exc:
            _duck.append((time.monotonic(), _rss(), {"error": str(exc)[:200]}))
        mark("detach>")
        try:
            return fn(host, *a, **k)
        finally:
            mark("detach<")
            if os.environ.get("TL_TRIM"):  # how much of the resident set is freed heap kept by malloc
                import ctypes
                ctypes.CDLL("libc.so.6").malloc_trim(0)
                mark("trimmed")
    return w
_by_mod = {}
'''

_DUMP_OLD = 'json.dump({"marks": _marks, "cpu_s": ru.ru_utime + ru.ru_stime, "maxrss_kb": ru.ru_maxrss}, fh)'
_DUMP_NEW = ('json.dump({"marks": _marks, "cpu_s": ru.ru_utime + ru.ru_stime, "maxrss_kb": ru.ru_maxrss, '
             '"hwm_mb": _hwm(), "samples": _samples, "duck": _duck}, fh)')


def hook_code() -> str:
    code = pt._HOOK
    old_mark = "def mark(name): _marks.append((name, time.monotonic()))"
    for old in (old_mark, "_by_mod = {}", _DUMP_OLD):
        if code.count(old) != 1:
            raise SystemExit(f"probe_timeline's hook changed: {old!r} not found once")
    code = code.replace(old_mark, _MEMORY)
    code = code.replace("_by_mod = {}", _DETACH)
    return code.replace(_DUMP_OLD, _DUMP_NEW)


HOOKS_WRITER = pt.HOOKS_WRITER + [
    ("tierdiag.store.reader", "detach", "detach"),
    ("tierdiag.diagnose.run.size_curves", "_Pages.index", "pages_index"),
    ("tierdiag.diagnose.run.live_curves", "LivePass.done", "live_done"),
    ("tierdiag.diagnose.run.live_curves", "LivePass.results", "live_results"),
    ("tierdiag.diagnose.run.size_curves", "compute_size_curves", "ev.curves"),
    ("tierdiag.diagnose.run.evidence", "run_story", "ev.story"),
    ("tierdiag.diagnose.run.size_curves", "curve_columns", "ev.curve_columns"),
    ("tierdiag.diagnose.run.size_curves", "found_tokens", "ev.found_tokens"),
    ("tierdiag.diagnose.run.size_curves", "_matched", "ev.matched"),
    ("tierdiag.diagnose.run.evidence", "release_cached_blocks", "release_blocks"),
]


def run_once(root: Path, trace: Path, tmp: Path, tag: str, extra: list[str], every: float, trim: bool = False) -> dict:
    db = tmp / f"{tag}.duckdb"
    for p in (db, Path(str(db) + ".wal")):
        p.unlink(missing_ok=True)
    code = hook_code()
    env = {**os.environ, "PYTHONPATH": str(root), "TL_ROLE": "main", "TL_OUT": str(tmp / f"{tag}-main.json"),
           "TL_PROF": "", "TL_HOOK_CODE": code, "TL_EVERY": str(every),
           "TL_HOOKS_MAIN": json.dumps(pt.HOOKS_MAIN), "TL_HOOKS_WRITER": json.dumps(HOOKS_WRITER),
           "TL_WRITER_ENTRY": pt._writer_entry(tmp, tag, False),
           "TL_REAL_ENTRY": "from tierdiag.app.writer_child import main; main()", "TIERDIAG_WRITER": "process"}
    if trim:
        env["TL_TRIM"] = "1"
    for side in ("main", "writer"):
        (tmp / f"{tag}-{side}.json").unlink(missing_ok=True)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", "import os; exec(os.environ['TL_HOOK_CODE'])", "replay", str(trace),
                           "--json", "--db", str(db), *extra], cwd=root, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    main = json.loads((tmp / f"{tag}-main.json").read_text())
    writer = json.loads((tmp / f"{tag}-writer.json").read_text())
    return {"wall_s": wall, "main": _side(main, t0), "writer": _side(writer, t0), "db": str(db)}


def _side(d: dict, t0: float) -> dict:
    return {"cpu_s": d["cpu_s"], "maxrss_mb": d["maxrss_kb"] / 1024, "hwm_mb": d["hwm_mb"],
            "marks": [(m[0], m[1] - t0, m[2] if len(m) > 2 else -1) for m in d["marks"]],
            "samples": [(t - t0, r) for t, r in d["samples"]],
            "duck": [(t - t0, r, tags) for t, r, tags in d["duck"]]}


def _mb(tags: dict) -> str:
    if "error" in tags:
        return tags["error"]
    total = sum(v[0] for v in tags.values()) / 1e6
    top = sorted(tags.items(), key=lambda kv: -kv[1][0])[:3]
    return f"{total:.0f} MB (" + ", ".join(f"{k} {v[0] / 1e6:.0f}" for k, v in top) + ")"


def report(name: str, r: dict, full: bool) -> None:
    w, m = r["writer"], r["main"]
    peak_t, peak = max(w["samples"], key=lambda s: s[1]) if w["samples"] else (0.0, 0)
    before = [mk for mk in w["marks"] if mk[1] <= peak_t]
    print(f"{name}: wall {r['wall_s']:.1f} s; CPU main {m['cpu_s']:.1f} s writer {w['cpu_s']:.1f} s; peak RSS "
          f"(ru_maxrss) main {m['maxrss_mb']:.0f} MB writer {w['maxrss_mb']:.0f} MB; writer's sampled peak {peak} MB "
          f"at {peak_t:.1f} s, after mark {before[-1][0] if before else '-'}")
    if not full:
        return
    print("  writer marks (s from the spawn, VmRSS MB):")
    for n, t, rss in w["marks"]:
        if n.startswith("import:") or n.startswith("take"):
            continue
        print(f"    {t:8.2f} {rss:6d}  {n}")
    print("  DuckDB before each detach (s, VmRSS MB, duckdb_memory()):")
    for t, rss, tags in w["duck"]:
        print(f"    {t:8.2f} {rss:6d}  {_mb(tags)}")
    xs = w["samples"]
    step = max(1, len(xs) // 40)
    print("  writer samples (s, VmRSS MB), every " + str(step) + ":  " +
          "  ".join(f"{t:.0f}:{rss}" for t, rss in xs[::step]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", type=Path)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--baseline", type=Path, default=None, help="a built checkout, run in the same rounds")
    ap.add_argument("--every", type=float, default=0.25, help="seconds between samples")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--brief", action="store_true", help="one line a run")
    ap.add_argument("--trim", action="store_true",
                    help="malloc_trim(0) after each detach (a measurement: the freed heap glibc keeps)")
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    a = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    a.extra = extra
    roots = [("this", ROOT)] + ([("base", a.baseline)] if a.baseline else [])
    runs: dict[str, list] = {n: [] for n, _ in roots}
    with tempfile.TemporaryDirectory(prefix="tierdiag-wmem-") as td:
        for rnd in range(a.repeats):
            for name, root in (roots if rnd % 2 == 0 else roots[::-1]):
                r = run_once(root, a.trace, Path(td), f"{name}{rnd}", a.extra, a.every, a.trim)
                runs[name].append(r)
                report(f"round {rnd + 1} {name}", r, not a.brief)
                sys.stdout.flush()
    with open("/proc/loadavg") as fh:
        print("load average at the end:", " ".join(fh.read().split()[:3]))
    for name, rs in runs.items():
        print(f"{name}: writer peak RSS median {statistics.median(r['writer']['maxrss_mb'] for r in rs):.0f} MB, "
              f"main {statistics.median(r['main']['maxrss_mb'] for r in rs):.0f} MB, "
              f"writer CPU {statistics.median(r['writer']['cpu_s'] for r in rs):.1f} s, "
              f"wall {statistics.median(r['wall_s'] for r in rs):.1f} s")
    if a.json:
        a.json.write_text(json.dumps(runs))


if __name__ == "__main__":
    main()
