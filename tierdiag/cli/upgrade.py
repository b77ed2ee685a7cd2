"""`tierdiag replay TRACE --sglang OLD,NEW`: the upgrade view (not a command of its own: replay's
`--sglang` with two releases). Parse, one call (app/upgrade.py through the sweep runner's
progress), then the view (report/upgrade_view.py) or its JSON."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from tierdiag.cli.common import db_option
from tierdiag.cli.sink import Sink, renders
from tierdiag.errors import ConfigError


def upgrade_releases(sglang: str | None, *, jobs: int | None, no_probes: bool) -> tuple[str, ...]:
    """`--sglang`'s releases: () unset, (one) as given, or (OLD, NEW) ordered for an upgrade. A
    single name is left to the config's check (its one registry error)."""
    from tierdiag.config.releases import ordered, parse_releases

    if sglang is None or "," not in sglang:
        if jobs is not None:
            raise ConfigError("--jobs goes with --sglang OLD,NEW (a single replay runs in one process)")
        return () if sglang is None else (sglang,)
    releases = parse_releases(sglang)
    if len(releases) == 1:  # "0.5.23," was refused as an empty name; a lone name has no comma
        return releases
    if no_probes:
        raise ConfigError("--sglang OLD,NEW records its replays to compare them: not with --no-probes")
    if jobs is not None and jobs < 1:
        raise ConfigError(f"--jobs {jobs} must be at least 1")
    return ordered(releases)


def replay_upgrade(trace: Path, cfg, releases: tuple[str, str], *, db: Path, run_name: str | None,
                   jobs: int | None, skip_bad: bool, json_: bool, runner=None) -> None:
    """Replay the upgrade's plan and show its view. A rule's replay that failed leaves that rule
    out of the view (listed as not isolated) and the command then fails with the sweep's error;
    without both release runs there is no view, only the error. `runner`: the sweep's `run_sweep`."""
    from tierdiag.app.sweep import Processes, SweepFailed
    from tierdiag.app.upgrade import new_upgrade_id, plan_upgrade
    from tierdiag.diagnose.comparison.upgrade import upgrade_view
    from tierdiag.errors import StoreError
    from tierdiag.store.reader import list_runs, open_store

    if runner is None:
        from tierdiag.cli.sweep import run_sweep as runner  # the sweep's progress bar, headlines and interrupt line

    plan = plan_upgrade(cfg, releases, run_name or trace.stem)
    sweep_id = new_upgrade_id()
    failed: SweepFailed | None = None
    try:
        runner(trace, SimpleNamespace(configs=list(plan.configs)), db, Processes(jobs), sweep_id, skip_bad, compare=False)
    except SweepFailed as exc:
        failed = exc
    try:
        con = open_store(db)
    except StoreError:  # no run made it into the store (none there, no runs, ...)
        if failed is not None:  # the sweep's own error says why
            raise failed from None
        raise
    with con:
        runs = [r for r in list_runs(con) if r.sweep_id == sweep_id]
        try:
            view = upgrade_view(con, runs)
        except StoreError:
            if failed is not None:  # a release's own run failed: nothing to compare
                raise failed from None
            raise
    Sink(json=json_).emit(view, db=db)
    if failed is not None:
        raise failed


@renders("tierdiag.diagnose.comparison.upgrade.UpgradeView")
def _text(view, out, *, db: Path) -> None:
    from tierdiag.report.terminal import plain
    from tierdiag.report.upgrade_view import render_upgrade

    render_upgrade(view, out)
    where = db_option(db)
    new_run = next(r.run_id for r in view.runs if r.role == "new")
    old_run = next(r.run_id for r in view.runs if r.role == "old")
    # A hint runs as printed (issue 42): the request the upgrade moved most, else the run's slowest.
    import shlex

    from tierdiag.cli.hints import slowest_request

    moved = view.upgrade.top[0].req_id if view.upgrade.top else None
    req = shlex.quote(moved) if moved is not None else slowest_request(db, new_run)
    explain = f"tierdiag explain {req} --run {new_run}{where}   ·   " if req else ""
    out.print(plain(f"next: {explain}tierdiag compare {old_run} {new_run}{where}"))
