"""Hostile text in the data: Rich markup and terminal escapes in run names, request ids, paths.

Data is never markup (a `[/]` in an id is just text) and never reaches the terminal raw: every
control character is shown escaped (`\\x1b`), in every view. A crafted database cannot make
`report` write outside `reports/`.
"""

from __future__ import annotations

import json
import os
import subprocess

import duckdb
import pytest

from harness import SMALL, cli_argv, cli_env, line, runs, tierdiag, write_trace

from tests.support.cli import tierdiag_in_process

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
    r = tierdiag_in_process("replay", trace, "--db", db, "--run-name", HOSTILE_NAME, *SMALL)
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
    r = tierdiag_in_process(*args, "--db", db)
    assert r.code == 0, r.err
    assert_no_raw_controls(r.out)
    assert_no_raw_controls(r.err)
    if args[0] == "explain":
        shown = args[1].replace("\x1b", "\\x1b").replace("\x07", "\\x07")
        assert shown in r.out
    if args[0] == "runs":
        # (`runs` folds a name longer than its column: wide enough, it is on one line.)
        wide = tierdiag_in_process(*args, "--db", db, env={**cli_env(), "COLUMNS": "200"})
        assert_no_raw_controls(wide.out)
        assert "\\x1b[2J\\x1b]0;pwned\\x07[/]\\u202e" in wide.out
    if args[0] == "slow":
        assert "[/bold]x" in r.out and "a\\x1b[31mred" in r.out


def test_json_keeps_the_data_exact(hostile):
    db, _ = hostile
    r = tierdiag_in_process("slow", "--db", db, "--json")
    assert sorted(x["req_id"] for x in json.loads(r.out)["requests"]) <= sorted(HOSTILE_IDS)
    assert json.loads(tierdiag_in_process("runs", "--db", db, "--json").out)[0]["name"] == HOSTILE_NAME


def test_an_error_line_never_carries_raw_escapes(hostile):
    db, _ = hostile
    r = tierdiag_in_process("explain", "zz\x1b[2Jzz", "--db", db)
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
    r = tierdiag_in_process("report", "--db", crafted, cwd=work)
    assert r.code == 0, r.err
    written = [p for p in tmp_path.rglob("*.html")]
    assert len(written) == 1 and written[0].parent == work / "reports", written
    assert ".." not in written[0].name and "/" not in written[0].name


# --- markup and escapes in every field of every command (issue 32, item 8) -----------------------
# A folder may not hold "/": split across two folders, the path reads "...d[bold]x[/]y\x1b[2J".
# `[bold]` would be eaten as a tag, `[/]` with nothing open raises MarkupError, ESC clears the screen.
TAGS = "[bold]x[/]y"
MARKUP_RUN = "[/]run[bold]b[/bold]\x1b[2J"


def markup_dir(root):
    d = root / "d[bold]x[" / "]y\x1b[2Jz"
    d.mkdir(parents=True)
    return d


def shows(text: str, *pieces: str) -> None:
    assert_no_raw_controls(text)
    flat = "".join(text.split())  # a long path may wrap inside a table cell
    for piece in pieces:
        assert "".join(piece.split()) in flat, f"{piece!r} not shown as text in:\n{text}"


@pytest.fixture(scope="module")
def marked(tmp_path_factory):
    d = markup_dir(tmp_path_factory.mktemp("markup"))
    lines = [line(0, 1500, [0, 1000 + i, 2000 + i], id=rid)
             for i, rid in enumerate(["[/]", "[bold]q[/bold]", "p\x1b[31m"])]
    trace = write_trace(d / "t[red]n[u].jsonl", lines)
    db = d / "s[bold].duckdb"
    named = tierdiag_in_process("replay", trace, "--db", db, "--run-name", MARKUP_RUN, *SMALL)
    stem = tierdiag_in_process("replay", trace, "--db", db, *SMALL)
    return d, trace, db, named, stem


def test_replay_shows_markup_in_the_run_name_the_trace_name_and_the_folder(marked):
    d, _, db, named, stem = marked
    assert named.code == 0, named.err
    shows(named.out, "[/]run[bold]b[/bold]\\x1b[2J", TAGS)
    assert stem.code == 0, stem.err
    shows(stem.out, "t[red]n[u]", TAGS)


