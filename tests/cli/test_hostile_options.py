"""A Hypothesis sweep over every command's options with hostile values (h41safe item 4).

Each command runs through the real entry point in this process (`tierdiag_in_process`: the error
mapping of cli/exits.py, stdout and stderr captured) with one option set to a drawn value: negative, zero,
past int64, NaN, inf, empty, blank, Rich markup, terminal escapes and a bidi override, a newline,
a lone surrogate (a byte that was not UTF-8), a 3,000-character name, a folder, the store or the
trace itself, /dev/full, or any short text with control characters. Whatever it is, the command
takes it or refuses it: exit 0, or the documented code (docs/contract.md section 7: 2 to 6) with
one `tierdiag: ` line on stderr and no traceback; never exit 1 (a bug); nothing raw of a control
character on stdout or stderr; and the store's run recorded before is still there, whole.

What it found (input, before, after):

| input | before | after |
|---|---|---|
| `runs --delete ""` (an unset shell variable), `--run ""` on any command | the store's only run deleted (the empty string is a prefix of every run id); the only run picked | exit 4, "an empty run names no run" (store/reader.py `resolve_run`) |
| a path option (`--db`, `-o`, `--config`, `--profile`, `--storage-dir`, `export DIR` ...) naming a file or folder longer than the file system takes (a 3,000-byte name, or a 4,096-byte path) | exit 1, "internal error" (`OSError: [Errno 36] File name too long` from `Path.exists()` in the store's open and elsewhere) | exit 2, one line naming the option: "is too long a file name" (cli/params.py) |

The trace's fields, the converter's records, config and profile keys, `--set` values and the
numeric options have property tests of their own (tests/trace/test_trace_line_bounds.py,
tests/trace/test_convert_hostile.py, tests/reliability/test_config_boundary_props.py,
tests/reliability/test_hostile_text.py); this sweep covers every option of every command.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reliability"))
from harness import SMALL, good_lines, tierdiag_in_process, write_trace  # noqa: E402

DOCUMENTED = {0, 2, 3, 4, 5, 6}
LINE_BOUND = 660  # "tierdiag: " + an abbreviated line (400 + "...[N characters]..." + 160)
RAW = {chr(c) for c in range(32) if chr(c) not in "\n"} | {chr(c) for c in range(0x7F, 0xA0)} | {"\u202e"}


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    """A folder with a 6-request trace, a store holding one complete run `base`, and a folder."""
    tmp = tmp_path_factory.mktemp("hostile")
    trace = write_trace(tmp / "t.jsonl", good_lines(6))
    db = tmp / "s.duckdb"
    code, _, err = tierdiag_in_process("replay", trace, "--db", db, *SMALL, "--run-name", "base")
    assert code == 0, err
    (tmp / "adir").mkdir()
    return tmp, trace, db


def fixed_values(tmp: Path, trace: Path, db: Path) -> list[str]:
    return ["-1", "0", "-0", "9223372036854775808", "-9223372036854775809", "1e309", "nan", "inf", "-inf", "",
            " ", "[/bold]x[/]", ":smile:", "\x1b[2Jz\x1b]0;title\x07", "\u202eevil", "a\nb", "\udcff", "x" * 3000,
            "y/" * 2100, "1_000", "0x10", "5e-324", str(tmp / "adir"), str(db), str(trace), "/dev/full",
            str(tmp / "adir" / "deeper" / "new.out"), str(trace / "under")]


def values(tmp: Path, trace: Path, db: Path):
    controls = st.characters(min_codepoint=0, max_codepoint=0x7F) | st.sampled_from("\u202e\x9b\xa0é漢")
    return (st.sampled_from(fixed_values(tmp, trace, db))
            | st.text(controls, max_size=12).filter(lambda s: "\x00" not in s)
            | st.integers(-2**64, 2**64).map(str)
            | st.floats(allow_nan=True, allow_infinity=True).map(repr))


# Each command: the arguments it runs with, then the options (and positional places) the sweep
# sets. A value is put in place of the option's own where the base arguments have it. The
# commands that replay many times (sweep, advise) or measure (calibrate, doctor) are driven by
# the options that are refused before any of that, with cheap base arguments.
def commands(tmp: Path, trace: Path, db: Path) -> dict[str, tuple[list[str], list[str]]]:
    out = str(tmp / "out")
    return {
        "replay": ([str(trace), "--db", str(tmp / "r.duckdb"), *SMALL],
                   ["--db", "--run-name", "--config", "--model", "--gpu", "--device-tokens", "--host-tokens",
                    "--storage-tokens", "--storage-dir", "--page-size", "--block-size", "--write-policy",
                    "--eviction-policy", "--tlru-threshold", "--tlru-next-prompt-estimate", "--load-back-threshold",
                    "--prefetch-policy", "--schedule-policy", "--prefetch-threshold", "--max-prefill-tokens", "--timing",
                    "--profile", "--time-scale", "--arrivals", "--max-context", "--max-running-requests", "--seed",
                    "--verify", "--data-plane-mib", "--dp", "--router", "--sglang", "--jobs", "@0"]),
        "runs": (["--db", str(db)], ["--db", "--delete"]),
        "summary": (["--db", str(db)], ["--db", "--run"]),
        "slow": (["--db", str(db)], ["--top", "--class", "--cause", "--db", "--run", "--by"]),
        "explain": (["1", "--db", str(db)], ["@0", "--db", "--run"]),
        "compare": (["--db", str(db), "base", "base"], ["--sweep", "--by", "--top", "--db", "@2"]),
        "report": (["--db", str(db), "-o", f"{out}.html"], ["--db", "--run", "-o", "--compare", "--sweep"]),
        "export": ([out, "--db", str(db)], ["@0", "--db", "--run"]),
        "synth": ([f"{out}.jsonl", "--requests", "5"], ["@0", "--kind", "--requests", "--seed", "--rate",
                                                         "--block-size"]),
        "convert": (["kv-cache-tester", str(trace), "-o", f"{out}.jsonl"], ["@0", "@1", "-o", "--block-size",
                                                                             "--start-spread", "--seed"]),
        "sweep": ([str(trace), "--db", str(tmp / "sw.duckdb"), "--set", "device_tokens=0"],
                  ["@0", "--set", "--config", "--jobs", "--by", "--db", "--resume"]),
        "advise": (["--db", str(db), "--budget", "0"], ["--db", "--run", "--budget", "--host-memory"]),
        "calibrate": (["--from", "nosuchrun", "--db", str(db), "-o", f"{out}.toml"],
                      ["-o", "--from", "--db", "--model", "--gpu", "--config"]),
    }


def argv(base: list[str], option: str, value: str) -> list[str]:
    args = list(base)
    if option.startswith("@"):  # a positional place
        args[int(option[1:])] = value
    elif option in args:
        args[args.index(option) + 1] = value
    else:
        args += [option, value]
    return args


def check(command: str, args: list[str], code: int, out: str, err: str) -> None:
    shown = f"tierdiag {command} {' '.join(map(repr, args))}"
    assert code in DOCUMENTED, f"{shown}: exit {code}\n{err[-2000:]}"
    assert "Traceback" not in err, f"{shown}\n{err[-2000:]}"
    if code:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("tierdiag: "), f"{shown}: exit {code}\n{err[-2000:]}"
        # a 3,000-character value is quoted by its ends, not in full (report/text.py `abbreviated`)
        assert len(lines[0]) <= LINE_BOUND, f"{shown}: a {len(lines[0]):,}-character error line"
    raw = sorted({c for c in out + err if c in RAW})
    assert not raw, f"{shown}: raw {raw!r} in its output\n{err[-500:]}"


def base_run_kept(db: Path) -> None:
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT r.status, count(q.req_id) FROM runs r LEFT JOIN requests q USING (run_id) "
                           "WHERE r.name = 'base' GROUP BY r.status").fetchall()
    assert rows == [("complete", 6)], rows


SWEEP = settings(max_examples=int(os.environ.get("TIERDIAG_HOSTILE_EXAMPLES", "12")), deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
NAMES = ["replay", "runs", "summary", "slow", "explain", "compare", "report", "export", "synth", "convert", "sweep",
         "advise", "calibrate"]


@pytest.mark.parametrize("command", NAMES)
def test_every_option_of_every_command_takes_or_refuses_a_hostile_value(place, command, monkeypatch):
    tmp, trace, db = place
    monkeypatch.chdir(tmp)  # a relative name the sweep draws is made here
    base, options = commands(tmp, trace, db)[command]

    with duckdb.connect(str(db), read_only=True) as con:
        (base_id,) = con.execute("SELECT run_id FROM runs WHERE name = 'base'").fetchall()[0]

    @SWEEP
    @given(option=st.sampled_from(options), value=values(tmp, trace, db))
    def one(option, value):
        # `runs --delete` of a prefix of the run's id or name deletes it, as documented
        assume(not (command == "runs" and option == "--delete" and value and
                    (base_id.startswith(value) or "base".startswith(value))))
        args = argv(base, option, value)
        code, out, err = tierdiag_in_process(command, *args)
        check(command, args, code, out, err)
        base_run_kept(db)

    one()


@pytest.mark.parametrize("command", NAMES)
def test_a_name_too_long_for_the_file_system_is_exit_2_naming_the_option(place, command):
    """The sweep's find: every path option and place of every command with a 3,000-byte name."""
    tmp, trace, db = place
    base, options = commands(tmp, trace, db)[command]
    long_name = str(tmp / ("x" * 3000))
    paths = {"--db", "-o", "--config", "--profile", "--storage-dir", "--resume"}
    tried = 0
    for option in options:
        if option in paths or (option.startswith("@") and os.sep in base[int(option[1:])]):
            args = argv(base, option, long_name)
            code, out, err = tierdiag_in_process(command, *args)
            check(command, args, code, out, err)
            assert code == 2 and "too long a file name" in err, (option, code, err)
            tried += 1
    assert tried, f"{command}: no path option tried"
    base_run_kept(db)


@pytest.mark.parametrize("args", [["runs", "--delete", ""], ["summary", "--run", ""], ["explain", "1", "--run", ""],
                                  ["report", "--run", ""], ["advise", "--run", ""], ["compare", "", "base"]])
def test_an_empty_run_names_no_run_and_deletes_nothing(tmp_path, args):
    """The sweep's find: `--delete ""` (say `tierdiag runs --delete "$RUN"` with RUN unset)
    deleted a store's only run, since the empty string is a prefix of every run id, and every
    `--run ""` read it. Now exit 4, one line, the run kept."""
    trace = write_trace(tmp_path / "t.jsonl", good_lines(6))
    db = tmp_path / "s.duckdb"
    code, _, err = tierdiag_in_process("replay", trace, "--db", db, *SMALL, "--run-name", "base")
    assert code == 0, err
    code, out, err = tierdiag_in_process(*args, "--db", db)
    check(args[0], args, code, out, err)
    assert code == 4 and "an empty run names no run" in err, (code, err)
    base_run_kept(db)
