"""The read model's questions with logic of their own (diagnose/read/compare.py, sessions.py,
totals.py): checked against the same answer worked out in Python over hand-made rows, with
hostile values where a caller hands one in."""

from __future__ import annotations

import itertools

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierdiag.diagnose.read.compare import RequestPairs
from tierdiag.diagnose.read.sessions import ended_sessions, pause_totals
from tierdiag.diagnose.read.totals import EVICTION_REQUESTS, evictions_by_request
from tierdiag.store.schema import create_statements


_STORE: list[duckdb.DuckDBPyConnection] = []
_IDS = itertools.count()


def _store() -> duckdb.DuckDBPyConnection:
    """One in-memory store for the module (a schema per example is most of an example's time);
    each example writes its own runs, named by `_run_id`."""
    if not _STORE:
        con = duckdb.connect()
        for statement in create_statements():
            con.execute(statement)
        _STORE.append(con)
    return _STORE[0]


def _run_id(name: str) -> str:
    return f"{name}-{next(_IDS)}"


def _insert(con, run_id: str, rows: list[dict]) -> None:
    """`rows` (dicts of the same columns) into `requests` in one statement."""
    if not rows:
        return
    names = ["run_id", *rows[0]]
    one = f"({', '.join('?' * len(names))})"
    con.execute(f"INSERT INTO requests ({', '.join(names)}) VALUES {', '.join([one] * len(rows))}",
                [v for row in rows for v in (run_id, *row.values())])


# One run's requests: id -> (TTFT in ns, None: rejected; input tokens; dp_rank).
_requests = st.dictionaries(st.sampled_from([str(i) for i in range(12)]),
                            st.tuples(st.one_of(st.none(), st.integers(1, 50)), st.sampled_from([10, 20]),
                                      st.one_of(st.none(), st.integers(0, 3))), max_size=12)


def _rows(requests: dict) -> list[dict]:
    return [dict(req_id=rid, seq=i, arrival_ns=0, input_tokens=n, status="finished" if t is not None else "rejected",
                 ttft_ns=t, dp_rank=rank, hit_class="miss", device_hit_tokens=0, host_hit_tokens=0,
                 storage_hit_tokens=0, computed_tokens=n, recomputed_tokens=0, compute_ns=t, ideal_ttft_ns=t)
            for i, (rid, (t, n, rank)) in enumerate(requests.items())]


@settings(max_examples=20, deadline=None)
@given(_requests, _requests, st.booleans(), st.booleans(), st.integers(1, 5))
def test_request_pairs_are_the_pairing_by_id(a, b, ranks_a, ranks_b, top):
    """Counts, the gains and losses (ties by id) and the rank each side shows: where either run
    records ranks, a run that does not shows rank 0; where neither does, none."""
    con, run_a, run_b = _store(), _run_id("A"), _run_id("B")
    _insert(con, run_a, _rows(a))
    _insert(con, run_b, _rows(b))
    pairs = RequestPairs(con, run_a, run_b, ranks_a=ranks_a, ranks_b=ranks_b)
    common = sorted(set(a) & set(b))
    delta = {r: b[r][0] - a[r][0] for r in common if a[r][0] is not None and b[r][0] is not None}
    counts = pairs.counts()
    assert (counts.common, counts.n_a, counts.n_b) == (len(common), len(a), len(b))
    assert counts.faster == sum(d < 0 for d in delta.values())
    assert counts.slower == sum(d > 0 for d in delta.values())
    assert counts.mismatch == sum(a[r][1] != b[r][1] for r in common)
    found = pairs.lists(top)
    assert [p.req_id for p in found.gains] == sorted((r for r in delta if delta[r] < 0),
                                                     key=lambda r: (delta[r], r))[:top]
    assert [p.req_id for p in found.losses] == sorted((r for r in delta if delta[r] > 0),
                                                      key=lambda r: (-delta[r], r))[:top]
    for p in found.gains + found.losses:
        assert p.delta == delta[p.req_id] == p.ttft_b - p.ttft_a
        shown_a = a[p.req_id][2] if ranks_a else (0 if ranks_b else None)
        shown_b = b[p.req_id][2] if ranks_b else (0 if ranks_a else None)
        assert (p.rank_a, p.rank_b) == (shown_a, shown_b)
    assert sum(f.requests for f in found.flows) == counts.changed


_bounds = st.lists(st.floats(1.0, 1e6, allow_nan=False), min_size=1, max_size=5, unique=True).map(sorted)


@settings(max_examples=40, deadline=None)
@given(_bounds, st.lists(st.floats(0.0, 2e6, allow_nan=False), max_size=20))
def test_pause_buckets_are_the_bounds(bounds, pauses):
    """A pause lands in the first bucket whose upper bound is above it, the last (no bound) else."""
    upper = (*bounds, None)
    con, run = _store(), _run_id("R")
    _insert(con, run, [dict(req_id=str(i), seq=i, arrival_ns=0, input_tokens=8, status="finished", ttft_ns=5,
                            think_ms=p, session_id="s") for i, p in enumerate(pauses)])
    expected: dict[int, int] = {}
    for p in pauses:
        i = next((k for k, hi in enumerate(bounds) if p < hi), len(bounds))
        expected[i] = expected.get(i, 0) + 1
    assert {k: v.turns for k, v in pause_totals(con, run, upper).items()} == expected


@settings(max_examples=40, deadline=None)
@given(st.text(max_size=16))
def test_an_ended_reason_is_a_value_not_sql(reason):
    """Quotes, semicolons and the like in the reason are bound, never spliced into the query."""
    con, run = _store(), _run_id("R")
    _insert(con, run, [dict(req_id="1", seq=0, session_id="s", status="rejected", reject_reason="too long"),
                       dict(req_id="2", seq=1, session_id="s", status="rejected", reject_reason=reason + "!")])
    ended = [(e.session_id, e.turns_not_served, e.req_id) for e in ended_sessions(con, run, reason)]
    if any(c in reason for c in "%_\\"):
        return  # LIKE's wildcards: a pattern, as the reason prefix always was
    reasons = ["too long", reason + "!"]
    dropped = [i for i, r in enumerate(reasons) if r.startswith(reason)]
    before = [i for i, r in enumerate(reasons) if i < dropped[0] and not r.startswith(reason)]
    assert ended == [("s", len(dropped), str(before[-1] + 1) if before else None)]


@settings(max_examples=25, deadline=None)
@given(st.text(max_size=24).filter(lambda c: c not in EVICTION_REQUESTS))
def test_evictions_by_request_takes_only_its_columns(column):
    with pytest.raises(ValueError, match="evictions by"):
        evictions_by_request(_store(), "R", column, 5)
