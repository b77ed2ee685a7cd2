"""Rows into a DuckDB table for a test, fast: `insert_rows(con, "INSERT INTO t (a, b)", rows)` is
`con.executemany("INSERT INTO t (a, b) VALUES (?, ?)", rows)` in one statement a chunk of rows.

executemany runs its statement once a row: ~2 ms of CPU a row on this machine, most of an example
of the Hypothesis tests that insert a dozen drawn rows (issue 41, the suite's time). One INSERT
whose VALUES rows hold the parameters binds each value as executemany binds it (the same Python
to DuckDB conversion, then the same cast to the column's type) and stores the rows in their
order (a chunk is one statement, the chunks in order): the same table, row for row and rowid for
rowid (checked on the drawn rows of tests/diagnose/test_story_rows.py, session 33).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

CHUNK_ROWS = 1000  # rows a statement: well inside one of DuckDB's vectors (2,048 rows)


def insert_rows(con, head: str, rows: Iterable[Sequence]) -> None:
    """`head` (an `INSERT INTO table [(columns)]`) with `rows` (sequences of one length) as its
    VALUES; nothing where there are no rows, as executemany."""
    rows = [list(r) for r in rows]
    for at in range(0, len(rows), CHUNK_ROWS):
        chunk = rows[at:at + CHUNK_ROWS]
        one = f"({', '.join('?' * len(chunk[0]))})"
        con.execute(f"{head} VALUES {', '.join([one] * len(chunk))}", [v for row in chunk for v in row])
