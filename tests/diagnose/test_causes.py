"""The primary-cause rule: Python and SQL agree on every row, and the rule reads as documented."""

from __future__ import annotations

import duckdb
from hypothesis import given, settings
from hypothesis import strategies as st

from tierdiag.diagnose.causes import CAUSES, NONE_TOLERANCE_PCT, TtftParts, cause_sql, primary_cause


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


_ns = st.integers(min_value=0, max_value=10**12)
_rows = st.lists(
    st.fixed_dictionaries({
        "queue_ns": _ns, "storage_wait_ns": _ns, "loadback_exposed_ns": _ns, "recompute_ns": _ns,
        "compute_ns": st.integers(min_value=1, max_value=10**12),
        "ideal_delta": st.integers(min_value=-10**6, max_value=10**12),
        "status": st.sampled_from(["finished", "finished", "rejected"]),
        "equal": st.booleans(),
    }),
    min_size=1, max_size=30,
)


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
                     "compute_ns": s["compute_ns"], **parts})
    con = duckdb.connect()
    cols = list(rows[0])
    con.execute("CREATE TABLE requests (req_id VARCHAR, status VARCHAR, ttft_ns BIGINT, ideal_ttft_ns BIGINT, "
                "compute_ns BIGINT, queue_ns BIGINT, storage_wait_ns BIGINT, loadback_exposed_ns BIGINT, "
                "recompute_ns BIGINT)")
    con.executemany(f"INSERT INTO requests ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                    [[r[c] for c in cols] for r in rows])
    sql = dict(con.execute(f"SELECT req_id, {cause_sql('r')} FROM requests r").fetchall())
    for r in rows:
        expected = primary_cause(r)
        assert sql[r["req_id"]] == expected, r
        assert expected is None or expected in CAUSES
