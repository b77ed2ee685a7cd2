"""`summary` and `explain` in their plain forms run without Typer (cli/main.py `direct_arguments`:
its import was ~45 ms of a ~0.3 s command, issue 41). The direct path must call the command
exactly as Typer would, and hand everything else to Typer: the parse is held to Typer's own on
hostile command lines, and the outputs of the two paths to each other on a real run."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.cli.cli_helpers import _env, cli, cli_here
from tests.support.cli import ENTRY
from tests.support.unreadable import as_a_reader, unreadable
from tierdiag.cli import main

# Tokens a command line is drawn from: the options and flags, values plain and hostile (empty,
# dashes, `=` forms, spaces, controls, non-UTF-8 bytes as the interpreter hands them over).
_TOKENS = st.sampled_from([
    "--db", "--run", "--json", "--no-json", "--help", "-h", "--", "--db=x.duckdb", "--debug", "--version",
    "x.duckdb", "a b.duckdb", "run-1", "late", "7", "-1", "-", "", " ", "\t", "r\x1b[31m", "caf\u00e9",
    "\udcff", "req\n2", "--run=late", "sub/dir/", "0.5", "--jso",
])


@functools.cache
def _click_command(name: str):
    """`main._command(name)` built once (~22 ms a build, ~400 examples here): click parses each
    command line in a context of its own, as Typer's app does for every call of a session."""
    return main._command(name)


def _typer_params(name: str, argv: list[str]):
    """The parameters Typer parses `argv` into for command `name`, or None where it refuses it."""
    command = _click_command(name)
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
    db = tmp_path / "locked.duckdb"
    db.write_bytes(b"")
    unreadable(db)  # (as root too: the check runs where mode bits hold)
    assert as_a_reader("import sys; from tierdiag.cli import main\n"
                       "print(main.direct_arguments(['summary', '--db', sys.argv[1]], {}))", str(db)) == "None"


