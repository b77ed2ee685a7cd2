"""What an SGLang upgrade moves, rule by rule: the runs of `replay TRACE --sglang OLD,NEW`.

The upgrade sweep (`UPGRADE_SWEEP_PREFIX` + time) holds one run under OLD's rules, one under
NEW's, and one under NEW's per rule with that rule alone switched back to OLD's
(`sglang_switched_back`). Their roles are read from their recorded configs, never from names.

    OLD ─────────────── the whole upgrade ───────────────► NEW
                          NEW with rule r back ──── r's effect ──► NEW

A rule's row compares NEW with rule r switched back against NEW: what r moves under NEW. Rules
interact, and one moved request moves every later one under a busy GPU, so the rows overlap:
they are not a decomposition of the upgrade and are never summed as one (the view states
their sum beside the upgrade's total as exactly that, a sum of overlapping counts).

A request's upgrade change (its tier split, or its TTFT by more than `TTFT_MOVED_NS`) is
attributed to a rule only when switching that rule back alone reproduces OLD's outcome: the
same split, or a TTFT within `(1 - UNDONE_SHARE)` of the change from OLD's. When no single
switch-back does, the answer is "several rules together"; when several each do alone, it is
all of them (each is needed). `upgrade_step` (upgrade_step.py) says this for one request in `explain`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import duckdb

from tierdiag.config.releases import RELEASES, RULE_NAMES, switched_back_names
from tierdiag.diagnose.read.quantile import nearest_rank
from tierdiag.diagnose.read.queries import outcome_rows
from tierdiag.diagnose.read.run import parse
from tierdiag.engine.rules import differing_rules, unnamed_fields
from tierdiag.errors import StoreError
from tierdiag.store.reader import RunInfo
from tierdiag.units import NS_PER_S, fmt_ms, fmt_tokens

UPGRADE_SWEEP_PREFIX = "upgrade-"
TTFT_MOVED_NS = 1 * NS_PER_S  # "TTFT moved by more than 1 s"
# A rule accounts for a request's TTFT change when switching it back alone leaves at most
# 1 - UNDONE_SHARE of the change from OLD's TTFT (its TTFT then within 20 % of the change of OLD's).
UNDONE_SHARE = 0.8
DEFAULT_TOP = 5
SHOWN_IDS = 20  # moved request ids listed per rule in --json


@dataclass(frozen=True)
class Outcome:
    """One request in one run: its tier split and TTFT (None: rejected or unfinished)."""

    device: int
    host: int
    storage: int
    computed: int
    ttft_ns: int | None

    @property
    def split(self) -> tuple[int, int, int]:
        return self.device, self.host, self.storage

    def split_text(self) -> str:
        return (f"device {fmt_tokens(self.device)} / host {fmt_tokens(self.host)} / "
                f"storage {fmt_tokens(self.storage)}")

    def to_json(self) -> dict:
        return {"device_tokens": self.device, "host_tokens": self.host, "storage_tokens": self.storage,
                "computed_tokens": self.computed, "ttft_ms": None if self.ttft_ns is None else self.ttft_ns / 1e6}


@dataclass(frozen=True)
class RunTotals:
    """A run of the upgrade: reuse by tier and TTFT percentiles (nearest rank, as `summary`)."""

    run_id: str
    name: str
    role: str  # "old", "new" or a rule name
    requests: int  # every request of the run, rejected ones included
    input_tokens: int  # this and the token sums: the finished requests'
    device_tokens: int
    host_tokens: int
    storage_tokens: int
    computed_tokens: int
    ttft_p50_ns: int | None
    ttft_p90_ns: int | None
    ttft_p99_ns: int | None

    def to_json(self) -> dict:
        ms = lambda ns: None if ns is None else ns / 1e6  # noqa: E731
        return {"run_id": self.run_id, "name": self.name, "role": self.role, "requests": self.requests,
                "input_tokens": self.input_tokens, "device_tokens": self.device_tokens,
                "host_tokens": self.host_tokens, "storage_tokens": self.storage_tokens,
                "computed_tokens": self.computed_tokens, "ttft_p50_ms": ms(self.ttft_p50_ns),
                "ttft_p90_ms": ms(self.ttft_p90_ns), "ttft_p99_ms": ms(self.ttft_p99_ns)}


@dataclass(frozen=True)
class MovedRequest:
    req_id: str
    before: Outcome
    after: Outcome

    @property
    def split_moved(self) -> bool:
        return self.before.split != self.after.split

    @property
    def ttft_delta_ns(self) -> int | None:
        if self.before.ttft_ns is None or self.after.ttft_ns is None:
            return None
        return self.after.ttft_ns - self.before.ttft_ns

    def to_json(self) -> dict:
        d = self.ttft_delta_ns
        return {"req_id": self.req_id, "split_moved": self.split_moved, "before": self.before.to_json(),
                "after": self.after.to_json(), "ttft_delta_ms": None if d is None else d / 1e6}


@dataclass(frozen=True)
class Movement:
    """Run `before` against run `after`, request by request (same req_id)."""

    before: RunTotals
    after: RunTotals
    compared: int  # requests in both runs
    split_moved: int  # requests whose (device, host, storage) split differs
    ttft_moved: int  # requests whose TTFT differs at all (or finished in one run only)
    ttft_moved_over_1s: int  # of those, by more than TTFT_MOVED_NS (or finished in one only)
    split_moved_ids: tuple[str, ...]  # the first SHOWN_IDS, in request order
    top: tuple[MovedRequest, ...]  # largest TTFT changes first

    def to_json(self) -> dict:
        b, a = self.before, self.after

        def delta(x, y):
            return None if x is None or y is None else (y - x) / 1e6

        return {
            "before_run_id": b.run_id, "after_run_id": a.run_id, "compared_requests": self.compared,
            "split_moved": self.split_moved, "ttft_moved": self.ttft_moved,
            "ttft_moved_over_1s": self.ttft_moved_over_1s, "split_moved_ids": list(self.split_moved_ids),
            "tokens_delta": {"device": a.device_tokens - b.device_tokens, "host": a.host_tokens - b.host_tokens,
                             "storage": a.storage_tokens - b.storage_tokens,
                             "computed": a.computed_tokens - b.computed_tokens},
            "ttft_delta_ms": {"p50": delta(b.ttft_p50_ns, a.ttft_p50_ns), "p90": delta(b.ttft_p90_ns, a.ttft_p90_ns),
                              "p99": delta(b.ttft_p99_ns, a.ttft_p99_ns)},
            "top": [m.to_json() for m in self.top],
        }


@dataclass(frozen=True)
class RuleEffect:
    """What one rule moves under NEW: NEW with it switched back (before) against NEW (after)."""

    rule: str
    title: str
    movement: Movement
    # Of the upgrade's moved requests, how many switching this rule back alone reproduces
    # (OLD's split; OLD's TTFT within the tolerance), the others not.
    reproduces_split: int
    reproduces_ttft: int

    def to_json(self) -> dict:
        return {"rule": self.rule, "title": self.title, "reproduces_upgrade_split": self.reproduces_split,
                "reproduces_upgrade_ttft": self.reproduces_ttft, **self.movement.to_json()}


@dataclass(frozen=True)
class Attribution:
    """How the upgrade's moved requests (of one kind: split, or TTFT by more than 1 s) divide
    by the rules that reproduce OLD's outcome alone."""

    moved: int
    one_rule: dict[str, int]  # requests exactly one rule reproduces, by that rule
    each_of_several: int  # several rules each reproduce it alone: they are needed together
    no_single_rule: int  # no rule switched back alone reproduces it: several rules together

    def to_json(self) -> dict:
        return {"moved": self.moved, "one_rule": dict(self.one_rule), "each_of_several": self.each_of_several,
                "no_single_rule": self.no_single_rule}


