"""`tierdiag sweep TRACE --set KEY=V1,V2 ...`: one replay per combination, then the comparison."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, List, Optional

import typer

from tierdiag.cli.common import command_line, db_option, DbOpt, DEFAULT_DB_PATH, err, JsonOpt
from tierdiag.cli.sink import Sink, renders
from tierdiag.errors import ConfigError

Opt = typer.Option


def sweep(
    trace: Annotated[Optional[Path], typer.Argument(help="Trace file: Mooncake JSONL or tierdiag JSONL (.gz too).",
                                                    show_default=False)] = None,
    set_: Annotated[List[str], Opt("--set", help="KEY=V1,V2,...: a replay option (its --config TOML name) and the "
                                                 "values to try; sizes take k/M/G (512k, 4M). Repeat for more keys: "
                                                 "every combination is replayed.")] = [],
    config: Annotated[Optional[Path], Opt("--config", help="TOML file with the base options (as `replay --config`).")] = None,
    jobs: Annotated[Optional[int], Opt("--jobs", help="Replays at a time (default: the machine's cores; with a "
                                                      "local --ray, its CPUs).")] = None,
    ray: Annotated[bool, Opt("--ray", help="Run each combination as a Ray task: `--ray` alone on a local Ray, "
                                           "`--ray ADDRESS` on that cluster (needs `pip install 'tierdiag[ray]'`).")] = False,
    # `--ray [ADDRESS]`: Typer has no option with an optional value, so the address is the one
    # positional argument allowed after TRACE, and only together with --ray.
    address: Annotated[Optional[str], typer.Argument(metavar="[ADDRESS]", show_default=False,
                                                     help="Ray address, with --ray.")] = None,
    by: Annotated[Optional[str], Opt("--by", metavar="METRIC", help="Sort the comparison by this metric (see `compare --by`).")] = None,
    skip_bad: Annotated[bool, Opt("--skip-bad", help="Skip malformed trace lines (and count them).")] = False,
    db: DbOpt = DEFAULT_DB_PATH,
    resume: Annotated[Optional[Path], Opt("--resume", help="Instead of a sweep: merge the runs a sweep kept in this "
                                                           "store (when --db stayed busy) into --db, and compare them.",
                                          show_default=False)] = None,
    json_: JsonOpt = False,
) -> None:
    """Replay TRACE once per combination of the --set values (in parallel processes or Ray tasks),
    record every run in --db under one sweep id, and compare them. A finished run is never lost:
    when --db stays busy the runs are kept in a store beside it, merged later with --resume."""
    if resume is not None:
        if trace is not None or set_ or config is not None or ray:
            raise ConfigError("--resume merges a kept store: give it no TRACE, --set, --config or --ray")
        return _resume(resume, db, by, json_)
    if trace is None:
        raise ConfigError("missing TRACE", hint="tierdiag sweep TRACE --set KEY=V1,V2")
    if not ray:
        from tierdiag.app.sweep_fork import warm_up_workers  # not app.sweep: its store code (pyarrow) can wait

        warm_up_workers()  # the workers' fork server boots and imports while the sweep is planned
    from tierdiag.config.engine import load_config  # no torch: presets and validation only
    from tierdiag.app.sweep import Processes, Ray, import_ray, new_sweep_id
    from tierdiag.config.sweep_spec import plan_sweep

    if by is not None:  # the comparison's module (~0.15 s of imports) waits for the workers otherwise
        from tierdiag.diagnose.comparison.compare import check_sort_key

        check_sort_key(by)
    if jobs is not None and jobs < 1:
        raise ConfigError(f"--jobs {jobs} must be at least 1")
    base = load_config(config, {})
    plan = plan_sweep(base, set_)
    from tierdiag.paths import check_output

    check_output(db, what="--db", inputs=[("TRACE", trace), ("--config", config)], store=True)
    if address is not None and not ray:
        raise ConfigError(f"unexpected argument {address!r} after TRACE", hint="a Ray address goes with --ray ADDRESS")
    if ray:
        import_ray()  # not installed: one line saying how, before anything runs
        backend = Ray(address=address, num_cpus=jobs)
    else:
        backend = Processes(jobs=jobs)
    for warning in dict.fromkeys(w for _, cfg in plan.configs for w in cfg.warnings()):
        err.print(f"tierdiag: warning: {warning}", markup=False, highlight=False)
    Sink(json=json_).emit(run_sweep(trace, plan, db, backend, new_sweep_id(), skip_bad, by))
    # Every store is closed and every worker joined by now: the process ends without freeing
    # what it imported (duckdb, pyarrow, Typer...; cli/exits.py), as `replay` and `summary` do.
    from tierdiag.cli.exits import leave_without_teardown

    leave_without_teardown()


@renders("tierdiag.app.sweep_view.SweepComparison")
def _text(result, out) -> None:
    from tierdiag.report.compare_terminal import render_comparison

    render_comparison(result.comparison, out)
    if result.resumed:
        return
    from tierdiag.report.terminal import plain

    where = db_option(result.db)
    out.print(plain(f"next: tierdiag compare --sweep {result.sweep_id}{where}   ·   "
                    f"tierdiag report --sweep {result.sweep_id}{where}"))


def _headline(h) -> str:
    """One finished combination's progress line (an app.sweep_view.Headline)."""
    from tierdiag.units import fmt_ms, fmt_pct

    if h.run_id is None:
        return f"{h.name}: {h.status}" + (f" ({h.error})" if h.error else "")
    return f"{h.name}: {h.status}, reuse {fmt_pct(h.reuse_share)}, TTFT p50 {fmt_ms(h.ttft_p50_ns)} ({h.wall_s:.1f}s)"


