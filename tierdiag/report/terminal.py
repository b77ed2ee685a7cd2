"""Rich views of the diagnose results: explain, slow, summary.

Each view renders the same typed result `--json` prints (through its `to_json()`), and formats
numbers by the unit their key ends with (units.fmt_value), so the terminal and the JSON can
never disagree. The verdict comes first, the evidence below it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Sequence

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from tierdiag.diagnose.units import fmt_bandwidth, fmt_bytes, fmt_ms, fmt_pct, fmt_rate, fmt_tokens, fmt_value

if TYPE_CHECKING:  # only for hints: `explain` should not import the slow/summary code to render
    from tierdiag.diagnose.explain import Explanation
    from tierdiag.diagnose.slow import SlowRequest
    from tierdiag.diagnose.summary import RunSummary

CAUSE_STYLE = {"none": "green", "queueing": "yellow", "load_back": "red", "storage_fetch": "magenta",
               "recompute": "red", "compute": "cyan", None: "dim"}
_MAX_ROWS = 10

# C0 and C1 controls (ESC starts ANSI/OSC sequences, BEL ends OSC ones), DEL, and the invisible
# Unicode format characters that reorder or hide text (bidi overrides, zero-width).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")
_CONTROL_ANY = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


def _escape(m: re.Match) -> str:
    code = ord(m.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: object, *, lines: bool = True) -> str:
    """`text` with every control character shown escaped (ESC as `\x1b`), so that data (a run
    name, a request id, a path) can never move the cursor, clear the screen or set a window
    title. Newlines and tabs stay unless `lines=False` (a table cell, a title: one line)."""
    return (_CONTROL if lines else _CONTROL_ANY).sub(_escape, str(text))


def plain(text: object, style: str = "") -> Text:
    """Data for a Rich view: never markup (a `[/]` in an id is just text), controls escaped."""
    return Text(visible(text, lines=False), style=style)


def _n(count: int, word: str, plural: str | None = None) -> str:
    return f"{count:,} {word if count == 1 else (plural or word + 's')}"


def _kv_table(evidence: dict) -> Table:
    """Scalar evidence as a two-column grid; lists of records become their own small tables."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="dim")
    grid.add_column()
    for key, value in evidence.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            continue
        grid.add_row(plain(key), plain(fmt_value(key, value)))
    return grid


# Columns worth a glance per list of records (all of them are in --json), with headers.
_RECORD_COLUMNS = {
    "transfers": (("kind", "kind"), ("t_start_ms", "start"), ("t_end_ms", "end"), ("pages", "pages"),
                  ("runs", "runs"), ("bytes", "bytes"), ("queued_ms", "queued")),
    "events": (("t_ms", "when"), ("tier", "tier"), ("action", "action"), ("prefix_tokens", "its tokens"),
               ("cause_req_id", "by req"), ("owner_req_id", "owner"), ("pool_used_share", "pool used"),
               ("locked_tokens", "locked")),
}


def _records_table(title: str, records: list[dict]) -> Table:
    columns = _RECORD_COLUMNS.get(title) or tuple((k, k) for k in records[0])
    table = Table(title=plain(title), title_justify="left", show_edge=False, pad_edge=False)
    for key, header in columns:
        table.add_column(plain(header), justify="left" if key in ("kind", "tier", "action") or key.endswith("req_id")
                         else "right")
    for rec in records[:_MAX_ROWS]:
        # `bytes` is a bare unit name: format it as one.
        table.add_row(*(plain(fmt_value("x_bytes" if key == "bytes" else key, rec.get(key))) for key, _ in columns))
    if len(records) > _MAX_ROWS:
        table.caption = f"first {_MAX_ROWS} of {len(records):,}; all of them with --json"
    return table


