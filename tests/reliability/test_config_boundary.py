"""Issue 39, the config side: one test per bug of the hostile pass, each failing before the fix.
Every error is one line, its documented exit code (docs/contract.md §7), named where the value
was written (the option, or the --config file and key, or the profile and key), and leaves the
store as it was."""

from __future__ import annotations

import hashlib
import json

import pytest

from harness import SMALL, good_lines, line, runs, tierdiag, tierdiag_in_process, write_trace
from tierdiag.config.engine import CONFIG_SCHEMA, RELEASE_OFFERS, EngineConfig, load_config
from tierdiag.config.profile import CLOCK_PARAMS, PROFILE_FORMAT, load_profile, preset_clock, write_profile
from tierdiag.errors import ConfigError, ExitCode


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A store holding one complete run, and the trace it replayed (with load-backs: a host hit)."""
    root = tmp_path_factory.mktemp("store")
    trace = write_trace(root / "t.jsonl", [line(0, 2000, [1, 2, 3, 4]), line(10, 3000, [9, 8, 7, 6, 5, 11]),
                                           line(20, 2000, [1, 2, 3, 4])])
    db = root / "r.duckdb"
    assert tierdiag_in_process("replay", trace, "--db", db, *SMALL).code == 0
    return db, trace


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _refused(store, code, *args, fragments=(), process=False):
    """`replay` with `args` fails (one line, `code`) and the store is byte for byte as it was.
    The CLI runs in this process (`tierdiag_in_process`: the real entry point, its exit code and stderr)
    unless `process`: what is tested is the refusal and the store, not the process, and a
    process a refusal cost ~1 s of CPU. Each exit code keeps subprocess cases (`process=True`)."""
    db, trace = store
    before, listed = _digest(db), runs(db, process=process)
    err_line = (tierdiag if process else tierdiag_in_process)("replay", trace, "--db", db, *args).fails(code, *fragments)
    assert _digest(db) == before and runs(db, process=process) == listed  # no failed run, nothing changed
    return err_line


# --- 6. copy-kernel JSON profiles ------------------------------------------------------------------

@pytest.mark.parametrize("value", [0, -5e9, 1e-300, "fast", True, None, [9e9]])
def test_a_bad_json_profile_is_refused_before_the_run_exists(store, tmp_path, value):
    """It was read with float(): 0 divided by zero mid-replay (a failed run), a negative
    bandwidth replayed with exit 0, a string or a boolean crashed."""
    p = tmp_path / "profile.json"
    p.write_text(json.dumps({"h2d_bytes_per_s": value, "d2h_bytes_per_s": 9e9, "transfer_overhead_ns": 1000}))
    _refused(store, 3, *SMALL, "--profile", p, fragments=(f"--profile {p}: h2d_bytes_per_s", "bandwidth"))


def test_json_profile_inf_and_nan_are_refused(tmp_path):
    p = tmp_path / "profile.json"
    for text in ('{"h2d_bytes_per_s": Infinity, "d2h_bytes_per_s": 9e9, "transfer_overhead_ns": 1}',
                 '{"h2d_bytes_per_s": 9e9, "d2h_bytes_per_s": NaN, "transfer_overhead_ns": 1}',
                 '{"h2d_bytes_per_s": 9e9, "d2h_bytes_per_s": 9e9, "transfer_overhead_ns": 1e400}'):
        p.write_text(text)
        with pytest.raises(ConfigError, match="must be a finite") as exc:
            load_profile(p)
        assert exc.value.exit_code == ExitCode.BAD_INPUT


# --- 7. one check per release for every option -------------------------------------------------------

@pytest.mark.parametrize("policy", ["slru", "tlru"])
def test_an_eviction_policy_the_release_lacks_is_refused(store, policy):
    """SGLang 0.5.9's RadixCache.__init__ switch has lru, lfu, fifo, mru, filo and priority;
    SLRUStrategy and TLRUStrategy came after (0.5.23's get_eviction_strategy)."""
    _refused(store, 2, *SMALL, "--sglang", "0.5.9", "--eviction-policy", policy,
             fragments=(f"--eviction-policy {policy} is not in SGLang 0.5.9", "use --sglang 0.5.23"))


def test_each_release_declares_what_it_offers():
    for release, offers in RELEASE_OFFERS.items():
        for key, names in offers.items():
            assert set(names) <= set(CONFIG_SCHEMA.fields[key].choices), (release, key)
            for name in CONFIG_SCHEMA.fields[key].choices:
                kw = {key: name, "sglang_rules": release}
                if name in names:
                    EngineConfig(**kw)
                else:
                    with pytest.raises(ConfigError, match=f"is not in SGLang {release}"):
                        EngineConfig(**kw)


def test_a_release_mismatch_written_in_a_config_file_is_exit_3(store, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('sglang_rules = "0.5.9"\neviction_policy = "slru"\n')
    line_ = _refused(store, 3, *SMALL, "--config", cfg, process=True,  # exit 3 through a real process
                     fragments=(f"--config {cfg}: eviction_policy slru is not in SGLang 0.5.9",))
    assert "--sglang" not in line_.split("(use")[0]


# --- 12. bounds for every numeric key ---------------------------------------------------------------

def test_router_eviction_interval_past_its_bound_is_refused(store, tmp_path):
    """1e300 s passed `>= 0` and crashed the replay turning it into ns."""
    cfg = tmp_path / "c.toml"
    cfg.write_text('router = "cache_aware"\ndp = 2\nrouter_eviction_interval_s = 1e300\n')
    _refused(store, 3, *SMALL, "--config", cfg,
             fragments=(f"--config {cfg}: router_eviction_interval_s 1e+300 must be in [0, 1e+09]",))


def test_every_numeric_key_has_a_finite_upper_bound():
    for key, spec in CONFIG_SCHEMA.fields.items():
        if spec.kind in (int, float) and spec.choices is None:
            assert spec.lo is not None and spec.hi is not None and spec.hi < float("inf"), key


# --- 13. fitted profiles with absurd finite values --------------------------------------------------

@pytest.mark.parametrize("key", ["prefill_ns_per_token", "decode_step_ns", "prefill_ns_per_token_pair",
                                 "batch_overhead_ns", "decode_ns_per_context_token", "transfer_overhead_ns"])
def test_a_fitted_profile_with_absurd_times_is_refused_before_the_run(store, tmp_path, key):
    clock = preset_clock("tiny", "cpu")
    clock[key] = 1e300
    p = write_profile(tmp_path / "p.toml", model="tiny", gpu="cpu", clock=clock, fit={})
    _refused(store, 3, "--device-tokens", "4096", "--profile", p,
             fragments=(f"--profile {p}: clock.{key} 1e+300 must be a time in ns in [0, ",))


def test_every_presets_clock_is_inside_the_bounds():
    """calibrate keeps a preset's value where the fit cannot say: a replay must take it."""
    from tierdiag.config.presets import GPUS, MODELS
    from tierdiag.config.profile import CLOCK_SCHEMA

    for model in MODELS:
        for gpu in GPUS:
            CLOCK_SCHEMA.convert(preset_clock(model, gpu))


def test_the_bounds_keep_the_longest_request_under_2_to_the_60_ns():
    """One operation on a 2^24-token request, each parameter at its bound, against the clock's
    2^62 ns after the last arrival (the claim of CLOCK_BOUNDS' comment)."""
    from tierdiag.config.presets import MODELS
    from tierdiag.config.profile import CLOCK_SCHEMA

    hi = {k: f.hi for k, f in CLOCK_SCHEMA.fields.items()}
    n = 2**24
    prefill = hi["prefill_ns_per_token"] * n + hi["prefill_ns_per_token_pair"] * n * (n + n / 2) \
        + hi["prefill_floor_ns"] + hi["batch_overhead_ns"]
    decode = hi["decode_step_ns"] + hi["decode_ns_per_context_token"] * n
    kv = max(m.kv_bytes_per_token for m in MODELS.values())
    copy = hi["transfer_overhead_ns"] + n * kv / CLOCK_SCHEMA.fields["h2d_bytes_per_s"].lo * 1e9
    assert max(prefill, decode, copy) < 2**60


# --- 15. NaN / inf in a --config file ----------------------------------------------------------------

@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "0.0", "1.5"])
def test_mem_fraction_static_out_of_range_names_the_file_and_key(store, tmp_path, text):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"mem_fraction_static = {text}\n")
    _refused(store, 3, "--config", cfg, fragments=(f"--config {cfg}: mem_fraction_static", "(0, 1]"))


