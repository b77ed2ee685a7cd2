"""The upgrade view (`replay TRACE --sglang OLD,NEW`): the whole upgrade, then what each rule
moves when switched back alone, the requests it moved most, and how the upgrade's moved requests
divide by the rules that reproduce them. Rendered from diagnose/comparison/upgrade.py's UpgradeView, the
same result `--json` prints; tables fit 80 columns and are complete when piped (cells wrap,
nothing is cut). Data (run names, ids) goes in as Text, never markup."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from tierdiag.diagnose.comparison.upgrade import (TTFT_MOVED_NS, UNDONE_SHARE, Attribution, MovedRequest, UpgradeView,
                                       signed_ms)
from tierdiag.report.terminal import plain
from tierdiag.units import fmt_ms, fmt_pct, fmt_tokens, share

SHOWN_TOP = 3  # requests per rule in the terminal (--json has DEFAULT_TOP)


def _signed_tokens(n: int) -> str:
    return "0" if n == 0 else f"{n:+,}"


def _signed_ms(before: int | None, after: int | None) -> str:
    return "-" if before is None or after is None else signed_ms(after - before)


def _count(n: int, of: int) -> str:
    return f"{n:,}" if n == 0 else f"{n:,} ({fmt_pct(share(n, of))})"


def _whole(view: UpgradeView, console: Console) -> None:
    u = view.upgrade
    o, n = u.before, u.after
    t = Table(title=plain(f"SGLang {view.old} -> {view.new}: the whole upgrade ({u.compared:,} requests)"),
              title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    t.add_column("")
    t.add_column(plain(view.old), justify="right")
    t.add_column(plain(view.new), justify="right")
    t.add_column("change", justify="right")

    def tokens(label: str, a: int, b: int, whole_a: int, whole_b: int) -> None:
        t.add_row(label, f"{fmt_tokens(a)} ({fmt_pct(share(a, whole_a))})", f"{fmt_tokens(b)} ({fmt_pct(share(b, whole_b))})",
                  _signed_tokens(b - a))

    tokens("device hit", o.device_tokens, n.device_tokens, o.input_tokens, n.input_tokens)
    tokens("host hit", o.host_tokens, n.host_tokens, o.input_tokens, n.input_tokens)
    tokens("storage hit", o.storage_tokens, n.storage_tokens, o.input_tokens, n.input_tokens)
    tokens("computed", o.computed_tokens, n.computed_tokens, o.input_tokens, n.input_tokens)
    for q, a, b in (("TTFT p50", o.ttft_p50_ns, n.ttft_p50_ns), ("TTFT p90", o.ttft_p90_ns, n.ttft_p90_ns),
                    ("TTFT p99", o.ttft_p99_ns, n.ttft_p99_ns)):
        t.add_row(q, fmt_ms(a), fmt_ms(b), _signed_ms(a, b))
    t.caption = (f"requests moved: split {_count(u.split_moved, u.compared)}, TTFT {_count(u.ttft_moved, u.compared)}, "
                 f"by > {fmt_ms(TTFT_MOVED_NS)} {_count(u.ttft_moved_over_1s, u.compared)}; "
                 "tokens of the finished requests, shares of their input; percentiles by nearest rank")
    t.caption_justify = "left"
    console.print(t)


def _rules_tables(view: UpgradeView, console: Console) -> None:
    moved = [r for r in view.rules if r.movement.split_moved or r.movement.ttft_moved]
    quiet = [r.rule for r in view.rules if not (r.movement.split_moved or r.movement.ttft_moved)]
    if moved:
        width = max(len(r.rule) for r in moved)
        t = Table(title=plain(f"each rule switched back alone under {view.new}: requests it moves"),
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
        t.add_column("rule", overflow="fold", min_width=width)
        t.add_column("split", justify="right")
        t.add_column("TTFT", justify="right")
        t.add_column(f"> {fmt_ms(TTFT_MOVED_NS)}", justify="right")
        t.add_column(f"gives {view.old}\nsplit", justify="right")
        t.add_column(f"gives {view.old}\nTTFT", justify="right")
        for r in moved:
            m = r.movement
            t.add_row(Text.assemble(plain(r.rule, "bold"), "\n", plain(r.title, "dim")), f"{m.split_moved:,}",
                      f"{m.ttft_moved:,}", f"{m.ttft_moved_over_1s:,}",
                      f"{r.reproduces_split:,}/{view.split_attribution.moved:,}",
                      f"{r.reproduces_ttft:,}/{view.ttft_attribution.moved:,}")
        t.caption = (f"moves: {view.new} with the rule switched back against {view.new}; gives {view.old}'s: of the "
                     f"upgrade's moved requests, those whose {view.old} outcome this switch-back alone reproduces "
                     f"(TTFT within {fmt_pct(1 - UNDONE_SHARE)} of the change)")
        t.caption_justify = "left"
        console.print(t)

        d = Table(title=plain(f"what each rule changes: {view.new} minus {view.new} with the rule as {view.old}"),
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
        d.add_column("rule", overflow="fold", min_width=width)
        # No storage tier in any run: its column would be all zeros.
        storage = any(r.storage_tokens for r in view.runs)
        for col in ("device", "host", *(("storage",) if storage else ()), "p50", "p90", "p99"):
            d.add_column(col, justify="right")
        for r in moved:
            b, a = r.movement.before, r.movement.after
            d.add_row(plain(r.rule), _signed_tokens(a.device_tokens - b.device_tokens),
                      _signed_tokens(a.host_tokens - b.host_tokens),
                      *((_signed_tokens(a.storage_tokens - b.storage_tokens),) if storage else ()),
                      _signed_ms(b.ttft_p50_ns, a.ttft_p50_ns), _signed_ms(b.ttft_p90_ns, a.ttft_p90_ns),
                      _signed_ms(b.ttft_p99_ns, a.ttft_p99_ns))
        d.caption = "hit tokens by tier" + ("" if storage else " (no storage tier)") + " and TTFT percentiles"
        d.caption_justify = "left"
        console.print(d)
    if quiet:
        console.print(plain(f"moved nothing here (every request's split and TTFT the same): {', '.join(quiet)}"))


def _request_line(m: MovedRequest) -> Text:
    d = m.ttft_delta_ns
    text = f"req {m.req_id}: TTFT {fmt_ms(m.before.ttft_ns)} -> {fmt_ms(m.after.ttft_ns)}"
    if d:
        text += f" ({signed_ms(d)})"
    if m.split_moved:
        text += f"; split {m.before.split_text()} -> {m.after.split_text()}"
    return plain("  " + text)


def _top(view: UpgradeView, console: Console) -> None:
    shown = [(f"the upgrade ({view.old} -> {view.new})", view.upgrade)]
    shown += [(f"{r.rule} ({view.old}'s rule -> {view.new}'s)", r.movement) for r in view.rules if r.movement.top]
    console.print(plain("requests moved most (largest TTFT change first)", "bold"))
    for label, m in shown:
        if not m.top:
            continue
        console.print(plain(f"{label}:"))
        for req in m.top[:SHOWN_TOP]:
            console.print(_request_line(req))


def _attribution_line(kind: str, a: Attribution, view: UpgradeView) -> str:
    if not a.moved:
        return f"No request's {kind} moved in the upgrade."
    parts = [f"{n:,} {rule}" for rule, n in a.one_rule.items()]
    text = (f"Of the {a.moved:,} requests whose {kind} moved in the upgrade, one rule switched back alone gives "
            f"{view.old}'s for {sum(a.one_rule.values()):,}" + (f" ({', '.join(parts)})" if parts else ""))
    if a.each_of_several:
        text += f"; several rules each do alone for {a.each_of_several:,} (the change needs all of them)"
    if a.no_single_rule:
        text += f"; no single rule does for {a.no_single_rule:,} (several rules together)"
    return text + "."


def render_upgrade(view: UpgradeView, console: Console) -> None:
    _whole(view, console)
    _rules_tables(view, console)
    _top(view, console)
    console.print(plain(_attribution_line("tier split", view.split_attribution, view)))
    console.print(plain(_attribution_line(f"TTFT (by > {fmt_ms(TTFT_MOVED_NS)})", view.ttft_attribution, view)))
    console.print(plain(
        f"Each rule's row is one switch-back alone; rules interact, so the rows overlap: their split moves add up "
        f"to {view.rule_split_sum():,} against the upgrade's {view.upgrade.split_moved:,}, a sum of overlapping "
        "counts, not a decomposition."))
    if view.unnamed_fields:
        console.print(plain(f"Not isolated (no rule name, they move with the whole upgrade only): "
                            f"{', '.join(view.unnamed_fields)}."))
    if view.missing_rules:
        console.print(plain(f"No complete run, so not isolated: {', '.join(view.missing_rules)}."))
    console.print(plain(f"sweep {view.sweep_id}: {len(view.runs)} runs", "dim"))