@pytest.mark.parametrize("args", [("runs",), ("summary",), ("slow",), ("explain", "[bold]q[/bold]"),
                                  ("explain", "[/]"), ("compare", "PREV", "LAST")],
                         ids=["runs", "summary", "slow", "explain-tags", "explain-close", "compare"])
def test_read_views_show_markup_from_the_store_and_the_path_as_text(marked, args):
    d, _, db, _, _ = marked
    ids = [r["run_id"] for r in runs(db, process=False)]
    args = tuple({"PREV": ids[0], "LAST": ids[-1]}.get(a, a) for a in args)
    r = tierdiag_in_process(*args, "--db", db, env=cli_env(COLUMNS="400"))
    assert r.code == 0, r.err
    assert_no_raw_controls(r.err)
    expected = {"runs": ["[/]run[bold]b[/bold]\\x1b[2J", TAGS], "slow": ["[bold]q[/bold]"],
                "explain": [args[-1]], "compare": ["[/]run[bold]b[/bold]"]}.get(args[0], [])
    shows(r.out, *expected)


def test_files_written_under_markup_paths_are_named_as_they_are(marked, tmp_path):
    d, trace, db, _, _ = marked
    out = markup_dir(tmp_path)
    report = tierdiag_in_process("report", "--db", db, "-o", out / "r[bold].html")
    assert report.code == 0, report.err
    shows(report.out, TAGS, "r[bold].html")
    export = tierdiag_in_process("export", out / "e[bold]", "--db", db)
    assert export.code == 0, export.err
    shows(export.out, TAGS, "e[bold]")
    synth = tierdiag_in_process("synth", out / "s[/].jsonl", "--requests", "5")
    assert synth.code == 0, synth.err
    shows(synth.out, TAGS, "s[/].jsonl")


def test_sweep_shows_a_markup_folder(marked, tmp_path):
    _, trace, _, _, _ = marked
    db = markup_dir(tmp_path) / "w[bold].duckdb"
    r = tierdiag_in_process("sweep", trace, "--set", "host_tokens=4096,8192", "--set", "model=tiny", "--set", "gpu=cpu",
                            "--set", "device_tokens=4096", "--db", db, "--jobs", "1")
    assert r.code == 0, r.err
    shows(r.out, TAGS)


def test_calibrate_names_a_markup_output_path(tmp_path):
    out = markup_dir(tmp_path) / "p[bold].json"
    # In this process (its output, not its start): a child imported torch again (~2.5 s of CPU).
    r = tierdiag_in_process("calibrate", "--quick", "-o", out)
    assert r.code == 0, r.err
    shows(r.out, TAGS, "p[bold].json")


def test_import_shows_markup_in_the_backend_the_folder_and_the_trace_path(tmp_path):
    from tests.importers.sglang_export import record, write_export

    folder = markup_dir(tmp_path) / "e[bold]x"
    write_export(folder, "20251201_09", [
        record("[/]a", prompt=80, tokens=list(range(80)), arrival_s=1.0),
        record("[bold]b", prompt=96, device=0, host=0, storage=64, backend="[/]Hi[bold]File",
               tokens=list(range(96)), arrival_s=2.0, prefetch_wait_s=0.01),
    ])
    db = tmp_path / "i.duckdb"
    r = tierdiag_in_process("import", "sglang", folder, "--db", db, "--trace-out", folder / "t[bold].jsonl")
    assert r.code == 0, r.err
    shows(r.out, "[/]Hi[bold]File", "sglang-e[bold]x", TAGS, "t[bold].jsonl")
    assert len(runs(db, process=False)) == 1
    for view in (("summary",), ("slow",), ("explain", "[/]a")):
        v = tierdiag_in_process(*view, "--db", db)
        assert v.code == 0, v.err
        assert_no_raw_controls(v.out)


# --- bytes that are not UTF-8, and a terminal that takes only ASCII (issue 32, item 9) -----------
# Python hands an argument's undecodable bytes over as lone surrogates (os.fsdecode); the child
# gets the same bytes back (subprocess encodes with surrogateescape).
NOT_UTF8 = os.fsdecode(b"n\xfe\xff")


