"""Integer and float options are parsed by tierdiag itself (cli/params.py `_parse_number`), not by
Typer's pydantic coercion: pydantic's import was 0.15 s of every replay's start-up. What it read,
this reads the same, and a value that is not a number is one line naming the option (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import completed_in_process

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "tierdiag" / "trace" / "samples" / "demo.jsonl"


def _tierdiag(*args: str, code: str = "from tierdiag.cli.main import main; main()") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT, timeout=300)


@pytest.mark.parametrize("args, problem", [
    (["--device-tokens", "abc"], "Invalid value for '--device-tokens': 'abc' is not an integer"),
    (["--device-tokens", "12.5"], "Invalid value for '--device-tokens': '12.5' is not an integer"),
    (["--time-scale", "fast"], "Invalid value for '--time-scale': 'fast' is not a number"),
])
def test_a_value_that_is_not_a_number_is_one_line_and_exit_2(args, problem):
    r = completed_in_process("replay", str(DEMO), "--no-probes", *args, cwd=ROOT)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and problem in lines[0], r.stderr


def test_numbers_written_as_pydantic_read_them_replay_without_importing_pydantic():
    code = ("import sys; from tierdiag.cli.main import main\n"
            "try:\n    main()\nfinally:\n"
            "    print('PYDANTIC' if any(m.split('.')[0] == 'pydantic' for m in sys.modules) else 'NONE', file=sys.stderr)")
    r = _tierdiag("replay", str(DEMO), "--no-probes", "--json", "--device-tokens", " 98_304 ",
                  "--host-tokens", "393216.0", "--time-scale", "1.5", code=code)
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip().splitlines()[-1] == "NONE"
    out = json.loads(r.stdout)
    assert out["data_plane"]["device_pages"] == 98_304 // 64 and out["data_plane"]["host_pages"] == 393_216 // 64
