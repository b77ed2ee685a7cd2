"""`tierdiag synth`: write a seeded synthetic workload trace (Mooncake format with ids)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tierdiag.cli.choices import choices
from tierdiag.cli.common import JsonOpt
from tierdiag.cli.sink import Sink, renders
from tierdiag.trace.synth import KINDS, SynthConfig, SynthSummary, synth_to_file

_DEFAULTS = SynthConfig()


def synth(
    out_path: Annotated[Path, typer.Argument(metavar="OUT.jsonl", help="Trace to write (.jsonl, or .jsonl.gz).")],
    kind: Annotated[str, typer.Option("--kind", **choices(KINDS), help="Workload.")] = _DEFAULTS.kind,
    requests: Annotated[int, typer.Option("--requests", help="Number of requests.")] = _DEFAULTS.num_requests,
    seed: Annotated[int, typer.Option("--seed", help="Random seed; the same options give the same file.")] = _DEFAULTS.seed,
    rate: Annotated[float, typer.Option("--rate", help="Mean arrival rate, requests per second.")] = _DEFAULTS.rate_per_s,
    block_size: Annotated[int, typer.Option("--block-size", help="Tokens per hash_ids block.")] = _DEFAULTS.block_size,
    json_: JsonOpt = False,
) -> None:
    """Write a synthetic workload: shared system prompts, multi-turn chats, agent loops, or all mixed.

    The defaults reproduce the bundled demo trace (tierdiag/trace/samples/demo.jsonl).
    """
    cfg = SynthConfig(kind=kind, num_requests=requests, seed=seed, rate_per_s=rate, block_size=block_size)
    Sink(json=json_).emit(synth_to_file(out_path, cfg))


@renders(SynthSummary)
def _text(summary: SynthSummary, console) -> None:
    # markup off: a path may contain [brackets]
    console.print(f"wrote {summary.num_requests:,} requests ({summary.kind}, seed {summary.seed}) to {summary.path}\n"
              f"  {summary.num_sessions:,} sessions over {summary.span_s:,.0f} s; input tokens mean "
              f"{summary.mean_input_tokens:,.0f}, max {summary.max_input_tokens:,}; "
              f"{summary.reusable_share:.0%} reusable with an unlimited cache", markup=False, highlight=False)
