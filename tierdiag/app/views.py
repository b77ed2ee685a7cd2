"""The read commands' one call each: `summary`, `explain`, `slow`, `runs`, `compare` open the store,
ask diagnose the run's question, and return a typed result whose `to_json()` is the command's
documented JSON view (docs/contract.md) and whose fields are what its text view draws.

No torch here, and nothing imported at the top that these commands do not need (start-up): the
diagnose modules behind an answer are imported when it is asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


def _resolve(con, run: str | None, db: Path):
    from tierdiag.store.reader import resolve_run

    return resolve_run(con, run, db_label=str(db))


@dataclass(frozen=True)
class SummaryView:
    """`summary`: the run's summary (RunSummary, or ObservedSummary for an imported run), the SGLang
    release whose rules a replay followed (None: imported), its KV memory, and the clock line of a
    replay timed by a calibrate profile (None without one)."""

    run: Any  # store.reader.RunInfo
    summary: Any
    sglang_rules: str | None
    kv_memory: Any  # diagnose.run.kv_memory.KvMemory | None
    clock: str | None

    def to_json(self) -> dict:
        return {**self.summary.to_json(), "sglang_rules": self.sglang_rules,
                "kv_memory": None if self.kv_memory is None else self.kv_memory.to_json(),
                **({"clock": self.run.config["profile_source"]} if self.clock else {})}


def summary_view(db: Path, run: str | None) -> SummaryView:
    from tierdiag.store.reader import PendingStore

    pending = PendingStore(db, run, str(db))  # the store opens on another thread meanwhile (issue 41)
    # An imported run has only what the server reported: diagnose answers for its kind.
    from tierdiag.diagnose.views import prepare, summarize

    prepare("summary")
    con, info = pending.result()
    with con:
        result = summarize(con, info)
    from tierdiag.diagnose.run.kv_memory import run_kv_memory
    from tierdiag.diagnose.read.run import parse

    # The SGLang release whose rules the replay followed (0.5.9 for one recorded before rule sets);
    # None for an imported run, whose numbers are the server's (the run parsed once: read/run.py).
    rules = parse(info).rules
    source, clock = info.config.get("profile_source"), None
    if source:  # a replay timed by a calibrate profile (config/profile.py loaded only then: start-up)
        from tierdiag.config.profile import provenance_line

        clock = provenance_line(source)
    return SummaryView(run=info, summary=result, sglang_rules=rules, kv_memory=run_kv_memory(info), clock=clock)


@dataclass(frozen=True)
class ExplainView:
    """`explain`: one request's Explanation (ObservedExplanation for an imported run)."""

    run: Any
    explanation: Any

    def to_json(self) -> dict:
        return self.explanation.to_json()


def explain_view(db: Path, run: str | None, req_id: str) -> ExplainView:
    from tierdiag.store.reader import PendingStore

    pending = PendingStore(db, run, str(db))  # the store opens on another thread meanwhile (issue 41)
    from tierdiag.diagnose.views import explain, prepare

    prepare("explain")
    con, info = pending.result()
    with con:
        # Which question a run of its kind can answer is diagnose's; how the answer is drawn
        # follows its type (report/views.py).
        return ExplainView(run=info, explanation=explain(con, info, req_id))


def _request_json(r, t0_ns: int) -> dict:
    # Arrivals since the run's first arrival, as in `explain --json` (run_start_ms adds back).
    return {**r.to_json(), "arrival_ms": None if r.arrival_ns is None else (r.arrival_ns - t0_ns) / 1e6}


@dataclass(frozen=True)
class SlowView:
    """`slow`: the run's requests ranked (by excess TTFT over their ideal; an imported run by TTFT),
    `row_type` naming the rows' type for an empty list's view; with `by` "rank", `groups` instead
    (diagnose/dp/ranks.py), one a data-parallel rank."""

    run: Any
    top: int
    hit_class: str | None
    cause: str | None
    run_start_ns: int
    row_type: type | None = None
    rows: tuple = ()
    by: str | None = None
    groups: tuple = ()

    @property
    def req_ids(self) -> list[str]:
        """The listed requests' ids, in the order shown (`slow --ids`)."""
        rows = [r for g in self.groups for r in g.requests] if self.by else self.rows
        return [r.req_id for r in rows]

    def to_json(self) -> dict:
        head = {"run_id": self.run.run_id, "run_name": self.run.name, "top": self.top, "class": self.hit_class,
                "cause": self.cause}
        t0 = self.run_start_ns
        if self.by is None:
            return {**head, "run_start_ms": t0 / 1e6, "requests": [_request_json(r, t0) for r in self.rows]}
        return {**head, "by": self.by, "run_start_ms": t0 / 1e6,
                "groups": [{**g.to_json(), "requests": [_request_json(r, t0) for r in g.requests]}
                           for g in self.groups]}


SLOW_BY = ("rank",)


