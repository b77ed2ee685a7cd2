"""The probes' cost on the engine's core, in CPU seconds (issue 41's probe-overhead row, the
engine side): `Engine.run` of one checkout or several (`--code`, e.g. main's worktree and this
one, each built in place), each mode in a fresh process, the rounds interleaved (the order of
the checkouts flips every round), CPU time (`time.process_time`) around `Engine.run` and the
recorder's last hand-over, so that a loaded machine's waits are not counted. Medians.

    .venv/bin/python benchmarks/recording.py [--trace FILE] [--requests N] [--rounds 3]
                                             [--code DIR ...] [--modes none,record,...]
                                             [--storage-tokens N]

Modes are benchmarks/core.py's: `none` (no probe), `record` (the recorder, its hand-overs
dropped: the engine's own cost of the probes), `arrow` (the hand-overs made the store's Arrow
columns on this thread: what the writer process adds to ingest them, short of DuckDB).
Instruction counts (deterministic) are core.py's `--instructions --code BASE`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT_TRACE = ROOT / ".." / "shared" / "traces" / "conversation_trace.jsonl"


def run_mode(code: Path, mode: str, trace: Path, requests: int | None, overrides: dict,
             extra_env: dict | None = None) -> dict:
    """One mode of `code`'s engine in a fresh process: core.py's instruction-count driver, which
    prints the run's CPU and wall seconds and whether its engine core was compiled (`extra_env`:
    e.g. core.pin's BENCH_PIN)."""
    from benchmarks.core import _DRIVER

    driver = _DRIVER.format(root=str(ROOT), code=str(code), trace=str(trace), requests=requests,
                            overrides=dict(overrides))
    env = {**os.environ, "PYTHONPATH": f"{code}:{ROOT}", "OPENBLAS_NUM_THREADS": "1", **(extra_env or {})}
    proc = subprocess.run([sys.executable, "-c", driver, mode], cwd=code, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise SystemExit(f"{code} {mode}: {proc.stderr.strip().splitlines()[-3:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if out["core"] != "compiled":
        raise SystemExit(f"{code}: the engine core is not compiled ({out['core']}): build it in place first")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--code", type=Path, action="append", default=None,
                    help="a checkout whose engine to time (repeatable; default: this one)")
    ap.add_argument("--modes", default="none,record")
    ap.add_argument("--storage-tokens", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.rounds < 1 or (args.requests is not None and args.requests < 1):
        raise SystemExit("--rounds and --requests must be positive")
    modes = [m for m in args.modes.split(",") if m]
    from benchmarks.core import MODES

    if not modes or any(m not in MODES for m in modes):
        raise SystemExit(f"--modes: a comma-separated list of {', '.join(MODES)} (benchmarks/core.py)")
    codes = [c.resolve() for c in (args.code or [ROOT])]
    overrides = {} if args.storage_tokens is None else {"storage_tokens": args.storage_tokens}
    trace = args.trace.resolve()
    cpu: dict[tuple[str, str], list[float]] = {(str(c), m): [] for c in codes for m in modes}
    for r in range(args.rounds):
        for code in (codes if r % 2 == 0 else codes[::-1]):
            for mode in (modes if r % 2 == 0 else modes[::-1]):
                cpu[(str(code), mode)].append(run_mode(code, mode, trace, args.requests, overrides)["cpu"])
    med = {k: sorted(v)[len(v) // 2] for k, v in cpu.items()}
    print(f"{trace.name}{f'[:{args.requests}]' if args.requests else ''}, {args.rounds} interleaved rounds, "
          f"CPU seconds of Engine.run (+ the last hand-over), medians; load average {os.getloadavg()[0]:.1f}")
    print("| code | " + " | ".join(modes) + " | " + " | ".join(f"{m} / none" for m in modes if m != "none") + " |")
    print("|---|" + "---|" * (len(modes) + sum(m != "none" for m in modes)))
    for code in codes:
        row = [f"{med[(str(code), m)]:.3f} s ({' / '.join(f'{x:.2f}' for x in cpu[(str(code), m)])})" for m in modes]
        base = med.get((str(code), "none"))
        ratios = [f"{med[(str(code), m)] / base:.3f}x" if base else "n/a" for m in modes if m != "none"]
        print(f"| {code.name} | " + " | ".join(row) + " | " + " | ".join(ratios) + " |")
    if args.json:
        print(json.dumps({f"{c}|{m}": v for (c, m), v in cpu.items()}))


if __name__ == "__main__":
    main()
