"""Bad configuration: rejected before any work (no database file appears), naming the option
or the --config file and key; unknown names list the known ones."""

from __future__ import annotations

import pytest

from harness import good_lines, line, sql, write_trace

from tests.support.cli import tierdiag_in_process
from tierdiag.config.engine import EVICTION_POLICIES, PREFETCH_POLICIES, SCHEDULE_POLICIES, WRITE_POLICIES
from tierdiag.config.presets import GPUS, MODELS


@pytest.fixture
def trace(tmp_path):
    return write_trace(tmp_path / "t.jsonl", good_lines(5))


@pytest.mark.parametrize(("option", "known"), [
    ("--model", MODELS), ("--gpu", GPUS), ("--write-policy", WRITE_POLICIES),
    ("--eviction-policy", EVICTION_POLICIES), ("--prefetch-policy", PREFETCH_POLICIES),
    ("--schedule-policy", SCHEDULE_POLICIES),
    ("--timing", ("modelled", "measured")), ("--verify", ("all", "sample", "off")),
])
def test_unknown_name_lists_the_known_ones(tmp_path, trace, option, known):
    db = tmp_path / "r.duckdb"
    line = tierdiag_in_process("replay", trace, "--db", db, option, "nope").fails(2, option, "'nope'", "known:")
    assert line.endswith(", ".join(sorted(known)))
    assert not db.exists()


@pytest.mark.parametrize(("args", "fragments"), [
    (("--host-tokens", "10"), ("--host-tokens 10", "smaller than one page")),
    (("--device-tokens", "64"), ("--device-tokens 64", "smaller than two pages")),
    (("--device-tokens", "-1"), ("--device-tokens -1",)),
    (("--page-size", "48"), ("--page-size 48", "power of two")),
    (("--page-size", "0"), ("--page-size 0", "power of two")),
    (("--page-size", "1024"), ("--block-size 512", "multiple of --page-size 1024")),
    (("--storage-tokens", "10"), ("--storage-tokens 10", "at least one page")),
    (("--max-prefill-tokens", "8"), ("--max-prefill-tokens 8",)),
    (("--time-scale", "0"), ("--time-scale",)),
    (("--time-scale", "inf"), ("--time-scale",)),
    (("--load-back-threshold", "-1"), ("--load-back-threshold -1",)),
    (("--device-tokens", str(10**13)), ("--device-tokens/--host-tokens", "memory")),
])
def test_impossible_sizes_are_rejected_up_front(tmp_path, trace, args, fragments):
    db = tmp_path / "r.duckdb"
    # --model/--gpu first: the tiny model leaves the sizes under test as the only problem.
    tierdiag_in_process("replay", trace, "--db", db, "--model", "tiny", "--gpu", "cpu", *args).fails(2, *fragments)
    assert not db.exists()


def test_unparsable_option_value_is_a_usage_error(tmp_path, trace):
    tierdiag_in_process("replay", trace, "--db", tmp_path / "r.duckdb", "--device-tokens", "lots").fails(
        2, "--device-tokens", "replay --help")


def test_unknown_option_and_command(tmp_path, trace):
    tierdiag_in_process("replay", trace, "--devise-tokens", "4096").fails(2, "No such option", "--devise-tokens")
    tierdiag_in_process("replya", trace).fails(2, "No such command", "replya")


@pytest.mark.parametrize(("text", "fragments"), [
    ('model = "tiny"\ngpu = \n', ("not valid TOML", "line 2")),
    ('model = "tiny"\ngpuu = "cpu"\n', ("unknown key 'gpuu'", "known:", "eviction_policy")),
    ('[replay]\nmodel = "tiny"\n[report]\nopen = true\n', ("unknown key 'report'", "[replay]")),
    ('device_tokens = "lots"\n', ("device_tokens 'lots' must be an integer", "(not a string)")),
    ('page_size = 64.5\n', ("page_size 64.5 must be an integer",)),
    ('page_size = true\n', ("page_size True must be an integer", "(not a boolean)")),
    ('layerwise_overlap = 1\n', ("layerwise_overlap 1 must be true or false",)),
    (b"\xff\xfe binary", ("not UTF-8",)),
])
def test_bad_config_file(tmp_path, trace, text, fragments):
    cfg = tmp_path / "c.toml"
    if isinstance(text, bytes):
        cfg.write_bytes(text)
    else:
        cfg.write_text(text)
    db = tmp_path / "r.duckdb"
    tierdiag_in_process("replay", trace, "--db", db, "--config", cfg).fails(3, f"--config {cfg}", *fragments)
    assert not db.exists()


def test_config_file_missing_or_a_folder(tmp_path, trace):
    tierdiag_in_process("replay", trace, "--config", tmp_path / "none.toml").fails(3, "none.toml", "no such file")
    tierdiag_in_process("replay", trace, "--config", tmp_path).fails(3, str(tmp_path), "folder")


