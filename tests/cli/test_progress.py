"""Issue 42 item 2: long commands say where they are, on stderr only (tierdiag/cli/progress.py).
Piped: a line every TIERDIAG_PROGRESS_EVERY_S seconds (what, done/total, elapsed); stdout's data
is the same with or without them. On an 80-column terminal: a bar with done/total and the time
left that fits the line."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings, strategies as st

from tests.cli.cli_helpers import REPLAY_ARGS, on_tty, write_late_trace
from tests.support.cli import cli_env
# Piped (stderr not a terminal), in this process (tests/support/cli.py): the interval is read as
# the command starts, not at import; ~0.45 s of CPU a start saved. The terminal's bar: `on_tty`.
from tests.support.cli import completed_in_process as run
from tierdiag.cli import progress as prog
from tierdiag.errors import ConfigError

SAMPLES = prog.__file__.rsplit("/cli/", 1)[0] + "/trace/samples"
OFTEN = "0.01"
LINE = re.compile(r"^tierdiag: (?P<what>[a-z: ]+): (?P<done>[\d,]+)(/(?P<total>[\d,]+))? ?[^,]*, "
                  r"(?P<elapsed>\d+[smh][\dms]*) elapsed")


def _lines(stderr: str, what: str) -> list[re.Match]:
    found = [LINE.match(x) for x in stderr.splitlines()]
    return [m for m in found if m and m["what"].startswith(what)]


def test_a_piped_replay_says_where_it_is_on_stderr_only(tmp_path):
    trace = write_late_trace(tmp_path / "t.jsonl", num_requests=3000)
    with_lines = run("replay", trace, "--db", tmp_path / "a.duckdb", *REPLAY_ARGS, "--json",
                     env=cli_env(TIERDIAG_PROGRESS_EVERY_S=OFTEN))
    assert with_lines.returncode == 0, with_lines.stderr
    lines = _lines(with_lines.stderr, "replay")
    assert lines, with_lines.stderr
    assert all(m["total"] == "3,000" for m in lines)  # done/total: the trace's line count
    done = [int(m["done"].replace(",", "")) for m in lines]
    assert done == sorted(done) and done[-1] <= 3000
    assert "tierdiag: replay:" not in with_lines.stdout
    without = run("replay", trace, "--db", tmp_path / "b.duckdb", *REPLAY_ARGS, "--json")
    assert without.returncode == 0 and "tierdiag: replay:" not in without.stderr
    a, b = json.loads(with_lines.stdout), json.loads(without.stdout)
    for volatile in ("run_id", "db_path", "wall_s", "wall_phases", "writer", "storage_dir"):
        a.pop(volatile, None), b.pop(volatile, None)
    assert a == b  # the data is the same with progress lines on stderr


def test_a_piped_convert_report_and_sweep_say_where_they_are(tmp_path):
    env = cli_env(TIERDIAG_PROGRESS_EVERY_S=OFTEN)
    quiet = cli_env()
    out_a, out_b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a = run("convert", "kv-cache-tester", f"{SAMPLES}/kv-cache-tester", "-o", out_a, env=env)
    b = run("convert", "kv-cache-tester", f"{SAMPLES}/kv-cache-tester", "-o", out_b, env=quiet)
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert a.stdout.replace(str(out_a), "OUT") == b.stdout.replace(str(out_b), "OUT")
    assert out_a.read_bytes() == out_b.read_bytes()
    db = tmp_path / "r.duckdb"
    trace = write_late_trace(tmp_path / "t.jsonl", num_requests=400)
    assert run("replay", trace, "--db", db, *REPLAY_ARGS, env=quiet).returncode == 0
    r = run("report", "--db", db, "-o", tmp_path / "r.html", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(tmp_path / "r.html")  # stdout: the path, nothing else
    steps = _lines(r.stderr, "report")
    assert steps and all(m["total"] for m in steps), r.stderr
    s = run("sweep", trace, "--db", db, "--set", "host_tokens=20480,40960", "--set", "model=tiny", "--set", "gpu=cpu",
            "--set", "device_tokens=12288", "--jobs", "1", env=env)
    assert s.returncode == 0, s.stderr
    assert all(m["total"] == "2" for m in _lines(s.stderr, "sweep")) and _lines(s.stderr, "sweep"), s.stderr
    assert "tierdiag: sweep:" not in s.stdout


def test_lines_off_with_zero(tmp_path):
    trace = write_late_trace(tmp_path / "t.jsonl", num_requests=600)
    r = run("replay", trace, "--db", tmp_path / "r.duckdb", *REPLAY_ARGS, env=cli_env(TIERDIAG_PROGRESS_EVERY_S="0"))
    assert r.returncode == 0 and not _lines(r.stderr, "replay"), r.stderr


@pytest.mark.parametrize("bad", ["-1", "abc", "nan", "inf", "1e9", "0x10"])
def test_a_bad_interval_is_one_line_exit_2(tmp_path, bad):
    from tests.support.cli import one_line_error

    trace = write_late_trace(tmp_path / "t.jsonl", num_requests=20)
    r = run("replay", trace, "--db", tmp_path / "r.duckdb", *REPLAY_ARGS, env=cli_env(TIERDIAG_PROGRESS_EVERY_S=bad))
    one_line_error(r.returncode, r.stderr, 2, "TIERDIAG_PROGRESS_EVERY_S")


@settings(max_examples=60, deadline=None)
@given(raw=st.one_of(st.text(max_size=30), st.floats(allow_nan=True, allow_infinity=True).map(repr),
                     st.integers(-10**6, 10**6).map(str)))
def test_every_s_takes_seconds_or_refuses(raw):
    if "\x00" in raw or any(0xD800 <= ord(c) <= 0xDFFF for c in raw):
        return  # not a value an environment can hold
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(prog.ENV, raw)
        try:
            value = prog.every_s()
        except ConfigError as exc:
            value = exc
    if isinstance(value, ConfigError):
        exc = value
        assert prog.ENV in str(exc) and "\n" not in str(exc).strip("\n")
        return
    assert 0 <= value <= prog.MAX_EVERY_S
    if raw.strip():
        assert value == float(raw)
    else:
        assert value == prog.DEFAULT_EVERY_S


@settings(max_examples=60, deadline=None)
@given(done=st.integers(0, 10**9), extra=st.one_of(st.none(), st.integers(0, 10**9)),
       elapsed=st.floats(0, 10**6), what=st.sampled_from(["replay", "convert: reading", "sweep"]),
       stopping=st.booleans())
def test_progress_line_names_what_done_total_elapsed(done, extra, elapsed, what, stopping):
    total = None if extra is None else done + extra
    line = prog.progress_line(what, done, total, "requests", elapsed, stopping=stopping)
    m = LINE.match(line)
    assert m and m["what"] == what and int(m["done"].replace(",", "")) == done
    assert (m["total"] is None) == (total is None)
    assert "\n" not in line
    # Once interrupted, the count no longer moves: no time left is estimated from it, and the
    # line says the command is closing instead.
    assert ("interrupted: closing" in line) == stopping
    assert not (stopping and " left" in line)


def test_the_piped_lines_after_an_interrupt_say_the_command_is_closing(monkeypatch):
    """A replay interrupted half-way closes its run (a 1M-request one for ~30 s): the ticker's
    lines from the signal on say so, not "about ... left" growing with each line (tierdiag/signals.py
    `received`, read by the ticker)."""
    import io
    import signal
    import time

    from tierdiag import signals

    err = io.StringIO()
    monkeypatch.setattr(prog.sys, "stderr", err)
    monkeypatch.setattr(prog, "every_s", lambda: 0.001)
    monkeypatch.setattr(prog, "stderr_is_terminal", lambda: False)
    bar = prog.Progress("replay", 1000, "requests", show_bar=False)
    with bar:
        bar.update(400)
        deadline = time.monotonic() + 30
        while "about" not in err.getvalue():  # a line with its estimate, before the signal
            assert time.monotonic() < deadline, err.getvalue()
            time.sleep(0.001)
        monkeypatch.setattr(signals, "received", lambda: signal.SIGTERM)
        at = len(err.getvalue().splitlines())
        while len(err.getvalue().splitlines()) < at + 3:
            assert time.monotonic() < deadline, err.getvalue()
            time.sleep(0.001)
    after = err.getvalue().splitlines()[at + 1:]  # the line being written as the signal came may be either
    assert after and all(ln.startswith("tierdiag: replay: 400/1,000 requests") and ln.endswith(
        "elapsed, interrupted: closing what was recorded") for ln in after), after


def test_the_bar_fits_80_columns_with_done_total_and_eta(tmp_path):
    trace = write_late_trace(tmp_path / "t.jsonl", num_requests=3000)
    code, shown = on_tty("replay", trace, "--db", tmp_path / "r.duckdb", *REPLAY_ARGS, columns=80)
    assert code == 0, shown[-2000:]
    frames = {re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", f) for f in re.split(r"[\r\n]", shown)}
    bars = [f for f in frames if "/3,000 requests" in f]
    assert bars, shown[:2000]
    assert all(len(f.rstrip()) <= 80 and "ETA" in f and "…" not in f for f in bars), bars


def test_fmt_duration_reads_short():
    assert [prog.fmt_duration(s) for s in (0, 42, 187, 3720)] == ["0s", "42s", "3m07s", "1h02m"]


class _Stream:
    """A stderr stand-in: isatty answers `tty` (or raises, as a closed stream's does)."""

    def __init__(self, tty):
        self.tty = tty

    def write(self, text):
        return len(text)

    def flush(self):
        pass

    def isatty(self):
        if self.tty == "closed":
            raise ValueError("I/O operation on closed file")
        return self.tty


class _NoIsatty:
    def write(self, text):
        return len(text)

    def flush(self):
        pass


def _stream(kind):
    if kind == "none":
        return None
    if kind == "no-isatty":
        return _NoIsatty()
    if kind.startswith("proxied"):  # Rich's Console.file reads a stream's rich_proxied_file
        stream = _Stream(kind == "proxied-pipe")
        stream.rich_proxied_file = _Stream(kind == "proxied-tty")
        return stream
    return _Stream({"tty": True, "pipe": False, "closed": "closed"}[kind])


@settings(max_examples=200, deadline=None)
@given(kind=st.sampled_from(["tty", "pipe", "closed", "none", "no-isatty", "proxied-tty", "proxied-pipe"]),
       tty_compatible=st.sampled_from([None, "", "0", "1", "2", "yes", " 1"]),
       force_color=st.sampled_from([None, "", "0", "1", "always", "\u00e9"]),
       made=st.booleans())
def test_stderr_is_terminal_answers_as_the_console_would(kind, tty_compatible, force_color, made):
    # stderr_is_terminal answers "no" without making the console only where Rich's is_terminal
    # is plainly no; on every drawn stream and environment it must give the console's answer,
    # and a plain pipe (neither variable set) must not make the console.
    import sys

    from tierdiag.cli import common
    from tierdiag.report.console import new_console

    with pytest.MonkeyPatch.context() as mp:
        for key, value in {"TTY_COMPATIBLE": tty_compatible, "FORCE_COLOR": force_color}.items():
            if value is None:
                mp.delenv(key, raising=False)
            else:
                mp.setenv(key, value)
        mp.setattr(sys, "stderr", _stream(kind))
        lazy = common._LazyConsole(stderr=True)
        mp.setattr(common, "err", lazy)
        if made:
            lazy._get()
        got = prog.stderr_is_terminal()
        plain = tty_compatible not in ("0", "1") and force_color is None
        if plain and not made and kind in ("pipe", "closed", "none", "no-isatty", "proxied-pipe"):
            assert not lazy.made(), kind
        want = new_console(stderr=True).is_terminal
    assert got == want, (kind, tty_compatible, force_color, made)


def test_a_total_given_as_a_function_is_counted_where_first_shown_and_once(monkeypatch):
    """A replay's total is its trace's line count, a read of the whole file: `Progress` takes it
    as a function and calls it where the total is first shown (the bar's start, the first piped
    line), once; a piped command that ends before its first line never reads the file (issue 41,
    the replay's start-up)."""
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    calls: list[int] = []

    def count() -> int:
        calls.append(1)
        return 3000

    bar = prog.Progress("replay", count, "requests", show_bar=False)  # piped (pytest's stderr)
    bar.update(256, info="t=1s")
    assert calls == []  # nothing shown yet: not counted
    assert bar.total == 3000 and bar.total == 3000 and calls == [1]
    assert bar._count() == "256/3,000 requests"
    bar.update(512, total=4000)  # a total given later replaces it, as before
    assert bar.total == 4000 and calls == [1]
    unknown = prog.Progress("replay", lambda: None, "requests", show_bar=False)
    assert unknown.total is None and unknown._count() == "0 requests"
