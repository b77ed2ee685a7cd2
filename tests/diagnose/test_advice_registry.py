"""An advice rule is one object in one file (tierdiag/diagnose/advice/rules/), listed once in
registry.py (issue 38). This file holds the completeness check over every rule (registered, its
sentence checked against the rows, its verification wired) and shows what adding one takes: a
rule defined here, registered by patching the list alone, is proposed, replayed by `advise`,
measured by its own target and shown by `summary` and `explain`, with no other file edited."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import pytest

import tierdiag.diagnose.advice.rules as rules_pkg
from tierdiag.diagnose.advice import registry
from tierdiag.diagnose.advice.base import Evidence, Rule, significant
from tierdiag.diagnose.advice.targets import Target
from tierdiag.diagnose.advice.types import Advice
from tierdiag.diagnose.advice.verify import _measured, kind_of
from tierdiag.diagnose.request.claims import Claim
from tierdiag.units import fmt_pct, fmt_tokens, share

from .test_advice_claims import CHECKED_KINDS
from .test_advice_planted import Story
from .test_advise_cli import _cycle
from .test_run_claims import PCT, _pct_ok

pytest.importorskip("tierdiag.cli.replay")
from tests.support.cli import invoke, invoke_json  # noqa: E402

ALL = registry.RULES + (registry.FALLBACK,)


def _rule_classes() -> list[type[Rule]]:
    """Every concrete Rule defined in a module under advice/rules/."""
    out = []
    for info in pkgutil.iter_modules(rules_pkg.__path__):
        mod = importlib.import_module(f"{rules_pkg.__name__}.{info.name}")
        out += [c for _, c in inspect.getmembers(mod, inspect.isclass)
                if issubclass(c, Rule) and c.__module__ == mod.__name__ and not inspect.isabstract(c)]
    return out


def test_every_rule_module_holds_one_rule_and_it_is_registered():
    classes = _rule_classes()
    modules = [c.__module__ for c in classes]
    assert len(modules) == len(set(modules)), "one rule a module"
    assert len(classes) == len(list(pkgutil.iter_modules(rules_pkg.__path__))), "a rule module without a rule"
    assert sorted(c.__name__ for c in classes) == sorted(type(r).__name__ for r in ALL), "a rule not in registry.py"
    assert len({type(r) for r in ALL}) == len(ALL), "a rule registered twice"


def test_kinds_and_options_name_one_rule_each():
    kinds = [k for r in ALL for k in r.kinds]
    assert all(r.kinds for r in ALL) and len(kinds) == len(set(kinds))
    assert not {"combined", "other"} & set(kinds)  # verify.py's own kinds
    keys = [k for r in ALL for k in r.options]
    assert len(keys) == len(set(keys)), "a config key owned by two rules"
    for r in ALL:
        assert set(r.options.values()) <= set(r.kinds) and r.dominant_options <= set(r.options), type(r).__name__


def test_every_rule_sentence_is_checked_against_the_rows():
    """test_advice_claims.py takes every kind's reason apart and recomputes each number with its
    own SQL: a new rule's kinds must be among those it checks."""
    missing = {k for r in ALL for k in r.kinds} - CHECKED_KINDS
    assert not missing, f"no row check in test_advice_claims.py for {sorted(missing)}"


@pytest.mark.parametrize("rule", ALL, ids=lambda r: type(r).__name__)
def test_every_rule_has_its_verification(rule):
    """Its target (or none: TTFT alone) reaches what a replay measured of each of its kinds, in words."""
    assert rule.target is None or isinstance(rule.target, Target)
    base = {"p50": 200e6, "p99": 400e6, "recompute_share": 0.5}
    after = {"p50": 100e6, "p99": 300e6, "recompute_share": 0.4}
    if rule.target is not None:
        base[rule.target.name], after[rule.target.name] = 0.5, 0.25
    for kind in rule.kinds:
        v = _measured(base, after, "r", kind, None)
        if rule.target is None:
            assert v.target is None and v.target_before is None
            continue
        assert (v.target, v.target_before, v.target_after) == (rule.target.name, 0.5, 0.25)
        assert f"{rule.target.words} 50 % → 25 %" in v.numbers()
    for key, kind in rule.options.items():
        assert kind_of({key: 1}) == kind


def test_a_change_of_the_in_batch_options_is_of_the_in_batch_kind():
    """Before the registry, the table of keys was written out apart from the rules and missed
    in_batch's: an earlier advise's schedule_policy replay came back as kind 'other'."""
    assert kind_of({"schedule_policy": "lpm"}) == kind_of({"max_prefill_tokens": 4096}) == "in_batch"
    assert kind_of({"storage_tokens": 1 << 20, "prefetch_policy": "wait_complete", "host_tokens": 8192}) == \
        "storage_tier"
    assert kind_of({"eviction_policy": "lfu", "page_size": 256}) == "combined"
    assert kind_of({"seed": 3}) == "other"