def test_config_file_values_are_validated_like_options(tmp_path, trace):
    """Validated like options, but a bad value written in the file is a bad --config file: exit 3
    naming the file and its key (README), while the same value on the command line is exit 2
    naming the option (issue 39, item 17: the file's errors named options never passed)."""
    cfg = tmp_path / "c.toml"
    cfg.write_text('[replay]\nmodel = "tiny"\ngpu = "cpu"\neviction-policy = "arc"\n')
    line = tierdiag_in_process("replay", trace, "--config", cfg).fails(3, f"--config {cfg}", "eviction_policy 'arc'",
                                                            "known: fifo, filo, lfu, lru, mru, priority, slru, tlru")
    assert "--eviction-policy" not in line
    cfg.write_text('[replay]\nmodel = "tiny"\ngpu = "cpu"\npage_size = 3\n')
    line = tierdiag_in_process("replay", trace, "--config", cfg).fails(3, f"--config {cfg}", "page_size 3",
                                                                      "power of two")
    assert "--page-size" not in line
    # Given on the command line, the option is to blame even with a --config beside it.
    tierdiag_in_process("replay", trace, "--config", cfg, "--page-size", "5").fails(2, "--page-size 5")


def test_a_good_config_file_and_options_combine(tmp_path, trace):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[replay]\nmodel = "tiny"\ngpu = "cpu"\ndevice_tokens = 8192\ntime_scale = 2\n')
    db = tmp_path / "r.duckdb"
    r = tierdiag_in_process("replay", trace, "--db", db, "--config", cfg, "--device-tokens", "4096", "--json")
    assert r.json()["num_requests"] == 5
    config = tierdiag_in_process("runs", "--db", db, "--json").json()[0]["config"]
    assert (config["device_tokens"], config["time_scale"], config["model"]) == (4096, 2.0, "tiny")


def test_request_larger_than_the_device_pool_is_rejected_not_waited_on(tmp_path):
    """The pool holds 256 tokens; one request needs 1,000. It is rejected with a reason in the
    requests table, and the requests around it are served (each leaves room for the page of
    admission overhead SGLang 0.5.23, the default rule set, counts a request)."""
    trace = write_trace(tmp_path / "t.jsonl", [line(0, 100, [0]), line(50, 1000, [7, 8]), line(100, 150, [0]),
                                               line(150, 100, [0])])
    db = tmp_path / "r.duckdb"
    r = tierdiag_in_process("replay", trace, "--db", db, "--model", "tiny", "--gpu", "cpu", "--device-tokens", "256",
                 "--page-size", "64", "--json")
    summary = r.json()
    assert (summary["num_requests"], summary["num_rejected"]) == (3, 1)
    rows = dict(sql(db, "SELECT req_id, coalesce(reject_reason, status) FROM requests"))
    # input + output (PrefillAdder.add_one_req's total_tokens, issue 43; it said 16 pages before)
    assert rows.pop("2") == ("needs 1008 tokens of device memory and 64 of admission overhead (SGLang 0.5.23: "
                             "a page a request); the pool holds 256")
    assert set(rows.values()) == {"finished"}


# --- numbers past what the engine and the store hold (issue 32, item 10) -------------------------

@pytest.mark.parametrize(("text", "fragments"), [
    ("seed = 99999999999999999999\n", (": seed 99999999999999999999", "out of range")),
    ("max_prefill_tokens = 9223372036854775808\n", (": max_prefill_tokens", "out of range")),
    ("time_scale = 1e30\n", (": time_scale 1e+30", "must be in [1e-09, 1e+06]")),
    ("time_scale = 1e-12\n", (": time_scale 1e-12", "must be in")),
])
@pytest.mark.parametrize("command", ["replay", "sweep"])
def test_a_config_value_out_of_range_is_a_bad_config_file(tmp_path, trace, text, fragments, command):
    """Exit 3 like every other bad value in the file (it was exit 2 for time_scale, and accepted
    for integers past int64)."""
    cfg = tmp_path / "c.toml"
    cfg.write_text('model = "tiny"\ngpu = "cpu"\n' + text)
    db = tmp_path / "r.duckdb"
    extra = ("--set", "seed=1,2") if command == "sweep" else ()
    tierdiag_in_process(command, trace, "--db", db, "--config", cfg, *extra).fails(3, f"--config {cfg}", *fragments)
    assert not db.exists()


@pytest.mark.parametrize(("value", "fragments"), [
    ("seed=99999999999999999999", ("--set 'seed=99999999999999999999': seed 99999999999999999999", "out of range")),
    ("max_prefill_tokens=9999999T", ("max_prefill_tokens 10995115178248372224", "out of range")),
    ("time_scale=1e30,1", ("--set 'time_scale=1e30,1': time_scale 1e+30 must be in [1e-09, 1e+06]",)),
    ("time_scale=1,nan", ("--set 'time_scale=1,nan': time_scale nan must be a finite number",)),
])
def test_sweep_set_values_out_of_range_are_refused_before_any_replay(tmp_path, trace, value, fragments):
    db = tmp_path / "r.duckdb"
    tierdiag_in_process("sweep", trace, "--db", db, "--set", value, "--set", "model=tiny", "--set", "gpu=cpu").fails(
        2, *fragments)
    assert not db.exists()


def test_replay_time_scale_out_of_range_stays_a_usage_error(tmp_path, trace):
    tierdiag_in_process("replay", trace, "--db", tmp_path / "r.duckdb", "--time-scale", "1e30").fails(
        2, "--time-scale 1e+30 must be in [1e-09, 1e+06]")
