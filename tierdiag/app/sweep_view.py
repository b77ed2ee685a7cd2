"""What `sweep` shows, beside the runner (app/sweep.py): each finished combination's headline, and
the comparison a sweep (or `sweep --resume`) ends with, as typed results. The command's progress
callback only reports; what a headline reads from the store, and the comparison, are here."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence


@dataclass(frozen=True)
class Headline:
    """One combination, as the sweep's progress line shows it: a recorded run's reuse and TTFT p50,
    or (nothing recorded) its status and error."""

    name: str
    status: str
    error: str | None
    run_id: str | None
    reuse_share: float | None = None
    ttft_p50_ns: float | None = None
    wall_s: float | None = None


def headline(outcome, db: str | os.PathLike) -> Headline:
    """`outcome`'s headline (an app.sweep.RunOutcome). A finished replay brings its numbers with it
    (computed by its worker); only a run cut short is read back from the store that holds it. This
    runs in the driver while the workers replay: a query per run here is CPU taken from them."""
    if outcome.run_id is None:
        return Headline(outcome.name, outcome.status, outcome.error, None)
    reuse, p50_ns = outcome.reuse_share, None if outcome.ttft_p50_ms is None else outcome.ttft_p50_ms * 1e6
    if reuse is None:
        from tierdiag.diagnose.run.summary import run_summary
        from tierdiag.store.reader import open_store, resolve_run

        with open_store(outcome.kept_in or db) as con:
            s = run_summary(con, resolve_run(con, outcome.run_id), diagnose=False)
        reuse = s.reused_token_share
        p50_ns = next((c.ttft_p50_ns for c in s.classes if c.hit_class == "all"), None)
    return Headline(outcome.name, outcome.status, outcome.error, outcome.run_id, reuse, p50_ns, outcome.wall_s)


def sweep(trace: Path, configs: Sequence, db: Path, *, backend, sweep_id: str, skip_bad: bool,
          command_line: list[str] | None, progress: Callable[[Headline], None], by: str | None = None,
          compare: bool = True) -> SweepComparison | None:
    """`tierdiag sweep`: app.sweep.run_configs, each finished combination reported to `progress` as
    its Headline, then the runs compared (`compare_sweep`; not with `compare` False: `replay
    --sglang`'s upgrade view reads the runs itself)."""
    from tierdiag.app.sweep import run_configs

    run_ids = run_configs(trace, configs, db, backend=backend, sweep_id=sweep_id, skip_bad=skip_bad,
                          command_line=command_line, progress=lambda outcome: progress(headline(outcome, db)))
    return compare_sweep(db, run_ids, by=by, sweep_id=sweep_id) if compare else None


@dataclass(frozen=True)
class SweepComparison:
    """The comparison a sweep ends with (diagnose.comparison.compare.Comparison), `resumed` for `sweep --resume`
    (then `merged`: its app.sweep_kept.Resumed)."""

    comparison: Any
    sweep_id: str | None
    db: Path
    resumed: bool = False
    merged: Any = None

    def to_json(self) -> dict:
        return self.comparison.to_json()


def compare_sweep(db: Path, run_ids: Sequence[str], *, by: str | None, sweep_id: str) -> SweepComparison:
    """The sweep's runs (in the order of its combinations) compared."""
    from tierdiag.diagnose.comparison.compare import compare_runs
    from tierdiag.store.reader import list_runs, open_store

    with open_store(db) as con:
        by_id = {r.run_id: r for r in list_runs(con)}
        result = compare_runs(con, [by_id[i] for i in run_ids], by=by, sweep_id=sweep_id)
    return SweepComparison(result, sweep_id, Path(db))


def resume_sweep(kept: Path, db: Path, *, by: str | None,
                 merged: Callable[[Any], None] | None = None) -> SweepComparison:
    """`sweep --resume KEPT`: the kept runs merged into `db` (app.sweep_kept.resume; `merged` is told
    what was, before the comparison), then compared: the whole sweep, the runs merged before --db
    went busy too (oldest first, as a sweep's)."""
    from tierdiag.app.sweep import resume
    from tierdiag.diagnose.comparison.compare import check_sort_key, compare_runs
    from tierdiag.store.reader import list_runs, open_store

    check_sort_key(by)
    done = resume(kept, db)
    if merged is not None:
        merged(done)
    with open_store(db) as con:
        every = list_runs(con)
        runs = ([r for r in every if r.sweep_id == done.sweep_id] if done.sweep_id is not None else
                [r for r in every if r.run_id in set(done.run_ids)])
        result = compare_runs(con, runs, by=by, sweep_id=done.sweep_id)
    return SweepComparison(result, done.sweep_id, Path(db), resumed=True, merged=done)
