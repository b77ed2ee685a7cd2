"""Peak RSS of the run evidence (diagnose/run/evidence.py `compute_evidence`) on a recorded run, or
of one of its sections alone, in a fresh process (issue 41: the close of a 1M-request replay).

    .venv/bin/python benchmarks/evidence_memory.py RUN.duckdb [SECTION|all] [--out EVIDENCE.json]

SECTION: context, summary, totals, session_summary, rank_summary, miss_reasons, sessions,
size_curves, or all (the evidence as the close computes it: three threads). Prints one JSON line:
the process's RSS before the work and its peak (ru_maxrss, MB), and the wall. `--out` writes the
computed sections as the store would (to compare two trees' evidence byte for byte). The store is
opened read-only; the run's trace must be where it was recorded (the size curves read it again).
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import duckdb


def main() -> None:
    from tierdiag.diagnose.dp.ranks import rank_summary
    from tierdiag.diagnose.run import evidence
    from tierdiag.diagnose.run.miss_reasons import run_miss_reasons
    from tierdiag.diagnose.run.numbers import compute_run_summary
    from tierdiag.diagnose.run.runcontext import compute_run_context
    from tierdiag.diagnose.run.size_curves import size_curves
    from tierdiag.diagnose.run.stored import encode
    from tierdiag.diagnose.run.totals import run_totals
    from tierdiag.diagnose.session.session_pool import session_pauses
    from tierdiag.diagnose.session.sessions import session_summary
    from tierdiag.store.reader import run_info

    work = {"context": compute_run_context, "summary": compute_run_summary,
            "totals": lambda c, r: run_totals(c, r.run_id), "session_summary": session_summary,
            "rank_summary": rank_summary, "miss_reasons": lambda c, r: run_miss_reasons(c, r.run_id),
            "sessions": session_pauses, "size_curves": size_curves}
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("db")
    ap.add_argument("section", nargs="?", default="all", choices=[*work, "all"])
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    def peak_mb() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024

    con = duckdb.connect(a.db, read_only=True)
    run = run_info(con, con.execute("SELECT run_id FROM runs ORDER BY created_at LIMIT 1").fetchone()[0])
    before, t = peak_mb(), time.perf_counter()
    got = evidence.compute_evidence(con, run) if a.section == "all" else encode(work[a.section](con, run))
    wall = time.perf_counter() - t
    print(json.dumps({"section": a.section, "rss_before_mb": before, "peak_rss_mb": peak_mb(), "wall_s": round(wall, 1)}))
    if a.out:
        with open(a.out, "w") as fh:
            fh.write(json.dumps(got, separators=(",", ":")))


if __name__ == "__main__":
    main()
