"""`tierdiag convert`: public session-trace formats (kv-cache-tester, bailian) to a tierdiag trace."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, Optional

import typer

from tierdiag.cli.choices import choices
from tierdiag.cli.common import JsonOpt, err
from tierdiag.cli.sink import Sink, renders
from tierdiag.paths import descriptor_of
from tierdiag.trace.convert import (DEFAULT_BLOCK_SIZE, DEFAULT_START_SPREAD_S, FORMATS, ConvertOptions, convert as run,
                                    replay_options)


def convert(
    fmt: Annotated[str, typer.Argument(**choices(FORMATS), help="Source format.", show_default=False)],
    sources: Annotated[list[Path], typer.Argument(metavar="SRC...", help="Source files, or folders of them.")],
    out_path: Annotated[Path, typer.Option("-o", "--output", metavar="OUT.jsonl",
                                           help="Trace to write (.jsonl, or .jsonl.gz).")],
    block_size: Annotated[int, typer.Option("--block-size", help="Tokens per hash_ids block in the output "
                                            "(replay's --block-size).")] = DEFAULT_BLOCK_SIZE,
    start_spread: Annotated[Optional[float], typer.Option(
        "--start-spread", help=f"kv-cache-tester: mean seconds between conversation starts (seeded; default "
                               f"{DEFAULT_START_SPREAD_S:g}).")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Random seed of the conversation starts.")] = 0,
    json_: JsonOpt = False,
) -> None:
    """Convert a public session trace (kv-cache-tester, bailian) to a tierdiag trace with sessions.

    Sessions and pauses become "session" and "think_ms"; hash ids come out prefix-chained, in
    blocks of --block-size tokens.
    """
    from tierdiag.cli.progress import Progress

    # Read, then written in arrival order: a count while reading (the total is known only then), done/total
    # while writing.
    with Progress("convert", None, "requests", show_bar=not json_) as bar:
        def moved(phase: str, done: int, total: int | None) -> None:
            bar.update(done, total=total, what="convert: reading" if phase == "read" else "convert: writing")

        summary = run(fmt, sources, out_path, ConvertOptions(block_size=block_size, start_spread_s=start_spread,
                                                              seed=seed), progress=moved)
    notes = summary.notes
    if notes.unchained_blocks:
        err.print(f"tierdiag: warning: {notes.unchained_blocks:,} distinct source block id(s) follow a different "
                  f"block than where first seen, at {notes.unchained_block_uses:,} place(s) in the requests (the "
                  "source's ids are not prefix-chained); they were given new ids there, so only true shared prefixes "
                  "are shared", markup=False, highlight=False)
    # `-o /dev/stdout`: stdout is the trace; what is said about it goes to stderr.
    Sink(json=json_, stderr=descriptor_of(out_path) == 1).emit(summary)


@renders("tierdiag.trace.convert.ConvertSummary")
def _text(summary, to) -> None:
    notes = summary.notes
    extra = [f"{n:,} {what}" for n, what in ((notes.subagents, "sub-agent session(s)"),
                                             (notes.orphans, "turn(s) whose parent is missing: new sessions"),
                                             (notes.forks, "fork(s): new sessions"),
                                             (notes.early_turns, "turn(s) sent before the parent's estimated finish: "
                                                                 "think_ms 0")) if n]
    flag = "".join(f" {opt}" for opt in replay_options(summary.block_size))
    to.print(f"wrote {summary.num_requests:,} requests in {summary.num_sessions:,} sessions ({summary.format}, "
              f"{summary.num_files:,} file(s), {summary.span_s:,.0f} s) to {summary.path}"
              + (f"\n  {'; '.join(extra)}" if extra else "")
              + f"\n  next: tierdiag replay {shlex.quote(summary.path)}{flag}", markup=False, highlight=False)
