"""The self-contained HTML report: one file, Plotly's JS inlined once, no network fetches.

    build_report(db, run, output)
      open_store ─► load_report_data (series.py, SQL) ─► build_figures (figures.py, dicts)
                 ─► render_html (this file) ─► write_atomic (tmp file in the folder, rename)

Figure data travels as JSON in `<script type="application/json">` blocks, numpy arrays as
Plotly's base64 typed arrays (`{"dtype": "f8", "bdata": ...}`), so 20,000 points cost
~200 KB, not megabytes of decimal text; one small loader script draws them all.
"""

from __future__ import annotations

import base64
import contextlib
import html
import json
import os
import re
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from tierdiag import __version__
from tierdiag.units import fmt_bandwidth, fmt_bytes, fmt_ms, fmt_pct, fmt_tokens
from tierdiag.errors import OutputError
from tierdiag.report.series import (
    BURST_GAP_SHARE,
    CAUSE_MEANING,
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
    build_figures,
)
from tierdiag.paths import prepare_output_path
from tierdiag.store.reader import RunInfo, open_store, resolve_run

DEFAULT_REPORTS_DIR = Path("reports")
PLOTLY_CONFIG = {"displaylogo": False, "responsive": True,
                 "modeBarButtonsToRemove": ["lasso2d", "select2d"],
                 "toImageButtonOptions": {"format": "png", "scale": 2}}

_TYPED = {np.dtype("float64"): "f8", np.dtype("float32"): "f4", np.dtype("int32"): "i4",
          np.dtype("int16"): "i2", np.dtype("int8"): "i1", np.dtype("uint8"): "u1"}


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


# --- encoding ---------------------------------------------------------------------------------

def _typed_array(a: np.ndarray) -> Any:
    """A numpy array as Plotly.js's typed-array spec, or a list where it has no binary form."""
    if a.dtype.kind in "iu":
        if a.size and (a.min() < np.iinfo(np.int32).min or a.max() > np.iinfo(np.int32).max):
            a = a.astype(np.float64)
        else:
            a = a.astype(np.int32)
    elif a.dtype.kind == "f":
        a = a.astype(np.float64)
    elif a.dtype.kind == "b":
        a = a.astype(np.uint8)
    else:
        return [_plain(v) for v in a.tolist()]
    spec = {"dtype": _TYPED[a.dtype], "bdata": base64.b64encode(np.ascontiguousarray(a)).decode("ascii")}
    if a.ndim > 1:
        spec["shape"] = ",".join(str(n) for n in a.shape)
    return spec


def _plain(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, np.ndarray):
        return _typed_array(v)
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not np.isfinite(v):
        return None  # JSON has no NaN; Plotly reads null as a gap
    return v


def encode_figure(figure: dict[str, Any]) -> str:
    """Figure dict -> JSON safe to embed inside a <script> element."""
    text = json.dumps(_plain(figure), separators=(",", ":"), allow_nan=False)
    # "</" would end the script element early (a request id can be any string).
    return text.replace("</", "<\\/").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


# --- page -------------------------------------------------------------------------------------

