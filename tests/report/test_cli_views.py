"""CLI conventions and terminal views as a user meets them: --version, -h, help that lists
choices and defaults, views that fit 80 columns without cutting a value, piped output that is
complete, and NO_COLOR without any styling.

The views run through the real entry point in a subprocess: piped (stdout not a TTY, as in
`tierdiag slow > file`) and under a pseudo-terminal 80 columns wide.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fake_run import write_fake_run
from tests.cli.cli_helpers import cli_here, on_tty
from tierdiag.diagnose.request.causes import CAUSES
from tierdiag.config.engine import EVICTION_POLICIES, WRITE_POLICIES
from tierdiag.config.presets import MODELS

ANSI = re.compile(r"\x1b\[")


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("views") / "run.duckdb"
    # Long ids and a long run name: what makes narrow terminals cut values.
    write_fake_run(path, 160, 4, name="conversation-trace-replay",
                   ids=[f"session-{i:04d}-turn-{i % 9:02d}" for i in range(160)])
    return path


# --- conventions --------------------------------------------------------------------------------

def test_version_help_and_no_arguments():
    from tierdiag import __version__

    v = cli_here("--version")
    assert v.returncode == 0 and v.stdout.strip() == f"tierdiag {__version__}"
    for args in ((), ("-h",), ("--help",)):
        r = cli_here(*args)
        assert r.returncode == 0, args
        assert r.stdout.startswith("Usage: tierdiag ") and "--install-completion" in r.stdout
        assert "replay" in r.stdout and "explain" in r.stdout
    # Each command's line in the list is whole (click would end it with "...").
    assert "..." not in r.stdout.split("Commands:")[1]
    assert cli_here("summary", "-h").returncode == 0


def test_replay_help_lists_choices_and_defaults_without_bool_metavars():
    r = cli_here("replay", "--help")
    assert r.returncode == 0
    text = r.stdout
    assert text.startswith("Usage: tierdiag replay [OPTIONS] {TRACE}")
    flat = " ".join(text.split())
    assert "[" + " | ".join(EVICTION_POLICIES) + "]" in flat
    assert "[" + " | ".join(WRITE_POLICIES) + "]" in flat and "[" + " | ".join(MODELS) + "]" in flat
    assert "<bool>" not in text and "…" not in text
    for option, default in (("--model", "llama3-8b"), ("--gpu", "h200"), ("--eviction-policy", "lru"),
                            ("--load-back-threshold", "10"), ("--overlap", "overlap"), ("--verify", "sample")):
        entry = flat[flat.index(option + " "):]
        entry = entry[:entry.index("]", entry.index("[default:")) + 1]
        assert f"[default: {default}]" in entry, option
    # Pool sizes in GiB beside tokens.
    assert re.search(r"--device-tokens .*\[default: .*[\d,]+ tokens \([\d.]+ GiB\)\]", flat)
    assert all(len(line) <= 80 for line in text.splitlines())


def test_an_unknown_choice_is_the_registry_error(db):
    r = cli_here("slow", "--db", str(db), "--cause", "bogus")
    assert r.returncode == 2 and "unknown cause 'bogus'; known: " in r.stderr
    assert all(c in r.stderr for c in CAUSES) and len(r.stderr.strip().splitlines()) == 1


# --- views at 80 columns, piped and on a terminal -------------------------------------------------

def _assert_whole(text: str) -> None:
    # Nothing cut: a line longer than the terminal (a title) is whole and wraps there.
    assert "…" not in text, text


def test_slow_piped_keeps_every_value(db):
    rows = json.loads(cli_here("slow", "--db", str(db), "--top", "15", "--json").stdout)["requests"]
    r = cli_here("slow", "--db", str(db), "--top", "15")
    assert r.returncode == 0
    _assert_whole(r.stdout)
    for row in rows:
        assert row["req_id"] in r.stdout
        split = " / ".join(f"{row[k]:,}" for k in ("device_tokens", "host_tokens", "storage_tokens", "computed_tokens"))
        # The token split stays on one line.
        assert any(split in line for line in r.stdout.splitlines()), split


def test_summary_at_80_columns_has_full_numbers_and_class_names(db):
    sm = json.loads(cli_here("summary", "--db", str(db), "--json").stdout)
    code, text = on_tty("summary", "--db", str(db), NO_COLOR="1")
    assert code == 0
    _assert_whole(text.replace("\r", ""))
    for c in sm["classes"]:
        assert re.search(rf"^{c['hit_class']}\s+{c['num_requests']:,}\s+{c['input_tokens']:,}\s", text, re.M), c
    assert f"{sm['tokens']['input_tokens']:,}" in text
    assert "GiB" in text  # pools beside tokens, and the units legend


def test_explain_at_80_columns_cuts_no_id(db):
    rid = json.loads(cli_here("slow", "--db", str(db), "--top", "1", "--json").stdout)["requests"][0]["req_id"]
    code, text = on_tty("explain", rid, "--db", str(db), NO_COLOR="1")
    assert code == 0 and rid in text
    assert "…" not in text


def test_no_color_removes_all_styling(db):
    code, styled = on_tty("slow", "--db", str(db), "--top", "5")
    assert code == 0 and ANSI.search(styled)  # the terminal does get styling by default
    for args in (("slow", "--db", str(db), "--top", "5"), ("summary", "--db", str(db)), ("replay", "--help")):
        code, text = on_tty(*args, NO_COLOR="1")
        assert code == 0 and not ANSI.search(text), args
    assert not ANSI.search(cli_here("summary", "--db", str(db)).stdout)  # piped: never escapes


def test_runs_at_80_columns_show_ids_that_run_accepts(db, tmp_path):
    multi = tmp_path / "multi.duckdb"
    ids = [write_fake_run(multi, 40, seed, name=f"a-rather-long-run-name-{seed}").run_id for seed in (1, 2)]
    for text in (cli_here("runs", "--db", str(multi)).stdout,
                 on_tty("runs", "--db", str(multi), NO_COLOR="1")[1].replace("\r", "")):
        _assert_whole(text)
        shown = re.findall(r"^(\d{8}-\d{6}-[0-9a-f]{6})\b", text, re.M)
        assert shown == ids, text
        assert "GiB" in text  # pools in tokens and GiB
    for rid in ids:
        assert cli_here("summary", "--db", str(multi), "--run", rid, "--json").returncode == 0
