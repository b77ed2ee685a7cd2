"""Verification that can say no (issue 34, DESIGN §6 "Advice status"): a tried change is
confirmed only when TTFT p50 is at least 5 % better and p99 not more than 5 % worse (the
request-level result it promised; the share it targeted is shown, not a criterion, issue 40);
worse is refuted, anything else no_effect. Only proposed and confirmed items
are advice; the others are "tried, not advised", with their numbers, in every view."""

from __future__ import annotations

import duckdb
import pytest

from tierdiag.diagnose.advice import Advice, Verified, advice_json, classify
from tierdiag.diagnose.advice.verify import combination, verified_advice
from tierdiag.store.reader import open_store, resolve_run

from .conftest import CONFIG, MS, RunBuilder


def _v(p50: tuple, p99: tuple, target: tuple | None = (0.5, 0.2)) -> Verified:
    return Verified("cand", p50[0], p50[1], p99[0], p99[1], None, None,
                    target="recompute_share" if target else None,
                    target_before=target[0] if target else None, target_after=target[1] if target else None)


@pytest.mark.parametrize("p50, p99, target, status", [
    ((100.0, 94.0), (200.0, 200.0), (0.5, 0.2), "confirmed"),
    ((100.0, 95.0), (200.0, 210.0), (0.5, 0.2), "confirmed"),  # exactly the margins
    ((100.0, 96.0), (200.0, 200.0), (0.5, 0.2), "no_effect"),  # 4 % is not worth a change
    ((100.0, 80.0), (200.0, 200.0), (0.5, 0.5), "confirmed"),  # faster, though its share did not fall
    ((100.0, 80.0), (200.0, 211.0), (0.5, 0.2), "refuted"),  # the tail paid for it
    ((100.0, 106.0), (200.0, 200.0), (0.5, 0.2), "refuted"),
    ((100.0, 50.0), (200.0, 100.0), None, "confirmed"),  # no target: TTFT alone
    ((None, 50.0), (200.0, 100.0), (0.5, 0.2), "no_effect"),
])
def test_classify(p50, p99, target, status):
    assert classify(_v(p50, p99, target)) == status


def _run(path, name: str, ttft_ms: float, recomputed: int, config: dict | None = None) -> str:
    b = RunBuilder(path, name=name, config=dict(config or CONFIG))
    for i in range(9):  # nine equal requests: p50 and p99 are their TTFT
        b.request(f"r{i}", arrival_ns=i * 10 * MS, input_tokens=1024, recomputed=recomputed,
                  recompute_ns=int(ttft_ms * MS) - 100_000, compute_ns=100_000, ideal_ttft_ns=100_000)
    b.write()
    return b.run_id


@pytest.fixture
def tried(tmp_path):
    """A baseline at 10 ms and three candidates `advise` recorded: a bigger host pool (5 ms, less
    recompute: confirmed), lfu (12 ms: refuted), write_back (9.8 ms: no_effect), and the
    combination of the confirmed ones is not there (one confirmed)."""
    path = tmp_path / "tried.duckdb"
    base = _run(path, "mine", 10, 512)
    cands = {"host": _run(path, "c1", 5, 128, {**CONFIG, "host_tokens": 65536}),
             "lfu": _run(path, "c2", 12, 512, {**CONFIG, "eviction_policy": "lfu"}),
             "wb": _run(path, "c3", 9.8, 256, {**CONFIG, "write_policy": "write_back"})}
    con = duckdb.connect(str(path))
    con.execute("UPDATE runs SET sweep_id = ? WHERE run_id <> ?", [f"advise-{base}", base])
    con.close()
    return path, base, cands


ITEMS = (Advice("capacity", "host_tokens", 65536, {"host_tokens": 65536}, "reuse distance beyond the pools"),
         Advice("eviction_policy", "eviction_policy", "lfu", {"eviction_policy": "lfu"}, "hot prefixes evicted"),
         Advice("write_policy", "write_policy", "write_back", {"write_policy": "write_back"}, "planted"),
         Advice("prefetch", "prefetch_policy", "wait_complete", {"prefetch_policy": "wait_complete"}, "not tried"))


