"""explain's upgrade step: one request of NEW's run of an upgrade sweep (`replay --sglang OLD,NEW`)
against OLD's run and each rule's switch-back (upgrade.py reads the sweep and says what it is)."""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from tierdiag.config.releases import RULE_NAMES
from tierdiag.diagnose.request.claims import Claim
from tierdiag.diagnose.request.explain_result import Step
from tierdiag.diagnose.comparison.upgrade import (TTFT_MOVED_NS, UNDONE_SHARE, Outcome, request_outcomes, ttft_changed,
                                       is_upgrade_sweep, reproduces_ttft, signed_ms, sweep_members)
from tierdiag.errors import StoreError
from tierdiag.store.reader import RunInfo
from tierdiag.units import fmt_ms, fmt_pct, fmt_tokens


@dataclass(frozen=True)
class RuleOutcome:
    """The request under NEW with one rule switched back."""

    rule: str
    device_tokens: int
    host_tokens: int
    storage_tokens: int
    ttft_ms: float | None
    gives_old_split: bool | None  # None: the upgrade did not move the split
    gives_old_ttft: bool | None  # None: the upgrade did not move the TTFT


@dataclass(frozen=True)
class UpgradeEvidence:
    sweep_id: str
    old_release: str
    new_release: str
    old_run_id: str
    old_device_tokens: int
    old_host_tokens: int
    old_storage_tokens: int
    old_ttft_ms: float | None
    new_device_tokens: int
    new_host_tokens: int
    new_storage_tokens: int
    new_ttft_ms: float | None
    split_moved: bool
    ttft_delta_ms: float | None
    ttft_moved_over_1s: bool
    split_rules: tuple[str, ...]  # rules whose switch-back alone gives OLD's split
    ttft_rules: tuple[str, ...]  # rules whose switch-back alone gives OLD's TTFT (within tolerance)
    undone_sum_ms: float | None  # the single switch-backs' TTFT changes added up (overlapping)
    rules: tuple[RuleOutcome, ...]  # every rule that moved this request (split or TTFT)


def upgrade_step(con: duckdb.DuckDBPyConnection, run: RunInfo, req_id: str, number: int) -> Step | None:
    """explain's upgrade step for a request of NEW's run of an upgrade sweep (None otherwise)."""
    if not is_upgrade_sweep(run.sweep_id):
        return None
    from tierdiag.store.reader import list_runs

    members = [r for r in list_runs(con) if r.sweep_id == run.sweep_id]
    try:
        old, new, roles = sweep_members(con, members)
    except StoreError:
        return None
    if roles.get("new") is None or roles["new"].run_id != run.run_id:
        return None
    rule_roles = [n for n in RULE_NAMES if n in roles]
    ids = [roles[r].run_id for r in ("old", "new", *rule_roles)]
    rows = request_outcomes(con, ids, req_id)
    if req_id not in rows[roles["old"].run_id] or req_id not in rows[run.run_id]:
        return None
    o, n = rows[roles["old"].run_id][req_id][0], rows[run.run_id][req_id][0]
    per_rule = []
    for rule in rule_roles:
        got = rows[roles[rule].run_id].get(req_id)
        if got is None:
            continue
        b = got[0]
        if b.split == n.split and not ttft_changed(b, n):
            continue
        # whether it gives OLD's outcome back: a question only where the upgrade moved it (None: it did not)
        per_rule.append(RuleOutcome(rule, b.device, b.host, b.storage, None if b.ttft_ns is None else b.ttft_ns / 1e6,
                                    None if o.split == n.split else b.split == o.split,
                                    None if not ttft_changed(o, n) else reproduces_ttft(o, n, b)))
    delta = None if o.ttft_ns is None or n.ttft_ns is None else n.ttft_ns - o.ttft_ns
    undone = None
    if n.ttft_ns is not None and all(r.ttft_ms is not None for r in per_rule):
        undone = sum(n.ttft_ns / 1e6 - r.ttft_ms for r in per_rule)
    ev = UpgradeEvidence(
        sweep_id=run.sweep_id or "", old_release=old, new_release=new, old_run_id=roles["old"].run_id,
        old_device_tokens=o.device, old_host_tokens=o.host, old_storage_tokens=o.storage,
        old_ttft_ms=None if o.ttft_ns is None else o.ttft_ns / 1e6,
        new_device_tokens=n.device, new_host_tokens=n.host, new_storage_tokens=n.storage,
        new_ttft_ms=None if n.ttft_ns is None else n.ttft_ns / 1e6, split_moved=o.split != n.split,
        ttft_delta_ms=None if delta is None else delta / 1e6,
        ttft_moved_over_1s=ttft_changed(o, n, TTFT_MOVED_NS),
        split_rules=tuple(r.rule for r in per_rule if r.gives_old_split),
        ttft_rules=tuple(r.rule for r in per_rule if r.gives_old_ttft),
        undone_sum_ms=undone, rules=tuple(per_rule))
    claims = upgrade_claims(ev, o, n)
    return Step(number, "upgrade", " ".join(c.text for c in claims), ev, claims)


