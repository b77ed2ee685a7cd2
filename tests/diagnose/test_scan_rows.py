"""The run-wide sums folded while a run is recorded (diagnose/run/scan_rows.py, issue 41 session
35): from the `requests` and `transfers` rows as a writer takes them, batch by batch, beside the
story's rows, they are what read/run_scan.py `run_scan` (its miss reasons' sums too) reads from
the committed store, value for value and type for type, whatever the batches; where they cannot
be (rows the store does not hold, a batch the fold cannot project, rows numpy would read
otherwise) the close gets None and queries, the story's, context's and evictions' parts kept."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from tests.support.folds import batches, empty_store as empty_store_of, replayed, taken
from tests.support.sql_rows import insert_rows
from tierdiag.diagnose.read.run_scan import run_scan, scan_of_row
from tierdiag.diagnose.run import scan_rows as sr
from tierdiag.diagnose.run.story_rows import StoryRows
from tierdiag.store.reader import open_store, resolve_run

TABLES = ("requests", "evictions", "request_evictions", "transfers")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """A real replay on two ranks with load-backs, prefetches and re-routed requests, recorded."""
    return replayed(tmp_path_factory.mktemp("scan_rows"), "--device-tokens", "32768", "--host-tokens", "65536",
                    "--storage-tokens", "5000000", "--dp", "2", "--router", "cache_aware")


def _taken(db: Path) -> tuple[str, dict]:
    return taken(db, TABLES)


_batches = batches


def _same(got, want) -> None:
    """Equal value for value and type for type (an int sum is not a float, None is not 0)."""
    assert got == want
    for field, a, b in zip(want._fields, got, want):
        assert repr(a) == repr(b), field


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cuts=st.lists(st.floats(0, 1), max_size=6))
def test_the_folded_scan_is_the_stores_whatever_the_batches(recorded, cuts):
    run_id, tables = _taken(recorded)
    fold = StoryRows(run_id)
    for batch in _batches(tables, cuts):
        fold.take(batch)
    with open_store(recorded) as con:
        story, context, evictions, scan = fold.results_scan(con, run_id)
        assert story is not None and context is not None and evictions is not None
        want = run_scan(con, run_id, miss=True)
        # the replay has what the scan's filters and parts read
        assert want.transfers.loadbacks and want.totals.hit_requests and want.named_ranks == 2
        assert want.loadback.tiered_loadback_ns and want.transfers.prefetches
        _same(scan, want)


def test_the_evidence_is_the_same_from_the_folded_scan(recorded, monkeypatch):
    """compute_evidence with the fold (as a writer process's close runs it): the scan is not
    queried, and every section is what it is without the fold."""
    from tierdiag.diagnose.run import evidence as E
    from tierdiag.diagnose.run import story_rows

    run_id, tables = _taken(recorded)
    with open_store(recorded) as con:
        run = resolve_run(con, run_id)
        without = E.compute_evidence(con, run)
    fold = StoryRows(run_id)
    for batch in _batches(tables, [0.2, 0.5, 0.51]):
        fold.take(batch)
    calls = []
    real = E.run_scan
    monkeypatch.setattr(E, "run_scan", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(story_rows, "_FOLDS", [fold])
    with open_store(recorded) as con:
        folded = E.compute_evidence(con, run)
    assert calls == []
    assert folded == without


@pytest.mark.parametrize("spoil", ["a transfer batch never committed", "a request batch never committed",
                                   "a transfer column missing", "a request column of another type"])
def test_where_the_scan_is_not_the_stores_it_is_queried_the_others_kept(recorded, spoil):
    run_id, tables = _taken(recorded)
    fold = StoryRows(run_id)
    batches = list(_batches(tables, [0.4, 0.7]))
    if spoil == "a transfer batch never committed":
        batches[1]["transfers"] = {c: a.slice(0, len(a) - 1) for c, a in batches[1]["transfers"].items()}
    if spoil == "a request batch never committed":  # one unfinished row more than the store holds
        extra = {c: pa.concat_arrays([a, a.slice(0, 1)]) for c, a in batches[1]["requests"].items()}
        extra["status"] = pa.array(batches[1]["requests"]["status"].to_pylist() + ["rejected"], pa.string())
        extra["ttft_ns"] = pa.array(batches[1]["requests"]["ttft_ns"].to_pylist() + [None], pa.int64())
        batches[1]["requests"] = extra
    if spoil == "a transfer column missing":
        del batches[0]["transfers"]["t_end_ns"]
    if spoil == "a request column of another type":
        n = len(batches[2]["requests"]["queue_ns"])
        batches[2]["requests"]["queue_ns"] = pa.array([{"x": 1}] * n)
    for batch in batches:
        fold.take(batch)  # never raises
    with open_store(recorded) as con:
        story, context, evictions, scan = fold.results_scan(con, run_id)
    assert scan is None, spoil
    if spoil in ("a transfer batch never committed", "a transfer column missing"):
        assert story is not None and context is not None and evictions is not None


# Hostile rows for the fold against the scan: NULLs in every column it reads, statuses the
# finished filter reads otherwise, negatives, magnitudes near and past the fold's range, ranks
# moved or not, transfer kinds near the two it counts.
_HUGE = st.sampled_from([2**40, 2**54, 2**55, 2**62, -(2**61)])
_STATUS = st.sampled_from([None, "finished", "finished", "rejected", "finished\x00", "", "Finished"])
_KIND = st.sampled_from([None, "load_back", "load_back", "prefetch", "load_back\x00", "", "prefetch_x"])


@st.composite
def _hostile(draw):
    huge = draw(st.integers(0, 4)) == 0
    num = st.one_of(st.none(), st.integers(0, 40), st.integers(-3, 3), st.integers(0, 10**12),
                    *([_HUGE] if huge else []))
    rank = st.one_of(st.none(), st.integers(0, 2))
    requests = []
    for i in range(draw(st.integers(0, 7))):
        row = {c: draw(num) for c in sr._INT_NEED if c not in ("dp_rank", "best_rank")}
        row.update(seq=i, status=draw(_STATUS), dp_rank=draw(rank), best_rank=draw(rank))
        if draw(st.booleans()):
            row["ttft_ns"] = draw(st.integers(0, 10**9))  # most rows finished
        requests.append(row)
    transfers = [dict(transfer_id=draw(st.one_of(st.none(), st.integers(0, 99))), kind=draw(_KIND),
                      **{c: draw(num) for c in ("bytes", "pages", "runs", "t_start_ns", "t_end_ns")})
                 for _ in range(draw(st.integers(0, 6)))]
    return {"requests": requests, "transfers": transfers}


@pytest.fixture(scope="module")
def empty_store():
    with empty_store_of() as con:
        yield con


def _declines_rightly(rows: dict) -> bool:
    """Whether the rows hold what the fold leaves to the SQL (scan_rows.py's rules)."""
    values = [r.get(c) for r in rows["requests"] for c in sr._INT_NEED]
    values += [r.get(c) for r in rows["transfers"] for c in sr._T_INT]
    if any(v is not None and abs(v) >= sr._NP_SAFE for v in values):
        return True
    for r in rows["requests"]:
        if (r["status"] or "finished") != "finished" or r.get("ttft_ns") is None:
            continue
        rec = r["recomputed_tokens"] or 0
        gap = sum((r[c] or 0) * s for c, s in (("best_rank_device_tokens", 1), ("best_rank_host_tokens", 1),
                                                ("arrival_device_tokens", -1), ("arrival_host_tokens", -1),
                                                ("storage_match_tokens", -1)))
        moved = None not in (r["dp_rank"], r["best_rank"]) and r["dp_rank"] != r["best_rank"]
        if rec > 0 and moved and min(rec, max(gap, 0)) != 0 and (r["recompute_ns"] or 0) < 0:
            return True
    return False


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=_hostile(), cut=st.floats(0, 1))
def test_the_scan_fold_is_the_sqls_or_declines(empty_store, rows, cut):
    """scan_rows.py (the rows cut in two batches) against `run_scan(miss=True)` (DuckDB) on the
    same rows: where it answers, equal value for value and type for type; where it declines, one
    of its rules holds."""
    import duckdb

    con = empty_store
    try:
        for table, drawn in rows.items():
            for r in drawn:
                cols = sorted(r)
                insert_rows(con, f"INSERT INTO {table} (run_id, {', '.join(cols)})", [["R", *(r[c] for c in cols)]])
        tables = {t: con.sql(f"SELECT * EXCLUDE (run_id) FROM {t} ORDER BY rowid").to_arrow_table()
                  for t in ("requests", "transfers")}
        fold = sr.ScanRows()
        for batch in _batches(tables, [cut]):
            fold.take(batch)
        row = fold.row()
        if row is None:
            event("declined")
            assert _declines_rightly(rows), rows
            return
        event("answered")
        try:
            want = run_scan(con, "R", miss=True)
        except duckdb.Error:
            pytest.fail(f"the fold answered rows the SQL refuses: {rows}")
        _same(scan_of_row(row, True), want)
        assert fold.check()[0] == len(rows["requests"]) and fold.check()[1] == len(rows["transfers"])
    finally:
        con.execute("DELETE FROM requests")
        con.execute("DELETE FROM transfers")


@settings(max_examples=100, deadline=None)
@given(rows=st.lists(st.lists(st.integers(-(2**57) + 1, 2**57 - 1), min_size=3, max_size=3), max_size=300))
def test_the_sums_are_exact_either_way(rows):
    """`_sum_rows`: each row's exact sum (Python's), by one int64 sum where the bound allows it
    and in two halves of 32 bits past it (values to 2^57, sums far past int64)."""
    import numpy as np

    m = np.array(rows, dtype=np.int64).reshape(-1, 3).T
    want = [sum(r[i] for r in rows) for i in range(3)]
    assert sr._sum_rows(m, False) == want
    if all(abs(x) < 2**40 for r in rows for x in r):
        assert sr._sum_rows(m, True) == want
