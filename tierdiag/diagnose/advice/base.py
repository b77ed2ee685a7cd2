"""What every advice rule is (`Rule`), what it reads (`Evidence`), and the bars and sizes all
rules share: a loss worth a change (MIN_LOSS_SHARE), the host memory a server has for KV.

A rule is one object in one file under rules/, listed once in registry.py:

    trigger(ev)     the items it proposes from the run's evidence (none, one, or one per option)
    sentence(...)   each item's reason: a Claim built from the named numbers its trigger computed,
                    so tests/diagnose/test_advice_claims.py can recompute every number from the rows
    prediction(...) what its change is expected to do under the run's own rules, in words (None:
                    not predicted)
    target          how its replay is judged beside TTFT (types.classify): the run share its change
                    must lower (targets.py), measured on the baseline and on the replay
    kinds           the Advice kinds it proposes; options: the config keys it owns (a replayed
                    change that sets only those is of its kind, verify.kind_of)
    place(ev)       where its items go among the others: -1 first, 0 in the registry's order, 1 last
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from tierdiag.units import fmt_bytes

if TYPE_CHECKING:
    from tierdiag.diagnose.advice.targets import Target
    from tierdiag.diagnose.advice.types import Advice
    from tierdiag.diagnose.request.claims import Claim
    from tierdiag.diagnose.run.runcontext import RunContext
    from tierdiag.diagnose.session.session_pool import SessionPauses

# A rule fires only when its tokens are known, more than none, and at least this share of a known,
# non-empty input (`significant`): below that, the cache is not what is worth changing.
MIN_LOSS_SHARE = 0.05
# A real server's host memory per GPU: an 8-GPU server (DGX H100 / H200: 2 TiB of system memory)
# has 256 GiB beside each GPU, and each data-parallel rank's scheduler allocates its own host pool
# there. `advise --host-memory` replaces it.
SERVER_HOST_BYTES = 2 << 40
SERVER_GPUS = 8
HOST_POOL_LIMIT_BYTES = SERVER_HOST_BYTES // SERVER_GPUS
DEFAULT_LIMIT_WORDS = (f"a GPU has in an {SERVER_GPUS}-GPU server with {SERVER_HOST_BYTES >> 40} TiB of host memory "
                       f"({HOST_POOL_LIMIT_BYTES >> 30} GiB per GPU)")
GIB = 1 << 30


@dataclass(frozen=True)
class Evidence:
    """What a rule reads: the run's context, and what `advise` or `summary` adds to it."""

    ctx: RunContext
    sessions: SessionPauses | None = None  # the run's later session turns (session_pool); None: none known
    curves: object | None = None  # the run's size curves (size_curves.SizeCurves); None: not computed
    host_limit_bytes: int = HOST_POOL_LIMIT_BYTES  # the most host memory a server has for KV per GPU


class Rule(ABC):
    """One advice rule (module doc)."""

    kinds: ClassVar[tuple[str, ...]]
    options: ClassVar[dict[str, str]]  # config key -> the kind of a replayed change that sets it
    # Keys whose change names the kind whatever else changes with it (a storage tier comes with its
    # prefetch policy and host room).
    dominant_options: ClassVar[frozenset[str]] = frozenset()
    target: ClassVar[Target | None]

    @abstractmethod
    def trigger(self, ev: Evidence) -> list[Advice]:
        """The items the run's evidence calls for; [] where the rule does not fire."""

    @abstractmethod
    def sentence(self, **numbers) -> Claim:
        """An item's reason, from the named numbers `trigger` computed."""

    @abstractmethod
    def prediction(self, **numbers) -> str | None:
        """What the change is expected to do, in words; None: not predicted."""

    def place(self, ev: Evidence) -> int:
        """-1: this rule's items lead; 1: they go last; 0: the registry's order."""
        return 0


def limit_words(host_limit_bytes: int) -> str:
    """What caps a host pool, in words: the default's server, or --host-memory's size."""
    return (DEFAULT_LIMIT_WORDS if host_limit_bytes == HOST_POOL_LIMIT_BYTES
            else f"of the {fmt_bytes(host_limit_bytes)} --host-memory gives each GPU")


def significant(tokens: int | None, input_tokens: int | None) -> bool:
    """A rule's tokens are worth a change: known, more than none, and at least MIN_LOSS_SHARE of
    a known, non-empty input. Unknown (None) stays unknown: no rule fires from it."""
    return bool(tokens) and bool(input_tokens) and tokens >= MIN_LOSS_SHARE * input_tokens


def pow2_at_least(n: int, page: int) -> int:
    p = max(page, 1)
    while p < n:
        p *= 2
    return p


def pow2_at_most(n: int) -> int:
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


def gib(tokens: int, kv: int | None) -> float | None:
    return None if not kv else tokens * kv / GIB


def covered(deciles: tuple, capacity: int) -> float | None:
    """Share (to the decile) of re-referenced removed tokens whose reuse distance fits `capacity`."""
    if not deciles:
        return None
    return max((i / 10 for i, d in enumerate(deciles) if d <= capacity), default=0.0)
