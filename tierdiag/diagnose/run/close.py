"""What a replay's close computes, once the store's writer has committed the run's status:
the run evidence (stored for every reader, diagnose/run/evidence.py) and the closing numbers the
replay prints (`summary`'s, one definition per metric).

The store calls this as a hook (`RunWriter.finish(..., after_commit=after_commit)`, and the
writer process's entry, app/writer_child.py): the store knows nothing of the diagnosis, and the
close still pays one open and one checkpoint, the hook running on the writer's connection."""

from __future__ import annotations

from pathlib import Path

import duckdb

from tierdiag.diagnose.run.evidence import record_run_evidence

# What the hook imports: a writer process imports these while the engine runs, not in the close.
# Not `summary` (36 modules, ~23 ms of the writer's CPU beside the engine): the closing numbers
# come from the summary the evidence computed; only where it was not stored are they read back
# through it (`closing_numbers`, which imports it then). The others are what the evidence's
# sections imported on first use, in the close the replay waits for (issue 41, session 23
# h41close5: ~15-28 ms of thread CPU there): the engine's rule sets (read/run.py `parse`, the
# run context's ranks; with the compiled engine modules they import), the claims the size
# curves' close names (run_claims) and the request lookup's writer (store/evidence.py).
PRELOAD = ("tierdiag.diagnose.run.evidence", "tierdiag.engine.rules", "tierdiag.diagnose.run.run_claims",
           "tierdiag.store.lookup")


def after_commit(con: duckdb.DuckDBPyConnection, db_path: Path, run_id: str, status: str) -> dict | None:
    """The run evidence for a run closed complete or interrupted (its own transaction; never
    raises: a warning line, and readers compute it from the rows), then, for a complete run, the
    closing numbers (what this raises, the replay raises where it reads them): from the summary the
    evidence just computed, which is what `summary` reads back from it, else read back."""
    computed: dict = {}
    if status in ("complete", "interrupted"):
        record_run_evidence(db_path, run_id, con=con, computed=computed)
    if status == "complete":
        return closing_numbers(con, run_id, summary=computed.get("summary"))
    return None


def closing_numbers(con: duckdb.DuckDBPyConnection, run_id: str, *, summary=None) -> dict:
    """What the replay's closing table takes from `summary` (one definition per metric): the
    run's span and its TTFT percentiles over every finished request (None when there is none).
    `summary`: the run's numbers (numbers.py `compute_run_summary`) when the caller has them:
    what `summary` would read back from the evidence just stored (~15 ms of reading back and
    decoding every section in the close the replay waits for; issue 41); else read back."""
    if summary is None:
        from tierdiag.diagnose.run.summary import run_summary
        from tierdiag.store.reader import resolve_run

        summary = run_summary(con, resolve_run(con, run_id), diagnose=False)  # the closing table needs no diagnosis
    s = summary
    every = next((c for c in s.classes if c.hit_class == "all"), None)
    return {"span_ns": s.span_ns,
            "ttft_ns": None if every is None else (every.ttft_p50_ns, every.ttft_p90_ns, every.ttft_p99_ns)}


def numbers_read_back(db_path: Path | str, run_id: str) -> dict:
    """The closing numbers of a run its writer process closed as complete and then died before
    it answered (app/replay.py `WriterDiedLate`): read from the store on a read-only connection
    of their own, as `summary` reads them: from the run's stored evidence where the writer got
    to store it, else computed from the rows (the summary's numbers alone: the whole evidence is
    the first reader's to compute and store, backfill.py; at 1M requests a minute or more in the
    process that holds the engine's memory, where the writer may just have been killed for its
    own). What it raises (a store held, damaged) the caller says instead of the numbers."""
    from tierdiag.diagnose.run.facts import stored_evidence
    from tierdiag.diagnose.run.numbers import compute_run_summary
    from tierdiag.store.reader import open_store, resolve_run

    with open_store(db_path) as con:
        run = resolve_run(con, run_id)
        stored = stored_evidence(con, run)
        summary = stored.summary(run) if stored is not None else None
        return closing_numbers(con, run_id, summary=summary if summary is not None else compute_run_summary(con, run))
