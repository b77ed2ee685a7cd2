"""The advice rules, in the order they are tried: the one list (propose.py tries them, verify.py
reads their options and targets). A rule not listed here is never tried;
tests/diagnose/test_advice_registry.py checks every rule module under rules/ is."""

from __future__ import annotations

from tierdiag.diagnose.advice.base import Rule
from tierdiag.diagnose.advice.rules.capacity import Capacity
from tierdiag.diagnose.advice.rules.dp import Dp
from tierdiag.diagnose.advice.rules.eviction_policy import EvictionPolicy
from tierdiag.diagnose.advice.rules.in_batch import InBatch
from tierdiag.diagnose.advice.rules.nothing import Nothing
from tierdiag.diagnose.advice.rules.page_size import PageSize
from tierdiag.diagnose.advice.rules.prefetch import Prefetch
from tierdiag.diagnose.advice.rules.rate import Rate
from tierdiag.diagnose.advice.rules.router import Router
from tierdiag.diagnose.advice.rules.router_threshold import RouterThreshold
from tierdiag.diagnose.advice.rules.session import Session
from tierdiag.diagnose.advice.rules.write_policy import WritePolicy

RULES: tuple[Rule, ...] = (Rate(), Prefetch(), WritePolicy(), Session(), Capacity(), EvictionPolicy(), PageSize(),
                           Router(), RouterThreshold(), Dp(), InBatch())
# The item where no rule fires ("nothing to change in the cache").
FALLBACK: Rule = Nothing()


def rules() -> tuple[Rule, ...]:
    """The registered rules, read at call time (a test may register one more)."""
    return RULES


def rule_of(kind: str) -> Rule | None:
    """The registered rule that proposes items of `kind`; None for combined, other and none."""
    return next((r for r in rules() if kind in r.kinds), None)


def option_kinds() -> tuple[dict[str, str], frozenset[str]]:
    """(config key -> the kind of a replayed change that sets it, the keys that name the kind
    whatever else changes with them), over every registered rule."""
    kinds: dict[str, str] = {}
    dominant: set[str] = set()
    for r in rules():
        for key, kind in r.options.items():
            kinds.setdefault(key, kind)
        dominant |= r.dominant_options
    return kinds, frozenset(dominant)
