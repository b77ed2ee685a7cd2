"""Instructions, not seconds: what a C data-plane pair buys, counted by valgrind's cachegrind
(deterministic, so a shared, noisy machine does not blur a 1-2 % difference).

    .venv/bin/python benchmarks/instructions.py [--requests 3000] [--trace FILE] [--pairs a,b]
                                                [--checkout DIR ...]

Pairs: `Engine.run` on the first --requests requests of the trace (read beforehand, no probes),
in one process per variant under `valgrind --tool=cachegrind --cache-sim=no`: the named pairs on
their reference, each alone on its compiled side, then all of them compiled (every other pair
stays compiled throughout); and the trace read alone (the fixed cost, taken off every other count
so the ratios are of Engine.run). Pairs are native/cplane.py's names, those in BINDINGS.

Checkouts: `tierdiag replay HEAD --no-probes` (the same first requests) by each --checkout's code
(built in place, as benchmarks/run.py builds a baseline), the whole process counted: how a
replay compares across commits. Needs valgrind (`apt-get install valgrind`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = ROOT / ".." / "shared" / "traces" / "conversation_trace.jsonl"
DEFAULT_PAIRS = ("pagemap.PageMap.set_many", "pages.block_page_keys")

# Where each pair is bound for its callers: an attribute read at call time (a class's method,
# a module global looked up by its own module), so rebinding it switches the engine's side.
BINDINGS = {
    "pagemap.PageMap.set_many": ("tierdiag.engine.pagemap", "PageMap", "set_many"),
    "pages.block_page_keys": ("tierdiag.trace.pages", None, "block_page_keys"),
}

_DRIVER = """
import gc, importlib, json, sys
from pathlib import Path
from tierdiag.native import cplane
from tierdiag.config.engine import EngineConfig
from tierdiag.engine.engine import Engine
from tierdiag.trace.reader import ReadReport, read_trace
trace, bindings, compiled, run = sys.argv[1], json.loads(sys.argv[2]), set(json.loads(sys.argv[3])), sys.argv[4] == "run"
if cplane.C is None:
    raise SystemExit(f"the compiled data plane is not available: {cplane.WHY_NOT}")
for name, (module, cls, attr) in bindings.items():
    holder = importlib.import_module(module)
    holder = getattr(holder, cls) if cls else holder
    c, ref = cplane.pairs()[name]
    setattr(holder, attr, c if name in compiled else ref)
cfg = EngineConfig()
reqs = list(read_trace(Path(trace), block_size=cfg.block_size, skip_bad=False, report=ReadReport()))
gc.set_threshold(50_000, 20, 100)  # as a replay sets it
if run:
    import tempfile
    with tempfile.TemporaryDirectory() as storage:
        Engine(cfg, storage_dir=storage).run(reqs)
"""


def _head(trace: Path, n: int, tmp: Path) -> Path:
    out = tmp / f"{trace.stem}_head{n}.jsonl"
    with trace.open() as src, out.open("w") as dst:
        for i, line in enumerate(src):
            if i >= n:
                break
            dst.write(line)
    return out


def _count(cmd: list[str], *, cwd: Path, tmp: Path) -> int:
    """Instructions (cachegrind's I refs) of `cmd`, its children not counted."""
    out = tmp / "cg.out"
    proc = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}", *cmd],
                          cwd=cwd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(cwd)})
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd[:3])}... failed under valgrind: {proc.stderr.strip().splitlines()[-1:]}")
    found = re.search(r"I\s+refs:\s+([\d,]+)", proc.stderr)
    if found is None:
        raise SystemExit(f"no instruction count in valgrind's output: {proc.stderr[-300:]}")
    return int(found.group(1).replace(",", ""))


def count_pairs(trace: Path, pairs: list[str], tmp: Path) -> list[dict]:
    unknown = [p for p in pairs if p not in BINDINGS]
    if unknown:
        raise SystemExit(f"--pairs: {', '.join(unknown)} not among {', '.join(BINDINGS)}")
    bindings = json.dumps({p: BINDINGS[p] for p in pairs})

    def one(compiled: list[str], run: bool = True) -> int:
        return _count([sys.executable, "-c", _DRIVER, str(trace), bindings, json.dumps(compiled),
                       "run" if run else "read"], cwd=ROOT, tmp=tmp)

    fixed = one([], run=False)
    reference = one([]) - fixed
    rows = [{"variant": "these pairs on their reference", "engine_run_instructions": reference, "vs_reference": 1.0}]
    for compiled in [[p] for p in pairs] + ([pairs] if len(pairs) > 1 else []):
        n = one(compiled) - fixed
        rows.append({"variant": " + ".join(compiled) + " compiled", "engine_run_instructions": n,
                     "vs_reference": n / reference})
    return rows


def count_checkouts(trace: Path, checkouts: list[Path], tmp: Path) -> list[dict]:
    rows = []
    for root in checkouts:
        db = tmp / "replay.duckdb"
        for stale in (db, db.with_suffix(".duckdb.wal")):
            stale.unlink(missing_ok=True)
        n = _count([sys.executable, "-c", "from tierdiag.cli.main import main; main()", "replay", str(trace),
                    "--no-probes", "--db", str(db), "--json"], cwd=root, tmp=tmp)
        rows.append({"checkout": str(root), "replay_instructions": n, "vs_first": n / rows[0]["replay_instructions"]
                     if rows else 1.0})
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--pairs", default=",".join(DEFAULT_PAIRS), help="cplane pair names, comma-separated")
    ap.add_argument("--checkout", type=Path, action="append", default=[],
                    help="count `replay --no-probes` by this checkout's code instead (repeatable)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    tmp = Path(tempfile.mkdtemp(prefix="tierdiag-instructions-"))
    try:
        trace = _head(args.trace.resolve(), args.requests, tmp)
        if args.checkout:
            rows = count_checkouts(trace, [c.resolve() for c in args.checkout], tmp)
        else:
            rows = count_pairs(trace, [p for p in args.pairs.split(",") if p], tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    key = "replay_instructions" if args.checkout else "engine_run_instructions"
    for r in rows:
        ratio = r.get("vs_first", r.get("vs_reference"))
        print(f"| {r.get('checkout', r.get('variant'))} | {r[key] / 1e9:.3f} G | {ratio:.3f} |")


if __name__ == "__main__":
    main()