def _loaded(*args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    code = (f"import sys\ntry:\n    {ENTRY}\nfinally:\n"
            "    print('MODULES ' + ' '.join(sorted(sys.modules)), file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=_env(), timeout=120)
    line = [x for x in r.stderr.splitlines() if x.startswith("MODULES ")][-1]
    return r, set(line.split()[1:])


def _slowest(db: Path) -> str:
    r = cli_here("slow", "--db", db, "--top", 1, "--ids")  # an input: in this process
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().splitlines()[0]


def test_the_plain_read_commands_import_no_typer_and_print_what_typer_s_path_prints(late_run):
    """Each command line by the direct path (the console script's process) and the same by
    Typer's (`--db=PATH`, a form the direct path leaves to Typer; in this process, `cli_here`:
    Typer's path is not what is tested): the same stdout, stderr and exit, errors included."""
    db = str(late_run)
    req = _slowest(late_run)
    for args in (["summary"], ["summary", "--json"], ["explain", req], ["explain", req, "--json"],
                 ["explain", "no-such-request"], ["summary", "--run", "no-such-run"],
                 ["explain", req, "--run", "late", "--json"]):
        direct = cli(*args[:1], "--db", db, *args[1:])
        typer = cli_here(*args[:1], f"--db={db}", *args[1:])
        assert (direct.returncode, direct.stdout, direct.stderr) == (typer.returncode, typer.stdout, typer.stderr), args
    missing = str(Path(db).with_name("missing.duckdb"))
    direct, typer = cli("summary", "--db", missing), cli_here("summary", f"--db={missing}")
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
        plain = cli_here(*args, direct=True)  # the same command's output, in this process
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


# --- replay ------------------------------------------------------------------------------------
# `replay`'s plain forms run without Typer too (its import and the building of its 39-parameter
# command were ~25 ms of the ~0.25 s before the engine runs, issue 41).

_KINDS = {Path: "path", str: "str", int: "int", float: "float"}


def test_the_replay_table_is_typers_command():
    """cli/main.py's table of replay's options is the command Typer builds from cli/replay.py:
    every option and flag (and `--no-overlap`), the same parameter, the same kind; the
    positional TRACE a path; nothing more, nothing less."""
    positional, options, flags = main._DIRECT["replay"]
    command = main._command("replay")
    want_options, want_flags, want_positional = {}, {}, []
    for param in command.params:
        annotation = param.type_descriptor.annotation
        if param.param_type_name == "argument":
            want_positional.append((param.name, _KINDS[annotation]))
        elif annotation is bool:
            want_flags.update({opt: (param.name, True) for opt in param.opts})
            want_flags.update({opt: (param.name, False) for opt in param.secondary_opts})
        else:
            want_options.update({opt: (param.name, _KINDS[annotation]) for opt in param.opts})
    assert (list(positional), options, flags) == (want_positional, want_options, want_flags)
    assert list(main._defaults("replay")) == [p.name for p in command.params]  # every parameter, in order


def test_an_error_names_the_same_option_without_typer():
    """params.checked names an option by Typer's context when there is one, else by its
    parameter's name (the direct path): the same flag either way, for every replay option."""
    from tierdiag.cli.params import _flag

    for param in main._command("replay").params:
        if param.param_type_name == "option":
            assert _flag(param.name) == param.opts[0], param.name


def _same(a, b) -> bool:
    """Equal, NaN equal to NaN (`--time-scale nan` parses to NaN on both paths)."""
    import math

    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def _check_replay_parse(tokens: list[str], *, must_take: bool) -> None:
    found = main.direct_arguments(["replay", *tokens], {})
    typer_params = _typer_params("replay", tokens)
    if found is None:
        assert not must_take, f"the direct path declined the plain form {tokens!r}"
        return
    assert found[0] == "replay"
    assert typer_params is not None, f"the direct path took {tokens!r}, which Typer refuses"
    assert set(found[1]) == set(typer_params), tokens  # every parameter (passed by keyword)
    for name, value in found[1].items():
        assert _same(value, typer_params[name]), (tokens, name, value, typer_params[name])


_REPLAY_TOKENS = st.sampled_from([
    "--db", "--json", "--no-probes", "--skip-bad", "--overlap", "--no-overlap", "--enable-mixed-chunk",
    "--no-enable-mixed-chunk", "--dp", "--router", "--storage-tokens", "--time-scale", "--seed", "--model",
    "--config", "--profile", "--storage-dir", "--run-name", "--sglang", "--jobs", "--help", "--", "--db=x.duckdb",
    "--dp=2", "--debug", "--no-json", "--jso", "-h", "t.jsonl", "x.duckdb", "4", "0", "-1", "1_000", " 12 ",
    "12.0", "1e3", "0x10", "nan", "inf", "-inf", "0.5", "", " ", "cache_aware", "lru", "caf\u00e9", "\udcff",
    "\u0663", "99999999999999999999", "r\x1b[31m", "a b.jsonl", "sub/dir/",
])


@settings(max_examples=150, deadline=None)
@given(tokens=st.lists(_REPLAY_TOKENS, max_size=8))
def test_the_direct_replay_parse_is_typers_or_declines(tokens):
    """Hostile command lines (options twice, `=` forms, values that are options, empty, spaces,
    controls, non-UTF-8, numbers int()/float() read or do not, NaN, 2^66): where the direct path
    takes one, Typer parses it into the same parameters; whatever Typer refuses it declines."""
    _check_replay_parse(tokens, must_take=False)


_VALUES = {"int": st.one_of(st.integers(0, 2**70).map(str), st.sampled_from(["1_000", "007", "\u0663"])),
           "float": st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr).filter(lambda t: not t.startswith("-")),
                              st.sampled_from(["0.5", "1e-3", "2", "nan", "inf"])),
           "str": st.sampled_from(["cache_aware", "lru", "tiny", "0.5.9,0.5.23", "caf\u00e9", "a b", "r\x1b[31m"]),
           "path": st.sampled_from(["x.duckdb", "sub/dir/", "a b.toml", "caf\u00e9.json", "."])}


@st.composite
def _plain_replay_forms(draw):
    _, options, flags = main._DIRECT["replay"]
    chosen = draw(st.lists(st.sampled_from(sorted(options)), unique=True, max_size=8))
    by_param = {}
    for flag in draw(st.lists(st.sampled_from(sorted(flags)), max_size=4)):
        by_param.setdefault(flags[flag][0], flag)  # one flag a parameter (--overlap or --no-overlap)
    parts = [[opt, draw(_VALUES[options[opt][1]])] for opt in chosen] + [[flag] for flag in by_param.values()]
    order = draw(st.permutations(range(len(parts) + 1)))
    pieces = parts + [[draw(st.sampled_from(["t.jsonl", "traces/a b.jsonl", "caf\u00e9.jsonl"]))]]
    return [token for i in order for token in pieces[i]]


