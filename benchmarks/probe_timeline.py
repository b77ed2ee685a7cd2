"""Where a probed replay's extra time goes, whole process (issue 41's probe overhead): a
timeline of both processes, the CPU of each, and optionally a cProfile of each.

    .venv/bin/python benchmarks/probe_timeline.py TRACE [--repeats N] [--modes process,none,inline]
        [--profile DIR] [--json FILE] [--baseline REF] [-- REPLAY OPTIONS...]

Each round runs `tierdiag replay TRACE --db FRESH --json` once per mode, interleaved (the order
flips every round): `process` (probes, TIERDIAG_WRITER=process: what a quiet machine picks),
`inline` (probes, TIERDIAG_WRITER=inline: what a loaded one picks) and `none` (`--no-probes`).
With --baseline REF the code of git ref REF (a detached worktree under the temporary folder)
runs the same modes in the same rounds, each mode then named `REF:mode`.

Nothing in tierdiag is changed for this: the command runs under a small launcher that wraps the
functions of interest as their modules are imported (an import hook, so nothing is imported
earlier than the command would) and records `time.monotonic()` (one clock for both processes)
at their start and end; the writer process is started through the same launcher (the replay's
`writer_child.ENTRY` is swapped for one that installs the hook first). Each process writes its
marks, its own CPU (getrusage at os._exit) and, with --profile, its cProfile to the temporary
folder. Printed: per mode the medians of wall (from before the spawn to the reap), the main
process's CPU, the writer's CPU, and of every mark's offset from the spawn; then the median
timeline of the first mode; then (with --profile) the top functions of each process's profile
of the last round.

On a loaded machine prefer the CPU columns and the medians: the marks' offsets move with the load.
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
ROOT = HERE.parent

# The hook: (module, qualified name, label). A function is wrapped when its module is imported;
# a generator function's first `next` and its end are marked too.
HOOKS_MAIN = [
    ("tierdiag.cli.main", "entry", "cli"),
    ("tierdiag.app.replay", "replay", "replay"),
    ("tierdiag.app.replay", "twin_dp", "twin_dp"),
    ("tierdiag.paths", "check_output", "check_output"),
    ("tierdiag.app.replay", "_open_run", "open_run"),
    ("tierdiag.app.replay", "_result", "result"),
    ("tierdiag.app.replay", "_close_storage", "close_storage"),
    ("tierdiag.app.replay_writers", "WriterInProcess.start", "writer_spawn"),
    ("tierdiag.app.replay_writers", "InlineWriter.open", "writer_open"),
    ("tierdiag.app.replay_writers", "WriterInProcess.open", "writer_open"),
    ("tierdiag.app.replay_writers", "InlineWriter.close", "close"),
    ("tierdiag.app.replay_writers", "WriterInProcess.finished", "reap"),
    ("tierdiag.app.replay_writers", "InlineWriter.numbers", "numbers"),
    ("tierdiag.store.writer_process", "WriterProcess.finish", "finish_wait"),
    # the writer reaped at this process's exit (atexit, WriterProcess._reap): the wait for its exit
    ("tierdiag.store.writer_process", "exits_within", "reap_wait"),
    ("tierdiag.store.writer", "RunWriter.__init__", "store_open"),
    ("tierdiag.store.writer", "RunWriter.finish", "finish"),
    ("tierdiag.store.writer", "RunWriter.write", "write"),
    ("tierdiag.probes.recorder", "Recorder.flush", "flush"),
    ("tierdiag.engine.engine", "Engine.__init__", "engine_init"),
    ("tierdiag.engine.engine", "Engine.run", "engine_run"),
    ("tierdiag.trace.reader", "read_trace", "trace"),
    ("tierdiag.diagnose.run.evidence", "record_run_evidence", "evidence"),
    ("tierdiag.diagnose.run.close", "closing_numbers", "closing_numbers"),
]
HOOKS_WRITER = [
    ("tierdiag.store.writer_serve", "main", "serve"),
    ("tierdiag.store.writer_serve", "_Serve.open", "open"),
    ("tierdiag.store.writer_serve", "_Serve.finish", "finish"),
    ("tierdiag.store.writer_serve", "_Serve.let_go", "let_go"),
    ("tierdiag.store.writer", "RunWriter.__init__", "store_open"),
    ("tierdiag.store.writer", "RunWriter.write", "write"),
    ("tierdiag.store.writer", "RunWriter.take", "take"),
    ("tierdiag.store.writer", "RunWriter._write_pending", "write_pending"),
    ("tierdiag.diagnose.run.evidence", "record_run_evidence", "evidence"),
    ("tierdiag.diagnose.run.evidence", "compute_evidence", "ev.compute"),
    ("tierdiag.diagnose.run.evidence", "compute_run_summary", "ev.summary"),
    ("tierdiag.diagnose.run.evidence", "run_totals", "ev.totals"),
    ("tierdiag.diagnose.run.evidence", "session_summary", "ev.session_summary"),
    ("tierdiag.diagnose.run.evidence", "rank_summary", "ev.ranks"),
    ("tierdiag.diagnose.run.evidence", "run_miss_reasons", "ev.miss_reasons"),
    ("tierdiag.diagnose.run.evidence", "session_pauses", "ev.session_pauses"),
    ("tierdiag.diagnose.run.evidence", "size_curves", "ev.size_curves"),
    ("tierdiag.diagnose.run.evidence", "compute_run_context", "ev.context"),
    ("tierdiag.diagnose.run.evidence", "write_evidence", "ev.write"),
    ("tierdiag.diagnose.run.close", "closing_numbers", "closing_numbers"),
    ("tierdiag.diagnose.run.size_curves", "_ReadAhead._read", "trace_read_ahead"),
    ("tierdiag.diagnose.run.size_curves", "_taken_ahead", "ev.taken_ahead"),
    # The pass fed while recording (live_curves.py): whole_pass marked means the close walked it all.
    ("tierdiag.diagnose.run.size_curves", "_ReadAhead._feed_live", "live_pass"),
    ("tierdiag.diagnose.run.size_curves", "_pass", "ev.pass"),
    ("tierdiag.diagnose.run.live_curves", "LivePass.verify", "ev.verify"),
    ("tierdiag.diagnose.run.live_curves", "whole_pass", "ev.whole_pass"),
]

# Runs first in each process: installs the hook, then runs the process's own code. argv:
# [marks file, profile file or "", role, then the command's argv (main) / nothing (writer)].
_HOOK = r"""
import json, os, sys, time, importlib.abc, importlib.machinery, functools, inspect, resource
_T = time.monotonic()
_OUT, _PROF, _ROLE = os.environ["TL_OUT"], os.environ.get("TL_PROF", ""), os.environ["TL_ROLE"]
_HOOKS = json.loads(os.environ["TL_HOOKS_" + _ROLE.upper()])
_marks = [("start", _T)]
def mark(name): _marks.append((name, time.monotonic()))
_prof = None
if _PROF:
    import cProfile
    # TL_PROF_CPU=1: each function's thread CPU, not its wall (a loaded machine's waits left out)
    _prof = cProfile.Profile(time.thread_time) if os.environ.get("TL_PROF_CPU") else cProfile.Profile(); _prof.enable()
