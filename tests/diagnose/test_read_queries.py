"""The read model's typed results name the columns they hold (issue 38 step 3): each NamedTuple a
query in diagnose/read/ returns is built by position from its SELECT, so a field out of order
would put one number under another's name. Each is checked here against the same numbers
computed in Python from the planted run's whole rows (`SELECT *`), field by field.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from tierdiag.diagnose.read import advice as read_advice
from tierdiag.diagnose.read import observed as read_obs
from tierdiag.diagnose.read import queries
from tierdiag.diagnose.read import request_context as read_req
from tierdiag.diagnose.read import request_steps as read_steps
from tierdiag.diagnose.read import run_context as read_ctx
from tierdiag.diagnose.read.rows import fetch_dicts, has_column
from tierdiag.store.reader import open_store, resolve_run

MS = 1_000_000

# Three batches on rank 0: (batch_id, start, end, compute, load-back exposed, recompute).
BATCHES = [(0, 0, 2 * MS, 900_000, 0, 100_000), (1, 20 * MS, 31 * MS, 60_000, 8 * MS, 0),
           (2, 60 * MS, 61 * MS, 280_000, 0, 250_000)]


@pytest.fixture
def store(planted):
    import duckdb

    with duckdb.connect(str(planted.path)) as rw:
        run_id = rw.execute("SELECT run_id FROM runs").fetchone()[0]
        for bid, s, e, c, x, rc in BATCHES:
            rw.execute("INSERT INTO batches (run_id, batch_id, t_start_ns, t_end_ns, num_reqs, extend_tokens, "
                       "loadback_bytes, compute_ns, loadback_exposed_ns, num_decoding, recompute_ns, dp_rank) "
                       "VALUES (?, ?, ?, ?, 1, 0, 0, ?, ?, 0, ?, 0)", [run_id, bid, s, e, c, x, rc])
    con = open_store(planted.path)
    run = resolve_run(con, None)
    rows = fetch_dicts(con, "SELECT * FROM requests WHERE run_id = ? ORDER BY seq", [run.run_id])
    yield con, run, rows
    con.close()


def _finished(rows):
    return [r for r in rows if (r["status"] or "finished") == "finished" and r["ttft_ns"] is not None]


def _sum(rows, key):
    values = [r[key] for r in rows if r[key] is not None]
    return sum(values) if values else None


def test_run_context_totals_name_their_columns(store):
    con, run, rows = store
    done = _finished(rows)
    t = read_ctx.finished_totals(con, run.run_id)
    assert (t.finished, t.ttft_ns, t.queue_ns) == (len(done), _sum(done, "ttft_ns"), _sum(done, "queue_ns"))
    assert t.start_ns == min(r["arrival_ns"] for r in done) and t.ttft_p50_ns <= t.ttft_p99_ns
    assert tuple(read_ctx.finished_token_totals(con, run.run_id)) == (_sum(done, "input_tokens"),
                                                                       _sum(done, "recomputed_tokens"))
    own = read_ctx.own_parts(con, run.run_id)
    assert own._asdict() == {k: _sum(done, k) for k in ("recompute_ns", "compute_ns", "loadback_exposed_ns",
                                                         "decode_wait_ns")}
    lr = read_ctx.loadback_requests(con, run.run_id)
    tiered = [r for r in done if (r["host_hit_tokens"] or 0) + (r["storage_hit_tokens"] or 0) > 0]
    assert (lr.ttft_ns, lr.loadback_exposed_ns, lr.tiered_ttft_ns) == (
        _sum(done, "ttft_ns"), _sum(done, "loadback_exposed_ns"), _sum(tiered, "ttft_ns"))
    assert dict(read_ctx.loadback_skipped_by_reason(con, run.run_id)) == {"below_threshold": 192}
    assert read_ctx.named_ranks(con, run.run_id) == len({r["dp_rank"] for r in rows if r["dp_rank"] is not None})
    assert read_ctx.first_arrival_ns(con, run.run_id) == min(r["arrival_ns"] for r in rows)


def test_batches_name_their_columns(store):
    con, run, _ = store
    rec = read_ctx.batch_recompute_sql(con)
    assert rec == "recompute_ns" and has_column(con, "batches", "recompute_ns")
    b = read_ctx.batch_arrays(con, run.run_id, rec)
    assert [list(map(int, col)) for col in b] == [
        [x[1] for x in BATCHES], [x[2] for x in BATCHES], [x[3] for x in BATCHES],
        [min(x[5], x[3]) for x in BATCHES], [x[4] for x in BATCHES], [0, 0, 0]]
    totals = read_ctx.batch_totals(con, run.run_id, rec)
    assert totals._asdict() == {"busy_ns": sum(x[2] - x[1] for x in BATCHES),
                                "compute_ns": sum(x[3] for x in BATCHES), "recompute_ns": sum(x[5] for x in BATCHES)}
    assert read_ctx.batch_totals(con, run.run_id, None).recompute_ns == 0
    # The window (19 ms, 32 ms) holds batch 1 whole.
    load = read_req.window_load(con, run.run_id, 19 * MS, 32 * MS, 0, rec)
    assert (load.num_batches, load.busy_ns, load.compute_ns, load.recompute_ns) == (1, 11 * MS, 60_000, 0)
    [one] = read_req.window_batches(con, run.run_id, 19 * MS, 32 * MS, 0, rec)
    assert one == read_req.WindowBatch(20 * MS, 31 * MS, 60_000, 8 * MS, 0)
    w = read_steps.window_device_evictions(con, run.run_id, 19 * MS, 32 * MS)
    ev = read_steps.window_eviction_load(con, run.run_id, 19 * MS, 32 * MS, w.first_id, w.last_id)
    assert (ev.window_busy_ns, ev.run_busy_ns) == (11 * MS, totals.busy_ns)


def test_wait_windows_and_story_rows_follow_the_requests(store):
    con, run, rows = store
    done = [r for r in _finished(rows) if r["prefill_ns"] is not None]
    w = read_ctx.wait_windows(con, run.run_id)
    assert sorted(zip(map(int, w.start_ns), map(int, w.first_token_ns))) == sorted(
        (r["arrival_ns"] + (r["storage_wait_ns"] or 0), r["first_token_ns"]) for r in done)
    s = read_ctx.story_requests(con, run.run_id)
    finished = _finished(rows)
    assert list(map(int, s.arrival_ns)) == [r["arrival_ns"] for r in finished]
    assert list(map(int, s.queue_ns)) == [r["queue_ns"] or 0 for r in finished]
    assert list(map(int, s.own_compute_ns)) == [r["compute_ns"] or 0 for r in finished]
    assert list(map(int, s.own_loadback_ns)) == [r["loadback_exposed_ns"] or 0 for r in finished]
    assert all(int(e) >= 0 for e in s.excess_ns)


def test_transfers_and_evictions_of_a_request(store):
    con, run, rows = store
    transfers = fetch_dicts(con, "SELECT * FROM transfers WHERE run_id = ? ORDER BY t_start_ns, transfer_id",
                            [run.run_id])
    got = read_steps.request_transfers(con, run.run_id, "stor", None, None)
    assert [t._asdict() for t in got] == [{k: t[k] for k in read_steps.TransferRecord._fields}
                                          for t in transfers if t["req_id"] == "stor"]
    assert ("prefetch", 50 * MS, 55 * MS) in [(t.kind, t.t_start_ns, t.t_end_ns) for t in got]
    assert [t.kind for t in read_steps.request_transfers(con, run.run_id, "stor", 51 * MS, None)] == [
        t["kind"] for t in transfers if t["req_id"] == "stor" and t["t_start_ns"] >= 51 * MS]
    evs = read_steps.request_evictions(con, run.run_id, "recomp")
    assert [(e.tier, e.action, e.prefix_tokens, e.tokens, e.cause_req_id, e.owner_req_id) for e in evs] == [
        ("device", "demote", 512, 512, "f2", "warm"), ("host", "delete", 512, 512, "f2", "warm")]
    assert evs[0].pool_capacity_tokens is not None and evs[0].node_last_access_ns == 1 * MS
    w = read_steps.window_device_evictions(con, run.run_id, 0, 100 * MS)
    dev_n, dev_tokens = w.evictions, w.tokens
    ids = sorted(e["eviction_id"] for e in fetch_dicts(con, "SELECT * FROM evictions WHERE run_id = ? AND tier = 'device'",
                                                         [run.run_id]))
    assert (w.first_id, w.last_id) == (ids[0], ids[-1])
    none = read_steps.window_device_evictions(con, run.run_id, 500 * MS, 600 * MS)
    assert none == (0, 0, None, None)
    assert read_steps.window_eviction_load(con, run.run_id, 500 * MS, 600 * MS, None, None).window_rereferenced_tokens == 0
    totals = read_ctx.device_evictions(con, run.run_id)
    assert (dev_n, dev_tokens) == (totals.evictions, totals.tokens) == (4, 1024 + 1024 + 512 + 192)
    assert totals.rereferenced_tokens == totals.tokens  # every device eviction took some request's prefix
    loadbacks = [t for t in transfers if t["kind"] == "load_back"]
    assert read_ctx.loadback_count_bytes(con, run.run_id) == (len(loadbacks), sum(t["bytes"] for t in loadbacks))
    lt = read_ctx.loadback_transfers(con, run.run_id)
    assert (lt.transfers, lt.bytes, lt.pages, lt.runs) == (
        len(loadbacks), sum(t["bytes"] for t in loadbacks), sum(t["pages"] for t in loadbacks),
        sum(t["runs"] for t in loadbacks))
    assert lt.busy_ns == sum(t["t_end_ns"] - t["t_start_ns"] for t in loadbacks)
    lb_n, lb_bytes = read_steps.window_loadbacks(con, run.run_id, 0, 100 * MS)
    assert (lb_n, lb_bytes) == (lt.transfers, lt.bytes)


def test_advice_and_observed_numbers_name_their_columns(store):
    con, run, rows = store
    served = [r for r in rows if r["status"] == "finished" and r["ttft_ns"] is not None]
    h = read_advice.headline(con, run.run_id)
    assert (h.recomputed_tokens, h.device_tokens, h.host_tokens, h.storage_tokens, h.input_tokens) == tuple(
        _sum(served, k) for k in ("recomputed_tokens", "device_hit_tokens", "host_hit_tokens",
                                  "storage_hit_tokens", "input_tokens"))
    assert h.ttft_mean_ns == pytest.approx(_sum(served, "ttft_ns") / len(served))
    assert read_advice.found_and_input_tokens(con, run.run_id, "host") == (
        _sum(served, "device_hit_tokens") + _sum(served, "host_hit_tokens"), _sum(served, "input_tokens"))
    t = read_advice.target_numbers(con, run.run_id, ["sum(input_tokens)", "count(*)"])
    assert (t.ttft_p50_ns, t.ttft_p99_ns) == (h.ttft_p50_ns, h.ttft_p99_ns)
    assert t.targets == (_sum(served, "input_tokens"), len(served))
    assert read_advice.request_ttft_ns(con, run.run_id, "miss") == next(r["ttft_ns"] for r in rows if r["req_id"] == "miss")
    assert read_advice.request_ttft_ns(con, run.run_id, "nobody") is None
    assert read_obs.request_count(con, run.run_id) == len(rows)
    assert read_obs.request_counts(con, run.run_id, "no-such-run") == {run.run_id: len(rows)}
    assert read_obs.shared_requests(con, run.run_id, run.run_id) == len(rows)
    totals = read_obs.observed_totals(con, run.run_id)
    assert (totals.requests, totals.finished, totals.input_tokens, totals.device_tokens) == (
        len(rows), len([r for r in rows if r["status"] == "finished"]),
        _sum([r for r in rows if r["device_hit_tokens"] is not None], "input_tokens"), _sum(rows, "device_hit_tokens"))
    # A run paired with itself agrees on every split and has no TTFT error.
    p = read_obs.pair_totals(con, run.run_id, run.run_id, 16)
    assert (p.matched, p.split_match, p.observed_device_tokens) == (len(rows), p.split_known,
                                                                     p.replayed_device_tokens)
    assert p.ttft_abs_error_p90_ns == 0
    worst = read_obs.worst_pairs(con, run.run_id, run.run_id, 16, 3)
    assert len(worst) == 3 and all(w.observed_ttft_ns == w.replayed_ttft_ns for w in worst)


def test_outcomes_are_the_rows(store):
    con, run, rows = store
    got = [queries.OutcomeRow(*r) for r in queries.outcome_rows(con, [run.run_id])]
    assert [o.req_id for o in got] == [r["req_id"] for r in rows]
    for o, r in zip(got, rows):
        assert (o.device_hit_tokens, o.host_hit_tokens, o.input_tokens) == (
            r["device_hit_tokens"] or 0, r["host_hit_tokens"] or 0, r["input_tokens"] or 0)
        assert o.ttft_ns == (r["ttft_ns"] if r["status"] == "finished" else None)
    assert [o[1] for o in queries.outcome_rows(con, [run.run_id], "dev")] == ["dev"]
    # The twin's pairs of a run paired with itself: each finished request with a TTFT, both sides equal.
    pairs = [read_obs.TwinPair(*p) for p in read_obs.twin_pairs(con, run.run_id, run.run_id)]
    assert sorted(p.observed_ttft_ns for p in pairs) == sorted(
        r["ttft_ns"] for r in rows if r["status"] == "finished" and (r["ttft_ns"] or 0) > 0)
    assert all(p.twin_ttft_ns == p.observed_ttft_ns and p.twin_rank == p.observed_rank for p in pairs)


def _reorder(con, table: str, order: str) -> None:
    """Rewrite `table`'s rows in another order (a scan then meets them out of order)."""
    con.execute(f"CREATE TEMP TABLE moved AS SELECT * FROM {table} ORDER BY {order}")
    con.execute(f"DELETE FROM {table}")
    con.execute(f"INSERT INTO {table} SELECT * FROM moved")
    con.execute("DROP TABLE moved")


