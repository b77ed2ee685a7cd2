"""Rich views of the diagnose results: explain, slow, summary.

Each view renders the same typed result `--json` prints (through its `to_json()`), and formats
numbers by the unit their key ends with (units.fmt_value), so the terminal and the JSON can
never disagree. The verdict comes first, the evidence below it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Sequence

from rich import box
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from tierdiag.config.names import Cause
from tierdiag.report.tables import fits, print_table, stacked  # noqa: F401 - the views import them from here too
from tierdiag.report.text import fmt_option, visible  # noqa: F401 - fmt_option: the views import it from here too
from tierdiag.report.console import PIPED_MIN_WIDTH, SafeConsole, new_console  # noqa: F401 - the views' console, from here too
from tierdiag.report.ranks_view import render_ranks
from tierdiag.report.sessions_view import render_sessions
from tierdiag.report.size_curves_view import render_size_curves
from tierdiag.units import (
    fmt_bandwidth,
    fmt_bytes,
    fmt_ms,
    fmt_pct,
    fmt_pool,
    fmt_rate,
    fmt_tokens,
    fmt_value,
)

if TYPE_CHECKING:  # only for hints: `explain` should not import the slow/summary code to render
    from tierdiag.diagnose.request.explain import Explanation
    from tierdiag.diagnose.request.slow import SlowRequest
    from tierdiag.diagnose.run.summary import RunSummary

CAUSE_STYLE = {Cause.NONE: "green", Cause.QUEUEING: "yellow", Cause.LOAD_BACK: "red", Cause.STORAGE_FETCH: "magenta",
               Cause.ROUTING: "red", Cause.RECOMPUTE: "red", Cause.COMPUTE: "cyan", None: "dim"}
_MAX_ROWS = 10


def plain(text: object, style: str = "") -> Text:
    """Data for a Rich view: never markup (a `[/]` in an id is just text), controls escaped."""
    return Text(visible(text, lines=False), style=style)


def _n(count: int, word: str, plural: str | None = None) -> str:
    return f"{count:,} {word if count == 1 else (plural or word + 's')}"


_NUMBER = re.compile(r"\d[\d,]*")


def requests_line(total: int, rejected: int) -> str:
    """'4,878 requests (3,779 served, 1,099 rejected)': replay's closing title and `summary` count
    alike (all the run's requests first)."""
    word = "request" if total == 1 else "requests"
    return f"{total:,} {word} ({total - rejected:,} served, {rejected:,} rejected)" if rejected else f"{total:,} {word}"


def grouped_reasons(reasons) -> list[tuple[str, int, int]]:
    """Reasons that differ only in their numbers, as one line with each varying number as its
    range: 30 lines "needs 30400 tokens of device memory; the pool holds 29952", "needs 31552
    ..." become "needs 30,400 to 119,360 tokens of device memory; the pool holds 29,952".
    Returns (reason, requests, tokens), most requests first."""
    groups: dict[str, list] = {}
    for r in reasons:
        groups.setdefault(_NUMBER.sub("#", r.reason), []).append(r)
    out = []
    for template, members in groups.items():
        if len(members) == 1:
            text = members[0].reason
        else:
            numbers = [[int(x.replace(",", "")) for x in _NUMBER.findall(m.reason)] for m in members]
            pieces = template.split("#")
            text = pieces[0]
            for i, piece in enumerate(pieces[1:]):
                lo, hi = min(n[i] for n in numbers), max(n[i] for n in numbers)
                text += (f"{lo:,}" if lo == hi else f"{lo:,} to {hi:,}") + piece
        out.append((text, sum(m.num_requests for m in members), sum(m.tokens for m in members)))
    return sorted(out, key=lambda g: -g[1])


def _kv_table(evidence: dict, words: dict[str, str] | None = None) -> Table:
    """Scalar evidence as a two-column grid; lists of records become their own small tables.
    `words`: a key's name as the run's SGLang release has it (shown; the value is the key's)."""
    words = words or {}
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="dim")
    grid.add_column()
    for key, value in evidence.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            continue
        grid.add_row(plain(words.get(key, key)), plain(fmt_value(key, value)))
    return grid


