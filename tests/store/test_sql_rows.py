"""tests/support/sql_rows.py: `insert_rows` stores what executemany stores (the same values, types,
order and rowids) on hostile rows, refuses what executemany refuses, and keeps the order past a
statement's chunk."""

from __future__ import annotations

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import sql_rows
from tests.support.sql_rows import insert_rows

_TABLE = "CREATE TABLE t (a BIGINT, b INTEGER, c VARCHAR, d DOUBLE, e BOOLEAN)"
_ROW = st.tuples(st.none() | st.integers(-2**63, 2**63 - 1) | st.integers(-5, 5),
                 st.none() | st.integers(-2**31, 2**31 - 1) | st.integers(2**31, 2**40),  # past INTEGER: refused
                 st.none() | st.text(max_size=8),
                 st.none() | st.floats(allow_nan=False) | st.integers(-2**53, 2**53),
                 st.none() | st.booleans())


def _tables() -> tuple:
    a, b = duckdb.connect(":memory:"), duckdb.connect(":memory:")
    for con in (a, b):
        con.execute(_TABLE)
    return a, b


def _read(con) -> list:
    return con.execute("SELECT rowid, a, b, c, d, e, typeof(a), typeof(b) FROM t ORDER BY rowid").fetchall()


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(_ROW, max_size=12), columns=st.sampled_from(["", " (a, b, c, d, e)", " (e, d, c, b, a)"]))
def test_the_rows_are_executemanys(rows, columns):
    if columns.startswith(" (e"):
        rows = [r[::-1] for r in rows]
    want_con, got_con = _tables()
    head = f"INSERT INTO t{columns}"
    try:
        if rows:
            want_con.executemany(f"{head} VALUES ({', '.join('?' * 5)})", rows)
    except duckdb.Error:
        with pytest.raises(duckdb.Error):  # executemany refused a row: so does the one statement
            insert_rows(got_con, head, rows)
        return
    insert_rows(got_con, head, rows)
    assert _read(got_con) == _read(want_con)


def test_the_order_holds_past_a_chunk(monkeypatch):
    monkeypatch.setattr(sql_rows, "CHUNK_ROWS", 7)
    con = duckdb.connect(":memory:")
    con.execute(_TABLE)
    rows = [(i, -i, f"r{i}", i / 2, i % 2 == 0) for i in range(30)]
    insert_rows(con, "INSERT INTO t", rows)
    assert con.execute("SELECT rowid, a, b, c, d, e FROM t ORDER BY rowid").fetchall() == [(i, *r) for i, r in
                                                                                          enumerate(rows)]
