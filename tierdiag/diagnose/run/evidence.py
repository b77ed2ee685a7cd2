"""Run evidence: the run-wide numbers every reader would recompute from all of a run's rows,
computed once when the run is closed and stored with it (docs/contract.md §5)::

    run_evidence(run_id, evidence_version, created_at, evidence_json)

`evidence_json` holds four sections, each a typed result as JSON (dataclasses tagged with their
class name, tuples marked as such, so that they read back equal to what was computed)::

    context   RunContext  (context.py)  summary's diagnosis, explain's "why", the advice rules
    summary   RunSummary  (numbers.py)  summary's numbers, without the diagnosis
    totals    RunTotals   (totals.py)   the bounds, load-backs and device evictions explain compares with
    sessions  SessionPauses (session_pool.py) the later session turns' stack distances (the session
                          advice rule); null for a run without later session turns
    size_curves SizeCurves (size_curves.py) the reuse each tier would find at every size, from one
                          pass over the run's page references: the trace is read again here, at
                          close, while it is surely there; null where it cannot be (gone, changed)
    session_summary SessionSummary (sessions.py) summary's sessions: survival by pause, the
                          sessions that ended early; null for a run without sessions (a join of
                          every later turn with what left its prefix while it queued: ~0.3 s of a
                          1M-request `summary` before it was stored; issue 41)
    rank_summary RankSummary (ranks.py) summary's per-rank section; null for a run of one rank
    miss_reasons {reason: tokens} (miss_reasons.py) summary's computed tokens by why they were not
                          reused; null where the rows have none (three more passes over every
                          request that `summary` made at read time)

On a million-request run these are seconds of work over every request, batch and eviction
(queue attribution, loss evidence, the token and class aggregates); stored, a reader fetches one
row. The diagnosis itself is still made by the reader from the stored context: its advice carries
what `tierdiag advise` verified after the run was closed.

Written by `record_run_evidence`, which the store's writer calls when it closes a run as complete
or interrupted (store/writer.py `RunWriter.finish`: replays, sweep and advise workers, imports),
after the run's rows and status are committed, in a transaction of its own on the writer's own
connection (the close opens and checkpoints the file once). A failure there is
one warning line on stderr and nothing else: the run stays as it was closed, with all its rows,
and the first reader that can write the store computes the evidence from the rows, with this
module's `compute_evidence`, and stores it (backfill.py; until then each reader computes it).
Observed runs (imported from a server) get none: their readers (diagnose/twin/observed.py) use
none of it.

This module computes and stores; it never reads the row back. Readers take it through
facts.py (`RunFacts`: the one reader, with the one "stored, else computed" fallback), and only when its `evidence_version` is
EVIDENCE_VERSION; otherwise (a store written before the table, a run closed by an older tierdiag,
a run still being recorded, a failed run, an observed one) they compute it from the rows, with
the same result (tests/diagnose/test_evidence.py checks both paths agree). Bump EVIDENCE_VERSION
(stored.py) whenever a stored class gains, loses or renames a field, or a number in it is computed
differently (stored.py, the row's format): old rows are then ignored, not misread.

A fourth section, `inputs`, holds what of the `runs` row the numbers were computed from (config,
hardware, data plane); a row whose inputs differ from the run's (a config edited since) is not
used. The summary's identity fields (name, status, trace path, model, gpu) are taken from the
`runs` row when read: a sweep's merge rewrites the trace path.
"""

from __future__ import annotations

import json
import sys

import duckdb

