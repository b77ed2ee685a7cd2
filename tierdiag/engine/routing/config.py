"""RouterConfig: the router's options, validated before any work.

Field names are the TOML keys (`router`, `router_cache_threshold`, ...), so EngineConfig can carry
the same fields and hand them over with `RouterConfig.from_config(engine_config)`. Defaults are
the SGLang model gateway's command-line defaults (RouterArgs, sglang_router/router_args.py).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from tierdiag.config.router import check_router_parameters
from tierdiag.errors import unknown_name
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
        check_router_parameters(self)  # the replay config's declarations of these keys and seed (config/router.py)

    @classmethod
    def from_config(cls, config: object) -> "RouterConfig":
        """The fields of this class read off any object that has them (EngineConfig, once it
        carries the router keys); a missing one keeps its default."""
        return cls(**{f.name: getattr(config, f.name) for f in fields(cls) if hasattr(config, f.name)})

