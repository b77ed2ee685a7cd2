"""The router keys of a data-parallel replay (`--dp N --router NAME`). Their types and bounds are
declared with the rest of the config (config/engine.py EngineConfig, checked by config/schema.py);
engine/routing/config.py's RouterConfig, for callers that build one directly, is checked against
the same declarations (`check_router_parameters`); engine/routing/registry.py asserts the names
here are its own.
"""

from __future__ import annotations

from typing import Any

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

_SCHEMA: list[Any] = []


def register_router_schema(schema) -> None:
    """The replay config's schema (config/engine.py), whose router_* and seed declarations
    RouterConfig is checked against."""
    _SCHEMA[:] = [schema]


def check_router_parameters(cfg) -> None:
    """The router_* keys (and `seed`) of an engine RouterConfig, against EngineConfig's
    declarations of the same keys; errors name the key."""
    import tierdiag.config.engine  # noqa: F401 - registers the schema
    from tierdiag.config.schema import check_values, key_name

    schema = _SCHEMA[0]
    keys = [k for k in schema.fields if (k.startswith("router_") or k == "seed") and hasattr(cfg, k)]
    check_values(schema, {k: getattr(cfg, k) for k in keys}, key_name)
