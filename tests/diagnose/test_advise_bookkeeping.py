"""`advise`'s bookkeeping (issues 39 and 40): what a candidate replays with and how its row is
labelled, starred and judged.

- Two sizes of one option (a host pool for the sessions, a larger one for capacity) are two
  alternatives, never a "together" combination: replaying their "combination" replayed the
  larger one again, labelled the single replay "together ... no effect" and starred the worse.
- A candidate follows the SGLang release the run is read as: a run recorded before rule sets (no
  `sglang_rules`) followed 0.5.9, not today's default.
- A run replayed with a calibrate profile is advised only while that profile is there,
  unchanged: a re-fitted or deleted profile is refused like a changed or gone trace (exit 3,
  naming the profile), and a candidate replayed on another clock verifies nothing.
- An item is confirmed by the request-level result it promised (TTFT p50/p99), not by a share.
"""

from __future__ import annotations

import json

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.cli import invoke, invoke_json, one_line_error
from tierdiag.diagnose.advice.types import Advice, Verified, classify
from tierdiag.diagnose.advice.verify import combination, own_combination

from .test_advice_planted import Story
from .test_advise_cli import _curve_size, _cycle
from .test_cli import run_cli_here

pytest.importorskip("tierdiag.cli.replay")


def _runs(db) -> dict[str, dict]:
    from tierdiag.store.reader import open_store

    with open_store(db) as con:
        return {rid: json.loads(cfg) for rid, cfg in
                con.execute("SELECT run_id, config_json FROM runs ORDER BY created_at").fetchall()}


# --------------------------------------------------------------------------- two sizes of one option


@pytest.fixture(scope="module")
def multi_turn(tmp_path_factory):
    """The issue's reproduction: `synth --kind multi-turn`, `replay --device-tokens 65536`. Both the
    session rule (host pool for the p90 pause) and the capacity rule (host pool for the p90 reuse
    distance) fire, each with its own host_tokens."""
    d = tmp_path_factory.mktemp("multi")
    trace, db = d / "t.jsonl", d / "r.duckdb"
    invoke("synth", "--kind", "multi-turn", str(trace))
    invoke("replay", str(trace), "--device-tokens", "65536", "--db", str(db))
    return db, invoke_json("advise", "--db", str(db), "--jobs", "1")


def test_two_sizes_of_one_option_are_alternatives_never_together(multi_turn):
    db, j = multi_turn
    cands = j["candidates"]
    sizes = [c for c in cands if set(c["changes"]) == {"host_tokens"}]
    assert len(sizes) == 2 and {c["kind"] for c in sizes} == {"session", "capacity"}
    # No combination of them: every candidate is a config of its own, none replayed twice.
    assert all(c["kind"] != "combined" for c in cands)
    keys = [json.dumps(c["changes"], sort_keys=True) for c in cands]
    assert len(keys) == len(set(keys))
    runs = _runs(db)
    replayed = [runs[c["run_id"]]["host_tokens"] for c in cands]
    assert len(replayed) == len(set(replayed))
    # Each row is labelled by what it changed: the recorded run's name and its kind.
    for c in cands:
        from tierdiag.store.reader import open_store

        with open_store(db) as con:
            (name,) = con.execute("SELECT name FROM runs WHERE run_id = ?", [c["run_id"]]).fetchone()
        assert "together" not in name and name.endswith(f"host_tokens={c['changes']['host_tokens']}")
    # Both measured better by TTFT: both confirmed, and the star is the better of them.
    assert {c["advice_status"] for c in sizes} == {"confirmed"}
    best = min(sizes, key=lambda c: (c["ttft_p50_ms"], c["ttft_p99_ms"], c["ttft_mean_ms"]))
    assert j["best"] == best["run_id"]
    assert j["tried_not_advised"] == [] and all(a["kind"] != "combined" for a in j["advice"])


def test_the_terminal_table_labels_each_row_by_its_change(multi_turn):
    db, j = multi_turn
    text = invoke("advise", "--db", str(db), "--jobs", "1")  # read back: every candidate replayed already
    flat = " ".join(text.replace("│", " ").split())
    assert "together" not in flat
    assert flat.count("★") == 1


def _item(kind: str, option: str, value, gain: float, changes: dict | None = None) -> Advice:
    v = Verified("r-" + kind, 100.0, 100.0 * (1 - gain), 200.0, 200.0, 0.5, 0.1)
    return Advice(kind, option, value, changes or {option: value}, "why", verified=v, status="confirmed")


