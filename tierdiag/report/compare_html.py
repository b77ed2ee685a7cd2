"""The comparison report: several runs (`report --compare A B`, `report --sweep ID`) in one
self-contained HTML file, built like the run report (html.py) and sharing its page parts.

    build_compare_report(db, runs | sweep, output)
      open_store ─► compare_runs / compare_requests (diagnose/comparison/compare.py) + each run's TTFTs
                 ─► compare_figures.py ─► the page (html.py's CSS, loader, cards) ─► write_atomic

The per-request delta table compares two runs: the two given (`--compare A B`); for a sweep, its
first run (the baseline) against the one with the lowest TTFT p50.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import duckdb
import numpy as np

from tierdiag.config.names import HitClass
from tierdiag.diagnose.comparison.compare import (CLASSES, Comparison, RequestComparison, RequestDelta, compare_requests,
                                       compare_runs, sweep_runs)
from tierdiag.diagnose.read.compare import ttfts_by_class
from tierdiag.units import fmt_bytes, fmt_ms, fmt_pct
from tierdiag.errors import ConfigError
from tierdiag.report.compare_figures import (RunTtfts, pareto_figure, reuse_bars_figure, run_colour,
                                             ttft_cdf_figure, ttft_unit_of)
from tierdiag.report.text import fmt_option
from tierdiag.report.plotting import CLASS_COLOURS, CLASS_LABELS, FigureSpec
from tierdiag.report.page import DEFAULT_REPORTS_DIR, e, page, plotly_js, write_atomic
from tierdiag.store.reader import RunInfo, open_store, resolve_run

DELTA_ROWS = 15

_SECTIONS = (
    ("runs", "Runs", "one row per run; the option columns are the only options that differ between them."),
    ("ttft", "TTFT distributions", "the whole distribution of time to first token, run against run."),
    ("reuse", "Reuse by tier", "where each run's input tokens came from."),
    ("pareto", "Memory against TTFT", "what each run's KV memory buys."),
    ("requests", "Per request", "the same request (req_id) in two runs: what got faster, what got slower, "
                                "and whose verdict (the primary cause `explain` names) changed."),
)

_EXTRA_CSS = """
.swatch { display:inline-block; width:10px; height:10px; border-radius:50%; margin-right:6px; vertical-align:baseline; }
td.gain { color:#2e7d32; } td.loss { color:#c62828; }
.pair { color:var(--muted); font-size:13px; margin:0 0 10px; }
"""


@dataclass(frozen=True)
class CompareReportResult:
    path: Path
    figures: int
    bytes: int
    run_ids: tuple[str, ...]
    sweep_id: str | None

    def to_json(self) -> dict:
        return {"path": str(self.path), "figures": self.figures, "bytes": self.bytes,
                "run_ids": list(self.run_ids), "sweep_id": self.sweep_id}


def run_labels(c: Comparison) -> list[str]:
    """Each run's name; where two runs share one, their ids tell them apart."""
    counts = Counter(r.name for r in c.rows)
    return [r.name if counts[r.name] == 1 else f"{r.name} ({r.run_id})" for r in c.rows]


def load_ttfts(con: duckdb.DuckDBPyConnection, run_id: str, label: str) -> RunTtfts:
    rows = ttfts_by_class(con, run_id)
    ttft = np.array([r[1] for r in rows], dtype=np.int64)
    cls = np.array([r[0] or "" for r in rows], dtype=object)
    return RunTtfts(run_id=run_id, label=label,
                    by_class={"all": ttft, **{k: ttft[cls == k] for k in CLASSES}})


def _delta_pair(c: Comparison, sweep_id: str | None) -> tuple[int, int] | None:
    """Which two rows the per-request table compares (indices into c.rows)."""
    if len(c.rows) < 2:
        return None
    if sweep_id is None:
        return 0, 1
    ranked = [i for i in range(1, len(c.rows)) if c.rows[i].ttft_p50_ns is not None]
    if not ranked:
        return 0, 1
    return 0, min(ranked, key=lambda i: c.rows[i].ttft_p50_ns)


# --- page parts --------------------------------------------------------------------------------

def _runs_table(c: Comparison, labels: Sequence[str]) -> str:
    head = ["run"] + list(c.varied) + ["reuse", "device / host / storage", "recompute", "TTFT p50", "p90", "p99",
                                       "tiered-hit p50 / p99", "load-back", "exposed", "evictions", "GPU busy",
                                       "memory"]
    num = set(range(1, len(head)))
    ths = "".join(f'<th class="num">{e(h)}</th>' if i in num else f"<th>{e(h)}</th>" for i, h in enumerate(head))
    rows = []
    for i, (r, label) in enumerate(zip(c.rows, labels)):
        tiered = next((s for s in r.ttft_by_class if s.hit_class == HitClass.TIERED_HIT), None)
        status = "" if r.status == "complete" else f' <span class="cause">{e(r.status)}</span>'
        cells = [f'<td class="id"><span class="swatch" style="background:{run_colour(i)}"></span><b>{e(label)}</b>'
                 f'{status}<br><span class="split">{e(r.run_id)}</span></td>']
        cells += [f'<td class="num">{e(fmt_option(r.changes.get(k)))}</td>' for k in c.varied]
        values = [fmt_pct(r.reuse_share),
                  f"{fmt_pct(r.device_share)} / {fmt_pct(r.host_share)} / {fmt_pct(r.storage_share)}",
                  fmt_pct(r.recompute_share), fmt_ms(r.ttft_p50_ns), fmt_ms(r.ttft_p90_ns), fmt_ms(r.ttft_p99_ns),
                  f"{fmt_ms(tiered.ttft_p50_ns)} / {fmt_ms(tiered.ttft_p99_ns)}" if tiered else "-",
                  fmt_bytes(r.loadback_bytes), fmt_ms(r.loadback_exposed_ns), f"{r.num_evictions:,}",
                  fmt_pct(r.gpu_busy_share),
                  fmt_bytes(r.memory_bytes) + (f" ({r.num_ranks} × {fmt_bytes(r.memory_rank_bytes)})"
                                               if r.num_ranks > 1 and r.memory_rank_bytes is not None else "")]
        cells += [f'<td class="num">{e(v)}</td>' for v in values]
        rows.append(f"<tr>{''.join(cells)}</tr>")
    return (f'<div class="card" style="overflow-x:auto"><table><thead><tr>{ths}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>')


def _delta_rows(title: str, deltas: Sequence[RequestDelta]) -> str:
    if not deltas:
        return f'<h3>{e(title)}</h3><p class="note">none</p>'
    body = []
    for d in deltas:
        cls = CLASS_LABELS.get(d.hit_class_a or "", "-")
        if d.hit_class_b != d.hit_class_a:
            cls += f" → {CLASS_LABELS.get(d.hit_class_b or '', '-')}"
        colour = CLASS_COLOURS.get(d.hit_class_b or "", "#78909c")
        change = "-" if d.delta_ns is None else ("+" if d.delta_ns > 0 else "") + fmt_ms(d.delta_ns)
        kind = "gain" if (d.delta_ns or 0) < 0 else "loss" if (d.delta_ns or 0) > 0 else ""
        a, b = d.cause_a or "rejected", d.cause_b or "rejected"
        verdict = f'<span class="cause {e(a)}">{e(a)}</span>' + (
            "" if a == b else f' → <span class="cause {e(b)}">{e(b)}</span>')
        body.append(f'<tr><td class="id"><b>{e(d.req_id)}</b></td>'
                    f'<td><span class="badge" style="background:{colour}">{e(cls)}</span></td>'
                    f'<td class="num">{e(fmt_ms(d.ttft_a_ns))}</td><td class="num">{e(fmt_ms(d.ttft_b_ns))}</td>'
                    f'<td class="num {kind}"><b>{e(change)}</b></td><td>{verdict}</td></tr>')
    head = ('<tr><th>request</th><th>class (A → B)</th><th class="num">TTFT in A</th><th class="num">in B</th>'
            '<th class="num">change</th><th>verdict A → B</th></tr>')
    return f'<h3>{e(title)}</h3><table><thead>{head}</thead><tbody>{"".join(body)}</tbody></table>'


def _requests_section(rc: RequestComparison | None, why: str) -> str:
    if rc is None:
        return '<div class="card"><div class="empty">one run: nothing to compare request by request</div></div>'
    pair = (f'<p class="pair">A = <b>{e(rc.name_a)}</b> ({e(rc.run_a)}) · B = <b>{e(rc.name_b)}</b> '
            f"({e(rc.run_b)}){e(why)}. {rc.num_common:,} requests in both ({rc.num_only_a:,} only in A, "
            f"{rc.num_only_b:,} only in B): {rc.num_faster:,} faster in B, {rc.num_slower:,} slower, "
            f"{rc.num_changed:,} changed verdict.</p>")
    transitions = ""
    if rc.transitions:
        items = "".join(f'<tr><td><span class="cause {e(t.from_cause)}">{e(t.from_cause)}</span> → '
                        f'<span class="cause {e(t.to_cause)}">{e(t.to_cause)}</span></td>'
                        f'<td class="num">{t.num_requests:,}</td></tr>' for t in rc.transitions)
        transitions = (f'<h3>Verdicts that changed</h3><table><thead><tr><th>primary cause A → B</th>'
                       f'<th class="num">requests</th></tr></thead><tbody>{items}</tbody></table>')
    return (f'<div class="card" style="overflow-x:auto">{pair}'
            f'{_delta_rows(f"Largest TTFT gains (top {rc.top})", rc.gains)}'
            f'{_delta_rows(f"Largest TTFT losses (top {rc.top})", rc.losses)}'
            f"{transitions}"
            f'{_delta_rows(f"Changed verdicts with the largest TTFT change (top {rc.top})", rc.changed) if rc.changed else ""}'
            "</div>")


def render_compare_html(c: Comparison, labels: Sequence[str], figures: Sequence[FigureSpec],
                        rc: RequestComparison | None, why: str, *, trace: str, plotly_js: str) -> str:
    what = f"sweep <span>{e(c.sweep_id)}</span>" if c.sweep_id else f"<span>{len(c.rows)} runs</span>"
    title = f"sweep {c.sweep_id}" if c.sweep_id else " vs ".join(labels)
    meta = (f"<b>{len(c.rows)}</b> runs · options that differ: <b>{e(', '.join(c.varied) or 'none')}</b> · "
            f"trace <b>{e(trace)}</b>")
    return page(title=f"tierdiag comparison · {title}", heading=f"tierdiag comparison · {what}", meta=meta,
                sections=_SECTIONS, figures=figures, clock="the replays' clock", plotly_js=plotly_js,
                extra_css=_EXTRA_CSS, before={"runs": [_runs_table(c, labels)]},
                after={"requests": [_requests_section(rc, why)]})


def default_compare_output(c: Comparison, folder: Path = DEFAULT_REPORTS_DIR) -> Path:
    stem = c.sweep_id if c.sweep_id else "compare-" + "-".join(r.run_id for r in c.rows[:2])
    return folder / (re.sub(r"[^A-Za-z0-9._-]+", "_", stem).strip("._") + ".html")


def build_compare_report(db: str | os.PathLike, runs: Sequence[str] = (), sweep: str | None = None,
                         output: str | os.PathLike | None = None, *, top: int = DELTA_ROWS) -> CompareReportResult:
    """Read the runs (or a sweep's runs) and write the comparison report; returns where and how big."""
    if bool(runs) == bool(sweep):
        raise ConfigError("give two runs (--compare A B) or a sweep (--sweep ID)")
    con = open_store(db)
    try:
        sweep_id = None
        if sweep:
            sweep_id, infos = sweep_runs(con, sweep, db_label=str(db))
        else:
            infos = [resolve_run(con, r, db_label=str(db)) for r in runs]
        c = compare_runs(con, infos, sweep_id=sweep_id)
        labels = run_labels(c)
        ttfts = [load_ttfts(con, r.run_id, label) for r, label in zip(c.rows, labels)]
        pair = _delta_pair(c, sweep_id)
        rc, why = None, ""
        if pair is not None:
            by_id: dict[str, RunInfo] = {r.run_id: r for r in infos}
            a, b = (by_id[c.rows[i].run_id] for i in pair)
            rc = compare_requests(con, a, b, top=top)
            why = " (the sweep's first run against its lowest TTFT p50)" if sweep_id else ""
    finally:
        con.close()
    unit = ttft_unit_of(ttfts)
    figures = [ttft_cdf_figure(ttfts, "all"), *(ttft_cdf_figure(ttfts, k) for k in CLASSES),
               reuse_bars_figure(c.rows, labels), pareto_figure(c.rows, labels, "p50", unit),
               pareto_figure(c.rows, labels, "p99", unit)]
    traces = sorted({Path(r.trace_path).name for r in infos})
    text = render_compare_html(c, labels, figures, rc, why, trace=", ".join(traces), plotly_js=plotly_js())
    path = Path(output) if output is not None else default_compare_output(c)
    size = write_atomic(path, text)
    return CompareReportResult(path=path, figures=sum(1 for f in figures if not f.empty), bytes=size,
                               run_ids=tuple(r.run_id for r in c.rows), sweep_id=sweep_id)