# Columns worth a glance per list of records (all of them are in --json), with headers.
_RECORD_COLUMNS = {
    "transfers": (("kind", "kind"), ("t_start_ms", "start"), ("t_end_ms", "end"), ("pages", "pages"),
                  ("runs", "runs"), ("bytes", "bytes"), ("queued_ms", "queued")),
    "events": (("t_ms", "when"), ("tier", "tier"), ("action", "action"), ("prefix_tokens", "its tokens"),
               ("cause_req_id", "by req"), ("owner_req_id", "owner"), ("pool_used_share", "pool used"),
               ("locked_tokens", "locked")),
    # the routing step's prefix on every rank at arrival (diagnose/dp/routing.py)
    "ranks": (("rank", "rank"), ("device_tokens", "device"), ("host_tokens", "host"), ("in_flight", "in flight"),
              ("score", "score")),
}


def _records_table(title: str, records: list[dict], console: Console | None = None, width: int | None = None):
    """A table of records where it fits `width` (the panel inside the console), else one line
    per record, "header value" pairs that wrap between pairs: ids and times stay whole."""
    columns = _RECORD_COLUMNS.get(title) or tuple((k, k) for k in records[0])
    shown = records[:_MAX_ROWS]
    cells = [[fmt_value("x_bytes" if key == "bytes" else key, rec.get(key)) for key, _ in columns] for rec in shown]
    table = new_table(title)
    for key, header in columns:
        table.add_column(plain(header), justify="left" if key in ("kind", "tier", "action") or key.endswith("req_id")
                         else "right", no_wrap=True)
    for row in cells:
        table.add_row(*(plain(cell) for cell in row))
    more = f"first {_MAX_ROWS} of {len(records):,}; all of them with --json" if len(records) > _MAX_ROWS else ""
    if more:
        table.caption = more
    if console is None or fits(console, table, width):
        return table
    lines: list = [plain(title, "italic")]
    budget = (width or console.width) - 2
    for row in cells:
        # "header value" pairs packed into lines that fit, so a line breaks between pairs, never
        # inside one (Rich would wrap at any space, "by req" | "sess17-turn4").
        line = ""
        for (_, header), value in zip(columns, row):
            pair = f"{header} {value}"
            if line and len(line) + 2 + len(pair) > budget:
                lines.append(plain("  " + line))
                line = "  " + pair
            else:
                line = f"{line}  {pair}" if line else pair
        lines.append(plain("  " + line))
    if more:
        lines.append(Text(more, style="dim"))
    return Group(*lines)


