"""Property tests of the config boundary (issue 39): generated hostile values for every config
key, every clock key of both kinds of profile, every numeric replay option, `--set` values and
`advise --host-memory`. Each one is taken or refused; refused means one `tierdiag:` line on
stderr, no traceback, the documented exit code (docs/contract.md §7: 2 for what the command
line says, 3 for what a file says), the file and key or the option named, and the store that
existed before left byte for byte as it was (no failed run added).

The CLI runs in this process (`tierdiag_in_process`: the real entry point, `tierdiag.cli.exits.run`,
with its stdout and stderr captured), so a bounded number of examples costs a second or two each.
"""

from __future__ import annotations

import hashlib
import json
import math

import pytest
import tomli_w
from hypothesis import HealthCheck, assume, example, given, settings, strategies as st

from harness import SMALL, good_lines, tierdiag_in_process, write_trace
from tierdiag.config.engine import CONFIG_KEYS, CONFIG_SCHEMA, load_config
from tierdiag.config.profile import CLOCK_PARAMS, PROFILE_FORMAT, load_profile, preset_clock
from tierdiag.config.releases import switched_back_names
from tierdiag.errors import ConfigError, ExitCode

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# What a TOML file (or JSON) can hold that a config key may not take.
HOSTILE = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, 10**400, -10**400, 2**63, -2**63 - 1, 2**62, True, False,
                     "x", "", "nan", "1e9", [1], [], {"a": 1}, -1, 0, 1, 1e-300, 1e300, -1e300, 0.5, 3, 4096]),
    st.integers(), st.floats(), st.text(max_size=6), st.lists(st.integers(), max_size=2))
# Command-line text no numeric replay option takes (a --set of a config-only key may).
BAD_NUMBER_TEXT = st.sampled_from(["nan", "inf", "-inf", "1e400", "1" + "0" * 400, "-1", "1e300", "1e-300",
                                   "true", "x", "", "[1]", "9223372036854775808", "-9223372036854775809",
                                   "0x10", "1,5", " ", "∞"])
NUMERIC_OPTIONS = sorted(f.option for f in CONFIG_SCHEMA.fields.values()
                         if f.option and f.kind in (int, float) and f.choices is None)
NUMERIC_KEYS = sorted(k for k, f in CONFIG_SCHEMA.fields.items() if f.kind in (int, float) and f.choices is None)


def refused(code: int, err: str, want: int, *fragments: str) -> str:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tierdiag: error: "), err
    assert code == want, (code, err)
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A store with one complete run; its trace; a folder for each example's files."""
    root = tmp_path_factory.mktemp("props")
    trace = write_trace(root / "t.jsonl", good_lines(4))
    db = root / "r.duckdb"
    assert tierdiag_in_process("replay", trace, "--db", db, *SMALL).code == 0
    return db, trace, root


class Unchanged:
    """The store's bytes before and after."""

    def __init__(self, db):
        self.db, self.before = db, hashlib.sha256(db.read_bytes()).hexdigest()

    def check(self):
        assert hashlib.sha256(self.db.read_bytes()).hexdigest() == self.before, "the store changed"


def _write_toml(path, table: dict) -> None:
    path.write_text(tomli_w.dumps(table), encoding="utf-8")


# --- configs -----------------------------------------------------------------------------------------

@SETTINGS
@given(key=st.sampled_from(CONFIG_KEYS), value=HOSTILE)
@example(key="router_cache_threshold", value=10**400)  # found here: math.isfinite raised OverflowError
@example(key="mem_fraction_static", value=math.nan)  # issue 39, item 15
@example(key="sglang_switched_back", value="")  # "" is no rule switched back: read back as None
def test_every_config_key_takes_or_names_file_and_key(store, key, value):
    """In the boundary itself: a value is taken as written (sglang_switched_back: in its one
    spelling, the names joined by ',' and None for none), or refused (exit 3) naming the file
    and the key, in one line."""
    _, _, root = store
    cfg = root / "c.toml"
    _write_toml(cfg, {key: value})
    try:
        got = load_config(cfg, {})
    except ConfigError as exc:
        line = exc.one_line()
        assert exc.exit_code == ExitCode.BAD_INPUT, line
        assert line.startswith(f"--config {cfg}: ") and key in line and "\n" not in line, line
        # short enough to read, long enough to list the known names (23 rule names with a temp path)
        assert len(line) < 900, line
        return
    if key == "sglang_switched_back":
        value = ",".join(switched_back_names(value)) or None
    assert getattr(got, key) == value  # taken as written (every float key is bounded: never NaN)


@FEW
@given(key=st.sampled_from(CONFIG_KEYS), value=HOSTILE)
def test_a_refused_config_value_is_one_line_exit_3_and_the_store_unchanged(store, key, value):
    db, trace, root = store
    cfg = root / "c2.toml"
    _write_toml(cfg, {key: value})
    try:
        load_config(cfg, {})
        assume(False)  # taken: a replay would run (tested everywhere else)
    except ConfigError:
        pass
    kept = Unchanged(db)
    code, _, err = tierdiag_in_process("replay", trace, "--db", db, "--config", cfg)
    refused(code, err, 3, f"--config {cfg}: ", key)
    kept.check()


