"""Where the engine process's probe overhead goes (issue 41, the engine side): `Engine.run` with
the recorder, its hand-overs taken one step further each mode, counted in one process a mode.

    .venv/bin/python benchmarks/recording_split.py [--trace FILE] [--requests N]
        [--instructions] [--rounds 3] [--modes none,record,pickle,pipe,writer] [--code DIR]

Modes (the recorder's sink; each adds one step to the one before):
  none     no probe
  record   the recorder, its hand-overs dropped (core.py's `record`): building the rows and
           encoding them into the buffers (rows.c's RowBuffer), the flush's `take`
  pickle   ... and each hand-over pickled as store/frames.py's `send_frame` does
  pipe     ... and written to a pipe (`send_frame` itself) that a `cat > /dev/null` child drains:
           what WriterProcess.append_rows costs the engine's process, short of its `select` poll
  writer   ... the replay's real writer process (store/writer_process.WriterProcess, a fresh
           store in a temporary folder) on the other core, which unpickles the rows, makes
           their Arrow columns and inserts them into DuckDB: with `--instructions` the same
           instructions as `pipe` in the engine's process (the writer is another process, not
           counted); in CPU seconds the difference from `pipe` is the writer's interference
           (caches, memory bandwidth, the core it takes from other work on a loaded machine)

`--instructions` counts each mode's `Engine.run` plus the last flush under cachegrind (the
engine's process only; the trace read counted alone and taken off). Without it each mode runs
`--rounds` times in a fresh process, interleaved (order flipped every round), and prints the
median CPU seconds (`time.process_time()` of the engine's process) and walls.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = ROOT / ".." / "shared" / "traces" / "conversation_trace.jsonl"
MODES = ("none", "record", "pickle", "pipe", "writer")

_DRIVER = r"""
import gc, json, os, pickle, subprocess, sys, tempfile, time
sys.path.insert(0, {code!r})
from tierdiag.config.engine import EngineConfig
from tierdiag.trace.reader import ReadReport, read_trace
cfg = EngineConfig()
reqs = list(read_trace({trace!r}, block_size=cfg.block_size, skip_bad=False, report=ReadReport()))
reqs = reqs[:{requests!r}] if {requests!r} else reqs
gc.set_threshold(50_000, 20, 100)
mode = sys.argv[1]
# imported by every mode, `read` too (its count is taken off the others')
from tierdiag.engine import compiled
from tierdiag.engine.engine import Engine
from tierdiag.probes.recorder import Recorder
from tierdiag.store.frames import send_frame
from tierdiag.store.writer_process import BATCH_ROWS, WriterProcess  # every mode hands over as often as the replay's writer process
if mode != "read":
    tmp = tempfile.mkdtemp()
    drain = writer = None
    if mode == "none":
        probe = None
    elif mode == "record":
        probe = Recorder(rows_sink=lambda tables: None, flush_rows=BATCH_ROWS)
    elif mode == "pickle":
        probe = Recorder(rows_sink=lambda tables: pickle.dumps(("row_tuples", tables), protocol=pickle.HIGHEST_PROTOCOL), flush_rows=BATCH_ROWS)
    elif mode == "pipe":
        drain = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
        fd = drain.stdin.fileno()
        probe = Recorder(rows_sink=lambda tables: send_frame(fd, ("row_tuples", tables)), flush_rows=BATCH_ROWS)
    else:
        writer = WriterProcess.start()
        writer.open(os.path.join(tmp, "run.duckdb"), run_id="split", name="split", trace_path={trace!r},
                    write_every_s=1.0, trace_sha256="0" * 64, config={{}}, hardware={{}}, data_plane={{}},
                    timing="modelled")
        probe = Recorder(rows_sink=writer.append_rows, flush_rows=BATCH_ROWS)
    engine = Engine(cfg, probe=probe, storage_dir=tmp)
    c0, w0 = time.process_time(), time.perf_counter()
    engine.run(reqs)
    if probe is not None:
        probe.flush()
    c1, w1 = time.process_time(), time.perf_counter()
    if drain is not None:
        drain.stdin.close()
        drain.wait()
    if writer is not None:
        writer.finish("finished")
        writer.close()
    print(json.dumps({{"cpu": c1 - c0, "wall": w1 - w0, "core": compiled.describe()["mode"]}}))
"""


def _driver(code: Path, trace: Path, requests: int | None) -> str:
    return _DRIVER.format(code=str(code), trace=str(trace), requests=requests)


def instructions(code: Path, trace: Path, requests: int | None, modes) -> dict[str, int]:
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    driver = _driver(code, trace, requests)
    counts = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        for mode in ("read", *modes):
            proc = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}",
                                   sys.executable, "-c", driver, mode], cwd=code, capture_output=True, text=True,
                                  env={**os.environ, "PYTHONPATH": str(code), "OPENBLAS_NUM_THREADS": "1"})
            found = re.search(r"I\s+refs:\s+([\d,]+)", proc.stderr)
            if proc.returncode or found is None:
                raise SystemExit(f"{mode}: failed under valgrind: {proc.stderr.strip().splitlines()[-3:]}")
            counts[mode] = int(found.group(1).replace(",", ""))
            if mode != "read" and json.loads(proc.stdout.strip().splitlines()[-1])["core"] != "compiled":
                raise SystemExit(f"{mode}: the engine core of {code} is not the compiled one (build it in place)")
    fixed = counts.pop("read")
    return {m: n - fixed for m, n in counts.items()}


def timings(code: Path, trace: Path, requests: int | None, modes, rounds: int) -> dict[str, dict[str, list[float]]]:
    driver = _driver(code, trace, requests)
    out: dict[str, dict[str, list[float]]] = {m: {"cpu": [], "wall": []} for m in modes}
    for r in range(rounds):
        for mode in (modes if r % 2 == 0 else list(reversed(modes))):
            proc = subprocess.run([sys.executable, "-c", driver, mode], cwd=code, capture_output=True, text=True,
                                  env={**os.environ, "PYTHONPATH": str(code)})
            if proc.returncode:
                raise SystemExit(f"{mode}: {proc.stderr.strip().splitlines()[-3:]}")
            got = json.loads(proc.stdout.strip().splitlines()[-1])
            out[mode]["cpu"].append(got["cpu"])
            out[mode]["wall"].append(got["wall"])
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--instructions", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--code", type=Path, default=ROOT, help="the checkout whose engine runs (built in place)")
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise SystemExit(f"--modes: {', '.join(bad)} not among {', '.join(MODES)}")
    code, trace = args.code.resolve(), args.trace.resolve()
    if args.instructions:
        counts = instructions(code, trace, args.requests, modes)
        base = counts.get("none")
        print("| mode | Engine.run instructions | vs none |")
        print("|---|---|---|")
        for m, n in counts.items():
            print(f"| {m} | {n / 1e9:.3f} G | {'+%.1f %%' % ((n / base - 1) * 100) if base else '-'} |")
        print(json.dumps(counts))
        return
    res = timings(code, trace, args.requests, modes, args.rounds)
    print(f"| mode | CPU s ({args.rounds} rounds) | median CPU | median wall |")
    print("|---|---|---|---|")
    for m in modes:
        cpu = res[m]["cpu"]
        print(f"| {m} | {' / '.join(f'{c:.2f}' for c in cpu)} | {statistics.median(cpu):.3f} | "
              f"{statistics.median(res[m]['wall']):.3f} |")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
