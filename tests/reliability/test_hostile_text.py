"""Hostile text in the data: Rich markup and terminal escapes in run names, request ids, paths.

Data is never markup (a `[/]` in an id is just text) and never reaches the terminal raw: every
control character is shown escaped (`\\x1b`), in every view. A crafted database cannot make
`report` write outside `reports/`.
"""

from __future__ import annotations

import json

import duckdb
import pytest

from harness import SMALL, cli_env, line, tierdiag, write_trace

# Markup that crashed the views (MarkupError), clear-screen, an OSC window title, a bidi override.
HOSTILE_NAME = "[/bold]run\x1b[2J\x1b]0;pwned\x07[/]\u202e"
HOSTILE_IDS = ["[/]", "[/bold]x", "a\x1b[31mred", "t\x1b]0;title\x07", "[link=file:///etc/passwd]x[/link]"]


def assert_no_raw_controls(text: str) -> None:
    raw = [c for c in text if (ord(c) < 32 and c not in "\n") or 0x7F <= ord(c) < 0xA0 or c == "\u202e"]
    assert not raw, f"raw control characters reached the terminal: {raw!r}"


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    # All at once: they queue behind each other, so `slow` has them to show.
    lines = [line(0, 1800, [0, 1000 + i, 2000 + i, 3000 + i], id=rid) for i, rid in enumerate(HOSTILE_IDS)]
    trace = write_trace(root / "t.jsonl", lines)
    db = root / "h.duckdb"
    r = tierdiag("replay", trace, "--db", db, "--run-name", HOSTILE_NAME, *SMALL)
    return db, r


def test_replay_closing_table_shows_a_hostile_run_name_escaped(hostile):
    _, r = hostile
    assert r.code == 0, r.err
    assert_no_raw_controls(r.out)
    assert "\\x1b[2J" in r.out and "[/bold]run" in r.out


@pytest.mark.parametrize("args", [("runs",), ("slow",), ("summary",)] + [("explain", rid) for rid in HOSTILE_IDS[2:4]],
                         ids=["runs", "slow", "summary", "explain-ansi", "explain-osc"])
def test_every_view_renders_hostile_text_as_text(hostile, args):
    db, _ = hostile
    r = tierdiag(*args, "--db", db)
    assert r.code == 0, r.err
    assert_no_raw_controls(r.out)
    assert_no_raw_controls(r.err)
    if args[0] == "explain":
        shown = args[1].replace("\x1b", "\\x1b").replace("\x07", "\\x07")
        assert shown in r.out
    if args[0] == "runs":
        # (`runs` folds a name longer than its column: wide enough, it is on one line.)
        wide = tierdiag(*args, "--db", db, env={**cli_env(), "COLUMNS": "200"})
        assert_no_raw_controls(wide.out)
        assert "\\x1b[2J\\x1b]0;pwned\\x07[/]\\u202e" in wide.out
    if args[0] == "slow":
        assert "[/bold]x" in r.out and "a\\x1b[31mred" in r.out


def test_json_keeps_the_data_exact(hostile):
    db, _ = hostile
    r = tierdiag("slow", "--db", db, "--json")
    assert sorted(x["req_id"] for x in json.loads(r.out)["requests"]) <= sorted(HOSTILE_IDS)
    assert json.loads(tierdiag("runs", "--db", db, "--json").out)[0]["name"] == HOSTILE_NAME


def test_an_error_line_never_carries_raw_escapes(hostile):
    db, _ = hostile
    r = tierdiag("explain", "zz\x1b[2Jzz", "--db", db)
    r.fails(5, "no request")
    assert_no_raw_controls(r.err)


def test_report_default_path_stays_in_reports_whatever_the_database_says(hostile, tmp_path):
    db, _ = hostile
    crafted = tmp_path / "crafted.duckdb"
    crafted.write_bytes(db.read_bytes())
    with duckdb.connect(str(crafted)) as con:
        (rid,), = con.execute("SELECT run_id FROM runs").fetchall()
        for table in ("runs", "requests", "evictions", "request_evictions", "transfers", "batches", "pool_samples"):
            con.execute(f"UPDATE {table} SET run_id = '../../../escaped' WHERE run_id = ?", [rid])
        con.execute("UPDATE runs SET name = '../../up'")
    work = tmp_path / "work"
    work.mkdir()
    r = tierdiag("report", "--db", crafted, cwd=work)
    assert r.code == 0, r.err
    written = [p for p in tmp_path.rglob("*.html")]
    assert len(written) == 1 and written[0].parent == work / "reports", written
    assert ".." not in written[0].name and "/" not in written[0].name
