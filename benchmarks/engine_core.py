"""The compiled engine core (mypyc; tierdiag/engine/compiled.py) against its Python twin, side by
side in one run (issue 41): `Engine.run` (benchmarks/core.py, no probe and the recorder) and a
whole `tierdiag replay` process, each engine in its own processes, interleaved round by round, with
the plain-Python prefix-LRU floor of the same requests; CPU time (user + system of the process,
which a loaded machine inflates less than wall time), medians.

    .venv/bin/python benchmarks/engine_core.py [--trace FILE] [--requests 2000] [--rounds 3]
                                               [--instructions]

`--instructions`: `Engine.run`'s instructions under cachegrind instead (core.py --instructions, the
trace read taken off), deterministic where timings are noise. Needs the compiled build (setup.py).
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = ROOT / ".." / "shared" / "traces" / "conversation_trace.jsonl"
ENV = "TIERDIAG_PURE_ENGINE"


def _env(pure: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    if pure:
        env[ENV] = "1"
    return env


def _cpu(cmd: list[str], pure: bool) -> tuple[float, str]:
    """(user + system CPU seconds of the child, its stdout)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=_env(pure))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd[:4])}...: exit {proc.returncode}: {proc.stderr.strip()[-800:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), proc.stdout


def _core(trace: Path, requests: int, pure: bool) -> dict[str, float]:
    """core.py's medians of one repeat: Engine.run none / record and the floor (wall seconds of
    the code inside one process: a ratio to its own floor is what survives the machine's phases)."""
    _, out = _cpu([sys.executable, "benchmarks/core.py", "--trace", str(trace), "--requests", str(requests),
                   "--modes", "none,record", "--repeats", "1"] + (["--pure"] if pure else []), pure)
    rows = dict(re.findall(r"^\| (\w+) \| ([\d.]+) s", out, re.M))
    return {k: float(v) for k, v in rows.items()}


def _replay(trace: Path, pure: bool, tmp: Path) -> float:
    db = tmp / ("pure.duckdb" if pure else "compiled.duckdb")
    for p in (db, Path(f"{db}.wal")):
        p.unlink(missing_ok=True)
    cpu, _ = _cpu([sys.executable, "-c", "from tierdiag.cli.main import entry; entry()", "replay", str(trace),
                   "--db", str(db)], pure)
    return cpu


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--instructions", action="store_true")
    args = ap.parse_args(argv)
    trace = args.trace.resolve()
    if not trace.is_file():
        raise SystemExit(f"{trace}: no such trace")
    if args.requests <= 0 or args.rounds <= 0:
        raise SystemExit("--requests and --rounds must be positive")
    if args.instructions:
        counts = {}
        for pure in (False, True):
            _, out = _cpu([sys.executable, "benchmarks/core.py", "--instructions", "--trace", str(trace),
                           "--requests", str(args.requests), "--modes", "none,record"], pure)
            counts[pure] = dict(re.findall(r"^\| (\w+) \| ([\d.]+) G", out, re.M))
        print(f"{trace.name}[:{args.requests}], Engine.run instructions (cachegrind)")
        print("| mode | compiled | pure | pure / compiled |\n|---|---|---|---|")
        for m in ("none", "record"):
            c, p = float(counts[False][m]), float(counts[True][m])
            print(f"| {m} | {c:.3f} G | {p:.3f} G | {p / c:.2f}x |")
        return
    with tempfile.TemporaryDirectory() as tmp:
        head = Path(tmp) / f"{trace.stem}-{args.requests}.jsonl"
        with trace.open() as f, head.open("w") as out:
            for i, line in enumerate(f):
                if i >= args.requests:
                    break
                out.write(line)
        core: dict[bool, list[dict]] = {False: [], True: []}
        replay: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.rounds):  # interleaved: each round runs both engines once each way
            for pure in (False, True):
                core[pure].append(_core(trace, args.requests, pure))
                replay[pure].append(_replay(head, pure, Path(tmp)))
    print(f"{trace.name}[:{args.requests}], medians of {args.rounds} interleaved rounds")
    print("| measure | compiled | pure | pure / compiled |\n|---|---|---|---|")
    for key, label in (("none", "Engine.run, no probe (s)"), ("record", "Engine.run, recorder (s)")):
        c, p = _median([r[key] for r in core[False]]), _median([r[key] for r in core[True]])
        print(f"| {label} | {c:.3f} | {p:.3f} | {p / c:.2f}x |")
    for key in ("none", "record"):
        c = _median([r[key] / r["lru_floor"] for r in core[False]])
        p = _median([r[key] / r["lru_floor"] for r in core[True]])
        print(f"| Engine.run {key} / LRU floor (same process) | {c:.1f}x | {p:.1f}x | |")
    c, p = _median(replay[False]), _median(replay[True])
    print(f"| replay, whole process, probes (CPU s) | {c:.2f} | {p:.2f} | {p / c:.2f}x |")


if __name__ == "__main__":
    main()
