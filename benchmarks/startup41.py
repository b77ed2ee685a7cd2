"""A replay's start-up and its trace read (issue 41's floor row, session 19 h41start): this
checkout against a baseline, in the same rounds.

    .venv/bin/python benchmarks/startup41.py [TRACE] [--baseline REF|DIR] [--rounds N] [--instructions]

Measured, each code's own process, interleaved (the order flips every round), medians and minima:

- `startup probes` / `startup no-probes`: the engine's process CPU (user + sys, getrusage) from the
  interpreter's start to the first call of `Engine.run`, of `tierdiag replay TRACE --db FRESH --json`
  (TIERDIAG_WRITER=process: the store written by its own process, as on a quiet machine) and of
  `--no-probes`. A launcher wraps `Engine.run` when tierdiag.engine.engine is imported (an import
  hook: nothing is imported earlier than the command would) and ends the process there.
- `read`: `list(read_trace(TRACE))` (block size 512) in a fresh process, CPU of the best of 3 passes.
- `--instructions`: the same two under valgrind's cachegrind (deterministic; a loaded machine
  cannot move them): the start-up of `--no-probes` to `Engine.run`, and the read alone (a process
  that reads the trace, less one that only imports the reader); and (session 25) `writer start`:
  a replay's writer process from its interpreter's start to the end of its `open` (its entry,
  app/writer_child.py, as the replay starts it: its imports, the store created in a fresh file
  and the runs row written, the close's modules preloaded, the while-recording feeds made), its
  work before its first take, which runs beside the engine's first steps. The harness opens it
  without a trace path (no read-ahead thread, no line count: a thread cut short at the exit would
  make the count vary).

Every module's bytecode is compiled first in both checkouts (whatever PYTHONDONTWRITEBYTECODE says).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from probe_timeline import baseline_worktree  # noqa: E402

CONVERSATION = ROOT / ".." / "shared" / "traces" / "conversation_trace.jsonl"

# The hooks are plain finders (find_spec is all sys.meta_path asks for): importlib.abc would
# import importlib.resources, tempfile, shutil, bz2, lzma and random, which a replay does not
# (~20 M instructions counted in both codes before session 25).
LAUNCHER = r"""
import os, sys, resource, importlib.machinery
class Hook:
    def find_spec(self, name, path, target=None):
        if name != "tierdiag.engine.engine":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        load = spec.loader.exec_module
        def exec_module(mod):
            load(mod)
            def run(self, requests):
                ru = resource.getrusage(resource.RUSAGE_SELF)
                sys.__stderr__.write(f"STARTUP_CPU {ru.ru_utime + ru.ru_stime:.6f}\n")
                sys.__stderr__.flush()
                os._exit(0)
            mod.Engine.run = run
        spec.loader.exec_module = exec_module
        return spec
sys.meta_path.insert(0, Hook())
sys.argv = ["tierdiag", *sys.argv[1:]]
from tierdiag.cli.main import entry
entry()
"""

WRITER = r"""
import os, sys, importlib.machinery
class Hook:
    def find_spec(self, name, path, target=None):
        if name != "tierdiag.store.writer_serve":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        load = spec.loader.exec_module
        def exec_module(mod):
            load(mod)
            def opened_only(after_commit=None, preload=(), while_recording=None):
                serve = mod._Serve(None, os.open(os.devnull, os.O_WRONLY), after_commit=after_commit,
                                   preload=preload, while_recording=while_recording)
                run = {"db_path": sys.argv[1], "run_id": "startup41", "name": "startup41", "trace_path": None,
                       "trace_sha256": "", "config": {"page_size": 64, "block_size": 512}, "hardware": {},
                       "data_plane": {}, "timing": "model", "command_line": ["tierdiag", "replay"], "pid": 1}
                assert serve.open({"writer": run, "write_every_s": 5.0, "flush_every_s": 5.0})
                os._exit(0)
            mod.main = opened_only
        spec.loader.exec_module = exec_module
        return spec
sys.meta_path.insert(0, Hook())
from tierdiag.app.writer_child import main
main()
"""

READER = r"""
import sys, time
from tierdiag.trace.reader import read_trace
if sys.argv[1] == "read":
    best = None
    for _ in range(int(sys.argv[3])):
        t0 = time.process_time()
        list(read_trace(sys.argv[2], block_size=512))
        t = time.process_time() - t0
        best = t if best is None else min(best, t)
    print(f"READ_CPU {best:.6f}")
