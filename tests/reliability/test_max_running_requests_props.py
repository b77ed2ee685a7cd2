"""Hostile values for `max_running_requests` (SGLang's --max-running-requests; docs/engine.md,
"Running requests"): as a --config key (exit 3, naming the file and key), as `replay
--max-running-requests` (exit 2, naming the option) and as `sweep --set` (exit 2): one
`tierdiag: error:` line each, the store left as it was. A positive integer up to 2^63 - 1 is
taken; the run's config records the cap the engine used (resolved: at most half the device pool
under SGLang 0.5.23, with a warning).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st
from pydantic import TypeAdapter, ValidationError

from harness import SMALL, runs, tierdiag_in_process
from test_config_boundary_props import Unchanged, _write_toml, refused, store  # noqa: F401 - the fixture
from tierdiag.config.engine import EngineConfig, load_config
from tierdiag.config.sweep_spec import plan_sweep
from tierdiag.errors import ConfigError, ExitCode

FEW = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                       HealthCheck.function_scoped_fixture])
INT64_MAX = 2**63 - 1
# what a TOML or JSON value can be that a count of requests is not
HOSTILE_VALUE = st.one_of(
    st.sampled_from([0, -1, -(2**63), 2**63, 10**400, math.nan, math.inf, -math.inf, 1.0, 2.5, 1e300, True, False,
                     "8", "", "nan", "é", "\x1b[31m", [8], {"n": 8}]),
    st.integers(max_value=0), st.integers(min_value=2**63), st.floats(), st.text(max_size=6))
HOSTILE_TEXT = st.one_of(
    st.sampled_from(["0", "-1", "-0", "nan", "inf", "1e3", "2.5", "8.0", "true", "", " ", "x", "0x10",
                     "9223372036854775808", "1" + "0" * 400, "\u0660", "'8'", "[8]"]),
    st.integers(max_value=0).map(str), st.integers(min_value=2**63, max_value=2**70).map(str),
    st.floats().map(repr))


def _typer_int(text: str) -> int | None:
    """The integer Typer makes of an option's text (its pydantic adapter, lax mode), or None."""
    try:
        return TypeAdapter(int).validate_python(text)
    except ValidationError:
        return None


def _taken(value) -> bool:
    return type(value) is int and 1 <= value <= INT64_MAX


@FEW
@given(value=HOSTILE_VALUE)
@example(value=0)
@example(value=True)
@example(value=math.nan)
@example(value=2**63)
def test_a_hostile_config_value_is_exit_3_naming_file_and_key(store, value):
    db, trace, root = store
    cfg = root / "c.toml"
    _write_toml(cfg, {"max_running_requests": value})
    if _taken(value):
        assert load_config(cfg, {}).max_running_requests == value
        return
    with pytest.raises(ConfigError) as exc:
        load_config(cfg, {})
    line = exc.value.one_line()
    assert exc.value.exit_code == ExitCode.BAD_INPUT
    assert line.startswith(f"--config {cfg}: max_running_requests") and "\n" not in line, line
    kept = Unchanged(db)
    code, _, err = tierdiag_in_process("replay", trace, "--db", db, "--config", cfg)
    refused(code, err, 3, f"--config {cfg}: ", "max_running_requests")
    kept.check()


@FEW
@given(text=HOSTILE_TEXT)
@example(text="0")
@example(text="-5")
@example(text="2.5")
@example(text="8.0")
@example(text="nan")
@example(text="true")
def test_a_hostile_option_is_exit_2_naming_it(store, text):
    db, trace, root = store
    taken = _typer_int(text)
    if taken is not None and 1 <= taken <= INT64_MAX:
        # an integral decimal such as "8.0": Typer's int coercion (pydantic, lax, from Typer 0.2x)
        # takes it as 8, as for every integer option; a Typer on click's INT refuses it (exit 2)
        fresh = root / "taken.duckdb"
        fresh.unlink(missing_ok=True)
        # In this process, as the refusals below: an example that replays pays no interpreter start.
        got = tierdiag_in_process("replay", trace, "--db", fresh, *SMALL, f"--max-running-requests={text}")
        if got.code == 0:
            (run,) = runs(fresh, process=False)
            assert 1 <= run["config"]["max_running_requests"] <= taken
            return
        refused(got.code, got.err, 2, "--max-running-requests")
        return
    kept = Unchanged(db)
    code, _, err = tierdiag_in_process("replay", trace, "--db", db, *SMALL, f"--max-running-requests={text}")
    line = refused(code, err, 2, "--max-running-requests")
    if text.strip() in ("0", "-5"):
        assert f"--max-running-requests {text.strip()} must be at least 1" in line, line
    kept.check()


@FEW
@given(text=HOSTILE_TEXT.filter(lambda t: "," not in t and t.strip()))
def test_a_hostile_set_value_is_exit_2_before_any_replay(store, text):
    db, trace, _ = store
    try:
        plan_sweep(EngineConfig(), [f"max_running_requests={text}"])
        return  # a spelling --set takes (a size suffix, "8.0k"): a sweep would run
    except ConfigError as exc:
        assert exc.exit_code == ExitCode.USAGE and "max_running_requests" in exc.one_line()
    kept = Unchanged(db)
    code, _, err = tierdiag_in_process("sweep", trace, "--db", db, "--set", f"max_running_requests={text}")
    refused(code, err, 2, "--set", "max_running_requests")
    kept.check()


def test_a_cap_is_recorded_and_one_above_half_the_pool_warned(store, tmp_path):
    """A valid cap runs; the run's config records the cap used. 4,096 device tokens: a given
    10^6 is lowered to 2,048 (0.5.23's resolve_max_num_reqs), with one warning line."""
    _, trace, _ = store
    db = tmp_path / "r.duckdb"
    got = tierdiag_in_process("replay", trace, "--db", db, *SMALL, "--max-running-requests", "1000000")
    assert got.code == 0, got.err
    assert "--max-running-requests 1,000,000 is reduced to 2,048" in got.err
    (run,) = runs(db, process=False)
    assert run["config"]["max_running_requests"] == 2048
    plan = plan_sweep(EngineConfig(model="tiny", gpu="cpu", device_tokens=4096), ["max_running_requests=1,8"])
    assert [c.resolved_max_running_requests() for _, c in plan.configs] == [1, 8]