# --- 17. the file's errors name the file and key, never an option not passed ----------------------

@pytest.mark.parametrize("text, key", [('sglang_rules = "0.4"\n', "sglang_rules"),
                                       ("max_context_tokens = 0\n", "max_context_tokens"),
                                       ("block_size = 100\n", "block_size"),
                                       ('eviction_policy = "lru"\ntlru_threshold = 5\n', "tlru_threshold")])
def test_a_bad_config_value_is_exit_3_naming_file_and_key(store, tmp_path, text, key):
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    err_line = _refused(store, 3, *SMALL, "--config", cfg, fragments=(f"--config {cfg}: ", key))
    assert "--sglang" not in err_line and "--max-context" not in err_line and "--block-size" not in err_line


def test_the_same_value_on_the_command_line_is_exit_2_naming_the_option(store):
    _refused(store, 2, *SMALL, "--max-context", "0", fragments=("--max-context 0 must be at least 1",),
             process=True)  # exit 2 through a real process
    _refused(store, 2, *SMALL, "--sglang", "0.4", fragments=("--sglang",))


def test_a_conflict_of_file_and_option_names_each_as_it_was_given(store, tmp_path):
    """A check of two keys, one from the file and one from the command line: the file is bad
    input with the option (exit 3), each key named where it was written."""
    cfg = tmp_path / "c.toml"
    cfg.write_text("page_size = 64\n")
    _refused(store, 3, *SMALL, "--config", cfg, "--block-size", "100",
             fragments=(f"--config {cfg}: --block-size 100 must be a positive multiple of page_size 64",))


