"""RouterConfig: the router's options, validated before any work.

Field names are the TOML keys (`router`, `router_cache_threshold`, ...), so EngineConfig can carry
the same fields and hand them over with `RouterConfig.from_config(engine_config)`. Defaults are
the SGLang model gateway's command-line defaults (RouterArgs, sglang_router/router_args.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from tierdiag.errors import ConfigError, unknown_name
from tierdiag.engine.routing.cache_aware import CACHE_MISS_RULES
from tierdiag.engine.routing.registry import ROUTERS


@dataclass(frozen=True)
class RouterConfig:
    router: str = "round_robin"
    # cache_aware (RouterArgs: cache_threshold 0.3, balance_abs_threshold 64,
    # balance_rel_threshold 1.5, eviction_interval_secs 60, max_tree_size 2**26)
    router_cache_threshold: float = 0.3
    router_balance_abs_threshold: int = 64
    router_balance_rel_threshold: float = 1.5
    router_eviction_interval_s: float = 60.0  # 0: never evict the approximate tree
    router_max_tree_tokens: int = 2**26  # a rank's approximate tree, in tokens (whole pages)
    router_cache_miss: str = "smallest_tree"  # smallest_tree (sgl-router) | min_load (sgl-model-gateway)
    # prefix_hash (PrefixHashConfig::default: prefix_token_count 256, load_factor 1.25)
    router_prefix_hash_tokens: int = 256
    router_prefix_hash_load_factor: float = 1.25
    seed: int = 0  # random and power_of_two draw from a generator seeded with it

    def __post_init__(self) -> None:
        if self.router not in ROUTERS:
            raise unknown_name("router", self.router, ROUTERS)
        if self.router_cache_miss not in CACHE_MISS_RULES:
            raise unknown_name("router_cache_miss rule", self.router_cache_miss, CACHE_MISS_RULES)
        _number("router_cache_threshold", self.router_cache_threshold, lo=0.0, hi=1.0)
        _integer("router_balance_abs_threshold", self.router_balance_abs_threshold, lo=0)
        _number("router_balance_rel_threshold", self.router_balance_rel_threshold, lo=0.0, lo_open=True)
        _number("router_eviction_interval_s", self.router_eviction_interval_s, lo=0.0)
        _integer("router_max_tree_tokens", self.router_max_tree_tokens, lo=1)
        _integer("router_prefix_hash_tokens", self.router_prefix_hash_tokens, lo=1)
        _number("router_prefix_hash_load_factor", self.router_prefix_hash_load_factor, lo=0.0, lo_open=True)
        _integer("seed", self.seed, lo=0)

    @classmethod
    def from_config(cls, config: object) -> "RouterConfig":
        """The fields of this class read off any object that has them (EngineConfig, once it
        carries the router keys); a missing one keeps its default."""
        return cls(**{f.name: getattr(config, f.name) for f in fields(cls) if hasattr(config, f.name)})


def _integer(key: str, value: object, *, lo: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key} {value!r} must be an integer")
    if value < lo:
        raise ConfigError(f"{key} {value} must be at least {lo}")


def _number(key: str, value: object, *, lo: float, hi: float | None = None, lo_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{key} {value!r} must be a finite number")
    if value < lo or (lo_open and value == lo) or (hi is not None and value > hi):
        bounds = f"{'(' if lo_open else '['}{lo:g}, {'inf)' if hi is None else f'{hi:g}]'}"
        raise ConfigError(f"{key} {value} must be in {bounds}")
