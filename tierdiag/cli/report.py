"""`tierdiag report`: one self-contained HTML file for a run (works offline)."""

from __future__ import annotations

import webbrowser
from pathlib import Path
from typing import Annotated, Optional, Tuple

import typer

from tierdiag.cli.common import DEFAULT_DB_PATH, DbOpt, JsonOpt, RunOpt, err
from tierdiag.cli.sink import Sink, renders

OutputOpt = Annotated[Optional[Path], typer.Option(
    "-o", "--output", help="Where to write the HTML (default: reports/<run name>-<run id>.html).")]
OpenOpt = Annotated[bool, typer.Option("--open", help="Open the report in a web browser afterwards.")]
CompareOpt = Annotated[Optional[Tuple[str, str]], typer.Option(
    "--compare", metavar="A B", help="A comparison report of two runs instead (ids, prefixes or names).")]
SweepOpt = Annotated[Optional[str], typer.Option("--sweep", metavar="SWEEP", help="A comparison report of every run of this sweep.")]


def report(db: DbOpt = DEFAULT_DB_PATH, run: RunOpt = None, output: OutputOpt = None, open_: OpenOpt = False,
           compare: CompareOpt = None, sweep: SweepOpt = None, json_: JsonOpt = False) -> None:
    """Write an HTML report of a run: tier split, pools over time, per-request TTFT, load-back
    distributions, TTFT decomposition and the slowest cached requests with their verdicts.
    With --compare A B or --sweep ID: overlaid TTFT CDFs, reuse by tier, memory against TTFT,
    and the requests that changed most between two runs."""
    if output is not None:  # never the store it reads, nor any DuckDB file (tierdiag/paths.py)
        from tierdiag.paths import check_output

        check_output(output, what="-o", inputs=[("--db", db)])
    if compare or sweep:
        from tierdiag.errors import ConfigError
        from tierdiag.report.compare_html import build_compare_report

        if compare and sweep or run is not None:
            raise ConfigError("--run, --compare and --sweep pick different reports: give one of them")
        result = build_compare_report(db, list(compare or ()), sweep, output)
    else:
        # Imported here: main.py imports every command module, and the report stack (numpy, figures)
        # would otherwise add ~0.1 s to the start-up of explain/slow/summary.
        from tierdiag.cli.progress import Progress
        from tierdiag.report.html import REPORT_STEPS, build_report

        with Progress("report", REPORT_STEPS, "steps") as bar:
            result = build_report(db, run, output, progress=lambda done, total: bar.update(done, total=total))
    Sink(json=json_).emit(result)
    if open_:
        # webbrowser returns False rather than raising when no browser is available (CI, SSH).
        opened = webbrowser.open(result.path.resolve().as_uri())
        if not opened:
            err.print(f"no web browser found; open {result.path} yourself", markup=False, highlight=False)


@renders("tierdiag.report.html.ReportResult", "tierdiag.report.compare_html.CompareReportResult")
def _text(result, console) -> None:
    """The written file's path, alone on its line (controls and newlines escaped)."""
    from tierdiag.report.terminal import visible

    print(visible(result.path, lines=False), file=console.file)
