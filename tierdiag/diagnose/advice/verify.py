"""Advice verified: what `tierdiag advise` replayed for a run's proposals (the runs recorded
under `advise-<run_id>`), measured against the run, each change classified (confirmed /
no_effect / refuted, types.classify) with the share its rule targets measured beside it (the
rule's Target), the confirmed ones combined, and a run's headline numbers. The rules that
propose are rules/'s (registry.py); this reads what their replays recorded."""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from tierdiag.diagnose.advice import registry
from tierdiag.diagnose.advice.propose import propose
from tierdiag.diagnose.advice.targets import RECOMPUTE_SHARE
from tierdiag.diagnose.advice.types import (COMBINE_MAX, COMBINED, CONFIRM_P50_GAIN, SIZE_KEYS, Advice, Sizing,
                                            Verified, classify)
from tierdiag.diagnose.read import advice as read_advice
from tierdiag.diagnose.run.runcontext import RunContext
from tierdiag.store.reader import ADVISE_SWEEP_PREFIX
from tierdiag.units import fmt_pct, ns_to_ms, share

# Config keys that differ between runs without being a change of the cache (bookkeeping).
# `profile_source` is what the profile held (same_clock compares its hash apart).
NOT_CHANGES = frozenset({"storage_dir", "seed", "verify", "data_plane_mib", "profile", "profile_source", "timing"})

# --------------------------------------------------------------------------- verification


def advise_sweep_id(run_id: str) -> str:
    return ADVISE_SWEEP_PREFIX + run_id


def sizing(con: duckdb.DuckDBPyConnection, run, a: Advice, curves) -> Sizing | None:
    """A size item's prediction from the run's size curve (`curves`: size_curves.SizeCurves; None:
    none) beside what its replay found, where it was replayed: reused tokens in the tier or above,
    as shares of the finished requests' input. None for an item that sets no size."""
    tier = SIZE_KEYS.get(a.option) if a.option is not None and not a.combined else None
    curve = curves.curve(tier) if curves is not None and tier is not None else None
    if curve is None or not isinstance(a.value, int) or isinstance(a.value, bool):
        return None
    replayed = None
    v = a.verified
    if v is not None:
        replayed = share(*read_advice.found_and_input_tokens(con, v.run_id, tier))
    return Sizing(a.option, tier, a.value, curve.knee_tokens, share(curve.reused_at(a.value), curves.input_tokens),
                  curve.run_size_tokens, share(curve.reused_at(curve.run_size_tokens), curves.input_tokens),
                  share(curve.found_tokens, curves.input_tokens), replayed, v.run_id if v is not None else None,
                  tuple(k for k in a.changes if k != a.option), curves.slack_tokens, curves.proposed_size(tier))


def same_clock(base: dict, other: dict) -> bool:
    """Whether a candidate replayed on the run's own clock: the same calibrate profile content
    (`profile_source.sha256`, recorded at replay), or neither had one. A candidate replayed after
    the profile was re-fitted measured the new clock, not its change: it verifies nothing."""
    def sha(config: dict):
        source = config.get("profile_source")
        return (config.get("profile") is not None, source.get("sha256") if isinstance(source, dict) else None)

    return sha(base) == sha(other)


def config_changes(base: dict, other: dict) -> dict:
    """What `other` changed of `base`, the run's config as it replayed: a run recorded before
    rule sets followed SGLang 0.5.9 (engine/rules.py recorded_rules), so its candidates, which
    follow the same release (app/advise.py), changed nothing there."""
    from tierdiag.engine.rules import recorded_rules

    base = {**base, "sglang_rules": recorded_rules(base)}
    return {k: v for k, v in other.items() if k not in NOT_CHANGES and base.get(k) != v}


def _run_numbers(con: duckdb.DuckDBPyConnection, run_id: str) -> dict:
    """TTFT p50 and p99, and every share a registered rule targets (the recompute share always:
    Verified carries it), over the run's finished requests."""
    targets = {RECOMPUTE_SHARE.name: RECOMPUTE_SHARE}
    for rule in registry.rules():
        if rule.target is not None:
            targets.setdefault(rule.target.name, rule.target)
    names = list(targets)
    r = read_advice.target_numbers(con, run_id, [targets[n].sql for n in names])
    return {"p50": r.ttft_p50_ns, "p99": r.ttft_p99_ns, **dict(zip(names, r.targets))}