"""


def _env(code: Path) -> dict:
    # The piped progress line's first print (10 s after the start: Rich's console, the token
    # split's imports) landed inside a start-up that valgrind on a loaded machine stretched past
    # 10 s of wall, adding ~90 M instructions to both codes as the load rose (session 25): the
    # lines a day apart here, as a start-up of ~0.1 s never reaches its first.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TIERDIAG_WRITER")}
    return {**env, "PYTHONPATH": str(code), "OPENBLAS_NUM_THREADS": "1", "TIERDIAG_PROGRESS_EVERY_S": "86400"}


def startup_cpu(code: Path, trace: Path, tmp: Path, probes: bool) -> float:
    db = tmp / "startup.duckdb"
    for p in tmp.glob("startup.duckdb*"):
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    args = [sys.executable, "-c", LAUNCHER, "replay", str(trace), "--json"]
    args += ["--db", str(db)] if probes else ["--no-probes"]
    env = {**_env(code), **({"TIERDIAG_WRITER": "process"} if probes else {})}
    proc = subprocess.run(args, cwd=tmp, env=env, capture_output=True, text=True)
    found = re.search(r"STARTUP_CPU ([\d.]+)", proc.stderr)
    if found is None:
        raise SystemExit(f"{code}: the replay did not reach Engine.run: {proc.stderr.strip()[-500:]}")
    return float(found.group(1))


def read_cpu(code: Path, trace: Path, tmp: Path) -> float:
    proc = subprocess.run([sys.executable, "-c", READER, "read", str(trace), "3"], cwd=tmp, env=_env(code),
                          capture_output=True, text=True)
    found = re.search(r"READ_CPU ([\d.]+)", proc.stdout)
    if found is None:
        raise SystemExit(f"{code}: the read failed: {proc.stderr.strip()[-500:]}")
    return float(found.group(1))


def instructions(code: Path, trace: Path, tmp: Path) -> dict[str, int]:
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")

    def count(*args: str) -> int:
        out = tmp / "cg.out"
        proc = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}",
                               sys.executable, *args], cwd=tmp, env=_env(code), capture_output=True, text=True)
        found = re.search(r"I\s+refs:\s+([\d,]+)", proc.stderr)
        if found is None:
            raise SystemExit(f"{code}: failed under valgrind: {proc.stderr.strip()[-500:]}")
        return int(found.group(1).replace(",", ""))

    for p in tmp.glob("writer.duckdb*"):
        p.unlink()
    return {"startup no-probes": count("-c", LAUNCHER, "replay", str(trace), "--json", "--no-probes"),
            "read": count("-c", READER, "read", str(trace), "1") - count("-c", READER, "import", str(trace), "1"),
            "writer start": count("-c", WRITER, str(tmp / "writer.duckdb"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", type=Path, nargs="?", default=CONVERSATION)
    ap.add_argument("--baseline", default=None, help="a git ref (a detached worktree, built) or a built checkout's folder")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--instructions", action="store_true")
    a = ap.parse_args()
    trace = a.trace.resolve()
    with tempfile.TemporaryDirectory(prefix="tierdiag-startup41-") as td:
        tmp = Path(td)
        codes = [("this", ROOT)]
        if a.baseline:
            codes.insert(0, ("baseline", baseline_worktree(a.baseline, tmp)))
        for _, code in codes:
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(code / "tierdiag")], check=True,
                           capture_output=True, env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"})
            # The tables of dataclass methods (cli/dataclass_code.py: the replay's own since session
            # 23), as `make setup` or a first run writes them, where the checkout has them.
            if (code / "tierdiag" / "cli" / "dataclass_code.py").is_file():
                subprocess.run([sys.executable, "-m", "tierdiag.cli.dataclass_code"], cwd=code, check=True,
                               capture_output=True, env=_env(code))
        rows: dict[tuple[str, str], list[float]] = {}
        for r in range(a.rounds):
            for name, code in (codes if r % 2 == 0 else codes[::-1]):
                rows.setdefault((name, "startup probes"), []).append(startup_cpu(code, trace, tmp, True))
                rows.setdefault((name, "startup no-probes"), []).append(startup_cpu(code, trace, tmp, False))
                rows.setdefault((name, "read"), []).append(read_cpu(code, trace, tmp))
        print(f"{trace.name}, {a.rounds} rounds, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(f"{'measure':<20} {'code':<10} {'CPU median':>11} {'CPU min':>9}")
        for what in ("startup probes", "startup no-probes", "read"):
            for name, _ in codes:
                v = rows[(name, what)]
                print(f"{what:<20} {name:<10} {statistics.median(v) * 1e3:>9.1f} ms {min(v) * 1e3:>6.1f} ms")
        if a.instructions:
            print(f"{'instructions':<20} " + " ".join(f"{name:>16}" for name, _ in codes))
            counts = {name: instructions(code, trace, tmp) for name, code in codes}
            for what in ("startup no-probes", "read", "writer start"):
                print(f"{what:<20} " + " ".join(f"{counts[name][what]:>16,}" for name, _ in codes))
        if a.baseline and not Path(a.baseline).is_dir():
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(codes[0][1])], capture_output=True)


if __name__ == "__main__":
    main()