from tierdiag.diagnose.run.runcontext import compute_run_context
from tierdiag.diagnose.run.story import run_story
from tierdiag.diagnose.run.story_rows import folded_rows
from tierdiag.diagnose.read import run_context as read_ctx
from tierdiag.diagnose.read.run_context import batch_recompute_sql
from tierdiag.diagnose.run.numbers import compute_run_summary
from tierdiag.diagnose.session.session_pool import session_pauses
from tierdiag.diagnose.session.sessions import session_summary
from tierdiag.diagnose.dp.ranks import rank_summary
from tierdiag.diagnose.run.miss_reasons import run_miss_reasons
from tierdiag.diagnose.run.size_curves import size_curves
from tierdiag.diagnose.read.rows import current_catalog, second_cursor
from tierdiag.diagnose.read.run_scan import run_scan
from tierdiag.store.duckdb_core import alone_threads, release_cached_blocks, restore_threads
from tierdiag.diagnose.run.stored import EVIDENCE_VERSION, encode, inputs
from tierdiag.diagnose.run.totals import run_totals
from tierdiag.store.evidence import begin_run_evidence, replace_run_evidence, rollback_run_evidence


# --------------------------------------------------------------------------- compute and write


# The sections' threads beside the size curves (on the caller's): each a list of sections, run in
# that order on a cursor of its own (the story before the context where both share a thread: the
# context waits for it). Below LARGE_RUN_REQUESTS requests, four (the story, the run
# context, the session pauses, the rest: the close a replay waits for is its longest thread's,
# issue 41 session 20). From it on, where each section holds hundreds of MB (1M requests: the
# story ~450 MB over the process's start, the context ~510, the session pauses ~320, the summary
# ~260), LARGE_RUN_THREADS: fewer at once bounds the close's peak (the writer process's, with the
# rows it holds), at the cost of a longer wall beside a curves' pass already walked while recording.
# The miss reasons first on the rest's thread: the context (the longest thread) takes them from
# it rather than querying them too (`compute_evidence`). The caller's `beside` (the writer's
# close: the request lookup's rows) on the first of these threads to be done with its sections
# (the session pauses' on the conversation trace, ~3 ms): long before the longest threads end,
# where on the curves' thread, once they were made, it was ~6 ms of the serial tail the replay
# waits for (issue 41, session 25).
SMALL_RUN_THREADS = (("story",), ("context",), ("sessions",),
                     ("miss_reasons", "summary", "totals", "session_summary", "rank_summary"))
# In the large runs' plan the first LARGE_RUN_BESIDE_CURVES sections run beside the size curves
# (the small ones: at 1M requests totals ~+60 MB, the session summary ~+95, the rank summary
# nothing, the miss reasons a pass of sums), the others (the story, the context, the session pauses,
# the summary: each +250-420 MB at 1M) only once the curves are made (or failed): the curves'
# pass was the 1M close's peak with the story beside it (1,140 MB against ~920 for the largest
# section alone; issue 41, session 24). The wall is the thread's sections plus what is left of
# the curves once the small sections are done.
LARGE_RUN_THREADS = (("totals", "session_summary", "rank_summary", "miss_reasons", "story", "context", "sessions",
                      "summary"),)
LARGE_RUN_BESIDE_CURVES = 4
LARGE_RUN_REQUESTS = 100_000


def evidence_threads(num_requests: int | None) -> tuple[tuple[str, ...], ...]:
    """The sections' threads for a run of `num_requests` requests (None: unknown, as small)."""
    return LARGE_RUN_THREADS if (num_requests or 0) >= LARGE_RUN_REQUESTS else SMALL_RUN_THREADS