_CSS = """
:root { --ink:#263238; --muted:#607d8b; --line:#e3e8ec; --bg:#f4f6f8; --card:#fff; --accent:#ef6c00; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--ink);
       font: 14px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
header.top { background:#263238; color:#eceff1; padding:22px 0 18px; }
header.top .wrap { display:flex; flex-wrap:wrap; gap:8px 32px; align-items:baseline; }
header.top h1 { margin:0; font-size:22px; font-weight:600; letter-spacing:.2px; }
header.top h1 span { color:#ffb74d; }
header.top .meta { color:#b0bec5; font-size:13px; }
header.top .meta b { color:#eceff1; font-weight:500; }
nav { position:sticky; top:0; z-index:10; background:rgba(255,255,255,.94); backdrop-filter:blur(4px);
      border-bottom:1px solid var(--line); }
nav .wrap { display:flex; gap:22px; overflow-x:auto; padding:9px 24px; }
nav a { color:var(--muted); text-decoration:none; font-size:13px; white-space:nowrap; }
nav a:hover { color:var(--ink); }
.wrap { max-width:1320px; margin:0 auto; padding:0 24px; }
section { margin:28px 0 8px; }
h2 { font-size:18px; margin:0 0 2px; font-weight:600; }
h2 .num { color:var(--accent); margin-right:8px; }
h3 { font-size:15px; margin:0 0 2px; font-weight:600; }
p.how { margin:0 0 12px; color:var(--muted); font-size:13px; }
p.how::before { content:"How to read this: "; font-weight:600; color:#78909c; }
.card { background:var(--card); border:1px solid var(--line); border-radius:10px; padding:16px 18px 10px;
        margin-bottom:16px; box-shadow:0 1px 2px rgba(38,50,56,.04); }
.grid { display:grid; grid-template-columns:repeat(auto-fit, minmax(380px, 1fr)); gap:16px; }
.grid .card { margin-bottom:0; }
.plot { width:100%; }
p.note { margin:6px 0 4px; font-size:12px; color:var(--muted); }
p.note.sampled { color:#bf360c; }
.empty { padding:40px 0; text-align:center; color:var(--muted); }
.stats { display:flex; flex-wrap:wrap; gap:12px; margin-bottom:16px; }
.stat { flex:1 1 var(--basis, 150px); min-width:0; }
.stat { background:var(--card); border:1px solid var(--line); border-radius:10px; padding:12px 14px; }
.stat .label { font-size:11px; color:var(--muted); text-transform:uppercase; letter-spacing:.3px; white-space:nowrap; }
.stat .value { font-size:24px; font-weight:600; margin:2px 0; font-variant-numeric:tabular-nums; }
.stat .sub { font-size:12px; color:var(--muted); }
.stat .rows { font-size:12px; color:var(--muted); margin-top:4px; }
.stat .rows div { display:flex; justify-content:space-between; gap:8px; white-space:nowrap; }
.stat .rows b { color:var(--ink); font-weight:600; font-variant-numeric:tabular-nums; }
.splitbar { display:flex; height:10px; border-radius:5px; overflow:hidden; margin:8px 0 6px; background:#eceff1; }
.splitbar span { display:block; height:100%; }
.legend { font-size:12px; color:var(--muted); display:flex; flex-wrap:wrap; gap:2px 12px; }
.legend i { display:inline-block; width:9px; height:9px; border-radius:2px; margin-right:4px; }
table { border-collapse:collapse; width:100%; font-size:13px; }
th, td { text-align:left; padding:7px 8px; border-bottom:1px solid var(--line); vertical-align:top; }
th { font-size:12px; color:var(--muted); font-weight:600; white-space:nowrap; }
td.num, th.num { text-align:right; font-variant-numeric:tabular-nums; white-space:nowrap; }
td .splitbar { width:160px; margin:5px 0 2px; }
td .split { font-size:12px; color:var(--muted); white-space:nowrap; }
td.verdict { min-width:280px; max-width:560px; }
td .sub { font-size:12px; color:var(--muted); white-space:nowrap; }
td.worst { white-space:nowrap; }
td.worst .id { word-break:break-all; white-space:normal; }
details.ids summary { cursor:pointer; font-size:12px; color:var(--muted); }
details.ids p { white-space:normal; max-width:360px; font-size:12px; margin:4px 0; }
.slow .scroll { overflow-x:auto; }
@media (max-width: 900px) { .wide-only { display:none; } td.verdict { min-width:200px; }
  td.worst, td .sub { white-space:normal; } th, td { padding:6px 5px; } }
.verdict-card .lead { font-size:15px; margin:6px 0 10px; }
.verdict-card .causes { display:grid; gap:4px; margin:6px 0 8px; max-width:760px; }
.cause-row { display:grid; grid-template-columns:120px 1fr 64px minmax(160px, auto); gap:10px; align-items:center;
             font-size:13px; }
.cause-row .track { height:10px; background:#eceff1; border-radius:5px; overflow:hidden; }
.cause-row .track span { display:block; height:100%; background:var(--accent); }
.cause-row b { text-align:right; font-variant-numeric:tabular-nums; }
.cause-row .sub { color:var(--muted); font-size:12px; white-space:nowrap; }
.verdict-card ul.facts { margin:6px 0; padding-left:20px; }
.verdict-card .advice ol { margin:4px 0; padding-left:22px; }
.verdict-card .advice h4 { margin:10px 0 2px; font-size:13px; }
.verdict-card .advice .check { color:var(--muted); font-size:12px; }
@media (max-width: 700px) { .cause-row { grid-template-columns:100px 1fr 60px; } .cause-row .sub { display:none; } }
td.verdict details summary { cursor:pointer; }
td.verdict details p { margin:6px 0 0; color:#455a64; }
.badge { display:inline-block; padding:1px 8px; border-radius:10px; font-size:12px; font-weight:600;
         color:#fff; white-space:nowrap; }
.cause { display:inline-block; padding:1px 7px; border-radius:4px; font-size:12px; font-weight:600;
         background:#eceff1; color:#37474f; margin-right:6px; }
.cause.load_back { background:#fff3e0; color:#e65100; } .cause.storage_fetch { background:#f3e5f5; color:#6a1b9a; }
.cause.recompute { background:#ffebee; color:#c62828; } .cause.queueing { background:#e8eaf6; color:#283593; }
dl.kv { display:grid; grid-template-columns:max-content 1fr; gap:3px 16px; margin:0; font-size:13px; }
dl.kv dt { color:var(--muted); } dl.kv dd { margin:0; font-family:ui-monospace, Menlo, Consolas, monospace;
          font-size:12px; word-break:break-all; }
.cols { display:grid; grid-template-columns:repeat(auto-fill, minmax(380px, 1fr)); gap:16px; }
details.cfg > summary { cursor:pointer; font-weight:600; }
footer { color:var(--muted); font-size:12px; padding:24px 0 40px; }
"""

