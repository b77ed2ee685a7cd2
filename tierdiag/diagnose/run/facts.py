"""A run's run-wide facts, and the one reader of the evidence stored with it.

    facts = RunFacts(con, run)
    facts.context(attribution=...)   RunContext   (context.py)  the diagnosis, explain's "why", advice
    facts.summary_numbers()          RunSummary   (numbers.py)  summary's numbers, diagnosis None
    facts.totals() / facts.bounds    RunTotals    (totals.py)   what explain compares a request with
    facts.session_pauses()           SessionPauses (session_pool.py) the session advice rule's distances
    facts.size_curves()              SizeCurves   (size_curves.py) reuse against each tier's size
    facts.session_summary()          SessionSummary (sessions.py) summary's survival by pause, ended sessions
    facts.rank_summary()             RankSummary  (ranks.py)    summary's per-rank section
    facts.miss_reasons()             {reason: tokens} (miss_reasons.py) summary's computed tokens by reason

Each is taken from the `run_evidence` row stored when the run was closed (evidence.py writes it,
stored.py is its format) where that row is there and current, else computed from the run's rows
(with the same result: tests/diagnose/test_evidence.py), once per `RunFacts`. This is the only
place that reads the row: "stored, else computed" is written here, once.

Where no current row is there, the first reader that can write the store computes the whole
evidence with the close's code, answers from it and stores it once its answer is out
(backfill.py): the next reader reads the row.

A row is not used (and the facts are computed) when: the store has no such table (written before
it), the run has none (still recording, failed, observed, closed by an older tierdiag), its
evidence_version is not EVIDENCE_VERSION, it is not JSON, its `inputs` differ from the run's
(a config edited since), or a section does not decode (a hand-edited row).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING

import duckdb

from tierdiag.diagnose.run.runcontext import RunContext, compute_run_context
from tierdiag.diagnose.read import queries
from tierdiag.diagnose.read.kind import view_of
from tierdiag.diagnose.session.session_pool import SessionPauses, session_pauses
from tierdiag.diagnose.run.size_curves import SizeCurves, size_curves
from tierdiag.diagnose.run.stored import DATACLASS_TAG, EVIDENCE_VERSION, decode, inputs, section_classes
from tierdiag.diagnose.run.totals import RunTotals, run_totals

if TYPE_CHECKING:  # summary's numbers are imported where they are computed: explain never asks for them
    from tierdiag.diagnose.run.numbers import RunSummary


class StoredEvidence:
    """One run's stored evidence, as stored; each section decoded when first asked for. A section
    that does not decode (a hand-edited row) reads as None."""

    def __init__(self, sections: dict):
        self._sections = sections
        self._decoded: dict = {}

    def _get(self, section: str, cls_name: str):
        if section not in self._decoded:
            value = None
            raw = self._sections.get(section)
            if isinstance(raw, dict) and raw.get(DATACLASS_TAG) == cls_name:
                try:
                    value = decode(raw, section_classes(section))
                except (KeyError, TypeError, ValueError):
                    value = None
            self._decoded[section] = value
        return self._decoded[section]

    def context(self, run) -> RunContext | None:
        """The run's RunContext (queue attribution included)."""
        return self._get("context", "RunContext")

    def summary(self, run) -> RunSummary | None:
        """The run's RunSummary numbers, diagnosis None; the identity fields (name, status, trace
        path, model, gpu) from the runs row (a sweep's merge rewrites the trace path)."""
        s = self._get("summary", "RunSummary")
        if s is None:
            return None
        return replace(s, run_id=run.run_id, run_name=run.name, status=run.status, trace_path=run.trace_path,
                       model=run.config.get("model"), gpu=run.config.get("gpu"), diagnosis=None)

    def totals(self) -> RunTotals | None:
        """explain's RunTotals."""
        return self._get("totals", "RunTotals")

    def sessions(self) -> tuple[bool, SessionPauses | None]:
        """(stored, the run's SessionPauses): stored as null for a run without later session turns;
        (False, None) where the row has no such section or it does not decode."""
        if "sessions" in self._sections and self._sections["sessions"] is None:
            return True, None
        found = self._get("sessions", "SessionPauses")
        return found is not None, found

    def session_summary(self) -> tuple[bool, object]:
        """(stored, the run's sessions.SessionSummary): stored as null for a run without sessions;
        (False, None) where the row has no such section (written before it) or it does not decode."""
        if "session_summary" in self._sections and self._sections["session_summary"] is None:
            return True, None
        found = self._get("session_summary", "SessionSummary")
        return found is not None, found

    def rank_summary(self) -> tuple[bool, object]:
        """(stored, the run's ranks.RankSummary): stored as null for a run of one rank; (False,
        None) where the row has no such section (written before it) or it does not decode."""
        if "rank_summary" in self._sections and self._sections["rank_summary"] is None:
            return True, None
        found = self._get("rank_summary", "RankSummary")
        return found is not None, found

    def miss_reasons(self) -> tuple[bool, dict | None]:
        """(stored, reason -> tokens): stored as null where the rows have none; (False, None)
        where the row has no such section or it is not such a dict."""
        if "miss_reasons" not in self._sections:
            return False, None
        raw = self._sections["miss_reasons"]
        if raw is None:
            return True, None
        if isinstance(raw, dict) and all(isinstance(k, str) and type(v) is int for k, v in raw.items()):
            return True, dict(raw)
        return False, None

    def size_curves(self) -> tuple[bool, SizeCurves | None]:
        """(stored, the run's SizeCurves): stored as null where the trace could not be read again
        at close; (False, None) where the row has no such section or it does not decode."""
        if "size_curves" in self._sections and self._sections["size_curves"] is None:
            return True, None
        found = self._get("size_curves", "SizeCurves")
        return found is not None, found