def run_sweep(trace: Path, plan, db: Path, backend, sweep_id: str, skip_bad: bool, by: str | None = None, *,
              compare: bool = True):
    """The sweep (app.sweep_view.sweep) under a progress bar, each finished run's headline printed
    above it; its comparison (None with `compare` False: `replay --sglang` reads its runs itself)."""
    from tierdiag.cli.progress import Progress
    from tierdiag.errors import RunInterrupted
    from tierdiag.app.sweep import Ray, SweepInterrupted
    from tierdiag.app.sweep_view import sweep as run_and_compare

    n = len(plan.configs)
    where = "as Ray tasks" if isinstance(backend, Ray) else f"in {min(backend.jobs or _cores(), n)} processes"
    err.print(f"tierdiag: sweep {sweep_id}: {n} combination{'s' if n != 1 else ''} of {trace.name} {where}",
              markup=False, highlight=False)
    bar = Progress("sweep", n, "runs")  # tierdiag/cli/progress.py: a bar, or a line every ~10 s piped

    def reported(h) -> None:
        bar.advance()
        bar.print(f"  {_headline(h)}")

    from tierdiag.threads import idle_work

    # The comparison's modules, imported once the workers run (app/sweep.py calls `idle` then),
    # not before they start: the driver's start was the longer one beside the fork server's.
    with bar, idle_work(_import_comparison if compare else _nothing):
        try:
            return run_and_compare(trace, plan.configs, db, backend=backend, sweep_id=sweep_id, skip_bad=skip_bad,
                                   command_line=command_line(), progress=reported, by=by, compare=compare)
        except SweepInterrupted as exc:
            bar.stop()
            count = {s: sum(1 for o in exc.outcomes if o.status == s) for s in ("complete", "interrupted", "not_started")}
            kept = next((o.kept_in for o in exc.outcomes if o.kept_in), None)
            where = f"{db}" if kept is None else f"{kept} ({db} was busy; merge: tierdiag sweep --resume {kept} --db {db})"
            # The CLI's one place for interrupts prints it and exits 130 (143 for SIGTERM).
            raise RunInterrupted(f"interrupted; sweep {sweep_id} kept in {where}: {count['complete']} complete, "
                                 f"{count['interrupted']} interrupted, {count['not_started']} not started") from None


def _import_comparison() -> None:
    import tierdiag.diagnose.comparison.compare  # noqa: F401 - the sweep's comparison, and its text view
    import tierdiag.report.compare_terminal  # noqa: F401


def _nothing() -> None:
    pass


def _cores() -> int:
    from tierdiag.app.sweep import default_jobs

    return default_jobs()


def _resume(kept: Path, db: Path, by, json_: bool) -> None:
    """`sweep --resume KEPT`: the kept runs into --db, then the comparison a sweep ends with."""
    from tierdiag.app.sweep_view import resume_sweep

    def merged(done) -> None:
        err.print(f"tierdiag: merged {len(done.copied)} run{'s' if len(done.copied) != 1 else ''} from {kept} into {db}"
                  + (f" ({len(done.present)} there already)" if done.present else "") + f"; removed {kept}",
                  markup=False, highlight=False)

    Sink(json=json_).emit(resume_sweep(kept, db, by=by, merged=merged))
