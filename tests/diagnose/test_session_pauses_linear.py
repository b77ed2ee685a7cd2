"""The session rule's stack distances (diagnose/session/session_pool.py) in linear time, stored at close
(issue 39 item 16: a 100k-turn session cost 22 s of CPU per `summary`/`explain`, the query
rerunning on every call).

- The linear computation gives each turn the distance its definition gives: the SQL join below
  is that definition, written as the join it once was (turns x requests, one row per other
  session at its largest context), compared turn by turn on workloads with sessionless
  requests, shared prefixes, open-loop arrivals and two ranks.
- It is stored with the run evidence at close and read back by `summary` and `explain`, which
  then never compute it.
- Its kept-share curve is bounded in size, exact up to CURVE_POINTS distinct distances, and
  errs low by less than 1/CURVE_POINTS of the reused prefix plus one turn's beyond.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.cli import invoke
from tierdiag.diagnose.session import session_pool as SP
from tierdiag.diagnose.run.facts import RunFacts
from tierdiag.store.reader import open_store, resolve_run

pytest.importorskip("tierdiag.cli.replay")

# The definition (docs/contract.md "Sessions"), as one join: each later turn's predecessor
# context, plus every other session (or sessionless request) that ran between the predecessor's
# finish and the turn's schedule, once at its largest context less what its first turn found
# cached, plus the largest such shared prefix beyond the turn's own. A session and a request
# without one are different owners whatever their names ('s:' and 'r:': a session "#7" is not
# the lone request "7", as it was when both were the string "#7").
DEFINITION = """
    WITH ordered AS (
        SELECT *, lag(req_id) OVER w AS prev_id, lag(status) OVER w AS prev_status,
               lag(finish_ns) OVER w AS prev_finish_ns,
               lag(coalesce(input_tokens, 0) + coalesce(output_tokens, 0)) OVER w AS prev_context
        FROM requests WHERE run_id = $1 AND session_id IS NOT NULL
        WINDOW w AS (PARTITION BY session_id ORDER BY seq)),
    turns AS (
        SELECT seq, session_id, prev_finish_ns AS pause_start_ns, arrival_ns + coalesce(queue_ns, 0) AS match_ns,
               prev_context
        FROM ordered WHERE think_ms IS NOT NULL AND prev_id IS NOT NULL
          AND coalesce(prev_status, 'finished') = 'finished' AND prev_finish_ns IS NOT NULL
          AND coalesce(status, 'finished') = 'finished' AND ttft_ns IS NOT NULL),
    firsts AS (
        SELECT coalesce('s:' || session_id, 'r:' || req_id) AS who,
               arg_min(coalesce(device_hit_tokens, 0) + coalesce(host_hit_tokens, 0)
                       + coalesce(storage_hit_tokens, 0) + coalesce(recomputed_tokens, 0), seq) AS shared
        FROM requests WHERE run_id = $1 GROUP BY who),
    others AS (
        SELECT o.*, coalesce('s:' || o.session_id, 'r:' || o.req_id) AS who FROM requests o
        WHERE o.run_id = $1 AND coalesce(o.status, 'finished') = 'finished' AND o.ttft_ns IS NOT NULL
          AND o.finish_ns IS NOT NULL),
    touched AS (
        SELECT t.seq, o.who, max(coalesce(o.input_tokens, 0) + coalesce(o.output_tokens, 0)) AS tokens
        FROM turns t JOIN others o
          ON o.arrival_ns <= t.match_ns AND o.finish_ns >= t.pause_start_ns
         AND o.session_id IS DISTINCT FROM t.session_id
        GROUP BY t.seq, o.who),
    spread AS (
        SELECT x.seq, sum(greatest(x.tokens - f.shared, 0)) AS own_tokens, max(f.shared) AS shared
        FROM touched x JOIN firsts f USING (who) GROUP BY x.seq)
    SELECT t.prev_context + coalesce(s.own_tokens, 0) + greatest(coalesce(s.shared, 0) - f.shared, 0)
    FROM turns t LEFT JOIN spread s USING (seq) JOIN firsts f ON f.who = 's:' || t.session_id
    ORDER BY t.seq"""


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    d = tmp_path_factory.mktemp("pauses")
    db = d / "r.duckdb"
    for kind, extra in (("mixed", ["--device-tokens", "16384", "--host-tokens", "16384"]),
                        ("agent", ["--device-tokens", "16384", "--arrivals", "trace"]),
                        ("agent", ["--device-tokens", "8192", "--dp", "2"]),
                        ("multi-turn", ["--device-tokens", "16384", "--write-policy", "write_back"])):
        trace = d / f"{kind}.jsonl"
        if not trace.exists():
            invoke("synth", "--kind", kind, "--requests", "300", str(trace))
        invoke("replay", str(trace), "--db", str(db), *extra)
    named = d / "named.jsonl"
    _session_named_as_a_lone_request(d / "mixed.jsonl", named)
    invoke("replay", str(named), "--db", str(db), "--device-tokens", "16384")
    return db


def _session_named_as_a_lone_request(src, out):
    """The trace with its longest session renamed '#' + the id of the lone request (no session)
    nearest its second turn: the owners' numbering once made both the string '#<id>', one owner
    (7 of 88 distances differed from the definition on the mixed trace here)."""
    import json

    lines = [json.loads(x) for x in src.read_text().splitlines()]
    turns: dict[str, list[int]] = {}
    for i, line in enumerate(lines):
        if "session" in line:
            turns.setdefault(line["session"], []).append(i)
    longest = max(turns.values(), key=len)
    second = lines[longest[1]]["timestamp"]
    lone = min((x for x in lines if "session" not in x), key=lambda x: abs(x["timestamp"] - second))
    for i in longest:
        lines[i]["session"] = "#" + lone["id"]
    out.write_text("".join(json.dumps(x) + "\n" for x in lines))


NUMPY_WAYS = [(budget, pack_bits, check) for budget in (SP.PAIR_BUDGET, 1, 37)
              for pack_bits in (SP.PACK_BITS, 0) for check in (False, True)]


@pytest.mark.parametrize("way", ["native", *NUMPY_WAYS], ids=str)
def test_the_linear_distances_are_the_definitions(store, way, monkeypatch):
    """The native sweep (tierdiag/native/sessions), and numpy's passes whatever the pair budget
    (one chunk of turns, one turn a chunk, a few), the pairs' (turn, who, tokens) packed in one
    int64 for their sort or not (PACK_BITS 0: the argsort a run too large to pack takes), each
    pair's span checked or known from the ranges: the definition's."""
    if way == "native":
        if SP._native() is None:
            pytest.skip("tierdiag.native._sessions is not built (setup.py build_ext --inplace)")
    else:
        budget, pack_bits, check_spans = way
        monkeypatch.setattr(SP, "NATIVE", False)
        monkeypatch.setattr(SP, "PAIR_BUDGET", budget)
        monkeypatch.setattr(SP, "PACK_BITS", pack_bits)
        if check_spans:  # every pair's span checked, as a run whose turns are not in order is
            monkeypatch.setattr(SP, "_in_order", lambda *a: False)
    with open_store(store) as con:
        runs = [resolve_run(con, rid) for (rid,) in con.execute("SELECT run_id FROM runs").fetchall()]
        assert len(runs) == 5
        checked = 0
        for run in runs:
            want = [d for (d,) in con.execute(DEFINITION, [run.run_id]).fetchall()]
            got = SP.session_turns(con, run)
            assert [t.distance_tokens for t in got] == want, run.name
            checked += len(want)
            sp = SP.session_pauses(con, run)
            assert sp is not None and sp.num_turns == len(want)
            assert sp.pool_p90_tokens == max(t.distance_tokens for t in got if t.think_ms <= sp.pause_p90_ms)
    assert checked > 300


def test_stored_at_close_and_read_by_summary_and_explain(store, monkeypatch):
    with open_store(store) as con:
        run = resolve_run(con, None)
        computed = SP.session_pauses(con, run)
        assert computed is not None
        assert RunFacts(con, run).stored.sessions() == (True, computed)
        req = con.execute("SELECT req_id FROM requests WHERE run_id = ? AND think_ms IS NOT NULL "
                          "AND status = 'finished' LIMIT 1", [run.run_id]).fetchone()[0]

    def recomputed(*_a, **_k):
        raise AssertionError("the distances were recomputed, not read from the run evidence")

    monkeypatch.setattr(SP, "_turns", recomputed)
    invoke("summary", "--db", str(store), "--json")
    invoke("explain", req, "--db", str(store), "--json")


def test_a_run_without_sessions_stores_none(tmp_path):
    trace, db = tmp_path / "t.jsonl", tmp_path / "r.duckdb"
    invoke("synth", "--kind", "system-prompt", "--requests", "60", str(trace))
    invoke("replay", str(trace), "--db", str(db))
    with open_store(db) as con:
        run = resolve_run(con, None)
        assert RunFacts(con, run).stored.sessions() == (True, None)
        assert RunFacts(con, run).session_pauses() is None


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**7), st.integers(0, 10**5)), min_size=1, max_size=6000),
       st.integers(0, 2 * 10**7))
def test_the_kept_curve_is_bounded_and_errs_low_by_at_most_a_step(turns, capacity):
    ts = tuple(SP.SessionTurn(1.0, d, r) for d, r in turns)
    curve = SP._curve(*_columns(turns))
    assert len(curve) <= SP.CURVE_POINTS
    assert [d for d, _ in curve] == sorted({d for d, _ in curve})
    reused = sum(r for _, r in turns)
    sp = SP.SessionPauses(len(ts), 0, reused, 0, 0, 0, 0, 1.0, 0, curve)
    exact = sum(r for d, r in turns if d <= capacity)
    got = sp.kept_share(capacity)
    if reused == 0:
        assert got is None
        return
    assert got * reused <= exact + 1e-6
    assert exact - got * reused <= reused / SP.CURVE_POINTS + max(r for _, r in turns) + 1e-6
    if len({d for d, _ in turns}) <= SP.CURVE_POINTS:
        assert got * reused == pytest.approx(exact)


def _columns(turns):
    """(distances, reused tokens) as the int64 columns `_curve` takes."""
    import numpy as np

    return (np.array([d for d, _ in turns], dtype=np.int64).reshape(-1),
            np.array([r for _, r in turns], dtype=np.int64).reshape(-1))


def _curve_reference(turns):
    """The kept curve as it was computed before it was vectorised (a dict of distance -> reused
    tokens, the steps walked in Python): the reference `_curve` is held to."""
    by_distance = {}
    for d, r in turns:
        by_distance[d] = by_distance.get(d, 0) + r
    steps, cum = [], 0
    for d in sorted(by_distance):
        cum += by_distance[d]
        steps.append((d, cum))
    if len(steps) <= SP.CURVE_POINTS:
        return tuple(steps)
    total = steps[-1][1]
    kept, bucket = [], -1
    for i, (d, c) in enumerate(steps):
        b = c * SP.CURVE_POINTS // total if total else 0
        if b > bucket or i == len(steps) - 1:
            kept.append((d, c))
            bucket = b
    return tuple(kept)


@settings(max_examples=60, deadline=None)
@given(st.one_of(
    st.lists(st.tuples(st.integers(0, 10**7), st.integers(0, 10**5)), min_size=1, max_size=5000),
    # many distinct distances (the thinned curve), zero reuse, and totals whose bucket product
    # passes int64 (the Python-int path)
    st.lists(st.tuples(st.integers(0, 2**40), st.sampled_from([0, 1, 2**40, 2**50])), min_size=2100, max_size=2600),
    st.lists(st.tuples(st.integers(0, 10), st.just(0)), min_size=1, max_size=50)))
def test_the_vectorised_kept_curve_is_the_python_walks(turns):
    """session_pool._curve (numpy: sort, reduceat, cumsum, the bucket steps) gives the very steps
    the dict-and-loop version gave, ints included (no float on the way)."""
    got = SP._curve(*_columns(turns))
    assert got == _curve_reference(turns)
    assert all(type(d) is int and type(c) is int for d, c in got)


# issue 41: the pairs' largest context per (turn, who) by one sort of packed int64s is the argsort
# and per-group max it replaced, for hostile pairs: negative and int32-sized tokens, repeated keys,
# one pair, whos up to the width.
@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 9), st.integers(-2**31, 2**31)), min_size=1, max_size=80))
def test_packed_pairs_are_the_argsorts(pairs):
    import numpy as np

    ti, w, tok = (np.asarray(c, dtype=np.int64) for c in zip(*pairs))
    low = int(tok.min())
    packed = SP._largest_per_pair(ti, w, tok, 10, (low, (10 - 1).bit_length(), (int(tok.max()) - low).bit_length()))
    plain = SP._largest_per_pair(ti, w, tok, 10, None)
    assert [a.tolist() for a in packed] == [a.tolist() for a in plain]
    want = {}
    for t, who, k in pairs:
        want[(t, who)] = max(want.get((t, who), k), k)
    assert sorted(want.items()) == [((t, who), k) for t, who, k in zip(*(a.tolist() for a in plain))]


# issue 41: the native sweep over the pauses (tierdiag/native/sessions/sessions.c) against numpy's
# chunked passes (_pairs_numpy, the reference), for hostile rows: requests finishing before they
# arrive, turns scheduled before their pause starts, negative and int32-sized tokens and shared
# prefixes, ties in every time, one owner with many requests, turns of every session.
_time = st.integers(-5, 30)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(_time, _time, st.integers(0, 6), st.booleans(), st.integers(-2**31, 2**31)), min_size=1, max_size=40),
       st.lists(st.integers(-2**31, 2**31), min_size=7, max_size=7),
       st.lists(st.tuples(_time, _time, st.integers(-1, 6)), min_size=1, max_size=30))
def test_the_native_sweep_is_numpys(requests, shared, turns):
    import numpy as np

    if SP._native() is None:
        pytest.skip("tierdiag.native._sessions is not built (setup.py build_ext --inplace)")
    arr, fin, who, has, tok = (np.asarray(c, dtype=np.int64) for c in zip(*requests))
    o_session = np.where(has, who, -1)
    sh = np.asarray(shared, dtype=np.int64)
    ps, m, t_session = (np.asarray(c, dtype=np.int64) for c in zip(*turns))
    got = {}
    for native in (True, False):
        own, top = np.zeros(len(ps), dtype=np.int64), np.zeros(len(ps), dtype=np.int64)
        SP.NATIVE = native
        try:
            SP._pairs(arr, fin, who, o_session, tok, sh, ps, m, t_session, own, top)
        finally:
            SP.NATIVE = True
        got[native] = (own.tolist(), top.tolist())
    assert got[True] == got[False]
    # ... and both the definition's, one turn at a time in Python.
    for k, (p, q, ts) in enumerate(turns):
        best: dict = {}
        for a, f, w, h, v in requests:
            if a <= q and f >= p and (w if h else -1) != ts:
                best[w] = max(best.get(w, v), v)
        assert got[True][0][k] == sum(max(v - shared[w], 0) for w, v in best.items())
        assert got[True][1][k] == max([0] + [shared[w] for w in best])
