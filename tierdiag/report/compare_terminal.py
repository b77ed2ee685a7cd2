"""Rich views of `compare` (runs side by side; one request in two runs; an observed run against its
twins: agreement, TTFT error per class, each twin's clock) and of `runs`.

Rendered from the same typed results `--json` prints. Every value that comes from the data (run
names, option values, request ids) goes in as a Text, never as markup.
"""

from __future__ import annotations

from typing import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tierdiag.diagnose.comparison.compare import (CLASSES, Comparison, RequestComparison, RequestDelta, RunRow, TwinAgreement,
                                      TwinComparison)
from tierdiag.units import fmt_bytes, fmt_ms, fmt_pct
from tierdiag.report.observed import render_agreement
from tierdiag.report.ranks_view import render_ranks_comparison
from tierdiag.report.terminal import CAUSE_STYLE, print_table
from tierdiag.report.text import fmt_option

_CLASS_SHORT = {"device_hit": "device hit", "tiered_hit": "tiered hit", "miss": "miss"}


def _split(r: RunRow) -> str:
    pct = lambda v: "-" if v is None else f"{v * 100:.0f}"  # noqa: E731
    return f"{pct(r.device_share)}/{pct(r.host_share)}/{pct(r.storage_share)} %"


def _memory(r) -> str:
    """The run's KV capacity in all; with more than one rank, how many and one rank's pools."""
    if getattr(r, "num_ranks", 1) > 1 and r.memory_rank_bytes is not None:
        return f"{fmt_bytes(r.memory_bytes)} ({r.num_ranks} × {fmt_bytes(r.memory_rank_bytes)})"
    return fmt_bytes(r.memory_bytes)


def _names_are_options(c: Comparison) -> bool:
    """A sweep names its runs after the options that vary: the option columns say it all."""
    return bool(c.varied) and all(all(f"{k}=" in r.name for k in c.varied) for r in c.rows)


def render_comparison(c: Comparison, console: Console, *, title: str | None = None) -> None:
    table = Table(title=title or f"{len(c.rows)} runs" + (f" of {c.sweep_id}" if c.sweep_id else "")
                  + (f", by {c.by}" if c.by else ""), title_justify="left")
    names = not _names_are_options(c)
    table.add_column("run")
    for key in c.varied:
        table.add_column(key, justify="right")
    for col in ("reuse", "dev/host/sto", "recompute", "TTFT p50", "p90", "p99", "load-back", "exposed",
                "evictions", "GPU busy", "memory"):
        table.add_column(col, justify="right")
    for r in c.rows:
        label = Text(r.name + " ", style="bold") if names else Text()
        label.append(r.run_id, style="dim")
        if r.status != "complete":
            label.append(f" {r.status}", style="yellow")
        table.add_row(label, *(Text(fmt_option(r.changes.get(k))) for k in c.varied),
                      fmt_pct(r.reuse_share), _split(r), fmt_pct(r.recompute_share), fmt_ms(r.ttft_p50_ns),
                      fmt_ms(r.ttft_p90_ns), fmt_ms(r.ttft_p99_ns), fmt_bytes(r.loadback_bytes),
                      fmt_ms(r.loadback_exposed_ns), f"{r.num_evictions:,}", fmt_pct(r.gpu_busy_share),
                      _memory(r))
    table.caption = ("reuse and tier split are token-weighted over finished requests; recompute: tokens "
                     "computed although cached once; memory: KV capacity in all, every rank's device + host "
                     "pools plus the shared storage (a run of N ranks: N × one rank's)")
    print_table(console, table)

    by_class = Table(title="TTFT p50 / p90 / p99 by class", title_justify="left")
    by_class.add_column("run")
    present = [k for k in CLASSES if any(s.hit_class == k for r in c.rows for s in r.ttft_by_class)]
    for k in present:
        by_class.add_column(_CLASS_SHORT[k], justify="right")
    for r in c.rows:
        cells = []
        for k in present:
            s = next((s for s in r.ttft_by_class if s.hit_class == k), None)
            cells.append("-" if s is None else f"{fmt_ms(s.ttft_p50_ns)} / {fmt_ms(s.ttft_p90_ns)} / "
                                                f"{fmt_ms(s.ttft_p99_ns)}  ({s.num_requests:,})")
        by_class.add_row(Text(r.name), *cells)
    if present:
        print_table(console, by_class)
    render_ranks_comparison(c.rows, console)


def _delta_table(title: str, rows: Sequence[RequestDelta], name_a: str, name_b: str) -> Table:
    table = Table(title=title, title_justify="left")
    for col, justify in (("request", "left"), ("class", "left"), (f"TTFT in A", "right"), ("in B", "right"),
                         ("change", "right"), ("verdict A → B", "left")):
        table.add_column(col, justify=justify)
    ranked = any(d.rank_a is not None or d.rank_b is not None for d in rows)  # a data-parallel run
    if ranked:
        table.add_column("rank A → B", justify="left")
    for d in rows:
        cls = _CLASS_SHORT.get(d.hit_class_a or "", "-")
        if d.hit_class_b != d.hit_class_a:
            cls += f" → {_CLASS_SHORT.get(d.hit_class_b or '', '-')}"
        verdict = Text(d.cause_a or "rejected", style=CAUSE_STYLE.get(d.cause_a, ""))
        if d.cause_b != d.cause_a:
            verdict.append(" → ")
            verdict.append(d.cause_b or "rejected", style=CAUSE_STYLE.get(d.cause_b, ""))
        change = "-" if d.delta_ns is None else ("+" if d.delta_ns > 0 else "") + fmt_ms(d.delta_ns)
        ranks = [Text(f"{d.rank_a}" if d.rank_b == d.rank_a else f"{d.rank_a} → {d.rank_b}")] if ranked else []
        table.add_row(Text(d.req_id), cls, fmt_ms(d.ttft_a_ns), fmt_ms(d.ttft_b_ns), change, verdict, *ranks)
    return table


