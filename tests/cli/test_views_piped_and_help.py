"""Piped output is complete whatever COLUMNS says, help text is readable, and the command table
is what `tierdiag` runs (issue 32 item 11; issue 28's thin cli/main.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.cli.cli_helpers import ENTRY, _env, cli, cli_here
from tierdiag.cli.main import COMMANDS, GROUP_APPS


@pytest.mark.parametrize("view", [("runs",), ("summary",), ("slow",), ("explain", "1")])
@pytest.mark.parametrize("columns", [20, 60])
def test_piped_output_under_a_narrow_columns_is_laid_out_as_for_80(late_run, view, columns):
    # In this process, by the path the console script takes for these lines (the read commands'
    # direct call, tests/support/cli.py `direct`): the layout is tested, not the start (~0.45 s
    # of CPU each). One line through a process: test_a_wide_columns_still_widens_piped_output.
    narrow = cli_here(*view, "--db", late_run, columns=columns, direct=True)
    assert narrow.returncode == 0, narrow.stderr
    assert narrow.stdout == cli_here(*view, "--db", late_run, columns=80, direct=True).stdout


def test_runs_piped_under_columns_20_shows_the_whole_run_id_and_config(late_run):
    (info,) = json.loads(cli_here("runs", "--db", late_run, "--json", direct=True).stdout)
    out = cli_here("runs", "--db", late_run, columns=20, direct=True).stdout
    assert info["run_id"] in out and "tiny on cpu" in out


def test_a_wide_columns_still_widens_piped_output(late_run):
    piped = cli("runs", "--db", late_run, columns=200)  # a real pipe, the console script's process
    assert piped.stdout == cli_here("runs", "--db", late_run, columns=200, direct=True).stdout
    assert max(map(len, piped.stdout.splitlines())) <= 200


def _help(*args: str) -> str:
    # In this process: `--help` is never the read commands' direct path (cli/main.py
    # `direct_arguments`), Typer's in either case; ~0.45 s of CPU a start saved.
    r = cli_here(*args, "--help")
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("command", [("import", "sglang") if c in GROUP_APPS else (c,) for c in COMMANDS])
def test_help_names_option_values_and_escapes_nothing(command):
    text = _help(*command)
    options = [line for line in text.splitlines() if line.lstrip().startswith("-")]
    assert not [line for line in options if "<str>" in line], text
    assert "\\[" not in text, text


def test_sweep_help_names_the_extra_to_install():
    assert "pip install 'tierdiag[ray]'" in " ".join(_help("sweep").split())


def _modules_loaded(*args: str) -> set[str]:
    code = (f"import sys\ntry:\n    {ENTRY}\nfinally:\n"
            "    print(' '.join(m for m in sys.modules if m.startswith('tierdiag.cli.')), file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=_env(), timeout=120)
    return set(r.stderr.strip().splitlines()[-1].split())


def test_every_command_in_the_table_is_its_modules_function():
    import importlib

    for name, (module, line) in COMMANDS.items():
        mod = importlib.import_module(f"tierdiag.cli.{module}")
        assert callable(getattr(mod, GROUP_APPS.get(name, name))), name
        assert line and "\n" not in line


def test_help_lists_the_table_without_importing_a_command_and_a_command_imports_only_its_own(late_run):
    helped = _modules_loaded("--help")
    assert not helped & {f"tierdiag.cli.{m}" for m, _ in COMMANDS.values()}, helped
    ran = _modules_loaded("runs", "--db", str(late_run))
    assert {f"tierdiag.cli.{m}" for m, _ in COMMANDS.values()} & ran == {"tierdiag.cli.runs"}, ran


@pytest.mark.parametrize("typo, suggested", [("summry", "'summary'"), ("expl", "'explain'")])
def test_a_mistyped_command_is_one_line_naming_the_close_ones_from_the_whole_table(typo, suggested):
    r = cli_here(typo)  # Typer's usage error either way (no direct path for an unknown command)
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert f"No such command '{typo}'. Did you mean {suggested}" in line


def test_completing_a_command_name_offers_the_table_without_importing_a_command():
    env = {"_TIERDIAG_COMPLETE": "complete_zsh", "_TYPER_COMPLETE_ARGS": "tierdiag su"}
    code = ("import sys; sys.argv[0] = 'tierdiag'\ntry:\n    " + ENTRY.replace("; ", "\n    ") + "\nfinally:\n"
            "    print(' '.join(m for m in sys.modules if m.startswith('tierdiag.cli.')), file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(**env), timeout=120)
    assert '"summary":"One run at a glance' in r.stdout, r.stdout + r.stderr
    loaded = set(r.stderr.strip().splitlines()[-1].split())
    assert not loaded & {f"tierdiag.cli.{m}" for m, _ in COMMANDS.values()}, loaded
