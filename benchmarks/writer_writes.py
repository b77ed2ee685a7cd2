"""The writer process's writes during a run and the last rows its close writes, on a recorded
run's rows handed over at an engine's pace (issue 41's probe overhead: the writes' CPU is taken
from the engine's through the shared machine, and the close's last write is on the path the
replay waits for), this tree against a baseline's code, interleaved.

    .venv/bin/python benchmarks/writer_writes.py RUN.duckdb [--baseline REF_OR_BUILT_FOLDER] [--rounds N]
        [--handovers 18] [--gap 0.09,0.1,0.11]

Each round runs one process per side and pace: a fresh store, `writer_serve._Serve` handed the
run's rows in `--handovers` batches `--gap` seconds apart (a quiet engine's: the conversation
trace's 18 hand-overs ~0.09 s apart), writing as the writer process does (its interval, its
coalescing, the run loop's timed write while idle), then `RunWriter.finish` without a close hook.
Several gaps: the close's last write depends on where the engine's end falls between two writes.
Printed per side (medians over the rounds, summed over the gaps): the writes during the run and
their CPU (the thread's), the rows still pending at the close, the close's CPU (the last rows'
write, the status, the detach's checkpoint) and its wall from the engine's end (the last
hand-over's time: a write then in progress is waited for), the file's size and the requests' row
groups. The hand-overs keep the engine's pace (a write in progress delays the next one it finds,
not the ones after), the engine's close is queued with its last rows (coalesced, as in a
replay), and the writer is told the run's request count (a writer process counts the trace's
lines: its late writes, session 23 h41close5; a baseline without them ignores it).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from close_parts import PRELUDE, interleaved, print_medians, run_in  # benchmarks/ is the script's folder: first on sys.path

_DRIVE = PRELUDE + r"""
import queue
import tierdiag.store.writer as W
from tierdiag.store import writer_serve

src, dst, n, gap = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
run, tables = load_run(src)
batches = [batch(tables, i, n) for i in range(n)]

r, w = os.pipe()
threading.Thread(target=lambda: [os.read(r, 1 << 16) for _ in iter(int, 1)], daemon=True).start()
serve = writer_serve._Serve(inbox=queue.SimpleQueue(), reply_fd=w)
serve.writer = W.RunWriter(dst, name=run["name"], trace_path=run["trace_path"], trace_sha256=run["trace_sha256"],
                           config={}, hardware={}, data_plane={}, timing=run["timing"])
serve.every = min(writer_serve.FIRST_WRITE_S, serve.every_max)  # as _Serve.open leaves it
serve.expected = tables["requests"].num_rows  # _Serve.open counts the trace's lines (the late writes; a base ignores it)
serve.last_write = time.monotonic()
timed(writer_serve._Serve, "write", "write")
t0 = time.monotonic()
for i in range(n):
    until = t0 + (i + 1) * gap  # the engine's pace: a hand-over is not later for a write in progress
    while True:  # _Serve.run's wait: a write once the interval has passed with rows pending
        left = until - time.monotonic()
        if left <= 0:
            break
        due = serve.last_write + serve.every - time.monotonic() if serve.writer.pending else left
        if due <= 0:
            serve.write()
            continue
        time.sleep(min(left, due))
    if i == n - 1:
        serve.inbox.put(b"finish")  # the engine's close comes with its last rows: that one is coalesced
    serve.rows(batches[i])
pending = sum(len(next(iter(c.values()))) for b in serve.writer._pending for c in b.values() if c)
out = {"writes": calls.get("write", 0), "write_cpu": parts.get("write", 0.0), "pending_rows": pending}
c0 = time.thread_time()
serve.writer.finish("complete", release=False)
out["close_cpu"] = time.thread_time() - c0
# From the engine's end (its last hand-over's time) to the close's end: a write still in
# progress then, and the last rows' write (status, checkpoint): what the replay waits for.
out["close_wall"] = time.monotonic() - (t0 + n * gap)
out["size_mb"] = os.path.getsize(dst) / 2**20
with duckdb.connect(dst, read_only=True) as s:
    out["row_groups"] = s.sql("SELECT count(DISTINCT row_group_id) FROM pragma_storage_info('requests')").fetchall()[0][0]
    assert s.sql("SELECT count(*) FROM requests").fetchall()[0][0] == tables["requests"].num_rows
print(json.dumps(out))
os._exit(0)
"""

KEYS = ("writes", "write_cpu", "pending_rows", "close_cpu", "close_wall", "size_mb", "row_groups")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path, help="a store holding one recorded replay")
    ap.add_argument("--baseline", default=None, help="a git ref or a built checkout's folder, timed in the same rounds")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--handovers", type=int, default=18)
    ap.add_argument("--gap", default="0.09,0.1,0.11", help="seconds between hand-overs, several: each a run")
    a = ap.parse_args()
    gaps = [float(g) for g in a.gap.split(",")]

    def measure(name: str, root: Path, i: int) -> dict:
        total = dict.fromkeys(KEYS, 0.0)
        for gap in gaps:
            dst = tmp / f"{name}-{i}-{gap}.duckdb"
            p = run_in(root, _DRIVE, a.run, dst, a.handovers, gap)
            for k in KEYS:
                total[k] += p[k]
            dst.unlink()
        print(f"round {i + 1} {name}: " + " ".join(f"{k} {v:.4g}" for k, v in total.items()), flush=True)
        return total

    with tempfile.TemporaryDirectory(prefix="tierdiag-writes-") as td:
        tmp = Path(td)
        got = interleaved(a.baseline, a.rounds, tmp, measure)
    print_medians(got, KEYS, f"each the sum over the gaps {gaps} ({a.handovers} hand-overs)", "13.4g")


if __name__ == "__main__":
    main()