def test_combination_is_of_different_options_only():
    session = _item("session", "host_tokens", 1 << 20, 0.54)
    capacity = _item("capacity", "host_tokens", 1 << 21, 0.55)
    assert combination((session, capacity)) is None  # two sizes of one option
    lfu = _item("eviction_policy", "eviction_policy", "lfu", 0.2)
    together = combination((session, capacity, lfu))
    assert together is not None and together.changes == {"host_tokens": 1 << 21, "eviction_policy": "lfu"}
    assert together.evidence["parts"] == ["capacity", "eviction_policy"]
    # A part whose keys hold the others' (a storage tier with a larger host pool beside a host
    # pool) would replay that part again: not a combination.
    tier = _item("storage_tier", "storage_tokens", 1 << 22, 0.3,
                 {"storage_tokens": 1 << 22, "prefetch_policy": "wait_complete", "host_tokens": 1 << 22})
    assert combination((capacity, tier)) is None


def test_confirmed_by_the_ttft_it_promised_not_by_a_share():
    """The issue's `dp = 5`: p50 261.5 -> 53.2 ms, p99 no worse, while queueing's share of the
    (much smaller) excess went 101 % -> 105 %. The item promised a faster TTFT and delivered it."""
    v = Verified("r", 261.5, 53.2, 900.0, 400.0, 0.1, 0.1, target="queue_excess_share",
                 target_before=1.01, target_after=1.05)
    assert classify(v) == "confirmed"
    assert "not the way its rule predicted" in v.numbers()
    worse = Verified("r", 261.5, 280.0, 900.0, 900.0, 0.1, 0.1, target="queue_excess_share",
                     target_before=1.01, target_after=0.5)
    assert classify(worse) == "refuted"  # a share that fell does not confirm a slower TTFT


# --------------------------------------------------------------------------- the rule set a run is read as


def test_candidates_of_a_run_from_before_rule_sets_follow_0_5_9(tmp_path):
    """A store written before rule sets: the run's config has no `sglang_rules` (read as 0.5.9,
    docs/contract.md). Its candidates must replay under 0.5.9 too, and verify it: the replay's
    change is the host pool alone."""
    from tierdiag.store.reader import open_store

    s = Story()
    _cycle(s)
    db = s.replay(tmp_path, {"model": "llama3-8b", "device_tokens": 4096, "host_tokens": 4096, "sglang": "0.5.9"})
    (rid, cfg), = _runs(db).items()
    cfg.pop("sglang_rules")
    with duckdb.connect(str(db)) as con:
        con.execute("UPDATE runs SET config_json = ? WHERE run_id = ?", [json.dumps(cfg), rid])
    j = invoke_json("advise", "--db", str(db), "--budget", "1", "--jobs", "1")
    (cand,) = j["candidates"]
    assert _runs(db)[cand["run_id"]]["sglang_rules"] == "0.5.9"
    size = _curve_size(db, "host")  # the host size curve's knee + slack
    assert cand["changes"] == {"host_tokens": size} and cand["advice_status"] == "confirmed"
    assert [a["changes"] for a in j["advice"]] == [{"host_tokens": size}] and j["tried_not_advised"] == []


# --------------------------------------------------------------------------- the profile a run replayed with


def _profiled(tmp_path, factor: float = 1.0):
    from tierdiag.config.profile import preset_clock, write_profile

    clock = preset_clock("llama3-8b", "h100")
    clock["prefill_ns_per_token"] *= factor
    return write_profile(tmp_path / "p.toml", model="llama3-8b", gpu="h100", clock=clock, fit={"source_run": "x"})


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    d = tmp_path_factory.mktemp("profiled")
    _profiled(d)
    s = Story()
    _cycle(s)
    db = s.replay(d, {"device_tokens": 4096, "host_tokens": 4096, "profile": d / "p.toml"})
    return d, db


def _advise_fails(db):
    code, out, err = run_cli_here("advise", "--db", str(db), "--budget", "1", "--jobs", "1")
    return code, out, err


def test_a_re_fitted_profile_is_refused_like_a_changed_trace(profiled):
    d, db = profiled
    before = _runs(db)
    _profiled(d, factor=3.0)  # re-fitted in place
    try:
        code, out, err = _advise_fails(db)
        one_line_error(code, err, 3, f"profile {d / 'p.toml'}", "changed since run")
        assert "--profile" not in err and out == ""
        assert _runs(db) == before  # nothing replayed, nothing recorded
    finally:
        _profiled(d)
    # Restored to what the run replayed with: advised as before.
    j = invoke_json("advise", "--db", str(db), "--budget", "1", "--jobs", "1")
    assert j["candidates"][0]["advice_status"] == "confirmed"


