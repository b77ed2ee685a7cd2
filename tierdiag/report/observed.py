"""Rich views of observed runs (diagnose/twin/observed.py): explain, slow, summary, agreement.

Rendered from the same typed results `--json` prints; what the server did not report shows as
"-" and is named as not reported, never as 0. Request ids and other text from the export are
printed as plain text (markup=False), never as Rich markup.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from tierdiag.report.tables import print_table
from tierdiag.report.terminal import CAUSE_STYLE
from tierdiag.units import fmt_ms, fmt_pct, fmt_tokens, fmt_value

if TYPE_CHECKING:
    from tierdiag.diagnose.twin.observed import Agreement, ObservedExplanation, ObservedSlow, ObservedSummary

_STYLE = {**CAUSE_STYLE, None: "bold"}  # a cause's colour as everywhere; no cause (unknown): bold


def _grid(evidence: dict) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="dim")
    grid.add_column()
    for key, value in evidence.items():
        if isinstance(value, (list, dict)) and value and isinstance((value[0] if isinstance(value, list) else 0), dict):
            continue
        grid.add_row(key, Text(fmt_value(key, value)))
    return grid


def render_observed_explanation(e: ObservedExplanation, console: Console) -> None:
    style = _STYLE.get(e.primary_cause, "bold")
    body: list = [Text(e.headline, style=f"bold {style}"), Text(""), Text(e.verdict)]
    tok = e.tokens
    body.append(Text(f"\ntokens: {fmt_tokens(tok['input'])} input = {fmt_tokens(tok['device'])} device + "
                     f"{fmt_tokens(tok['host'])} host + {fmt_tokens(tok['storage'])} storage + "
                     f"{fmt_tokens(tok['computed'])} computed (server-reported)", style="dim"))
    if e.twin_trust is not None:
        body.append(Text(f"\nhow far to trust steps 3-4 (from the twin): {e.twin_trust.sentence()}.",
                         style="yellow"))
    title = f"request {e.req_id} · {e.hit_class or e.status} · observed run {e.run_name} ({e.run_id})"
    source = f" ({e.primary_cause_source})" if e.primary_cause_source else ""
    console.print(Panel(Group(*body), title=Text(f"verdict: {e.primary_cause or 'not known'}{source}"),
                        subtitle=Text(title), border_style=style, title_align="left", subtitle_align="left"),
                  soft_wrap=False)
    for s in e.steps:
        console.print(Panel(Group(Text(s.finding), Text(""), _grid(s.evidence)),
                            title=Text(f"{s.step} · {s.name} · from the {s.source}" if s.source != "unknown"
                                       else f"{s.step} · {s.name} · not reported"),
                            title_align="left", border_style="blue" if s.source != "unknown" else "dim"),
                      soft_wrap=False)


def render_observed_slow(rows: Sequence[ObservedSlow], console: Console, *, run_label: str) -> None:
    if not rows:
        console.print(Text(f"no finished request with a server-reported TTFT in {run_label}"))
        return
    table = Table(title=Text(f"slowest requests by server-reported TTFT · {run_label}"), title_justify="left")
    for col in ("#", "req_id", "class", "TTFT", "queue", "storage wait", "mostly", "dev/host/sto/comp"):
        table.add_column(col, justify="left" if col in ("req_id", "class", "mostly") else "right",
                         no_wrap=col != "dev/host/sto/comp")
    for r in rows:
        split = " / ".join(fmt_tokens(n) for n in (r.device_tokens, r.host_tokens, r.storage_tokens,
                                                    r.computed_tokens))
        table.add_row(str(r.rank), Text(r.req_id), r.hit_class or "-", fmt_ms(r.ttft_ns), fmt_ms(r.queue_ns),
                      fmt_ms(r.storage_wait_ns), Text(r.server_cause or "-", style=_STYLE.get(r.server_cause, "")),
                      split)
    table.caption = ("observed run: SGLang reports no ideal TTFT, so requests are ranked by TTFT itself; "
                     "'mostly' names a server-reported part that is at least half of it")
    print_table(console, table)
    console.print(Text("explain one with `tierdiag explain REQ_ID --run RUN`", style="dim"))


def render_agreement(a: Agreement, console: Console) -> None:
    console.print(Text.assemble(("observed ", "dim"), (f"{a.observed_run_name} ({a.observed_run_id})", "bold"),
                                (" vs replayed ", "dim"), (f"{a.replayed_run_name} ({a.replayed_run_id})", "bold")))
    table = Table(title="tier split over the matched requests (tokens)", title_justify="left")
    for col in ("tier", "observed", "replayed"):
        table.add_column(col, justify="left" if col == "tier" else "right")
    for tier in ("device", "host", "storage", "computed"):
        table.add_row(tier, fmt_tokens(getattr(a.observed_tokens, f"{tier}_tokens")),
                      fmt_tokens(getattr(a.replayed_tokens, f"{tier}_tokens")))
    print_table(console, table)
    console.print(Text(a.finding()))
    if a.requests:
        pairs = Table(title="largest disagreements (split mismatches first, then TTFT error)", title_justify="left")
        for col in ("req_id", "observed d/h/s", "replayed d/h/s", "split", "TTFT obs", "TTFT replay", "error"):
            pairs.add_column(col, justify="left" if col in ("req_id", "split") else "right")
        for p in a.requests:
            obs = " / ".join(fmt_tokens(n) for n in (p.observed_device_tokens, p.observed_host_tokens,
                                                      p.observed_storage_tokens))
            rep = " / ".join(fmt_tokens(n) for n in (p.replayed_device_tokens, p.replayed_host_tokens,
                                                      p.replayed_storage_tokens))
            match = "-" if p.split_match is None else ("match" if p.split_match else "differs")
            err = "-" if p.ttft_error_ns is None else f"{fmt_ms(p.ttft_error_ns)} ({fmt_pct(p.ttft_rel_error)})"
            pairs.add_row(Text(p.req_id), obs, rep, match, fmt_ms(p.observed_ttft_ns), fmt_ms(p.replayed_ttft_ns), err)
        print_table(console, pairs)


def render_observed_summary(s: ObservedSummary, console: Console) -> None:
    console.print(Text.assemble((s.run_name, "bold"), f" ({s.run_id}) · observed (imported from the server) · "
                                f"{s.num_requests:,} requests ({s.num_aborted:,} aborted) over "
                                f"{fmt_ms(s.span_ns)} of server time"))
    split = Table(title="tier split, token-weighted (server-reported)", title_justify="left")
    for col in ("tier", "tokens", "share of input"):
        split.add_column(col, justify="left" if col == "tier" else "right")
    for tier in ("device", "host", "storage", "computed"):
        n = getattr(s, f"{tier}_tokens")
        split.add_row(tier, fmt_tokens(n), fmt_pct(n / s.input_tokens if s.input_tokens else None))
    split.add_row(Text("input", style="bold"), fmt_tokens(s.input_tokens), "")
    split.caption = (f"{fmt_pct(s.hit_request_share)} of requests hit something, {fmt_pct(s.reused_token_share)} "
                     f"of tokens were reused"
                     + (f"; {s.num_split_unknown:,} requests without a reported split left out" if s.num_split_unknown else ""))
    print_table(console, split)
    classes = Table(title="TTFT by class (server-reported)", title_justify="left")
    for col in ("class", "requests", "input tokens", "p50", "p90", "p99", "queue p50"):
        classes.add_column(col, justify="left" if col == "class" else "right")
    for c in s.classes:
        classes.add_row(Text(c.hit_class, style="bold" if c.hit_class == "all" else ""), f"{c.num_requests:,}",
                        fmt_tokens(c.input_tokens), fmt_ms(c.ttft_p50_ns), fmt_ms(c.ttft_p90_ns), fmt_ms(c.ttft_p99_ns),
                        fmt_ms(c.queue_p50_ns))
    classes.caption = f"{s.num_with_ttft:,} of {s.num_requests:,} requests have a TTFT"
    print_table(console, classes)
    if s.ttft_total_ns:
        console.print(Text(f"queueing is {fmt_pct(s.queue_share_of_ttft)} of all TTFT; {s.requests_mostly_queueing:,} "
                           f"requests spent at least half of their TTFT in the queue; storage prefetch waits "
                           f"{fmt_ms(s.storage_wait_total_ns)} in all."))
    console.print(Text(f"not reported by SGLang: {', '.join(s.not_reported)}.", style="dim"))
    if s.agreement is not None:
        console.print(Text(f"\n{s.twin.describe()}", style="bold"))  # type: ignore[union-attr]
        console.print(Text(s.agreement.finding()))
    else:
        console.print(Text("no replayed twin in this database: replay the trace from `tierdiag import sglang "
                           "--trace-out` to compare the engine with the server and to explain load-backs and "
                           "evictions", style="dim"))
