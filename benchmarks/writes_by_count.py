"""The same recorded rows written in K writes (issue 41's 1M row: what the writer process's
write interval costs on a large run). Each K: a fresh store, the run's rows cut into K equal
batches (every table sliced alike), each taken and written as the writer process writes
(`RunWriter.take`, `write`, every VACUUM_EVERY-th write vacuuming), then the close's status.

    .venv/bin/python benchmarks/writes_by_count.py RUN.duckdb [--counts 56,28,14,8,4] [--sql "SET ...;..."]

Printed per K: the writes' thread CPU (and their detaches' checkpoints), per write, wall and the
file's size. `--sql`: settings tried on the writer's in-memory instance first.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from close_parts import PRELUDE  # noqa: E402  (benchmarks/close_parts.py: load_run, batch)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("store", type=Path)
    ap.add_argument("--counts", default="56,28,14,8,4")
    ap.add_argument("--sql", default="")
    a = ap.parse_args()
    scope: dict = {}
    exec(PRELUDE, scope)
    import tierdiag.store.writer as W
    from tierdiag.store.writer_process import VACUUM_EVERY

    run, tables = scope["load_run"](str(a.store))
    print("rows:", {t: v.num_rows for t, v in tables.items()})
    with tempfile.TemporaryDirectory(prefix="tierdiag-writes-") as td:
        for k in [int(x) for x in a.counts.split(",")]:
            dst = Path(td) / f"w{k}.duckdb"
            w = W.RunWriter(dst, name="x", trace_path=run["trace_path"], trace_sha256=run["trace_sha256"], config={},
                            hardware={}, data_plane={}, timing=run["timing"])
            for stmt in a.sql.split(";"):
                if stmt.strip():
                    w._host.execute(stmt)
            checkpoint = [0.0]
            real = W.detach

            def timed_detach(host, _real=real, _c=checkpoint):
                c = time.thread_time()
                try:
                    return _real(host)
                finally:
                    _c[0] += time.thread_time() - c

            W.detach = timed_detach
            c0, t0 = time.thread_time(), time.perf_counter()
            try:
                for i in range(k):
                    w.take(scope["batch"](tables, i, k))
                    w.write(vacuum=(i + 1) % VACUUM_EVERY == 0)
            finally:
                W.detach = real
            cpu = time.thread_time() - c0
            print(f"K={k}: writes CPU {cpu:.2f} s (their detaches' checkpoints {checkpoint[0]:.2f}), per write "
                  f"{cpu / k * 1000:.0f} ms, wall {time.perf_counter() - t0:.1f} s, file {os.path.getsize(dst) / 1e6:.1f} MB",
                  flush=True)
            w.finish("complete")
    with open("/proc/loadavg") as fh:
        print("load average at the end:", " ".join(fh.read().split()[:3]))


if __name__ == "__main__":
    main()
