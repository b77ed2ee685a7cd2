"""`tierdiag advise`: propose option changes from a run's diagnosis and verify each by replaying its trace."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from tierdiag.cli.common import DEFAULT_DB_PATH, DbOpt, JsonOpt, RunOpt, err, out, print_json


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
    from tierdiag.app.advise import advise_run
    from tierdiag.diagnose.advice import HOST_POOL_LIMIT_BYTES
    from tierdiag.store.reader import open_store, resolve_run

    host_limit = HOST_POOL_LIMIT_BYTES if host_memory is None else _bytes(host_memory)

    with open_store(db) as con:
        info = resolve_run(con, run, db_label=str(db))

    def progress(outcome) -> None:
        err.print(f"  {outcome.name}: {outcome.status}" + (f" ({outcome.wall_s:.1f}s)" if outcome.wall_s else ""),
                  markup=False, highlight=False)

    result = advise_run(lambda: open_store(db), db, info, budget=budget, jobs=jobs, host_limit_bytes=host_limit,
                        progress=None if json_ else progress)
    if json_:
        print_json(result.to_json())
        return
    from tierdiag.report.views import render

    render(result, out, run=info)


def _bytes(text: str) -> int:
    from tierdiag.errors import ConfigError
    from tierdiag.config.sweep_spec import parse_size

    try:
        value = parse_size(text)
    except ValueError:
        raise ConfigError(f"--host-memory {text!r} is not a size in bytes (e.g. 512G, 2T)") from None
    if value < 1:
        raise ConfigError(f"--host-memory {text!r} must be at least 1 byte")
    return value