def compute_evidence(con: duckdb.DuckDBPyConnection, run, *, computed: dict | None = None,
                     beside=None, dumped: dict | None = None) -> dict:
    """The sections, from the run's rows, as the JSON-ready dict that is stored; `computed`, if
    given, is updated with the sections as computed (name -> object: the close's closing numbers
    take the summary from it instead of reading it back). `beside`, if given, is called once
    while the sections are computed (the writer's close: the request lookup's rows on a cursor of
    its own, `record_run_evidence`): below LARGE_RUN_REQUESTS on whichever thread is first done
    with its sections (this one, once the size curves are made, included); from it on, on this
    thread once the curves are made; what it raises is raised, as a section's would be.
    `dumped`, if given, is updated with the size curves' section as its JSON text
    (`write_evidence` takes it as is).

    The size curves (the trace's pages and one pass over them: Python and numpy; fed while
    recording in a writer process, mostly done by now) on this thread, while the other sections
    run on threads of their own, one cursor each (`evidence_threads`): below LARGE_RUN_REQUESTS
    four, the run context's queries, its story's (the context's largest part: a join of every
    finished request with what left its prefix while it waited; the context takes it from that
    thread), the session pauses' (numpy over every later turn's pairs: the largest section at 200k
    requests, ~45 % of the others' CPU, issue 41 session 20) and every other section's (DuckDB
    runs a query without the GIL, and at a replay's close the engine's core is idle, waiting for
    this); from it on, fewer, one section after another (the peak memory, issue 41). The results
    are the same as one after the other: the rows are committed and nothing writes meanwhile."""
    import threading
    from contextlib import ExitStack

    done: dict = {}
    story_done = threading.Event()
    rows_done = threading.Event()  # the fold's rows taken (or not there): the context's wait for them

    def the_story(cur):
        try:
            counts: dict = {}
            rec = batch_recompute_sql(cur)
            # Its per-request rows folded while the run was recorded, where they are the run's
            # (story_rows.py: the close's largest query, issue 41); else queried by run_story.
            folded, done["context_rows"], done["eviction_rows"], done["scan_rows"] = folded_rows(
                cur, run.run_id, use=rec is not None)
            rows_done.set()
            done["story"] = run_story(cur, run.run_id, rec, cause_counts=counts, requests=folded,
                                      batches=None if one_thread else lambda: batches(cur, rec))
            if counts:  # the story read its requests (empty: it read none, or no finished one; the summary queries)
                done["cause_counts"] = counts
            return done["story"]
        except BaseException as exc:  # noqa: BLE001 - raised only where the context asks for the story
            done["story_error"] = exc
            return None
        finally:
            rows_done.set()
            story_done.set()

    def story():
        story_done.wait()
        if "story_error" in done:
            raise done["story_error"]
        if "story" not in done:
            raise RuntimeError("the run story was not computed: its thread failed before it")
        return done["story"]

    def context_rows():
        # The run context's per-request columns (its wait windows, allocations, lost sizes, sums
        # by skipped reason, ideal arrivals), folded while recording beside the story's rows and
        # checked with them (context_rows.py: six queries, ~21 ms of the context's thread, the
        # longest, on the conversation trace at load 9; issue 41, session 32). None: queried.
        rows_done.wait()
        return done.get("context_rows")

    def eviction_rows():
        # The eviction queries' results (the removals' re-references, the device evictions, the
        # summary's by tier and action, owners and causes), folded while recording beside the
        # story's rows and checked with them (eviction_rows.py: five statements, ~23 ms of the
        # close's CPU on the conversation trace; issue 41, session 34). None: queried.
        rows_done.wait()
        return done.get("eviction_rows")

    def cause_counts():
        # The summary's requests per primary cause: the story's query reads every finished
        # request's cause code; counted there, not queried again (issue 41: ~13 ms of the close's
        # CPU on the conversation trace). None where the story read none (no per-batch
        # recompute, or it failed): the summary queries them.
        story_done.wait()
        return done.get("cause_counts")

    scan_lock = threading.Lock()

    def scan(cur):
        # The run-wide sums of the summary, the context, the totals and the miss reasons over the
        # run's requests and transfers (read/run_scan.py): one query, not eleven of ~1-2 ms each
        # (issue 41, session 26), by whichever thread asks first, on its cursor, the others
        # waiting for it (the same rows: nothing writes meanwhile). Below LARGE_RUN_REQUESTS,
        # folded while recording where it could be, checked with the story's rows (scan_rows.py:
        # ~13 ms of the close's CPU on the conversation trace; issue 41, session 35): taken from
        # the story's thread once its check is done (~2-3 ms in), else queried.
        with scan_lock:
            if "scan" not in done:
                if not one_thread:
                    rows_done.wait()
                folded = done.get("scan_rows")
                done["scan"] = folded if folded is not None else run_scan(cur, run.run_id, miss=True)
            return done["scan"]

    batch_lock = threading.Lock()

    def batches(cur, rec):
        # The run's batch arrays, which the story and the run context's attribution both read:
        # queried once (~2-3 ms of CPU on the conversation trace; issue 41, session 26), by
        # whichever thread asks first, the other waiting for it. Not in the large runs' plan
        # (one thread): there each section lets go of its arrays before the next (the peak).
        with batch_lock:
            if "batches" not in done:
                done["batches"] = read_ctx.batch_arrays(cur, run.run_id, rec)
            return done["batches"]

    miss_lock = threading.Lock()

    def miss_reasons(cur):
        # The miss reasons (their sums: the scan's) are a section and the context's in-batch
        # tokens: made once, by whichever thread asks first, the other waiting for it. Issue 41,
        # session 23.
        with miss_lock:
            if "miss_reasons" not in done:
                done["miss_reasons"] = run_miss_reasons(cur, run.run_id, sums=scan(cur).miss_sums, summed=True)
            return done["miss_reasons"]

    work = {"story": the_story,
            "context": lambda c: compute_run_context(
                c, run, story=story, miss_reasons=lambda: miss_reasons(c), scan=lambda: scan(c),
                batches=None if one_thread else lambda rec: batches(c, rec), rows=context_rows,
                evictions=eviction_rows),
            "sessions": lambda c: session_pauses(c, run),
            "summary": lambda c: compute_run_summary(c, run, cause_counts=cause_counts, scan=lambda: scan(c),
                                                     evictions=eviction_rows),
            # (not in the large runs' plan: there the totals come before the story on its one
            # thread, and a run that large has no fold: story_rows.py MOST_ROWS)
            "totals": lambda c: run_totals(c, run.run_id, scan=lambda: scan(c),
                                           evictions=None if one_thread else eviction_rows),
            "session_summary": lambda c: session_summary(c, run),
            "rank_summary": lambda c: rank_summary(c, run), "miss_reasons": miss_reasons}

    plan = evidence_threads(getattr(run, "num_requests", None))
    beside_lock = threading.Lock()
    beside_left = [beside] if beside is not None else []

    def take_beside():
        """`beside`, to the first thread that asks (None once taken: called once)."""
        with beside_lock:
            return beside_left.pop() if beside_left else None

    # The one-thread plan (large runs): once the size curves are made (their queries done, nothing
    # else on this instance runs one), each section's cached blocks are let go before the next
    # (store/duckdb_core.py `release_cached_blocks`: the instance's limit a megabyte for a statement,
    # so never while another cursor's query may run; issue 41: a 1M close's peak).
    one_thread = len(plan) == 1
    curves_done = threading.Event()
    curves_over = threading.Event()  # made or failed: the sections after LARGE_RUN_BESIDE_CURVES wait for it

    def on_a_thread(cur, names) -> threading.Thread:
        def compute() -> None:
            try:
                released = False  # let go since the curves were made, with no section after
                for at, name in enumerate(names):
                    if one_thread and at == LARGE_RUN_BESIDE_CURVES:
                        curves_over.wait()
                        if curves_done.is_set() and not released:  # the curves' blocks, before the large ones
                            release_cached_blocks(cur)
                    done[name] = work[name](cur)
                    released = one_thread and curves_done.is_set()
                    if released:
                        release_cached_blocks(cur)
                if not one_thread:
                    first = take_beside()
                    if first is not None:
                        first()
            except BaseException as exc:  # noqa: BLE001 - re-raised below, on the caller's thread
                done.setdefault("error", exc)
            finally:
                if "story" in names:
                    rows_done.set()
                    story_done.set()  # failed before its story: the context raises the failure, not waits

        thread = threading.Thread(target=compute, name="tierdiag-evidence", daemon=True)
        thread.start()
        return thread

    with ExitStack() as stack:
        catalog = current_catalog(con)
        threads: list[threading.Thread] = []
        try:
            try:
                # Started inside the try: a thread's cursor or start refused leaves those started
                # joined below, not running on cursors the ExitStack closes under them (the lookup
                # begun on one of them then, its transaction left open; issue 41, session 35).
                for names in plan:
                    threads.append(on_a_thread(stack.enter_context(second_cursor(con, catalog)), names))
                curves = size_curves(con, run)
            finally:
                curves_over.set()
            curves_done.set()
            # Encoded here, while the other threads may still run (~2.5 ms: the curves' steps are
            # the evidence's largest section), not after they have all joined.
            curves_encoded = encode(curves)
            if dumped is not None:  # its JSON text too (~2-3.5 ms: ~95 % of the row's), not in the serial write
                dumped["size_curves"] = _dumps(curves_encoded)
            first = take_beside()
            if first is not None:
                first()
        finally:
            curves_over.set()  # a failure before the curves (a thread's start): nothing waits for ever
            for thread in threads:
                thread.join()
    if "error" in done:
        raise done["error"]
    if one_thread:  # every section made, no query running: their blocks let go before the write
        release_cached_blocks(con)
    names = ("context", "summary", "totals", "sessions", "session_summary", "rank_summary", "miss_reasons")
    if computed is not None:
        computed.update({name: done[name] for name in names}, size_curves=curves)
    return {"inputs": encode(inputs(run)), "context": encode(done["context"]),
            "summary": encode(done["summary"]), "totals": encode(done["totals"]), "sessions": encode(done["sessions"]),
            "size_curves": curves_encoded, "session_summary": encode(done["session_summary"]),
            "rank_summary": encode(done["rank_summary"]), "miss_reasons": encode(done["miss_reasons"])}


