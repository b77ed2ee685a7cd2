"""RequestRecords.rules_split: the rule set's split of the cached prefix called by name where it is
one of cached_split's two (the Scheduler's `_split_kind`, cached_split.split_kind, read once),
through the rule set's field where it is any other function. Either way the same tokens as the
field's call, for every release's rule set, one with its split switched back, and a rule set
made by hand; on any request's page counts, hostile ones included (negative, past int64)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine import helpers
from tierdiag.engine import cached_split
from tierdiag.engine.cached_split import SPLIT_BY_TIER, SPLIT_OTHER, SPLIT_PROMISED, split_kind
from tierdiag.engine.engine import Engine
from tierdiag.engine.rules import RULE_SETS

PAGES = ("prefix_pages", "device_prefix_pages", "host_match_pages", "host_loaded_pages", "storage_loaded_pages",
         "loadback_skip_pages", "storage_span_pages", "storage_span_start")
_INTS = st.one_of(st.integers(0, 64), st.integers(-3, 3), st.integers(-2**70, 2**70),
                  st.sampled_from([2**62, -2**62, 2**63 - 1, -2**63, 2**64]))


def _through_field(rules, r, ps: int) -> tuple[int, int, int]:
    """rules_split as it was: every value through the rule set's field."""
    storage_hit = r.storage_loaded_pages if r.loadback_skip_pages == 0 else r.loadback_skip_pages - r.host_match_pages
    d, h, s = rules.split_cached_prefix(r.prefix_pages, r.device_prefix_pages, r.host_match_pages + storage_hit,
                                        r.host_loaded_pages + r.storage_loaded_pages, storage_hit,
                                        r.device_prefix_pages + r.host_match_pages, r.storage_span_pages,
                                        r.storage_span_start)
    return d * ps, h * ps, s * ps


def _by_hand(prefix, device, host_hit, host_loaded, storage_hit, storage_start, span, span_start):
    """A split that is neither of cached_split's (a rule set made by hand)."""
    return prefix - device, host_hit + span, storage_hit * 2 - span_start


def test_split_kind_names_the_two_by_identity_and_nothing_else():
    assert split_kind(cached_split.split_by_tier) == SPLIT_BY_TIER
    assert split_kind(cached_split.split_promised) == SPLIT_PROMISED
    twin = helpers.source_twin("cached_split", "_cached_split_kind_twin").split_by_tier  # same source, another object
    for other in (twin, _by_hand, None, 0, "split_by_tier", cached_split.split_kind):
        assert split_kind(other) == SPLIT_OTHER


def _scheduler(release: str, **kw):
    return Engine(helpers.small_config(sglang_rules=release, **kw)).scheduler


def test_every_release_s_scheduler_calls_its_split_by_name():
    for release, rules in RULE_SETS.items():
        sched = _scheduler(release)
        assert sched._split_kind == split_kind(rules.split_cached_prefix) != SPLIT_OTHER
    switched = _scheduler("0.5.23", sglang_switched_back="split_cached_prefix")
    assert switched.rules.split_cached_prefix is cached_split.split_promised
    assert switched._split_kind == SPLIT_PROMISED


@settings(max_examples=150, deadline=None)
@given(pages=st.tuples(*[_INTS] * len(PAGES)), release=st.sampled_from(sorted(RULE_SETS)),
       by_hand=st.booleans())
def test_rules_split_is_the_field_s_call(pages, release, by_hand):
    sched = _scheduler(release)
    if by_hand:
        sched.rules = replace(sched.rules, split_cached_prefix=_by_hand)
        sched._split_kind = split_kind(_by_hand)
    r = helpers.tracked_req(0)
    for name, value in zip(PAGES, pages):
        setattr(r, name, value)
    want = _through_field(sched.rules, r, sched.ps)
    assert sched.rules_split(r) == want
    assert all(type(v) is int for v in sched.rules_split(r))
