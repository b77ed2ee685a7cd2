"""The one HTML page skeleton both reports are made of (html.py: one run; compare_html.py: runs
side by side): the head with its CSS and Plotly's JS inlined once, the header, the numbered
sections with their "how to read this" line and their figure cards, the footer, and the loader
that draws every figure from its JSON block; then the atomic write.

Figure data travels as JSON in `<script type="application/json">` blocks, numpy arrays as
Plotly's base64 typed arrays (`{"dtype": "f8", "bdata": ...}`), so 20,000 points cost
~200 KB, not megabytes of decimal text. Every value from the data goes through `e` (escaped).
"""

from __future__ import annotations

import base64
import html
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from tierdiag import __version__
from tierdiag.paths import write_output
from tierdiag.report.plotting import FigureSpec

DEFAULT_REPORTS_DIR = Path("reports")
PLOTLY_CONFIG = {"displaylogo": False, "responsive": True,
                 "modeBarButtonsToRemove": ["lasso2d", "select2d"],
                 "toImageButtonOptions": {"format": "png", "scale": 2}}

_TYPED = {np.dtype("float64"): "f8", np.dtype("float32"): "f4", np.dtype("int32"): "i4",
          np.dtype("int16"): "i2", np.dtype("int8"): "i1", np.dtype("uint8"): "u1"}


# --- figure data ---------------------------------------------------------------------------------

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


# --- page ---

CSS = """
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

def e(v: Any) -> str:
    """Data as HTML text (a request id, a run name: never markup)."""
    return html.escape(str(v), quote=True)



def cards_by_section(figures) -> tuple[dict[str, list[tuple[FigureSpec, str]]], list[str]]:
    """Each figure's card grouped by its page section, and the scripts that draw them."""
    scripts: list[str] = []
    by_section: dict[str, list[tuple[FigureSpec, str]]] = {}
    for spec in figures:
        card, script = figure_card(spec)
        by_section.setdefault(spec.section, []).append((spec, card))
        if script:
            scripts.append(script)
    return by_section, scripts


def figure_card(spec: FigureSpec) -> tuple[str, str]:
    """(card html, data script) for one figure; an empty figure gets a message and no script."""
    note_cls = "note sampled" if spec.note.startswith("sampled") else "note"
    note = f'<p class="{note_cls}">{e(spec.note)}</p>' if spec.note else ""
    head = f"<h3>{e(spec.title)}</h3><p class=\"how\">{e(spec.how_to_read)}</p>"
    if spec.empty:
        return f'<div class="card">{head}<div class="empty">{e(spec.empty_text)}</div>{note}</div>', ""
    div_id = f"fig-{spec.key}"
    card = (f'<div class="card">{head}<div class="plot" id="{div_id}" style="height:{spec.height_px}px"></div>'
            f"{note}</div>")
    script = f'<script type="application/json" data-plot="{div_id}">{encode_figure(spec.figure)}</script>'
    return card, script




def page(*, title: str, heading: str, meta: str, sections: Sequence[tuple[str, str, str]], figures,
         before: dict[str, Sequence[str]] | None = None, after: dict[str, Sequence[str]] | None = None,
         clock: str, plotly_js: str, extra_css: str = "") -> str:
    """The whole page. `sections`: (key, title, how to read it); each shows `before[key]`, its
    figure cards (wide ones first, the rest in a grid), then `after[key]`. `heading` and `meta`
    are HTML (escape data with `e`); `title` is text; `clock`: whose clock the times are on."""
    before, after = before or {}, after or {}
    by_section, scripts = cards_by_section(figures)
    body = []
    for n, (key, name, how) in enumerate(sections, start=1):
        cards = by_section.get(key, [])
        narrow = [card for spec, card in cards if not spec.wide]
        body.append("".join([f'<section id="{key}"><h2><span class="num">{n}</span>{e(name)}</h2>'
                             f'<p class="how">{e(how)}</p>', *before.get(key, ()),
                             *(card for spec, card in cards if spec.wide),
                             f'<div class="grid">{"".join(narrow)}</div>' if narrow else "",
                             *after.get(key, ()), "</section>"]))
    nav = "".join(f'<a href="#{k}">{e(t)}</a>' for k, t, _ in sections)
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="tierdiag {e(__version__)}">
<title>{e(title)}</title>
<style>{CSS}{extra_css}</style>
<script>{plotly_js}</script>
</head>
<body>
<header class="top"><div class="wrap">
<h1>{heading}</h1>
<div class="meta">{meta}</div>
</div></header>
<nav><div class="wrap">{nav}</div></nav>
<main class="wrap">
{"".join(body)}
</main>
<footer class="wrap">Generated by tierdiag {e(__version__)} on {generated} from the run store only.
Times are virtual ({clock}); token counts are exact. This file works offline.</footer>
{"".join(scripts)}
<script>{_LOADER % json.dumps(PLOTLY_CONFIG)}</script>
</body>
</html>
"""


# --- writing ----------------------------------------------------------------------------------

def write_atomic(path: Path, text: str) -> int:
    """Write `text` to `path` through the one output writer (`paths.write_output`): a temporary
    file made exclusively in the same folder, renamed into place. Readers (a browser reloading, a
    CI artifact upload) see the old file or the whole new one, never a torn write; on failure the
    temporary file is removed and nothing else changes."""
    return write_output(path, text.encode("utf-8"), what="-o")


def plotly_js() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