_LOADER = """
(function () {
  var config = %s;
  var blocks = document.querySelectorAll('script[type="application/json"][data-plot]');
  for (var i = 0; i < blocks.length; i++) {
    var el = blocks[i];
    var spec = JSON.parse(el.textContent);
    Plotly.newPlot(el.getAttribute('data-plot'), spec.data, spec.layout, config);
  }
})();
"""

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


def _e(v: Any) -> str:
    return html.escape(str(v), quote=True)


def _split_bar(tokens: dict[str, int], *, legend: bool = False) -> str:
    total = sum(tokens.values()) or 1
    spans = "".join(
        f'<span style="width:{tokens[p] / total * 100:.3f}%;background:{TIER_COLOURS[p]}" '
        f'title="{_e(TIER_LABELS[p])}: {tokens[p]:,} tokens ({tokens[p] / total:.1%})"></span>'
        for p in TIER_PARTS if tokens.get(p))
    bar = f'<div class="splitbar">{spans}</div>'
    if legend:
        items = "".join(f'<span><i style="background:{TIER_COLOURS[p]}"></i>{_e(p)} {tokens[p] / total:.1%}</span>'
                        for p in TIER_PARTS)
        bar += f'<div class="legend">{items}</div>'
    return bar


def _stat(label: str, value: str, sub: str = "", *, extra: str = "", basis_px: int = 150) -> str:
    """One number of the headline strip; `sub` and `extra` are already-escaped HTML.

    `basis_px` is its share of the row: the six cards fill one row on a laptop screen and wrap
    on narrower ones."""
    return (f'<div class="stat" style="--basis:{basis_px}px"><div class="label">{_e(label)}</div><div class="value">{_e(value)}</div>'
            f'{extra}<div class="sub">{sub}</div></div>')


