"""Issue 43why: the time a request's wait spent while its rank ran max_running_requests requests
(diagnose/request/running.py; SGLang 0.5.23 `Scheduler.get_num_allocatable_reqs` is the cap less
the running batch, and `_get_new_batch_prefill_raw` forms no prefill batch at 0). Over small
random runs (running spans, a cap, waits) the one-request sweep (`at_cap_ns`, explain's), the
numpy sweep (`at_cap_arrays`, the run story's) and a brute-force count per nanosecond agree, and
a wait's share at the cap is in [0, 1]. The run story's per-request shares over a real replay
agree with `at_cap_ns` request by request."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierdiag.diagnose.request.running import at_cap_arrays, at_cap_intervals, at_cap_ns

np = pytest.importorskip("numpy")

spans_st = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60)), max_size=12)


def _brute(spans, cap, lo, hi) -> int:
    """Every nanosecond t in [lo, hi): at the cap when at least `cap` spans [a, b) hold t."""
    return sum(1 for t in range(lo, hi) if sum(a <= t < b for a, b in spans) >= cap)


@settings(max_examples=300, deadline=None)
@given(spans_st, st.integers(1, 5), st.integers(0, 70), st.integers(0, 70))
def test_the_time_at_the_cap_is_a_brute_force_count(spans, cap, lo, width):
    hi = lo + width
    got = at_cap_ns(spans, cap, lo, hi)
    assert got == _brute(spans, cap, lo, hi)
    assert 0 <= got <= width
    if width:
        assert 0.0 <= got / width <= 1.0
    # The numpy sweep gives the same time (its pieces may touch; the measure is the same).
    a, b = at_cap_arrays([x for x, _ in spans], [y for _, y in spans], cap)
    assert int(np.clip(np.minimum(b, hi) - np.maximum(a, lo), 0, None).sum()) == got
    ivs = at_cap_intervals(spans, cap)
    assert all(x < y for x, y in ivs) and all(ivs[i][1] < ivs[i + 1][0] for i in range(len(ivs) - 1))


def test_a_span_leaving_as_another_joins_does_not_hold_the_cap():
    # [0, 10) and [10, 20): one running at every instant, never two.
    assert at_cap_ns([(0, 10), (10, 20)], 2, 0, 20) == 0
    assert at_cap_ns([(0, 10), (5, 20)], 2, 0, 20) == 5
    assert at_cap_ns([(0, 10), (5, 20)], 1, 3, 30) == 17


@pytest.mark.parametrize("cap", [2, 5])
def test_the_run_story_share_is_each_requests_own(tmp_path, cap):
    """The run story's per-request time at the cap (story.cap_wait, numpy over every request) is
    explain's (running.at_cap_ns over one request's spans), request by request."""
    pytest.importorskip("tierdiag.cli.replay")
    from tests.support.cli import invoke
    from tierdiag.diagnose.read import request_context as read_req
    from tierdiag.diagnose.read import run_context as read_ctx
    from tierdiag.diagnose.run.story import cap_wait
    from tierdiag.store.reader import open_store, resolve_run

    trace = tmp_path / "mixed.jsonl"
    invoke("synth", str(trace), "--kind", "mixed", "--requests", "120", "--rate", "8")
    db = tmp_path / "run.duckdb"
    invoke("replay", str(trace), "--db", str(db), "--model", "llama3-8b", "--gpu", "h100", "--device-tokens",
           "32768", "--host-tokens", "49152", "--max-running-requests", str(cap))
    with open_store(db) as con:
        rid = resolve_run(con, None).run_id
        assert read_ctx.running_cap(con, rid) == (cap, True)
        r = read_ctx.story_requests(con, rid)
        rank = np.asarray(r.dp_rank, dtype=np.int64)
        w0, ft, queue = (np.asarray(v, dtype=np.int64) for v in (r.wait_start_ns, r.first_token_ns, r.queue_ns))
        w1 = np.maximum(ft, w0)
        got = cap_wait(con, rid, rank, w0, w1, queue, cap)
        want = [min(at_cap_ns(read_req.running_spans(con, rid, int(k), int(a), int(b)), cap, int(a), int(b)), int(q))
                for k, a, b, q in zip(rank, w0, w1, queue)]
    assert got.tolist() == [float(x) for x in want]
    assert any(want), "the cap never held a wait: the run tests nothing"
    share = np.where(queue > 0, got / np.maximum(queue, 1), 0.0)
    assert ((share >= 0) & (share <= 1)).all()


@settings(max_examples=100, deadline=None)
@given(st.one_of(st.none(), st.booleans(), st.integers(-10, 10), st.integers(2 ** 62, 2 ** 63 - 1),
                 st.floats(allow_nan=True), st.text(max_size=8), st.lists(st.integers(), max_size=2)),
       st.one_of(st.none(), st.integers(1, 8), st.text(max_size=4)))
def test_a_hostile_recorded_cap_reads_as_none_or_itself(cap, given_):
    """runs.config_json's max_running_requests as recorded, or as a hand-edited / foreign store
    might hold it: a positive int is the cap; anything else (bool, 0, negative, float, NaN, text,
    list, missing) reads as no cap, so no sentence names one."""
    import json

    import duckdb

    from tierdiag.diagnose.read.run_context import running_cap, running_cap_of

    con = duckdb.connect()
    con.execute("CREATE TABLE runs (run_id VARCHAR, config_json VARCHAR)")
    config = {"max_running_requests": cap, "max_running_requests_given": given_}
    con.execute("INSERT INTO runs VALUES ('r', ?)", [json.dumps(config)])
    got = running_cap(con, "r")
    ok = isinstance(cap, int) and not isinstance(cap, bool) and cap >= 1
    assert got == ((cap, given_ is not None) if ok else (None, False))
    # explain's: the config as RunInfo parsed it (the same JSON), not read again
    assert running_cap_of(json.loads(json.dumps(config))) == got
    assert running_cap_of([config]) == running_cap_of(None) == running_cap_of({}) == (None, False)
    con.execute("UPDATE runs SET config_json = ?", ["{not json"])
    assert running_cap(con, "r") == (None, False)
    assert running_cap(con, "missing") == (None, False)
