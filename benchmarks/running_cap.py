"""Issue 43why: the cost of "the max_running_requests cap held the queue" at scale.

    PYTHONPATH=. .venv/bin/python benchmarks/running_cap.py STORE.duckdb [--cap N] [--explain 20]

On a run store (a 1M-request stand-in: benchmarks/big_store.py) times, read-only:
  run    story.cap_wait over every finished request (the run story's part: one read of the
         decoding spans, a numpy sweep per rank, a prefix-sum measure per wait), beside
         run_context.story_requests (the read the story already makes) for scale;
  explain  context's per-request part: running_spans (SQL cut to its wait) + running.at_cap_ns,
         for the --explain requests with the longest queue.
The cap is the run's recorded max_running_requests, or --cap (a run recorded before the cap:
the timing is of the same work). Walls and CPU seconds, median of --rounds."""

from __future__ import annotations

import argparse
import statistics
import time


def _timed(fn, rounds: int):
    walls, cpus, out = [], [], None
    for _ in range(rounds):
        w, c = time.perf_counter(), time.process_time()
        out = fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return statistics.median(walls), statistics.median(cpus), out


def main() -> None:
    import numpy as np

    from tierdiag.diagnose.read import request_context as read_req
    from tierdiag.diagnose.read import run_context as read_ctx
    from tierdiag.diagnose.request.running import at_cap_ns
    from tierdiag.diagnose.run.story import cap_wait
    from tierdiag.store.reader import open_store, resolve_run

    p = argparse.ArgumentParser()
    p.add_argument("store")
    p.add_argument("--cap", type=int, default=None)
    p.add_argument("--explain", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    with open_store(a.store) as con:
        rid = resolve_run(con, None).run_id
        cap = a.cap or read_ctx.running_cap(con, rid)[0] or 64
        w, c, r = _timed(lambda: read_ctx.story_requests(con, rid), a.rounds)
        print(f"requests {len(r.arrival_ns):,}  cap {cap}")
        print(f"story_requests (for scale)   wall {w:7.3f} s  cpu {c:7.3f} s")
        rank = np.asarray(r.dp_rank, dtype=np.int64)
        w0, ft, queue = (np.asarray(v, dtype=np.int64) for v in (r.wait_start_ns, r.first_token_ns, r.queue_ns))
        w1 = np.maximum(ft, w0)
        w, c, got = _timed(lambda: cap_wait(con, rid, rank, w0, w1, queue, cap), a.rounds)
        print(f"cap_wait (run story)         wall {w:7.3f} s  cpu {c:7.3f} s  "
              f"waits at the cap {int((got > 0).sum()):,}")
        ids = con.execute("SELECT coalesce(dp_rank, 0), arrival_ns + coalesce(storage_wait_ns, 0), first_token_ns, "
                          "queue_ns FROM requests WHERE run_id = ? AND first_token_ns IS NOT NULL "
                          "ORDER BY queue_ns DESC LIMIT ?", [rid, a.explain]).fetchall()

        def one():
            return [min(at_cap_ns(read_req.running_spans(con, rid, k, lo, hi), cap, lo, hi), q)
                    for k, lo, hi, q in ids]
        w, c, _ = _timed(one, a.rounds)
        print(f"explain's part, per request  wall {1e3 * w / max(len(ids), 1):7.2f} ms  "
              f"cpu {1e3 * c / max(len(ids), 1):7.2f} ms  ({len(ids)} longest waits)")


if __name__ == "__main__":
    main()
