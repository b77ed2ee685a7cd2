"""`tierdiag replay TRACE`: run a workload trace through the tiered cache engine and record it."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from dataclasses import fields
from typing import Annotated, Optional

from tierdiag import signals
from tierdiag.cli import common
from tierdiag.cli.choices import choices, completer, listed
from tierdiag.cli.upgrade import upgrade_releases
from tierdiag.cli.common import command_line, DEFAULT_DB_PATH, err, typer_when_read as typer
from tierdiag.cli.sink import Sink
from tierdiag.cli import replay_view  # noqa: F401 - registers the replay's text view (app.replay.ReplayResult)
from tierdiag.config.names import Tier
# No torch: presets, registries and validation only.
from tierdiag.units import fmt_ms, fmt_pool
from tierdiag.config.engine import (
    ARRIVALS,
    EVICTION_POLICIES,
    PREFETCH_POLICIES,
    SCHEDULE_POLICIES,
    SGLANG_RULES,
    TIMINGS,
    VERIFY_MODES,
    WRITE_POLICIES,
    EngineConfig,
    load_config,
)
from tierdiag.config.presets import GPUS, MODELS, model_preset
from tierdiag.config.router import ROUTER_NAMES
from tierdiag.errors import RunInterrupted



# The annotations below are read by Typer alone (`typer.Argument`, `Opt`, `common.DbOpt`: Typer
# imported when it reads them); cli/main.py calls `replay` directly, without Typer, for the plain
# forms of the command line.
def Opt(*param_decls, **kwargs):
    """typer.Option, made when Typer reads the annotation."""
    import typer as typer_

    return typer_.Option(*param_decls, **kwargs)


def _default(name: str):
    return next(f.default for f in fields(EngineConfig) if f.name == name)


def _d(text: str, name: str | None = None, shown: object = None) -> str:
    """Help text ending in its default, in Typer's own format. The options themselves default
    to None (not given), so that a --config file can set what the command line did not."""
    value = shown if shown is not None else _default(name)
    if isinstance(value, bool):
        value = name.replace("_", "-") if value else f"no-{name.replace('_', '-')}"
    return f"{text}  [default: {value}]"


def _pool_default(which: str) -> str:
    cfg = EngineConfig.__new__(EngineConfig)  # the defaults, without validating this machine
    for f in fields(EngineConfig):
        object.__setattr__(cfg, f.name, f.default)
    tokens = cfg.resolved_device_tokens() if which == Tier.DEVICE else cfg.resolved_host_tokens()
    how = ("what the GPU preset leaves beside the weights" if which == Tier.DEVICE else "2x device")
    return f"{how}; {cfg.model} on {cfg.gpu}: {fmt_pool(tokens, model_preset(cfg.model).kv_bytes_per_token)}"


def replay(
    trace: Annotated[Path, typer.Argument(help="Trace file: Mooncake JSONL or tierdiag JSONL (.gz too).",
                                          metavar="TRACE", show_default=False)],
    db: common.DbOpt = DEFAULT_DB_PATH,
    run_name: Annotated[Optional[str], Opt("--run-name", metavar="NAME", help="Name of the run (default: trace file stem).")] = None,
    config: Annotated[Optional[Path], Opt("--config", help="TOML file with any of the options below.")] = None,
    # NAME, the names in the help text: the presets' list is too long for one line of --help at 80 columns.
    model: Annotated[Optional[str], Opt(metavar="NAME", autocompletion=completer(MODELS), help=_d(
        "Model preset: " + listed(MODELS) + ".", "model"))] = None,
    gpu: Annotated[Optional[str], Opt(**choices(GPUS), help=_d("GPU preset.", "gpu"))] = None,
    device_tokens: Annotated[Optional[int], Opt(help=_d("Device KV pool in tokens.",
                                                         shown=_pool_default(Tier.DEVICE)))] = None,
    host_tokens: Annotated[Optional[int], Opt(help=_d("Host KV pool in tokens.", shown=_pool_default(Tier.HOST)))] = None,
    storage_tokens: Annotated[Optional[int], Opt(help=_d("Storage tier in tokens; 0 = none.", "storage_tokens"))] = None,
    storage_dir: Annotated[Optional[Path], Opt("--storage-dir", help="Folder for the storage tier's page files; each run "
                                               "writes into its own subfolder.  [default: DB.storage beside --db]",
                                               show_default=False)] = None,
    page_size: Annotated[Optional[int], Opt(help=_d("Tokens per page (a power of two).", "page_size"))] = None,
    block_size: Annotated[Optional[int], Opt(help=_d("Tokens per hash id in Mooncake traces.", "block_size"))] = None,
    write_policy: Annotated[Optional[str], Opt(**choices(WRITE_POLICIES), help=_d("When pages are backed up to host.", "write_policy"))] = None,
    eviction_policy: Annotated[Optional[str], Opt(**choices(EVICTION_POLICIES), help=_d("Which pages leave a full pool first.", "eviction_policy"))] = None,
    tlru_threshold: Annotated[Optional[int], Opt("--tlru-threshold", help=_d("tlru only: tokens of a conversation's history that need not stay cached (SGLang's --radix-eviction-policy-config threshold).", shown="unset"))] = None,
    tlru_next_prompt_estimate: Annotated[Optional[int], Opt("--tlru-next-prompt-estimate", help=_d("tlru only: expected tokens of the next prompt (next_prompt_estimate); below --tlru-threshold.", shown="unset"))] = None,
    load_back_threshold: Annotated[Optional[int], Opt(help=_d("Host hits shorter than this (tokens) are recomputed.", "load_back_threshold"))] = None,
    prefetch_policy: Annotated[Optional[str], Opt(**choices(PREFETCH_POLICIES), help=_d("How long a request waits for its storage prefetch.", shown="the release's: timeout (0.5.23), best_effort (0.5.9)"))] = None,
    schedule_policy: Annotated[Optional[str], Opt(**choices(SCHEDULE_POLICIES), help=_d("Waiting-queue order: fcfs, lpm (longest cached prefix first), hrrn and shortest-prefill-first (SGLang 0.5.23 only).", "schedule_policy"))] = None,
    prefetch_threshold: Annotated[Optional[int], Opt(help=_d("Storage hits shorter than this (tokens) are not prefetched.", "prefetch_threshold"))] = None,
    max_prefill_tokens: Annotated[Optional[int], Opt(help=_d("Token budget of one prefill batch (chunk size).", "max_prefill_tokens"))] = None,
    overlap: Annotated[Optional[bool], Opt("--overlap/--no-overlap", help=_d("Overlap load-back with prefill layer by layer.", "overlap", True))] = None,
    timing: Annotated[Optional[str], Opt(**choices(TIMINGS), help=_d("modelled: the cost model; measured: real kernel time, scaled.", "timing"))] = None,
    profile: Annotated[Optional[Path], Opt(help="A `tierdiag calibrate` profile: the link numbers (JSON), or the whole "
                                                "clock fitted by `calibrate --from` (TOML; sets --model/--gpu).")] = None,
    time_scale: Annotated[Optional[float], Opt(help=_d("Multiply inter-arrival times (2 = half the request rate).", "time_scale"))] = None,
    arrivals: Annotated[Optional[str], Opt(**choices(ARRIVALS), help=_d(
        "How session turns arrive: trace = at their timestamps (open loop); closed = at the previous turn's "
        "finish + think_ms.", shown="closed where the trace has sessions, else trace"))] = None,
    max_context: Annotated[Optional[int], Opt("--max-context", help=_d(
        "Longest request (input + output tokens); longer ones are rejected (context_length).",
        shown="the model preset's context"))] = None,
    max_running_requests: Annotated[Optional[int], Opt("--max-running-requests", help=_d(
        "Requests running at once on a scheduler (each --dp rank), SGLang's --max-running-requests; SGLang 0.5.23 "
        "caps it at half the device pool.", shown="derived as SGLang does: 512 per context of device tokens, "
        "2048-4096, at most half the device pool"))] = None,
    seed: Annotated[Optional[int], Opt(help=_d("Seed (recorded; the engine itself is deterministic).", "seed"))] = None,
    verify: Annotated[Optional[str], Opt(**choices(VERIFY_MODES), help=_d("Check load-backs byte for byte (sample: one in 16).", "verify"))] = None,
    data_plane_mib: Annotated[Optional[int], Opt(help=_d("Memory for the real pools in MiB; their width shrinks to fit.", "data_plane_mib"))] = None,
    dp: Annotated[Optional[int], Opt("--dp", help=_d("Data-parallel ranks behind one router, on one clock, sharing the "
                                                     "storage tier (config key dp). A twin of an imported run: the ranks its "
                                                     "export named.", "dp"))] = None,
    # NAME, the names in the help text: the list is too long for one line of --help at 80 columns.
    router: Annotated[Optional[str], Opt("--router", metavar="NAME", autocompletion=completer(ROUTER_NAMES), help=_d(
        "The router in front of the --dp ranks: " + listed(ROUTER_NAMES) + "; its parameters are the router_* "
        "config keys.", "router"))] = None,
    enable_mixed_chunk: Annotated[Optional[bool], Opt("--enable-mixed-chunk", help=_d(
        "A prefill batch carries the running requests' decode step (SGLang's --enable-mixed-chunk; config key "
        "enable_mixed_chunk).", shown="off"))] = None,
    sglang: Annotated[Optional[str], Opt("--sglang", metavar="RELEASE[,RELEASE]", autocompletion=completer(SGLANG_RULES), help=_d(
        "The SGLang release whose cache rules the engine follows, " + listed(SGLANG_RULES) + " (config key sglang_rules). Two, OLD,NEW: the "
        "upgrade view, both replayed and NEW once more per differing rule switched back, under one sweep id.",
        "sglang_rules"))] = None,
    jobs: Annotated[Optional[int], Opt("--jobs", help="With --sglang OLD,NEW: replays at a time (default: the "
                                                      "machine's cores).")] = None,
    skip_bad: Annotated[bool, Opt("--skip-bad", help="Skip malformed trace lines (and count them).")] = False,
    no_probes: Annotated[bool, Opt("--no-probes", help="Record nothing (benchmarking the engine).")] = False,
    json_: common.JsonOpt = False,
) -> None:
    """Replay TRACE through the tiered cache engine and record every request into --db."""
    # Whatever happens below is closed by the time the command returns (the run, its writer
    # process, the storage tier's files): the process then skips freeing the engine's objects.
    from tierdiag.app.replay import single_threaded_blas, twin_dp
    from tierdiag.cli.exits import leave_without_teardown, process_ends_after, process_ends_unfreed

    leave_without_teardown()
    single_threaded_blas()  # before anything loads numpy (its BLAS threads would spin): app/replay.py
    # A twin of an observed run replays on as many ranks as the server had, unless told.
    ranks = twin_dp(None if no_probes else db, trace) if dp is None else None
    # --sglang OLD,NEW (cli/upgrade.py): the options are checked under NEW here, under OLD by its plan.
    releases = upgrade_releases(sglang, jobs=jobs, no_probes=no_probes)
    if len(releases) == 2:
        sglang = releases[1]
    cfg = load_config(config, {
        "model": model, "gpu": gpu, "device_tokens": device_tokens, "host_tokens": host_tokens,
        "storage_tokens": storage_tokens, "storage_dir": str(storage_dir) if storage_dir else None,
        "page_size": page_size, "block_size": block_size,
        "write_policy": write_policy, "eviction_policy": eviction_policy, "tlru_threshold": tlru_threshold,
        "tlru_next_prompt_estimate": tlru_next_prompt_estimate,
        "load_back_threshold": load_back_threshold, "prefetch_policy": prefetch_policy,
        "schedule_policy": schedule_policy,
        "prefetch_threshold": prefetch_threshold, "max_prefill_tokens": max_prefill_tokens,
        "layerwise_overlap": overlap, "timing": timing, "profile": str(profile) if profile else None,
        "time_scale": time_scale, "arrivals": arrivals, "max_context_tokens": max_context,
        "max_running_requests": max_running_requests, "seed": seed, "verify": verify, "data_plane_mib": data_plane_mib,
        "sglang_rules": sglang, "dp": dp, "router": router, "enable_mixed_chunk": enable_mixed_chunk,
    }, defaults={"dp": ranks} if ranks else None,
        defaults_origin=f"the imported run whose --trace-out this trace is (its export named {ranks} ranks)")
    if not no_probes:  # the store is not one of the files this replay reads (tierdiag/paths.py)
        from tierdiag.paths import check_output

        check_output(db, what="--db", inputs=[("TRACE", trace), ("--config", config), ("--profile", profile)],
                     store=True)
    for warning in cfg.warnings():
        err.print(f"tierdiag: warning: {warning}", markup=False, highlight=False)
    if len(releases) == 2:
        from tierdiag.cli.upgrade import replay_upgrade

        return replay_upgrade(trace, cfg, releases, db=db, run_name=run_name, jobs=jobs, skip_bad=skip_bad,
                              json_=json_)
    # Imported here, not at the top: every command module is imported to register it.
    from tierdiag.app.replay import ReplayInterrupted, replay as run_replay

    if not json_:
        # What the closing table and an interrupt's line print with, loaded now, whole: a signal
        # landing in one of these imports at the end would stop it part-way (decimal's C part,
        # under rich.table), and importing it again prints a libmpdec warning on stderr.
        with signals.deferred():
            import rich.table  # noqa: F401
            import rich.text  # noqa: F401

            import tierdiag.report.terminal  # noqa: F401

    bar, progress = _progress_bar(trace, show_bar=not json_)
    with bar:
        try:
            summary = run_replay(trace, cfg, db=None if no_probes else db, run_name=run_name,
                                 probes=not no_probes, skip_bad=skip_bad,
                                 command_line=command_line(), progress=progress,
                                 process_ends=process_ends_unfreed(),
                                 leave_stopped_again=_leave_stopped_again(bar, progress) if process_ends_after() else None)
        except ReplayInterrupted as exc:
            if progress is not None:  # a bar is shown: it goes before the interrupt's line
                bar.stop()
            # The CLI's one place for interrupts prints it and exits 130 (143 for SIGTERM).
            raise RunInterrupted(_interrupted_line(exc)) from None

    try:
        if summary.bad_lines:
            print(f"tierdiag: {_skipped_line(summary.bad_lines, summary.first_bad)}", file=sys.stderr)
        if summary.unknown_keys:
            err.print(f"tierdiag: warning: ignored unknown trace keys: {', '.join(summary.unknown_keys)}",
                      markup=False, highlight=False)
        Sink(json=json_).emit(summary, cfg=cfg)
    except KeyboardInterrupt:
        # While the closing numbers are printed: the run is closed (complete) and stays so. Its
        # request rows are the finished and the rejected requests (the file's count, as above).
        kept = ReplayInterrupted(summary.run_id, summary.db_path, summary.num_requests + summary.num_rejected,
                                 status=summary.status)
        raise RunInterrupted(_interrupted_line(kept)) from None


def _leave_stopped_again(bar, progress):
    """What ends the CLI's process where a second signal stops an inline replay's interrupted
    close (its rows and status committed): the bar put away, the interrupt's line, the first
    signal's code (cli/exits.py `leave_now`)."""
    def leave(exc) -> None:
        from tierdiag.cli.exits import leave_now

        if progress is not None:
            with contextlib.suppress(Exception):  # the handler may have come in the middle of a redraw
                bar.stop()
        leave_now(_interrupted_line(exc))

    return leave