def test_story_rows_are_in_trace_order_with_their_causes_and_losses_as_explain_has_them(planted):
    """story_requests gives the cause as a one-byte code (CAUSES' index; issue 41: a million
    Python strings at 1M requests) and takes the engine's own lost-while-queued count without
    the eviction join where every finished row has it: each the same as the row's cause
    (`cause_sql`) and `waiting.lost_while_waiting`, in trace order however the rows were written."""
    import duckdb

    from tierdiag.diagnose.read.sql import finished_sql
    from tierdiag.diagnose.read.waiting import lost_while_waiting
    from tierdiag.diagnose.request.causes import cause_sql

    for case in ("the engine's count on every row", "out of order", "a row without the engine's count"):
        with duckdb.connect(str(planted.path)) as rw:
            if case == "the engine's count on every row":  # the planted rows have none: the join
                rw.execute("UPDATE requests SET miss_lost_while_queued_tokens = seq % 3")
            if case == "out of order":
                _reorder(rw, "requests", "seq DESC")
            if case == "a row without the engine's count":
                rw.execute("UPDATE requests SET miss_lost_while_queued_tokens = NULL WHERE seq = "
                           "(SELECT min(seq) FROM requests WHERE first_token_ns IS NOT NULL)")
        with open_store(planted.path) as con:
            run = resolve_run(con, None)
            want = con.execute(f"SELECT req_id, seq, {cause_sql('q')} FROM requests q WHERE q.run_id = ? "
                               f"AND {finished_sql('q')} ORDER BY seq", [run.run_id]).fetchall()
            s = read_ctx.story_requests(con, run.run_id)
            assert str(s.cause.dtype) == "int8", case
            assert read_ctx.cause_names(s.cause) == [c for _, _, c in want], case
            assert [int(x) for x in s.lost_waiting_tokens] == [
                lost_while_waiting(con, run.run_id, rid, seq) for rid, seq, _ in want], case
            assert len(want) > 1 and {c for _, _, c in want} - {None}, case
            assert any(s.lost_waiting_tokens), case