def _ttft(ns: float | None) -> str:
    return "no TTFT (not finished)" if ns is None else fmt_ms(ns)


def upgrade_claims(ev: UpgradeEvidence, o: Outcome, n: Outcome) -> tuple[Claim, ...]:
    """The step's sentences, each from the evidence's named numbers (times: the rows' ns)."""
    old, new = ev.old_release, ev.new_release
    claims = []
    if not ev.split_moved and not ev.ttft_moved_over_1s:
        claims.append(Claim("upgrade_same", (
            f"Under SGLang {old}'s rules (run {ev.old_run_id}) this request had the same tier split "
            f"({o.split_text()}) and a TTFT of {_ttft(o.ttft_ns)} against {_ttft(n.ttft_ns)} here, within "
            f"{fmt_ms(TTFT_MOVED_NS)}: the upgrade did not change its outcome.")))
        return tuple(claims)
    both = o.ttft_ns is not None and n.ttft_ns is not None
    claims.append(Claim("upgrade_outcome", (
        f"Under SGLang {old}'s rules (run {ev.old_run_id}) this request's split was {o.split_text()} and its TTFT "
        f"{_ttft(o.ttft_ns)}; under {new}'s, {n.split_text()} and {_ttft(n.ttft_ns)}"
        + (f" ({signed_ms(n.ttft_ns - o.ttft_ns)})." if both else "."))))
    if ev.split_moved:
        if len(ev.split_rules) == 1:
            claims.append(Claim("upgrade_split_rule", (
                f"Switching {ev.split_rules[0]} ({RULE_NAMES[ev.split_rules[0]].title}) back to {old}'s alone gives "
                f"{old}'s split: that rule changed it.")))
        elif ev.split_rules:
            claims.append(Claim("upgrade_split_rule", (
                f"Each of {', '.join(ev.split_rules)} switched back to {old}'s alone gives {old}'s split: the change "
                f"needs all of them (with any one back it is gone).")))
        else:
            movers = [r for r in ev.rules if (r.device_tokens, r.host_tokens, r.storage_tokens) != n.split]
            listed = "; ".join(f"{r.rule}: device {fmt_tokens(r.device_tokens)} / host {fmt_tokens(r.host_tokens)} / "
                               f"storage {fmt_tokens(r.storage_tokens)}" for r in movers[:4])
            claims.append(Claim("upgrade_split_rule", (
                f"No rule switched back to {old}'s alone gives {old}'s split"
                + (f" (those that move it: {listed}{'; ...' if len(movers) > 4 else ''})" if movers else
                   " (none moves it alone)")
                + ": several rules together changed it.")))
    if ev.ttft_moved_over_1s and both:
        change_ns = n.ttft_ns - o.ttft_ns
        within = f"within {fmt_pct(1 - UNDONE_SHARE)} of the {signed_ms(change_ns)} change from {old}'s {_ttft(o.ttft_ns)}"
        by_rule = {r.rule: r for r in ev.rules}
        if len(ev.ttft_rules) == 1:
            r = by_rule[ev.ttft_rules[0]]
            claims.append(Claim("upgrade_ttft_rule", (
                f"Switching {r.rule} back to {old}'s alone leaves its TTFT {signed_ms(r.ttft_ms * 1e6 - o.ttft_ns)} "
                f"from {old}'s, {within}: that rule accounts for it.")))
        elif ev.ttft_rules:
            claims.append(Claim("upgrade_ttft_rule", (
                f"Each of {', '.join(ev.ttft_rules)} switched back to {old}'s alone brings its TTFT {within}: the "
                f"change needs all of them.")))
        else:
            timed = [r for r in ev.rules if r.ttft_ms is not None]
            text = f"No rule switched back to {old}'s alone brings its TTFT {within}"
            if timed:
                closest = min(timed, key=lambda r: abs(r.ttft_ms * 1e6 - o.ttft_ns))
                back = (n.ttft_ns - closest.ttft_ms * 1e6) / change_ns
                text += (f" (closest: {closest.rule}, {signed_ms(closest.ttft_ms * 1e6 - o.ttft_ns)} from it, moving "
                         f"it back {fmt_pct(back)} of the change)")
            if ev.undone_sum_ms is not None and timed:
                text += (f"; the {len(timed)} single switch-backs that move it move it back "
                         f"{signed_ms(ev.undone_sum_ms * 1e6)} added up, against the {signed_ms(change_ns)} change "
                         "(overlapping parts, not a decomposition)")
            elif not ev.rules:
                text += " (no rule switched back alone moves it at all: only their combination does)"
            claims.append(Claim("upgrade_ttft_rule", text + ": several rules together changed it."))
    return tuple(claims)
