"""Whether two stores' runs hold the same rows: every event table, every column but the run id
and what is measured rather than modelled (a copy's wall time, the data-plane bytes, whether a
load-back was verified), as multisets both ways (EXCEPT ALL). How a speed change proves it left
the rows alone:

    .venv/bin/python benchmarks/compare_rows.py BEFORE.duckdb AFTER.duckdb

Each store must hold one run (replay the same trace and config into two fresh stores). Prints
one line a table, "differing: 0 0" when identical; exits 1 when any table differs.
`--ignore COL,COL` leaves those columns out too (e.g. the v4 data-parallel columns, which a
one-rank run writes as dp_rank 0 and an engine before them left NULL):

    .venv/bin/python benchmarks/compare_rows.py BEFORE.duckdb AFTER.duckdb --ignore dp_rank
"""

from __future__ import annotations

import sys

import duckdb

TABLES = ("requests", "evictions", "request_evictions", "batches", "transfers", "pool_samples")
MEASURED = ("run_id", "wall_ns", "data_plane_bytes", "verified")


def main(a: str, b: str, ignore: tuple[str, ...] = ()) -> int:
    con = duckdb.connect()
    for name, path in (("a", a), ("b", b)):
        con.execute(f"ATTACH '{path.replace(chr(39), chr(39) * 2)}' AS {name} (READ_ONLY)")
    differ = False
    for t in TABLES:
        cols = ", ".join(r[0] for r in con.execute(f"DESCRIBE a.{t}").fetchall() if r[0] not in MEASURED + ignore)
        n = con.execute(f"SELECT count(*) FROM a.{t}").fetchone()[0]
        only_a = con.execute(f"SELECT count(*) FROM (SELECT {cols} FROM a.{t} EXCEPT ALL SELECT {cols} FROM b.{t})").fetchone()[0]
        only_b = con.execute(f"SELECT count(*) FROM (SELECT {cols} FROM b.{t} EXCEPT ALL SELECT {cols} FROM a.{t})").fetchone()[0]
        differ |= bool(only_a or only_b)
        print(f"{t} {n} rows; differing: {only_a} {only_b}")
    return 1 if differ else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    ignored: tuple[str, ...] = ()
    if len(args) == 4 and args[2] == "--ignore":
        ignored, args = tuple(args[3].split(",")), args[:2]
    if len(args) != 2:
        sys.exit(__doc__)
    sys.exit(main(args[0], args[1], ignored))
