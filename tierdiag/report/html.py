"""The report of one run: its sections, cards and tables, on page.py's page skeleton.

    build_report(db, run, output)
      open_store ─► load_report_data (series.py, SQL) ─► build_figures (figures.py, dicts)
                 ─► render_html (this file, on page.page) ─► write_atomic (tmp file, rename)
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tierdiag.config.names import Tier
from tierdiag.units import fmt_bandwidth, fmt_bytes, fmt_ms, fmt_pct, fmt_tokens
from tierdiag.diagnose.run.kv_memory import run_kv_memory
from tierdiag.diagnose.request.causes import CAUSE_MEANING
from tierdiag.diagnose.request.slow_groups import BURST_GAP_SHARE
from tierdiag.report.series import (
    CLASSES,
    TIER_PARTS,
    ReportData,
    load_report_data,
)
from tierdiag.report.figures import (
    CLASS_COLOURS,
    CLASS_LABELS,
    TIER_COLOURS,
    TIER_LABELS,
    FigureSpec,
    FIGURE_BUILDERS,
    build_figures,
)
from tierdiag.report.page import DEFAULT_REPORTS_DIR, e, encode_figure, page, plotly_js, write_atomic  # noqa: F401 (encode_figure: for tests)
from tierdiag.diagnose.read.kind import view_of
from tierdiag.diagnose.read.run import parse
from tierdiag.report.ranks_figure import ranks_figure
from tierdiag.report.sessions_figure import survival_figure
from tierdiag.report.size_curves_figure import size_curves_figure
from tierdiag.store.reader import RunInfo, open_store, resolve_run


@dataclass(frozen=True)
class ReportResult:
    path: Path
    figures: int  # Plotly figures drawn in the page
    bytes: int
    sampled: bool  # some per-request points were left out (see the figure's note)
    run_id: str

    def to_json(self) -> dict:
        return {"path": str(self.path), "figures": self.figures, "bytes": self.bytes,
                "sampled": self.sampled, "run_id": self.run_id}


# --- page -------------------------------------------------------------------------------------

_SECTIONS = (
    ("headline", "Headline",
     "the verdict names what cost the run most time above ideal; the token-weighted tier split says how "
     "much of the input the cache served and from where; TTFT percentiles are per class (nearest rank, "
     "the same numbers as `tierdiag summary`)."),
    ("time", "Over virtual time",
     "every time axis starts at the run's first arrival. Load first (is the GPU saturated?), then the pools: "
     "device pressure causes evictions, evicted prefixes come back as load-backs and use the link."),
    ("requests", "Per request",
     "every finished request is one point; the interesting ones are high (slow) despite a large host share "
     "(a hit)."),
    ("distributions", "Distributions",
     "the shape of load-back cost and of TTFT per class; tails matter more than means."),
    ("decomposition", "TTFT decomposition",
     "each request's TTFT splits exactly into queueing + storage fetch + exposed load-back + recompute + "
     "compute; this shows which part grows."),
    ("slowest", "Slowest cached requests",
     "cached requests (device or tiered hit) with the largest excess TTFT over their ideal, grouped by burst "
     "of arrivals and verdict; each row shows `tierdiag explain`'s verdict for the group's slowest request "
     "(click it for the full answer)."),
)


def _split_bar(tokens: dict[str, int], *, legend: bool = False) -> str:
    total = sum(tokens.values()) or 1
    spans = "".join(
        f'<span style="width:{tokens[p] / total * 100:.3f}%;background:{TIER_COLOURS[p]}" '
        f'title="{e(TIER_LABELS[p])}: {tokens[p]:,} tokens ({tokens[p] / total:.1%})"></span>'
        for p in TIER_PARTS if tokens.get(p))
    bar = f'<div class="splitbar">{spans}</div>'
    if legend:
        items = "".join(f'<span><i style="background:{TIER_COLOURS[p]}"></i>{e(p)} {tokens[p] / total:.1%}</span>'
                        for p in TIER_PARTS)
        bar += f'<div class="legend">{items}</div>'
    return bar


def _stat(label: str, value: str, sub: str = "", *, extra: str = "", basis_px: int = 150) -> str:
    """One number of the headline strip; `sub` and `extra` are already-escaped HTML.

    `basis_px` is its share of the row: the six cards fill one row on a laptop screen and wrap
    on narrower ones."""
    return (f'<div class="stat" style="--basis:{basis_px}px"><div class="label">{e(label)}</div><div class="value">{e(value)}</div>'
            f'{extra}<div class="sub">{sub}</div></div>')


def _headline_stats(data: ReportData) -> str:
    h, sm = data.headline, data.summary
    all_split = h.tier_split.get("all", {p: 0 for p in TIER_PARTS})
    total_tokens = sm.tokens.input_tokens
    reused = sm.tokens.device_tokens + sm.tokens.host_tokens + sm.tokens.storage_tokens
    cards = [
        _stat("Requests", f"{sm.num_requests:,}",
              e(f"{sm.num_finished:,} finished · {sm.num_rejected:,} rejected · "
                 f"{fmt_ms(sm.span_ns)} from first arrival to last finish")),
        _stat("Input tokens reused", fmt_pct(sm.reused_token_share),
              e(f"{fmt_tokens(reused)} of {fmt_tokens(total_tokens)} tokens"),
              extra=_split_bar(all_split, legend=True), basis_px=250),
    ]
    by_class = {c.hit_class: c for c in sm.classes}
    ttft_all = by_class.get("all")
    if ttft_all is not None and ttft_all.ttft_p50_ns is not None:
        per_class = "".join(
            f'<div><span><span style="color:{CLASS_COLOURS[c.hit_class]}">●</span> '
            f"{e(CLASS_LABELS[c.hit_class])}</span><b>{e(fmt_ms(c.ttft_p50_ns))} / "
            f"{e(fmt_ms(c.ttft_p99_ns))}</b></div>"
            for c in sm.classes if c.hit_class in CLASSES)
        cards.append(_stat("TTFT p50 / p99", fmt_ms(ttft_all.ttft_p50_ns),
                           f"p99 {e(fmt_ms(ttft_all.ttft_p99_ns))}",
                           extra=f'<div class="rows">{per_class}</div>', basis_px=260))
    if not view_of(data.run).engine_parts:  # imported from a server that reports none of the cards below
        cards.append(_stat("Not reported by the server", "-", e(
            "load-back volume, skipped load-backs, evictions, TTFT parts: replay the trace written by "
            "`tierdiag import sglang --trace-out` and report that run"), basis_px=250))
        return f'<div class="stats">{"".join(cards)}</div>'
    lb = sm.load_back
    cards.append(_stat("Load-back volume", fmt_bytes(lb.bytes),
                       e(f"{lb.num_transfers:,} load-backs for {lb.num_requests:,} requests · "
                          f"{fmt_ms(lb.link_busy_ns)} on the link · {fmt_ms(lb.exposed_ns)} exposed"), basis_px=190))
    host_skips = [k for k in sm.skipped if k.tier == Tier.HOST]
    reasons = ", ".join(f"{k.reason.replace('_', ' ')} {k.num_requests:,}" for k in host_skips) or "none"
    cards.append(_stat("Skipped load-backs", f"{sum(k.num_requests for k in host_skips):,}",
                       e(f"{reasons} · {fmt_tokens(sm.tokens.loadback_skipped_tokens)} tokens recomputed instead")))
    kinds = ", ".join(f"{e.tier} {e.action} {e.num_events:,}" for e in sm.evictions) or "none"
    tokens = " · ".join(f"{e.tier} {fmt_tokens(e.tokens)} tokens" for e in sm.evictions)
    cards.append(_stat("Evictions", f"{h.num_evictions:,}", e(kinds + (f" · {tokens}" if tokens else "")),
                       basis_px=200))
    return f'<div class="stats">{"".join(cards)}</div>'


def _advice_html(item: Any) -> str:
    """One advice item of the diagnosis (issue 12): the option and value to set, why, what it
    costs, and its verification once a replay measured it; an item of another shape as text."""
    get = item.get if isinstance(item, dict) else (lambda k, d=None: getattr(item, k, d))
    option, value = get("option"), get("value")
    if option is None:
        reason = get("reason")
        return f"<li>{e(reason if reason else item)}</li>"
    changes = get("changes") or {option: value}  # every key to apply together (option included)
    head = ", ".join(f"<code>{e(k)} = {e(v)}</code>" for k, v in changes.items())
    reason = f" — {e(get('reason'))}" if get("reason") else ""
    ranks = get("cost_ranks")
    per_rank = (f" per rank, {get('cost_gib') * ranks:,.1f} GiB over the {ranks} ranks"
                if isinstance(ranks, int) and ranks > 1 and isinstance(get("cost_gib"), (int, float)) else "")
    cap = f"; capped by the host memory {e(str(get('host_limit_words')))}" if get("host_limit_words") else ""
    cost = (f'<div class="check">costs {get("cost_gib"):,.1f} GiB of {e(str(get("cost_kind") or "memory").replace("_", " "))}'
            f'{per_rank}{cap}</div>'
            if isinstance(get("cost_gib"), (int, float)) else "")
    verified = get("verified")
    vget = (verified.get if isinstance(verified, dict) else (lambda k, d=None: getattr(verified, k, d)))
    check = ""
    if get("status") in ("no_effect", "refuted"):  # tried, not advised: what the replay measured
        line = item.tried_line() if hasattr(item, "tried_line") else f"{head} ({get('status')})"
        return f'<li>{e(line)}</li>'
    if verified is not None and get("status", "confirmed") == "confirmed" and vget("ttft_p50_ms_before") is not None:
        check = (f'<div class="check">verified by replay {e(vget("run_id"))}: TTFT p50 '
                 f"{e(fmt_ms(vget('ttft_p50_ms_before') * 1e6))} → {e(fmt_ms(vget('ttft_p50_ms_after') * 1e6))}"
                 + (f", p99 {e(fmt_ms(vget('ttft_p99_ms_before') * 1e6))} → "
                    f"{e(fmt_ms(vget('ttft_p99_ms_after') * 1e6))}" if vget("ttft_p99_ms_before") is not None else "")
                 + "</div>")
    elif get("verification"):
        check = f'<div class="check">check: {e(get("verification"))}</div>'
    prediction = f'<div class="check">{e(get("prediction"))}</div>' if get("prediction") else ""
    sizing = get("sizing")  # a size item's one-pass prediction beside its replay (diagnose.advice.types.Sizing)
    if sizing is not None:
        words = sizing.words() if hasattr(sizing, "words") else None
        check += f'<div class="check">{e(words)}</div>' if words else ""
    return f"<li>{head}{reason}{prediction}{cost}{check}</li>"


def _status(item: Any) -> str:
    """An advice item's status (DESIGN §6); an item without one (a caller's own) is proposed."""
    status = item.get("status") if isinstance(item, dict) else getattr(item, "status", None)
    return status or "proposed"


def _verdict_card(data: ReportData) -> str:
    """The run-level verdict: the cause that dominated excess TTFT, with its numbers."""
    v = data.verdict
    if v.dominant is None:
        body = ('<p class="lead">No request exceeded its ideal TTFT: queueing, load-backs, storage and '
                "recompute cost nothing worth naming in this run.</p>")
        if not data.summary.num_finished:
            # Interrupted at once, or every request rejected: say which, then show what there is
            # (the run's details, the rejections).
            sm = data.summary
            why = (f"all {sm.num_rejected:,} were rejected" if sm.num_rejected
                   else f"the run is {data.run.status} before any request finished")
            body = (f'<p class="lead">No finished requests in this run: {e(why)}, so there is no TTFT to '
                    "attribute and the figures below have nothing to plot.</p>")
        return f'<div class="card verdict-card" id="verdict"><h3>Run verdict</h3>{body}</div>'
    top = v.ranked[0]
    cause = v.dominant
    finished = data.summary.num_finished
    lead = (f'<p class="lead"><span class="cause {e(cause)}">{e(cause)}</span> dominated excess TTFT: '
            f"<b>{e(fmt_pct(top.excess_share))}</b> of the time requests spent above their ideal TTFT "
            f"(<b>{e(fmt_ms(top.excess_part_ns))}</b> of {e(fmt_ms(v.excess_total_ns))}, summed over "
            f"{finished:,} finished requests) went to {e(CAUSE_MEANING[cause])}; it is the primary cause of "
            f"{top.num_requests:,} requests.</p>")
    bars = "".join(
        f'<div class="cause-row"><span class="cause {e(c.cause)}">{e(c.cause)}</span>'
        f'<span class="track"><span style="width:{(c.excess_share or 0) * 100:.2f}%"></span></span>'
        f"<b>{e(fmt_pct(c.excess_share))}</b><span class=\"sub\">{e(fmt_ms(c.excess_part_ns))} · "
        f"primary for {c.num_requests:,} requests</span></div>"
        for c in v.ranked)
    facts = "".join(f"<li>{e(f)}</li>" for f in v.facts)
    if v.finding:
        # The diagnosis's root cause (issue 12): often not the largest part itself (prefill
        # saturated by recompute shows up as queueing for everyone).
        root = (f'<span class="cause {e(v.root_cause)}">{e(v.root_cause)}</span> '
                if v.root_cause and v.root_cause != cause else "")
        facts = f"<li><b>Root cause:</b> {root}{e(v.finding)}</li>" + facts
    facts_html = f'<ul class="facts">{facts}</ul>' if facts else ""
    # The diagnosis's advice (RunSummary.diagnosis, issue 12) renders here when summary has it.
    shown = [a for a in v.advice if _status(a) in ("proposed", "confirmed")]
    tried = [a for a in v.advice if _status(a) not in ("proposed", "confirmed")]
    advice = (f'<div class="advice"><h4>Advice</h4><ol>{"".join(_advice_html(a) for a in shown)}</ol></div>'
              if shown else "")
    if tried:  # DESIGN §6: what advise replayed that did not help, with its numbers, never as advice
        advice += (f'<div class="advice tried"><h4>Tried, not advised</h4><ol>'
                   f'{"".join(_advice_html(a) for a in tried)}</ol></div>')
    return (f'<div class="card verdict-card" id="verdict"><h3>Run verdict</h3>{lead}'
            f'<div class="causes">{bars}</div>{facts_html}{advice}'
            f'<p class="note">Excess TTFT is each finished request\'s TTFT above its ideal (all reused tokens on '
            f"the GPU, no queueing), summed over the run; shares are `tierdiag summary`'s.</p></div>")


# Config keys whose values are token counts (shown with GiB at the model's KV size) or rates.
_TOKEN_KEYS = ("device_tokens", "host_tokens", "storage_tokens")


def _fmt_config(key: str, value: Any, kv_bytes_per_token: int | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    if key in _TOKEN_KEYS and isinstance(value, (int, float)):
        gib = f" ({fmt_bytes(value * kv_bytes_per_token)})" if kv_bytes_per_token and value else ""
        return f"{int(value):,} tokens{gib}"
    if key.endswith("_bytes_per_s") and isinstance(value, (int, float)):
        return fmt_bandwidth(value)
    if key.endswith("_bytes") and isinstance(value, (int, float)):
        return f"{fmt_bytes(value)} ({int(value):,} B)" if value >= 1024 else f"{int(value):,} B"
    if key.endswith("_ns") and isinstance(value, (int, float)):
        return fmt_ms(value)
    if key.endswith("_mib") and isinstance(value, (int, float)):
        return f"{value:,} MiB"
    if isinstance(value, float):
        return f"{value:,.0f}" if value.is_integer() and abs(value) >= 1000 else f"{value:,.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _kv(d: dict[str, Any], kv_bytes_per_token: int | None = None) -> str:
    if not d:
        return '<p class="note">not recorded</p>'
    rows = "".join(f"<dt>{e(k)}</dt><dd>{e(_fmt_config(k, v, kv_bytes_per_token))}</dd>"
                   for k, v in sorted(d.items()))
    return f'<dl class="kv">{rows}</dl>'


def _run_details(run: RunInfo) -> str:
    basics = {"run id": run.run_id, "name": run.name, "status": run.status, "created": str(run.created_at)[:19],
              "trace": run.trace_path, "trace sha256": run.trace_sha256, "timing": run.timing,
              "tierdiag": run.tierdiag_version, "replay wall time": f"{run.wall_s:.1f} s" if run.wall_s else "-",
              "command": run.command_line}
    kv = run.data_plane.get("kv_bytes_per_token")
    kv = int(kv) if isinstance(kv, (int, float)) and kv > 0 else None
    sizes = ""
    if kv:
        sizes = (f'<p class="note">Pool sizes in GiB at the modelled KV size of {kv:,} B per token '
                 "(binary units: 1 GiB = 2<sup>30</sup> B); bandwidths in decimal GB/s.</p>")
    return (
        '<details class="card cfg"><summary>Run configuration and hardware</summary>'
        f"{sizes}"
        '<div class="cols" style="margin-top:12px">'
        f'<div><h3>Run</h3>{_kv(basics)}</div>'
        f'<div><h3>Engine config</h3>{_kv(run.config, kv)}</div>'
        f'<div><h3>Hardware</h3>{_kv(run.hardware)}</div>'
        f'<div><h3>Data plane</h3>{_kv(run.data_plane)}</div>'
        "</div></details>")


def _slow_table(data: ReportData) -> str:
    """The slowest cached requests, one row per (burst, verdict) group; the verdict comes first so
    it stays on screen on a narrow window, the worst request's full answer one click away."""
    if not data.slow_groups and not view_of(data.run).engine_parts:
        return ('<div class="card"><div class="empty">an observed run has no engine verdicts: '
                '`tierdiag explain REQ_ID --run RUN` explains one request from the server\'s numbers '
                'and its replayed twin</div></div>')
    if not data.slow_groups:
        return ('<div class="card"><div class="empty">no cached request exceeded its ideal TTFT by more than '
                "the 20 % tolerance</div></div>")
    rows = []
    for g in data.slow_groups:
        r, ex = g.worst.request, g.worst.explanation
        cause = ex.primary_cause or g.cause
        # The headline starts with the cause ("load_back: ..."), which the badge already shows.
        headline = ex.headline.split(": ", 1)[1] if ex.headline.startswith(f"{cause}: ") else ex.headline
        split = {"device": r.device_tokens, "host": r.host_tokens, "storage": r.storage_tokens,
                 "new": r.tokens.new_tokens, "recomputed": r.recomputed_tokens}
        n_in = max(r.input_tokens, 1)
        split_text = (f"{fmt_tokens(r.input_tokens)} tok · dev {r.device_tokens / n_in:.0%}"
                      f" · host {(r.host_tokens + r.storage_tokens) / n_in:.0%}"
                      f" · comp {r.computed_tokens / n_in:.0%}")
        when = (f"{g.first_arrival_s:,.1f} s" if g.first_arrival_s == g.last_arrival_s
                else f"{g.first_arrival_s:,.1f}–{g.last_arrival_s:,.1f} s")
        classes = ", ".join(f"{n:,} {CLASS_LABELS.get(c, c)}" for c, n in sorted(g.classes.items()))
        others = [x.req_id for x in g.requests[1:]]
        more = ""
        if others:
            shown = ", ".join(e(i) for i in others[:40]) + (f" … and {len(others) - 40:,} more" if len(others) > 40 else "")
            more = f'<details class="ids"><summary>{len(others):,} more</summary><p>{shown}</p></details>'
        colour = CLASS_COLOURS.get(r.hit_class or "", "#78909c")
        rows.append(
            "<tr>"
            f'<td class="verdict"><details><summary><span class="cause {e(cause)}">{e(cause)}</span>'
            f"{e(headline)}</summary><p>{e(ex.verdict)}</p></details></td>"
            f'<td class="num"><b>{len(g.requests):,}</b><div class="sub">{e(classes)}</div></td>'
            f'<td class="num">{e(when)}<div class="sub">burst {g.burst} of {g.num_bursts}</div></td>'
            f'<td class="num"><b>{e(fmt_ms(g.excess_total_ns))}</b>'
            f'<div class="sub">worst {e(fmt_ms(r.excess_ns))}</div></td>'
            f'<td class="worst"><b class="id">{e(r.req_id)}</b> '
            f'<span class="badge" style="background:{colour}">{e(CLASS_LABELS.get(r.hit_class or "", "?"))}</span>'
            f'<div class="sub">TTFT {e(fmt_ms(r.ttft_ns))} · ideal {e(fmt_ms(r.ideal_ttft_ns))}</div>'
            f'<div class="wide-only">{_split_bar(split)}<span class="split">{e(split_text)}</span></div>{more}</td>'
            "</tr>")
    head = ('<tr><th>verdict (of the group\'s slowest request)</th><th class="num">requests</th>'
            '<th class="num">arrived</th><th class="num">excess</th><th>slowest request</th></tr>')
    n = sum(len(g.requests) for g in data.slow_groups)
    groups = f"{len(data.slow_groups)} group" + ("" if len(data.slow_groups) == 1 else "s")
    note = (f'<p class="note">{n:,} requests in {groups}, of the {data.slow_considered:,} '
            f"slowest cached requests (at most {data.slow_pool:,}) that exceeded their ideal: a burst is a run of arrivals with no gap over {BURST_GAP_SHARE:.0%} of the run's span, "
            "a group the requests of one burst sharing a primary cause; groups are ordered by summed excess. "
            "Requests within 20 % of their ideal are not listed (their cause is none).</p>")
    return (f'<div class="card slow"><div class="scroll"><table><thead>{head}</thead><tbody>{"".join(rows)}</tbody>'
            f"</table></div>{note}</div>")


