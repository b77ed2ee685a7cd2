"""Where the writer process's CPU goes over a probed replay (issue 41's 1M row: on synth traces the
writer is about as heavy as the engine, beside it on the second vCPU).

    .venv/bin/python benchmarks/writer_cpu.py TRACE [--repeats N] [--baseline DIR] [--profile DIR]
        [--no-probes-too] [--json FILE] [-- REPLAY OPTIONS...]

Runs `tierdiag replay TRACE --db FRESH --json` with the writer forced to its own process
(TIERDIAG_WRITER=process) under probe_timeline.py's launcher, and adds to the writer's hook:

- the process's CPU, its system part and its minor page faults (getrusage at its exit);
- each thread's CPU, its system part and its minor faults: the Python threads (`threading.Thread.run` wrapped: its name, its
  `time.thread_time()` at its end), the main thread at the exit, and every thread the kernel still
  lists then (/proc/self/task: DuckDB's and the allocator's own threads, by what is left);
- CPU by part (thread CPU spent inside, summed; nested parts counted in both): the frames'
  unpickling (`pickle.loads` of the request loop), the rows' decode (`table_columns`), their Arrow
  conversion (`RunWriter.take`), the live pass's hand-over (`_ReadAhead.rows`), each write's
  inserts by table (`RunWriter._append`), its commit and checkpoint (`detach`), the read-ahead's
  parts (`read_trace`'s lines, `page_keys_array`, `_Pages.add` / `add_request`, `_chunk_keys`,
  `_Pages.index`), the live pass's
  (`rows_of`, `LivePass.add_rows`, `advance`, `done`) and the close (`RunWriter.finish`);
- the inbox (writer_serve.Inbox, session 23): the most bytes it held, how often and how long
  the reader thread waited for room (the engine's hand-overs then wait on the pipe);
- with --profile DIR, a cProfile of every Python thread of the writer (one file a thread, last
  round), and the top functions of each printed.

With --baseline DIR (a checkout already built) the same runs of that code are interleaved (the
order flips every round); --no-probes-too adds a `--no-probes` replay of each code to each round.
Printed per run: wall, CPU of both processes, the writer's per-thread and per-part CPU; then
medians. On a loaded machine compare the CPU columns, not the walls.
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import probe_timeline as pt  # noqa: E402  (benchmarks/probe_timeline.py: the launcher and its hooks)

ROOT = HERE.parent

# (module, qualified name, label, index of the argument that names the part, or -1)
PARTS = [
    ("tierdiag.store.columns", "table_columns", "decode", -1),
    ("tierdiag.store.writer", "RunWriter.take", "take", -1),
    ("tierdiag.store.writer", "RunWriter._append", "append:", 1),
    ("tierdiag.store.writer", "RunWriter._write_pending", "write_pending", -1),
    ("tierdiag.store.writer", "RunWriter.write", "write", -1),
    ("tierdiag.store.writer", "RunWriter.finish", "finish", -1),
    ("tierdiag.store.writer", "_vacuum", "vacuum_set", -1),
    ("tierdiag.store.reader", "detach", "detach(checkpoint)", -1),
    ("tierdiag.store.reader", "attach_with_retry", "attach", -1),
    ("tierdiag.diagnose.run.size_curves", "_ReadAhead.rows", "live.hand_over", -1),
    ("tierdiag.diagnose.run.size_curves", "_Pages.add", "ahead.pages_add", -1),
    ("tierdiag.diagnose.run.size_curves", "_Pages.add_request", "ahead.add_request", -1),
    ("tierdiag.diagnose.run.size_curves", "_chunk_keys", "ahead.chunk_keys", -1),
    ("tierdiag.diagnose.run.size_curves", "_Pages._close_chunk", "ahead.close_chunk", -1),
    ("tierdiag.diagnose.run.size_curves", "_Pages._resample", "ahead.resample", -1),
    ("tierdiag.diagnose.run.size_curves", "_Pages.index", "ahead.index", -1),
    ("tierdiag.diagnose.run.size_curves", "_first_distinct", "ahead.first_distinct", -1),
    ("tierdiag.trace.pages", "page_keys_array", "ahead.page_keys", -1),
    ("tierdiag.diagnose.run.live_curves", "rows_of", "live.rows_of", -1),
    ("tierdiag.diagnose.run.live_curves", "LivePass.add_rows", "live.add_rows", -1),
    ("tierdiag.diagnose.run.live_curves", "LivePass.advance", "live.advance", -1),
    ("tierdiag.diagnose.run.live_curves", "LivePass.watermark", "live.watermark", -1),
    ("tierdiag.diagnose.run.live_curves", "LivePass.done", "live.done", -1),
    ("tierdiag.diagnose.run.live_curves", "whole_pass", "close.whole_pass", -1),
    ("tierdiag.diagnose.run.live_curves", "release_freed_heap", "trim", -1),
    ("tierdiag.diagnose.run.evidence", "record_run_evidence", "close.evidence", -1),
    # the folds while recording (story_rows.py's take: the story's, context's, evictions' and the
    # run's scan's parts of each batch) and the serve loop's open and close (session 35)
    ("tierdiag.diagnose.run.story_rows", "StoryRows.take", "fold.take", -1),
    ("tierdiag.diagnose.read.run_context", "taken_story_rows", "fold.story", -1),
    ("tierdiag.diagnose.run.context_rows", "taken_context_rows", "fold.context", -1),
    ("tierdiag.diagnose.run.eviction_rows", "EvictionRows.take", "fold.evictions", -1),
    ("tierdiag.diagnose.run.scan_rows", "ScanRows.take", "fold.scan", -1),
    ("tierdiag.diagnose.run.evidence", "run_scan", "close.run_scan", -1),  # 0 calls: the fold's scan used
    ("tierdiag.store.writer_serve", "_Serve.open", "serve.open", -1),
    ("tierdiag.store.writer_serve", "_Serve.finish", "serve.finish", -1),
]

_CPU = r'''
_ROLE_IS_WRITER = _ROLE == "writer"
import threading as _th, collections as _co
_part_cpu = _co.defaultdict(float)
_part_n = _co.defaultdict(int)
_threads = []  # (name, native id, thread CPU at its end, its minor faults, its system CPU)
import resource as _rs
def _thread_faults():
    try:
        return _rs.getrusage(_rs.RUSAGE_THREAD).ru_minflt
    except (AttributeError, OSError):
        return 0
def _thread_sys():
    try:
        return _rs.getrusage(_rs.RUSAGE_THREAD).ru_stime
    except (AttributeError, OSError):
        return 0.0
_tprof_dir = os.environ.get("TL_THREAD_PROF", "")
if _ROLE_IS_WRITER:
    _orig_run = _th.Thread.run
    def _run(self):
        p = None
        if _tprof_dir:
            import cProfile
            p = cProfile.Profile(time.thread_time) if os.environ.get("TL_PROF_CPU") else cProfile.Profile(); p.enable()
        try:
            return _orig_run(self)
        finally:
            if p is not None:
                p.disable(); p.dump_stats(os.path.join(_tprof_dir, f"thread-{self.name}-{_th.get_native_id()}.prof"))
            _threads.append((self.name, _th.get_native_id(), time.thread_time(), _thread_faults(), _thread_sys()))
    _th.Thread.run = _run
    import pickle as _pk
    _orig_loads = _pk.loads
    class _PickleShim:
        def __getattr__(self, k): return getattr(_pk, k)
        @staticmethod
        def loads(*a, **k):
            c = time.thread_time()
            try:
                return _orig_loads(*a, **k)
            finally:
                _part_cpu["unpickle"] += time.thread_time() - c; _part_n["unpickle"] += 1
def _cpu_wrap(fn, label, argi):
    @functools.wraps(fn)
    def w(*a, **k):
        c = time.thread_time()
        try:
            return fn(*a, **k)
        finally:
            key = label + (str(a[argi]) if argi >= 0 and len(a) > argi else "")
            _part_cpu[key] += time.thread_time() - c; _part_n[key] += 1
    return w
_CPU_PARTS = json.loads(os.environ.get("TL_CPU_PARTS", "[]")) if _ROLE_IS_WRITER else []
_cpu_by_mod = {}
for _m, _q, _l, _i in _CPU_PARTS:
    _cpu_by_mod.setdefault(_m, []).append((_q, _l, _i))
_inboxes = []  # writer_serve.Inbox (session 23): what the bound did
def _inbox_stats():
    return [{"most": b.most, "waits": b.waits, "waited_s": b.waited_s, "limit": b.limit} for b in _inboxes]
_sched = []  # the serve loop's writes and its close: when, how far the run was, what they carried
def _sched_patch(module):
    S = getattr(module, "_Serve", None)
    if S is None:
        return
    def _state(self, kind):
        ib = self.inbox
        return {"kind": kind, "at": time.monotonic(), "taken": getattr(self, "taken", None),
                "expected": getattr(self, "expected", None), "rows": getattr(self, "rows_pending", None),
                "inbox_b": ib.held() if hasattr(ib, "held") else None, "inbox_n": len(getattr(ib, "_items", ()))}
    for name, kind in (("write", "write"), ("finish", "close")):
        fn = S.__dict__.get(name)
        if fn is None:
            continue
        def w(self, *a, _fn=fn, _kind=kind, **k):
            ev = _state(self, _kind); c = time.thread_time()
            try:
                return _fn(self, *a, **k)
            finally:
                ev["wall"] = time.monotonic() - ev["at"]; ev["cpu"] = time.thread_time() - c; _sched.append(ev)
        setattr(S, name, functools.wraps(fn)(w))
def _cpu_patch(module):
    if _ROLE_IS_WRITER and module.__name__ == "tierdiag.store.writer_serve":
        _sched_patch(module)
        module.pickle = _PickleShim()
        if hasattr(module, "loads"):  # (session 28: frames.loads, out-of-band buffers) its own unpickling
            module.loads = _cpu_wrap(module.loads, "unpickle", -1)
        _ib = getattr(module, "Inbox", None)
        if _ib is not None:
            _ib_init = _ib.__init__
            def _init(self, *a, **k):
                _ib_init(self, *a, **k)
                _inboxes.append(self)
            _ib.__init__ = _init
    for qual, label, argi in _cpu_by_mod.get(module.__name__, ()):
        owner, *rest = qual.split(".")
        if rest:
            cls = getattr(module, owner, None)
            if cls is None or rest[0] not in cls.__dict__:
                continue
            raw = cls.__dict__[rest[0]]
            if isinstance(raw, staticmethod):
                setattr(cls, rest[0], staticmethod(_cpu_wrap(raw.__func__, label, argi)))
            else:
                setattr(cls, rest[0], _cpu_wrap(raw, label, argi))
        elif hasattr(module, owner):
            setattr(module, owner, _cpu_wrap(getattr(module, owner), label, argi))
def _tasks():
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/stat") as fh:
                raw = fh.read()
            comm = raw[raw.index("(") + 1:raw.rindex(")")]
            f = raw[raw.rindex(")") + 2:].split()
            out[int(tid)] = (comm, (int(f[11]) + int(f[12])) / tick)
    except OSError:
        pass
    return out
_by_mod = {}
'''

_LOADER_OLD = '''        mark("import:" + module.__name__)
        _patch(module)'''
_LOADER_NEW = '''        mark("import:" + module.__name__)
        _patch(module)
        _cpu_patch(module)'''
_FINDER_OLD = "        if name not in _by_mod:"
_FINDER_NEW = "        if name not in _by_mod and name not in _cpu_by_mod and name != 'tierdiag.store.writer_serve':"
_DUMP_OLD = 'json.dump({"marks": _marks, "cpu_s": ru.ru_utime + ru.ru_stime, "maxrss_kb": ru.ru_maxrss}, fh)'
_DUMP_NEW = ('json.dump({"marks": _marks, "cpu_s": ru.ru_utime + ru.ru_stime, "maxrss_kb": ru.ru_maxrss, '
             '"sys_s": ru.ru_stime, "minflt": ru.ru_minflt, '
             '"main_thread_cpu": time.thread_time(), "main_thread_faults": _thread_faults(), "main_thread_sys": _thread_sys(), '
             '"main_tid": _th.main_thread().native_id, '
             '"threads": _threads, "tasks": _tasks(), "parts": dict(_part_cpu), "part_n": dict(_part_n), "inbox": _inbox_stats(), "sched": _sched}, fh)')


def hook_code() -> str:
    code = pt._HOOK
    for old in ("_by_mod = {}", _LOADER_OLD, _FINDER_OLD, _DUMP_OLD):
        if code.count(old) != 1:
            raise SystemExit(f"probe_timeline's hook changed: {old!r} not found once")
    code = code.replace("_by_mod = {}", _CPU)
    code = code.replace(_LOADER_OLD, _LOADER_NEW).replace(_FINDER_OLD, _FINDER_NEW)
    return code.replace(_DUMP_OLD, _DUMP_NEW)


def run_once(root: Path, trace: Path, tmp: Path, tag: str, extra: list[str], prof_dir: Path | None,
             probes: bool = True) -> dict:
    db = tmp / f"{tag}.duckdb"
    for p in (db, Path(str(db) + ".wal")):
        p.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(root), "TL_ROLE": "main", "TL_OUT": str(tmp / f"{tag}-main.json"),
           "TL_PROF": "", "TL_HOOK_CODE": hook_code(), "TL_CPU_PARTS": json.dumps(PARTS),
           "TL_HOOKS_MAIN": json.dumps(pt.HOOKS_MAIN), "TL_HOOKS_WRITER": json.dumps(pt.HOOKS_WRITER),
           "TL_WRITER_ENTRY": pt._writer_entry(tmp, tag, prof_dir is not None),
           "TL_REAL_ENTRY": "from tierdiag.app.writer_child import main; main()", "TIERDIAG_WRITER": "process",
           "TL_THREAD_PROF": str(prof_dir) if prof_dir else ""}
    args = ["replay", str(trace), "--json", *extra] + (["--db", str(db)] if probes else ["--no-probes"])
    _, wall, cpu_all, _, main, writer = pt.launch(root, args, env, tmp, tag)
    if prof_dir is not None and writer is not None and (tmp / f"{tag}-writer.prof").exists():
        (prof_dir / f"thread-MainThread-{writer['main_tid']}.prof").write_bytes((tmp / f"{tag}-writer.prof").read_bytes())
    for p in (db, Path(str(db) + ".wal")):
        p.unlink(missing_ok=True)
    ends = [t for n, t in main["marks"] if n == "engine_run<"]
    w = None if writer is None else _writer(writer)
    if w is not None:
        # the writes and the close, their times from the engine's end (Engine.run returned: one
        # monotonic clock for both processes)
        end = ends[-1] if ends else None
        w["sched"] = [{**ev, "at": None if end is None else ev["at"] - end} for ev in writer.get("sched") or []]
    return {"wall_s": wall, "cpu_all_s": cpu_all,
            "main_cpu_s": main["cpu_s"], "main_rss_mb": main["maxrss_kb"] / 1024,
            "engine_run_s": _span(main["marks"], "engine_run"),
            "finish_wait_s": _span(main["marks"], "finish_wait"),
            "writer": w}


def _span(marks, label: str) -> float | None:
    s = [t for n, t in marks if n == label + ">"]
    e = [t for n, t in marks if n == label + "<"]
    return e[-1] - s[0] if s and e else None


def _writer(w: dict) -> dict:
    threads = {"MainThread": w["main_thread_cpu"]}
    faults = {"MainThread": w.get("main_thread_faults", 0)}
    system = {"MainThread": w.get("main_thread_sys", 0.0)}
    seen = {w["main_tid"]}
    for name, tid, cpu, *more in w["threads"]:
        threads[name] = threads.get(name, 0.0) + cpu
        faults[name] = faults.get(name, 0) + (more[0] if more else 0)
        system[name] = system.get(name, 0.0) + (more[1] if len(more) > 1 else 0.0)
        seen.add(tid)
    other = 0.0
    for tid, (comm, cpu) in w["tasks"].items():
        if int(tid) not in seen:
            other += cpu
    threads["(native threads alive at exit)"] = other
    return {"cpu_s": w["cpu_s"], "sys_s": w.get("sys_s"), "minflt": w.get("minflt"), "thread_faults": faults,
            "thread_sys": system,
            "rss_mb": w["maxrss_kb"] / 1024, "threads": threads, "parts": w["parts"],
            "part_n": w["part_n"], "close_s": _span(w["marks"], "finish"), "inbox": w.get("inbox") or []}


def report(name: str, r: dict) -> None:
    w = r["writer"]
    line = (f"{name}: wall {r['wall_s']:.1f} s, CPU all {r['cpu_all_s']:.1f} s, main {r['main_cpu_s']:.1f} s"
            f" (Engine.run {r['engine_run_s'] or 0:.1f} s wall)")
    if w is None:
        print(line + " (no writer)")
        return
    print(line + f", writer {w['cpu_s']:.2f} s (sys {w['sys_s'] or 0:.2f} s, {w['minflt'] or 0} minor faults), "
                 f"writer peak {w['rss_mb']:.0f} MB, close {w['close_s'] or 0:.2f} s")
    print("   threads: " + ", ".join(f"{k} {v:.3f}" + (f" (sys {w['thread_sys'][k]:.3f}, {w['thread_faults'][k]} faults)"
                                                         if k in w.get("thread_faults", {}) else "")
                                   for k, v in sorted(w["threads"].items(), key=lambda kv: -kv[1])))
    print(f"   close:   the engine waited {r.get('finish_wait_s') or 0:.3f} s (WriterProcess.finish); "
          + _sched_line(w.get("sched") or []))
    for b in w.get("inbox") or []:
        print(f"   inbox:   most {b['most'] / 2**20:.1f} MB held (limit {b['limit'] / 2**20:.0f} MB), "
              f"{b['waits']} waits for room, {b['waited_s']:.2f} s")
    print("   parts:   " + ", ".join(f"{k} {v:.2f} ({w['part_n'][k]})"
                                     for k, v in sorted(w["parts"].items(), key=lambda kv: -kv[1])))


def close_rows(w: dict) -> int | None:
    """The rows (all tables) the close found pending: written on the path the replay waits for."""
    closes = [ev for ev in w.get("sched") or [] if ev["kind"] == "close"]
    return closes[-1]["rows"] if closes else None


def _sched_line(sched: list) -> str:
    """The writes and the close: at (s from the engine's end), the trace's share taken, rows
    pending, inbox MB, wall / CPU ms."""
    out = []
    for ev in sched:
        share = f"{ev['taken'] / ev['expected']:.0%}" if ev.get("expected") else f"{ev.get('taken')}"
        at = "?" if ev["at"] is None else f"{ev['at']:+.2f}"
        out.append(f"{ev['kind']} {at} s @{share} {ev['rows']} rows inbox {ev['inbox_b'] / 2**20:.1f} MB/"
                   f"{ev['inbox_n']} {ev['wall'] * 1e3:.0f}/{ev['cpu'] * 1e3:.0f} ms")
    writes = sum(ev["kind"] == "write" for ev in sched)
    return f"{writes} mid-run writes; " + "; ".join(out)


def print_profiles(prof_dir: Path, top: int) -> None:
    for f in sorted(prof_dir.glob("thread-*.prof")):
        print(f"\n== {f.name} (top {top} by own time)")
        st = pstats.Stats(str(f))
        st.sort_stats("tottime").print_stats(top)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", type=Path)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--baseline", type=Path, default=None, help="a built checkout, run in the same rounds")
    ap.add_argument("--profile", type=Path, default=None, help="cProfile every writer thread (last round) here")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--no-probes-too", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    a = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    roots = [("this", ROOT)] + ([("base", a.baseline)] if a.baseline else [])
    keys = [(n, root, True) for n, root in roots]
    if a.no_probes_too:
        keys += [(n + ":no-probes", root, False) for n, root in roots]
    runs: dict[str, list] = {k[0]: [] for k in keys}
    with tempfile.TemporaryDirectory(prefix="tierdiag-wcpu-") as td:
        for rnd in range(a.repeats):
            for name, root, probes in (keys if rnd % 2 == 0 else keys[::-1]):
                prof = None
                if a.profile is not None and rnd == a.repeats - 1 and probes:
                    prof = a.profile / name
                    prof.mkdir(parents=True, exist_ok=True)
                    for old in prof.glob("*.prof"):
                        old.unlink()
                r = run_once(root, a.trace, Path(td), f"{name.replace(':', '_')}{rnd}", extra, prof, probes)
                runs[name].append(r)
                report(f"round {rnd + 1} {name}", r)
                sys.stdout.flush()
    with open("/proc/loadavg") as fh:
        print("load average at the end:", " ".join(fh.read().split()[:3]))
    for name, rs in runs.items():
        med = lambda f: statistics.median(f(r) for r in rs)  # noqa: E731
        line = f"{name}: medians wall {med(lambda r: r['wall_s']):.1f} s, CPU all {med(lambda r: r['cpu_all_s']):.1f} s"
        if rs[0]["writer"] is not None:
            line += (f", writer CPU {med(lambda r: r['writer']['cpu_s']):.3f} s "
                     f"(sys {med(lambda r: r['writer']['sys_s'] or 0):.3f} s, "
                     f"{med(lambda r: r['writer']['minflt'] or 0):.0f} minor faults), "
                     f"writer peak {med(lambda r: r['writer']['rss_mb']):.0f} MB")
            rng = lambda f: (f"{statistics.median(f(r) for r in rs):.3f} "  # noqa: E731
                             f"({min(f(r) for r in rs):.3f}..{max(f(r) for r in rs):.3f})")
            line += (f"\n   the engine's wait for the close {rng(lambda r: r['finish_wait_s'] or 0)} s, "
                     f"rows at the close {rng(lambda r: close_rows(r['writer']) or 0)}, "
                     f"mid-run writes {rng(lambda r: sum(e['kind'] == 'write' for e in r['writer'].get('sched') or []))}, "
                     f"wall {rng(lambda r: r['wall_s'])} s, writer CPU {rng(lambda r: r['writer']['cpu_s'])} s")
        print(line)
    if a.profile is not None:
        for name, _, probes in keys:
            if probes:
                print_profiles(a.profile / name, a.top)
    if a.json:
        a.json.write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
