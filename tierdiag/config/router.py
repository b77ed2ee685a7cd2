"""The router of a data-parallel replay (`--dp N --router NAME`): its names, its keys and their
defaults, declared once here. EngineConfig's router fields take these declarations and defaults
(config/engine.py, checked by config/schema.py); the engine builds a RouterConfig from an
EngineConfig (`RouterConfig.from_config`) and registers one router class under each name
(engine/routing/registry.py; tests/test_registries.py checks both ways). Defaults are the SGLang
model gateway's command-line defaults (RouterArgs, sglang_router/router_args.py).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any

from tierdiag.config.names import values
from tierdiag.config.schema import Choice, Float, Int, Schema, check_values, key_name
from tierdiag.errors import unknown_name


class RouterName(StrEnum):
    ROUND_ROBIN = "round_robin"
    RANDOM = "random"
    SHORTEST_QUEUE = "shortest_queue"
    POWER_OF_TWO = "power_of_two"
    SESSION = "session"
    PREFIX_HASH = "prefix_hash"
    CACHE_AWARE = "cache_aware"


class CacheMissRule(StrEnum):
    """cache_aware's choice when no rank holds enough of the prompt."""

    SMALLEST_TREE = "smallest_tree"  # sgl-router
    MIN_LOAD = "min_load"  # sgl-model-gateway


ROUTER_NAMES = values(RouterName)
CACHE_MISS_NAMES = values(CacheMissRule)
MAX_DP = 256  # ranks of one replay: each has its own pools and data plane
# The approximate tree's eviction interval, in seconds: turned into ns and added to the clock
# (arrivals < 2^62 ns), so at most 10^9 s (~31 years; 10^18 ns) keeps the sum inside int64.
MAX_EVICTION_INTERVAL_S = 1e9
# The balance ratio and prefix_hash's load factor multiply loads: past a million they mean
# "never", as any larger finite value would.
MAX_RATIO = 1e6

# The declarations of the router keys (and the seed, which random and power_of_two draw with):
# EngineConfig's fields and RouterConfig are checked against them.
KEYS: dict[str, Any] = {
    "dp": Int(1, MAX_DP),
    "router": Choice(ROUTER_NAMES),
    "router_cache_threshold": Float(0.0, 1.0, cli=False),
    "router_balance_abs_threshold": Int(0, cli=False),
    "router_balance_rel_threshold": Float(0.0, MAX_RATIO, lo_open=True, cli=False),
    "router_eviction_interval_s": Float(0.0, MAX_EVICTION_INTERVAL_S, cli=False),
    "router_max_tree_tokens": Int(1, cli=False),
    "router_cache_miss": Choice(CACHE_MISS_NAMES, cli=False, noun="rule"),
    "router_prefix_hash_tokens": Int(1, cli=False),
    "router_prefix_hash_load_factor": Float(0.0, MAX_RATIO, lo_open=True, cli=False),
    "seed": Int(0),
}
_PARAMETERS = Schema("RouterParameters", {k: v for k, v in KEYS.items() if k.startswith("router_") or k == "seed"})


@dataclass(frozen=True)
class RouterConfig:
    """The router's options, validated before any work. Field names are the TOML keys, so
    EngineConfig carries the same fields (with these defaults) and hands them over with
    `RouterConfig.from_config(engine_config)`."""

    router: str = RouterName.ROUND_ROBIN.value
    # cache_aware (RouterArgs: cache_threshold 0.3, balance_abs_threshold 64,
    # balance_rel_threshold 1.5, eviction_interval_secs 60, max_tree_size 2**26)
    router_cache_threshold: float = 0.3
    router_balance_abs_threshold: int = 64
    router_balance_rel_threshold: float = 1.5
    router_eviction_interval_s: float = 60.0  # 0: never evict the approximate tree
    router_max_tree_tokens: int = 2**26  # a rank's approximate tree, in tokens (whole pages)
    router_cache_miss: str = CacheMissRule.SMALLEST_TREE.value
    # prefix_hash (PrefixHashConfig::default: prefix_token_count 256, load_factor 1.25)
    router_prefix_hash_tokens: int = 256
    router_prefix_hash_load_factor: float = 1.25
    seed: int = 0  # random and power_of_two draw from a generator seeded with it

    def __post_init__(self) -> None:
        if self.router not in ROUTER_NAMES:
            raise unknown_name("router", self.router, ROUTER_NAMES)
        check_values(_PARAMETERS, {k: getattr(self, k) for k in _PARAMETERS.fields}, key_name)

    @classmethod
    def from_config(cls, config: object) -> "RouterConfig":
        """The fields of this class read off any object that has them (EngineConfig); a missing
        one keeps its default."""
        return cls(**{f.name: getattr(config, f.name) for f in fields(cls) if hasattr(config, f.name)})


# Every router key's default, for EngineConfig's fields (`dp`: one rank).
DEFAULTS: dict[str, Any] = {"dp": 1, **{f.name: f.default for f in fields(RouterConfig)}}