def test_a_gone_profile_is_said_as_for_a_gone_trace(profiled):
    d, db = profiled
    (d / "p.toml").rename(d / "kept.toml")
    try:
        code, out, err = _advise_fails(db)
        line = one_line_error(code, err, 3, f"profile {d / 'p.toml'}", "is gone", "advise replays with it")
        assert "--profile" not in line and "no such file" not in line
    finally:
        (d / "kept.toml").rename(d / "p.toml")


def test_a_candidate_on_another_clock_verifies_nothing(profiled):
    """A candidate recorded with another profile content (re-fitted between the run and an older
    advise): its numbers are the clock's, not the change's. The item stays proposed, nothing in
    any view comes from it, and no view fails on its recorded profile (`unhashable dict`)."""
    from tierdiag.store.reader import open_store

    d, db = profiled
    invoke_json("advise", "--db", str(db), "--budget", "1", "--jobs", "1")
    with duckdb.connect(str(db)) as con:
        rows = con.execute("SELECT run_id, config_json FROM runs WHERE sweep_id LIKE 'advise-%'").fetchall()
        for rid, cfg in rows:
            cfg = json.loads(cfg)
            cfg["profile_source"]["sha256"] = "0" * 64
            con.execute("UPDATE runs SET config_json = ? WHERE run_id = ?", [json.dumps(cfg), rid])
    summary = invoke_json("summary", "--db", str(db))
    items = summary["diagnosis"]["advice"]
    assert items and all(a["status"] == "proposed" and a["verified"] is None for a in items)
    assert summary["diagnosis"]["tried_not_advised"] == []


@settings(max_examples=50, deadline=None)
@given(st.one_of(st.none(), st.integers(), st.floats(), st.booleans(), st.text(max_size=40),
                 st.lists(st.text(max_size=5), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=2)),
       st.one_of(st.none(), st.integers(), st.text(max_size=10), st.dictionaries(st.just("sha256"), st.text(max_size=64))))
def test_any_recorded_profile_is_checked_or_refused_in_one_line(profile, source):
    """The recorded config is data (an older or hand-edited store): whatever `profile` and
    `profile_source` hold, advise's check passes (no profile) or refuses with a TraceError (exit 3),
    never another exception (a file descriptor number is not a path)."""
    from types import SimpleNamespace

    from tierdiag.app.advise import check_profile_for_advise
    from tierdiag.errors import TraceError

    run = SimpleNamespace(run_id="r1", name="n", config={"profile": profile, "profile_source": source})
    try:
        check_profile_for_advise(run)
    except TraceError as exc:
        assert "\n" not in exc.one_line() and "profile" in exc.one_line()
    else:  # nothing to check, or a file there whose content no hash was recorded for
        import os

        assert profile is None or profile == "" or (os.path.isfile(profile) and not (isinstance(source, dict) and source.get("sha256")))


def test_an_item_that_is_the_combination_carries_its_replay_alone():
    """Issue 40: an advice item "verified by" a combined replay that the same view listed under
    "tried, not advised". An item setting exactly the combination's changes (a storage tier with
    its host pool) is that replay: the combination is not a second entry for it."""
    host = _item("capacity", "host_tokens", 1 << 20, 0.30)
    policy = _item("write_policy", "write_policy", "write_back", 0.20)
    both = combination((host, policy))
    assert both is not None and own_combination((host, policy)) == both
    same = _item("storage", "host_tokens", 1 << 20, 0.10, changes=dict(both.changes))
    assert own_combination((host, policy, same)) is None


def test_a_replay_records_its_trace_and_profile_as_absolute_paths(tmp_path, monkeypatch):
    """`advise` re-reads the run's trace and profile, perhaps from another folder than the replay
    ran in: the run records them as absolute paths, whatever was typed."""
    monkeypatch.chdir(tmp_path)
    invoke("synth", "t.jsonl", "--kind", "mixed", "--requests", "40")
    invoke("calibrate", "--quick", "--out", "p.json")
    invoke("replay", "t.jsonl", "--db", "r.duckdb", "--profile", "p.json")
    from tierdiag.store.reader import open_store

    with open_store(tmp_path / "r.duckdb") as con:
        trace_path, cfg = con.execute("SELECT trace_path, config_json FROM runs").fetchone()
    assert trace_path == str(tmp_path / "t.jsonl")
    assert json.loads(cfg)["profile"] == str(tmp_path / "p.json")
