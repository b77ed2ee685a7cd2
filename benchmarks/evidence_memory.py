"""Peak RSS of the run evidence (diagnose/run/evidence.py `compute_evidence`) on a recorded run, or
of one of its sections alone, in a fresh process (issue 41: the close of a 1M-request replay).

    .venv/bin/python benchmarks/evidence_memory.py RUN.duckdb [SECTION|all] [--out EVIDENCE.json]

SECTION: context (with its story), story, summary, totals, session_summary, rank_summary,
miss_reasons, sessions, size_curves, or all (the evidence as the close computes it: its threads,
`evidence.evidence_threads`). `--plan small|large` (all only) takes that plan whatever the run's
size (session 20, h41mem3: four threads below 100k requests, one from it on); `--no-curves` leaves
the size curves out of all (the sections beside them alone). Prints one JSON line: the process's
RSS before the work and its peak (ru_maxrss, MB), its CPU and wall. `--out` writes the
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
    from tierdiag.diagnose.read.run_context import batch_recompute_sql
    from tierdiag.diagnose.run.story import run_story
    from tierdiag.diagnose.run.stored import encode
    from tierdiag.diagnose.run.totals import run_totals
    from tierdiag.diagnose.session.session_pool import session_pauses
    from tierdiag.diagnose.session.sessions import session_summary
    from tierdiag.store.reader import run_info

    work = {"context": compute_run_context, "summary": compute_run_summary,
            "totals": lambda c, r: run_totals(c, r.run_id), "session_summary": session_summary,
            "rank_summary": rank_summary, "miss_reasons": lambda c, r: run_miss_reasons(c, r.run_id),
            "sessions": session_pauses, "size_curves": size_curves,
            "story": lambda c, r: run_story(c, r.run_id, batch_recompute_sql(c))}
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("db")
    ap.add_argument("section", nargs="?", default="all", choices=[*work, "all"])
    ap.add_argument("--out", default=None)
    ap.add_argument("--plan", choices=["small", "large"], default=None)
    ap.add_argument("--no-curves", action="store_true")
    a = ap.parse_args()
    if a.plan:
        evidence.LARGE_RUN_REQUESTS = 0 if a.plan == "large" else 2**62
    if a.no_curves:
        evidence.size_curves = lambda con, run: None

    def peak_mb() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024

    con = duckdb.connect(a.db, read_only=True)
    run = run_info(con, con.execute("SELECT run_id FROM runs ORDER BY created_at LIMIT 1").fetchone()[0])
    before, t, cpu = peak_mb(), time.perf_counter(), time.process_time()
    if a.section == "all":
        got = evidence.compute_evidence(con, run)
    else:
        value = work[a.section](con, run)
        got = repr(value) if a.section == "story" else encode(value)
    wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    print(json.dumps({"section": a.section, "plan": a.plan, "curves": not a.no_curves, "rss_before_mb": before,
                      "peak_rss_mb": peak_mb(), "cpu_s": round(cpu, 2), "wall_s": round(wall, 2)}))
    if a.out:
        with open(a.out, "w") as fh:
            fh.write(json.dumps(got, separators=(",", ":")))


if __name__ == "__main__":
    main()
