"""The writer process's vacuum policy (store/writer_serve.py `vacuum_due`): while every table of
the run is short of a row group (writer_process.VACUUM_ROWS), every VACUUM_EVERY-th write's
checkpoint merges the row groups the writes before it left, as before; from then on only once
they hold a row group's worth of rows in the table with the most, never more often than every
VACUUM_EVERY-th write, and at least every VACUUM_MOST_WRITES-th (issue 41, session 30: each vacuum
rewrites the trailing row groups it merges)."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from tierdiag.store import writer_process, writer_serve
from tierdiag.store.writer_serve import vacuum_due

EVERY, ROWS, MOST = writer_process.VACUUM_EVERY, writer_process.VACUUM_ROWS, writer_process.VACUUM_MOST_WRITES

_COUNTS = st.one_of(st.integers(-10**18, 10**18), st.sampled_from([-1, 0, 1, ROWS - 1, ROWS, ROWS + 1, 2**63]))


def test_the_policy_constants_are_coherent():
    assert 1 <= EVERY <= MOST
    assert ROWS == 122_880  # DuckDB's row group


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.integers(-10**18, 10**18), st.sampled_from([-1, 0, 1, EVERY - 1, EVERY, MOST - 1, MOST, 2**63])),
       _COUNTS, _COUNTS)
def test_vacuum_due_for_any_counts(writes, rows, total):
    """Hostile counts (negative, zero, past int64): a bool; never before VACUUM_EVERY writes; from
    it on always while the run's tables are short of a row group, or from VACUUM_MOST_WRITES
    writes on, and otherwise exactly when the writes' rows fill a row group."""
    got = vacuum_due(writes, rows, total)
    assert isinstance(got, bool)
    if writes < EVERY:
        assert got is False
    elif total < ROWS or writes >= MOST:
        assert got is True
    else:
        assert got is (rows >= ROWS)
    # More writes or more rows since the last vacuum never take a vacuum away.
    assert vacuum_due(writes + 1, rows, total) >= got and vacuum_due(writes, rows + 1, total) >= got


class _Writer:
    """RunWriter's surface that _Serve.rows and _Serve.write use: what each write asked for."""

    def __init__(self, hold: bool = False):
        self.vacuums: list[bool] = []
        self.hold = hold  # a reader holds the file: the write keeps its rows pending
        self._pending = False

    def take(self, tables):
        self._pending = True
        return tables

    def hold_memory(self, limit_bytes: int) -> bool:  # (a large run's writes hold DuckDB's memory: nothing to hold here)
        return False

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
def test_a_write_vacuums_as_vacuum_due_says_of_the_rows_taken(writes):
    """_Serve counts the rows taken by table since the last vacuuming write and in the whole run:
    each write vacuums exactly as vacuum_due says of those counts, and a vacuuming write that wrote
    starts the first afresh; a table with few rows beside one with many does not hold it back."""
    w = _Writer()
    serve = _serve(w)
    since_writes, since, total = 0, {"evictions": 0, "requests": 0}, {"evictions": 0, "requests": 0}
    expected = []
    for evictions, requests in writes:
        _hand(serve, evictions=evictions, requests=requests)
        for t, n in (("evictions", evictions), ("requests", requests)):
            since[t] += n
            total[t] += n
        since_writes += 1
        due = vacuum_due(since_writes, max(since.values()), max(total.values()))
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


def test_large_runs_small_writes_vacuum_less_often_and_the_rest_as_before():
    """A loaded machine's writes of a large run (a few ten thousand rows each) merge their row
    groups once a row group's worth has come; a quiet 1M replay's (more than a row group each) and
    a small run's (its tables short of a row group) every VACUUM_EVERY-th."""
    small, large, tiny = _Writer(), _Writer(), _Writer()
    s_small, s_large, s_tiny = _serve(small), _serve(large), _serve(tiny)
    for _ in range(14):
        _hand(s_small, evictions=20_000, requests=4_000)
        s_small.write()
        _hand(s_large, evictions=130_000, requests=26_000)
        s_large.write()
        _hand(s_tiny, evictions=4_000, requests=900)
        s_tiny.write()
    assert large.vacuums == [(i + 1) % EVERY == 0 for i in range(14)]
    assert tiny.vacuums == [(i + 1) % EVERY == 0 for i in range(14)]
    # 20k a write: every 2nd until the run's evictions reach a row group (the 7th write: 140k),
    # then once 122,880 have come since the last vacuum (the 6th write's): the 13th write's 140k.
    assert small.vacuums == [i in (1, 3, 5, 12) for i in range(14)]


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