def _headline_stats(data: ReportData) -> str:
    h, sm = data.headline, data.summary
    all_split = h.tier_split.get("all", {p: 0 for p in TIER_PARTS})
    total_tokens = sm.tokens.input_tokens
    reused = sm.tokens.device_tokens + sm.tokens.host_tokens + sm.tokens.storage_tokens
    cards = [
        _stat("Requests", f"{sm.num_requests:,}",
              _e(f"{sm.num_finished:,} finished · {sm.num_rejected:,} rejected · "
                 f"{fmt_ms(sm.span_ns)} from first arrival to last finish")),
        _stat("Input tokens reused", fmt_pct(sm.reused_token_share),
              _e(f"{fmt_tokens(reused)} of {fmt_tokens(total_tokens)} tokens"),
              extra=_split_bar(all_split, legend=True), basis_px=250),
    ]
    by_class = {c.hit_class: c for c in sm.classes}
    ttft_all = by_class.get("all")
    if ttft_all is not None and ttft_all.ttft_p50_ns is not None:
        per_class = "".join(
            f'<div><span><span style="color:{CLASS_COLOURS[c.hit_class]}">●</span> '
            f"{_e(CLASS_LABELS[c.hit_class])}</span><b>{_e(fmt_ms(c.ttft_p50_ns))} / "
            f"{_e(fmt_ms(c.ttft_p99_ns))}</b></div>"
            for c in sm.classes if c.hit_class in CLASSES)
        cards.append(_stat("TTFT p50 / p99", fmt_ms(ttft_all.ttft_p50_ns),
                           f"p99 {_e(fmt_ms(ttft_all.ttft_p99_ns))}",
                           extra=f'<div class="rows">{per_class}</div>', basis_px=260))
    if data.run.kind == "observed":  # imported from a server that reports none of the cards below
        cards.append(_stat("Not reported by the server", "-", _e(
            "load-back volume, skipped load-backs, evictions, TTFT parts: replay the trace written by "
            "`tierdiag import sglang --trace-out` and report that run"), basis_px=250))
        return f'<div class="stats">{"".join(cards)}</div>'
    lb = sm.load_back
    cards.append(_stat("Load-back volume", fmt_bytes(lb.bytes),
                       _e(f"{lb.num_transfers:,} load-backs for {lb.num_requests:,} requests · "
                          f"{fmt_ms(lb.link_busy_ns)} on the link · {fmt_ms(lb.exposed_ns)} exposed"), basis_px=190))
    host_skips = [k for k in sm.skipped if k.tier == "host"]
    reasons = ", ".join(f"{k.reason.replace('_', ' ')} {k.num_requests:,}" for k in host_skips) or "none"
    cards.append(_stat("Skipped load-backs", f"{sum(k.num_requests for k in host_skips):,}",
                       _e(f"{reasons} · {fmt_tokens(sm.tokens.loadback_skipped_tokens)} tokens recomputed instead")))
    kinds = ", ".join(f"{e.tier} {e.action} {e.num_events:,}" for e in sm.evictions) or "none"
    tokens = " · ".join(f"{e.tier} {fmt_tokens(e.tokens)} tokens" for e in sm.evictions)
    cards.append(_stat("Evictions", f"{h.num_evictions:,}", _e(kinds + (f" · {tokens}" if tokens else "")),
                       basis_px=200))
    return f'<div class="stats">{"".join(cards)}</div>'


