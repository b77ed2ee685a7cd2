"""`tierdiag advise`: propose changes from a run's diagnosis (every rule of
diagnose/advice/registry.py), replay the run's trace once per change with the sweep runner, and
measure each against the baseline: each tried change is confirmed, no_effect or refuted
(diagnose.advice.classify). Where two or more are confirmed and the budget has a replay left, the
best of them are replayed together.
A size (a host pool, a storage tier) is proposed at its one-pass size curve's knee
(diagnose/run/size_curves.py) and confirmed by that one replay: its `sizing` puts the curve's
prediction beside what the replay found.

Orchestration only, and of no rule in particular: the rules, the numbers and the verification
read back (each rule's target) are diagnose's; the replays are the sweep runner's. Diagnose never
starts a replay."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from tierdiag.diagnose.advice import HOST_POOL_LIMIT_BYTES, Advice, advice_json, propose
from tierdiag.diagnose.advice.verify import RunNumbers, advise_sweep_id, combination, run_numbers, verified_advice
from tierdiag.diagnose.run.facts import run_facts


@dataclass(frozen=True)
class Candidate:
    advice: Advice  # with its advice status (proposed where the replay did not complete)
    numbers: RunNumbers | None  # None when its replay recorded nothing
    status: str  # the replay's: complete | interrupted | failed | not_started

    def to_json(self) -> dict:
        d = {"changes": dict(self.advice.changes), "reason": self.advice.reason, "status": self.status,
             "kind": self.advice.kind, "advice_status": self.advice.status,
             "run_id": None, "ttft_p50_ms": None, "ttft_p99_ms": None, "recompute_share": None, "reuse_share": None}
        if self.numbers is not None:
            d.update(self.numbers.to_json())
        return d


@dataclass(frozen=True)
class AdviseResult:
    baseline: RunNumbers
    candidates: tuple[Candidate, ...]
    best: str | None  # run id of the confirmed candidate with the lowest (p50, p99, mean) TTFT; None: none confirmed
    advice: tuple[Advice, ...]  # everything proposed, each with its status (advice.advised splits them)
    sweep_id: str
    run: Any = field(default=None, compare=False)  # the advised run's store.reader.RunInfo (the text view names it)

    def to_json(self) -> dict:
        return {"baseline": self.baseline.to_json(), "candidates": [c.to_json() for c in self.candidates],
                "best": self.best, "sweep_id": self.sweep_id, **advice_json(self.advice)}



def _shown(path: str) -> str:
    """A recorded path as one line: as it is, or quoted with its escapes where it holds a newline
    or another control character (a hand-edited store's value is data, not text to print)."""
    return path if path.isprintable() else repr(path)

def check_trace_for_advise(run) -> str:
    """The run's trace must still be there, unchanged: advise replays it."""
    import os

    from tierdiag.errors import TraceError

    path = run.trace_path
    if not path or not os.path.isfile(path):
        raise TraceError(f"trace file {_shown(path)} of run {run.run_id} ({run.name}) is gone; advise replays it",
                         hint="restore the file at that path, or replay the trace again and advise that run")
    if run.trace_sha256:
        from tierdiag.trace.reader import trace_sha256

        if trace_sha256(path) != run.trace_sha256:
            raise TraceError(f"trace file {path} changed since run {run.run_id} ({run.name}) was recorded",
                             hint="replay it again and advise the new run")
    return path


def check_profile_for_advise(run) -> None:
    """The run's calibrate profile (config `profile`), where it replayed with one, must still be
    there, unchanged (the content hash recorded at replay, `profile_source.sha256`): advise
    replays with it, and a candidate on another clock measures the clock, not the change."""
    import hashlib
    import os

    from tierdiag.errors import TraceError

    path = run.config.get("profile")
    if path is None or path == "":
        return
    source = run.config.get("profile_source")
    recorded = source.get("sha256") if isinstance(source, dict) else None
    if not isinstance(path, str) or "\x00" in path:  # a hand-edited store: not a path at all
        raise TraceError(f"profile {path!r} of run {run.run_id} ({run.name}) is not a file path; advise replays with it",
                         hint="replay the trace again and advise that run")
    if not os.path.isfile(path):
        raise TraceError(f"profile {_shown(path)} of run {run.run_id} ({run.name}) is gone; advise replays with it",
                         hint="restore the file at that path, or replay the trace again and advise that run")
    if recorded:
        try:
            with open(path, "rb") as f:
                now = hashlib.sha256(f.read()).hexdigest()
        except OSError as exc:
            raise TraceError(f"profile {_shown(path)} of run {run.run_id} ({run.name}) cannot be read "
                             f"({exc.strerror or exc}); advise replays with it") from None
        if now != recorded:
            raise TraceError(f"profile {path} changed since run {run.run_id} ({run.name}) was recorded",
                             hint="replay it again and advise the new run")


def replayed_config(run) -> dict:
    """The run's config as it replayed, what every candidate starts from: its recorded keys (not
    storage_dir: recorded, it is the run's own folder; a candidate gets its own; not the
    running-requests cap it derived), and the SGLang
    release it followed: a run recorded before rule sets has no `sglang_rules` and followed 0.5.9
    (engine/rules.py recorded_rules), so its candidates do too, not today's default."""
    from tierdiag.config.engine import CONFIG_KEYS
    from tierdiag.engine.rules import recorded_rules

    base = {k: v for k, v in run.config.items() if k in CONFIG_KEYS and k != "storage_dir"}
    base["sglang_rules"] = recorded_rules(run.config)
    # the running-requests cap as the run was given it: derived (None, and runs recorded before
    # the cap) stays derived, from each candidate's own pools
    base["max_running_requests"] = run.config.get("max_running_requests_given")
    return base


def candidate_configs(run, advice: tuple[Advice, ...], budget: int) -> list[tuple[Advice, str, object]]:
    """(advice, run name, EngineConfig) for up to `budget` items that change something (the
    combination's name says so)."""
    from tierdiag.config.engine import EngineConfig

    base = replayed_config(run)
    out = []
    for a in [a for a in advice if a.option is not None][:budget]:
        cfg = EngineConfig(**{**base, **a.changes})
        name = ("advise: together " if a.combined else "advise: ") + ", ".join(
            f"{k}={v}" for k, v in a.changes.items())
        out.append((a, name, cfg))
    return out


def advise(db, run: str | None, *, budget: int = 4, jobs: int | None = None,
           host_limit_bytes: int = HOST_POOL_LIMIT_BYTES, progress=None) -> AdviseResult:
    """`tierdiag advise`: the run `run` names in the store `db` (None: the newest), advised
    (`advise_run`)."""
    from tierdiag.store.reader import open_store, resolve_run

    with open_store(db) as con:
        info = resolve_run(con, run, db_label=str(db))
    result = advise_run(lambda: open_store(db), db, info, budget=budget, jobs=jobs,
                        host_limit_bytes=host_limit_bytes, progress=progress)
    return replace(result, run=info)


def advise_run(con_factory, db, run, *, budget: int = 4, jobs: int | None = None,
               host_limit_bytes: int = HOST_POOL_LIMIT_BYTES, progress=None) -> AdviseResult:
    """Propose changes from `run`'s diagnosis, replay its trace once per change (parallel
    processes, the sweep runner), and measure each against the baseline. `host_limit_bytes`:
    the most host memory a server has for KV (a host pool beyond it is not proposed; a storage
    tier is).

    `con_factory()` opens the store read-only (closed again before the runner writes to it).
    """
    from tierdiag.errors import ConfigError

    if budget < 1:
        raise ConfigError(f"--budget {budget} must be at least 1")
    if jobs is not None and jobs < 1:
        raise ConfigError(f"--jobs {jobs} must be at least 1")
    if host_limit_bytes < 1:
        raise ConfigError(f"--host-memory {host_limit_bytes} must be at least 1 byte")
    with con_factory() as con:
        facts = run_facts(con, run)
        ctx = facts.context()
        curves = facts.size_curves()
        proposed = propose(ctx, host_limit_bytes=host_limit_bytes, sessions=facts.session_pauses(), curves=curves)
        baseline = run_numbers(con, run.run_id)
    sweep_id = advise_sweep_id(run.run_id)
    # What every candidate replays with, checked before anything is replayed or recorded: the
    # profile first (a candidate's config reads it), the trace where there is a change to replay.
    check_profile_for_advise(run)
    plans = candidate_configs(run, proposed, budget)
    if plans:
        check_trace_for_advise(run)
    outcomes = _replay(run, db, plans, jobs, sweep_id, progress)
    with con_factory() as con:
        verified = verified_advice(con, run, proposed, curves=curves)
    # Two or more confirmed: their best together, if the budget has a replay left.
    together = combination(verified)
    extra = candidate_configs(run, (together,), 1) if together is not None and len(plans) < budget else []
    outcomes.update({len(plans) + i: o for i, o in _replay(run, db, extra, jobs, sweep_id, progress).items()})
    plans += extra
    candidates = []
    with con_factory() as con:
        verified = verified_advice(con, run, proposed, curves=curves)
        # Each row is the item its replay was planned for (a single change, or the combination),
        # with what was measured of it: never another item that happens to set the same keys.
        by_changes = {_key(a): a for a in verified}
        for i, (a, _name, _cfg) in enumerate(plans):
            rid, status = outcomes.get(i, (None, "not_started"))
            a = by_changes.get(_key(a), a)
            candidates.append(Candidate(a, run_numbers(con, rid) if rid and status == "complete" else None, status))
    confirmed = [c for c in candidates if c.numbers is not None and c.advice.status == "confirmed"]
    best = min(confirmed, key=lambda c: c.numbers.key()).numbers.run_id if confirmed else None
    return AdviseResult(baseline, tuple(candidates), best, verified, sweep_id)


def _key(a: Advice) -> tuple:
    import json

    return (a.combined, json.dumps(a.changes, sort_keys=True, default=str))


def _replay(run, db, plans, jobs, sweep_id, progress) -> dict[int, tuple[str | None, str]]:
    """Replay `plans` (candidate_configs') with the sweep runner: index -> (run id, status)."""
    from tierdiag.app.sweep import Processes, SweepFailed, run_configs

    if not plans:
        return {}
    trace = check_trace_for_advise(run)
    check_profile_for_advise(run)
    try:
        ids = run_configs(trace, [(name, cfg) for _, name, cfg in plans], db,
                          backend=Processes(jobs or min(len(plans), _cores())), sweep_id=sweep_id,
                          progress=progress, command_line=["tierdiag", "advise", "--run", run.run_id])
        return {i: (rid, "complete") for i, rid in enumerate(ids)}
    except SweepFailed as exc:
        return {o.index: (o.run_id, o.status) for o in exc.outcomes}


def _cores() -> int:
    from tierdiag.app.sweep import default_jobs

    return default_jobs()