def render_explanation(expl: Explanation, console: Console) -> None:
    data = expl.to_json()
    style = CAUSE_STYLE.get(expl.primary_cause, "bold")
    title = plain(f"request {expl.req_id} · {expl.hit_class or expl.status} · run {expl.run_name} ({expl.run_id})")
    verdict_parts: list = [Text(visible(expl.headline), style=f"bold {style}"), Text(""), Text(visible(expl.verdict))]
    if expl.decomposition is not None:
        d = expl.decomposition
        shares = d.shares_of_ttft()
        table = Table(show_edge=False, pad_edge=False, box=None, padding=(0, 2))
        table.add_column("TTFT part", style="dim")
        table.add_column("time", justify="right")
        table.add_column("of TTFT", justify="right")
        for cause, ns in (("queueing", d.queue_ns), ("storage_fetch", d.storage_wait_ns),
                          ("load_back", d.loadback_exposed_ns), ("recompute", d.recompute_ns),
                          ("compute", d.compute_ns)):
            mark = "bold" if cause == expl.primary_cause else ""
            table.add_row(Text(cause, style=mark), fmt_ms(ns), fmt_pct(shares[cause]))
        table.add_row(Text("TTFT", style="bold"), fmt_ms(d.ttft_ns), "")
        table.add_row("ideal", fmt_ms(d.ideal_ttft_ns), "")
        table.add_row("excess", fmt_ms(d.excess_ns), "")
        cf = data["counterfactual"]
        lost = expl.tokens.host_tokens + expl.tokens.storage_tokens + expl.tokens.recomputed_tokens
        loaded = expl.tokens.host_tokens + expl.tokens.storage_tokens
        # A counterfactual that equals the actual TTFT by construction is not shown as one.
        table.add_row("if never evicted", fmt_value("x_ms", cf["ttft_if_never_evicted_ms"]) if lost else "n/a", "")
        table.add_row("if device-resident", fmt_value("x_ms", cf["ttft_if_device_resident_ms"]) if loaded else "n/a", "")
        table.add_row("if recomputed", fmt_value("x_ms", cf["recompute_instead_ms"]) if loaded else "n/a", "")
        verdict_parts += [Text(""), table]
        if expl.queue_attribution is not None and d.queue_ns:
            qa = expl.queue_attribution.parts_ns
            verdict_parts.append(Text("while it waited the GPU was: " + ", ".join(
                f"{k} {fmt_ms(v)}" for k, v in qa.items() if v), style="dim"))
    tok = expl.tokens
    verdict_parts.append(Text(visible(
        f"\ntokens: {fmt_tokens(tok.input_tokens)} input = {fmt_tokens(tok.device_tokens)} device + "
        f"{fmt_tokens(tok.host_tokens)} host + {fmt_tokens(tok.storage_tokens)} storage + "
        f"{fmt_tokens(tok.computed_tokens)} computed ({fmt_tokens(tok.recomputed_tokens)} recomputed)"
        + (f"; evicted by {', '.join(expl.evicted_by[:8])}" if expl.evicted_by else "")), style="dim"))
    verdict_parts += _advice_lines(expl.advice)
    # soft_wrap=False: the shared console soft-wraps (no cropping of long lines on stdout), but
    # inside panels text must wrap to the panel, not be cut.
    console.print(Panel(Group(*verdict_parts), title=plain(f"verdict: {expl.primary_cause or expl.status}"),
                        subtitle=title, border_style=style, title_align="left", subtitle_align="left"),
                  soft_wrap=False)
    for step in data["steps"]:
        body: list = [Text(visible(step["finding"])), Text("")]
        evidence = step["evidence"]
        body.append(_kv_table(evidence))
        for key, value in evidence.items():
            if isinstance(value, list) and value and isinstance(value[0], dict):
                body += [Text(""), _records_table(key, value)]
        console.print(Panel(Group(*body), title=plain(f"{step['step']} · {step['name']}"), title_align="left",
                            border_style="blue"), soft_wrap=False)


def _advice_lines(advice) -> list:
    """Advice items as the last lines of a verdict (the same `Advice.line()` the report shows)."""
    if not advice:
        return []
    return [Text("")] + [plain(("advice: " if i == 0 else "        ") + a.line(), style="bold" if a.option else "green")
                         for i, a in enumerate(advice)]


def render_slow(rows: Sequence[SlowRequest], console: Console, *, run_label: str,
                hit_class: str | None = None, cause: str | None = None) -> None:
    filters = ", ".join(f for f in (hit_class and f"class {hit_class}", cause and f"cause {cause}") if f)
    table = Table(title=plain(f"slowest requests by excess TTFT over ideal · {run_label}"
                             + (f" · {filters}" if filters else "")), title_justify="left")
    for col in ("#", "req_id", "class", "TTFT", "excess", "cause", "by cause", "dev/host/sto/comp"):
        # Ids, classes, causes and times are what a reader scans for: never cut them.
        table.add_column(col, justify="left" if col in ("req_id", "class", "cause") else "right",
                         no_wrap=col != "dev/host/sto/comp")
    for r in rows:
        style = CAUSE_STYLE.get(r.primary_cause, "")
        split = " / ".join(fmt_tokens(n) for n in (r.device_tokens, r.host_tokens, r.storage_tokens,
                                                    r.computed_tokens))
        table.add_row(str(r.rank), plain(r.req_id), plain(r.hit_class or "-"), fmt_ms(r.ttft_ns), fmt_ms(r.excess_ns),
                      plain(r.primary_cause, style=style),
                      "-" if r.primary_cause == "none" else fmt_ms(r.cause_ns), split)
    if not rows:
        console.print(plain(f"no request slower than its ideal in {run_label}" + (f" ({filters})" if filters else "")))
        return
    console.print(table)
    console.print(Text("explain one with `tierdiag explain REQ_ID`", style="dim"))