def stored_evidence(con: duckdb.DuckDBPyConnection, run) -> StoredEvidence | None:
    """The evidence stored with `run` when it was closed, or None where no current row is there."""
    if not view_of(run).engine_parts:
        return None
    row = queries.stored_evidence(con, run)
    if row is None or row[0] != EVIDENCE_VERSION:
        return None
    try:
        sections = json.loads(row[1])
    except (TypeError, ValueError, RecursionError):
        return None
    if not isinstance(sections, dict) or sections.get("inputs") != inputs(run):
        return None
    return StoredEvidence(sections)


class RunFacts:
    """One run's facts: stored where they are there, else computed; each once, then kept."""

    def __init__(self, con: duckdb.DuckDBPyConnection, run):
        self._con = con
        self.run = run
        self.stored = stored_evidence(con, run)
        if self.stored is None:
            # None stored (a close cut short, a failed one, an older tierdiag's row): the whole
            # evidence computed once, answered from and stored after the answer, where this
            # reader can write the store (backfill.py); else each fact computed as asked for.
            from tierdiag.diagnose.run.backfill import computed_sections

            sections = computed_sections(con, run)
            self.stored = StoredEvidence(sections) if sections is not None else None
        self._computed: dict = {}

    def _fact(self, stored, key, compute):
        """The one fallback: the stored value, else computed (and kept)."""
        if stored is not None:
            return stored
        if key not in self._computed:
            self._computed[key] = compute()
        return self._computed[key]

    def context(self, *, attribution: bool = True) -> RunContext:
        """The run context. `attribution=False`: the caller does not need the run's queue
        attribution, so where the context is computed it is left out (a pass over every request
        and batch); a stored context has it anyway."""
        return self._fact(self.stored and self.stored.context(self.run), ("context", attribution),
                          lambda: compute_run_context(self._con, self.run, attribution=attribution))

    def summary_numbers(self) -> RunSummary:
        """summary's numbers, diagnosis None."""
        from tierdiag.diagnose.run.numbers import compute_run_summary

        return self._fact(self.stored and self.stored.summary(self.run), "summary",
                          lambda: compute_run_summary(self._con, self.run))

    def totals(self) -> RunTotals:
        return self._fact(self.stored and self.stored.totals(), "totals",
                          lambda: run_totals(self._con, self.run.run_id))

    def session_pauses(self) -> SessionPauses | None:
        """The run's later session turns and their stack distances (None: it has none)."""
        stored, value = self.stored.sessions() if self.stored is not None else (False, None)
        if stored:
            return value
        if "sessions" not in self._computed:
            self._computed["sessions"] = session_pauses(self._con, self.run)
        return self._computed["sessions"]

    def session_summary(self):
        """summary's sessions.SessionSummary (None: the run has no sessions)."""
        stored, value = self.stored.session_summary() if self.stored is not None else (False, None)
        if stored:
            return value
        if "session_summary" not in self._computed:
            from tierdiag.diagnose.session.sessions import session_summary

            self._computed["session_summary"] = session_summary(self._con, self.run)
        return self._computed["session_summary"]

    def rank_summary(self):
        """summary's ranks.RankSummary (None: a run of one rank)."""
        stored, value = self.stored.rank_summary() if self.stored is not None else (False, None)
        if stored:
            return value
        if "rank_summary" not in self._computed:
            from tierdiag.diagnose.dp.ranks import rank_summary

            self._computed["rank_summary"] = rank_summary(self._con, self.run)
        return self._computed["rank_summary"]

    def miss_reasons(self) -> dict[str, int] | None:
        """summary's reason -> tokens over the run's finished requests (None: the rows have none)."""
        stored, value = self.stored.miss_reasons() if self.stored is not None else (False, None)
        if stored:
            return value
        if "miss_reasons" not in self._computed:
            from tierdiag.diagnose.run.miss_reasons import run_miss_reasons

            self._computed["miss_reasons"] = run_miss_reasons(self._con, self.run.run_id)
        return self._computed["miss_reasons"]

    def size_curves(self) -> SizeCurves | None:
        """The run's size curves (None: its trace could not be read again, at close or now)."""
        stored, value = self.stored.size_curves() if self.stored is not None else (False, None)
        if stored:
            return value
        if "size_curves" not in self._computed:
            self._computed["size_curves"] = size_curves(self._con, self.run)
        return self._computed["size_curves"]

    @property
    def bounds(self) -> tuple[int, int]:
        """The run's first arrival and last finish: where every view's clock starts."""
        return self.totals().bounds


def run_facts(con: duckdb.DuckDBPyConnection, run) -> RunFacts:
    """`RunFacts(con, run)`: kept for app/advise.py until the commands' rework lands (then gone)."""
    return RunFacts(con, run)


def run_context(con: duckdb.DuckDBPyConnection, run, *, attribution: bool = True) -> RunContext:
    """The run context alone (`RunFacts(con, run).context(...)`)."""
    return RunFacts(con, run).context(attribution=attribution)


def run_bounds(con: duckdb.DuckDBPyConnection, run) -> tuple[int, int]:
    """The run's first arrival and last finish (`RunFacts(con, run).bounds`)."""
    return RunFacts(con, run).bounds
