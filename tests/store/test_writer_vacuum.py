"""The writer process's vacuum policy (store/writer_serve.py `vacuum_due`): a write's checkpoint
merges the row groups the writes before it left once they hold a row group's worth of rows
(writer_process.VACUUM_ROWS) in the table with the most, never more often than every
VACUUM_EVERY-th write, and at least every VACUUM_MOST_WRITES-th (issue 41, session 30: each vacuum
rewrites the trailing row groups it merges)."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from tierdiag.store import writer_process, writer_serve
from tierdiag.store.writer_serve import vacuum_due

EVERY, ROWS, MOST = writer_process.VACUUM_EVERY, writer_process.VACUUM_ROWS, writer_process.VACUUM_MOST_WRITES


def test_the_policy_constants_are_coherent():
    assert 1 <= EVERY <= MOST
    assert ROWS == 122_880  # DuckDB's row group


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.integers(-10**18, 10**18), st.sampled_from([-1, 0, 1, EVERY - 1, EVERY, MOST - 1, MOST, 2**63])),
       st.one_of(st.integers(-10**18, 10**18), st.sampled_from([-1, 0, ROWS - 1, ROWS, ROWS + 1, 2**63])))
def test_vacuum_due_for_any_counts(writes, rows):
    """Hostile counts (negative, zero, past int64): a bool, never before VACUUM_EVERY writes, always
    from VACUUM_MOST_WRITES on, and in between exactly when a table's rows fill a row group."""
    got = vacuum_due(writes, rows)
    assert isinstance(got, bool)
    if writes < EVERY:
        assert got is False
    elif writes >= MOST:
        assert got is True
    else:
        assert got is (rows >= ROWS)
    # More rows or more writes never take a vacuum away.
    assert vacuum_due(writes + 1, rows) >= got and vacuum_due(writes, rows + 1) >= got


class _Writer:
    """RunWriter's surface that _Serve.rows and _Serve.write use: what each write asked for."""

    def __init__(self, hold: bool = False):
        self.vacuums: list[bool] = []
        self.hold = hold  # a reader holds the file: the write keeps its rows pending
        self._pending = False

    def take(self, tables):
        self._pending = True
        return tables

    @property
    def pending(self) -> bool:
        return self._pending

    def write(self, *, vacuum=True):
        self.vacuums.append(vacuum)
        self._pending = self.hold


def _serve(writer) -> writer_serve._Serve:
    serve = writer_serve._Serve(inbox=None, reply_fd=-1)
    serve.writer = writer
    serve.every = serve.every_max = serve.most = 10**9  # no write from `rows`: the test writes
    return serve


def _hand(serve, **tables: int) -> None:
    serve.rows({t: {"seq": list(range(n))} for t, n in tables.items()})


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3 * ROWS), st.integers(0, 40_000)), min_size=1, max_size=30))
def test_a_write_vacuums_once_a_row_groups_worth_is_there(writes):
    """_Serve counts the rows taken by table since the last vacuuming write: each write vacuums
    exactly as vacuum_due says of those counts, and a vacuuming write that wrote starts them
    afresh; a table with few rows beside one with many does not hold the vacuum back."""
    w = _Writer()
    serve = _serve(w)
    since_writes, since = 0, {"evictions": 0, "requests": 0}
    expected = []
    for evictions, requests in writes:
        _hand(serve, evictions=evictions, requests=requests)
        since["evictions"] += evictions
        since["requests"] += requests
        since_writes += 1
        due = vacuum_due(since_writes, max(since.values()))
        expected.append(due)
        serve.write()
        if due:
            since_writes, since = 0, {"evictions": 0, "requests": 0}
    assert w.vacuums == expected
    # Never two vacuums closer than VACUUM_EVERY writes, never more than VACUUM_MOST_WRITES apart.
    at = [i for i, v in enumerate(w.vacuums) if v]
    assert all(b - a >= EVERY for a, b in zip(at, at[1:]))
    gaps = [b - a for a, b in zip([-1] + at, at + [len(w.vacuums)])]
    assert all(g <= MOST for g in gaps[:-1])


def test_small_writes_vacuum_less_often_than_every_second_write_and_large_ones_as_before():
    """A loaded machine's writes (a few thousand rows each) merge their row groups once a row
    group's worth has come; a quiet 1M replay's (more than a row group each) every VACUUM_EVERY-th."""
    small, large = _Writer(), _Writer()
    s_small, s_large = _serve(small), _serve(large)
    for _ in range(12):
        _hand(s_small, evictions=20_000, requests=4_000)
        s_small.write()
        _hand(s_large, evictions=130_000, requests=26_000)
        s_large.write()
    assert large.vacuums == [(i + 1) % EVERY == 0 for i in range(12)]
    # 20k a write: the 7th write brings 140k >= 122,880 (the 6th 120k does not).
    assert small.vacuums == [i in (6, 13) for i in range(12)]


def test_a_write_a_reader_held_off_keeps_the_counts():
    """A write that could not take the file (a reader held it past the wait: RunWriter.write keeps
    the rows pending) merged nothing: the rows and writes since the last vacuum are still counted."""
    w = _Writer(hold=True)
    serve = _serve(w)
    for _ in range(3):
        _hand(serve, evictions=ROWS)
        serve.write()
    assert w.vacuums == [False, True, True]
    assert serve.writes_since_vacuum == 3 and serve.rows_since_vacuum == {"evictions": 3 * ROWS}
    w.hold = False
    serve.write()
    assert serve.writes_since_vacuum == 0 and serve.rows_since_vacuum == {}