@dataclass(frozen=True)
class UpgradeView:
    sweep_id: str
    old: str
    new: str
    trace_path: str
    upgrade: Movement  # OLD against NEW
    rules: tuple[RuleEffect, ...]  # in RULE_NAMES order
    split_attribution: Attribution
    ttft_attribution: Attribution
    # Rules without a complete run in the sweep (failed, interrupted): not isolated.
    missing_rules: tuple[str, ...] = ()
    # RuleSet fields that differ but have no rule name (config/releases.py): no run isolates them.
    unnamed_fields: tuple[str, ...] = ()
    runs: tuple[RunTotals, ...] = field(default=())

    def rule_split_sum(self) -> int:
        """Per-rule split moves added up: overlapping counts, not a share of the upgrade."""
        return sum(r.movement.split_moved for r in self.rules)

    def to_json(self) -> dict:
        return {
            "sweep_id": self.sweep_id, "from": self.old, "to": self.new, "trace_path": self.trace_path,
            "ttft_moved_threshold_ms": TTFT_MOVED_NS / 1e6, "undone_share": UNDONE_SHARE,
            "upgrade": self.upgrade.to_json(),
            "rules": [r.to_json() for r in self.rules],
            "rules_split_moved_sum": self.rule_split_sum(),
            "attribution": {"split": self.split_attribution.to_json(), "ttft": self.ttft_attribution.to_json()},
            "missing_rules": list(self.missing_rules), "unnamed_fields": list(self.unnamed_fields),
            "runs": [r.to_json() for r in self.runs],
        }