def test_batches_are_in_clock_order_however_they_were_written(store, planted):
    con, run, _ = store
    want = read_ctx.batch_arrays(con, run.run_id, "recompute_ns")
    path = planted.path
    con.close()
    import duckdb

    with duckdb.connect(path) as rw:
        _reorder(rw, "batches", "t_start_ns DESC")
    with open_store(path) as again:
        got = read_ctx.batch_arrays(again, run.run_id, "recompute_ns")
    assert [list(map(int, c)) for c in got] == [list(map(int, c)) for c in want]
    assert list(map(int, got.start_ns)) == sorted(x[1] for x in BATCHES)


keys = st.lists(st.tuples(st.integers(-2**63, 2**63 - 1), st.sampled_from([-2**63, -1, 0, 1, 7, 2**63 - 1])),
                max_size=40)


@settings(max_examples=80, deadline=None)
@given(keys)
def test_sorted_by_is_a_stable_sort_by_its_keys(rows):
    """`sorted_by` (what batch_arrays and story_requests sort with, in place of DuckDB's ORDER BY)
    is Python's stable sort by (first key, second key): ties, negatives, int64's ends, in order or not."""
    import numpy as np

    cols = {"a": np.array([a for a, _ in rows], dtype=np.int64), "b": np.array([b for _, b in rows], dtype=np.int64),
            "i": np.arange(len(rows))}
    got = read_ctx.sorted_by(cols, "b", "a")
    want = sorted(range(len(rows)), key=lambda i: rows[i])
    assert got["i"].tolist() == want
    assert list(zip(got["a"].tolist(), got["b"].tolist())) == [rows[i] for i in want]
