"""Names at the bottom, implementations above: the config owns every name a user can type
(config/router.py, config/engine.py, config/releases.py, config/names.py) and the engine
registers one implementation under each. This is the one completeness check, both ways: every
config name has its implementation and no implementation hides under a name the config refuses."""

from __future__ import annotations

import pytest

from tierdiag.config import engine as E
from tierdiag.config import names as N
from tierdiag.config import router as R
from tierdiag.config.policies import EVICTION_POLICIES
from tierdiag.config.releases import RELEASES
from tierdiag.engine.queue_policy import QUEUE_POLICIES
from tierdiag.engine.routing import ROUTERS
from tierdiag.engine.routing.cache_aware import CACHE_MISS_RULES
from tierdiag.engine.rules import RULE_SETS


@pytest.mark.parametrize("names, registry", [
    (R.ROUTER_NAMES, ROUTERS),
    (R.CACHE_MISS_NAMES, CACHE_MISS_RULES),
    (E.SCHEDULE_POLICIES, QUEUE_POLICIES),
    (E.SGLANG_RULES, RULE_SETS),
    (E.EVICTION_POLICIES, EVICTION_POLICIES),
], ids=["routers", "cache_miss_rules", "schedule_policies", "rule_sets", "eviction_policies"])
def test_every_config_name_has_exactly_one_implementation(names, registry):
    assert tuple(registry) == tuple(names)  # same names, same order (the order options list them in)
    for name in names:
        assert type(name) is str  # a plain string in schemas, messages and rows


def test_each_implementation_carries_its_registered_name():
    assert all(cls.name == name for name, cls in ROUTERS.items())
    assert all(p.name == name for name, p in QUEUE_POLICIES.items())
    assert all(r.version == name for name, r in RULE_SETS.items())
    assert all(p.name == name for name, p in EVICTION_POLICIES.items())


def test_a_release_offers_only_names_it_has_implementations_for():
    assert E.SGLANG_RULES == RELEASES
    for release, offers in E.RELEASE_OFFERS.items():
        assert set(offers["eviction_policy"]) <= set(EVICTION_POLICIES)
        assert set(offers["schedule_policy"]) <= set(QUEUE_POLICIES)
        for name, policy in QUEUE_POLICIES.items():
            assert (release in policy.releases) == (name in offers["schedule_policy"])


def test_each_rule_set_reads_its_release_defaults_from_the_config():
    for version, rules in RULE_SETS.items():
        assert rules.prefetch_policy_default == E.SGLANG_PREFETCH_POLICY[version]
        assert rules.prefetch_policy_default in E.PREFETCH_POLICIES
        assert rules.host_layout == E.SGLANG_HOST_LAYOUT[version]


@pytest.mark.parametrize("enum, choices", [
    (N.WritePolicy, E.WRITE_POLICIES), (N.PrefetchPolicy, E.PREFETCH_POLICIES),
    (R.RouterName, R.ROUTER_NAMES), (R.CacheMissRule, R.CACHE_MISS_NAMES),
])
def test_an_options_choices_are_its_enums_values(enum, choices):
    assert choices == tuple(m.value for m in enum)
    for member in enum:  # the member is its string: stored, compared and printed as before
        assert member == member.value and f"{member}" == member.value and str(member) == member.value


def test_the_router_defaults_are_declared_once():
    cfg = E.EngineConfig()
    for key, default in R.DEFAULTS.items():
        assert getattr(cfg, key) == default, key
    assert R.RouterConfig.from_config(cfg) == R.RouterConfig()


def test_the_tree_node_carries_what_eviction_keys_read():
    """config/policies.py's keys read an EvictionNode (config sits below the engine); the
    engine's TreeNode must carry every field the Protocol names, and every policy's key must
    run on one."""
    from tierdiag.config.policies import EvictionNode, configured_eviction_policy
    from tierdiag.engine.tree import TreeNode

    root = TreeNode(0, None, [], [], None, 0, None)
    node = TreeNode(1, root, [7], [0], None, 5, "r")
    # on the node, not its class's __slots__: a compiled core's (mypyc) native class has none
    assert [f for f in EvictionNode.__annotations__ if not hasattr(node, f)] == []
    for name in EVICTION_POLICIES:
        assert isinstance(EVICTION_POLICIES[name].key(node), tuple)
    assert isinstance(configured_eviction_policy("tlru", 8, 2).key(node), tuple)