def _dumps(value) -> str:
    return json.dumps(value, separators=(",", ":"))


def evidence_json(sections: dict, dumped: dict | None = None) -> str:
    """`sections` as the row's JSON text: `json.dumps(sections, separators=(",", ":"))`, with the
    sections in `dumped` (name -> that section's JSON text, dumped alike) taken as they are: the
    same text (a dict of str keys dumps as its items' texts joined), made where the section was
    made (the size curves', on their thread: issue 41, session 26)."""
    if not dumped:
        return _dumps(sections)
    return "{" + ",".join(_dumps(str(k)) + ":" + (dumped[k] if k in dumped else _dumps(v))
                          for k, v in sections.items()) + "}"


def write_evidence(con: duckdb.DuckDBPyConnection, run_id: str, sections: dict, *, begun: bool = False,
                   dumped: dict | None = None) -> None:
    """Replace the run's row, and its rows of `request_lookup` (store/lookup.py), in one transaction
    (creating the tables in a store made before them). `begun`: that transaction is open on `con`,
    the lookup's rows in it (store/evidence.py `begin_run_evidence`). `dumped`: sections already
    as JSON text (`evidence_json`)."""
    replace_run_evidence(con, run_id, EVIDENCE_VERSION, evidence_json(sections, dumped), begun=begun)