# --------------------------------------------------------------------------- roles


def is_upgrade_sweep(sweep_id: str | None) -> bool:
    return bool(sweep_id) and sweep_id.startswith(UPGRADE_SWEEP_PREFIX)


def run_role(run: RunInfo, old: str, new: str) -> str | None:
    """"old", "new", a rule name (NEW with that one rule switched back), or None."""
    run = parse(run)
    rules = run.rules_recorded
    back = switched_back_names(run.switched_back)
    if rules == old and not back:
        return "old"
    if rules == new and not back:
        return "new"
    if rules == new and len(back) == 1:
        return back[0]
    return None


def releases_of(runs: Sequence[RunInfo]) -> tuple[str, str]:
    """(OLD, NEW) of an upgrade sweep's runs: the two releases recorded, older first."""
    seen = {parse(r).rules_recorded for r in runs} & set(RELEASES)
    if len(seen) != 2:
        raise StoreError(f"sweep {runs[0].sweep_id if runs else '?'} is not an upgrade of two SGLang releases "
                         f"(its runs follow {', '.join(sorted(map(str, seen))) or 'none'})")
    old, new = sorted(seen, key=RELEASES.index, reverse=True)
    return old, new


# --------------------------------------------------------------------------- reading

def request_outcomes(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str], req_id: str | None = None
              ) -> dict[str, dict[str, tuple[Outcome, int]]]:
    """run_id -> req_id -> (outcome, input tokens), in request order."""
    rows = outcome_rows(con, run_ids, req_id)
    out: dict[str, dict[str, tuple[Outcome, int]]] = {r: {} for r in run_ids}
    for run_id, rid, d, h, s, c, ttft, n in rows:
        out[run_id][str(rid)] = (Outcome(int(d), int(h), int(s), int(c), None if ttft is None else int(ttft)), int(n))
    return out


def _totals(run: RunInfo, role: str, rows: dict[str, tuple[Outcome, int]]) -> RunTotals:
    """Token sums over the finished requests (as `summary`'s split), percentiles of their TTFTs."""
    done = [(o, n) for o, n in rows.values() if o.ttft_ns is not None]
    ttfts = sorted(o.ttft_ns for o, _ in done)
    q = lambda p: None if not ttfts else int(nearest_rank(ttfts, p, presorted=True))  # noqa: E731
    return RunTotals(run.run_id, run.name, role, len(rows), sum(n for _, n in done),
                     sum(o.device for o, _ in done), sum(o.host for o, _ in done),
                     sum(o.storage for o, _ in done), sum(o.computed for o, _ in done),
                     q(0.5), q(0.9), q(0.99))


def ttft_changed(a: Outcome, b: Outcome, over_ns: int = 0) -> bool:
    if (a.ttft_ns is None) != (b.ttft_ns is None):
        return True
    return a.ttft_ns is not None and abs(b.ttft_ns - a.ttft_ns) > over_ns


def _movement(before: RunTotals, after: RunTotals, b: dict[str, tuple[Outcome, int]],
              a: dict[str, tuple[Outcome, int]], top: int) -> Movement:
    both = [rid for rid in a if rid in b]
    moved = [MovedRequest(rid, b[rid][0], a[rid][0]) for rid in both]
    split = [m for m in moved if m.split_moved]
    ttft_any = [m for m in moved if ttft_changed(m.before, m.after)]
    over = [m for m in ttft_any if ttft_changed(m.before, m.after, TTFT_MOVED_NS)]

    def size(m: MovedRequest) -> tuple:
        d = m.ttft_delta_ns
        return (-(abs(d) if d is not None else float("inf")), not m.split_moved)

    ranked = sorted((m for m in moved if m.split_moved or ttft_changed(m.before, m.after)), key=size)
    return Movement(before, after, len(both), len(split), len(ttft_any), len(over),
                    tuple(m.req_id for m in split[:SHOWN_IDS]), tuple(ranked[:top]))


