"""Every reader leaves its DuckDB connection free for the next statement (h41safe item 3).

DuckDB 2 refuses a relation (`con.sql()`, `.query()`, `.table()`, `.register()`, `.from_arrow()`)
on a connection whose last `execute()` was read with `fetchone()` or `fetchmany()` and not to its
end: "Resource In Use Error: connection has an unfinished result from execute()" (checked on
duckdb 2.0.1: even a one-row `SELECT count(*)` read by fetchone() is unfinished until a fetch
returns nothing). `execute()` itself still replaces the result, which is why nothing failed yet;
but one reader that reads with `fetchone()` followed by one that asks a relation (store/copy_run.py
does) would fail with a traceback, exit 1.

What was found: 53 `fetchone()` calls (diagnose/read: 51, store/delete.py, store/export.py), every
one left its result unfinished; none fetchmany(). Each now reads with `fetchall()`: `[0]` where
the query always returns one row (an aggregate with no GROUP BY), the first row or None where it
may return none (a lookup by id, a LIMIT 1). The same rows, the same cost (one row).

| reader | before | after |
|---|---|---|
| any `diagnose/read` function, then `con.sql(...)` on the connection | ResourceInUseException | fine |
| `store.delete` / `store.export` counts, then a relation | the same | fine |
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import duckdb
import pytest

from tests.reliability.harness import ROOMY, real_trace_head
from tests.support.cli import tierdiag_in_process

REPO = Path(__file__).resolve().parents[2]


def test_no_reader_leaves_a_result_unfinished():
    """No `fetchone()` or `fetchmany()` anywhere in tierdiag (the parsed code, not comments): a
    reader reads its result to the end (fetchall, fetchnumpy, fetch_arrow_table ...)."""
    found = []
    for path in sorted((REPO / "tierdiag").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in ("fetchone", "fetchmany"):
                found.append(f"{path.relative_to(REPO)}:{node.lineno} {node.attr}")
    assert not found, "\n".join(found)


def test_duckdb_still_refuses_a_relation_after_an_unfinished_fetchone():
    """What the rule guards against, on the installed DuckDB (if a later DuckDB lifts it, this
    says so and the rule may be relaxed)."""
    con = duckdb.connect()
    con.execute("SELECT 1").fetchone()
    with pytest.raises(duckdb.Error, match="unfinished result"):
        con.sql("SELECT 2").fetchall()
    con.execute("SELECT 1").fetchall()
    assert con.sql("SELECT 2").fetchall() == [(2,)]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """Two replayed runs of a real trace's first 200 lines (sessions, hits, evictions), so that
    each reader has rows to read."""
    tmp = tmp_path_factory.mktemp("reads")
    trace = real_trace_head(tmp / "t.jsonl", 200, fallback=40)
    db = tmp / "s.duckdb"
    for name, tokens in (("a", "65536"), ("b", "32768")):
        r = tierdiag_in_process("replay", trace, "--db", db, *ROOMY[:-1], tokens, "--run-name", name, "--dp", "2")
        assert r.code == 0, r.err
    return db


def _free(con, after: str) -> None:
    try:
        assert con.sql("SELECT 42").fetchall() == [(42,)]
    except duckdb.Error as exc:
        pytest.fail(f"{after} left the connection's result unfinished: {exc}")


def _read_functions():
    """Every public function of tierdiag.diagnose.read.* whose parameters are (con, run_id) and
    then only ones with defaults."""
    import tierdiag.diagnose.read as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        module = importlib.import_module(f"{pkg.__name__}.{info.name}")
        for name, fn in vars(module).items():
            if name.startswith("_") or not inspect.isfunction(fn) or fn.__module__ != module.__name__:
                continue
            params = list(inspect.signature(fn).parameters.values())
            if (len(params) >= 2 and params[0].name in ("con", "cur") and params[1].name == "run_id"
                    and all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                            for p in params[2:])):
                yield f"{info.name}.{name}", fn


def test_every_read_path_on_one_connection_in_sequence(store):
    """One connection, every reader after the other (each `diagnose/read` function of (con,
    run_id), then summary, slow and explain of both runs, the comparison's counts), a relation
    asked after each: each left the connection free."""
    from tierdiag.diagnose.read.compare import RequestPairs
    from tierdiag.diagnose.views import explain, prepare, slow, summarize
    from tierdiag.store.reader import open_store, resolve_run

    con = open_store(store)
    try:
        runs = {name: resolve_run(con, name) for name in ("a", "b")}
        called = []
        for label, fn in _read_functions():
            for info in runs.values():
                try:
                    fn(con, info.run_id)
                except (TypeError, AttributeError, KeyError, ValueError):
                    continue  # wants more than a run id (an argument's type), not this test's question
                _free(con, label)
                called.append(label)
        assert len(set(called)) >= 30, sorted(set(called))  # the net is wide: most readers ran
        for command in ("summary", "explain"):
            prepare(command)
        for info in runs.values():
            summarize(con, info)
            _free(con, "summary")
            ranked = slow(con, info, top=5)
            _free(con, "slow")
            ids = [r[0] for r in con.execute("SELECT req_id FROM requests WHERE run_id = ? ORDER BY seq LIMIT 3",
                                              [info.run_id]).fetchall()]
            for req_id in ids:
                explain(con, info, req_id)
                _free(con, f"explain {req_id}")
            assert ranked is not None
        pairs = RequestPairs(con, runs["a"].run_id, runs["b"].run_id, ranks_a=True, ranks_b=True)
        assert pairs.counts().common > 0
        _free(con, "compare counts")
    finally:
        con.close()


def test_runs_delete_and_export_after_one_another(store, tmp_path):
    """The store's own readers that counted with fetchone (export's rows a table, delete's):
    through the CLI, one after the other on the same file."""
    import shutil

    db = tmp_path / "copy.duckdb"
    shutil.copy(store, db)
    r = tierdiag_in_process("export", tmp_path / "out", "--db", db, "--all")
    assert r.code == 0, r.err
    r = tierdiag_in_process("runs", "--db", db, "--delete", "b")
    assert r.code == 0, r.err
    with duckdb.connect(str(db), read_only=True) as con:
        assert [n for (n,) in con.execute("SELECT name FROM runs").fetchall()] == ["a"]