def render_html(data: ReportData, figures: list[FigureSpec], *, plotly_js: str) -> str:
    run = data.run
    peak = data.transfers.link_bytes_per_s
    status = "" if run.status == "complete" else f" · <b style='color:#ffb74d'>status {e(run.status)}</b>"
    rules = ""
    parsed = parse(run)
    if parsed.rules is not None:  # the SGLang release whose rules the replay followed
        rules = (f" · sglang <b>{e(parsed.rules)}</b>"
                 + ("" if parsed.rules_recorded else " (recorded before rule sets)"))
    memory = run_kv_memory(run)  # a run of more than one rank: each rank's own pools, and in all
    if memory is not None and memory.ranks > 1:
        rules += f" · KV memory <b>{e(memory.words())}</b>"
    meta = (f"run <b>{e(run.run_id)}</b> · model <b>{e(run.config.get('model', '?'))}</b> on "
            f"<b>{e(run.config.get('gpu', '?'))}</b>{rules} ·\n{e(run.timing)} timing · link peak <b>{e(fmt_bandwidth(peak))}</b> "
            f"· trace <b>{e(Path(run.trace_path).name)}</b>{status}")
    return page(title=f"tierdiag report · {run.name} · {run.run_id}", heading=f"tierdiag report · <span>{e(run.name)}</span>",
                meta=meta, sections=_SECTIONS, figures=figures, clock="the replay's clock", plotly_js=plotly_js,
                before={"headline": [_verdict_card(data), _headline_stats(data)]},
                after={"headline": [_run_details(run)], "slowest": [_slow_table(data)]})


