"""The read model holds the SQL (issue 38 step 3): every query diagnose, report, app and cli make
of a recorded run is a named function in tierdiag/diagnose/read/ (the store layer, tierdiag/store/,
keeps its own: it is the write side and the schema). This scans the readers for SQL text and for
calls that run SQL, and names each file:line it finds, so a query written at its caller again
fails here instead of spreading.

SQL text is a string literal (an f-string's literal parts included; docstrings left out) that
holds a statement's keywords: `SELECT <something>`, `INSERT INTO`, `UPDATE <table> SET`,
`DELETE FROM`, `CREATE TABLE|VIEW|INDEX|...`, upper case as the code writes them. A call that runs
SQL is `.execute(`, `.executemany(`, `.sql(`, or one of read/rows.py's `fetch_dicts`,
`fetch_one`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tierdiag"
SCANNED = ("diagnose", "report", "app", "cli")
READ_MODEL = PACKAGE / "diagnose" / "read"

# Files allowed to hold SQL outside the read model: none.
ALLOW: set[str] = set()

SQL_TEXT = re.compile(
    r"\bSELECT\s+\S"
    r"|\bINSERT\s+INTO\b"
    r"|\bUPDATE\s+\w+\s+SET\b"
    r"|\bDELETE\s+FROM\b"
    r"|\bCREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMP(?:ORARY)?\s+)?(?:TABLE|VIEW|INDEX|SEQUENCE|MACRO|SCHEMA)\b")
SQL_METHODS = {"execute", "executemany", "sql"}
SQL_HELPERS = {"fetch_dicts", "fetch_one"}


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring nodes of the module, its classes and functions."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                out.add(id(body[0].value))
    return out


def _literal_text(node: ast.AST) -> str | None:
    """A string literal's text; an f-string's literal parts with `{}` where a value goes."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "{}"
                       for v in node.values)
    return None


def _call_name(call: ast.Call) -> tuple[str, bool] | None:
    """(name, is a method) of what `call` calls."""
    if isinstance(call.func, ast.Attribute):
        return call.func.attr, True
    if isinstance(call.func, ast.Name):
        return call.func.id, False
    return None


def sql_sites(source: str) -> list[tuple[int, str]]:
    """(line, what) of every SQL text and SQL-running call in `source` (module doc)."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    inside_fstring = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    found = []
    for node in ast.walk(tree):
        if id(node) in docs or id(node) in inside_fstring:
            continue
        text = _literal_text(node)
        if text is not None:
            m = SQL_TEXT.search(text)
            if m:
                found.append((node.lineno, f"SQL text {m.group(0)!r}"))
        elif isinstance(node, ast.Call):
            name = _call_name(node)
            if name is not None and ((name[1] and name[0] in SQL_METHODS) or name[0] in SQL_HELPERS):
                found.append((node.lineno, f"runs SQL: {'.' if name[1] else ''}{name[0]}("))
    return sorted(found)


def _scanned_files() -> list[Path]:
    files = []
    for part in SCANNED:
        for path in sorted((PACKAGE / part).rglob("*.py")):
            if READ_MODEL not in path.parents:
                files.append(path)
    return files


def test_readers_hold_no_sql():
    offenders = []
    for path in _scanned_files():
        rel = path.relative_to(ROOT).as_posix()
        if rel in ALLOW:
            continue
        for line, what in sql_sites(path.read_text(encoding="utf-8")):
            offenders.append(f"{rel}:{line}: {what}")
    assert not offenders, ("SQL outside the read model (move it into a named query in "
                           "tierdiag/diagnose/read/):\n" + "\n".join(offenders))


def test_allow_list_is_not_stale():
    """Each allowed file exists and still holds SQL: one that no longer does leaves the list."""
    stale = [rel for rel in sorted(ALLOW)
             if not (ROOT / rel).is_file() or not sql_sites((ROOT / rel).read_text(encoding="utf-8"))]
    assert not stale, f"remove from ALLOW (no SQL left, or gone): {stale}"


def test_read_model_modules_stay_small():
    """The read model is split by question: no module of it over 500 lines."""
    long = [f"{p.relative_to(ROOT).as_posix()}: {n} lines" for p in sorted(READ_MODEL.glob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 500]
    assert not long, long


@pytest.mark.parametrize("source, line, what", [
    ('x = con.execute(q)\n', 1, "runs SQL: .execute("),
    ('q = "SELECT run_id FROM runs"\n', 1, "SQL text 'SELECT r'"),
    ('q = f"SELECT {cols} FROM requests WHERE run_id = ?"\n', 1, "SQL text 'SELECT {'"),
    ('q = ("DELETE "\n     "FROM runs")\n', 1, "SQL text 'DELETE FROM'"),
    ('q = "INSERT INTO runs VALUES (?)"\n', 1, "SQL text 'INSERT INTO'"),
    ('q = "UPDATE runs SET status = ?"\n', 1, "SQL text 'UPDATE runs SET'"),
    ('q = "CREATE OR REPLACE TEMP VIEW v AS x"\n', 1, "SQL text 'CREATE OR REPLACE TEMP VIEW'"),
    ('rows = fetch_dicts(con, q)\n', 1, "runs SQL: fetch_dicts("),
    ('rel = con.sql(q)\n', 1, "runs SQL: .sql("),
    ('\n\ny = [r for r in cur.executemany(q, rows)]\n', 3, "runs SQL: .executemany("),
])
def test_scanner_finds(source, line, what):
    assert sql_sites(source) == [(line, what)]


@pytest.mark.parametrize("source", [
    '"""Select the runs to compare: SELECT is what the read model does."""\n',  # a docstring
    'def f():\n    """SELECT * FROM requests, as the module doc says."""\n',
    'msg = "select a run with --run"\n',  # prose, lower case
    'msg = "the SELECT"\n',  # a keyword with nothing after it
    'x = "coalesce(status, \'finished\') = \'finished\'"\n',  # a fragment, no statement
    'pool.submit(job)\n',
    'help = "Create a table of runs"\n',
])
def test_scanner_leaves(source):
    assert sql_sites(source) == []
