"""`replay TRACE --sglang OLD,NEW`: the replays of an SGLang upgrade, through the sweep runner.

One run under OLD's rules, one under NEW's, and one under NEW's per rule in which the releases
differ with that rule alone switched back to OLD's (`sglang_switched_back`), all in one store
under one sweep id (`UPGRADE_SWEEP_PREFIX`...). diagnose/upgrade.py reads them back.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from tierdiag.config.engine import EngineConfig
from tierdiag.config.releases import RELEASES
from tierdiag.diagnose.upgrade import UPGRADE_SWEEP_PREFIX
from tierdiag.engine.rules import differing_rules
from tierdiag.errors import ConfigError


@dataclass(frozen=True)
class UpgradePlan:
    old: str
    new: str
    configs: tuple[tuple[str, EngineConfig], ...]  # (run name, config): OLD, NEW, then one a rule
    rules: tuple[str, ...]  # the rules switched back, one a run, in the order of configs[2:]


def parse_releases(text: str) -> tuple[str, ...]:
    """`--sglang`'s value: one release, or two (OLD,NEW in either order) for the upgrade view.
    Each element is checked as a single `--sglang` is (EngineConfig's names); the same one
    twice, more than two, or an empty element is a ConfigError (exit 2)."""
    if not isinstance(text, str):
        raise ConfigError(f"--sglang {text!r} must be a release or two, comma-separated")
    parts = [p.strip() for p in text.split(",")]
    shown = text if len(text) <= 80 else text[:77] + "..."
    if len(parts) > 2:
        raise ConfigError(f"--sglang {shown!r}: at most two releases (OLD,NEW), got {len(parts)}")
    for p in parts:
        if not p:
            raise ConfigError(f"--sglang {shown!r}: an empty release name; known: {', '.join(RELEASES)}")
        if p not in RELEASES:
            raise ConfigError(f"--sglang {shown!r}: unknown release {p[:40]!r}; known: {', '.join(RELEASES)}")
    if len(parts) == 2 and parts[0] == parts[1]:
        raise ConfigError(f"--sglang {shown!r} names SGLang {parts[0]} twice",
                          hint=f"an upgrade needs two releases, e.g. --sglang {RELEASES[1]},{RELEASES[0]}")
    return tuple(parts)


def ordered(releases: Sequence[str]) -> tuple[str, str]:
    """(OLD, NEW) of two releases, whichever order they were given in."""
    old, new = sorted(releases, key=RELEASES.index, reverse=True)
    return old, new


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


def run_upgrade(trace: str | Path, plan: UpgradePlan, db: str | Path, *, jobs: int | None = None,
                sweep_id: str | None = None, skip_bad: bool = False, command_line: Sequence[str] | None = None,
                progress=None) -> list[str]:
    """Replay the plan's configs through the sweep runner (`--jobs` processes); the run ids in
    the plan's order. Errors and interrupts as `sweep.run_configs`'."""
    from tierdiag.app.sweep import Processes, run_configs

    return run_configs(trace, plan.configs, db, backend=Processes(jobs), sweep_id=sweep_id or new_upgrade_id(),
                       skip_bad=skip_bad, command_line=command_line, progress=progress)


