"""`--set` parsing and the sweep plan: every mistake is a ConfigError naming the --set, before any replay."""

from __future__ import annotations

import pytest

from tierdiag.config.engine import CONFIG_KEYS, EngineConfig
from tierdiag.errors import ConfigError, ExitCode
from tierdiag.config.sweep_spec import parse_set, parse_size, plan_sweep

BASE = EngineConfig(model="tiny", gpu="cpu", device_tokens=16384)


def test_sizes_are_binary_tokens():
    assert parse_size("2048") == 2048
    assert parse_size("512k") == 512 * 1024
    assert parse_size("4M") == 4 * 2**20 == 4_194_304
    assert parse_size("1g") == 2**30
    assert parse_size("1.5M") == 1_572_864
    for bad in ("", "4MB", "-1", "1.3k", "M"):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_values_are_parsed_by_the_field_type():
    assert parse_set("host_tokens=2M,8M").values == (2 * 2**20, 8 * 2**20)
    assert parse_set("host_tokens=2M,8M").spellings == ("2M", "8M")
    assert parse_set("layerwise-overlap=on,false").values == (True, False)  # dashes as in the TOML file
    assert parse_set("time_scale=1,2.5").values == (1.0, 2.5)
    assert parse_set("write_policy=write_back").values == ("write_back",)


@pytest.mark.parametrize("text, fragments", [
    ("hots_tokens=1M", ("unknown key 'hots_tokens'", "known: ", "host_tokens", "write_policy")),
    ("host_tokens=1x", ("host_tokens value '1x' must be a whole number",)),
    ("layerwise_overlap=maybe", ("must be true or false",)),
    ("time_scale=fast", ("must be a number",)),
    ("host_tokens=", ("no values for host_tokens",)),
    ("host_tokens=1M,,2M", ("empty value",)),
    ("host_tokens=1M,1024k", ("'1024k' repeats '1M'",)),
    ("host_tokens", ("expected KEY=V1,V2",)),
])
def test_bad_set_is_a_usage_error(text, fragments):
    with pytest.raises(ConfigError) as info:
        parse_set(text)
    assert info.value.exit_code == ExitCode.USAGE
    for f in fragments:
        assert f in info.value.one_line()
    if "unknown key" in fragments[0]:
        assert all(k in info.value.one_line() for k in CONFIG_KEYS)


def test_plan_is_the_product_named_by_what_varies():
    plan = plan_sweep(BASE, ["host_tokens=16k,64k", "write_policy=write_through,write_back", "seed=3"])
    assert [name for name, _ in plan.configs] == [
        "host_tokens=16k,write_policy=write_through", "host_tokens=16k,write_policy=write_back",
        "host_tokens=64k,write_policy=write_through", "host_tokens=64k,write_policy=write_back"]
    assert plan.varied_keys == ("host_tokens", "write_policy")
    last = plan.configs[-1][1]
    assert (last.host_tokens, last.write_policy, last.seed, last.model, last.device_tokens) == (
        65536, "write_back", 3, "tiny", 16384)
    assert plan_sweep(BASE, ["seed=1"]).configs[0][0] == "seed=1"  # nothing varies: named by all it set


def test_plan_refuses_before_any_replay():
    with pytest.raises(ConfigError, match="given twice"):
        plan_sweep(BASE, ["host_tokens=1M", "host-tokens=2M"])
    with pytest.raises(ConfigError, match="at least one --set"):
        plan_sweep(BASE, [])
    # A combination the engine refuses names itself and the reason.
    # A key --set gave is named as --set wrote it, not as an option never passed.
    with pytest.raises(ConfigError, match=r"combination host_tokens=16: host_tokens 16 is smaller than one page"):
        plan_sweep(BASE, ["host_tokens=16,64k", "page_size=64"])
    with pytest.raises(ConfigError, match="write_policy=write_back,wb': unknown write_policy 'wb'; known: write_back"):
        plan_sweep(BASE, ["write_policy=write_back,wb"])
