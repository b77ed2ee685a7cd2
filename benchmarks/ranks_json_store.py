"""What storing a `--dp` run's `ranks_json` texts costs DuckDB alone (issue 41, session 35 h45dp8).

    .venv/bin/python benchmarks/ranks_json_store.py STORE [--compression auto|uncompressed|null] [--runs 5]

Reads the `requests.ranks_json` texts of a replayed store (e.g. the conversation trace replayed
`--dp 8 --router cache_aware`), then appends them with an int column beside, as an Arrow table,
to a fresh DuckDB file in 5 chunks, each committed and checkpointed as the writer's writes are,
on one thread; prints each run's process CPU (the Arrow conversion's apart) and the file's size.
`uncompressed` forces DuckDB's compression off; `null` appends a NULL column instead (the floor).
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile

import duckdb
import pyarrow as pa


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store")
    ap.add_argument("--compression", choices=("auto", "uncompressed", "null"), default="auto")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    src = duckdb.connect(args.store, read_only=True)
    texts = [r[0] for r in src.execute("SELECT ranks_json FROM requests ORDER BY seq").fetchall()]
    src.close()
    step = -(-len(texts) // 5)
    chunks = [texts[i:i + step] for i in range(0, len(texts), step)]
    print(f"{len(texts)} texts, {sum(len(t or '') for t in texts):,} characters, {len(set(texts))} distinct")
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "t.duckdb")
            con = duckdb.connect(path, config={"threads": 1})
            if args.compression == "uncompressed":
                con.execute("SET force_compression = 'uncompressed'")
            con.execute("CREATE TABLE t (a BIGINT, s VARCHAR)")
            c0, conv = _cpu(), 0.0
            for chunk in chunks:
                a = _cpu()
                values = [None] * len(chunk) if args.compression == "null" else chunk
                tbl = pa.table({"a": pa.array(range(len(chunk)), pa.int64()), "s": pa.array(values, pa.string())})
                conv += _cpu() - a
                con.execute("INSERT INTO t SELECT * FROM tbl")
                con.execute("CHECKPOINT")
            cpu = _cpu() - c0
            con.close()
            print(f"{args.compression}: CPU {cpu:.3f} s (pa.array {conv:.3f} s), file {os.path.getsize(path):,} bytes")


if __name__ == "__main__":
    main()
