"""The stored run evidence's format: one row per run in `run_evidence`, written by evidence.py
when the run is closed and read by facts.py (the one reader); see evidence.py for what it holds
and when it is trusted::

    run_evidence(run_id, evidence_version, created_at, evidence_json)

`evidence_json` holds the sections `inputs`, `context`, `summary`, `totals`, `sessions` (null for
a run without later session turns), `size_curves` (null where the trace could not be read again),
`session_summary` (null for a run without sessions), `rank_summary` (null for a run of one rank)
and `miss_reasons` (reason -> tokens; null where the rows have none): summary's read-time parts,
absent from rows written before them, whose readers compute them from the rows (no version bump:
nothing else changed meaning), each a typed result
as JSON (dataclasses tagged with their class name, tuples marked as such, so that they read back
equal to what was computed). Bump EVIDENCE_VERSION whenever a stored class gains, loses or
renames a field, or a number in it is computed differently: old rows are then ignored, not
misread (tests/diagnose/test_evidence.py pins the stored fields).
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass

from tierdiag.diagnose.run.capacity import Capacity
from tierdiag.diagnose.dp.routing_loss import RoutingLoss
from tierdiag.diagnose.run.runcontext import LossEvidence, RunContext, TransferEvidence
from tierdiag.diagnose.session.session_pool import SessionPauses
from tierdiag.diagnose.run.size_curves import SizeCurve, SizeCurves
from tierdiag.diagnose.run.story import RunStory, VerdictShare
from tierdiag.diagnose.run.totals import RunTotals

EVIDENCE_VERSION = 13  # 13: RunContext.prefill_busy_ns (the run's batch time summed: explain's run eviction rate without a scan of every batch; issue 41); 12: RunStory.max_running, max_running_given, queued_cap_share, other_cap_share (the max_running_requests cap held the queue; issue 43why); 11: SizeCurves.sample_rate (the pass sampled over its touch budget; issue 41); 10: queue attribution key decode (issue 43: decode steps on the clock); 9: section `size_curves` (SizeCurves, size_curves.py; issue 40); 8: RunStory.evicted_while_waiting_* counts only prefixes that left every tier while waiting and were recomputed, wait parts gain memory_wait, other_wait_parts_ns / other_wait_ns, time_by_cause excess_share of max(excess, parts sum), LossEvidence.in_batch_tokens / trace_arrival_spread_ns, RunSummary.miss_reasons (always None when stored: read-time), RunStory.evicted_while_waiting_tokens (issue 40); 7  # 7: section `sessions` (SessionPauses, session_pool.py; issue 39), RunSummary.span_ns ends at the last served finish (issue 40); 6: RunSummary.ranks (always None when stored: read-time, diagnose/dp/ranks.py), RunContext.routing, Capacity.num_ranks, time_by_cause's routing row, per-rank story (issue 31); 5: RunSummary.median_reused_tokens_per_hit nearest rank (quantile_disc), LossEvidence.hot_competing_deciles_tokens, TransferEvidence.transfer_overhead_ns, queue attribution key memory_wait (was decode); 4: RunStory.other_busy_share/other_recompute_share; 2: RunSummary.sessions (always None when stored: read-time, diagnose/session/sessions.py); 3: RunContext gained story and capacity (issue 34)
_DC, _TUPLE = "__dataclass__", "__tuple__"
DATACLASS_TAG = _DC


# --------------------------------------------------------------------------- JSON, exactly


# Stored as themselves: what `encode` returns as it is given (exactly these types: a subclass, an
# enum say, would read back as something else).
_PLAIN = frozenset((bool, int, float, str, type(None)))


def encode(value):
    # The leaves, and a plain tuple's or list's leaves, first and without a call each: the close
    # encodes the size curves' thousands of (size, tokens) steps (issue 41: 7.5 -> ~2 ms of the
    # serial tail on the conversation trace). The same result as the generic order below, which
    # takes everything else (tests/diagnose/test_evidence.py holds the two equal).
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is tuple:
        if value and _plain_pairs(value):  # the curves' steps: no call a pair (issue 41, session 37)
            return {_TUPLE: [{_TUPLE: [a, b]} for a, b in value]}
        return {_TUPLE: [v if type(v) in _PLAIN else encode(v) for v in value]}
    if kind is list:
        return [v if type(v) in _PLAIN else encode(v) for v in value]
    if is_dataclass(value) and not isinstance(value, type):
        out = {_DC: type(value).__name__}
        for f in fields(value):
            out[f.name] = encode(getattr(value, f.name))
        return out
    if isinstance(value, tuple):
        return {_TUPLE: [encode(v) for v in value]}
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        if _DC in value or _TUPLE in value or not all(isinstance(k, str) for k in value):
            raise TypeError(f"a dict that would not read back as itself: keys {list(value)[:4]}")
        return {k: encode(v) for k, v in value.items()}
    if value is None or type(value) in (bool, int, float, str):
        return value
    # numpy scalars, Decimals, datetimes: JSON would store them as something else.
    raise TypeError(f"{type(value).__name__} is not stored as itself in JSON: {value!r}")


def _plain_pairs(value: tuple) -> bool:
    """Whether every item of `value` is a plain tuple of two leaves: the size curves' and the
    session pauses' (size, tokens) steps, thousands a run, each `{_TUPLE: [size, tokens]}` as
    `encode` makes it, made in one comprehension rather than a call each (~1.5 -> ~0.7 ms of the
    close's serial tail on the conversation trace's 5,269 steps)."""
    return all(type(v) is tuple and len(v) == 2 and type(v[0]) in _PLAIN and type(v[1]) in _PLAIN for v in value)


def decode(value, classes: dict):
    # A JSON leaf (exactly these types) is returned as it is, without a call: the size curves'
    # and the session pauses' thousands of (size, tokens) tuples (issue 41: ~4 -> ~2 ms of every
    # summary's and explain's start). The same result as the generic order below (a leaf is
    # neither dict nor list), which takes everything else (tests/diagnose/test_evidence.py).
    if isinstance(value, dict):
        if _TUPLE in value:
            return tuple([v if type(v) in _PLAIN else decode(v, classes) for v in value[_TUPLE]])
        if _DC in value:
            cls = classes[value[_DC]]  # KeyError: a class this section does not hold
            return cls(**{k: v if type(v) in _PLAIN else decode(v, classes) for k, v in value.items() if k != _DC})
        return {k: v if type(v) in _PLAIN else decode(v, classes) for k, v in value.items()}
    if isinstance(value, list):
        return [v if type(v) in _PLAIN else decode(v, classes) for v in value]
    return value


def section_classes(section: str) -> dict:
    """The classes a section may hold."""
    if section == "context":
        found = (RunContext, LossEvidence, TransferEvidence, RunStory, VerdictShare, Capacity, RoutingLoss)
    elif section == "totals":
        found = (RunTotals,)
    elif section == "sessions":
        found = (SessionPauses,)
    elif section == "size_curves":
        found = (SizeCurves, SizeCurve)
    elif section == "session_summary":
        from tierdiag.diagnose.session.sessions import EndedSession, PauseBucket, SessionSummary

        found = (SessionSummary, PauseBucket, EndedSession)
    elif section == "rank_summary":
        from tierdiag.diagnose.dp.ranks import Deployment, RankStats, RankSummary

        found = (RankSummary, RankStats, Deployment)
    elif section == "miss_reasons":
        found = ()  # a plain dict: reason -> tokens
    else:  # summary's numbers: imported by who reads them (explain does not: ~6 ms of its start-up)
        from tierdiag.diagnose.run import numbers as n

        found = (n.RunSummary, n.TierSplit, n.ClassStats, n.LoadBackTotals, n.SkipCount, n.EvictionCount,
                 n.RequestCount, n.ReasonCount, n.CauseShare)
    return {c.__name__: c for c in found}


def inputs(run) -> dict:
    """What of the runs row the stored numbers depend on (pool sizes, link peak, KV geometry)."""
    return {"config": run.config, "hardware": run.hardware, "data_plane": run.data_plane}
