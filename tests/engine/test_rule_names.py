"""Rules switched back one at a time (`sglang_switched_back`, config/releases.py): the names
cover every field the releases differ in, a switched-back rule set takes exactly that rule's
fields from the release before, and with every rule switched back 0.5.23 replays 0.5.9's rows
exactly (so each single switch-back isolates a rule, and nothing the releases differ in hides
outside the names)."""

from __future__ import annotations

import json
import string
from dataclasses import fields
from pathlib import Path

import duckdb
import pytest
from hypothesis import given, settings, strategies as st

from tests.support.cli import completed_in_process, invoke, one_line_error
from tierdiag.config.engine import EngineConfig, load_config
from tierdiag.config.releases import NOT_RULES, RELEASES, RULE_NAMES, switched_back_names
from tierdiag.engine.rules import (RULE_SETS, RuleSet, config_rules, differing_fields, differing_rules,
                                   switched_back, unnamed_fields)
from tierdiag.errors import ConfigError, ConfigFileError

OLD, NEW = "0.5.9", "0.5.23"
DEMO = Path(__file__).resolve().parents[2] / "tierdiag" / "trace" / "samples" / "demo.jsonl"


def test_every_differing_field_has_a_rule_name_and_every_name_a_field():
    """A field added to RuleSet that differs between the releases needs a name in
    config/releases.py RULE_NAMES (else the upgrade view can only list it as not isolated)."""
    rule_fields = {f.name for f in fields(RuleSet)}
    named = [f for r in RULE_NAMES.values() for f in r.fields]
    assert len(named) == len(set(named)), "a field belongs to one rule"
    assert set(named) <= rule_fields - set(NOT_RULES)
    assert unnamed_fields(OLD, NEW) == ()
    assert set(differing_fields(OLD, NEW)) == {f for n in differing_rules(OLD, NEW) for f in RULE_NAMES[n].fields}
    assert RELEASES == tuple(RULE_SETS)


@pytest.mark.parametrize("rule", list(RULE_NAMES))
def test_a_switched_back_rule_takes_its_fields_from_the_release_before_and_nothing_else(rule):
    mixed = config_rules(EngineConfig(sglang_switched_back=rule))
    own = set(RULE_NAMES[rule].fields)
    for f in fields(RuleSet):
        expected = RULE_SETS[OLD if f.name in own else NEW]
        assert getattr(mixed, f.name) == getattr(expected, f.name), f.name
    assert mixed.version == NEW and mixed.vocabulary == RULE_SETS[NEW].vocabulary
    assert switched_back(NEW, ()) is RULE_SETS[NEW]


def test_the_config_read_rules_follow_the_switch_back():
    """prefetch_policy_default and host_layout are read by the config (resolved_prefetch_policy,
    to_json), not the engine: switched back, they resolve to 0.5.9's."""
    assert EngineConfig(sglang_switched_back="prefetch_policy_default").resolved_prefetch_policy() == "best_effort"
    assert EngineConfig().resolved_prefetch_policy() == "timeout"
    # an explicit policy is the user's, whichever release's default is switched back
    assert EngineConfig(prefetch_policy="wait_complete",
                        sglang_switched_back="prefetch_policy_default").resolved_prefetch_policy() == "wait_complete"
    assert EngineConfig(sglang_switched_back="host_layout").to_json()["host_layout"] == "layer_first"
    assert EngineConfig(sglang_switched_back=" host_layout , eviction_amount").sglang_switched_back == \
        "host_layout,eviction_amount"
    assert EngineConfig(sglang_switched_back="").sglang_switched_back is None


def test_the_oldest_release_has_nothing_to_switch_back_to():
    with pytest.raises(ConfigError, match="oldest"):
        EngineConfig(sglang_rules=OLD, sglang_switched_back="eviction_amount")


_NAME_PIECES = st.sampled_from(list(RULE_NAMES) + ["", " ", "nope", "eviction", "EVICTION_AMOUNT", "\x1b[31m", "\n",
                                                   "[bold]x[/]", "é", "0" * 300])


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.lists(_NAME_PIECES, max_size=5).map(",".join),
                 st.text(alphabet=string.printable + "\x00\u202e", max_size=200)))
def test_hostile_switched_back_values_are_one_line_errors_or_distinct_known_names(text):
    try:
        names = switched_back_names(text)
    except ConfigError as exc:
        assert "\n" not in exc.one_line() and "\x1b" not in exc.one_line() and len(exc.one_line()) < 1000
        with pytest.raises(ConfigError):
            EngineConfig(sglang_switched_back=text)
        return
    assert len(set(names)) == len(names) and set(names) <= set(RULE_NAMES)
    assert EngineConfig(sglang_switched_back=text).sglang_switched_back == (",".join(names) or None)