def _measured(base: dict, after: dict, rid: str, kind: str, req: tuple | None) -> Verified:
    rule = registry.rule_of(kind)
    target = rule.target.name if rule is not None and rule.target is not None else None
    before_req, after_req = req[:2] if req is not None else (None, None)
    return Verified(
        run_id=rid, ttft_p50_ms_before=ns_to_ms(base["p50"]), ttft_p50_ms_after=ns_to_ms(after["p50"]),
        ttft_p99_ms_before=ns_to_ms(base["p99"]), ttft_p99_ms_after=ns_to_ms(after["p99"]),
        recompute_share_before=base["recompute_share"], recompute_share_after=after["recompute_share"],
        req_id=None if req is None else req[2], ttft_ms_before=ns_to_ms(before_req),
        ttft_ms_after=ns_to_ms(after_req), target=target,
        target_before=base.get(target) if target else None, target_after=after.get(target) if target else None)


def _gain(a: Advice) -> float:
    v = a.verified
    if v is None or not v.ttft_p50_ms_before or v.ttft_p50_ms_after is None:
        return 0.0
    return (v.ttft_p50_ms_before - v.ttft_p50_ms_after) / v.ttft_p50_ms_before


def kind_of(changes: dict) -> str:
    """The kind of a replayed change no proposal names: the rule whose options it sets (a key one
    rule's dominant_options name decides it alone), else combined; other for a key no rule owns."""
    key_kinds, dominant = registry.option_kinds()
    for k in changes:
        if k in dominant:
            return key_kinds[k]
    kinds = {key_kinds.get(k, "other") for k in changes}
    return kinds.pop() if len(kinds) == 1 else COMBINED


def combination(items: tuple[Advice, ...]) -> Advice | None:
    """The confirmed items (the COMBINE_MAX best by p50 gain) as one change, or None with fewer
    than two. A combination is of different options only: of two sizes of one option (a host
    pool for the sessions and one for capacity) only the better is a part, the other is an
    alternative, not something to add. Where two parts set the same key besides their own option
    (a host pool for capacity and for a storage tier's prefetch room), the larger number wins;
    other values, the better item's. A part that would leave the combination one of its parts'
    own changes (it adds nothing, or holds all the others) is left out: the combination is never a
    config already replayed alone."""
    ranked = sorted((a for a in items if a.status == "confirmed" and not a.combined and a.option is not None),
                    key=_gain, reverse=True)
    best: list[Advice] = []
    changes: dict = {}
    for a in ranked:
        if len(best) == COMBINE_MAX:
            break
        if any(a.option == b.option for b in best):
            continue  # another size of an option already in: an alternative, not a part
        merged = _merge(changes, a.changes)
        if best and (merged == changes or any(merged == b.changes for b in best + [a])):
            continue  # it adds nothing, or the combination would be one part replayed again
        best.append(a)
        changes = merged
    if len(best) < 2:
        return None
    first = next(iter(changes))
    return Advice(COMBINED, first, changes[first], changes,
                  "together: " + "; ".join(f"{a.settings()} ({a.kind}, TTFT p50 {fmt_pct(_gain(a))} better alone)"
                                           for a in best),
                  {"parts": [a.kind for a in best]})


def _merge(changes: dict, more: dict) -> dict:
    """`changes` with `more` added: a key both set keeps the larger integer, else the first value."""
    out = dict(changes)
    for k, v in more.items():
        old = out.get(k)
        if old is None or (isinstance(v, int) and isinstance(old, int) and not isinstance(v, bool)
                           and not isinstance(old, bool) and v > old):
            out[k] = v
    return out


def own_combination(items: tuple[Advice, ...]) -> Advice | None:
    """`combination(items)`, unless an item of the list sets exactly its changes: that item and
    the combination would be one replay, shown once as advice ("verified by run R") and once as
    tried, not advised (issue 40). The item carries the replay; no second entry."""
    together = combination(items)
    if together is None or any(a.changes == together.changes for a in items if a.option is not None):
        return None
    return together


