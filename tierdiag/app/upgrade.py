"""`replay TRACE --sglang OLD,NEW`: the replays of an SGLang upgrade, planned for the sweep runner.

One run under OLD's rules, one under NEW's, and one under NEW's per rule in which the releases
differ with that rule alone switched back to OLD's (`sglang_switched_back`): `plan_upgrade`'s
configs, replayed by `sweep.run_configs` into one store under one sweep id (`new_upgrade_id`,
`UPGRADE_SWEEP_PREFIX`...). diagnose/comparison/upgrade.py reads them back.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from dataclasses import dataclass
from typing import Sequence

from tierdiag.config.engine import EngineConfig
from tierdiag.config.releases import ordered
from tierdiag.diagnose.comparison.upgrade import UPGRADE_SWEEP_PREFIX
from tierdiag.engine.rules import differing_rules
from tierdiag.errors import ConfigError


@dataclass(frozen=True)
class UpgradePlan:
    old: str
    new: str
    configs: tuple[tuple[str, EngineConfig], ...]  # (run name, config): OLD, NEW, then one a rule
    rules: tuple[str, ...]  # the rules switched back, one a run, in the order of configs[2:]


def plan_upgrade(cfg: EngineConfig, releases: Sequence[str], run_name: str) -> UpgradePlan:
    """The configs to replay: `cfg` (whatever its own release) under OLD, NEW, and NEW with each
    differing rule switched back. An option one of the releases lacks is the ConfigError that
    release's config raises, saying which release (exit 2)."""
    old, new = ordered(releases)
    if cfg.sglang_switched_back:
        raise ConfigError("--sglang OLD,NEW switches rules back itself: leave sglang_switched_back unset "
                          f"(the config has {cfg.sglang_switched_back!r})")

    def at(version: str, back: str | None = None) -> EngineConfig:
        try:
            return dataclasses.replace(cfg, sglang_rules=version, sglang_switched_back=back)
        except ConfigError as exc:
            raise ConfigError(f"--sglang {old},{new}: under SGLang {version}: {exc.message}") from None

    rules = differing_rules(old, new)
    configs = [(f"{run_name} sglang {old}", at(old)), (f"{run_name} sglang {new}", at(new))]
    configs += [(f"{run_name} sglang {new}, {rule} as {old}", at(new, rule)) for rule in rules]
    return UpgradePlan(old, new, tuple(configs), rules)


def new_upgrade_id() -> str:
    return UPGRADE_SWEEP_PREFIX + time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
