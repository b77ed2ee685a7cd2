"""The engine core's speed (issue 41): `Engine.run` on a trace read beforehand, with and without
the recorder, against the plain-Python prefix-LRU floor over the same trace's hash ids; each
a ratio measured in the same process and the same minute, so a fast or slow phase of the
machine cancels out. Instructions (valgrind's cachegrind, deterministic) where a 5 % change is
to be told from this shared machine's noise.

    .venv/bin/python benchmarks/core.py [--trace FILE] [--requests N] [--repeats 3]
                                        [--modes none,record,arrow] [--profile MODE] [--instructions]
                                        [--storage-tokens N] [--dp N --router NAME]

Modes (the probe the engine is given):
  none     no probe (what `replay --no-probes` runs)
  record   the Recorder with a sink that drops what it is handed: the engine's own cost of the
           probes (events built, buffered, handed over), what a replay with the writer process
           pays on the engine's core
  arrow    the Recorder, its hand-overs made the store's Arrow columns (store/columns.py
           table_columns) on this thread: the inline writer's cost short of DuckDB
The engine process's hand-over, one step further each (issue 41's probe overhead split; each
hands over every BATCH_ROWS rows, as the replay's writer process is handed them):
  pickle   the Recorder, each hand-over pickled as store/frames.py's `send_frame` does (`encode`)
  pipe     ... `send_frame` into a pipe that a `cat > /dev/null` child drains: what
           WriterProcess.append_rows costs the engine's process (its `out_of_band` frame, as
           `pickle` encodes it), short of its `select` poll
  writer   ... the replay's real writer process (a fresh store in a temporary folder) making
           Arrow columns and inserting them into DuckDB on the other core: in instructions the
           same as `pipe` (another process); in CPU seconds (benchmarks/recording.py --modes)
           the difference from `pipe` is the writer's interference
  (pipe and writer leave their child until the process exits: for fresh processes a run,
  --instructions and benchmarks/recording.py, not for this script's in-process timings)

`--profile MODE` prints cProfile's top functions of one run of MODE instead. `--instructions`
counts each mode's `Engine.run` under cachegrind (the trace read counted alone and taken off).
`--pure` runs the engine core's Python twin where it is compiled (TIERDIAG_PURE_ENGINE=1, also
for the cachegrind subprocesses; benchmarks/engine_core.py compares the two side by side).
`--storage-tokens`, `--dp`, `--router`: the engine config's keys of those names (targets41's storage
and dp rows), the default config otherwise.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT_TRACE = ROOT / ".." / "shared" / "traces" / "conversation_trace.jsonl"
MODES = ("none", "record", "arrow", "pickle", "pipe", "writer")


def read(trace: Path, requests: int | None, overrides: dict | None = None):
    from tierdiag.config.engine import EngineConfig
    from tierdiag.trace.reader import ReadReport, read_trace

    cfg = EngineConfig(**(overrides or {}))
    reqs = list(read_trace(trace, block_size=cfg.block_size, skip_bad=False, report=ReadReport()))
    return cfg, reqs[:requests] if requests else reqs


def lru_floor(reqs, capacity_blocks: int) -> int:
    """The floor: a plain-Python prefix LRU over the requests' hash ids (a request hits the
    leading blocks already cached, stops at the first miss, and caches the rest), the least
    recently used block evicted first. Returns the blocks hit."""
    cache: OrderedDict = OrderedDict()
    hits = 0
    for r in reqs:
        missed = False
        for h in r.hash_ids or ():
            if not missed and h in cache:
                cache.move_to_end(h)
                hits += 1
                continue
            missed = True
            cache[h] = None
            cache.move_to_end(h)
            if len(cache) > capacity_blocks:
                cache.popitem(last=False)
    return hits


def make_probe(mode: str):
    if mode == "none":
        return None
    from tierdiag.probes.recorder import Recorder

    if mode == "record":
        return Recorder(rows_sink=lambda tables: None)
    if mode in ("pickle", "pipe", "writer"):
        return _handover_probe(mode)
    from tierdiag.store.columns import table_columns

    def to_arrow(tables):
        for table, (fields, rows) in tables.items():
            table_columns(table, fields, rows)

    return Recorder(rows_sink=to_arrow)


def _handover_probe(mode: str):
    """The recorder handing over as the replay's writer process is handed rows, one step more
    each mode (module doc); a child process it needs is ended at exit."""
    import atexit
    import pickle
    import subprocess as sp

    from tierdiag.probes.recorder import Recorder
    from tierdiag.store.frames import send_frame
    from tierdiag.store.writer_process import BATCH_ROWS, WriterProcess

    if mode == "pickle":
        try:  # the frame as send_frame makes it (its int blocks out of band: session 28's frames)
            from tierdiag.store.frames import encode, out_of_band
        except ImportError:  # a checkout from before: one pickle, everything in it
            return Recorder(rows_sink=lambda tables: pickle.dumps(("row_tuples", tables), protocol=pickle.HIGHEST_PROTOCOL),
                            flush_rows=BATCH_ROWS)
        return Recorder(rows_sink=lambda tables: encode(("row_tuples", out_of_band(tables))), flush_rows=BATCH_ROWS)
    if mode == "pipe":
        drain = sp.Popen(["cat"], stdin=sp.PIPE, stdout=sp.DEVNULL)
        fd = drain.stdin.fileno()

        def end_drain() -> None:
            drain.stdin.close()
            drain.wait()

        atexit.register(end_drain)
        try:  # as WriterProcess.append_rows sends (its int blocks and text columns out of band)
            from tierdiag.store.frames import out_of_band as sent
        except ImportError:  # a checkout from before session 28: everything in the pickle
            def sent(tables):
                return tables
        return Recorder(rows_sink=lambda tables: send_frame(fd, ("row_tuples", sent(tables))), flush_rows=BATCH_ROWS)
    store = tempfile.mkdtemp()
    writer = WriterProcess.start()
    writer.open(os.path.join(store, "run.duckdb"), run_id="handover", name="handover", trace_path=str(DEFAULT_TRACE),
                write_every_s=1.0, trace_sha256="0" * 64, config={}, hardware={}, data_plane={}, timing="modelled")

    def end_writer() -> None:
        writer.finish("finished")
        writer.close()
        shutil.rmtree(store, ignore_errors=True)

    atexit.register(end_writer)
    return Recorder(rows_sink=writer.append_rows, flush_rows=BATCH_ROWS)


def pin(spec: str | None) -> None:
    """`ENGINE_CPU:CHILD_CPU` (benchmarks/writer_contention.py's BENCH_PIN): this process on one
    CPU and its children (a `pipe` or `writer` mode's `cat` or writer process) on the other's;
    an empty CHILD_CPU leaves them alone. None or "": nothing."""
    if not spec:
        return
    engine_cpu, _, child_cpu = spec.partition(":")
    os.sched_setaffinity(0, {int(engine_cpu)})
    children: list[int] = []
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as f:
            children += [int(p) for p in f.read().split()]
    if child_cpu:
        if not children:
            raise SystemExit(f"BENCH_PIN={spec}: no child process to pin")
        for pid in children:
            os.sched_setaffinity(pid, {int(child_cpu)})


def run_once(cfg, reqs, mode: str) -> float:
    from tierdiag.engine.engine import Engine

    probe = make_probe(mode)
    with tempfile.TemporaryDirectory() as storage:
        engine = Engine(cfg, probe=probe, storage_dir=storage)
        gc.collect()
        t0 = time.perf_counter()
        engine.run(reqs)
        if probe is not None:
            probe.flush()
        return time.perf_counter() - t0


def timings(cfg, reqs, modes, repeats: int) -> dict:
    capacity = cfg.resolved_device_tokens() // cfg.block_size
    out: dict[str, list[float]] = {m: [] for m in (*modes, "lru_floor")}
    for _ in range(repeats):  # interleaved: each repeat runs every mode once
        for m in modes:
            out[m].append(run_once(cfg, reqs, m))
        t0 = time.perf_counter()
        lru_floor(reqs, capacity)
        out["lru_floor"].append(time.perf_counter() - t0)
    med = {m: sorted(v)[len(v) // 2] for m, v in out.items()}
    return {"seconds": out, "median": med}


def profile(cfg, reqs, mode: str, top: int) -> None:
    import cProfile
    import pstats

    from tierdiag.engine.engine import Engine

    probe = make_probe(mode)
    with tempfile.TemporaryDirectory() as storage:
        engine = Engine(cfg, probe=probe, storage_dir=storage)
        prof = cProfile.Profile()
        prof.enable()
        engine.run(reqs)
        if probe is not None:
            probe.flush()
        prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(top)


_DRIVER = """
import gc, sys
sys.path.insert(0, {root!r})
from benchmarks.core import make_probe, pin  # (it puts this checkout first on the path: `code` goes ahead of it)
sys.path.insert(0, {code!r})
from tierdiag.config.engine import EngineConfig
from tierdiag.trace.reader import ReadReport, read_trace
# read() inline: an older checkout's (--code) takes no config keys
cfg = EngineConfig(**{overrides!r})
reqs = list(read_trace({trace!r}, block_size=cfg.block_size, skip_bad=False, report=ReadReport()))
reqs = reqs[:{requests!r}] if {requests!r} else reqs
gc.set_threshold(50_000, 20, 100)
mode = sys.argv[1]
import tempfile
from tierdiag.engine.engine import Engine
from tierdiag.probes.recorder import Recorder
from tierdiag.store.columns import table_columns
# the hand-over modes' imports, here so that `read` counts them (pickle, pipe, writer)
import atexit, pickle, subprocess
from tierdiag.store.frames import send_frame
from tierdiag.store.writer_process import WriterProcess
if mode != "read":
    import json, time
    from tierdiag.engine import compiled
    probe = make_probe(mode)
    import os
    pin(os.environ.get("BENCH_PIN"))
    with tempfile.TemporaryDirectory() as storage:
        engine = Engine(cfg, probe=probe, storage_dir=storage)
        c0, w0 = time.process_time(), time.perf_counter()
        engine.run(reqs)
        if probe is not None:
            probe.flush()
        c1, w1 = time.process_time(), time.perf_counter()
    # what benchmarks/recording.py reads (the instruction counts ignore it)
    print(json.dumps({{"cpu": c1 - c0, "wall": w1 - w0, "core": compiled.describe()["mode"]}}))
"""


def instructions(trace: Path, requests: int | None, modes, code: Path = ROOT, overrides: dict | None = None) -> dict:
    """Each mode's `Engine.run` instructions by the engine of checkout `code` (this one by
    default; its extension built in place): the driver (this file) stays this checkout's."""
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    driver = _DRIVER.format(root=str(ROOT), code=str(code), trace=str(trace), requests=requests,
                            overrides=dict(overrides or {}))
    counts = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        for mode in ("read", *modes):
            proc = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}",
                                   sys.executable, "-c", driver, mode], cwd=ROOT, capture_output=True, text=True,
                                  # one BLAS thread: an idle one spins, and its spinning is counted
                                  env={**os.environ, "PYTHONPATH": f"{code}:{ROOT}", "OPENBLAS_NUM_THREADS": "1"})
            found = re.search(r"I\s+refs:\s+([\d,]+)", proc.stderr)
            if proc.returncode or found is None:
                raise SystemExit(f"{mode}: failed under valgrind: {proc.stderr.strip().splitlines()[-3:]}")
            counts[mode] = int(found.group(1).replace(",", ""))
            if mode != "read":
                # a source edited since the build (or while this runs) makes the Python twin run,
                # silently: counts of the twin are not the compiled core's (h41rec4 lost an hour to it)
                core = json.loads(proc.stdout.strip().splitlines()[-1])["core"]
                want = "pure" if os.environ.get("TIERDIAG_PURE_ENGINE") == "1" else "compiled"
                if (core == "compiled") != (want == "compiled"):
                    raise SystemExit(f"{code}: {mode} ran the engine core {core!r}, not {want!r}: "
                                     "build it in place (setup.py build_ext --inplace) and leave its sources alone while counting")
    fixed = counts.pop("read")
    return {m: n - fixed for m, n in counts.items()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--requests", type=int, default=None, help="the first N requests (default: all)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--profile", choices=MODES, default=None)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--instructions", action="store_true")
    ap.add_argument("--code", type=Path, default=ROOT,
                    help="--instructions: count the engine of this checkout (before/after in one run)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--pure", action="store_true", help="the engine core's Python twin (TIERDIAG_PURE_ENGINE=1)")
    ap.add_argument("--storage-tokens", type=int, default=None, help="the storage tier's tokens (0: none)")
    ap.add_argument("--dp", type=int, default=None, help="data-parallel ranks")
    ap.add_argument("--router", default=None, help="the router of --dp ranks")
    args = ap.parse_args(argv)
    overrides = {k: v for k, v in (("storage_tokens", args.storage_tokens), ("dp", args.dp),
                                   ("router", args.router)) if v is not None}
    if args.pure:  # before tierdiag.engine is first imported: the process decides once
        os.environ["TIERDIAG_PURE_ENGINE"] = "1"
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise SystemExit(f"--modes: {', '.join(bad)} not among {', '.join(MODES)}")
    trace = args.trace.resolve()
    if args.instructions:
        counts = instructions(trace, args.requests, modes, args.code.resolve(), overrides)
        base = counts.get("none")
        for m, n in counts.items():
            print(f"| {m} | {n / 1e9:.3f} G | {n / base if base else float('nan'):.3f} |")
        if args.json:
            print(json.dumps(counts))
        return
    cfg, reqs = read(trace, args.requests, overrides)
    gc.set_threshold(50_000, 20, 100)  # as a replay sets it
    if args.profile:
        profile(cfg, reqs, args.profile, args.top)
        return
    res = timings(cfg, reqs, modes, args.repeats)
    med = res["median"]
    floor = med["lru_floor"]
    from tierdiag.engine import compiled

    core = compiled.describe()
    print(f"{trace.name}: {len(reqs)} requests, medians of {args.repeats} interleaved; engine core {core['mode']} "
          f"({core['why']})")
    print("| mode | Engine.run | req/s | vs none | vs LRU floor |")
    print("|---|---|---|---|---|")
    for m in (*modes, "lru_floor"):
        vs_none = med[m] / med["none"] if "none" in med else float("nan")
        print(f"| {m} | {med[m]:.3f} s | {len(reqs) / med[m]:,.0f} | {vs_none:.3f} | {med[m] / floor:.1f}x |")
    if args.json:
        print(json.dumps(res))


if __name__ == "__main__":
    main()
