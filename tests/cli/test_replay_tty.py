"""A replay in a terminal: its progress bar on stderr (Rich's Live over the CLI's lazily made
console, which it enters as a context manager at every refresh), then the closing table, exit 0.
Piped, neither the bar nor its count of the trace's lines is made (test_leave_fast.py and the
other CLI tests replay piped)."""

from __future__ import annotations

from tests.cli.cli_helpers import REPLAY_ARGS, on_tty, write_late_trace


def test_a_replay_on_a_terminal_draws_its_bar_then_prints_the_closing_table(tmp_path):
    trace = write_late_trace(tmp_path / "t.jsonl", num_requests=600)
    code, shown = on_tty("replay", trace, "--db", tmp_path / "r.duckdb", *REPLAY_ARGS, columns=100)
    assert code == 0, shown[-2000:]
    assert "replay" in shown and "/600" in shown, shown[:2000]  # the bar, with the trace's line count
    assert "recorded run" in shown and "next: " in shown, shown[-2000:]


def test_a_piped_replay_makes_no_progress_bar(tmp_path):
    """Piped (a script, a benchmark, `make demo > log`): rich.progress is never imported."""
    import subprocess
    import sys

    from tests.cli.cli_helpers import _env

    trace = write_late_trace(tmp_path / "t.jsonl", num_requests=40)
    code = ("import sys\nfrom tierdiag.cli.main import main\n"
            "try:\n    main()\nfinally:\n    sys.stderr.write(f\"\\nprogress imported: {'rich.progress' in sys.modules}\\n\")\n")
    r = subprocess.run([sys.executable, "-c", code, "replay", str(trace), "--db", str(tmp_path / "r.duckdb"),
                        *map(str, REPLAY_ARGS)], capture_output=True, text=True, timeout=300, env=_env())
    assert r.returncode == 0, r.stderr
    assert r.stderr.rstrip().splitlines()[-1] == "progress imported: False", r.stderr


def test_a_piped_json_replay_loads_no_view_duckdb_or_package_metadata_in_the_engines_process(tmp_path):
    """Its start-up (issue 41): with the store written by its own process, the engine's process
    never needs DuckDB, Rich's views (report.terminal: its size curves' view imports DuckDB),
    importlib.metadata (the run row's torch version is read from its dist-info) or torch; nor Rich
    at all before its first progress line (none within the hour asked for here); nor Typer, for a
    plain command line."""
    import subprocess
    import sys

    from tests.cli.cli_helpers import _env

    trace = write_late_trace(tmp_path / "t.jsonl", num_requests=40)
    heavy = ("duckdb", "tierdiag.report.terminal", "importlib.metadata", "torch", "pyarrow",
             "rich",  # Rich too: asking whether stderr is a terminal makes no console when it plainly is not
             "typer",  # a plain command line: cli/main.py calls the command without Typer
             "tomllib", "tempfile")  # nothing to read as TOML (no --config, no --profile), no temporary folder
    code = ("import sys\nfrom tierdiag.cli.main import main\n"
            "try:\n    main()\nfinally:\n"
            f"    sys.stderr.write('\\nloaded: ' + ' '.join(m for m in {heavy!r} if m in sys.modules) + '\\n')\n")
    r = subprocess.run([sys.executable, "-c", code, "replay", str(trace), "--db", str(tmp_path / "r.duckdb"), "--json",
                        *map(str, REPLAY_ARGS)], capture_output=True, text=True, timeout=300,
                       env=_env(TIERDIAG_WRITER="process", TIERDIAG_PROGRESS_EVERY_S="3600"))
    assert r.returncode == 0, r.stderr
    assert r.stderr.rstrip().splitlines()[-1] == "loaded:", r.stderr


def test_an_unrecorded_replay_loads_no_gzip_shutil_or_request_rows(tmp_path):
    """Its start-up (issue 41, session 24): a trace file that is not gzip needs no gzip; shutil
    (bz2, lzma) is for a folder to remove; a replay's token split never reads a `requests` row
    (RequestRow, a slotted class of ~90 fields). None of them is loaded, start to end."""
    import subprocess
    import sys

    from tests.cli.cli_helpers import _env

    trace = write_late_trace(tmp_path / "t.jsonl", num_requests=40)
    avoided = ("gzip", "shutil", "bz2", "lzma", "tierdiag.diagnose.read.requests", "duckdb", "typer")
    code = ("import sys\nfrom tierdiag.cli.main import main\n"
            "try:\n    main()\nfinally:\n"
            f"    sys.stderr.write('\\nloaded: ' + ' '.join(m for m in {avoided!r} if m in sys.modules) + '\\n')\n")
    r = subprocess.run([sys.executable, "-c", code, "replay", str(trace), "--no-probes", "--json",
                        *map(str, REPLAY_ARGS)], capture_output=True, text=True, timeout=300,
                       env=_env(TIERDIAG_PROGRESS_EVERY_S="3600"))
    assert r.returncode == 0, r.stderr
    assert r.stderr.rstrip().splitlines()[-1] == "loaded:", r.stderr