def slow_view(db: Path, run: str | None, *, top: int, hit_class: str | None, cause: str | None,
              by: str | None) -> SlowView:
    from tierdiag.errors import ConfigError, unknown_name
    from tierdiag.store.reader import open_store

    if by is not None and by not in SLOW_BY:
        raise unknown_name("--by grouping", by, SLOW_BY)
    with open_store(db) as con:
        info = _resolve(con, run, db)
        from tierdiag.diagnose.run.facts import run_bounds  # where every view's clock starts

        if by == "rank":  # the listing cut by dp_rank (diagnose/dp/ranks.py), a replayed run only
            from tierdiag.diagnose.read.kind import view_of

            if not view_of(info).engine_parts:
                raise ConfigError(f"--by rank ranks requests by excess over their ideal; run {info.run_id} "
                                  f"({info.name}) is imported and has no ideal: use `tierdiag slow` without --by")
            from tierdiag.diagnose.dp.ranks import slow_by_rank

            groups = slow_by_rank(con, info, top=top, hit_class=hit_class, cause=cause)
            return SlowView(run=info, top=top, hit_class=hit_class, cause=cause,
                            run_start_ns=run_bounds(con, info)[0], by=by, groups=tuple(groups))
        # An imported run has no ideal TTFT: diagnose ranks it by TTFT (diagnose/views.py).
        from tierdiag.diagnose.views import slow

        row_type, rows = slow(con, info, top=top, hit_class=hit_class, cause=cause)
        return SlowView(run=info, top=top, hit_class=hit_class, cause=cause, run_start_ns=run_bounds(con, info)[0],
                        row_type=row_type, rows=tuple(rows))


@dataclass(frozen=True)
class RunsView:
    """`runs`: every run in the store, oldest first, with the options each changed from the
    defaults, its pools and KV memory, and which one a command without --run reads."""

    db: Path
    runs: tuple
    changes: dict  # run id -> {option: value} changed from the defaults
    default_run_id: str | None

    def to_json(self) -> list:
        from tierdiag.diagnose.run.kv_memory import run_kv_memory
        from tierdiag.diagnose.read.run import parse
        from tierdiag.report.run_lines import pool_sizes

        def memory(r):
            m = run_kv_memory(r)  # ranks, one rank's device + host bytes, the shared storage's, the total
            return None if m is None else m.to_json()

        return [{**r.to_json(), "changed_from_defaults": self.changes[r.run_id],
                 "sglang_rules": parse(r).rules,
                 "pools": pool_sizes(r.config, r.data_plane), "kv_memory": memory(r),
                 "default": r.run_id == self.default_run_id} for r in self.runs]


def runs_view(db: Path) -> RunsView:
    """A store with no run in it, whatever the file's kind (errors.NoRunsError: a 0-byte file,
    DuckDB's header alone, a schema begun or whole), is an empty listing: `runs` says so, exit 0."""
    from tierdiag.diagnose.comparison.compare import changed_from_defaults
    from tierdiag.errors import NoRunsError
    from tierdiag.store.reader import default_run, list_runs, open_store

    try:
        con = open_store(db)
    except NoRunsError:
        return RunsView(db=db, runs=(), changes={}, default_run_id=None)
    with con:
        infos = list_runs(con)
    return RunsView(db=db, runs=tuple(infos), changes={r.run_id: changed_from_defaults(r.config) for r in infos},
                    default_run_id=default_run(infos).run_id if infos else None)


@dataclass(frozen=True)
class CompareView:
    """`compare`: runs side by side (Comparison), one request in two runs (RequestComparison), or
    an observed run beside its replays (TwinComparison)."""

    result: Any

    def to_json(self) -> dict:
        return self.result.to_json()


def compare_view(db: Path, runs: list[str], *, sweep: str | None, by: str | None, requests: bool,
                 top: int) -> CompareView:
    from tierdiag.diagnose.comparison.compare import (check_sort_key, compare_requests, compare_runs, compare_twins,
                                           observed_and_twins, sweep_runs)
    from tierdiag.errors import ConfigError
    from tierdiag.store.reader import list_runs, no_runs_error, open_store

    check_sort_key(by)
    if runs and sweep:
        raise ConfigError("give RUNS or --sweep, not both")
    if requests and (sweep or len(runs) != 2):
        raise ConfigError("--requests compares exactly two runs: compare RUN_A RUN_B --requests")
    if top < 1:
        raise ConfigError(f"--top {top} must be at least 1")
    with open_store(db) as con:
        twins = None  # an observed run beside its replays: per-request agreement and TTFT error
        if len(runs) >= 2 and not sweep:
            twins = observed_and_twins([_resolve(con, r, db) for r in runs])
        if twins is not None:
            return CompareView(compare_twins(con, *twins, top=top if requests else None))
        if requests:
            a, b = (_resolve(con, r, db) for r in runs)
            return CompareView(compare_requests(con, a, b, top=top))
        sweep_id = None
        if runs:
            infos = [_resolve(con, r, db) for r in runs]
        else:
            if sweep is None:
                every = list_runs(con)
                if not every:
                    raise no_runs_error(db)
                newest = [r.sweep_id for r in every if r.sweep_id]
                if not newest:
                    raise ConfigError(f"no sweep in {db}: give RUNS to compare, or run `tierdiag sweep` first")
                sweep = newest[-1]
            sweep_id, infos = sweep_runs(con, sweep, db_label=str(db))
        return CompareView(compare_runs(con, infos, by=by, sweep_id=sweep_id))