def _advice_html(item: Any) -> str:
    """One advice item of the diagnosis (issue 12): the option and value to set, why, what it
    costs, and its verification once a replay measured it; an item of another shape as text."""
    get = item.get if isinstance(item, dict) else (lambda k, d=None: getattr(item, k, d))
    option, value = get("option"), get("value")
    if option is None:
        reason = get("reason")
        return f"<li>{_e(reason if reason else item)}</li>"
    changes = get("changes") or {option: value}  # every key to apply together (option included)
    head = ", ".join(f"<code>{_e(k)} = {_e(v)}</code>" for k, v in changes.items())
    reason = f" — {_e(get('reason'))}" if get("reason") else ""
    cost = (f'<div class="check">costs {get("cost_gib"):,.1f} GiB of {_e(str(get("cost_kind") or "memory").replace("_", " "))}</div>'
            if isinstance(get("cost_gib"), (int, float)) else "")
    verified = get("verified")
    vget = (verified.get if isinstance(verified, dict) else (lambda k, d=None: getattr(verified, k, d)))
    check = ""
    if get("status") in ("no_effect", "refuted"):  # tried, not advised: what the replay measured
        line = item.tried_line() if hasattr(item, "tried_line") else f"{head} ({get('status')})"
        return f'<li>{_e(line)}</li>'
    if verified is not None and get("status", "confirmed") == "confirmed" and vget("ttft_p50_ms_before") is not None:
        check = (f'<div class="check">verified by replay {_e(vget("run_id"))}: TTFT p50 '
                 f"{_e(fmt_ms(vget('ttft_p50_ms_before') * 1e6))} → {_e(fmt_ms(vget('ttft_p50_ms_after') * 1e6))}"
                 + (f", p99 {_e(fmt_ms(vget('ttft_p99_ms_before') * 1e6))} → "
                    f"{_e(fmt_ms(vget('ttft_p99_ms_after') * 1e6))}" if vget("ttft_p99_ms_before") is not None else "")
                 + "</div>")
    elif get("verification"):
        check = f'<div class="check">check: {_e(get("verification"))}</div>'
    return f"<li>{head}{reason}{cost}{check}</li>"


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
            body = (f'<p class="lead">No finished requests in this run: {_e(why)}, so there is no TTFT to '
                    "attribute and the figures below have nothing to plot.</p>")
        return f'<div class="card verdict-card" id="verdict"><h3>Run verdict</h3>{body}</div>'
    top = v.ranked[0]
    cause = v.dominant
    finished = data.summary.num_finished
    lead = (f'<p class="lead"><span class="cause {_e(cause)}">{_e(cause)}</span> dominated excess TTFT: '
            f"<b>{_e(fmt_pct(top.excess_share))}</b> of the time requests spent above their ideal TTFT "
            f"(<b>{_e(fmt_ms(top.excess_part_ns))}</b> of {_e(fmt_ms(v.excess_total_ns))}, summed over "
            f"{finished:,} finished requests) went to {_e(CAUSE_MEANING[cause])}; it is the primary cause of "
            f"{top.num_requests:,} requests.</p>")
    bars = "".join(
        f'<div class="cause-row"><span class="cause {_e(c.cause)}">{_e(c.cause)}</span>'
        f'<span class="track"><span style="width:{(c.excess_share or 0) * 100:.2f}%"></span></span>'
        f"<b>{_e(fmt_pct(c.excess_share))}</b><span class=\"sub\">{_e(fmt_ms(c.excess_part_ns))} · "
        f"primary for {c.num_requests:,} requests</span></div>"
        for c in v.ranked)
    facts = "".join(f"<li>{_e(f)}</li>" for f in v.facts)
    if v.finding:
        # The diagnosis's root cause (issue 12): often not the largest part itself (prefill
        # saturated by recompute shows up as queueing for everyone).
        root = (f'<span class="cause {_e(v.root_cause)}">{_e(v.root_cause)}</span> '
                if v.root_cause and v.root_cause != cause else "")
        facts = f"<li><b>Root cause:</b> {root}{_e(v.finding)}</li>" + facts
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
    rows = "".join(f"<dt>{_e(k)}</dt><dd>{_e(_fmt_config(k, v, kv_bytes_per_token))}</dd>"
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


def _cards_by_section(figures) -> tuple[dict[str, list[tuple[FigureSpec, str]]], list[str]]:
    """Each figure's card grouped by its report section, and the scripts that draw them (shared
    with the comparison report)."""
    scripts: list[str] = []
    by_section: dict[str, list[tuple[FigureSpec, str]]] = {}
    for spec in figures:
        card, script = _figure_card(spec)
        by_section.setdefault(spec.section, []).append((spec, card))
        if script:
            scripts.append(script)
    return by_section, scripts


def _figure_card(spec: FigureSpec) -> tuple[str, str]:
    """(card html, data script) for one figure; an empty figure gets a message and no script."""
    note_cls = "note sampled" if spec.note.startswith("sampled") else "note"
    note = f'<p class="{note_cls}">{_e(spec.note)}</p>' if spec.note else ""
    head = f"<h3>{_e(spec.title)}</h3><p class=\"how\">{_e(spec.how_to_read)}</p>"
    if spec.empty:
        return f'<div class="card">{head}<div class="empty">{_e(spec.empty_text)}</div>{note}</div>', ""
    div_id = f"fig-{spec.key}"
    card = (f'<div class="card">{head}<div class="plot" id="{div_id}" style="height:{spec.height_px}px"></div>'
            f"{note}</div>")
    script = f'<script type="application/json" data-plot="{div_id}">{encode_figure(spec.figure)}</script>'
    return card, script


def _slow_table(data: ReportData) -> str:
    """The slowest cached requests, one row per (burst, verdict) group; the verdict comes first so
    it stays on screen on a narrow window, the worst request's full answer one click away."""
    if not data.slow_groups and data.run.kind == "observed":
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
                 "new": r.computed_tokens - r.recomputed_tokens, "recomputed": r.recomputed_tokens}
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
            shown = ", ".join(_e(i) for i in others[:40]) + (f" … and {len(others) - 40:,} more" if len(others) > 40 else "")
            more = f'<details class="ids"><summary>{len(others):,} more</summary><p>{shown}</p></details>'
        colour = CLASS_COLOURS.get(r.hit_class or "", "#78909c")
        rows.append(
            "<tr>"
            f'<td class="verdict"><details><summary><span class="cause {_e(cause)}">{_e(cause)}</span>'
            f"{_e(headline)}</summary><p>{_e(ex.verdict)}</p></details></td>"
            f'<td class="num"><b>{len(g.requests):,}</b><div class="sub">{_e(classes)}</div></td>'
            f'<td class="num">{_e(when)}<div class="sub">burst {g.burst} of {g.num_bursts}</div></td>'
            f'<td class="num"><b>{_e(fmt_ms(g.excess_total_ns))}</b>'
            f'<div class="sub">worst {_e(fmt_ms(r.excess_ns))}</div></td>'
            f'<td class="worst"><b class="id">{_e(r.req_id)}</b> '
            f'<span class="badge" style="background:{colour}">{_e(CLASS_LABELS.get(r.hit_class or "", "?"))}</span>'
            f'<div class="sub">TTFT {_e(fmt_ms(r.ttft_ns))} · ideal {_e(fmt_ms(r.ideal_ttft_ns))}</div>'
            f'<div class="wide-only">{_split_bar(split)}<span class="split">{_e(split_text)}</span></div>{more}</td>'
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
    by_section, scripts = _cards_by_section(figures)

    body = []
    for n, (key, title, how) in enumerate(_SECTIONS, start=1):
        parts = [f'<section id="{key}"><h2><span class="num">{n}</span>{_e(title)}</h2><p class="how">{_e(how)}</p>']
        if key == "headline":
            parts.append(_verdict_card(data))
            parts.append(_headline_stats(data))
        cards = by_section.get(key, [])
        wide = [c for s, c in cards if s.wide]
        narrow = [c for s, c in cards if not s.wide]
        parts.extend(wide)
        if narrow:
            parts.append(f'<div class="grid">{"".join(narrow)}</div>')
        if key == "headline":
            parts.append(_run_details(run))
        if key == "slowest":
            parts.append(_slow_table(data))
        parts.append("</section>")
        body.append("".join(parts))

    nav = "".join(f'<a href="#{k}">{_e(t)}</a>' for k, t, _ in _SECTIONS)
    model = run.config.get("model", "?")
    gpu = run.config.get("gpu", "?")
    peak = data.transfers.link_bytes_per_s
    status = "" if run.status == "complete" else f" · <b style='color:#ffb74d'>status {_e(run.status)}</b>"
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="tierdiag {_e(__version__)}">
<title>tierdiag report · {_e(run.name)} · {_e(run.run_id)}</title>
<style>{_CSS}</style>
<script>{plotly_js}</script>
</head>
<body>
<header class="top"><div class="wrap">
<h1>tierdiag report · <span>{_e(run.name)}</span></h1>
<div class="meta">run <b>{_e(run.run_id)}</b> · model <b>{_e(model)}</b> on <b>{_e(gpu)}</b> ·
{_e(run.timing)} timing · link peak <b>{_e(fmt_bandwidth(peak))}</b> · trace <b>{_e(Path(run.trace_path).name)}</b>{status}</div>
</div></header>
<nav><div class="wrap">{nav}</div></nav>
<main class="wrap">
{"".join(body)}
</main>
<footer class="wrap">Generated by tierdiag {_e(__version__)} on {generated} from the run store only.
Times are virtual (the replay's clock); token counts are exact. This file works offline.</footer>
{"".join(scripts)}
<script>{_LOADER % json.dumps(PLOTLY_CONFIG)}</script>
</body>
</html>
"""


# --- writing ----------------------------------------------------------------------------------

def _umask() -> int:
    # The only portable way to read the umask is to set it and put it back.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path: Path, text: str) -> int:
    """Write `text` to `path` via a temporary file in the same folder, renamed into place.

    Readers (a browser reloading, a CI artifact upload) see the old file or the whole new one,
    never a torn write; on failure the temporary file is removed and nothing else changes.
    """
    payload = text.encode("utf-8")
    prepare_output_path(path, what="-o")
    parent = path.parent
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a report is meant to be shared
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}",
                          hint="check free space and permissions, or pass -o elsewhere") from exc
    finally:
        if tmp is not None:
            # Cleanup after a failed write; the original error is what the user needs to see.
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return len(payload)


def _file_part(text: str, fallback: str) -> str:
    """One safe piece of a file name: no separators, no `..`, no controls, not hidden."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text or "").strip("._")[:100] or fallback


def default_output(run: RunInfo, folder: Path = DEFAULT_REPORTS_DIR) -> Path:
    # Both parts come from the database, which may have been crafted: neither may leave `folder`.
    return folder / f"{_file_part(run.name, 'run')}-{_file_part(run.run_id, 'id')}.html"


def _plotly_js() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def build_report(db: str | os.PathLike, run: str | None = None, output: str | os.PathLike | None = None,
                 *, slow_pool: int | None = None) -> ReportResult:
    """Read one run from the store and write its HTML report; returns where and how big."""
    con = open_store(db)
    try:
        info = resolve_run(con, run, db_label=str(db))
        data = load_report_data(con, info) if slow_pool is None else load_report_data(con, info, slow_pool=slow_pool)
    finally:
        con.close()
    figures = build_figures(data)
    if info.kind == "observed":  # an empty figure there means "not reported", not "none happened"
        import dataclasses

        figures = [dataclasses.replace(f, empty_text="not reported by the server (observed run); replay the "
                                       "trace from `tierdiag import sglang --trace-out` to see it")
                   if f.empty else f for f in figures]
    text = render_html(data, figures, plotly_js=_plotly_js())
    path = Path(output) if output is not None else default_output(info)
    size = write_atomic(path, text)
    return ReportResult(path=path, figures=sum(1 for f in figures if not f.empty), bytes=size,
                        sampled=data.points.sampled, run_id=info.run_id)
