"""The writer's two size-curves threads alone, one process, thread CPU by part (issue 41, probe
overhead): the read-ahead (tierdiag-trace-pages: the trace read again, `_Pages`) and the live pass
(tierdiag-live-curves: the index, then each batch of request rows `rows_of` -> `add_rows` ->
`advance(watermark)`, then the rest and `done`), fed the batches a replay's writer handed it.

    # once: the batches a writer process hands its read-ahead, captured
    H46_CAPTURE=/tmp/x.batches PYTHONPATH=benchmarks/curves_capture TIERDIAG_WRITER=process \
        .venv/bin/python -m tierdiag replay TRACE --db /tmp/x.duckdb
    # then, from the checkout to measure (its code imported: run it from there)
    .venv/bin/python benchmarks/curves_threads.py TRACE /tmp/x.batches [--repeats 5] [--dp N]
        [--profile FILE] [--json FILE]

Printed per repeat and as medians: `read` (read_trace + `_Pages.add_request` + `finish`, the
read-ahead's thread), `index` (`_Pages.index` and the scaled arrivals), `rows_of`, `add_rows`,
`watermark`, `advance`, `done` (thread CPU, `time.thread_time`), and a digest of the pass's results
(the depths walked: two codes' digests must match). Nothing here asserts on timings.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pickle
import statistics
import sys
import time


def _batches(path: str) -> list:
    out = []
    with open(path, "rb") as f:
        while True:
            try:
                out.append(pickle.load(f))
            except EOFError:
                return out


def one(trace: str, batches: list, dp: int, page: int = 64, block: int = 512) -> dict:
    from tierdiag.diagnose.run import live_curves
    from tierdiag.diagnose.run import size_curves as sc
    from tierdiag.trace.reader import read_trace

    t = {}
    clock = time.thread_time
    c0 = clock()
    pages = sc._Pages(page)
    for req in read_trace(trace, block_size=block, skip_bad=True):
        pages.add_request(req, block)
    pages.finish()
    t["read"] = clock() - c0
    c0 = clock()
    index = pages.index()
    index.arrival_ns = live_curves.scaled_arrivals(pages.arrival, 1.0)
    del pages
    t["index"] = clock() - c0
    live = live_curves.LivePass(index, page, all_ranks=dp > 1, closed=False)
    for k in ("rows_of", "add_rows", "watermark", "advance"):
        t[k] = 0.0
    for got in batches:
        c0 = clock()
        args = live_curves.rows_of(index, got)
        c1 = clock()
        live.add_rows(*args)
        c2 = clock()
        w = live.watermark()
        c3 = clock()
        live.advance(w)
        c4 = clock()
        t["rows_of"] += c1 - c0
        t["add_rows"] += c2 - c1
        t["watermark"] += c3 - c2
        t["advance"] += c4 - c3
    c0 = clock()
    live.advance(None)
    t["advance_end"] = clock() - c0
    c0 = clock()
    live.done()
    t["done"] = clock() - c0
    t["live"] = sum(t[k] for k in ("rows_of", "add_rows", "watermark", "advance", "advance_end", "done"))
    lr, d, d_all = live.results()
    h = hashlib.sha256()
    for a in (lr, d, d_all):
        if a is not None:
            h.update(bytes(memoryview(a.astype("int64").copy())))
    tally = live.depth_tally()
    if tally is not None:
        h.update(str(tally[0]).encode())
        h.update(bytes(memoryview(tally[1])))
        h.update(bytes(memoryview(tally[2])))
    t["digest"] = h.hexdigest()[:16]
    t["lookups"] = int(len(d))
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("batches")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dp", type=int, default=1)
    ap.add_argument("--profile", default=None, help="cProfile the last repeat into this file")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    import tierdiag

    print("code:", tierdiag.__file__, file=sys.stderr)
    batches = _batches(a.batches)
    runs = []
    for r in range(a.repeats):
        if a.profile and r == a.repeats - 1:
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
            got = one(a.trace, batches, a.dp)
            prof.disable()
            prof.dump_stats(a.profile)
        else:
            got = one(a.trace, batches, a.dp)
        runs.append(got)
        print(" ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in got.items()))
    keys = [k for k, v in runs[0].items() if isinstance(v, float)]
    med = {k: statistics.median(x[k] for x in runs) for k in keys}
    print("median: " + " ".join(f"{k} {v:.4f}" for k, v in med.items()))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"runs": runs, "median": med}, f)


if __name__ == "__main__":
    main()