@settings(max_examples=25, deadline=None)
@given(st.one_of(st.text(max_size=60), st.integers(), st.booleans(), st.lists(st.sampled_from(list(RULE_NAMES)))))
def test_hostile_switched_back_values_in_a_config_file_name_the_file(tmp_path_factory, value):
    """From --config: a bad value is exit 3 naming the file (ConfigFileError), never a traceback."""
    import tomli_w

    path = tmp_path_factory.mktemp("cfg") / "c.toml"
    path.write_text(tomli_w.dumps({"sglang_switched_back": value}))
    try:
        cfg = load_config(path, {})
    except ConfigFileError as exc:
        assert str(path) in exc.message and "\n" not in exc.one_line()
        return
    assert isinstance(value, str)
    assert cfg.sglang_switched_back == (",".join(switched_back_names(value)) or None)


# --- every rule switched back: 0.5.9's rows ---------------------------------------------------------

TABLES = ("requests", "evictions", "request_evictions", "batches", "transfers", "pool_samples")
MEASURED = ("run_id", "wall_ns", "data_plane_bytes", "verified")


def _differing_rows(db: Path, a: str, b: str) -> dict[str, int]:
    """Rows of each event table in one run and not the other (both ways, as multisets), every
    column but the run id and what is measured rather than modelled (benchmarks/compare_rows.py)."""
    con = duckdb.connect(str(db), read_only=True)
    out = {}
    for t in TABLES:
        cols = ", ".join(r[0] for r in con.execute(f"DESCRIBE {t}").fetchall() if r[0] not in MEASURED)
        q = f"SELECT {cols} FROM {t} WHERE run_id = ?"
        n = con.execute(f"SELECT count(*) FROM ({q} EXCEPT ALL {q})", [a, b]).fetchone()[0]
        n += con.execute(f"SELECT count(*) FROM ({q} EXCEPT ALL {q})", [b, a]).fetchone()[0]
        out[t] = n
    con.close()
    return out


@pytest.mark.parametrize("options", [
    ("--device-tokens", "16384", "--host-tokens", "32768"),
    ("--device-tokens", "16384", "--host-tokens", "32768", "--write-policy", "write_back", "--schedule-policy", "lpm"),
    ("--device-tokens", "16384", "--host-tokens", "16384", "--storage-tokens", "400000", "--prefetch-threshold", "64",
     "--write-policy", "write_back"),
    ("--device-tokens", "8192", "--host-tokens", "8192", "--storage-tokens", "1000000", "--prefetch-threshold", "64",
     "--write-policy", "write_through_selective", "--schedule-policy", "lpm"),
], ids=["small-pools", "write_back-lpm", "storage-write_back", "storage-selective-lpm"])
def test_every_rule_switched_back_replays_the_older_release_exactly(tmp_path, options):
    db = tmp_path / "r.duckdb"
    back = ",".join(differing_rules(OLD, NEW))
    (tmp_path / "all.toml").write_text(f'sglang_switched_back = "{back}"\n')
    old = invoke("replay", DEMO, "--db", db, "--sglang", OLD, *options, "--storage-dir", tmp_path / "s1", "--json")
    mixed = invoke("replay", DEMO, "--db", db, "--config", tmp_path / "all.toml", *options,
                   "--storage-dir", tmp_path / "s2", "--json")
    a, b = json.loads(old[old.index("{"):])["run_id"], json.loads(mixed[mixed.index("{"):])["run_id"]
    assert _differing_rows(db, a, b) == {t: 0 for t in TABLES}
    plain_new = invoke("replay", DEMO, "--db", db, *options, "--storage-dir", tmp_path / "s3", "--json")
    c = json.loads(plain_new[plain_new.index("{"):])["run_id"]
    if "--storage-tokens" in options:  # the prefetch rules had something to act on
        assert json.loads(plain_new[plain_new.index("{"):])["storage_tokens"] > 0
    assert _differing_rows(db, a, c)["requests"] > 0, "the releases differ on this workload at all"


def test_a_switched_back_config_file_key_is_refused_under_the_oldest_release_exit_2(tmp_path):
    proc = completed_in_process("replay", DEMO, "--db", tmp_path / "r.duckdb", "--sglang", OLD, "--config",
                                _toml(tmp_path, 'sglang_switched_back = "eviction_amount"'))
    one_line_error(proc.returncode, proc.stderr, 3, "oldest")
    assert not (tmp_path / "r.duckdb").exists()


def _toml(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.toml"
    p.write_text(text + "\n")
    return p