def verified_advice(con: duckdb.DuckDBPyConnection, run, advice: tuple[Advice, ...],
                    req_id: str | None = None, curves=None) -> tuple[Advice, ...]:
    """Attach what `advise` measured (its runs under advise_sweep_id) to the matching items, each
    with its status (module doc); the combination of the confirmed ones, where it was replayed,
    first when it is confirmed too. `curves`: the run's size curves (size_curves.py), for each size
    item's `sizing` (prediction beside replay); None: no sizing."""
    import dataclasses
    import json

    rows = read_advice.complete_sweep_runs(con, advise_sweep_id(run.run_id))
    if not rows:
        return tuple(dataclasses.replace(a, sizing=sizing(con, run, a, curves)) for a in advice)
    by_changes: dict[str, str] = {}
    for rid, cfg in rows:  # the newest run of each change wins
        cfg = json.loads(cfg or "{}")
        if same_clock(run.config, cfg):
            by_changes[json.dumps(config_changes(run.config, cfg), sort_keys=True)] = rid
    if not by_changes:
        return tuple(dataclasses.replace(a, sizing=sizing(con, run, a, curves)) for a in advice)
    base = _run_numbers(con, run.run_id)

    def measure(a: Advice) -> Advice:
        rid = by_changes.get(json.dumps(a.changes, sort_keys=True)) if a.option else None
        if rid is None:
            return dataclasses.replace(a, sizing=sizing(con, run, a, curves))
        req = None
        if req_id is not None:
            req = (read_advice.request_ttft_ns(con, run.run_id, req_id), read_advice.request_ttft_ns(con, rid, req_id),
                   req_id)
        v = _measured(base, _run_numbers(con, rid), rid, a.kind, req)
        done = dataclasses.replace(a, verified=v, status=classify(v))
        return dataclasses.replace(done, sizing=sizing(con, run, done, curves))

    out = [measure(a) for a in advice]
    together = own_combination(tuple(out))
    if together is not None:
        together = measure(together)
    # Candidates of an earlier advise that no proposal of now matches (other --host-memory, a
    # rule since changed): tried all the same, so shown with what they measured.
    known = {json.dumps(a.changes, sort_keys=True) for a in out + ([together] if together else [])}
    for key in by_changes:
        changes = json.loads(key)
        if key not in known and changes:
            first = next(iter(changes))
            out.append(measure(Advice(kind_of(changes), first, changes[first], changes,
                                      "replayed by an earlier `tierdiag advise` of this run")))
    if together is not None:
        if together.verified is not None:
            # Worth advising only where it beats the best of its parts alone by the same margin
            # a change must beat the baseline by: p50 after <= best alone's x (1 - CONFIRM_P50_GAIN).
            best_alone = 1 - max(_gain(a) for a in out if a.status == "confirmed")
            if together.status == "confirmed" and 1 - _gain(together) > best_alone * (1 - CONFIRM_P50_GAIN):
                together = dataclasses.replace(together, status="no_effect")
            out.insert(0 if together.status == "confirmed" else len(out), together)
    return tuple(out)


def run_advice(con: duckdb.DuckDBPyConnection, run, ctx: RunContext, req_id: str | None = None,
               facts=None) -> tuple[Advice, ...]:
    """The run's advice, verified by what `advise` replayed; `facts`: the run's RunFacts where
    the caller has them (the session rule's distances are stored with the run evidence)."""
    from tierdiag.diagnose.run.facts import RunFacts

    facts = facts if facts is not None else RunFacts(con, run)
    curves = facts.size_curves()
    return verified_advice(con, run, propose(ctx, sessions=facts.session_pauses(), curves=curves), req_id, curves)


# --------------------------------------------------------------------------- a run's headline numbers


@dataclass(frozen=True)
class RunNumbers:
    run_id: str
    ttft_p50_ns: int | None
    ttft_p99_ns: int | None
    recompute_share: float | None
    reuse_share: dict  # tier -> share of input tokens (device, host, storage)
    ttft_mean_ns: float | None = None

    def key(self) -> tuple:
        """Better is lower: TTFT p50, then p99, then the mean (small runs often tie on p50)."""
        return (self.ttft_p50_ns or 0, self.ttft_p99_ns or 0, self.ttft_mean_ns or 0.0)

    def to_json(self) -> dict:
        return {"run_id": self.run_id, "ttft_p50_ms": ns_to_ms(self.ttft_p50_ns),
                "ttft_p99_ms": ns_to_ms(self.ttft_p99_ns), "ttft_mean_ms": ns_to_ms(self.ttft_mean_ns),
                "recompute_share": self.recompute_share,
                "reuse_share": dict(self.reuse_share)}


def run_numbers(con: duckdb.DuckDBPyConnection, run_id: str) -> RunNumbers:
    r = read_advice.headline(con, run_id)
    n = r.input_tokens
    return RunNumbers(run_id, r.ttft_p50_ns, r.ttft_p99_ns, share(r.recomputed_tokens, n),
                      {"device": share(r.device_tokens, n), "host": share(r.host_tokens, n),
                       "storage": share(r.storage_tokens, n)}, r.ttft_mean_ns)


