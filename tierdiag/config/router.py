"""The router keys of a data-parallel replay (`--dp N --router NAME`), declared once here (KEYS):
EngineConfig's fields take these declarations (config/engine.py, checked by config/schema.py),
and engine/routing/config.py's RouterConfig, for callers that build one directly, is checked
against them (`check_router_parameters`); engine/routing/registry.py asserts the names here are
its own.
"""

from __future__ import annotations

from typing import Any

from tierdiag.config.schema import Choice, Float, Int, Schema, check_values, key_name

# engine/routing/registry.py ROUTERS, by name (asserted equal there at import).
ROUTER_NAMES = ("round_robin", "random", "shortest_queue", "power_of_two", "session", "prefix_hash", "cache_aware")
# engine/routing/cache_aware.py CACHE_MISS_RULES (asserted equal there at import).
CACHE_MISS_NAMES = ("smallest_tree", "min_load")
MAX_DP = 256  # ranks of one replay: each has its own pools and data plane
# The approximate tree's eviction interval, in seconds: turned into ns and added to the clock
# (arrivals < 2^62 ns), so at most 10^9 s (~31 years; 10^18 ns) keeps the sum inside int64.
MAX_EVICTION_INTERVAL_S = 1e9
# The balance ratio and prefix_hash's load factor multiply loads: past a million they mean
# "never", as any larger finite value would.
MAX_RATIO = 1e6

# The declarations of the router keys (and the seed, which random and power_of_two draw with):
# EngineConfig's fields take them from here, and RouterConfig is checked against them.
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


def check_router_parameters(cfg) -> None:
    """The router_* keys (and `seed`) of an engine RouterConfig, against the declarations above;
    errors name the key."""
    check_values(_PARAMETERS, {k: getattr(cfg, k) for k in _PARAMETERS.fields if hasattr(cfg, k)}, key_name)
