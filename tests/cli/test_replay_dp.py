"""`tierdiag replay --dp N --router NAME` end to end: the rows in the store carry their rank and
the routing decision, through the writer process and the in-process writer alike; bad values are
refused before any work (exit 2 on the command line, 3 in a --config file)."""

from __future__ import annotations

import json
import subprocess

import duckdb
import pytest

from tests.support.cli import cli_env, completed_in_process
from tierdiag.trace.synth import DEMO_TRACE


def tierdiag(*args, env=None) -> subprocess.CompletedProcess:
    """The CLI in this process (tests/support/cli.py `completed_in_process`): what a replay
    records and how it refuses, not its process (~0.45 s of CPU a start)."""
    return completed_in_process(*args, env=cli_env(**(env or {})))


@pytest.mark.parametrize("writer", ["process", "inline"])
def test_a_deployment_records_every_rank_and_each_routing_decision(tmp_path, writer):
    db = tmp_path / "dp.duckdb"
    res = tierdiag("replay", DEMO_TRACE, "--db", db, "--dp", 3, "--router", "cache_aware", "--device-tokens", 32768,
                   "--host-tokens", 65536, "--storage-tokens", 262144, "--json", env={"TIERDIAG_WRITER": writer})
    assert res.returncode == 0, res.stderr
    con = duckdb.connect(str(db), read_only=True)
    cfg = json.loads(con.execute("SELECT config_json FROM runs").fetchone()[0])
    assert (cfg["dp"], cfg["router"]) == (3, "cache_aware")
    for table in ("requests", "evictions", "transfers", "batches", "pool_samples"):
        ranks = {r for (r,) in con.execute(f"SELECT DISTINCT dp_rank FROM {table}").fetchall()}
        assert ranks == {0, 1, 2}, f"{table}: {ranks}"
    for table, key in (("batches", "batch_id"), ("transfers", "transfer_id"), ("evictions", "eviction_id")):
        n, distinct = con.execute(f"SELECT count(*), count(DISTINCT {key}) FROM {table}").fetchone()
        assert n == distinct > 0, f"{table}.{key} repeats across ranks"
    missing = con.execute("""SELECT count(*) FROM requests WHERE status = 'finished' AND (route_branch IS NULL
        OR route_reason IS NULL OR arrival_device_tokens IS NULL OR best_rank IS NULL OR ranks_json IS NULL)""").fetchone()[0]
    assert missing == 0
    branches = {b for (b,) in con.execute("SELECT DISTINCT route_branch FROM requests").fetchall()}
    assert branches <= {"cache_hit", "cache_miss", "imbalanced"} and "cache_hit" in branches
    worse = con.execute("""SELECT count(*) FROM requests WHERE best_rank_device_tokens + best_rank_host_tokens
        < arrival_device_tokens + arrival_host_tokens""").fetchone()[0]
    assert worse == 0, "best_rank holds at least as much of the prefix as the rank it went to"
    con.close()


def test_one_rank_leaves_the_routing_columns_null(tmp_path):
    db = tmp_path / "one.duckdb"
    assert tierdiag("replay", DEMO_TRACE, "--db", db, "--model", "tiny").returncode == 0
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT DISTINCT dp_rank FROM batches").fetchall() == [(0,)]
    assert con.execute("SELECT count(*) FROM requests WHERE dp_rank <> 0 OR route_branch IS NOT NULL "
                       "OR best_rank IS NOT NULL OR ranks_json IS NOT NULL").fetchone()[0] == 0


@pytest.mark.parametrize("args, words", [
    (("--dp", 0), "--dp 0 must be an integer from 1 to 256"),
    (("--router", "nearest"), "unknown --router 'nearest'"),
])
def test_bad_options_exit_2_with_one_line(tmp_path, args, words):
    res = tierdiag("replay", DEMO_TRACE, "--db", tmp_path / "x.duckdb", *args)
    assert res.returncode == 2 and words in res.stderr and res.stderr.count("\n") <= 2, res.stderr
    assert not (tmp_path / "x.duckdb").exists()


@pytest.mark.parametrize("text, words", [
    ("dp = 0\n", ": dp 0 must be an integer from 1 to 256"),
    ("router_cache_threshold = 1.5\n", "router_cache_threshold 1.5 must be in [0, 1]"),
    ('router = "x"\n', "unknown router 'x'"), ('router_cache_threshold = "high"\n', "router_cache_threshold 'high' must be"),
])
def test_bad_deployment_keys_in_a_config_file_exit_3(tmp_path, text, words):
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    res = tierdiag("replay", DEMO_TRACE, "--db", tmp_path / "x.duckdb", "--config", cfg)
    assert res.returncode == 3 and words in res.stderr and str(cfg) in res.stderr, res.stderr
