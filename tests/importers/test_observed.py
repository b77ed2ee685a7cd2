"""Observed runs: agreement with a replayed run, explain without and with a twin, slow, summary.

The agreement case, page 64 (|observed - replayed| <= 64 per tier is a match)::

    req   observed d/h/s   TTFT     replayed d/h/s   TTFT    split    error
    p     512/256/0        100 ms   512/192/0        80 ms   match    -20 ms (-20 %)
    q       0/  0/0         50 ms     0/  0/0        60 ms   match    +10 ms (+20 %)
    r     960/  0/0         20 ms   832/  0/0        30 ms   differs  +10 ms (+50 %)
    s     only observed            t only replayed
"""

from __future__ import annotations

import pytest

from tests.diagnose.conftest import MS, RunBuilder
from tests.importers.sglang_export import record, write_export
from tierdiag.diagnose.twin.observed import (
    agreement,
    explain_observed,
    find_twin,
    observed_summary,
    slow_observed,
)
from tierdiag.diagnose.read.quantile import nearest_rank
from tierdiag.errors import ConfigError, NotFoundError
from tierdiag.importers.load import import_sglang
from tierdiag.store.reader import open_store, resolve_run


def _observed(tmp_path, extra: list[dict] = ()) -> tuple:
    db = tmp_path / "runs.duckdb"
    write_export(tmp_path / "export", "20251201_09", [
        record("p", prompt=1024, device=512, host=256, arrival_s=0.0, queue_s=0.010, ttft_s=0.100),
        record("q", prompt=1024, arrival_s=1.0, queue_s=0.040, ttft_s=0.050),
        record("r", prompt=1024, device=960, arrival_s=2.0, queue_s=0.001, ttft_s=0.020),
        record("s", prompt=500, arrival_s=3.0, queue_s=0.001, ttft_s=0.030, storage=64, device=0, host=0,
               prefetch_wait_s=0.02),
        *extra,
    ])
    s = import_sglang([tmp_path / "export"], db=db, run_name="prod")
    return db, s.run_id


def _replayed(db, *, with_s: bool = False) -> str:
    b = RunBuilder(db, name="twin")
    b.request("p", arrival_ns=0, input_tokens=1024, device=512, host=192, compute_ns=80 * MS)
    b.request("q", arrival_ns=1000 * MS, input_tokens=1024, compute_ns=60 * MS)
    b.request("r", arrival_ns=2000 * MS, input_tokens=1024, device=832, compute_ns=30 * MS)
    b.request("t", arrival_ns=2500 * MS, input_tokens=64, compute_ns=1 * MS)
    if with_s:
        b.request("s", arrival_ns=3000 * MS, input_tokens=500, storage=64, compute_ns=25 * MS)
    b.write()
    return b.run_id


def test_agreement_figures_come_from_the_pairs(tmp_path):
    db, obs_id = _observed(tmp_path)
    rep_id = _replayed(db)
    with open_store(db) as con:
        a = agreement(con, resolve_run(con, obs_id), resolve_run(con, rep_id), top=10)
    assert (a.num_observed, a.num_replayed, a.num_matched) == (4, 4, 3)
    assert (a.page_tokens, a.num_split_known, a.num_split_match) == (64, 3, 2)
    assert a.split_match_share == pytest.approx(2 / 3)
    # Errors (replayed - observed): p -20 ms of 100, q +10 of 50, r +10 of 20. Percentiles by
    # nearest rank, the package's one definition (issue 32: not interpolated): each names a request.
    assert a.ttft_abs_error_p50_ns == 10 * MS
    assert a.ttft_abs_error_p90_ns == 20 * MS  # rank ceil(0.9 * 3) = 3 of [10, 10, 20]; not 18 interpolated
    assert a.ttft_rel_error_p50 == pytest.approx(0.2) and a.ttft_rel_error_p90 == pytest.approx(0.5)
    assert a.ttft_bias_p50_ns == 10 * MS
    errors = [r.ttft_error_ns for r in a.requests]
    assert a.ttft_abs_error_p90_ns == nearest_rank([abs(e) for e in errors], 0.9)
    assert a.ttft_rel_error_p90 == nearest_rank([abs(r.ttft_error_ns) / r.observed_ttft_ns for r in a.requests], 0.9)
    assert (a.observed_tokens.host_tokens, a.replayed_tokens.host_tokens) == (256, 192)
    assert [p.req_id for p in a.requests] == ["r", "p", "q"]  # the split mismatch first
    assert a.requests[0].split_match is False and a.requests[1].ttft_error_ns == -20 * MS
    text = a.finding()
    assert "2 of 3 (67 %)" in text and "1 only observed" in text and "slower by a median 10.0 ms" in text