# --- 18. the twin's --dp from its import ------------------------------------------------------------

def test_a_twin_with_more_ranks_than_a_replay_takes_says_where_they_came_from(tmp_path):
    from tests.importers.sglang_export import record, write_export
    from tierdiag.importers.load import import_sglang

    records = [record(f"r{i}", prompt=64, tokens=list(range(i, i + 64)), arrival_s=float(i), dp_rank=i)
               for i in range(300)]
    write_export(tmp_path / "export", "20251201_09", records)
    db, twin = tmp_path / "obs.duckdb", tmp_path / "twin.jsonl"
    import_sglang([tmp_path / "export"], db=db, trace_out=twin)
    before = _digest(db)
    err_line = tierdiag_in_process("replay", twin, "--db", db).fails(
        2, "--dp 300 was taken from the imported run whose --trace-out this trace is (its export named 300 ranks)",
        "must be an integer from 1 to 256", "pass --dp")
    assert "--dp 300 must be" not in err_line and _digest(db) == before


# --- 20. a profile's model of the wrong type ----------------------------------------------------------

@pytest.mark.parametrize("value", ['["llama3-8b"]', "{ name = 'x' }", "8", "true", '"gpt5"'])
def test_a_profile_model_of_the_wrong_type_names_the_profile_and_key(store, tmp_path, value):
    """It was "bad configuration: unhashable type: 'list'", naming neither."""
    p = write_profile(tmp_path / "p.toml", model="tiny", gpu="cpu", clock=preset_clock("tiny", "cpu"), fit={})
    p.write_text(p.read_text().replace('model = "tiny"', f"model = {value}"))
    err_line = _refused(store, 3, "--device-tokens", "4096", "--profile", p, fragments=(f"--profile {p}: ", "model"))
    assert "unhashable" not in err_line
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'profile = "{p}"\ndevice_tokens = 4096\n')
    _refused(store, 3, "--config", cfg, fragments=(f"--config {cfg}: profile {p}: ", "model"))


def test_profile_errors_from_either_source():
    with pytest.raises(ConfigError) as exc:
        load_config(None, {"profile": "/nonexistent/p.toml"})
    assert exc.value.exit_code == ExitCode.USAGE and exc.value.message == "--profile /nonexistent/p.toml: no such file"


# --- 22. --host-memory past int64 -----------------------------------------------------------------------

@pytest.mark.parametrize("value", ["99999999999T", "9223372036854775808", "0", "-1", "nan", "1e3"])
def test_advise_host_memory_out_of_range_is_exit_2(store, value):
    db, _ = store
    before = _digest(db)
    cmd = tierdiag if value == "99999999999T" else tierdiag_in_process  # one through a real process
    cmd("advise", "--db", db, "--host-memory", value).fails(2, "--host-memory", repr(value))
    assert _digest(db) == before


def test_clock_params_are_declared_once():
    from tierdiag.config.profile import CLOCK_BOUNDS

    assert list(CLOCK_BOUNDS) == list(CLOCK_PARAMS) and PROFILE_FORMAT


# --- the contract's tables are the declarations ------------------------------------------------------

def _block(text: str, name: str) -> list[str]:
    return text.split(f"<!-- {name}:begin -->\n", 1)[1].split(f"\n<!-- {name}:end -->", 1)[0].splitlines()


def test_the_contract_tables_are_the_declarations():
    """docs/contract.md holds the tables markdown_table writes from the declarations; if this
    fails, paste the lines it prints there."""
    import dataclasses
    from pathlib import Path

    from tierdiag.config.profile import CLOCK_SCHEMA
    from tierdiag.config.schema import markdown_table

    doc = (Path(__file__).resolve().parents[2] / "docs" / "contract.md").read_text()
    want = markdown_table(CONFIG_SCHEMA, default={f.name: f.default for f in dataclasses.fields(EngineConfig)})
    assert _block(doc, "config-keys") == want, "\n".join(want)
    want = markdown_table(CLOCK_SCHEMA, prefix="clock.", options=False)
    assert _block(doc, "clock-keys") == want, "\n".join(want)
