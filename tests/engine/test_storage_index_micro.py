"""benchmarks/storage_index_micro.py: its options checked, one line an error, and a small run."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "storage_index_micro.py"
sys.path.insert(0, str(ROOT / "benchmarks"))
import storage_index_micro as micro  # noqa: E402

INT_OPTIONS = ("keys", "capacity", "batch", "queries", "rounds")


@settings(max_examples=80, deadline=None)
@given(name=st.sampled_from(INT_OPTIONS),
       value=st.one_of(st.integers(max_value=0), st.integers(min_value=2**31), st.just(-1), st.just(10**30)))
def test_an_int_option_out_of_range_is_one_line_and_exit_1(name, value):
    if name == "queries" and value == 0:
        value = -1  # (0 queries is fine)
    with pytest.raises(SystemExit) as got:
        micro.main([f"--{name}={value}"])
    assert isinstance(got.value.code, str) and "\n" not in got.value.code and f"--{name}" in got.value.code


@settings(max_examples=60, deadline=None)
@given(value=st.one_of(st.floats(allow_nan=True, allow_infinity=True).filter(lambda v: not 0 <= v < 1),
                       st.just(float("nan"))))
def test_touched_out_of_range_nan_or_infinite_is_one_line_and_exit_1(value):
    with pytest.raises(SystemExit) as got:
        micro.main([f"--touched={value!r}" if math.isfinite(value) else f"--touched={value}"])
    assert isinstance(got.value.code, str) and "--touched" in got.value.code and "\n" not in got.value.code


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(INT_OPTIONS + ("touched",)),
       text=st.sampled_from(["abc", "1e3x", "", "\u00e9\u4e2d", "1;rm -rf /", "\\n", "0x10", "NaN!"]))
def test_a_value_of_the_wrong_type_is_argparse_exit_2(name, text):
    with pytest.raises(SystemExit) as got:
        micro.main([f"--{name}={text}"])
    assert got.value.code == 2


def test_a_small_run_times_the_index_and_holds_the_capacity():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--keys", "3000", "--capacity", "500", "--rounds", "1",
                           "--queries", "100"], capture_output=True, text=True, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    if "not built" in proc.stderr:
        pytest.skip("the compiled data plane is not built here")
    assert proc.returncode == 0, proc.stderr
    assert "500 held" in proc.stdout and "this: CPU" in proc.stdout