def _file_part(text: str, fallback: str) -> str:
    """One safe piece of a file name: no separators, no `..`, no controls, not hidden."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text or "").strip("._")[:100] or fallback


def default_output(run: RunInfo, folder: Path = DEFAULT_REPORTS_DIR) -> Path:
    # Both parts come from the database, which may have been crafted: neither may leave `folder`.
    return folder / f"{_file_part(run.name, 'run')}-{_file_part(run.run_id, 'id')}.html"


REPORT_STEPS = len(FIGURE_BUILDERS) + 4  # the run read, each figure, the session and rank figures, the page written


def build_report(db: str | os.PathLike, run: str | None = None, output: str | os.PathLike | None = None,
                 *, slow_pool: int | None = None, progress=None) -> ReportResult:
    """Read one run from the store and write its HTML report; returns where and how big.
    `progress(done, REPORT_STEPS)` is called after each step."""
    done = [0]

    def step() -> None:
        done[0] += 1
        if progress is not None:
            progress(done[0], REPORT_STEPS)

    con = open_store(db)
    try:
        info = parse(resolve_run(con, run, db_label=str(db)))  # the run parsed once for every loader
        data = load_report_data(con, info) if slow_pool is None else load_report_data(con, info, slow_pool=slow_pool)
    finally:
        con.close()
    step()
    figures = build_figures(data, progress=step)
    survival = survival_figure(data.summary.sessions)  # session runs only
    if survival is not None:
        figures.append(survival)
    step()
    ranks = ranks_figure(getattr(data.summary, "ranks", None))  # data-parallel runs only
    if ranks is not None:
        figures.append(ranks)
    sizes = size_curves_figure(getattr(data.summary, "size_curves", None))  # where the trace was read again
    if sizes is not None:
        figures.append(sizes)
    step()
    if not view_of(info).engine_parts:  # an empty figure there means "not reported", not "none happened"
        import dataclasses

        figures = [dataclasses.replace(f, empty_text="not reported by the server (observed run); replay the "
                                       "trace from `tierdiag import sglang --trace-out` to see it")
                   if f.empty else f for f in figures]
    text = render_html(data, figures, plotly_js=plotly_js())
    path = Path(output) if output is not None else default_output(info)
    size = write_atomic(path, text)
    step()
    return ReportResult(path=path, figures=sum(1 for f in figures if not f.empty), bytes=size,
                        sampled=data.points.sampled, run_id=info.run_id)
