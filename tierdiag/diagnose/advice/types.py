"""Advice as data: the typed item a rule proposes (`Advice`), what a replay measured of it
(`Verified`), and its status (DESIGN §6: proposed, confirmed, no_effect, refuted; `classify`).
The rules are rules/'s (registry.py lists them); what `advise` replayed is read by verify.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tierdiag.diagnose.advice.targets import words as target_words
from tierdiag.units import fmt_ms, fmt_pct

# Verification (DESIGN §6 "Advice status"): replays are deterministic, so these are not noise
# margins but what is worth a change: 5 % of the median TTFT, without the tail paying for it.
CONFIRM_P50_GAIN = 0.05
P99_TOLERANCE = 0.05
STATUSES = ("proposed", "confirmed", "no_effect", "refuted")
ADVISED = ("proposed", "confirmed")
# At most this many confirmed items are replayed together (the best, by their p50 gain).
COMBINE_MAX = 3
# The kind of several rules' changes replayed together (verify.combination, verify.kind_of).
COMBINED = "combined"
# The size options a rule proposes, and the tier whose size curve (size_curves.py) predicts them:
# an item setting one carries `sizing`, the curve's prediction at its value beside what its one
# replay found; they disagree where the two shares of input differ by more than SIZING_TOLERANCE.
SIZE_KEYS = {"device_tokens": "device", "host_tokens": "host", "storage_tokens": "storage"}
SIZING_TOLERANCE = 0.05


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
    target: str | None = None  # the share the change targeted (its rule's Target), None: TTFT alone
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
            text += (f", {target_words(self.target)} {fmt_pct(self.target_before)} → "
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
    its rule's Target); None: no target, or not measured on one side."""
    if v.target is None or v.target_before is None or v.target_after is None:
        return None
    return v.target_after < v.target_before


@dataclass(frozen=True)
class Sizing:
    """A size item's one-pass prediction (the tier's size curve, size_curves.py) beside what its
    replay found: reused tokens in that tier or above, as shares of the finished requests' input."""

    option: str
    tier: str  # SIZE_KEYS[option]
    value: int
    knee_tokens: int | None  # the curve's knee (size_curves.KNEE_SHARE of its plateau)
    predicted_share: float | None  # the curve at `value`
    run_size_tokens: int
    run_predicted_share: float | None  # the curve at the run's own size ...
    run_found_share: float | None  # ... and what the run's rows found there: the model's error on the run itself
    replayed_share: float | None = None  # what the item's replay found; None: not replayed
    replay_run_id: str | None = None
    also_changed: tuple[str, ...] = ()  # other keys the item sets: the curve held them at the run's values
    slack_tokens: int = 0  # what a proposal adds to the knee (size_curves.SizeCurves.slack_tokens)
    curve_size_tokens: int | None = None  # the size the curve proposes: knee + slack, whole pages

    @property
    def disagrees(self) -> bool | None:
        """Whether prediction and replay differ by more than SIZING_TOLERANCE (None: not replayed)."""
        if self.replayed_share is None or self.predicted_share is None:
            return None
        return abs(self.replayed_share - self.predicted_share) > SIZING_TOLERANCE

    def to_json(self) -> dict:
        return {**{k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()},
                "disagrees": self.disagrees, "tolerance": SIZING_TOLERANCE}

    def words(self) -> str:
        """"one-pass size curve (LRU): at host_tokens = 28_672 (the knee 26_688 + the median
        request's prefix 1_984) ... predicted 75 %; the
        replay found 70 %: they agree within 5 points", every number named."""
        where = {"device": "device", "host": "device and host", "storage": "device, host and storage"}[self.tier]
        knee = ("" if self.knee_tokens is None else
                f" (the knee {_toml(self.knee_tokens)} + the median request's prefix {_toml(self.slack_tokens)})"
                if self.value == self.curve_size_tokens else " (the knee)" if self.value == self.knee_tokens
                else f" (the knee: {_toml(self.knee_tokens)})")
        text = (f"one-pass size curve (LRU): at {self.option} = {_toml(self.value)}{knee} {where} find "
                f"{fmt_pct(self.predicted_share)} of input, predicted (at the run's {_toml(self.run_size_tokens)}: "
                f"{fmt_pct(self.run_predicted_share)} predicted, {fmt_pct(self.run_found_share)} found)")
        if self.also_changed:
            text += f", with {', '.join(self.also_changed)} held at the run's"
        if self.replayed_share is None:
            return text
        text += f"; the replay found {fmt_pct(self.replayed_share)}"
        gap = (self.replayed_share - self.predicted_share) * 100 if self.predicted_share is not None else None
        if self.disagrees:
            text += (f": they disagree by {abs(gap):,.1f} points (more than {SIZING_TOLERANCE * 100:,.0f}), the "
                     "model is LRU over pages with no locks, eviction timing or prefetch rules")
        elif gap is not None:
            text += f": they agree within {SIZING_TOLERANCE * 100:,.0f} points"
        return text


@dataclass(frozen=True)
class Advice:
    kind: str  # one of its rule's kinds (base.Rule.kinds); none; combined; other (verify.kind_of)
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
    sizing: Sizing | None = None  # a size item's one-pass prediction beside its replay (SIZE_KEYS)
    cost_ranks: int = 1  # the data-parallel ranks that each pay cost_gib (a host pool is per rank)
    host_limit_words: str | None = None  # what caps a host pool (a server's host memory per GPU)

    @property
    def combined(self) -> bool:
        """Several rules' changes together (kind COMBINED)."""
        return self.kind == COMBINED

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
        elif v is not None:
            text += f" — tried in run {v.run_id}, {self.status.replace('_', ' ')}: {v.numbers()}"
        if self.sizing is not None:
            text += f"; {self.sizing.words()}"
        return text

    def tried_line(self) -> str:
        """A tried item that is not advice: what it set, what the replay measured, and why not."""
        v = self.verified
        why = {"refuted": "it made TTFT worse", "no_effect": _no_effect_why(self)}.get(self.status, self.status)
        return (f"{self.settings()} ({self.kind}): {why} — run {v.run_id if v else '?'}: "
                + (v.numbers() if v else "not measured") + (f"; {self.sizing.words()}" if self.sizing else ""))


def _no_effect_why(a: "Advice") -> str:
    v = a.verified
    if v is None or v.ttft_p50_ms_before is None or v.ttft_p50_ms_after is None:
        return "nothing was measured"
    if v.ttft_p50_ms_after > v.ttft_p50_ms_before * (1 - CONFIRM_P50_GAIN):
        return f"TTFT p50 did not improve by {fmt_pct(CONFIRM_P50_GAIN)}"
    if a.combined:
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


