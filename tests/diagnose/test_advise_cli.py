"""`tierdiag advise` end to end: propose from the run, replay with the sweep runner, measure;
the measured numbers then show in `explain --json` advice[].verified. A run whose trace is gone
is one line on stderr and exit 3."""

from __future__ import annotations

import json
import tomllib

import pytest
from typer.testing import CliRunner

from .test_advice_planted import Story, _pushed_out

pytest.importorskip("tierdiag.cli.replay")
from tierdiag.cli.main import app  # noqa: E402

from .test_cli import run_cli  # noqa: E402


@pytest.fixture(scope="module")
def lost_prefix(tmp_path_factory):
    """The capacity story: a2's prefix falls out of a 4,096-token host pool before it comes back."""
    s = Story()
    _pushed_out(s)
    return s.replay(tmp_path_factory.mktemp("advise"), {"model": "llama3-8b", "device_tokens": 4096,
                                                        "host_tokens": 4096})


def test_advise_verifies_the_change_and_explain_shows_it(lost_prefix):
    result = CliRunner().invoke(app, ["advise", "--db", str(lost_prefix), "--budget", "1", "--jobs", "1", "--json"])
    assert result.exit_code == 0, (result.output, result.exception)
    j = json.loads(result.output)
    assert set(j) >= {"baseline", "candidates", "best"}
    (cand,) = j["candidates"]
    assert cand["changes"] == {"host_tokens": 16384} and cand["status"] == "complete"
    assert cand["recompute_share"] < j["baseline"]["recompute_share"]
    assert cand["reuse_share"]["host"] > 0 and j["best"] == cand["run_id"]
    base_run = j["baseline"]["run_id"]
    code, out, err, _ = run_cli("explain", "a2", "--db", str(lost_prefix), "--run", base_run, "--json")
    assert code == 0, err
    verified = json.loads(out)["advice"][0]["verified"]
    assert verified["run_id"] == cand["run_id"] and verified["ttft_ms_after"] < verified["ttft_ms_before"]
    # The terminal verdict ends with the advice, verified.
    code, text, _, _ = run_cli("explain", "a2", "--db", str(lost_prefix), "--run", base_run)
    assert "advice: set host_tokens = 16_384" in text and f"verified by run {cand['run_id']}" in text
    # What follows "set" is TOML a user can paste into --config (digit separators included).
    setting = text.split("advice: set ", 1)[1].split(":", 1)[0]
    assert tomllib.loads(setting) == {"host_tokens": 16384}


def test_advise_without_the_trace_is_exit_3_naming_it(tmp_path):
    s = Story()
    _pushed_out(s)
    db = s.replay(tmp_path, {"model": "llama3-8b", "device_tokens": 4096, "host_tokens": 4096})
    (tmp_path / "trace.jsonl").unlink()
    code, out, err, heavy = run_cli("advise", "--db", str(db))
    assert code == 3 and out == ""
    assert len(err.splitlines()) == 1 and str(tmp_path / "trace.jsonl") in err and "gone" in err


def test_advise_bad_budget_is_a_usage_error(lost_prefix):
    code, _, err, _ = run_cli("advise", "--db", str(lost_prefix), "--budget", "0")
    assert code == 2 and "--budget 0" in err


def test_advise_proposes_and_verifies_a_storage_tier_with_its_prefetch_policy(tmp_path):
    """The capacity story on a server (--host-memory 8M) that cannot hold a2's reuse distance in
    host memory: advise proposes a storage tier with prefetch_policy wait_complete, and, since
    host == device leaves prefetches no room, a host pool of 2 x device; replaying it, a2's prefix
    comes from storage instead of being recomputed, and a2 is faster (tiny model on the CPU
    preset, where a token is cheaper to read from disk than to recompute)."""
    from tierdiag.store.reader import open_store

    s = Story()
    _pushed_out(s)
    # 0.5.9's prefetch limit, 0.8 x (host - device), is the one that leaves no room with host ==
    # device (0.5.23's is 0.5 x host: the advice then needs no host pool)
    db = s.replay(tmp_path, {"model": "tiny", "gpu": "cpu", "device_tokens": 4096, "host_tokens": 4096,
                             "sglang": "0.5.9"})
    result = CliRunner().invoke(app, ["advise", "--db", str(db), "--budget", "2", "--jobs", "1",
                                      "--host-memory", "8M", "--json"])
    assert result.exit_code == 0, (result.output, result.exception)
    j = json.loads(result.output)
    tier = next(c for c in j["candidates"] if "storage_tokens" in c["changes"])
    assert tier["changes"] == {"storage_tokens": 16384, "prefetch_policy": "wait_complete", "host_tokens": 8192}
    assert tier["status"] == "complete" and tier["reuse_share"]["storage"] > 0
    assert tier["recompute_share"] < j["baseline"]["recompute_share"]
    assert j["best"] == tier["run_id"]
    item = next(a for a in j["advice"] if a["kind"] == "storage_tier")
    assert "beyond the 8.0 MiB a server holds for KV" in item["reason"] and "rate_limited" in item["reason"]
    assert item["verified"]["run_id"] == tier["run_id"]
    with open_store(db) as con:
        ttft = dict(con.execute("SELECT run_id, ttft_ns FROM requests WHERE req_id = 'a2'").fetchall())
        skipped = con.execute("SELECT storage_skipped_reason, storage_hit_tokens FROM requests "
                              "WHERE req_id = 'a2' AND run_id = ?", [tier["run_id"]]).fetchone()
    assert skipped == (None, 24 * s.block)  # a2's whole prefix fetched, none skipped
    assert ttft[tier["run_id"]] < ttft[j["baseline"]["run_id"]]


def test_advise_bad_host_memory_is_a_usage_error(lost_prefix):
    code, _, err, _ = run_cli("advise", "--db", str(lost_prefix), "--host-memory", "lots")
    assert code == 2 and "--host-memory 'lots'" in err