def _interrupted_line(exc) -> str:
    """What an interrupted replay kept, for the CLI's one interrupt line (a ReplayInterrupted)."""
    if exc.write_problem is not None:
        line = f"interrupted; {exc.write_problem.one_line()}"
        if exc.run_id:  # where the run is, as for any other interrupted run
            n = exc.num_requests
            line += (f"; run {exc.run_id} kept in {exc.db_path} as {exc.status}, "
                     f"{n:,} request{'' if n == 1 else 's'} recorded")
        return line
    if exc.run_id:
        n = exc.num_requests
        line = (f"interrupted; run {exc.run_id} kept in {exc.db_path} as {exc.status}, "
                f"{n:,} request{'' if n == 1 else 's'} recorded")
        if getattr(exc, "stopped_again", False):
            # A second signal once the rows and status were committed (WriterProcess).
            line = line.replace("interrupted; ", "interrupted, then stopped again; ", 1)
            line += "; its evidence was not stored (the first reader that can write the store computes and stores it)"
        return line
    return "interrupted (nothing was being recorded)"


def _progress_bar(trace: Path, *, show_bar: bool):
    """Where the replay is, on stderr (tierdiag/cli/progress.py: a bar on a terminal, unless --json;
    a line every ~10 s otherwise), and the replay's callback that moves it. Without either (--json
    on a terminal, TIERDIAG_PROGRESS_EVERY_S=0 piped), neither rich.progress nor a count of the
    trace's lines (a read of the whole file) is paid for: a context that does nothing, no callback."""
    from tierdiag.cli.progress import Progress, every_s, stderr_is_terminal

    terminal = stderr_is_terminal()  # piped: Rich not loaded for it
    if not (show_bar and terminal) and (terminal or every_s() == 0):
        return contextlib.nullcontext(), None
    from tierdiag.app.replay import count_lines

    # The total (a read of the whole trace) where it is first shown: piped, the first line's ~10 s in.
    bar = Progress("replay", lambda: count_lines(trace) if trace.is_file() else None, "requests", show_bar=show_bar)

    from tierdiag.diagnose.request.tokens import TokenSplit

    def progress(done: int, since_start_ns: int, stats) -> None:
        reused = TokenSplit.of(stats).reused_tokens
        share = lambda n: f"{n / stats.input_tokens:.0%}" if stats.input_tokens else "-"  # noqa: E731
        bar.update(done, info=(f"t={fmt_ms(since_start_ns)}  device {share(stats.device_tokens)} host "
                               f"{share(stats.host_tokens)} storage {share(stats.storage_tokens)} reuse {share(reused)}"))

    return bar, progress


def _skipped_line(count: int, first_bad: list) -> str:
    """'skipped 3 bad lines (line 4: bad JSON (...); also line 9, line 12)'."""
    (line, why), *rest = first_bad
    more = [f"line {ln}" for ln, _ in rest] + (["..."] if count > len(first_bad) else [])
    also = f"; also {', '.join(more)}" if more else ""
    return f"skipped {count:,} bad line{'s' if count != 1 else ''} (line {line}: {why}{also})"
