"""The router keys of a data-parallel replay (`--dp N --router NAME`), checked with the rest of
the config before any work (engine/routing/config.py's RouterConfig checks them the same way for
callers that build one directly; engine/routing/registry.py asserts the names here are its own).
"""

from __future__ import annotations

import math

from tierdiag.errors import ConfigError, unknown_name

# engine/routing/registry.py ROUTERS, by name (asserted equal there at import).
ROUTER_NAMES = ("round_robin", "random", "shortest_queue", "power_of_two", "session", "prefix_hash", "cache_aware")
# engine/routing/cache_aware.py CACHE_MISS_RULES (asserted equal there at import).
CACHE_MISS_NAMES = ("smallest_tree", "min_load")
MAX_DP = 256  # ranks of one replay: each has its own pools and data plane


def check_router_keys(cfg) -> None:
    """`dp`, `router` and the router_* keys of an EngineConfig; errors name the key."""
    if isinstance(cfg.dp, bool) or not isinstance(cfg.dp, int) or not 1 <= cfg.dp <= MAX_DP:
        raise ConfigError(f"--dp {cfg.dp!r} must be an integer from 1 to {MAX_DP}")
    if cfg.router not in ROUTER_NAMES:
        raise unknown_name("--router", cfg.router, ROUTER_NAMES)
    check_router_parameters(cfg)


def check_router_parameters(cfg) -> None:
    """The router_* keys of an EngineConfig or an engine RouterConfig (both carry these names)."""
    if cfg.router_cache_miss not in CACHE_MISS_NAMES:
        raise unknown_name("router_cache_miss rule", cfg.router_cache_miss, CACHE_MISS_NAMES)
    number("router_cache_threshold", cfg.router_cache_threshold, lo=0.0, hi=1.0)
    integer("router_balance_abs_threshold", cfg.router_balance_abs_threshold, lo=0)
    number("router_balance_rel_threshold", cfg.router_balance_rel_threshold, lo=0.0, lo_open=True)
    number("router_eviction_interval_s", cfg.router_eviction_interval_s, lo=0.0)
    integer("router_max_tree_tokens", cfg.router_max_tree_tokens, lo=1)
    integer("router_prefix_hash_tokens", cfg.router_prefix_hash_tokens, lo=1)
    number("router_prefix_hash_load_factor", cfg.router_prefix_hash_load_factor, lo=0.0, lo_open=True)


def integer(key: str, value: object, *, lo: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key} {value!r} must be an integer")
    if value < lo:
        raise ConfigError(f"{key} {value} must be at least {lo}")


def number(key: str, value: object, *, lo: float, hi: float | None = None, lo_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{key} {value!r} must be a finite number")
    if value < lo or (lo_open and value == lo) or (hi is not None and value > hi):
        bounds = f"{'(' if lo_open else '['}{lo:g}, {'inf)' if hi is None else f'{hi:g}]'}"
        raise ConfigError(f"{key} {value} must be in {bounds}")