# --- numeric options ---------------------------------------------------------------------------------

@FEW
@given(option=st.sampled_from(NUMERIC_OPTIONS), text=BAD_NUMBER_TEXT)
def test_a_bad_numeric_option_is_one_line_exit_2_naming_it(store, option, text):
    db, trace, _ = store
    kept = Unchanged(db)
    code, _, err = tierdiag_in_process("replay", trace, "--db", db, *SMALL, f"{option}={text}")
    refused(code, err, 2, option)
    kept.check()


# --- --set values and --host-memory ------------------------------------------------------------------

@FEW
@given(key=st.sampled_from(NUMERIC_KEYS), text=BAD_NUMBER_TEXT.filter(lambda t: "," not in t and t.strip()))
def test_a_bad_set_value_is_one_line_exit_2_before_any_replay(store, key, text):
    from tierdiag.config.engine import EngineConfig
    from tierdiag.config.sweep_spec import plan_sweep

    db, trace, _ = store
    try:  # a value some key takes (1e-300 for a ratio that must be above 0): a sweep would run
        plan_sweep(EngineConfig(), [f"{key}={text}"])
        assume(False)
    except ConfigError:
        pass
    kept = Unchanged(db)
    code, _, err = tierdiag_in_process("sweep", trace, "--db", db, "--set", f"{key}={text}")
    refused(code, err, 2, "--set", key)
    kept.check()


@FEW
@given(text=st.one_of(BAD_NUMBER_TEXT, st.sampled_from(["99999999999T", "8192P", "0", "0k", "1.0000001k"])))
def test_a_bad_host_memory_is_one_line_exit_2(store, text):
    db, _, _ = store
    kept = Unchanged(db)
    code, _, err = tierdiag_in_process("advise", "--db", db, f"--host-memory={text}")
    refused(code, err, 2, "--host-memory")
    kept.check()


# --- profiles ------------------------------------------------------------------------------------------

PROFILE_KEYS = [("clock", k) for k in CLOCK_PARAMS] + [(None, "model"), (None, "gpu")]


def _fitted(root, where, key, value):
    doc = {"format": PROFILE_FORMAT, "model": "tiny", "gpu": "cpu", "clock": preset_clock("tiny", "cpu"), "fit": {}}
    (doc[where] if where else doc)[key] = value
    p = root / "p.toml"
    _write_toml(p, doc)
    return p


def _copy_kernels(root, key, value):
    doc = {"h2d_bytes_per_s": 9e9, "d2h_bytes_per_s": 8e9, "transfer_overhead_ns": 1000, key: value}
    p = root / "p.json"
    p.write_text(json.dumps(doc))  # NaN and Infinity as JSON's readers write them
    return p


def _profile_taken_or_named(p, key, value) -> bool:
    try:
        prof = load_profile(p)
    except ConfigError as exc:
        line = exc.one_line()
        assert exc.exit_code == ExitCode.BAD_INPUT, line
        assert line.startswith(f"--profile {p}: ") and key in line and "\n" not in line, line
        return False
    if key in prof.clock:
        assert prof.clock[key] == float(value)
    return True


@SETTINGS
@given(place=st.sampled_from(PROFILE_KEYS), value=HOSTILE)
@example(place=("clock", "prefill_ns_per_token"), value=10**400)
@example(place=(None, "model"), value=["llama3-8b"])  # issue 39, item 20
def test_every_fitted_profile_key_takes_or_names_the_profile_and_key(store, place, value):
    where, key = place
    _profile_taken_or_named(_fitted(store[2], where, key, value), key, value)


@SETTINGS
@given(key=st.sampled_from(["h2d_bytes_per_s", "d2h_bytes_per_s", "transfer_overhead_ns"]), value=HOSTILE)
@example(key="h2d_bytes_per_s", value=0)  # issue 39, item 6
def test_every_copy_kernel_profile_key_takes_or_names_the_profile_and_key(store, key, value):
    _profile_taken_or_named(_copy_kernels(store[2], key, value), key, value)


@FEW
@given(kind=st.sampled_from(["toml", "json"]), n=st.integers(0, 10), value=HOSTILE)
def test_a_refused_profile_is_one_line_exit_3_and_the_store_unchanged(store, kind, n, value):
    db, trace, root = store
    if kind == "toml":
        where, key = PROFILE_KEYS[n]
        p = _fitted(root, where, key, value)
    else:
        key = ("h2d_bytes_per_s", "d2h_bytes_per_s", "transfer_overhead_ns")[n % 3]
        p = _copy_kernels(root, key, value)
    try:
        load_profile(p)
        assume(False)
    except ConfigError:
        pass
    kept = Unchanged(db)
    code, _, err = tierdiag_in_process("replay", trace, "--db", db, "--device-tokens", "4096", "--profile", p)
    refused(code, err, 3, f"--profile {p}: ", key)
    kept.check()
