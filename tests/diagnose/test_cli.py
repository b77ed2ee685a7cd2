"""explain / slow / summary through the real CLI entry, in a subprocess: output, errors, no torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# Runs the CLI in-process of a fresh interpreter, then reports which of the watched packages
# (by top-level name) got imported.
_HARNESS = """
import json, sys
watch = set(json.loads(sys.argv[2]))
sys.argv = ["tierdiag", *json.loads(sys.argv[1])]
from tierdiag.cli.main import main
code = 0
try:
    main()
except SystemExit as exc:
    code = exc.code or 0
seen = sorted({m.split(".")[0] for m in sys.modules} & watch)
sys.stderr.write("\\n@@HEAVY@@" + json.dumps(seen) + "\\n")
sys.exit(code)
"""
HEAVY = ("torch", "pandas", "plotly")


def run_cli(*args: str, watch: tuple[str, ...] = HEAVY) -> tuple[int, str, str, list[str]]:
    """(exit code, stdout, stderr, which of `watch` the command imported)."""
    env = {"COLUMNS": "120", "PATH": "/usr/bin:/bin",  # and the suite's CPU data plane, if it chose one
           **{k: v for k, v in os.environ.items() if k == "TIERDIAG_CPLANE"}}
    proc = subprocess.run([sys.executable, "-c", _HARNESS, json.dumps(list(args)), json.dumps(list(watch))],
                          capture_output=True, text=True, env=env, timeout=120)
    err, _, heavy = proc.stderr.rpartition("@@HEAVY@@")
    return proc.returncode, proc.stdout, err.strip(), json.loads(heavy)


def run_cli_here(*args: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `run_cli`'s command line run in this process
    (tests/support/cli.py `tierdiag_in_process`, the console script's own path for the line, at
    run_cli's width), for tests of what a command says and writes, not of what it imports: a
    fresh interpreter was ~0.45 s of CPU a call, ~1.5 s where the command imports scipy
    (`calibrate --from`)."""
    from tests.support.cli import cli_env, tierdiag_in_process

    r = tierdiag_in_process(*args, env=cli_env(columns=120), direct=True)
    return r.code, r.out, r.err


@pytest.mark.parametrize("args", [
    ("explain", "tier", "--json"),
    ("explain", "tier"),
    ("slow", "--json"),
    ("slow",),
    ("summary", "--json"),
    ("summary",),
])
def test_read_commands_never_import_torch(planted, args):
    code, out, err, heavy = run_cli(*args, "--db", str(planted.path))
    assert code == 0, err
    assert heavy == [], f"{args[0]} imported {heavy}"


def test_explain_json_and_rich_tell_the_same_story(planted):
    code, out, _, _ = run_cli("explain", "tier", "--json", "--db", str(planted.path))
    j = json.loads(out)
    assert (j["class"], j["primary_cause"], j["evicted_by"]) == ("tiered_hit", "load_back", ["f1", "f2"])
    code, text, _, _ = run_cli("explain", "tier", "--db", str(planted.path))
    # Verdict first, then the four steps in the troubleshooting order.
    positions = [text.index(s) for s in ("verdict: load_back", "1 · host_hit_length", "2 · prefix_indices",
                                         "3 · load_back", "4 · eviction")]
    assert positions == sorted(positions)
    assert "8.06 ms" in text and "25.0 GB/s" in text and "256.0 MiB" in text and "2,048" in text


def test_slow_and_summary_json(planted):
    _, out, _, _ = run_cli("slow", "--top", "2", "--class", "tiered_hit", "--json", "--db", str(planted.path))
    assert [r["req_id"] for r in json.loads(out)["requests"]] == ["tier", "stor"]
    _, out, _, _ = run_cli("summary", "--json", "--run", "planted", "--db", str(planted.path))
    assert json.loads(out)["tokens"]["host_tokens"] == 2048


def test_slow_ids_prints_only_ids_in_rank_order(planted):
    _, out, _, _ = run_cli("slow", "--top", "2", "--class", "tiered_hit", "--ids", "--db", str(planted.path))
    assert out.splitlines() == ["tier", "stor"]


@pytest.mark.parametrize("args, code, fragment", [
    (("explain", "tierr"), 5, "no request 'tierr' in run"),
    (("slow", "--cause", "loadback"), 2, "unknown cause 'loadback'"),
    (("summary", "--run", "nope"), 4, "no run 'nope'"),
])
def test_errors_are_one_line(planted, args, code, fragment):
    rc, out, err, _ = run_cli(*args, "--db", str(planted.path))
    assert rc == code
    assert err.startswith("tierdiag: error: ") and fragment in err and "\n" not in err
    assert out == ""


def test_missing_database(tmp_path):
    rc, _, err, _ = run_cli("explain", "1", "--db", str(tmp_path / "none.duckdb"))
    assert rc == 4 and "no database at" in err
