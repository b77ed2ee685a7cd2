"""`tierdiag advise`: propose option changes from a run's diagnosis and verify each by replaying its trace."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from tierdiag.cli.common import DEFAULT_DB_PATH, DbOpt, JsonOpt, RunOpt
from tierdiag.cli.sink import Sink, renders


def advise(
    db: DbOpt = DEFAULT_DB_PATH,
    run: RunOpt = None,
    budget: Annotated[int, typer.Option("--budget", help="At most this many replays: the changes (a size at its one-pass curve's knee, "
                                                         "one replay each), then the best confirmed together.")] = 4,
    jobs: Annotated[Optional[int], typer.Option("--jobs", help="Replays at a time (default: one per change, "
                                                               "at most the machine's cores).")] = None,
    host_memory: Annotated[Optional[str], typer.Option(
        "--host-memory", metavar="SIZE", help="Host memory a server has for KV per GPU (each rank's host pool is its own), in "
                              "bytes (k/M/G/T suffixes: 512G, 2T); a host pool beyond it is not proposed, a storage "
                              "tier is. Default 256G (an 8-GPU server's 2T).")] = None,
    json_: JsonOpt = False,
) -> None:
    """Propose cache changes from the run's diagnosis, replay the run's trace once per change in parallel,
    and print TTFT p50/p99, recompute share and reuse by tier before and after; the best is marked.
    The measured numbers then show in `explain` as advice[].verified for that run's requests."""
    from tierdiag.app.advise import advise as advise_store
    from tierdiag.diagnose.advice import HOST_POOL_LIMIT_BYTES

    host_limit = HOST_POOL_LIMIT_BYTES if host_memory is None else _bytes(host_memory)
    from tierdiag.cli.progress import Progress

    # How many replays is known only as they go (the changes, then their combination and the size
    # searches, within --budget): a count of at most the budget, no total.
    bar = Progress("advise", None, f"of at most {budget} replays", show_bar=not json_)

    def progress(outcome) -> None:
        bar.advance()
        if not json_:
            bar.print(f"  {outcome.name}: {outcome.status}" + (f" ({outcome.wall_s:.1f}s)" if outcome.wall_s else ""))

    with bar:
        result = advise_store(db, run, budget=budget, jobs=jobs, host_limit_bytes=host_limit, progress=progress)
    Sink(json=json_).emit(result)


@renders("tierdiag.app.advise.AdviseResult")
def _text(result, console) -> None:
    from tierdiag.report.views import render

    render(result, console, run=result.run)


def _bytes(text: str) -> int:
    from tierdiag.config.sweep_spec import size_option

    return size_option("--host-memory", text)  # bytes: 1 to 2^63 - 1
