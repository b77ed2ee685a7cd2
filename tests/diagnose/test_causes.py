"""The primary-cause rule: Python and SQL agree on every row, and the rule reads as documented."""

from __future__ import annotations

import duckdb
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.sql_rows import insert_rows
from tierdiag.diagnose.request.causes import (CAUSES, NONE_TOLERANCE_PCT, TtftParts, cause_sql, primary_cause, routing_tokens,
                                      routing_tokens_sql)


def _row(**kw) -> dict:
    parts = {k: kw.pop(k, 0) for k in ("queue_ns", "storage_wait_ns", "loadback_exposed_ns", "recompute_ns")}
    compute = kw.pop("compute_ns", 100)
    ttft = sum(parts.values()) + compute
    return {"status": "finished", "ttft_ns": ttft, "ideal_ttft_ns": kw.pop("ideal_ttft_ns", compute),
            "compute_ns": compute, **parts, **kw}


def test_small_excess_is_none_and_boundary_is_inclusive():
    # ideal 1000: an excess of exactly 20 % is still "none", one ns more is not.
    at = _row(compute_ns=1000, queue_ns=1000 * NONE_TOLERANCE_PCT // 100)
    above = _row(compute_ns=1000, queue_ns=1000 * NONE_TOLERANCE_PCT // 100 + 1)
    assert primary_cause(at) == "none"
    assert primary_cause(above) == "queueing"


def test_largest_part_of_the_excess_wins():
    assert primary_cause(_row(queue_ns=300, loadback_exposed_ns=500, recompute_ns=400)) == "load_back"
    assert primary_cause(_row(storage_wait_ns=900, loadback_exposed_ns=100)) == "storage_fetch"
    assert primary_cause(_row(recompute_ns=900)) == "recompute"


def test_compute_counts_only_beyond_the_ideal():
    # 3x its ideal compute: the 2x beyond it is the excess, and compute owns it.
    assert primary_cause(_row(compute_ns=300, ideal_ttft_ns=100)) == "compute"
    # A full miss whose TTFT is its ideal is not slow, however long it took.
    assert primary_cause(_row(compute_ns=10**9)) == "none"


def test_ties_go_to_the_earlier_cause():
    assert primary_cause(_row(queue_ns=500, loadback_exposed_ns=500)) == "queueing"
    assert primary_cause(_row(storage_wait_ns=500, recompute_ns=500)) == "storage_fetch"


def test_rejected_rows_have_no_cause():
    assert primary_cause({"status": "rejected", "ttft_ns": None}) is None
    assert TtftParts.from_row({"ttft_ns": None}) is None


def _dp_row(**kw) -> dict:
    """A request of a data-parallel run: served by rank 2 while rank 0 held `best` tokens."""
    route = {"dp_rank": kw.pop("dp_rank", 2), "best_rank": kw.pop("best_rank", 0),
             "best_rank_device_tokens": kw.pop("best", 0), "best_rank_host_tokens": kw.pop("best_host", 0),
             "arrival_device_tokens": kw.pop("own", 0), "arrival_host_tokens": kw.pop("own_host", 0),
             "storage_match_tokens": kw.pop("storage_match", 0), "recomputed_tokens": kw.pop("recomputed", 0)}
    return _row(**route, **kw)


def test_routing_owns_the_recompute_of_what_the_best_rank_held():
    # 1,000 tokens recomputed; rank 0 held 800 on device + host, its own rank 200: routing lost
    # 600 of the 1,000, so it owns 60 % of the 900 ns of recompute and recompute the rest.
    row = _dp_row(recomputed=1000, best=500, best_host=300, own=200, recompute_ns=900)
    assert routing_tokens(row) == 600
    parts = TtftParts.from_row(row)
    assert parts.excess_parts_ns()["routing"] == 540 and parts.excess_parts_ns()["recompute"] == 360
    assert primary_cause(row) == "routing"
    # Storage is shared by every rank: what it could fetch was not lost to routing.
    assert routing_tokens(_dp_row(recomputed=1000, best=800, own=200, storage_match=500)) == 100
    # Never more than it recomputed; nothing on its best rank, or one rank, or no routing columns: 0.
    assert routing_tokens(_dp_row(recomputed=100, best=5000)) == 100
    assert routing_tokens(_dp_row(recomputed=1000, best=800, best_rank=2)) == 0
    assert routing_tokens(_dp_row(recomputed=1000, best=800, dp_rank=None)) == 0
    assert primary_cause(_row(recompute_ns=900, recomputed_tokens=1000)) == "recompute"


def test_routing_ties_go_before_recompute():
    # Half the recomputed tokens were routing's: the two parts tie and routing, earlier, wins.
    row = _dp_row(recomputed=1000, best=500, recompute_ns=1000)
    assert TtftParts.from_row(row).excess_parts_ns()["routing"] == 500
    assert primary_cause(row) == "routing"
    assert CAUSES.index("routing") < CAUSES.index("recompute")


_ns = st.integers(min_value=0, max_value=10**12)
_tok = st.integers(min_value=0, max_value=10**6)
_rows = st.lists(
    st.fixed_dictionaries({
        "queue_ns": _ns, "storage_wait_ns": _ns, "loadback_exposed_ns": _ns, "recompute_ns": _ns,
        "compute_ns": st.integers(min_value=1, max_value=10**12),
        "ideal_delta": st.integers(min_value=-10**6, max_value=10**12),
        "status": st.sampled_from(["finished", "finished", "rejected"]),
        "equal": st.booleans(),
        "dp_rank": st.sampled_from([None, 0, 1]), "best_rank": st.sampled_from([None, 0, 1]),
        "recomputed_tokens": _tok, "best_rank_device_tokens": _tok, "best_rank_host_tokens": _tok,
        "arrival_device_tokens": _tok, "arrival_host_tokens": _tok, "storage_match_tokens": _tok,
    }),
    min_size=1, max_size=30,
)
_V4 = ("dp_rank", "best_rank", "recomputed_tokens", "best_rank_device_tokens", "best_rank_host_tokens",
       "arrival_device_tokens", "arrival_host_tokens", "storage_match_tokens")


@settings(max_examples=60, deadline=None)
@given(_rows)
def test_sql_and_python_agree(specs):
    rows = []
    for i, s in enumerate(specs):
        parts = {k: s[k] for k in ("queue_ns", "storage_wait_ns", "loadback_exposed_ns", "recompute_ns")}
        if s["equal"]:  # exercise the tie-break
            parts["loadback_exposed_ns"] = parts["queue_ns"]
        ttft = sum(parts.values()) + s["compute_ns"]
        finished = s["status"] == "finished"
        rows.append({"req_id": str(i), "status": s["status"], "ttft_ns": ttft if finished else None,
                     "ideal_ttft_ns": max(s["compute_ns"] + s["ideal_delta"], 1),
                     "compute_ns": s["compute_ns"], **parts, **{k: s[k] for k in _V4}})
    con = duckdb.connect()
    cols = list(rows[0])
    con.execute("CREATE TABLE requests (req_id VARCHAR, status VARCHAR, ttft_ns BIGINT, ideal_ttft_ns BIGINT, "
                "compute_ns BIGINT, queue_ns BIGINT, storage_wait_ns BIGINT, loadback_exposed_ns BIGINT, "
                "recompute_ns BIGINT, dp_rank INTEGER, best_rank INTEGER, recomputed_tokens BIGINT, "
                "best_rank_device_tokens BIGINT, best_rank_host_tokens BIGINT, arrival_device_tokens BIGINT, "
                "arrival_host_tokens BIGINT, storage_match_tokens BIGINT)")
    insert_rows(con, f"INSERT INTO requests ({', '.join(cols)})", [[r[c] for c in cols] for r in rows])
    sql = dict(con.execute(f"SELECT req_id, {cause_sql('r')} FROM requests r").fetchall())
    tokens = dict(con.execute(f"SELECT req_id, {routing_tokens_sql('r')} FROM requests r").fetchall())
    for r in rows:
        expected = primary_cause(r)
        assert sql[r["req_id"]] == expected, r
        assert tokens[r["req_id"]] == routing_tokens(r), r
        assert expected is None or expected in CAUSES
