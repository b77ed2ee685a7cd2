"""The writer process's ingest during a run (issue 41's probe overhead: the writer's CPU on the
other core, which slows the engine's on 2 vCPUs): what it does with each hand-over short of
the close, timed on the real hand-overs of a run.

    .venv/bin/python benchmarks/writer_ingest.py [--trace FILE] [--requests N] [--rounds 3]
                                                 [--code DIR ...]

Each code (a source tree, built in place; default this one) runs in fresh processes, rounds
interleaved (the order flips every round). A process replays the trace's first N requests with
the Recorder handing over every BATCH_ROWS rows as the replay's writer process is handed them,
keeps each hand-over pickled (as `send_frame` sends it), then times, on this process's CPU
(`time.process_time`), medians of 3 passes over all of them:

  unpickle  pickle.loads of each hand-over (the writer's `recv_frame`)
  columns   store/columns.py `table_columns` of each table (the C decoder into Arrow buffers,
            or Python values for a column that does not fit) and RunWriter.take's
            `arrow_column` of each column (pa.array of the Python values): the decode
  insert    RunWriter._write_pending's inserts of those columns into an in-memory DuckDB
            store (one transaction a hand-over; the writer groups a second's hand-overs)

and counts the columns that came back as Python values (off the Arrow path) and the objects
pickled beside the encoded rows ('O' values). Printed: a table, one row a code, medians over
the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = ROOT / ".." / "shared" / "traces" / "conversation_trace.jsonl"


def child(trace: Path, requests: int) -> dict:
    import tempfile

    import duckdb
    import pyarrow as pa

    from tierdiag.config.engine import EngineConfig
    from tierdiag.engine.engine import Engine
    from tierdiag.probes.recorder import Recorder
    from tierdiag.store.columns import arrow_column, table_columns
    from tierdiag.store.schema import TABLES
    from tierdiag.store.writer import RunWriter, init_store
    from tierdiag.store.writer_process import BATCH_ROWS
    from tierdiag.trace.reader import ReadReport, read_trace

    cfg = EngineConfig()
    reqs = list(read_trace(trace, block_size=cfg.block_size, skip_bad=False, report=ReadReport()))[:requests]
    frames: list[bytes] = []
    probe = Recorder(rows_sink=lambda t: frames.append(pickle.dumps(("row_tuples", t), protocol=pickle.HIGHEST_PROTOCOL)),
                     flush_rows=BATCH_ROWS)
    with tempfile.TemporaryDirectory() as storage:
        Engine(cfg, probe=probe, storage_dir=storage).run(reqs)
        probe.flush()
    objects = 0
    for f in frames:
        for _, (_, rows) in pickle.loads(f)[1].items():
            if not isinstance(rows, list) and rows[2] is not None:
                objects += len(rows[2])

    def unpickle() -> list:
        return [pickle.loads(f)[1] for f in frames]

    handovers = unpickle()

    def decode() -> list:
        return [{table: {col: arrow_column(table, col, v) for col, v in table_columns(table, fields, rows).items()}
                 for table, (fields, rows) in tables.items()} for tables in handovers]

    decoded = decode()
    python_columns = sum(not isinstance(v, pa.Array)
                         for tables in handovers for table, (fields, rows) in tables.items()
                         for v in table_columns(table, fields, rows).values())

    def insert() -> None:
        con = duckdb.connect()
        init_store(con)
        for taken in decoded:
            con.execute("BEGIN")
            for table, cols in taken.items():
                cols = dict(cols)
                n = len(next(iter(cols.values())))
                cols["run_id"] = pa.repeat(pa.scalar("r", type=pa.string()), n)
                RunWriter._append(con, table, cols)
            con.execute("COMMIT")
        con.close()

    def cpu(fn) -> float:
        times = []
        for _ in range(3):
            t0 = time.process_time()
            fn()
            times.append(time.process_time() - t0)
        return statistics.median(times)

    assert TABLES
    return {"handovers": len(frames), "bytes": sum(map(len, frames)), "objects": objects,
            "python_columns": python_columns, "unpickle": cpu(unpickle), "columns": cpu(decode), "insert": cpu(insert)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--code", type=Path, action="append", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.trace, args.requests)))
        return
    codes = [c.resolve() for c in (args.code or [ROOT])]
    results: dict[Path, list[dict]] = {c: [] for c in codes}
    for r in range(args.rounds):
        for code in codes if r % 2 == 0 else codes[::-1]:
            env = {**os.environ, "PYTHONPATH": str(code)}
            proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", "--trace", str(args.trace),
                                   "--requests", str(args.requests)], cwd=code, env=env, capture_output=True,
                                  text=True, check=True)
            results[code].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print("| code | hand-overs | bytes | pickled objects | Python-value columns | unpickle CPU | columns CPU | insert CPU |")
    print("|---|---|---|---|---|---|---|---|")
    for code, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in ("unpickle", "columns", "insert")}
        first = runs[0]
        print(f"| {code} | {first['handovers']} | {first['bytes']:,} | {first['objects']:,} | {first['python_columns']} | "
              f"{med['unpickle'] * 1e3:.1f} ms | {med['columns'] * 1e3:.1f} ms | {med['insert'] * 1e3:.1f} ms |")


if __name__ == "__main__":
    main()