def _wrap(fn, label):
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def gen(*a, **k):
            it = fn(*a, **k); first = True
            mark(label + ">")
            for x in it:
                if first:
                    mark(label + ".first"); first = False
                yield x
            mark(label + "<")
        return gen
    @functools.wraps(fn)
    def w(*a, **k):
        mark(label + ">")
        try:
            return fn(*a, **k)
        finally:
            mark(label + "<")
    return w
_by_mod = {}
for mod, qual, label in _HOOKS:
    _by_mod.setdefault(mod, []).append((qual, label))
def _patch(module):
    for qual, label in _by_mod.get(module.__name__, ()):
        owner, *rest = qual.split(".")
        if rest:
            cls = getattr(module, owner, None)
            if cls is not None and rest[0] in cls.__dict__:
                setattr(cls, rest[0], _wrap(cls.__dict__[rest[0]], label))
        elif hasattr(module, owner):
            setattr(module, owner, _wrap(getattr(module, owner), label))
class _Loader(importlib.abc.Loader):
    def __init__(self, inner): self.inner = inner
    def create_module(self, spec): return self.inner.create_module(spec)
    def exec_module(self, module):
        self.inner.exec_module(module)
        mark("import:" + module.__name__)
        _patch(module)
class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _by_mod:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec
sys.meta_path.insert(0, _Finder())
_real_exit = os._exit
def _dump():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    mark("exit")
    if _prof is not None:
        _prof.disable(); _prof.dump_stats(_PROF)
    with open(_OUT, "w") as fh:
        json.dump({"marks": _marks, "cpu_s": ru.ru_utime + ru.ru_stime, "maxrss_kb": ru.ru_maxrss}, fh)
def _exit(code):
    _dump(); _real_exit(code)
os._exit = _exit
if _ROLE == "main":
    import atexit
    atexit.register(_dump)  # an ordinary exit (a command that does not leave early)
    # The writer starts through this hook too: its entry, swapped when the module loads.
    _by_mod.setdefault("tierdiag.app.writer_child", [])
    _orig_patch = _patch
    def _patch(module):
        if module.__name__ == "tierdiag.app.writer_child":
            module.ENTRY = os.environ["TL_WRITER_ENTRY"]
        _orig_patch(module)
    sys.argv = ["tierdiag"] + sys.argv[1:]
    from tierdiag.cli.main import entry
    entry()
