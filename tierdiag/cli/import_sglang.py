"""`tierdiag import sglang PATH...`: an SGLang server's per-request metrics export -> an observed run.

`import` is a Python keyword, so the command group is a Typer sub-app (`import_app`) that
main.py adds by name; each source format is one command of it.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, Optional

import typer

from tierdiag.cli.common import command_line, db_option, DbOpt, DEFAULT_DB_PATH, err, JsonOpt
from tierdiag.cli.sink import Sink, renders

import_app = typer.Typer(name="import", help="Record a server's own per-request export as an observed run.",
                         no_args_is_help=True)


def _tokens(n: int, total: int) -> str:
    return f"{n:,} ({n / total:.1%})" if total else f"{n:,}"


@import_app.command("sglang")
def sglang(
    paths: Annotated[list[Path], typer.Argument(
        help="sglang-request-metrics-*.log(.gz) files, or folders holding them (--export-metrics-to-file-dir).")],
    db: DbOpt = DEFAULT_DB_PATH,
    run_name: Annotated[Optional[str], typer.Option("--run-name", metavar="NAME", help="Name of the run (default: sglang-<folder>).")] = None,
    trace_out: Annotated[Optional[Path], typer.Option(
        "--trace-out", help="Also write the requests as a tierdiag trace (JSONL) to replay as the twin run.")] = None,
    skip_bad: Annotated[bool, typer.Option("--skip-bad", help="Skip malformed lines (and count them).")] = False,
    json_: JsonOpt = False,
) -> None:
    """Read SGLang's --export-metrics-to-file output into one run of kind `observed`."""
    # Imported here, not at the top: main.py imports every command module to register it.
    from tierdiag.importers.load import import_sglang

    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("import", style="bold", markup=False), BarColumn(), DownloadColumn(), TextColumn("{task.fields[info]}", markup=False),
                   TimeElapsedColumn(), console=err, transient=True, disable=not err.is_terminal or json_)
    with bar:
        task = bar.add_task("import", total=None, info="")

        def progress(records: int, done: int, total: int) -> None:
            bar.update(task, completed=done, total=max(total, done), info=f"{records:,} requests")

        s = import_sglang(paths, db=db, run_name=run_name, trace_out=trace_out, skip_bad=skip_bad,
                          command_line=command_line(), progress=progress)
    if s.bad_lines:
        first = "; ".join(s.first_bad[:2])
        err.print(f"tierdiag: skipped {s.bad_lines:,} bad line{'s' if s.bad_lines != 1 else ''} (first: {first})",
                  markup=False, highlight=False)
    for warning in s.warnings:
        err.print(f"tierdiag: warning: {warning}", markup=False, highlight=False)
    Sink(json=json_).emit(s)


@renders("tierdiag.importers.load.ImportSummary")
def _text(s, out) -> None:
    from rich.table import Table

    table = Table(title=f"import sglang: {s.run_name}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("files", f"{len(s.files):,}")
    table.add_row("requests", f"{s.num_requests:,}" + (f" ({s.num_aborted:,} aborted)" if s.num_aborted else ""))
    total = s.input_tokens
    table.add_row("input tokens", f"{total:,}")
    table.add_row("device hit", _tokens(s.device_tokens, total))
    table.add_row("host hit (loaded back)", _tokens(s.host_tokens, total))
    table.add_row("storage hit", _tokens(s.storage_tokens, total)
                  + (f" ({', '.join(s.storage_backends)})" if s.storage_backends else ""))
    table.add_row("computed", _tokens(s.computed_tokens, total))
    table.add_row("with TTFT", f"{s.num_with_ttft:,} of {s.num_requests:,}")
    if s.span_s is not None:
        table.add_row("span", f"{s.span_s:,.1f} s of server time")
    if s.dp_ranks:
        table.add_row("dp ranks", f"{s.dp_ranks:,} (dp_rank in the export; a twin replays with --dp {s.dp_ranks})")
    if s.trace_out:
        table.add_row("trace", f"{s.trace_requests:,} requests -> {s.trace_out}")
    table.add_row("read in", f"{s.wall_s:,.2f} s ({s.num_requests / s.wall_s:,.0f} requests/s)" if s.wall_s else "-")
    out.print(table)
    from tierdiag.report.terminal import plain

    db_opt = db_option(s.db_path)
    out.print(plain(f"recorded observed run {s.run_id} in {s.db_path}"))
    if s.trace_out and s.trace_requests:
        # Hints that run as printed (tierdiag/cli/hints.py): the twin under a name, then compared.
        twin = shlex.quote(f"{s.run_name}-twin")
        out.print(plain("the twin: give its replay the server's cache sizes, which the export does not hold "
                        "(--device-tokens, --host-tokens, --page-size)"))
        out.print(plain(f"next: tierdiag replay {shlex.quote(str(s.trace_out))}{db_opt} --run-name {twin}   ·   "
                        f"tierdiag compare {s.run_id} {twin} --requests{db_opt}"))
    else:
        from tierdiag.cli.hints import slowest_request

        req = slowest_request(s.db_path, s.run_id)
        explain = f"   ·   tierdiag explain {req} --run {s.run_id}{db_opt}" if req else ""
        out.print(plain(f"next: tierdiag summary --run {s.run_id}{db_opt}{explain}"))
