"""Advice as data: the typed item a rule proposes (`Advice`), what a replay measured of it
(`Verified`), and its status (DESIGN §6: proposed, confirmed, no_effect, refuted; `classify`).
The rules are advice.py's; what `advise` replayed is read by advice_verify.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tierdiag.units import fmt_ms, fmt_pct

# Verification (DESIGN §6 "Advice status"): replays are deterministic, so these are not noise
# margins but what is worth a change: 5 % of the median TTFT, without the tail paying for it.
CONFIRM_P50_GAIN = 0.05
P99_TOLERANCE = 0.05
STATUSES = ("proposed", "confirmed", "no_effect", "refuted")
ADVISED = ("proposed", "confirmed")
# At most this many confirmed items are replayed together (the best, by their p50 gain).
COMBINE_MAX = 3
# kind -> the run share the change targets, which it must lower: a change that sped TTFT up
# without lowering its target did not work the way its rule claimed.
TARGETS: dict[str, str] = {
    "prefetch": "recompute_share", "write_policy": "recompute_share", "capacity": "recompute_share",
    "storage_tier": "recompute_share", "eviction_policy": "recompute_share",
    "page_size": "loadback_exposed_share", "rate": "queue_share", "session": "session_recompute_share",
    "router": "routing_share", "router_threshold": "routing_share", "dp": "queue_excess_share",  # advice_routing_loss.py
}
# Sizes `advise` searches down (issue 34): for a confirmed item setting one of these, the smallest
# value whose replay keeps at least SUFFICIENT_GAIN_SHARE of the largest tried value's TTFT p50 gain.
SIZE_KEYS = ("host_tokens", "storage_tokens", "device_tokens")
SUFFICIENT_GAIN_SHARE = 0.9
_TARGET_WORDS = {"recompute_share": "recompute share of input", "loadback_exposed_share":
                 "exposed load-back share of TTFT", "queue_share": "queueing share of TTFT",
                 "session_recompute_share": "recompute share of later session turns' input",
                 "routing_share": "routing-lost share of input", "queue_excess_share": "queueing share of excess TTFT"}


@dataclass(frozen=True)
class Verified:
    run_id: str
    ttft_p50_ms_before: float | None
    ttft_p50_ms_after: float | None
    ttft_p99_ms_before: float | None
    ttft_p99_ms_after: float | None
    recompute_share_before: float | None
    recompute_share_after: float | None
    req_id: str | None = None  # set when attached to one request's explain
    ttft_ms_before: float | None = None
    ttft_ms_after: float | None = None
    target: str | None = None  # the share the change targeted (TARGETS), None: TTFT alone
    target_before: float | None = None
    target_after: float | None = None

    def to_json(self) -> dict:
        return dict(self.__dict__)

    def numbers(self) -> str:
        """What the replay measured, in words: TTFT p50 and p99 before -> after, and the target."""
        text = (f"TTFT p50 {fmt_ms_value(self.ttft_p50_ms_before)} → {fmt_ms_value(self.ttft_p50_ms_after)}"
                f"{_change(self.ttft_p50_ms_before, self.ttft_p50_ms_after)}, p99 "
                f"{fmt_ms_value(self.ttft_p99_ms_before)} → {fmt_ms_value(self.ttft_p99_ms_after)}"
                f"{_change(self.ttft_p99_ms_before, self.ttft_p99_ms_after)}")
        if self.target is not None:
            text += (f", {_TARGET_WORDS.get(self.target, self.target)} {fmt_pct(self.target_before)} → "
                     f"{fmt_pct(self.target_after)}")
            if target_moved(self) is False and self.ttft_p50_ms_before and self.ttft_p50_ms_after is not None \
                    and self.ttft_p50_ms_after <= self.ttft_p50_ms_before * (1 - CONFIRM_P50_GAIN):
                text += " (TTFT fell though that share did not: not the way its rule predicted)"
        if self.req_id is not None:
            text += f"; this request {fmt_ms_value(self.ttft_ms_before)} → {fmt_ms_value(self.ttft_ms_after)}"
        return text


def _change(before: float | None, after: float | None) -> str:
    if not before or after is None:
        return ""
    return f" ({(after - before) / before * 100:+,.1f} %)"


def classify(v: Verified) -> str:
    """confirmed | no_effect | refuted, from what one replay measured against the baseline: by the
    request-level result every item promises, TTFT (p50 at least CONFIRM_P50_GAIN better, p99 not
    more than P99_TOLERANCE worse). The share its rule targeted is measured and shown beside it
    (`target_moved`), not a criterion: a change that cut the median TTFT did what a user wants of
    it, whichever way the share moved (`dp = 5` cut p50 from 261.5 to 53.2 ms while queueing's share
    of a smaller excess grew)."""
    b50, a50, b99, a99 = v.ttft_p50_ms_before, v.ttft_p50_ms_after, v.ttft_p99_ms_before, v.ttft_p99_ms_after
    if b50 is None or a50 is None:
        return "no_effect"  # nothing finished on one side: nothing measured to advise on
    p99_worse = b99 is not None and a99 is not None and a99 > b99 * (1 + P99_TOLERANCE)
    if a50 >= b50 * (1 + CONFIRM_P50_GAIN) or p99_worse:
        return "refuted"
    return "confirmed" if a50 <= b50 * (1 - CONFIRM_P50_GAIN) else "no_effect"


def target_moved(v: Verified) -> bool | None:
    """Whether the share the change targeted fell (every target is a share its change must lower,
    TARGETS); None: no target, or not measured on one side."""
    if v.target is None or v.target_before is None or v.target_after is None:
        return None
    return v.target_after < v.target_before


@dataclass(frozen=True)
class SizePoint:
    """One size replayed (or the run itself): its TTFT p50 and the share of the largest tried
    value's p50 gain it kept (0 for the run's own size, by definition)."""

    value: int
    run_id: str
    ttft_p50_ms: float | None
    gain_share: float | None

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Sizing:
    """The gain curve `advise` measured for a size item (app/advise.py's bisection) and the
    smallest value keeping SUFFICIENT_GAIN_SHARE of the largest tried value's TTFT p50 gain."""

    option: str
    largest: int  # the value the rule proposed (its replay is the curve's top)
    smallest_sufficient: int
    points: tuple[SizePoint, ...]  # ascending by value: the run's own, each size tried, the largest
    short_of: int | None  # the largest value tried below smallest_sufficient (it fell short); None: none

    def to_json(self) -> dict:
        return {"option": self.option, "largest": self.largest, "smallest_sufficient": self.smallest_sufficient,
                "sufficient_gain_share": SUFFICIENT_GAIN_SHARE, "short_of": self.short_of,
                "points": [p.to_json() for p in self.points]}

    def words(self) -> str:
        """"smallest sufficient host_tokens = 32_768 (...); gain curve: ...", every number named."""
        best = next(p for p in self.points if p.value == self.smallest_sufficient)
        text = (f"smallest sufficient {self.option} = {_toml(self.smallest_sufficient)}: it keeps "
                f"{fmt_pct(best.gain_share)} of the TTFT p50 gain of {_toml(self.largest)} "
                f"(at least {fmt_pct(SUFFICIENT_GAIN_SHARE)})")
        if self.short_of is not None:
            text += f", {_toml(self.short_of)} fell short"
        return text + "; gain curve (value: TTFT p50, share of the gain): " + ", ".join(
            f"{_toml(p.value)}: {fmt_ms_value(p.ttft_p50_ms)}, {fmt_pct(p.gain_share)}" for p in self.points)


@dataclass(frozen=True)
class Advice:
    kind: str  # prefetch | write_policy | session | capacity | storage_tier | eviction_policy | page_size | none
    option: str | None  # the --config TOML key (None: nothing to change)
    value: Any
    changes: dict  # every key to apply together (option included)
    reason: str
    evidence: dict = field(default_factory=dict)
    cost_gib: float | None = None  # extra memory (host) or disk (storage) it takes
    cost_kind: str | None = None  # host_memory | disk | None
    verified: Verified | None = None  # what a replay measured (whatever its status)
    status: str = "proposed"  # STATUSES: proposed until `advise` replayed it
    prediction: str | None = None  # what the rule expects under the run's own rules, in words
    sizing: Sizing | None = None  # a confirmed size item's gain curve, once `advise` searched it
    cost_ranks: int = 1  # the data-parallel ranks that each pay cost_gib (a host pool is per rank)
    host_limit_words: str | None = None  # what caps a host pool (a server's host memory per GPU)

    @property
    def advised(self) -> bool:
        """Shown as advice: proposed (not tried yet) or confirmed by a replay."""
        return self.status in ADVISED

    def to_json(self) -> dict:
        return {"option": self.option, "value": self.value, "reason": self.reason,
                "verified": self.verified.to_json() if self.verified else None,
                "status": self.status, "prediction": self.prediction,
                "sizing": self.sizing.to_json() if self.sizing else None,
                "kind": self.kind, "changes": dict(self.changes), "evidence": dict(self.evidence),
                "cost_gib": self.cost_gib, "cost_kind": self.cost_kind, "cost_ranks": self.cost_ranks,
                "host_limit_words": self.host_limit_words}

    def settings(self) -> str:
        return ", ".join(f"{k} = {_toml(v)}" for k, v in self.changes.items())

    def line(self) -> str:
        """One line for the terminal: what to set, why, at what cost, and what a replay measured
        ("verified" only for a confirmed item; a tried one that did not help says so instead)."""
        if self.option is None:
            return self.reason
        text = f"set {self.settings()}: {self.reason}"
        if self.prediction:
            text += f"; {self.prediction}"
        if self.cost_gib is not None and self.cost_kind == "host_memory":
            text += f" (costs {self.cost_gib:,.0f} GiB of host memory"
            if self.cost_ranks > 1:
                text += (f" per rank, {self.cost_gib * self.cost_ranks:,.0f} GiB over the {self.cost_ranks} ranks "
                         "(each scheduler allocates its own host pool)")
            text += f"; a host pool is capped by the host memory {self.host_limit_words})" if self.host_limit_words else ")"
        elif self.cost_gib is not None:
            text += f" (costs {self.cost_gib:,.0f} GiB of disk)"
        v = self.verified
        if v is not None and self.status == "confirmed":
            text += f" — verified by run {v.run_id}: {v.numbers()}"
            if self.sizing is not None:
                text += f"; {self.sizing.words()}"
        elif v is not None:
            text += f" — tried in run {v.run_id}, {self.status.replace('_', ' ')}: {v.numbers()}"
        return text

    def tried_line(self) -> str:
        """A tried item that is not advice: what it set, what the replay measured, and why not."""
        v = self.verified
        why = {"refuted": "it made TTFT worse", "no_effect": _no_effect_why(self)}.get(self.status, self.status)
        return (f"{self.settings()} ({self.kind}): {why} — run {v.run_id if v else '?'}: "
                + (v.numbers() if v else "not measured"))


def _no_effect_why(a: "Advice") -> str:
    v = a.verified
    if v is None or v.ttft_p50_ms_before is None or v.ttft_p50_ms_after is None:
        return "nothing was measured"
    if v.ttft_p50_ms_after > v.ttft_p50_ms_before * (1 - CONFIRM_P50_GAIN):
        return f"TTFT p50 did not improve by {fmt_pct(CONFIRM_P50_GAIN)}"
    if a.kind == "combined":
        return "together they were no better than the best of them alone"
    return f"TTFT p50 improved by {fmt_pct(CONFIRM_P50_GAIN)} or more, yet it was not confirmed"


def advised(items: tuple["Advice", ...]) -> tuple["Advice", ...]:
    return tuple(a for a in items if a.advised)


def tried_not_advised(items: tuple["Advice", ...]) -> tuple["Advice", ...]:
    return tuple(a for a in items if not a.advised)


def advice_json(items: tuple["Advice", ...]) -> dict:
    """`advice` (proposed and confirmed) and `tried_not_advised` (no_effect, refuted) of --json."""
    return {"advice": [a.to_json() for a in advised(items)],
            "tried_not_advised": [a.to_json() for a in tried_not_advised(items)]}


def fmt_ms_value(ms: float | None) -> str:
    return fmt_ms(None if ms is None else ms * 1e6)


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, int) and abs(v) >= 10_000:
        return f"{v:_}"  # TOML's digit separator: 16_777_216 reads, and pastes into --config as is
    return str(v)