else:
    exec(os.environ["TL_REAL_ENTRY"])
"""


def _writer_entry(tmp: Path, tag: str, prof: bool) -> str:
    """The writer's `python -c` code: the hook, with its own output files, then the real entry."""
    out, pf = tmp / f"{tag}-writer.json", (tmp / f"{tag}-writer.prof") if prof else ""
    return (f"import os; os.environ['TL_ROLE']='writer'; os.environ['TL_OUT']={str(out)!r}; "
            f"os.environ['TL_PROF']={str(pf)!r}; exec(os.environ['TL_HOOK_CODE'])")


def run_once(root: Path, trace: Path, mode: str, tmp: Path, tag: str, extra: list[str], prof: bool) -> dict:
    db = tmp / f"{tag}.duckdb"
    for p in (db, Path(str(db) + ".wal")):
        p.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(root), "TL_ROLE": "main", "TL_OUT": str(tmp / f"{tag}-main.json"),
           "TL_PROF": str(tmp / f"{tag}-main.prof") if prof else "", "TL_HOOK_CODE": _HOOK,
           "TL_HOOKS_MAIN": json.dumps(HOOKS_MAIN), "TL_HOOKS_WRITER": json.dumps(HOOKS_WRITER),
           "TL_WRITER_ENTRY": _writer_entry(tmp, tag, prof),
           "TL_REAL_ENTRY": "from tierdiag.app.writer_child import main; main()"}
    args = ["replay", str(trace), "--json", *extra]
    if mode == "none":
        args += ["--no-probes"]
        env.pop("TIERDIAG_WRITER", None)
    else:
        args += ["--db", str(db)]
        env["TIERDIAG_WRITER"] = mode
    proc, wall, cpu_all, t0, main, writer = launch(root, args, env, tmp, tag, mode)
    out = json.loads(proc.stdout[proc.stdout.index("{"):])
    marks = [(f"main {n}", t - t0) for n, t in main["marks"]]
    if writer is not None:
        marks += [(f"writer {n}", t - t0) for n, t in writer["marks"]]
    marks.sort(key=lambda m: m[1])
    return {"mode": mode, "wall_s": wall, "cpu_all_s": cpu_all,
            "cpu_main_s": main["cpu_s"], "cpu_writer_s": writer["cpu_s"] if writer else 0.0,
            "rss_main_mb": main["maxrss_kb"] / 1024, "rss_writer_mb": writer["maxrss_kb"] / 1024 if writer else 0.0,
            "replay_wall_s": out.get("wall_s"), "phases": out.get("wall_phases"), "writer": out.get("writer"),
            "marks": marks, "db": str(db)}


def launch(root: Path, args: list[str], env: dict, tmp: Path, tag: str, what: str = "replay"):
    """Run the command under the hook: (process, wall, CPU of it and its children, the start's
    monotonic time, the main process's marks file read, the writer's or None)."""
    import resource

    for side in ("main", "writer"):
        (tmp / f"{tag}-{side}.json").unlink(missing_ok=True)
    c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", "import os; exec(os.environ['TL_HOOK_CODE'])", *args],
                          cwd=root, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{what}: exit {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    main = json.loads((tmp / f"{tag}-main.json").read_text())
    wpath = tmp / f"{tag}-writer.json"
    writer = json.loads(wpath.read_text()) if wpath.exists() else None
    return proc, wall, (c1.ru_utime + c1.ru_stime) - (c0.ru_utime + c0.ru_stime), t0, main, writer


def _median_marks(runs: list[dict]) -> list[tuple[str, float]]:
    """Each mark's median offset over the runs (a mark made several times: each occurrence by its
    rank, e.g. the 3rd `write>` of each run)."""
    per: dict[tuple[str, int], list[float]] = {}
    for r in runs:
        seen: dict[str, int] = {}
        for name, t in r["marks"]:
            k = seen.get(name, 0)
            seen[name] = k + 1
            per.setdefault((name, k), []).append(t)
    out = [(f"{name}" + (f" #{k + 1}" if k else ""), statistics.median(ts)) for (name, k), ts in per.items()
           if len(ts) * 2 > len(runs)]
    return sorted(out, key=lambda m: m[1])


def baseline_worktree(ref: str, tmp: Path) -> Path:
    """A detached worktree of `ref` under `tmp`, its C data plane built (made once; evidence_close.py too).
    `ref` may be the folder of a checkout already built (then used as it is, never removed)."""
    if Path(ref).is_dir():
        return Path(ref)
    path = tmp / f"baseline-{ref.replace('/', '_')}"
    if not path.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), ref], check=True,
                       capture_output=True)
        subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace", "-q"], cwd=path, check=True,
                       capture_output=True)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", type=Path)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--modes", default="process,none")
    ap.add_argument("--profile", type=Path, default=None, help="keep each process's cProfile (last round) here")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--baseline", default=None, help="a git ref, timed in the same rounds")
    ap.add_argument("--timeline", action="store_true", help="print every mode's median timeline")
    ap.add_argument("extra", nargs="*", help="more replay options (after --)")
    a = ap.parse_args()
    modes = a.modes.split(",")
    with tempfile.TemporaryDirectory(prefix="tierdiag-timeline-") as td:
        tmp = Path(td)
        roots = [("", ROOT)]
        if a.baseline:
            roots.insert(0, (f"{a.baseline}:", baseline_worktree(a.baseline, tmp)))
        for _, root in roots:  # as after a first run: every module's bytecode cached (whatever
            # PYTHONDONTWRITEBYTECODE says), or each process compiles its imports again (~0.3 s)
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(root / "tierdiag")], check=True,
                           capture_output=True, env={k: v for k, v in os.environ.items()
                                                     if k != "PYTHONDONTWRITEBYTECODE"})
            if (root / "tierdiag" / "cli" / "dataclass_code.py").is_file():  # its tables of dataclass methods, likewise
                subprocess.run([sys.executable, "-m", "tierdiag.cli.dataclass_code"], cwd=root, check=True,
                               capture_output=True, env={**os.environ, "PYTHONPATH": str(root)})
        keys = [(p, root, m) for p, root in roots for m in modes]
        runs: dict[str, list[dict]] = {p + m: [] for p, _, m in keys}
        try:
            _rounds(a, keys, runs, tmp)
        finally:
            if a.baseline and not Path(a.baseline).is_dir():  # the worktree goes with the temporary folder: unregister it too
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(roots[0][1])],
                               capture_output=True)
        _print(a, roots, runs)


