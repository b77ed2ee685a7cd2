"""Run evidence a reader had to compute, stored by that reader: computed at most once, then read.

A run closed as `complete` or `interrupted` normally has its evidence stored by its close
(evidence.py); a `failed` run's close stores none (its writer or its disk failed there). Some
complete and interrupted runs have none too: an interrupted run whose close a second SIGINT/SIGTERM ended
once its rows and status were committed (docs/contract.md section 7; at 1M requests the
evidence is 18-146 s of that close), a close whose evidence failed (one warning line), a row
an older tierdiag wrote (another `evidence_version`) or one computed from another config (its
`inputs` differ). Every reader used to compute it from the rows again, each time (issue 41).

Now the first reader (`summary`, `explain`, `slow`, `compare`, `report`, `advise`, their JSON
views: whatever makes a `RunFacts`) that finds none for such a run computes the whole evidence
with the close's own code (`compute_evidence`, the same threads and sections), answers from it
(decoded from the very JSON text it will store: what a later reader reads back), and, once its
answer is out and its store closed (cli/exits.py calls `store_pending`), opens the store for
writing for a moment and stores it with the close's write (store/evidence.py
`store_missing_evidence`: the row and the run's `request_lookup` rows in one transaction, the
same text a close stores for the same rows: benchmarks/compare_evidence.py). The next reader
reads one row.

Not stored (the reader answers from what it computed, says nothing, loses nothing; the next
reader computes it again and tries): the store cannot be written (a read-only file or folder:
then the reader does not compute the whole evidence either, only what it needs, as before), it
is held by another process past STORE_WAIT_S (a replay writing, another reader), or another
connection of this process still holds it. A `failed` run's is stored as an interrupted run's: its rows
are as final and as consistent (whole writes, committed in order: store/evidence.py
`FINAL_STATUSES`), so what a reader computes from them is the same each time (issue 41, session
39). Never stored: a run whose stored status is not final (`running`, also a dead replay's,
which readers take as interrupted: nothing says its writer is done: its rows may still grow),
an observed run, a store of an older
schema version (read through views: nothing is written to it), and a read-write connection's
reads (the store's writer: its close reads the summary back where its evidence was not stored,
close.py; that close is neither made longer nor retried here). Another reader that stored the
same row first: nothing is written twice. The size curves are what the trace gives now, as for
a close now: null where it is gone or changed (as a close stores them then; issue 41 session 38).

A signal while the row is written: the transaction is rolled back (nothing half-written), and
the command ends with the interrupt's code and one line saying the evidence was not stored.
"""

from __future__ import annotations

import json
import os
import sys
import weakref

import duckdb

# Waiting for another process to let go of the store: a reader's exit waits this long at most
# (a replay's mid-run writes hold it a moment; its writer waits for readers, store/writer.py).
STORE_WAIT_S = 1.0

# (store path, run id) -> the evidence's JSON text, to store once the command's answer is out.
_PENDING: dict[tuple[str, str], str] = {}
# connection -> {run id: the sections}: one computation a run for every RunFacts of a command.
_MADE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def computed_sections(con: duckdb.DuckDBPyConnection, run) -> dict | None:
    """For RunFacts, where no current row is stored: the run's whole evidence computed now (and
    queued for `store_pending`), as the sections a stored row's JSON reads back as (facts.py
    `StoredEvidence` takes them), where it can be stored (module doc); else None (the reader
    computes the sections it needs, as before)."""
    from tierdiag.diagnose.read.kind import view_of

    if not view_of(run).engine_parts:
        return None
    try:
        made = _MADE.setdefault(con, {})
    except TypeError:  # not weakly referable (no DuckDB connection): nothing to share
        made = {}
    if run.run_id in made:
        return made[run.run_id]
    path = _storable_path(con, run)
    if path is None:
        return None
    from tierdiag.diagnose.run.evidence import compute_evidence, evidence_json

    try:
        sections = compute_evidence(con, run)
    except Exception:  # noqa: BLE001 - the reader computes what it needs instead, and says what that raises
        return None
    text = evidence_json(sections)
    made[run.run_id] = read_back = json.loads(text)
    _PENDING[(path, run.run_id)] = text
    return read_back


def _storable_path(con: duckdb.DuckDBPyConnection, run) -> str | None:
    """The store's file where this reader may store the run's evidence (module doc), else None."""
    from tierdiag.diagnose.read.queries import store_state
    from tierdiag.store.evidence import FINAL_STATUSES
    from tierdiag.store.reader import views_shown
    from tierdiag.store.schema import SCHEMA_VERSION

    if views_shown(con):  # an older schema's store, read through views
        return None
    try:
        state = store_state(con, run.run_id)
    except duckdb.Error:  # not a store this can tell (a cursor on another catalog): as before
        return None
    path = state.path
    # Read-write: the store's writer, whose close reads the summary back where its evidence was
    # not stored (close.py `closing_numbers`): that close is not made longer nor retried here.
    if (path is None or not state.read_only or state.schema_version != SCHEMA_VERSION
            or state.stored_status not in FINAL_STATUSES or not os.path.isfile(path)):
        return None
    folder = os.path.dirname(os.path.abspath(path))
    if not (os.access(path, os.R_OK | os.W_OK) and os.access(folder, os.W_OK | os.X_OK)):  # DuckDB's .wal beside it
        return None
    return path


def pending() -> list[tuple[str, str]]:
    """The (store, run id) pairs `store_pending` would store."""
    return list(_PENDING)


def store_pending() -> list[str]:
    """Store what this process's readers computed (`computed_sections`), each in one transaction
    of its own, once every connection of the command is closed (cli/exits.py, after the answer).
    Returns the run ids stored. Not stored, silently: the store held by another process past
    STORE_WAIT_S, or by a connection of this one; any other failure is one warning line; an
    interrupt, RunInterrupted (rolled back)."""
    from tierdiag import signals
    from tierdiag.diagnose.run.stored import EVIDENCE_VERSION
    from tierdiag.errors import RunInterrupted
    from tierdiag.store.evidence import store_missing_evidence
    from tierdiag.store.reader import connect_with_retry, first_line, is_lock_error

    done = []
    while _PENDING:
        (path, run_id), text = _PENDING.popitem()
        try:
            with connect_with_retry(path, read_only=False, wait_s=STORE_WAIT_S) as rw:
                if store_missing_evidence(rw, run_id, EVIDENCE_VERSION, text):
                    done.append(run_id)
        except KeyboardInterrupt:
            _PENDING.clear()
            raise RunInterrupted(_interrupted_line(run_id)) from None
        except (duckdb.Error, OSError) as exc:
            if signals.received() is not None:  # DuckDB's own error around the interrupt
                _PENDING.clear()
                raise RunInterrupted(_interrupted_line(run_id)) from None
            if isinstance(exc, duckdb.ConnectionException) or (isinstance(exc, duckdb.IOException)
                                                                and is_lock_error(exc)):
                continue  # held (by another process, or still by this one): the next reader stores it
            why = "".join(c if c.isprintable() else repr(c)[1:-1] for c in first_line(exc))[:200]
            sys.stderr.write(f"tierdiag: warning: run {run_id}'s evidence was computed but not stored "
                             f"({type(exc).__name__}: {why}); the next reader computes it again\n")
            sys.stderr.flush()
    return done


def _interrupted_line(run_id: str) -> str:
    return (f"interrupted while storing run {run_id}'s evidence: none of it stored "
            "(the answer above is whole; the next reader computes and stores it)")