def render_request_comparison(rc: RequestComparison, console: Console) -> None:
    head = Text("A ")
    head.append(rc.name_a, style="bold")
    head.append(f" ({rc.run_a})  vs  B ")
    head.append(rc.name_b, style="bold")
    head.append(f" ({rc.run_b})")
    console.print(head)
    console.print(Text(f"{rc.num_common:,} requests in both ({rc.num_only_a:,} only in A, {rc.num_only_b:,} only in B): "
                       f"{rc.num_faster:,} faster in B, {rc.num_slower:,} slower, {rc.num_changed:,} changed verdict"))
    if rc.gains:
        print_table(console, _delta_table(f"largest TTFT gains (top {rc.top})", rc.gains, rc.name_a, rc.name_b))
    if rc.losses:
        print_table(console, _delta_table(f"largest TTFT losses (top {rc.top})", rc.losses, rc.name_a, rc.name_b))
    if rc.transitions:
        t = Table(title="verdicts that changed (primary cause, A → B)", title_justify="left")
        for col in ("from", "to", "requests"):
            t.add_column(col, justify="right" if col == "requests" else "left")
        for v in rc.transitions:
            t.add_row(Text(v.from_cause, style=CAUSE_STYLE.get(v.from_cause, "")),
                      Text(v.to_cause, style=CAUSE_STYLE.get(v.to_cause, "")), f"{v.num_requests:,}")
        print_table(console, t)
        print_table(console, _delta_table(f"changed verdicts with the largest TTFT change (top {rc.top})", rc.changed,
                                   rc.name_a, rc.name_b))
    elif rc.num_common:
        console.print("no request changed its verdict")


# --- an observed run against its twins -----------------------------------------------------------

_ERROR_CLASSES = {"all": "all", **_CLASS_SHORT, "unknown": "class not reported"}


def _twin_error_table(twins: Sequence[TwinAgreement]) -> Table:
    table = Table(title="twin TTFT error against the server, per request (|twin - server|, nearest rank)",
                  title_justify="left")
    for col in ("twin", "class", "requests", "median", "p90", "median rel", "p90 rel"):
        table.add_column(col, justify="left" if col in ("twin", "class") else "right")
    for t in twins:
        for c in t.twin_error.classes:
            ms = lambda v: fmt_ms(None if v is None else v * 1e6)  # noqa: E731 - ms -> ns
            table.add_row(Text(t.agreement.replayed_run_name) if c.hit_class == "all" else Text(""),
                          Text(_ERROR_CLASSES.get(c.hit_class, c.hit_class),
                               style="bold" if c.hit_class == "all" else ""),
                          f"{c.num_requests:,}", ms(c.median_abs_ms), ms(c.p90_abs_ms), fmt_pct(c.median_rel),
                          fmt_pct(c.p90_rel))
    unmatched = [t for t in twins if t.twin_error.unmatched]
    if unmatched:
        table.caption = "; ".join(f"{t.agreement.replayed_run_name}: {t.twin_error.unmatched:,} observed requests "
                                  f"with a TTFT have none in the twin" for t in unmatched)
    return table


def _rank_error_table(twins: Sequence[TwinAgreement]) -> Table | None:
    """The twin's error per data-parallel rank of the server (None: the export names no rank)."""
    if not any(t.twin_error.ranks for t in twins):
        return None
    table = Table(title="twin TTFT error per server dp_rank (|twin - server|, nearest rank)", title_justify="left")
    for col in ("twin", "dp_rank", "requests", "median", "p90", "median rel", "p90 rel", "same rank in twin"):
        table.add_column(col, justify="left" if col == "twin" else "right")
    ms = lambda v: fmt_ms(None if v is None else v * 1e6)  # noqa: E731 - ms -> ns
    for t in twins:
        for i, r in enumerate(t.twin_error.ranks):
            table.add_row(Text(t.agreement.replayed_run_name) if i == 0 else Text(""), f"{r.dp_rank}",
                          f"{r.num_requests:,}", ms(r.median_abs_ms), ms(r.p90_abs_ms), fmt_pct(r.median_rel),
                          fmt_pct(r.p90_rel), f"{r.same_rank:,} ({fmt_pct(r.same_rank / r.num_requests)})"
                          if r.num_requests else "-")
    return table


def _clock_line(t: TwinAgreement) -> Text:
    line = Text.assemble(("twin ", "dim"), (t.agreement.replayed_run_name, "bold"),
                         (f" ({t.agreement.replayed_run_id}): ", "dim"))
    line.append(t.clock)
    return line


def render_twin_agreement(t: TwinAgreement, console: Console) -> None:
    render_agreement(t.agreement, console)
    console.print(_clock_line(t))
    print_table(console, _twin_error_table([t]))
    ranks = _rank_error_table([t])
    if ranks is not None:
        print_table(console, ranks)


def render_twin_comparison(c: TwinComparison, console: Console) -> None:
    console.print(Text.assemble(("observed ", "dim"), (f"{c.observed_run_name} ({c.observed_run_id})", "bold"),
                                (f" against {len(c.twins)} replayed twins", "dim")))
    for t in c.twins:
        console.print(_clock_line(t))
        console.print(Text("  " + t.agreement.finding()))
    print_table(console, _twin_error_table(c.twins))
    ranks = _rank_error_table(c.twins)
    if ranks is not None:
        print_table(console, ranks)