def _rounds(a, keys, runs: dict, tmp: Path) -> None:
    for rnd in range(a.repeats):
        order = keys if rnd % 2 == 0 else keys[::-1]
        for prefix, root, mode in order:
            name = prefix + mode
            tag = name.replace(":", "_").replace("/", "_")
            prof = a.profile is not None and rnd == a.repeats - 1
            r = run_once(root, a.trace, mode, tmp, tag, a.extra, prof)
            runs[name].append(r)
            print(f"round {rnd + 1} {name:>16}: wall {r['wall_s']:.3f} s, CPU main {r['cpu_main_s']:.3f} "
                  f"writer {r['cpu_writer_s']:.3f} (all {r['cpu_all_s']:.3f}) s; peak RSS main {r['rss_main_mb']:.0f} "
                  f"writer {r['rss_writer_mb']:.0f} MB; in-process {r['replay_wall_s']:.3f} s "
                  f"{ {k: round(v, 3) for k, v in (r['phases'] or {}).items()} }", file=sys.stderr, flush=True)
            if prof:
                a.profile.mkdir(parents=True, exist_ok=True)
                for side in ("main", "writer"):
                    src = tmp / f"{tag}-{side}.prof"
                    if src.exists():
                        (a.profile / f"{tag}-{side}.prof").write_bytes(src.read_bytes())


def _print(a, roots, runs: dict) -> None:
    with open("/proc/loadavg") as fh:
        load = fh.read().split()[:3]
    print(f"\nload average at the end: {' '.join(load)}; medians of {a.repeats} interleaved rounds\n")
    print(f"{'mode':>16} {'wall':>7} {'CPU all':>8} {'main':>7} {'writer':>7} {'in-proc':>8}")
    med = {}
    for name, rs in runs.items():
        m = {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "cpu_all_s", "cpu_main_s", "cpu_writer_s",
                                                              "replay_wall_s")}
        med[name] = m
        print(f"{name:>16} {m['wall_s']:7.3f} {m['cpu_all_s']:8.3f} {m['cpu_main_s']:7.3f} {m['cpu_writer_s']:7.3f} "
              f"{m['replay_wall_s']:8.3f}")
    for prefix, _ in roots:
        p, n = med.get(prefix + "process"), med.get(prefix + "none")
        if p and n:
            print(f"{prefix or 'this'} probe overhead (process vs none): wall {p['wall_s'] / n['wall_s']:.2f}x, "
                  f"CPU {p['cpu_all_s'] / n['cpu_all_s']:.2f}x")
    for name, rs in runs.items():
        if not a.timeline and name != next(iter(runs)):
            continue
        print(f"\ntimeline of {name} (median offset from the spawn, s):")
        for mark, t in _median_marks(rs):
            if mark.split()[1].startswith("import:") and "main import:tierdiag.engine" not in mark:
                continue
            print(f"  {t:7.3f}  {mark}")
    if a.json:
        a.json.write_text(json.dumps({"runs": runs, "medians": med, "load": load}, indent=1))


if __name__ == "__main__":
    main()