# The threads a large run's request lookup is written on, after its sections (`record_run_evidence`).
LOOKUP_THREADS = 2

# How long to wait for another process to let go of the store, to read the rows and to write the
# row: a reader's wait. Beyond it the run goes without stored evidence (its readers compute it).
WAIT_S = 3.0


def record_run_evidence(db_path, run_id: str, *, con: duckdb.DuckDBPyConnection | None = None,
                        computed: dict | None = None) -> str | None:
    """Compute and store the evidence of run `run_id`, whose rows and final status are committed
    to the store at `db_path`. With `con` (the store's writer closing the run: its own read-write
    connection) the rows are read and the row written through it, with no open and no checkpoint
    of their own in the close the replay waits for; the file stays the writer's meanwhile (a
    reader waits, as for any write). Without, no connection of this process may hold the file:
    the rows are read through a read-only connection, so other readers can open the file
    meanwhile (seconds on a million requests), and it is held for writing only for the one short
    INSERT. Never raises an Exception: a failure is printed as one warning line on stderr and
    returned (None when all went well); the run is untouched by it. `computed`: as
    compute_evidence's, filled once the sections are stored (left empty where they were not:
    then a reader computes them from the rows)."""
    try:
        from tierdiag.diagnose.read.kind import view_of
        from tierdiag.store.reader import connect_with_retry, run_info

        if con is not None:
            run = run_info(con, run_id)
            if run is None or not view_of(run).engine_parts:
                return None  # observed runs: their readers use none of it
            made: dict = {}
            # The request lookup's rows (a hash and a sort of every request id: ~10 ms on the
            # conversation trace, ~0.17 s of CPU at 200k requests) are written on a cursor of their
            # own, in the transaction the row then joins: below LARGE_RUN_REQUESTS while the
            # sections are computed (on the first of their threads to be done: compute_evidence),
            # not after them in the close the replay waits for (issue 41); from it on after them,
            # as before (beside them it held ~25 MB more at 200k requests, +25-140 MB at 1M: the
            # large runs' plan bounds the peak), on two threads (LOOKUP_THREADS: 1M, 1.4 -> 0.7-0.9
            # s of the calling thread, session 31). The same rows, committed together, either way.
            with second_cursor(con) as lk:
                begun = False

                def lookup() -> None:
                    nonlocal begun
                    begin_run_evidence(lk, run_id)
                    begun = True

                small = evidence_threads(getattr(run, "num_requests", None)) is SMALL_RUN_THREADS
                try:
                    dumped: dict = {}
                    sections = compute_evidence(con, run, computed=made, beside=lookup if small else None,
                                                dumped=dumped)
                except BaseException:
                    if begun:
                        rollback_run_evidence(lk, run_id)
                    raise
                if not begun:
                    # A large run's, after its sections (their peak): nothing else queries now and
                    # the engine's process only waits, so on its core too: the rows in the same
                    # order (a sort by (bucket, seq), which orders every row), ~1.6 s of one
                    # thread at 1M requests (store/duckdb_core.py `alone_threads`; issue 41).
                    had = alone_threads(lk, LOOKUP_THREADS)
                    try:
                        lookup()
                    finally:
                        if had is not None:
                            try:
                                restore_threads(lk, had)
                            except BaseException:
                                if begun:  # the lookup's transaction: not left open
                                    rollback_run_evidence(lk, run_id)
                                raise
                write_evidence(lk, run_id, sections, begun=True, dumped=dumped)
            if computed is not None:
                computed.update(made)
            return None
        with connect_with_retry(db_path, read_only=True, wait_s=WAIT_S) as ro:
            run = run_info(ro, run_id)
            if run is None or not view_of(run).engine_parts:
                return None
            made = {}
            sections = compute_evidence(ro, run, computed=made)
        with connect_with_retry(db_path, read_only=False, wait_s=WAIT_S) as rw:
            write_evidence(rw, run_id, sections)
        if computed is not None:
            computed.update(made)
        return None
    except Exception as exc:  # noqa: BLE001 - by contract: the run is closed already, readers fall back
        text = str(exc).strip()
        line = "".join(c if c.isprintable() else repr(c)[1:-1] for c in (text.splitlines()[0] if text else ""))
        why = f"{type(exc).__name__}: {line[:200]}" if line else type(exc).__name__
        msg = (f"run {run_id} is recorded in full, but its run evidence was not stored ({why}); "
               "the first reader that can write the store computes it from the rows and stores it")
        sys.stderr.write(f"tierdiag: warning: {msg}\n")
        sys.stderr.flush()
        return msg