def render_summary(s: RunSummary, console: Console) -> None:
    t = s.tokens
    shares = t.shares()
    head = Text.assemble(
        plain(s.run_name, "bold"), visible(f" ({s.run_id}) · {s.status} · {s.model or '?'} on {s.gpu or '?'} · ", lines=False),
        f"{_n(s.num_requests, 'request')} ({s.num_rejected:,} rejected) over {fmt_ms(s.span_ns)} of virtual time")
    console.print(head)
    if getattr(s, "diagnosis", None) is not None:
        dx = s.diagnosis
        console.print(Panel(Group(plain(dx.finding), *_advice_lines(dx.advice)),
                            title=f"diagnosis: {dx.dominant_cause or '-'}", title_align="left",
                            border_style=CAUSE_STYLE.get(dx.dominant_cause, "bold")), soft_wrap=False)

    split = Table(title="tier split, token-weighted (finished requests)", title_justify="left")
    for col in ("tier", "tokens", "share of input"):
        split.add_column(col, justify="left" if col == "tier" else "right")
    for tier in ("device", "host", "storage", "computed"):
        split.add_row(tier, fmt_tokens(getattr(t, f"{tier}_tokens")), fmt_pct(shares[tier]))
    split.add_row(Text("  of computed: recomputed", style="dim"), fmt_tokens(t.recomputed_tokens),
                  fmt_pct(shares["recomputed"]))
    split.add_row(Text("input", style="bold"), fmt_tokens(t.input_tokens), "")
    split.caption = (f"{fmt_pct(s.hit_request_share)} of requests hit something, but only "
                     f"{fmt_pct(s.reused_token_share)} of tokens were reused; median reused per hit "
                     f"{fmt_tokens(int(s.median_reused_tokens_per_hit)) if s.median_reused_tokens_per_hit is not None else '-'} tokens")
    console.print(split)

    classes = Table(title="TTFT by class", title_justify="left")
    for col in ("class", "requests", "input tokens", "reused tokens", "p50", "p90", "p99", "mean", "max"):
        classes.add_column(col, justify="left" if col == "class" else "right")
    for c in s.classes:
        classes.add_row(Text(c.hit_class, style="bold" if c.hit_class == "all" else ""), f"{c.num_requests:,}",
                        fmt_tokens(c.input_tokens), fmt_tokens(c.reused_tokens), fmt_ms(c.ttft_p50_ns),
                        fmt_ms(c.ttft_p90_ns), fmt_ms(c.ttft_p99_ns), fmt_ms(c.ttft_mean_ns), fmt_ms(c.ttft_max_ns))
    console.print(classes)

    causes = Table(title="where TTFT went (run totals) · requests by primary cause", title_justify="left")
    for col in ("cause", "requests", "TTFT part", "of all TTFT", "of excess"):
        causes.add_column(col, justify="left" if col == "cause" else "right")
    for c in s.time_by_cause:
        causes.add_row(Text(c.cause, style=CAUSE_STYLE.get(c.cause, "")), f"{c.num_requests:,}",
                       fmt_ms(c.ttft_part_ns), fmt_pct(c.ttft_share), fmt_pct(c.excess_share))
    causes.caption = f"total TTFT {fmt_ms(s.ttft_total_ns)}, of it excess over ideal {fmt_ms(s.excess_total_ns)}"
    console.print(causes)

    lb = s.load_back
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="dim")
    grid.add_column()
    grid.add_row("load-backs", f"{_n(lb.num_transfers, 'transfer')} for {_n(lb.num_requests, 'request')}, "
                 f"{fmt_tokens(lb.loaded_tokens)} tokens, {fmt_bytes(lb.bytes)}")
    grid.add_row("rate", f"{fmt_rate(lb.loadbacks_per_s)} · {fmt_bandwidth(lb.loadback_bytes_per_s)} averaged over the run")
    grid.add_row("link", f"busy {fmt_ms(lb.link_busy_ns)} at {fmt_bandwidth(lb.achieved_bytes_per_s)} "
                 f"({fmt_pct(lb.link_peak_share)} of the {fmt_bandwidth(lb.link_peak_bytes_per_s)} peak)")
    grid.add_row("exposed / queued", f"{fmt_ms(lb.exposed_ns)} exposed in TTFT, {fmt_ms(lb.queued_ns)} queued "
                 f"behind other load-backs")
    grid.add_row("storage", f"{_n(lb.num_prefetches, 'prefetch', 'prefetches')}, {fmt_bytes(lb.prefetch_bytes)}; "
                 f"{fmt_ms(lb.storage_wait_ns)} waited")
    for sk in s.skipped:
        grid.add_row(plain(f"skipped ({sk.tier})"), plain(f"{sk.reason}: {_n(sk.num_requests, 'request')}, {fmt_tokens(sk.tokens)} tokens recomputed"))
    for rj in s.rejected_reasons:
        grid.add_row("rejected", plain(f"{rj.reason}: {_n(rj.num_requests, 'request')}, {fmt_tokens(rj.tokens)} tokens"))
    console.print(Panel(grid, title="load-back", title_align="left"), soft_wrap=False)

    ev = Table(title="evictions", title_justify="left")
    for col in ("tier", "action", "events", "tokens"):
        ev.add_column(col, justify="left" if col in ("tier", "action") else "right")
    for e in s.evictions:
        ev.add_row(plain(e.tier), plain(e.action), f"{e.num_events:,}", fmt_tokens(e.tokens))
    if not s.evictions:
        ev.caption = "no evictions: the pools never filled"
    console.print(ev)
    if s.most_evicted_from or s.top_evictors:
        who = Table(title="most evicted-from (owner of the pages) · top evictors (whose allocation)",
                    title_justify="left")
        for col in ("evicted-from", "events", "tokens", "evictor", "events ", "tokens "):
            who.add_column(col, justify="left" if "evict" in col else "right")
        for i in range(max(len(s.most_evicted_from), len(s.top_evictors))):
            a = s.most_evicted_from[i] if i < len(s.most_evicted_from) else None
            b = s.top_evictors[i] if i < len(s.top_evictors) else None
            who.add_row(plain(a.req_id) if a else "", f"{a.num_events:,}" if a else "", fmt_tokens(a.tokens) if a else "",
                        plain(b.req_id) if b else "", f"{b.num_events:,}" if b else "", fmt_tokens(b.tokens) if b else "")
        console.print(who)


