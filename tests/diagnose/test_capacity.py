"""Capacity first (issue 34): offered prefill (each request's ideal, recompute excluded) against
one GPU over sliding windows. A planted overloaded workload (fresh requests arriving at about
three times what the GPU can prefill, no reuse at all) is named as overload first, advised a
lower rate (time_scale), and advise confirms it by replay; a planted idle-between-bursts one is
not overload (test_run_story.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tierdiag.diagnose.advice import propose
from tierdiag.diagnose.advice.rules.rate import MAX_TIME_SCALE, round_up_2
from tierdiag.diagnose.run.capacity import TARGET_LOAD
from tierdiag.diagnose.run.facts import run_context
from tierdiag.diagnose.run.summary import run_summary
from tierdiag.store.reader import open_store, resolve_run

from .test_advice_planted import Story

pytest.importorskip("tierdiag.cli.replay")
from tierdiag.cli.main import app  # noqa: E402


def overloaded(story: Story, n: int = 240, gap_ms: int = 40) -> None:
    """`n` requests of 64 fresh pages (4,096 tokens, ~0.12 s of prefill each on llama3-8b/h100),
    one every `gap_ms`: about three times what one GPU prefills, and nothing to reuse."""
    for i in range(n):
        story.add(f"r{i}", i * gap_ms, story.fresh(64))


@pytest.fixture(scope="module")
def overload_run(tmp_path_factory):
    s = Story()
    overloaded(s)
    return s.replay(tmp_path_factory.mktemp("overload"), {"model": "llama3-8b", "device_tokens": 16384,
                                                           "host_tokens": 16384})


def test_overload_is_named_first_with_its_numbers(overload_run):
    with open_store(overload_run) as con:
        run = resolve_run(con, None)
        dx = run_summary(con, run).diagnosis
        ideal = con.execute("SELECT sum(ideal_ttft_ns), max(arrival_ns) - min(arrival_ns) FROM requests "
                            "WHERE run_id = ?", [run.run_id]).fetchone()
    cap = dx.capacity
    assert cap.overloaded and cap.overloaded_share >= 0.9
    # The run offers its ideal work over its arrival span: ~3x; the windows see the same.
    assert ideal[0] / ideal[1] > 2 and 0.8 * ideal[0] / ideal[1] <= cap.overload_factor <= 1.2 * ideal[0] / ideal[1]
    assert dx.claims[0].name == "capacity" and dx.finding.startswith(
        f"Offered prefill was {cap.overload_factor:,.1f}× one GPU for {round(cap.overloaded_share * 100)} % of the run")
    assert "no cache setting removes this queue" in dx.claims[0].text
    assert dx.dominant_cause == "capacity" and dx.proximate_cause == "queueing"
    cause = next(c for c in dx.claims if c.name == "queue_cause")
    assert "not the cache's doing" in cause.text and "offered more prefill than it can do" in cause.text
    j = dx.to_json()
    assert j["capacity"]["overloaded"] is True and j["capacity"]["overload_factor"] == cap.overload_factor
    rate = dx.advice[0]
    assert rate.kind == "rate" and rate.changes == {"time_scale": round_up_2(cap.material_load / TARGET_LOAD)}
    assert cap.overload_factor <= cap.material_load <= cap.peak_load
    assert "--dp" in rate.reason and rate.prediction


def test_advise_confirms_the_rate(overload_run):
    result = CliRunner().invoke(app, ["advise", "--db", str(overload_run), "--budget", "1", "--jobs", "1", "--json"])
    assert result.exit_code == 0, (result.output, result.exception)
    j = json.loads(result.output)
    (cand,) = j["candidates"]
    assert cand["kind"] == "rate" and cand["advice_status"] == "confirmed" and j["best"] == cand["run_id"]
    item = j["advice"][0]
    assert item["verified"]["target"] == "queue_share"
    assert item["verified"]["target_after"] < item["verified"]["target_before"]


def test_a_cache_rule_does_not_fire_on_a_run_that_reuses_nothing(overload_run):
    with open_store(overload_run) as con:
        kinds = [a.kind for a in propose(run_context(con, resolve_run(con, None)))]
    assert kinds == ["rate", "dp"]  # less traffic per GPU, or more GPUs (advice/rules/dp.py); no cache rule


def test_the_time_scale_bound_is_the_configs():
    from tierdiag.config.engine import MAX_TIME_SCALE as CONFIG_MAX

    assert MAX_TIME_SCALE == CONFIG_MAX
    assert [round_up_2(x) for x in (3.41, 62.3, 0.0123, 1.0, 120.1)] == [3.5, 63, 0.013, 1.0, 130]


# issue 41: the material load by a partition, not a Python sort of up to a million window loads;
# the same nearest-rank value (quantile.py's one definition) for any loads, ties and zeros included.
@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=1e12, allow_nan=False) | st.sampled_from([0.0, 1.0, 1.0000001]),
                min_size=1, max_size=200))
def test_the_material_load_is_the_nearest_rank_of_the_loads(loads):
    import numpy as np

    from tierdiag.diagnose.read.quantile import nearest_rank
    from tierdiag.diagnose.run.capacity import MATERIAL_SHARE, _material

    assert _material(np.asarray(loads, dtype=np.float64)) == nearest_rank(loads, 1 - MATERIAL_SHARE)
