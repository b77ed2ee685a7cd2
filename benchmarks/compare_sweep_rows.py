"""Whether two sweeps' stores hold the same runs, row for row (h47sweep): each run of BEFORE is
paired with the run of the same name in AFTER, each copied alone into a store of its own
(store/copy_run.py: every table of the run, its evidence included), then compared as a single
replay's are: benchmarks/compare_rows.py (every event table) and compare_evidence.py (the run
evidence and the request lookup, `storage_dir` left out).

    .venv/bin/python benchmarks/compare_sweep_rows.py BEFORE.duckdb AFTER.duckdb

Prints each run's lines; exits 1 when any table or section differs or the names differ.
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
from pathlib import Path

import duckdb

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import compare_evidence  # noqa: E402
import compare_rows  # noqa: E402

from tierdiag.store.copy_run import read_run_tables, write_run_tables  # noqa: E402


# A runs row's columns that say what was replayed and how it ended (not when, where or by whom).
RUN_IDENTITY = ("name", "status", "schema_version", "tierdiag_version", "trace_sha256", "config_json",
                "hardware_json", "data_plane_json", "timing", "num_requests", "error", "kind")


def run_rows(path: str) -> list[tuple]:
    with duckdb.connect(path, read_only=True) as con:
        return con.execute(f"SELECT {', '.join(RUN_IDENTITY)} FROM runs ORDER BY name").fetchall()


def runs_by_name(path: str) -> dict[str, str]:
    with duckdb.connect(path, read_only=True) as con:
        return dict(con.execute("SELECT name, run_id FROM runs").fetchall())


def main(before: str, after: str) -> int:
    a, b = runs_by_name(before), runs_by_name(after)
    if sorted(a) != sorted(b):
        print(f"run names differ: {sorted(a)} vs {sorted(b)}")
        return 1
    same_runs = run_rows(before) == run_rows(after)
    print(f"runs rows ({', '.join(RUN_IDENTITY)}): {'identical' if same_runs else 'DIFFER'}")
    differ = not same_runs
    with tempfile.TemporaryDirectory(prefix="compare-sweep-") as tmp:
        for name in sorted(a):
            pair = []
            for side, path, runs in (("a", before, a), ("b", after, b)):
                one = Path(tmp) / f"{side}-{len(pair)}-{abs(hash(name))}.duckdb"
                write_run_tables(one, read_run_tables(path, runs[name]))
                pair.append(str(one))
            print(f"== {name}")
            differ |= bool(compare_rows.main(*pair))
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                code = compare_evidence.main([*pair, "--ignore", "storage_dir"])
            print("evidence: " + out.getvalue().strip().splitlines()[-1])
            differ |= bool(code)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
