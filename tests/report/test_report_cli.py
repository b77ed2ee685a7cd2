"""`tierdiag report` end to end: default path, --json, --open, errors, and no torch import."""

from __future__ import annotations

import json
import subprocess
import sys
import webbrowser
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fake_run import write_fake_run
from tierdiag.cli.main import app
from tierdiag.errors import ExitCode

runner = CliRunner()


@pytest.fixture
def run_db(tmp_path: Path):
    db = tmp_path / "run.duckdb"
    writer = write_fake_run(db, 120, 11, name="demo")
    return db, writer.run_id


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The real entry point in a fresh interpreter (exit codes, stderr lines, imported modules)."""
    code = (
        "import json, sys\n"
        "from tierdiag.cli.main import main\n"
        "try:\n    main()\n    rc = 0\n"
        "except SystemExit as e:\n    rc = e.code or 0\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'pandas'))\n"
        "print(json.dumps({'rc': rc, 'heavy': heavy}), file=sys.stderr)\n"
    )
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def _status(proc: subprocess.CompletedProcess) -> dict:
    return json.loads(proc.stderr.strip().splitlines()[-1])


def test_default_path_under_reports_and_no_torch(run_db, tmp_path: Path):
    db, run_id = run_db
    proc = _cli("report", "--db", str(db), cwd=tmp_path)
    status = _status(proc)
    assert status == {"rc": 0, "heavy": []}, proc.stderr
    expected = Path("reports") / f"demo-{run_id}.html"
    assert proc.stdout.strip() == str(expected)
    assert (tmp_path / expected).stat().st_size > 1_000_000  # Plotly alone is ~4.8 MB


def test_json_output(run_db, tmp_path: Path):
    db, run_id = run_db
    out = tmp_path / "x" / "r.html"
    result = runner.invoke(app, ["report", "--db", str(db), "--run", "demo", "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["path"] == str(out) and payload["run_id"] == run_id
    assert payload["bytes"] == out.stat().st_size
    assert payload["figures"] >= 4 and payload["sampled"] is False


def test_unwritable_output_is_one_line_io_error(run_db, tmp_path: Path):
    db, _ = run_db
    (tmp_path / "blocker").write_text("not a folder")
    proc = _cli("report", "--db", str(db), "-o", str(tmp_path / "blocker" / "r.html"), cwd=tmp_path)
    assert _status(proc)["rc"] == ExitCode.IO
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("tierdiag: error: cannot write")
    assert proc.stdout == ""


def test_missing_db_and_unknown_run(run_db, tmp_path: Path):
    db, _ = run_db
    assert _status(_cli("report", "--db", str(tmp_path / "nope.duckdb"), cwd=tmp_path))["rc"] == ExitCode.STORE
    proc = _cli("report", "--db", str(db), "--run", "no-such-run", cwd=tmp_path)
    assert _status(proc)["rc"] == ExitCode.STORE and "no run 'no-such-run'" in proc.stderr
    assert not (tmp_path / "reports").exists()


@pytest.mark.parametrize("browser_found", [True, False])
def test_open(run_db, tmp_path: Path, monkeypatch, browser_found):
    db, _ = run_db
    opened = []

    def fake_open(url, *a, **k):
        opened.append(url)
        return browser_found

    monkeypatch.setattr(webbrowser, "open", fake_open)
    out = tmp_path / "r.html"
    result = runner.invoke(app, ["report", "--db", str(db), "-o", str(out), "--open"])
    assert result.exit_code == 0
    assert opened == [out.resolve().as_uri()]
    assert result.stdout.strip().splitlines()[0] == str(out)
    assert ("no web browser found" in result.stderr) is not browser_found
