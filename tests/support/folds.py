"""A recorded run's rows as the store's writer takes them, for the tests of the folds made while
recording (diagnose/run/eviction_rows.py, scan_rows.py): the tables read back in their insert
order (`taken`), cut into batches at the same shares of each (`batches`), an empty store for
drawn rows (`empty_store`), and the replay they are read from (`replayed`)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from tierdiag.store.reader import open_store, resolve_run


def replayed(folder: Path, *options) -> Path:
    """A store in `folder` holding a replay (an inline writer: the rows as committed) of a synth
    agent trace of 300 requests (seed 5) with `options`."""
    from tests.support.cli import cli_env, completed_in_process as run

    trace = folder / "t.jsonl"
    assert run("synth", trace, "--requests", "300", "--kind", "agent", "--seed", "5").returncode == 0
    db = folder / "run.duckdb"
    done = run("replay", trace, "--db", db, *options, env=cli_env(TIERDIAG_WRITER="inline"))
    assert done.returncode == 0, done.stderr
    return db


def taken(db: Path, tables: tuple[str, ...]) -> tuple[str, dict]:
    """(the run id, {table: its rows as an Arrow table, in insert order}) of the one run in `db`."""
    with open_store(db) as con:
        run_id = resolve_run(con, None).run_id
        rows = {t: con.sql(f"SELECT * EXCLUDE (run_id) FROM {t} ORDER BY rowid").to_arrow_table() for t in tables}
    return run_id, rows


def batches(tables: dict, cuts: list[float]):
    """The tables cut at the same shares of their rows (`cuts`, in [0, 1]): each batch a share of each."""
    at = 0.0
    for cut in sorted(set(cuts)) + [1.0]:
        batch = {}
        for t, rows in tables.items():
            lo, hi = int(rows.num_rows * at), int(rows.num_rows * cut)
            batch[t] = {c: rows.column(c).slice(lo, hi - lo).combine_chunks() for c in rows.column_names}
        yield batch
        at = cut


@contextmanager
def empty_store():
    """An in-memory store with the schema and no rows."""
    import duckdb

    from tierdiag.store.writer import init_store

    with duckdb.connect(":memory:") as con:
        init_store(con)
        yield con