def test_tried_changes_get_their_status_and_only_confirmed_ones_stay_advice(tried):
    path, base, cands = tried
    with open_store(path) as con:
        run = resolve_run(con, None)
        assert run.run_id == base
        out = verified_advice(con, run, ITEMS, req_id="r3")
    status = {a.kind: a.status for a in out}
    assert status == {"capacity": "confirmed", "eviction_policy": "refuted", "write_policy": "no_effect",
                      "prefetch": "proposed"}
    j = advice_json(out)
    assert [a["kind"] for a in j["advice"]] == ["capacity", "prefetch"]
    assert [(a["kind"], a["status"]) for a in j["tried_not_advised"]] == [("eviction_policy", "refuted"),
                                                                          ("write_policy", "no_effect")]
    lfu = next(a for a in out if a.kind == "eviction_policy")
    assert lfu.verified.run_id == cands["lfu"] and lfu.verified.ttft_p50_ms_after > lfu.verified.ttft_p50_ms_before
    # Its line never says "verified"; the tried line gives its numbers and why it is not advice.
    assert "verified" not in lfu.line() and "verified" not in lfu.tried_line()
    assert "it made TTFT worse" in lfu.tried_line() and "10.0 ms → 12.0 ms" in lfu.tried_line()
    wb = next(a for a in out if a.kind == "write_policy")
    assert "did not improve by 5 %" in wb.tried_line()
    host = next(a for a in out if a.kind == "capacity")
    assert f"verified by run {cands['host']}" in host.line()
    assert combination(out) is None  # one confirmed: nothing to combine


def test_views_list_tried_changes_apart(tried, monkeypatch):
    """summary's diagnosis, explain and the terminal lines split the same way (the advice rules
    are stubbed to propose the planted items: the split is what is under test)."""
    import tierdiag.diagnose.advice.verify as advice_mod  # run_advice: summary's proposals
    import tierdiag.diagnose.request.explain as explain_mod
    from rich.console import Console

    from tierdiag.diagnose.request.explain import explain_request
    from tierdiag.diagnose.run.summary import run_summary
    from tierdiag.report.html import _advice_html
    from tierdiag.report.terminal import _advice_lines

    monkeypatch.setattr(advice_mod, "propose", lambda ctx, **kw: ITEMS)
    monkeypatch.setattr(explain_mod, "propose", lambda ctx, **kw: ITEMS)
    path, base, cands = tried
    with open_store(path) as con:
        run = resolve_run(con, None)
        dx = run_summary(con, run).diagnosis
        ex = explain_request(con, run, "r3")
    for doc in (dx.to_json(), ex.to_json()):
        assert [a["kind"] for a in doc["advice"]] == ["capacity", "prefetch"]
        assert [a["kind"] for a in doc["tried_not_advised"]] == ["eviction_policy", "write_policy"]
    console = Console(width=400, record=True)
    for line in _advice_lines(ex.advice):
        console.print(line)
    text = console.export_text()
    head, _, tail = text.partition("tried, not advised:")
    assert "eviction_policy" not in head and "lfu" in tail and cands["lfu"] in tail
    assert "refuted" not in head and "verified by run " + cands["host"] in head
    html = "".join(_advice_html(a) for a in ex.advice if a.status in ("no_effect", "refuted"))
    assert "verified" not in html and "it made TTFT worse" in html


@pytest.mark.parametrize("both_ms, status", [(5.9, "no_effect"), (4.0, "confirmed")])
def test_the_best_confirmed_are_combined_and_confirmed_only_when_better_than_alone(tmp_path, both_ms, status):
    path = tmp_path / "combo.duckdb"
    base = _run(path, "mine", 10, 512)
    _run(path, "host", 6, 256, {**CONFIG, "host_tokens": 65536})
    _run(path, "pf", 7, 256, {**CONFIG, "prefetch_policy": "wait_complete"})
    both = {**CONFIG, "host_tokens": 65536, "prefetch_policy": "wait_complete"}
    _run(path, "both", both_ms, 128, both)  # 5.9: no better than the host pool alone (6 ms) by 5 %
    con = duckdb.connect(str(path))
    con.execute("UPDATE runs SET sweep_id = ? WHERE run_id <> ?", [f"advise-{base}", base])
    con.close()
    items = (ITEMS[0], ITEMS[3])
    with open_store(path) as con:
        run = resolve_run(con, None)
        out = verified_advice(con, run, items)
    together = next(a for a in out if a.kind == "combined")
    assert together.changes == {"host_tokens": 65536, "prefetch_policy": "wait_complete"}
    assert together.status == status
    if status == "confirmed":  # the best advice: first, verified
        assert out[0] is together and "verified by run" in together.line()
    else:
        assert "no better than the best of them alone" in together.tried_line() and out[-1] is together
    assert [a.status for a in out if a.kind != "combined"] == ["confirmed", "confirmed"]