# --------------------------------------------------------------------------- adding a rule: one file


DEVICE_MISS = Target("device_miss_share", "share of input not found on device",
                     "1 - sum(device_hit_tokens) / nullif(sum(input_tokens), 0)")


class BiggerDevice(Rule):
    """Twice the device pool (and the host pool beside it, which is never smaller) where a material
    share of input was recomputed; judged by its own target, the share not found on device."""

    kinds = ("bigger_device",)
    options = {"device_tokens": "bigger_device"}
    target = DEVICE_MISS

    def trigger(self, ev: Evidence) -> list[Advice]:
        lo = ev.ctx.losses
        device = lo.device_capacity_tokens
        if not device or not significant(lo.recomputed_tokens, lo.input_tokens):
            return []
        new = 2 * device
        return [Advice("bigger_device", "device_tokens", new, {"device_tokens": new, "host_tokens": new},
                       self.sentence(recomputed_tokens=lo.recomputed_tokens, input_tokens=lo.input_tokens,
                                     device_tokens=new).text,
                       {"recomputed_tokens": lo.recomputed_tokens}, prediction=self.prediction(device_tokens=new))]

    def sentence(self, *, recomputed_tokens: int, input_tokens: int, device_tokens: int) -> Claim:
        return Claim("bigger_device", (
            f"{fmt_tokens(recomputed_tokens)} tokens ({fmt_pct(share(recomputed_tokens, input_tokens))} of input) "
            f"were recomputed; {fmt_tokens(device_tokens)} tokens of device hold more of them"))

    def prediction(self, *, device_tokens: int) -> str:
        return f"predicted: a device pool of {fmt_tokens(device_tokens)} tokens misses less"


@pytest.fixture(scope="module")
def cycle_run(tmp_path_factory):
    s = Story()
    _cycle(s)
    return s.replay(tmp_path_factory.mktemp("tiny_rule"), {"model": "llama3-8b", "device_tokens": 4096,
                                                           "host_tokens": 4096})


def test_a_rule_defined_here_is_proposed_replayed_measured_and_shown(cycle_run, monkeypatch):
    monkeypatch.setattr(registry, "RULES", registry.RULES + (BiggerDevice(),))
    j = invoke_json("advise", "--db", str(cycle_run), "--budget", "2", "--jobs", "1")
    cand = next(c for c in j["candidates"] if c["kind"] == "bigger_device")
    assert cand["changes"] == {"device_tokens": 8192, "host_tokens": 8192} and cand["status"] == "complete"
    item = next(a for a in j["advice"] + j["tried_not_advised"] if a["kind"] == "bigger_device")
    v = item["verified"]
    assert v["run_id"] == cand["run_id"] and item["status"] == cand["advice_status"]
    # Measured by its own target, on the baseline and on its replay: the rows' own share.
    import duckdb

    con = duckdb.connect(str(cycle_run), read_only=True)
    shares = dict(con.execute(
        "SELECT run_id, 1 - sum(device_hit_tokens) / sum(input_tokens) FROM requests WHERE status = 'finished' "
        "AND ttft_ns IS NOT NULL GROUP BY run_id").fetchall())
    recomputed, inp = con.execute(
        "SELECT sum(recomputed_tokens), sum(input_tokens) FROM requests WHERE run_id = ? "
        "AND status = 'finished' AND ttft_ns IS NOT NULL", [j["baseline"]["run_id"]]).fetchone()
    con.close()
    assert v["target"] == "device_miss_share"
    assert v["target_before"] == pytest.approx(shares[j["baseline"]["run_id"]])
    assert v["target_after"] == pytest.approx(shares[cand["run_id"]]) and v["target_after"] < v["target_before"]
    # Its sentence, from the rows.
    m = re.match(rf"([\d,]+) tokens \({PCT} of input\) were recomputed; 8,192 tokens of device", item["reason"])
    assert m is not None and int(m[1].replace(",", "")) == recomputed and _pct_ok(m[2], recomputed / inp), \
        item["reason"]
    # summary and explain show it with what the replay measured, in its target's words.
    d = invoke_json("summary", "--db", str(cycle_run))["diagnosis"]
    shown = next(a for a in d["advice"] + d["tried_not_advised"] if a["kind"] == "bigger_device")
    assert shown["verified"]["run_id"] == cand["run_id"]
    text = " ".join(invoke("summary", "--db", str(cycle_run)).replace("│", " ").split())
    assert "share of input not found on device" in text
    ex = invoke_json("explain", "p0r2", "--db", str(cycle_run), "--run", j["baseline"]["run_id"])
    mine = next(a for a in ex["advice"] + ex["tried_not_advised"] if a["kind"] == "bigger_device")
    assert mine["verified"]["req_id"] == "p0r2" and mine["verified"]["run_id"] == cand["run_id"]