@settings(max_examples=150, deadline=None)
@given(tokens=_plain_replay_forms())
def test_every_plain_replay_form_goes_direct_as_typer_parses_it(tokens):
    """The trace and any options in any order, each once, with plain values (digits up to 2^70,
    floats incl. NaN and inf, text with spaces, unicode and escapes, paths): the direct path takes
    them all, with Typer's parameters."""
    _check_replay_parse(tokens, must_take=True)


def test_what_the_direct_replay_path_declines(tmp_path):
    for argv in (["replay"], ["replay", "a", "b"], ["replay", "t", "--dp", "-1"], ["replay", "t", "--dp=2"],
                 ["replay", "t", "--dp", "2", "--dp", "3"], ["replay", "t", "--json", "--json"],
                 ["replay", "t", "--overlap", "--no-overlap"], ["replay", "t", "--dp", "1e3"],
                 ["replay", "t", "--dp", "12.0"], ["replay", "t", "--time-scale", "x"], ["replay", "t", "--help"],
                 ["replay", "t", "--no-enable-mixed-chunk"], ["replay", "\udcff"], ["replay", "t", "--"],
                 ["replay", "t", "--db"], ["--debug", "replay", "t"], ["replay", "t", "--debug"]):
        assert main.direct_arguments(argv, {}) is None, argv
    assert main.direct_arguments(["replay", "t"], {"_TIERDIAG_COMPLETE": "bash_complete"}) is None
    found = main.direct_arguments(["replay", "t.jsonl", "--dp", "4", "--no-probes", "--time-scale", "0.5"], {})
    assert found is not None and found[1]["dp"] == 4 and found[1]["no_probes"] is True
    assert found[1]["trace"] == Path("t.jsonl") and found[1]["time_scale"] == 0.5 and found[1]["router"] is None


def test_a_replay_path_there_but_not_readable_goes_to_typer(tmp_path):
    locked = tmp_path / "locked.jsonl"
    locked.write_text("")
    unreadable(locked)  # (as root too: the check runs where mode bits hold)
    assert as_a_reader("import sys; from tierdiag.cli import main\n"
                       "print(main.direct_arguments(['replay', sys.argv[1]], {}),"
                       " main.direct_arguments(['replay', 't', '--config', sys.argv[1]], {}))", str(locked)) == "None None"


def test_replay_by_either_path_prints_the_same(tmp_path):
    """A replay's plain form (direct, the console script's process) and the same with
    `--db=PATH` (Typer's, in this process: `cli_here`): the same result (but its walls) and, for
    bad values, the same error line and exit code."""
    import json

    from tests.cli.cli_helpers import REPLAY_ARGS, write_late_trace

    trace = str(write_late_trace(tmp_path / "t.jsonl", num_requests=40))
    db = str(tmp_path / "r.duckdb")
    args = [*map(str, REPLAY_ARGS)]
    direct = cli("replay", trace, "--no-probes", "--json", *args, "--db", db)
    typer = cli_here("replay", trace, "--no-probes", "--json", *args, f"--db={db}")
    assert direct.returncode == typer.returncode == 0, direct.stderr + typer.stderr
    mine, theirs = json.loads(direct.stdout), json.loads(typer.stdout)
    for out in (mine, theirs):
        out.pop("wall_s"), out.pop("wall_phases")
    assert mine == theirs and direct.stderr == typer.stderr
    for bad in (["--dp", "0"], ["--storage-tokens", "99999999999999999999"], ["--router", "nope"],
                ["--time-scale", "nan"], ["--model", "caf\u00e9"], ["--config", str(tmp_path / "none.toml")]):
        direct = cli("replay", trace, "--no-probes", *args, *bad, "--db", db)
        typer = cli_here("replay", trace, "--no-probes", *args, *bad, f"--db={db}")
        assert direct.returncode == typer.returncode != 0 and direct.stderr == typer.stderr, (bad, direct.stderr)
        assert direct.stderr.count("\n") == 1 and direct.stdout == typer.stdout == "", bad
    missing = cli("replay", str(tmp_path / "none.jsonl"), "--no-probes", "--db", db)
    typer = cli_here("replay", str(tmp_path / "none.jsonl"), "--no-probes", f"--db={db}")
    assert missing.returncode == typer.returncode == 3 and missing.stderr == typer.stderr
