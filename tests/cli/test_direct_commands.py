"""`summary` and `explain` in their plain forms run without Typer (cli/main.py `direct_arguments`:
its import was ~45 ms of a ~0.3 s command, issue 41). The direct path must call the command
exactly as Typer would, and hand everything else to Typer: the parse is held to Typer's own on
hostile command lines, and the outputs of the two paths to each other on a real run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.cli.cli_helpers import _env, cli
from tests.support.cli import ENTRY
from tierdiag.cli import main

# Tokens a command line is drawn from: the options and flags, values plain and hostile (empty,
# dashes, `=` forms, spaces, controls, non-UTF-8 bytes as the interpreter hands them over).
_TOKENS = st.sampled_from([
    "--db", "--run", "--json", "--no-json", "--help", "-h", "--", "--db=x.duckdb", "--debug", "--version",
    "x.duckdb", "a b.duckdb", "run-1", "late", "7", "-1", "-", "", " ", "\t", "r\x1b[31m", "caf\u00e9",
    "\udcff", "req\n2", "--run=late", "sub/dir/", "0.5", "--jso",
])


def _typer_params(name: str, argv: list[str]):
    """The parameters Typer parses `argv` into for command `name`, or None where it refuses it."""
    command = main._command(name)
    try:
        ctx = command.make_context("tierdiag", list(argv))
    except Exception:  # noqa: BLE001 - a usage error, --help's exit: Typer's to say, not the direct path's
        return None
    return dict(ctx.params)


@pytest.mark.parametrize("name", ["summary", "explain"])
@settings(max_examples=60, deadline=None)
@given(tokens=st.lists(_TOKENS, max_size=6))
def test_the_direct_parse_is_typers_or_declines(name, tokens):
    """Where the direct path takes a command line, Typer parses it into the same parameters;
    whatever Typer refuses (or answers with help) the direct path declines."""
    found = main.direct_arguments([name, *tokens], {})
    typer_params = _typer_params(name, tokens)
    if found is None:
        return
    assert found[0] == name
    assert typer_params is not None, f"the direct path took {tokens!r}, which Typer refuses"
    assert found[1] == typer_params
    assert list(found[1]) == [k for k in ("req_id", "db", "run", "json_") if k in typer_params]  # Typer's order


def test_what_the_direct_path_declines():
    for argv in (["summary", "--db=x"], ["summary", "--json", "--json"], ["summary", "--db", "-x"],
                 ["summary", "--db", ""], ["summary", "--db"], ["summary", "extra"], ["explain"],
                 ["explain", "1", "2"], ["explain", "-1"], ["summary", "--help"], ["summary", "--no-json"],
                 ["explain", "\udcff"], ["--debug", "summary"], ["slow"], []):
        assert main.direct_arguments(argv, {}) is None, argv
    assert main.direct_arguments(["summary"], {"_TIERDIAG_COMPLETE": "zsh_complete"}) is None  # completion
    assert main.direct_arguments(["explain", "7", "--json"], {}) == (
        "explain", {"req_id": "7", "db": main.direct_arguments(["summary"], {})[1]["db"], "run": None, "json_": True})


def test_a_store_there_but_not_readable_goes_to_typer(tmp_path):
    import os

    if os.geteuid() == 0:
        pytest.skip("root reads any file")
    db = tmp_path / "locked.duckdb"
    db.write_bytes(b"")
    db.chmod(0)
    assert main.direct_arguments(["summary", "--db", str(db)], {}) is None


def _loaded(*args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    code = (f"import sys\ntry:\n    {ENTRY}\nfinally:\n"
            "    print('MODULES ' + ' '.join(sorted(sys.modules)), file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=_env(), timeout=120)
    line = [x for x in r.stderr.splitlines() if x.startswith("MODULES ")][-1]
    return r, set(line.split()[1:])


def _slowest(db: Path) -> str:
    r = cli("slow", "--db", db, "--top", 1, "--ids")
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().splitlines()[0]


def test_the_plain_read_commands_import_no_typer_and_print_what_typer_s_path_prints(late_run):
    """Each command line by the direct path and the same by Typer's (`--db=PATH`, a form the
    direct path leaves to Typer): the same stdout, stderr and exit, errors included."""
    db = str(late_run)
    req = _slowest(late_run)
    for args in (["summary"], ["summary", "--json"], ["explain", req], ["explain", req, "--json"],
                 ["explain", "no-such-request"], ["summary", "--run", "no-such-run"],
                 ["explain", req, "--run", "late", "--json"]):
        direct = cli(*args[:1], "--db", db, *args[1:])
        typer = cli(*args[:1], f"--db={db}", *args[1:])
        assert (direct.returncode, direct.stdout, direct.stderr) == (typer.returncode, typer.stdout, typer.stderr), args
    missing = str(Path(db).with_name("missing.duckdb"))
    direct, typer = cli("summary", "--db", missing), cli("summary", f"--db={missing}")
    assert direct.returncode == typer.returncode != 0 and direct.stderr == typer.stderr
    for args in (["explain", req], ["summary"]):
        r, loaded = _loaded(*args, "--db", db)
        # nor msgspec: config/schema.py makes its Structs when a value is first checked
        assert r.returncode == 0 and not {m for m in loaded if m.split(".")[0] in ("typer", "msgspec")}, r.stderr
        # DuckDB's C extension alone, not its Python package (store/duckdb_core.py: ~90 ms of CPU)
        assert "_duckdb" in loaded and not {m for m in loaded if m.startswith("duckdb.")}, sorted(loaded)
    r, loaded = _loaded("explain", req, f"--db={db}")  # a form left to Typer: Typer parses it
    assert r.returncode == 0 and "typer" in loaded and "duckdb._relation" in loaded, r.stderr


def test_the_read_commands_leave_without_teardown_their_output_written_and_atexit_run(late_run):
    """summary and explain end the console script's process without the interpreter's teardown
    (cli/exits.py `_leave`; ~40 ms of CPU after the last line): everything printed reaches the
    pipe, a library's atexit function still runs, and an error keeps its line and exit code."""
    entry = ("import atexit, sys\n"
             "atexit.register(lambda: sys.stderr.write('atexit ran\\n'))\n"
             "from tierdiag.cli.main import entry\n"
             "entry()\n")
    db = str(late_run)
    req = _slowest(late_run)
    for args, code in ((["summary", "--db", db], 0), (["explain", req, "--db", db, "--json"], 0),
                       (["explain", "no-such-request", "--db", db], None)):
        left = subprocess.run([sys.executable, "-c", entry, *args], capture_output=True, text=True, env=_env(COLUMNS="80"),
                              timeout=120)
        plain = cli(*args)
        assert left.stdout == plain.stdout and left.returncode == plain.returncode, args
        assert left.stderr == plain.stderr + "atexit ran\n", left.stderr
        assert code is None or left.returncode == code
        assert code == 0 or left.returncode != 0


def test_python_dash_m_tierdiag_is_the_console_script(tmp_path):
    """`python -m tierdiag ...` runs the same command as `tierdiag ...` (tierdiag/__main__.py calls
    cli/main.py's `entry`): its version, and a bad store's one line and documented exit code."""
    env = _env()
    ver = subprocess.run([sys.executable, "-m", "tierdiag", "--version"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert ver.returncode == 0 and ver.stdout.startswith("tierdiag "), ver.stdout + ver.stderr
    missing = tmp_path / "none.duckdb"
    bad = subprocess.run([sys.executable, "-m", "tierdiag", "summary", "--db", str(missing)], capture_output=True,
                         text=True, env=env, timeout=120)
    assert bad.returncode == 4 and bad.stderr.count("\n") == 1 and "no database at" in bad.stderr
    assert not missing.exists()