def test_a_run_name_that_is_not_utf8_is_recorded_with_its_bytes_escaped(tmp_path):
    trace = write_trace(tmp_path / "t.jsonl", [line(0, 1000, [0, 1])])
    db = tmp_path / "s.duckdb"
    r = tierdiag("replay", trace, "--db", db, "--run-name", NOT_UTF8, *SMALL)
    assert r.code == 0, r.err
    assert runs(db, process=False)[0]["name"] == "n\\xfe\\xff"
    assert "n\\xfe\\xff" in r.out


@pytest.mark.parametrize("where", ["trace", "db", "import-folder", "trace-out"])
def test_a_file_name_that_is_not_utf8_is_refused_before_any_file_is_made(tmp_path, where):
    from tests.importers.sglang_export import record, write_export

    odd = tmp_path / os.fsdecode(b"x\xff")
    if where in ("trace", "db"):
        trace = write_trace(odd if where == "trace" else tmp_path / "t.jsonl", [line(0, 1000, [0, 1])])
        db = odd if where == "db" else tmp_path / "s.duckdb"
        r = tierdiag("replay", trace, "--db", db, "--run-name", "n", *SMALL)
    else:
        folder = odd if where == "import-folder" else tmp_path / "export"
        write_export(folder, "20251201_09", [record("a", prompt=80, tokens=list(range(80)))])
        db = tmp_path / "s.duckdb"
        out = odd if where == "trace-out" else tmp_path / "t.jsonl"
        r = tierdiag("import", "sglang", folder, "--db", db, "--trace-out", out)
    r.fails(2, "x\\xff", "not a UTF-8 file name")
    assert not db.exists()
    if where.startswith("import"):
        assert not (tmp_path / "t.jsonl").exists()


@pytest.fixture(scope="module")
def ascii_only():
    env = {k: v for k, v in cli_env().items() if k not in ("LANG", "LC_CTYPE", "PYTHONIOENCODING")}
    return {**env, "LC_ALL": "C", "PYTHONUTF8": "0"}


@pytest.mark.parametrize("args", [("runs",), ("summary",), ("slow",), ("explain", "[/]"), ("runs", "--json")],
                         ids=["runs", "summary", "slow", "explain", "runs-json"])
def test_a_stdout_that_takes_only_ascii_gets_the_rest_escaped(hostile, ascii_only, args):
    db, _ = hostile
    proc = subprocess.run(cli_argv(*args, "--db", db), capture_output=True, env=ascii_only, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode("ascii", "replace")
    proc.stdout.decode("ascii")  # every byte ASCII: what could not be written is escaped
    assert b"Traceback" not in proc.stderr


def test_replay_to_an_ascii_only_stdout_with_a_name_that_is_not_ascii(tmp_path, ascii_only):
    trace = write_trace(tmp_path / "t.jsonl", [line(0, 1000, [0, 1])])
    proc = subprocess.run(cli_argv("replay", trace, "--db", tmp_path / "s.duckdb", "--run-name", "r\u00e9·",
                                   *SMALL), capture_output=True, env=ascii_only, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode("ascii", "replace")
    assert b"r\\xe9\\xb7" in proc.stdout


def test_advise_and_delete_show_markup_in_the_run_name_and_the_folder(marked, tmp_path):
    _, trace, db, _, _ = marked
    copy = markup_dir(tmp_path) / "c[bold].duckdb"
    copy.write_bytes(db.read_bytes())
    named = next(r for r in runs(copy, process=False) if r["name"] == MARKUP_RUN)
    advise = tierdiag_in_process("advise", "--run", named["run_id"], "--db", copy, "--budget", "1", "--jobs", "1")
    assert advise.code == 0, advise.err  # (nothing to change here: it names no run, but must not crash)
    assert_no_raw_controls(advise.out)
    assert_no_raw_controls(advise.err)
    deleted = tierdiag_in_process("runs", "--delete", named["run_id"], "--db", copy)
    assert deleted.code == 0, deleted.err
    shows(deleted.out, "[/]run[bold]b[/bold]\\x1b[2J", TAGS, "c[bold].duckdb")
