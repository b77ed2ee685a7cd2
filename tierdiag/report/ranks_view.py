"""A data-parallel run's ranks in the terminal: `summary`'s per-rank tables (diagnose/dp/ranks.py's
`RankSummary`), `compare`'s ranks table and the one-line deployment shown by `runs` and
`summary` (`slow --by rank` is slow_ranks_view.py's: it draws with terminal.py's slow table). A
run of one rank has none of them. No numpy or Plotly here (the report's figure is
figures.py's `ranks_figure`)."""

from __future__ import annotations

from typing import Callable

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tierdiag.report.tables import print_table
from tierdiag.units import fmt_ms, fmt_pct, fmt_tokens


def deployment_line(run) -> str | None:
    """"4 ranks · router cache_aware" for a data-parallel run; None for a run of one rank."""
    from tierdiag.diagnose.dp.ranks import deployment

    dep = deployment(run)
    return None if dep is None else f"{dep.dp} ranks · router {dep.router}"


def imbalance_line(r) -> str:
    """The imbalance as a sentence of its named numbers."""
    if r.imbalance is None:
        return "imbalance: - (no prefill batch ran)"
    return (f"imbalance {r.imbalance:.2f}: busiest rank {r.busiest_rank}'s prefill busy {fmt_ms(r.busy_max_ns)} / "
            f"the {r.dp} ranks' mean {fmt_ms(r.busy_mean_ns)} (1.00: even)")


def rank_label(k) -> str:
    return "?" if k is None else str(k)


def render_ranks(ranks, console: Console, *, table: Callable[..., Table], plain: Callable[..., Text]) -> None:
    """`table` / `plain`: terminal.py's compact table and its data-as-text (never markup)."""
    if ranks is None:
        return
    load = table(f"load by rank ({ranks.dp} ranks, router {ranks.router}); busy share of the run's "
                 f"{fmt_ms(ranks.span_ns)}")
    for col in ("rank", "requests", "finished", "prefill busy", "busy share", "tokens computed"):
        load.add_column(col, justify="right", no_wrap=True)
    for s in ranks.ranks:
        style = "bold" if s.dp_rank is not None and s.dp_rank == ranks.busiest_rank else ""
        load.add_row(Text(rank_label(s.dp_rank), style=style), f"{s.num_requests:,}", f"{s.num_finished:,}",
                     fmt_ms(s.prefill_busy_ns), fmt_pct(s.prefill_busy_share), fmt_tokens(s.computed_tokens))
    load.caption = imbalance_line(ranks)
    console.print(load)
    reuse = table("reuse and TTFT by rank (finished requests; reuse token-weighted, share of input)")
    for col in ("rank", "input tokens", "device", "host", "storage", "TTFT p50", "TTFT p90"):
        reuse.add_column(col, justify="right", no_wrap=True)
    for s in ranks.ranks:
        reuse.add_row(rank_label(s.dp_rank), fmt_tokens(s.input_tokens), fmt_pct(s.device_share), fmt_pct(s.host_share),
                      fmt_pct(s.storage_share), fmt_ms(s.ttft_p50_ns), fmt_ms(s.ttft_p90_ns))
    console.print(reuse)
    console.print(plain(routing_line(ranks), "dim"))


def routing_line(r) -> str:
    """Where the router sent requests against where their prefix was, in named numbers."""
    if not r.num_routed:
        return "routing: no request carries a routing record"
    return (f"routing: {r.to_best_rank:,} of {r.num_routed:,} requests ({fmt_pct(r.to_best_rank_share)}) went to the "
            f"rank that held the most of their prefix at arrival; {fmt_tokens(r.held_elsewhere_tokens)} tokens of "
            f"prefix were held (device + host) on another rank but not on the one that served them")


def plain_line(text: str, style: str = "") -> Text:
    from tierdiag.report.text import visible

    return Text(visible(text, lines=False), style=style)


def render_ranks_comparison(rows, console: Console) -> None:
    """`compare`'s ranks table: for each data-parallel run (a RunRow with `ranks`), its ranks and
    router, imbalance, routing against where the prefixes were, and per rank its device + host +
    storage reuse and TTFT p50. Nothing when no compared run has more than one rank."""
    ranked = [r for r in rows if getattr(r, "ranks", None) is not None]
    if not ranked:
        return
    table = Table(title="ranks and routing (runs of more than one rank)", title_justify="left")
    for col, justify in (("run", "left"), ("ranks", "right"), ("router", "left"), ("imbalance", "right"),
                         ("to best rank", "right"), ("held elsewhere", "right"), ("reuse by rank", "left"),
                         ("TTFT p50 by rank", "left")):
        table.add_column(col, justify=justify)
    for r in ranked:
        k = r.ranks
        own = [s for s in k.ranks if s.dp_rank is not None and 0 <= s.dp_rank < k.dp]
        reuse = " / ".join(fmt_pct(None if s.input_tokens == 0 else
                                   (s.device_hit_tokens + s.host_hit_tokens + s.storage_hit_tokens) / s.input_tokens)
                           for s in own)
        label = Text(r.name + " ", style="bold")
        label.append(r.run_id, style="dim")
        table.add_row(label, f"{k.dp}", Text(k.router), "-" if k.imbalance is None else f"{k.imbalance:.2f}",
                      fmt_pct(k.to_best_rank_share), fmt_tokens(k.held_elsewhere_tokens), reuse,
                      " / ".join(fmt_ms(s.ttft_p50_ns) for s in own))
    table.caption = ("imbalance: busiest rank's prefill busy / the mean rank's; to best rank: requests served by the "
                     "rank that held the most of their prefix at arrival; held elsewhere: tokens of prefix on another "
                     "rank but not on the serving one; reuse by rank: device + host + storage, token-weighted, "
                     "rank 0 first")
    print_table(console, table)
