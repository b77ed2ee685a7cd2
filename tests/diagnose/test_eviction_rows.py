"""The evidence's eviction queries folded while a run is recorded (diagnose/run/eviction_rows.py,
issue 41 session 34): from the `requests`, `evictions` and `request_evictions` rows as a writer
takes them, batch by batch, beside the story's rows, they are what `removed_rereferences`,
`device_evictions` and `evictions_by_tier` read from the committed store, whatever the batches;
the run context, totals and summary made from them are the queried ones; where they cannot be
(rows the store does not hold, a batch the fold cannot project, rows numpy would read otherwise)
the close gets None for them and queries, the story's and the context's parts kept."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from tests.support.folds import batches, empty_store as empty_store_of, replayed, taken
from tests.support.sql_rows import insert_rows
from tierdiag.diagnose.read import run_context as read_ctx
from tierdiag.diagnose.read import totals as read_totals
from tierdiag.diagnose.run import eviction_rows as er
from tierdiag.diagnose.run.story_rows import StoryRows
from tierdiag.store.reader import open_store, resolve_run

TABLES = ("requests", "evictions", "request_evictions")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """A real replay with host deletes and re-references of what they removed, recorded."""
    return replayed(tmp_path_factory.mktemp("eviction_rows"), "--device-tokens", "32768", "--host-tokens", "65536")


def _taken(db: Path) -> tuple[str, dict]:
    return taken(db, TABLES)


_batches = batches


def _multiset(r) -> list:
    return sorted(zip(*[np.asarray(x).tolist() for x in r]))


def _same(got, con, run_id) -> None:
    assert got is not None
    want = read_ctx.removed_rereferences(con, run_id)
    assert got.removed is not None
    for field, a, b in zip(want._fields, got.removed, want):
        assert a.dtype == b.dtype, field
    assert _multiset(got.removed) == _multiset(want)  # the rows as a multiset: their one reader sums them
    assert got.device == read_ctx.device_evictions(con, run_id)
    assert sorted(got.by_tier, key=repr) == sorted(read_totals.evictions_by_tier(con, run_id), key=repr)


def _fold(tables: dict, run_id: str, cuts) -> StoryRows:
    fold = StoryRows(run_id)
    for batch in _batches(tables, cuts):
        fold.take(batch)
    return fold


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cuts=st.lists(st.floats(0, 1), max_size=6))
def test_the_folded_eviction_results_are_the_stores_whatever_the_batches(recorded, cuts):
    run_id, tables = _taken(recorded)
    fold = _fold(tables, run_id, cuts)
    with open_store(recorded) as con:
        story, context, evictions = fold.results_all(con, run_id)
        assert story is not None and context is not None
        assert len(read_ctx.removed_rereferences(con, run_id).tokens) > 10  # the replay has what the join reads
        _same(evictions, con, run_id)


def test_the_sections_are_the_same_from_the_folded_results(recorded):
    """The run context, the totals and the summary with the folded results: as queried."""
    from tierdiag.diagnose.run.numbers import compute_run_summary
    from tierdiag.diagnose.run.runcontext import compute_run_context
    from tierdiag.diagnose.run.totals import run_totals

    run_id, tables = _taken(recorded)
    fold = _fold(tables, run_id, [0.3, 0.31, 0.8])
    with open_store(recorded) as con:
        run = resolve_run(con, run_id)
        evictions = fold.results_all(con, run_id)[2]
        assert evictions is not None
        assert compute_run_context(con, run, evictions=lambda: evictions) == compute_run_context(con, run)
        assert run_totals(con, run_id, evictions=lambda: evictions) == run_totals(con, run_id)
        assert compute_run_summary(con, run, evictions=lambda: evictions) == compute_run_summary(con, run)


@pytest.mark.parametrize("spoil", ["an eviction batch never committed", "a re-reference batch never committed",
                                   "an eviction column missing", "an eviction column of another type",
                                   "a repeated request id"])
def test_where_the_evictions_are_not_the_stores_they_are_queried_the_story_kept(recorded, spoil):
    run_id, tables = _taken(recorded)
    fold = StoryRows(run_id)
    batches = list(_batches(tables, [0.4, 0.7]))
    if spoil == "an eviction batch never committed":
        batches[1]["evictions"] = {c: a.slice(0, len(a) - 1) for c, a in batches[1]["evictions"].items()}
    if spoil == "a re-reference batch never committed":
        batches[2]["request_evictions"] = {c: a.slice(1) for c, a in batches[2]["request_evictions"].items()}
    if spoil == "an eviction column missing":
        del batches[0]["evictions"]["node_hit_count"]
    if spoil == "an eviction column of another type":
        n = len(batches[2]["evictions"]["tokens"])
        batches[2]["evictions"]["tokens"] = pa.array([{"x": 1}] * n)
    if spoil == "a repeated request id":
        ids = batches[1]["requests"]["req_id"].to_pylist()
        batches[1]["requests"]["req_id"] = pa.array([batches[0]["requests"]["req_id"][0].as_py()] + ids[1:])
    for batch in batches:
        fold.take(batch)  # never raises
    with open_store(recorded) as con:
        story, context, evictions = fold.results_all(con, run_id)
    assert evictions is None, spoil
    if spoil != "a repeated request id":  # (the story's check sees the same ids: its own rows are kept)
        assert story is not None and context is not None


def test_the_text_codes_group_as_the_values_do():
    """`_text_codes` (numpy over the bytes of short words; Python values otherwise) groups rows
    exactly by value: NULL apart from '', a trailing NUL apart from none, long and odd words."""
    values = [None, "", "device", "host", "a\x00", "a", "\u00e9", "\u00df", None, "device", "x" * 9, "\x00", "d\x00e"]
    for rows in (values, values[:4] + values[8:10], ["host", "device", "host"], [None, None], []):
        codes, words = er._text_codes(pa.array(rows, type=pa.string()))
        assert [None if c < 0 else words[c] for c in codes.tolist()] == rows
        assert len(set(words)) == len(words)


# Hostile rows for the fold against the three queries: NULLs everywhere the join, the window and
# the groups read, repeated request and eviction ids, tokens summing to zero in a window,
# negatives, magnitudes near and past the fold's range, odd and long tier and action words.
_N = st.one_of(st.none(), st.integers(0, 30), st.integers(-3, 3), st.integers(0, 10**9))
_HUGE = st.sampled_from([2**40, 2**53 + 1, 2**62, -(2**61)])
_WORDS = st.sampled_from([None, "device", "host", "storage", "delete", "drop", "demote", "", "a\x00", "\u00e9",
                          "dropped_x", "device\u00df"])


@st.composite
def _hostile(draw):
    huge = draw(st.integers(0, 4)) == 0
    num = st.one_of(_N, _HUGE) if huge else _N
    # one example in two joinable: unique ids, every request scheduled and recomputing, most
    # evictions removals of their own id (the join's rows), the rest as drawn
    tame = draw(st.booleans())
    some = (lambda s: s) if tame else (lambda s: st.one_of(st.none(), s))
    small = st.integers(-3, 60) if tame else num
    nreq = draw(st.integers(0, 6))
    ids = [f"r{i}" if tame else draw(st.sampled_from([f"r{i}", f"r{i}", f"r{i}", "r0", None])) for i in range(nreq)]
    requests = [dict(req_id=ids[i], seq=i, status="finished", ttft_ns=5, arrival_ns=0,
                     prefill_ns=draw(some(st.integers(0, 10**6))), first_token_ns=draw(some(st.integers(0, 10**6))),
                     recomputed_tokens=draw(st.integers(1, 50) if tame else num),
                     loadback_skipped_reason=draw(st.sampled_from([None, "x"])),
                     loadback_skipped_tokens=draw(small), storage_skipped_reason=draw(st.sampled_from([None, "y"])),
                     storage_match_tokens=draw(small), storage_hit_tokens=draw(small)) for i in range(nreq)]
    nev = draw(st.integers(0, 8))
    evictions = [dict(eviction_id=i if tame else draw(st.one_of(st.integers(0, 9), st.none(), *([_HUGE] if huge else []))),
                      tier=draw(_WORDS), action=draw(st.one_of(_WORDS, st.sampled_from(["delete", "drop"]))),
                      tokens=draw(num),
                      node_hit_count=draw(st.one_of(st.none(), st.integers(0, 5))),
                      node_last_access_ns=draw(st.one_of(st.none(), st.integers(0, 10**6)))) for i in range(nev)]
    nlink = draw(st.integers(0, 8))
    links = [dict(req_id=draw(st.sampled_from([None, "r0", "r1", "r1", "r2", "r3", "zz"])),
                  eviction_id=draw(st.one_of(st.integers(0, 9), st.integers(0, 3), st.none())),
                  tokens=draw(st.one_of(st.integers(0, 40), st.integers(-2, 2)) if tame else num))
             for _ in range(nlink)]
    return {"requests": requests, "evictions": evictions, "request_evictions": links}


@pytest.fixture(scope="module")
def empty_store():
    with empty_store_of() as con:
        yield con


def _declines_rightly(rows: dict) -> bool:
    """Whether the rows hold what the fold leaves to the SQL (eviction_rows.py's rules)."""
    reqs, evs, links = rows["requests"], rows["evictions"], rows["request_evictions"]
    ids = [r["req_id"] for r in reqs if r["req_id"] is not None]
    if len(set(ids)) < len(ids):
        return True

    def joins(r):
        return r["prefill_ns"] is not None and (r["recomputed_tokens"] or 0) > 0

    for r in reqs:
        if joins(r) and (r["first_token_ns"] is None or (r["loadback_skipped_reason"] and r["loadback_skipped_tokens"] is None)
                         or (r["storage_skipped_reason"] and None in (r["storage_match_tokens"], r["storage_hit_tokens"]))):
            return True
    values = [v for t in rows.values() for r in t for k, v in r.items() if isinstance(v, int) and k != "seq"]
    if any(abs(v) >= er._SAFE for v in values):
        return True
    removal = [e["eviction_id"] for e in evs if e["action"] in ("delete", "drop") and e["eviction_id"] is not None]
    if len(set(removal)) < len(removal):
        return True
    by_id = {r["req_id"]: r for r in reqs if r["req_id"] is not None}
    joined = [link for link in links if link["eviction_id"] in removal and link["req_id"] in by_id
              and joins(by_id[link["req_id"]])]
    if any(link["tokens"] is None for link in joined):
        return True
    window: dict = {}
    for link in joined:
        window[link["req_id"]] = window.get(link["req_id"], 0) + link["tokens"]
    return any(s == 0 for s in window.values())


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=_hostile(), cut=st.floats(0, 1))
def test_the_eviction_fold_is_the_sqls_or_declines(empty_store, rows, cut):
    """eviction_rows.py (the rows cut in two batches) against `removed_rereferences`,
    `device_evictions`, `evictions_by_tier` (DuckDB) on the same rows: where it answers, equal
    (the re-references as a multiset, the dtypes too); where it declines, one of its rules holds."""
    import duckdb

    con = empty_store
    try:
        for table, drawn in rows.items():
            if drawn:
                cols = sorted(drawn[0])
                insert_rows(con, f"INSERT INTO {table} (run_id, {', '.join(cols)})",
                            [["R", *(r[c] for c in cols)] for r in drawn])
        tables = {t: con.sql(f"SELECT * EXCLUDE (run_id) FROM {t} ORDER BY rowid").to_arrow_table() for t in TABLES}
        fold = er.EvictionRows()
        for batch in _batches(tables, [cut]):
            fold.take(batch)
        got = fold.results()
        if got is None or got.removed is None:
            event("declined" if got is None else "the removals declined")
            assert _declines_rightly(rows), rows
            if got is None:
                return
        else:
            event("answered, with re-references" if len(got.removed.tokens) else "answered")
        try:
            want = read_ctx.removed_rereferences(con, "R") if got.removed is not None else None
            device, by_tier = read_ctx.device_evictions(con, "R"), read_totals.evictions_by_tier(con, "R")
        except duckdb.Error:  # an overflow the SQL refuses: the fold must not have answered it
            raise AssertionError(f"the fold answered rows the SQL refuses: {rows}") from None
        if want is not None:
            assert [a.dtype for a in got.removed] == [b.dtype for b in want] or not len(want.tokens)
            assert _multiset(got.removed) == _multiset(want)
        assert got.device == device
        assert sorted(got.by_tier, key=repr) == sorted(by_tier, key=repr)
    finally:
        for table in TABLES:
            con.execute(f"DELETE FROM {table}")