def test_twin_by_request_ids_needs_most_of_the_requests(tmp_path):
    db, obs_id = _observed(tmp_path)
    _replayed(db)  # 3 of 4 observed requests: not enough to call it a twin
    with open_store(db) as con:
        assert find_twin(con, resolve_run(con, obs_id)) is None
    rep_id = _replayed(db, with_s=True)
    with open_store(db) as con:
        twin = find_twin(con, resolve_run(con, obs_id))
    assert (twin.run_id, twin.matched_by, twin.num_shared) == (rep_id, "request_ids", 4)


def test_explain_without_a_twin_says_what_cannot_be_known(tmp_path):
    db, obs_id = _observed(tmp_path)
    with open_store(db) as con:
        run = resolve_run(con, obs_id)
        e = explain_observed(con, run, "p")
        q = explain_observed(con, run, "q")
        s = explain_observed(con, run, "s")
        with pytest.raises(NotFoundError, match="no request 'nope'"):
            explain_observed(con, run, "nope")
    assert [st.source for st in e.steps] == ["server", "server", "unknown", "unknown"]
    assert "256 loaded back from host (host_hit_length 256)" in e.steps[0].finding
    assert "768 = 512 device original + 256 restored" in e.steps[1].finding
    assert "cannot be known" in e.steps[2].finding and "--trace-out" in e.steps[2].finding
    assert "256 tokens were loaded back, inside the 90.0 ms" in e.steps[2].finding
    assert (e.primary_cause, e.twin) == (None, None)  # 10 ms queue of 100 ms: the rest is unsplit
    assert (q.primary_cause, q.primary_cause_source) == ("queueing", "server")  # 40 of 50 ms
    assert q.headline == "queueing: 80 % of TTFT (server-reported)"
    assert (s.primary_cause, s.parts.storage_wait_ns) == ("storage_fetch", 20 * MS)  # 20 of 30 ms
    j = e.to_json()
    assert j["kind"] == "observed" and j["tokens"]["host"] == 256 and j["steps"][2]["source"] == "unknown"


def test_explain_takes_steps_3_and_4_from_the_twin(tmp_path):
    db, obs_id = _observed(tmp_path)
    rep_id = _replayed(db, with_s=True)
    with open_store(db) as con:
        e = explain_observed(con, resolve_run(con, obs_id), "r")
    assert [st.source for st in e.steps] == ["server", "server", "replayed twin", "replayed twin"]
    assert e.twin.run_id == rep_id
    assert "Its split differs from the server's (832 device / 0 host / 0 storage replayed vs 960 / 0 / 0" \
        in e.steps[2].finding
    assert e.twin_primary_cause is not None and "The replayed twin (twin) took 30.0 ms" in e.verdict


def test_slow_ranks_by_reported_ttft_and_refuses_causes_it_cannot_tell(tmp_path):
    db, obs_id = _observed(tmp_path)
    with open_store(db) as con:
        run = resolve_run(con, obs_id)
        rows = slow_observed(con, run, top=3)
        queued = slow_observed(con, run, cause="queueing")
        with pytest.raises(ConfigError, match="cannot be told from an observed run"):
            slow_observed(con, run, cause="load_back")
    assert [r.req_id for r in rows] == ["p", "q", "s"]
    assert [r.req_id for r in queued] == ["q"]


def test_summary_of_an_observed_run(tmp_path):
    db, obs_id = _observed(tmp_path)
    with open_store(db) as con:
        s = observed_summary(con, resolve_run(con, obs_id))
    assert (s.num_requests, s.input_tokens, s.device_tokens, s.host_tokens, s.storage_tokens,
            s.computed_tokens) == (4, 3572, 1472, 256, 64, 1780)
    assert s.queue_total_ns == 52 * MS and s.requests_mostly_queueing == 1 and s.storage_wait_total_ns == 20 * MS
    assert s.twin is None and s.agreement is None and "evictions" in s.not_reported


def test_explain_of_an_aborted_request_says_it_was_aborted(tmp_path):
    # Issue 32: a request the server aborted after its first token (a client gone mid-decode)
    # has a TTFT to explain, and the verdict must say first that it did not finish.
    db, obs_id = _observed(tmp_path, [
        record("x", prompt=512, arrival_s=4.0, queue_s=0.030, ttft_s=0.040,
               finish={"type": "abort", "message": "client disconnected", "status_code": 499}),
        record("y", prompt=512, arrival_s=5.0, ttft_s=None,
               finish={"type": "abort", "message": "client disconnected", "status_code": 499}),
    ])
    with open_store(db) as con:
        run = resolve_run(con, obs_id)
        x = explain_observed(con, run, "x")
        y = explain_observed(con, run, "y")
    assert x.status == "aborted" and x.ttft_ns == 40 * MS
    assert x.headline.startswith("aborted after its first token (client disconnected); queueing: 75 % of TTFT")
    assert x.verdict.startswith("Request x was aborted (client disconnected) after its first token, so it did "
                                "not finish. Request x took 40.0 ms to its first token")
    assert y.headline == "aborted: client disconnected" and "before its first token" in y.verdict

