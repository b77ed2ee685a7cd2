"""The columnar hand-over's two ends (issue 41, probe overhead: h41rec8), a checkout against
another: the engine's side of each flush (the columnar buffers' `take()` and the frame's pickle,
as WriterProcess.append_rows sends it) and the writer's side (the frame unpickled and made Arrow
columns by store/columns.py's `table_columns` and `arrow_column`, as writer_serve.py and
RunWriter.take do), in CPU seconds of one
process, rounds interleaved, medians.

    .venv/bin/python benchmarks/handover_columns.py [--trace FILE] [--requests N] [--repeats 5]
                                                    [--baseline DIR]

Each round runs, for each checkout (this one; --baseline DIR, a checkout built in place), a fresh
process that replays the trace through `Engine.run` with a rows-sink Recorder flushing every
BATCH_ROWS rows (the replay's writer process cadence) whose sink pickles each hand-over and keeps
the bytes; the flushes' CPU (take + pickle) is summed inside it. Then, in the same process, every
kept frame is unpickled, decoded by `table_columns` and each column made its Arrow array
(`arrow_column`, as RunWriter.take does), summed. Printed: a table of medians.
The engine's own rows (the columns' appends) are not in either number: benchmarks/core.py
--instructions counts those.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = ROOT / ".." / "shared" / "traces" / "conversation_trace.jsonl"

_CHILD = r"""
import gc, json, os, pickle, sys, tempfile, time
sys.path.insert(0, {code!r})
from tierdiag.config.engine import EngineConfig
from tierdiag.engine import compiled
from tierdiag.engine.engine import Engine
from tierdiag.probes.recorder import Recorder
from tierdiag.store.columns import arrow_column, table_columns
from tierdiag.store.writer_process import BATCH_ROWS
from tierdiag.trace.reader import ReadReport, read_trace

cfg = EngineConfig()
reqs = list(read_trace({trace!r}, block_size=cfg.block_size, skip_bad=False, report=ReadReport()))
reqs = reqs[:{requests!r}] if {requests!r} else reqs
gc.set_threshold(50_000, 20, 100)
frames, spent = [], [0.0]
probe = None

try:  # the frame as send_frame makes it, read back as writer_serve does (session 28's frames)
    from tierdiag.store.frames import encode, loads, out_of_band
except ImportError:  # a checkout from before: one pickle
    encode = None

def sink(tables):
    if encode is None:
        frames.append(pickle.dumps(("row_tuples", tables), protocol=pickle.HIGHEST_PROTOCOL))
    else:
        frames.append(encode(("row_tuples", out_of_band(tables))))

class Timed(Recorder):
    def flush(self):
        t = time.process_time()
        super().flush()
        spent[0] += time.process_time() - t

probe = Timed(rows_sink=sink, flush_rows=BATCH_ROWS)
with tempfile.TemporaryDirectory() as storage:
    Engine(cfg, probe=probe, storage_dir=storage).run(reqs)
    probe.flush()
if encode is not None:  # each frame's body as the writer's reader thread reads it off the pipe
    frames = [bytearray(b"".join(parts))[8:] for parts in frames]
t = time.process_time()
for data in frames:
    _, tables = pickle.loads(data) if encode is None else loads(data)
    for table, (fields, rows) in tables.items():
        cols = table_columns(table, fields, rows)
        for col, values in cols.items():  # made Arrow arrays as RunWriter.take makes them
            arrow_column(table, col, values)
writer = time.process_time() - t
print(json.dumps({{"engine_flush_s": spent[0], "writer_decode_s": writer, "frames": len(frames),
                  "frame_bytes": sum(map(len, frames)), "core": compiled.describe()["mode"]}}))
"""


def run(code: Path, trace: Path, requests: int | None) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD.format(code=str(code), trace=str(trace), requests=requests)],
                         capture_output=True, text=True, cwd=code,
                         env={**os.environ, "PYTHONPATH": str(code), "OPENBLAS_NUM_THREADS": "1"})
    if out.returncode:
        raise SystemExit(f"{code}: {out.stderr.strip().splitlines()[-3:]}")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    if got["core"] != "compiled":
        raise SystemExit(f"{code}: the engine core ran {got['core']!r}: build it in place first")
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--baseline", type=Path, default=None, help="a checkout built in place, run in the same rounds")
    a = ap.parse_args()
    codes = ([("baseline", a.baseline.resolve())] if a.baseline else []) + [("this", ROOT)]
    got: dict[str, list[dict]] = {name: [] for name, _ in codes}
    for r in range(a.repeats):
        for name, code in (codes if r % 2 == 0 else codes[::-1]):
            got[name].append(run(code, a.trace.resolve(), a.requests))
    print(f"{a.trace.name}{f' [:{a.requests}]' if a.requests else ''}: medians of {a.repeats} interleaved rounds, "
          f"load average {os.getloadavg()[0]:.1f}")
    print("| code | engine: flushes (take + pickle) | writer: unpickle + table_columns + arrow_column | frames | bytes |")
    print("|---|---|---|---|---|")
    for name, rows in got.items():
        med = {k: statistics.median(r[k] for r in rows) for k in ("engine_flush_s", "writer_decode_s", "frame_bytes")}
        print(f"| {name} | {med['engine_flush_s']:.4f} s | {med['writer_decode_s']:.4f} s | {rows[0]['frames']} | "
              f"{med['frame_bytes'] / 1e6:.1f} MB |")


if __name__ == "__main__":
    main()