def render_advise(r, console: Console, *, run_label: str) -> None:
    """`advise`: the baseline, each replayed change, the best marked; then what was not replayed."""
    table = Table(title=plain(f"advice verified by replay · {run_label}"), title_justify="left")
    for col in ("", "change", "TTFT p50", "TTFT p99", "recompute", "reuse dev/host/sto", "run"):
        # Changes and run ids wrap rather than lose their ends to an ellipsis.
        table.add_column(col, justify="left" if col in ("", "change", "run") else "right",
                         overflow="fold" if col in ("change", "run") else "ellipsis")

    def row(mark: str, label: str, n) -> None:
        if n is None:
            table.add_row(mark, label, "-", "-", "-", "-", "-")
            return
        reuse = " / ".join(fmt_pct(n.reuse_share.get(t)) for t in ("device", "host", "storage"))
        table.add_row(mark, label, fmt_ms(n.ttft_p50_ns), fmt_ms(n.ttft_p99_ns), fmt_pct(n.recompute_share), reuse,
                      n.run_id)

    row("", "baseline", r.baseline)
    for c in r.candidates:
        label = ", ".join(f"{k}={v}" for k, v in c.advice.changes.items())
        if c.status != "complete":
            label += f" ({c.status})"
        row("★" if c.numbers is not None and c.numbers.run_id == r.best else "", label, c.numbers)
    if r.candidates:
        console.print(table)
        console.print(Text("best: " + (r.best or "none beats the baseline's TTFT (p50, then p99, then mean)"),
                           style="bold"))
    for line in _advice_lines(r.advice):
        console.print(line)