def reproduces_split(old: Outcome, back: Outcome) -> bool:
    return back.split == old.split


def reproduces_ttft(old: Outcome, new: Outcome, back: Outcome) -> bool:
    """Switching the rule back leaves at most 1 - UNDONE_SHARE of the change from OLD's TTFT."""
    if old.ttft_ns is None or new.ttft_ns is None or back.ttft_ns is None:
        return (old.ttft_ns is None) == (back.ttft_ns is None) and (old.ttft_ns is None) != (new.ttft_ns is None)
    change = abs(new.ttft_ns - old.ttft_ns)
    return change > 0 and abs(back.ttft_ns - old.ttft_ns) <= (1 - UNDONE_SHARE) * change


def _attribution(moved: list[str], reproducing: dict[str, list[str]]) -> Attribution:
    one: dict[str, int] = {}
    several = none = 0
    for rid in moved:
        rules = reproducing.get(rid, [])
        if len(rules) == 1:
            one[rules[0]] = one.get(rules[0], 0) + 1
        elif rules:
            several += 1
        else:
            none += 1
    return Attribution(len(moved), dict(sorted(one.items(), key=lambda kv: (-kv[1], kv[0]))), several, none)


def sweep_members(con: duckdb.DuckDBPyConnection, runs: Sequence[RunInfo]) -> tuple[str, str, dict[str, RunInfo]]:
    """(OLD, NEW, role -> run) of an upgrade sweep's complete runs (the newest of a role)."""
    old, new = releases_of(runs)
    roles: dict[str, RunInfo] = {}
    for r in runs:
        role = run_role(r, old, new)
        if role is not None and r.status == "complete":
            roles[role] = r
    for need in ("old", "new"):
        if need not in roles:
            raise StoreError(f"sweep {runs[0].sweep_id}: no complete run under SGLang {old if need == 'old' else new}")
    return old, new, roles


def upgrade_view(con: duckdb.DuckDBPyConnection, runs: Sequence[RunInfo], *, top: int = DEFAULT_TOP) -> UpgradeView:
    """The upgrade view of one upgrade sweep's runs (every run of the sweep)."""
    old, new, roles = sweep_members(con, runs)
    rule_roles = [n for n in RULE_NAMES if n in roles]
    ids = [roles[r].run_id for r in ("old", "new", *rule_roles)]
    rows = request_outcomes(con, ids)
    totals = {role: _totals(roles[role], role, rows[roles[role].run_id]) for role in ("old", "new", *rule_roles)}
    o_rows, n_rows = rows[roles["old"].run_id], rows[roles["new"].run_id]
    upgrade = _movement(totals["old"], totals["new"], o_rows, n_rows, top)

    split_moved = [rid for rid in n_rows if rid in o_rows and o_rows[rid][0].split != n_rows[rid][0].split]
    ttft_moved = [rid for rid in n_rows if rid in o_rows and ttft_changed(o_rows[rid][0], n_rows[rid][0], TTFT_MOVED_NS)]
    split_by: dict[str, list[str]] = {}
    ttft_by: dict[str, list[str]] = {}
    effects = []
    for rule in rule_roles:
        b_rows = rows[roles[rule].run_id]
        s = [rid for rid in split_moved if rid in b_rows and reproduces_split(o_rows[rid][0], b_rows[rid][0])]
        t = [rid for rid in ttft_moved if rid in b_rows
             and reproduces_ttft(o_rows[rid][0], n_rows[rid][0], b_rows[rid][0])]
        for rid in s:
            split_by.setdefault(rid, []).append(rule)
        for rid in t:
            ttft_by.setdefault(rid, []).append(rule)
        effects.append(RuleEffect(rule, RULE_NAMES[rule].title, _movement(totals[rule], totals["new"], b_rows, n_rows, top),
                                  len(s), len(t)))
    missing = tuple(n for n in differing_rules(old, new) if n not in roles)
    return UpgradeView(roles["new"].sweep_id or "", old, new, roles["new"].trace_path, upgrade, tuple(effects),
                       _attribution(split_moved, split_by), _attribution(ttft_moved, ttft_by), missing,
                       unnamed_fields(old, new), tuple(totals.values()))


def signed_ms(ns: float) -> str:
    """A TTFT difference with its sign: "+1.04 s", "-259.3 ms", "0 ms"."""
    return "0 ms" if ns == 0 else ("+" if ns > 0 else "-") + fmt_ms(abs(ns))