def render_explanation(expl: Explanation, console: Console) -> None:
    data = expl.to_json()
    style = CAUSE_STYLE.get(expl.primary_cause, "bold")
    what = f"{expl.hit_class}, {expl.tokens.label()}" if expl.hit_class else expl.status
    title = plain(f"request {expl.req_id} · {what} · run {expl.run_name} ({expl.run_id})")
    # The release whose rules the run followed, whose words the steps use (short: the subtitle
    # above is cut at the panel's width).
    rules = f" · sglang {expl.sglang_rules}" if expl.sglang_rules else ""
    verdict_parts: list = [Text(visible(expl.headline), style=f"bold {style}"), Text(""), Text(visible(expl.verdict))]
    if expl.decomposition is not None:
        d = expl.decomposition
        shares = d.shares_of_ttft()
        table = Table(show_edge=False, pad_edge=False, box=None, padding=(0, 2))
        table.add_column("TTFT part", style="dim")
        table.add_column("time", justify="right")
        table.add_column("of TTFT", justify="right")
        for cause, ns in ((Cause.QUEUEING, d.queue_ns), (Cause.STORAGE_FETCH, d.storage_wait_ns),
                          (Cause.LOAD_BACK, d.loadback_exposed_ns), (Cause.RECOMPUTE, d.recompute_ns),
                          (Cause.COMPUTE, d.compute_ns)):
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
            # The --json keys (queue_attribution_ms), each meaning what the verdict's queue claim says.
            verdict_parts.append(Text("its wait, by what held it up: " + ", ".join(
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
    console.print(Panel(Group(*verdict_parts), title=plain(f"verdict: {expl.primary_cause or expl.status}{rules}"),
                        subtitle=title, border_style=style, title_align="left", subtitle_align="left"),
                  soft_wrap=False)
    for step in data["steps"]:
        body: list = [Text(visible(step["finding"])), Text("")]
        evidence = step["evidence"]
        body.append(_kv_table(evidence, expl.vocabulary))
        for key, value in evidence.items():
            if isinstance(value, list) and value and isinstance(value[0], dict):
                body += [Text(""), _records_table(key, value, console, console.width - 4)]
        console.print(Panel(Group(*body), title=plain(f"{step['step']} · {expl.word(step['name'])}"), title_align="left",
                            border_style="blue"), soft_wrap=False)


def _advice_lines(advice) -> list:
    """Advice items as the last lines of a verdict (the same `Advice.line()` the report shows):
    what is advised (proposed, or confirmed by a replay), then what `advise` tried that did not
    help, under "tried, not advised", with its numbers."""
    if not advice:
        return []
    shown = [a for a in advice if getattr(a, "advised", True)]
    tried = [a for a in advice if not getattr(a, "advised", True)]
    lines = [Text("")] + [plain(("advice: " if i == 0 else "        ") + a.line(), style="bold" if a.option else "green")
                          for i, a in enumerate(shown)]
    if not shown:
        lines.append(plain("advice: nothing that a replay confirmed", style="green"))
    if tried:
        lines.append(plain("tried, not advised:", style="dim"))
        lines += [plain("  " + a.tried_line(), style="dim") for a in tried]
    return lines


def _print_fitting(console: Console, *layouts) -> None:
    """Print the first layout that fits the width, else the last (the narrow one, which wraps
    rather than cuts). Views build a wide layout and a stacked one; none truncates with "…"."""
    for layout in layouts[:-1]:
        if fits(console, layout):
            console.print(layout)
            return
    console.print(layouts[-1])


def new_table(title: str = "", **kw) -> Table:
    """A compact table: no vertical rules, one space between columns, cells fold rather than cut."""
    # The title is data (a run name, a path): never markup, controls escaped.
    return Table(title=plain(title) if title else None, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                 show_edge=False, padding=(0, 1), collapse_padding=True, **kw)


def render_slow(rows: Sequence[SlowRequest], console: Console, *, run_label: str,
                hit_class: str | None = None, cause: str | None = None, hint: bool = True) -> None:
    filters = ", ".join(f for f in (hit_class and f"class {hit_class}", cause and f"cause {cause}") if f)
    title = f"slowest requests by excess TTFT over ideal · {run_label}" + (f" · {filters}" if filters else "")
    if not rows:
        console.print(plain(f"no request slower than its ideal in {run_label}" + (f" ({filters})" if filters else "")))
        return
    splits = [" / ".join(fmt_tokens(n) for n in (r.device_tokens, r.host_tokens, r.storage_tokens, r.computed_tokens))
              for r in rows]
    wide = new_table(title)
    for col in ("#", "req_id", "class", "TTFT", "excess", "cause", "by cause", "dev/host/sto/comp tokens"):
        wide.add_column(col, justify="left" if col in ("req_id", "class", "cause") else "right", no_wrap=True)
    for r, split in zip(rows, splits):
        style = CAUSE_STYLE.get(r.primary_cause, "")
        wide.add_row(str(r.rank), plain(r.req_id), plain(r.hit_class or "-"), fmt_ms(r.ttft_ns), fmt_ms(r.excess_ns),
                     plain(r.primary_cause, style=style),
                     "-" if r.primary_cause == Cause.NONE else fmt_ms(r.cause_ns), split)
    # Narrow: each request on two lines, the token split whole on the second.
    narrow = new_table(title)
    narrow.add_column("#", justify="right", no_wrap=True)
    narrow.add_column("request · class · tokens dev/host/sto/comp", overflow="fold")
    narrow.add_column("TTFT / excess", justify="right", no_wrap=True)
    narrow.add_column("cause / its part", no_wrap=True)
    for r, split in zip(rows, splits):
        style = CAUSE_STYLE.get(r.primary_cause, "")
        narrow.add_row(str(r.rank), Text.assemble(plain(r.req_id, "bold"), plain(f" · {r.hit_class or '-'}"), "\n",
                                                  (split, "dim")),
                       f"{fmt_ms(r.ttft_ns)}\n{fmt_ms(r.excess_ns)}",
                       Text.assemble(plain(r.primary_cause, style), "\n",
                                     "-" if r.primary_cause == Cause.NONE else fmt_ms(r.cause_ns)))
    _print_fitting(console, wide, narrow)
    if hint:
        console.print(Text("explain one with `tierdiag explain REQ_ID`", style="dim"))


def render_summary(s: RunSummary, console: Console, *, kv_bytes_per_token: int | None = None,
                   pools: dict[str, int] | None = None, rules: str | None = None, memory=None) -> None:
    """`pools`: tier -> configured tokens (the run's config), shown with GiB at `kv_bytes_per_token`;
    `rules`: the run's rule set (`rules_line`); `memory`: its KvMemory (run_kv_memory), stated per
    rank and in all for a run of more than one rank."""
    t = s.tokens
    shares = t.shares()
    console.print(Text.assemble(
        plain(s.run_name, "bold"), visible(f" ({s.run_id}) · {s.status} · {s.model or '?'} on {s.gpu or '?'} · ", lines=False),
        f"{requests_line(s.num_requests, s.num_rejected)} over {fmt_ms(s.span_ns)} "
        "of virtual time, from the first arrival"))
    if pools:
        each = memory is not None and memory.ranks > 1
        console.print(plain("pools" + (" (device and host: each rank's own)" if each else "") + ": "
                            + " · ".join(f"{tier} {fmt_pool(n, kv_bytes_per_token)}" for tier, n in pools.items())
                            + (f" · KV memory {memory.words()}" if each else ""), "dim"))
    if rules:
        console.print(plain(f"engine rules: {rules}", "dim"))
    if getattr(s, "ranks", None) is not None:  # a data-parallel run (diagnose/dp/ranks.py); one rank: nothing
        console.print(plain(f"deployment: {s.ranks.dp} data-parallel ranks behind router {s.ranks.router}", "dim"))
    if getattr(s, "diagnosis", None) is not None:
        dx = s.diagnosis
        console.print(Panel(Group(plain(dx.finding), *_advice_lines(dx.advice)),
                            title=plain(f"diagnosis: {dx.dominant_cause or '-'}"), title_align="left",
                            border_style=CAUSE_STYLE.get(dx.dominant_cause, "bold")), soft_wrap=False)

    split = new_table("tier split, token-weighted (finished requests)")
    for col in ("tier", "tokens", "share of input"):
        split.add_column(col, justify="left" if col == "tier" else "right", no_wrap=True)
    for tier in ("device", "host", "storage", "computed"):
        split.add_row(tier, fmt_tokens(getattr(t, f"{tier}_tokens")), fmt_pct(shares[tier]))
    split.add_row(Text("  of computed: recomputed", style="dim"), fmt_tokens(t.recomputed_tokens),
                  fmt_pct(shares["recomputed"]))
    split.add_row(Text("input", style="bold"), fmt_tokens(t.input_tokens), "")
    console.print(split)
    misses = getattr(s, "miss_reasons", None)  # diagnose/run/miss_reasons.py; None: not recorded
    if misses and t.computed_tokens:
        console.print(plain("computed tokens by why they were not reused: " + ", ".join(
            f"{r.replace('_', ' ')} {fmt_tokens(n)} ({fmt_pct(n / t.computed_tokens)})"
            for r, n in sorted(misses.items(), key=lambda kv: -kv[1]) if n)))
    console.print(f"{fmt_pct(s.hit_request_share)} of requests hit something, but only "
                  f"{fmt_pct(s.reused_token_share)} of tokens were reused; median reused per hit "
                  f"{fmt_tokens(int(s.median_reused_tokens_per_hit)) if s.median_reused_tokens_per_hit is not None else '-'} tokens",
                  markup=False, highlight=False)

    # Two tables, not one of nine columns: each fits 80 columns with every number whole.
    tokens = new_table("requests and tokens by class")
    for col in ("class", "requests", "input tokens", "reused tokens", "reused"):
        tokens.add_column(col, justify="left" if col == "class" else "right", no_wrap=True)
    for c in s.classes:
        tokens.add_row(Text(c.hit_class, style="bold" if c.hit_class == "all" else ""), f"{c.num_requests:,}",
                       fmt_tokens(c.input_tokens), fmt_tokens(c.reused_tokens),
                       fmt_pct(c.reused_tokens / c.input_tokens if c.input_tokens else None))
    console.print(tokens)
    ttft = new_table("TTFT by class (percentiles: nearest rank)")
    for col in ("class", "p50", "p90", "p99", "mean", "max"):
        ttft.add_column(col, justify="left" if col == "class" else "right", no_wrap=True)
    for c in s.classes:
        ttft.add_row(Text(c.hit_class, style="bold" if c.hit_class == "all" else ""),
                     *(fmt_ms(v) for v in (c.ttft_p50_ns, c.ttft_p90_ns, c.ttft_p99_ns, c.ttft_mean_ns,
                                                 c.ttft_max_ns)))
    console.print(ttft)

    causes = new_table("where TTFT went (run totals) · requests by primary cause")
    for col in ("cause", "requests", "TTFT part", "of all TTFT", "of excess"):
        causes.add_column(col, justify="left" if col == "cause" else "right", no_wrap=True)
    for c in s.time_by_cause:
        causes.add_row(Text(c.cause, style=CAUSE_STYLE.get(c.cause, "")), f"{c.num_requests:,}",
                       fmt_ms(c.ttft_part_ns), fmt_pct(c.ttft_share), fmt_pct(c.excess_share))
    console.print(causes)
    console.print(f"total TTFT {fmt_ms(s.ttft_total_ns)} summed over requests, of it excess over ideal "
                  f"{fmt_ms(s.excess_total_ns)}", markup=False, highlight=False)

    lb = s.load_back
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="dim", no_wrap=True)
    grid.add_column(overflow="fold")
    grid.add_row("load-backs", f"{_n(lb.num_transfers, 'transfer')} for {_n(lb.num_requests, 'request')}, "
                 f"{fmt_tokens(lb.loaded_tokens)} tokens, {fmt_bytes(lb.bytes)}")
    grid.add_row("rate", f"{fmt_rate(lb.loadbacks_per_s)} · {fmt_bandwidth(lb.loadback_bytes_per_s)} over the run's span")
    grid.add_row("link", f"busy {fmt_ms(lb.link_busy_ns)} at {fmt_bandwidth(lb.achieved_bytes_per_s)} "
                 f"({fmt_pct(lb.link_peak_share)} of the {fmt_bandwidth(lb.link_peak_bytes_per_s)} peak)")
    grid.add_row("exposed / queued", f"{fmt_ms(lb.exposed_ns)} exposed in TTFT, {fmt_ms(lb.queued_ns)} "
                 "queued behind other load-backs")
    grid.add_row("storage", f"{_n(lb.num_prefetches, 'prefetch', 'prefetches')}, {fmt_bytes(lb.prefetch_bytes)}; "
                 f"{fmt_ms(lb.storage_wait_ns)} waited")
    for sk in s.skipped:
        grid.add_row(plain(f"skipped ({sk.tier})"), plain(f"{sk.reason}: {_n(sk.num_requests, 'request')}, {fmt_tokens(sk.tokens)} tokens recomputed"))
    for reason, num, tokens in grouped_reasons(s.rejected_reasons):
        grid.add_row("rejected", plain(f"{reason}: {_n(num, 'request')}, {fmt_tokens(tokens)} tokens"))
    # The title as Text, not a str: Rich parses a str title as markup with emoji codes, whose table
    # (rich._emoji_codes, ~3 ms of import) nothing else here loads; drawn the same.
    console.print(Panel(grid, title=Text("load-back"), title_align="left"), soft_wrap=False)
    console.print(Text("sizes in binary units (GiB = 2^30 bytes), bandwidth in decimal GB/s (10^9 bytes/s)",
                       style="dim"))

    ev = new_table("evictions")
    for col in ("tier", "action", "events", "tokens"):
        ev.add_column(col, justify="left" if col in ("tier", "action") else "right", no_wrap=True)
    for e in s.evictions:
        ev.add_row(plain(e.tier), plain(e.action), f"{e.num_events:,}", fmt_tokens(e.tokens))
    if not s.evictions:
        ev.caption = "no evictions: the pools never filled"
    console.print(ev)
    if s.most_evicted_from or s.top_evictors:
        def who_table(title: str, rows) -> Table:
            tab = new_table(title)
            for col in ("request", "events", "tokens"):
                tab.add_column(col, justify="left" if col == "request" else "right", no_wrap=col != "request",
                               overflow="fold")
            for r in rows:
                tab.add_row(plain(r.req_id), f"{r.num_events:,}", fmt_tokens(r.tokens))
            return tab

        side = Table.grid(padding=(0, 4))
        side.add_row(who_table("most evicted-from (owner of the pages)", s.most_evicted_from),
                     who_table("top evictors (whose allocation)", s.top_evictors))
        _print_fitting(console, side, Group(who_table("most evicted-from (owner of the pages)", s.most_evicted_from),
                                            who_table("top evictors (whose allocation)", s.top_evictors)))
    render_ranks(getattr(s, "ranks", None), console, table=new_table, plain=plain)
    render_sessions(s.sessions, console, table=new_table, plain=plain)
    render_size_curves(getattr(s, "size_curves", None), console, table=new_table, plain=plain)


def render_advise(r, console: Console, *, run_label: str) -> None:
    """`advise`: the baseline, each replayed change with its status (confirmed, no_effect,
    refuted), the best confirmed one marked; then the advice and what was tried, not advised.
    A table where it fits the width, else one stacked entry a change (a run id, a change such as
    `host_tokens=1048576`, is never split or cut)."""
    title = plain(f"advice checked by replay · {run_label}")
    wide = new_table(title.plain)
    for col in ("", "change", "status", "TTFT p50", "TTFT p99", "recompute", "reuse dev/host/sto", "run"):
        wide.add_column(col, justify="left" if col in ("", "change", "run") else "right", no_wrap=True)
    narrow = Table.grid(padding=(0, 1))
    narrow.add_column(no_wrap=True)
    narrow.add_column()
    rows = []

    def row(mark: str, label: str, status: str, n) -> None:
        if n is None:
            wide.add_row(mark, plain(label), status, "-", "-", "-", "-", "-")
            narrow.add_row(mark, Text.assemble(plain(label, "bold"), plain(f" · {status or '-'} · not replayed")))
            return
        reuse = " / ".join(fmt_pct(n.reuse_share.get(t)) for t in ("device", "host", "storage"))
        wide.add_row(mark, plain(label), status, fmt_ms(n.ttft_p50_ns), fmt_ms(n.ttft_p99_ns),
                     fmt_pct(n.recompute_share), reuse, plain(n.run_id))
        head = Text.assemble(plain(label, "bold"), plain(f" · {status}") if status else "")
        narrow.add_row(mark, Text("\n").join([
            head,
            plain(f"TTFT p50 {fmt_ms(n.ttft_p50_ns)} · p99 {fmt_ms(n.ttft_p99_ns)} · recompute "
                  f"{fmt_pct(n.recompute_share)}"),
            plain(f"reuse dev/host/sto {reuse}"), plain(f"run {n.run_id}", "dim")]))
        rows.append(label)

    row("", "baseline", "", r.baseline)
    for c in r.candidates:
        label = ("together: " if c.advice.combined else "") + ", ".join(
            f"{k}={v}" for k, v in c.advice.changes.items())
        if c.status != "complete":
            label += f" ({c.status})"
        row("★" if c.numbers is not None and c.numbers.run_id == r.best else "", label,
            c.advice.status.replace("_", " ") if c.numbers is not None else "-", c.numbers)
    if r.candidates:
        if fits(console, wide):
            console.print(wide)
        else:
            console.print(title)
            console.print(narrow)
        console.print(plain("best: " + (r.best or "none confirmed (TTFT p50 better by 5 %, p99 not worse by more "
                                                  "than 5 %)"), style="bold"))
    for line in _advice_lines(r.advice):
        console.print(line)
