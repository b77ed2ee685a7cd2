"""Plotly figures for the HTML report of one run, as plain figure dicts (data + layout); what
they share with the comparison's figures is in plotting.py.

Over 500 lines on purpose: one function per figure of the report (eleven), each with the words
around it; they share one colour story and one time axis, and a reader looks for a figure by
its section here rather than across files.

Dicts rather than `plotly.graph_objects` because a large run's figures are built in
milliseconds this way (no per-attribute validation), and numpy arrays stay numpy until
`html.py` encodes them as Plotly's binary typed arrays. The tests validate every dict with
`plotly.graph_objects.Figure`, so a misspelt attribute still fails loudly.

Histograms are binned here (numpy) and drawn as bars, so a run with a million load-backs
embeds a few hundred numbers, not a million. Colours are fixed per meaning across figures:
amber is always host / load-back, purple storage, red recompute.
"""

from __future__ import annotations

import html
from typing import Any

import numpy as np

from tierdiag.units import fmt_bandwidth, fmt_ms, fmt_pct
from tierdiag.report.plotting import (  # noqa: F401 (FigureSpec, colours, log_ticks: also for html.py and tests)
    CLASS_COLOURS,
    CLASS_LABELS,
    COMPONENT_COLOURS,
    COMPONENT_LABELS,
    INK,
    MUTED,
    POOL_COLOURS,
    TIER_COLOURS,
    TIER_LABELS,
    FigureSpec,
    TimeUnit,
    base_axis,
    base_layout,
    log_ticks,
    log_time_axis,
)
from tierdiag.report.series import (
    CLASSES,
    COMPONENTS,
    TIER_PARTS,
    LoadSeries,
    ReportData,
    RequestPoints,
    Timeline,
    Transfers,
)

HIST_BINS = 60
EVICTION_TICKS_MAX_SHARE = 1 / 3
RATE_POINTS = 200
EVICTION_COLOURS = {"device": "#c62828", "host": "#ef6c00", "storage": "#6a1b9a"}
TIME_AXIS_TITLE = "virtual time since the first arrival (s)"
NO_LOADBACKS = "no load-backs in this run (nothing was loaded back from host or storage)"


def _ms(ns: np.ndarray) -> np.ndarray:
    return np.asarray(ns, dtype=float) / 1e6


def ttft_unit(data: ReportData) -> TimeUnit:
    ref = data.headline.ttft_for("all")
    p50 = ref.p50_ns if ref is not None else 0.0
    if p50 >= 10e9:
        return TimeUnit("s", 1e9)
    if 0 < p50 < 10e3:
        return TimeUnit("µs", 1e3)
    return TimeUnit("ms", 1e6)


# --- 1. headline ------------------------------------------------------------------------------

def tier_split_figure(data: ReportData) -> FigureSpec:
    split = data.headline.tier_split
    rows = [c for c in ("all",) + CLASSES if c in split]
    # Plotly draws the first category at the bottom; reverse so "all" sits on top.
    rows = rows[::-1]
    counts = {t.hit_class: t.num_requests for t in data.headline.ttft}
    labels = [f"{CLASS_LABELS[c]} ({counts.get(c, 0):,})" for c in rows]
    traces = []
    for part in TIER_PARTS:
        tokens = np.array([split[c][part] for c in rows], dtype=float)
        totals = np.array([max(sum(split[c].values()), 1) for c in rows], dtype=float)
        traces.append({
            "type": "bar", "orientation": "h", "name": TIER_LABELS[part], "y": labels,
            "x": tokens / totals * 100, "customdata": tokens,
            "marker": {"color": TIER_COLOURS[part]},
            "hovertemplate": "%{y}<br>" + TIER_LABELS[part] + ": %{x:.1f} % (%{customdata:,.0f} tokens)"
                             "<extra></extra>",
        })
    layout = base_layout(barmode="stack", bargap=0.35,
                     xaxis=base_axis("share of input tokens (%)", range=[0, 100], ticksuffix=" %"),
                     yaxis=base_axis("", automargin=True, gridcolor="rgba(0,0,0,0)"),
                     margin={"l": 24, "r": 24, "t": 8, "b": 48})
    return FigureSpec(
        key="tier-split", section="headline", title="Where the input tokens came from",
        how_to_read="Each bar is 100 % of the input tokens of that class: green was already on the GPU, "
                    "amber and purple had to be loaded back first, grey and red were computed "
                    "(red = had been cached once, so the cache lost it).",
        figure={"data": traces, "layout": layout}, height_px=60 + 46 * len(rows) + 60)


# --- 2. over virtual time -----------------------------------------------------------------------

def timeline_figure(data: ReportData) -> FigureSpec:
    tl: Timeline = data.timeline
    marks = {m.tier: m for m in tl.evictions}
    # Ticks past a third of the bins merge into one solid strip: those tiers get a rate lane.
    as_rate = [t for t in marks if tl.eviction_bins_share(t) > EVICTION_TICKS_MAX_SHARE]
    rows = [p.tier for p in tl.pools] + (["eviction rate"] if as_rate else []) + ["bandwidth"]
    n = len(rows)
    gap = 0.06
    # Row i (0 = top) uses y axis i+1; all traces share the one x axis, so zoom is linked.
    domains = _rows(n, gap)
    layout = base_layout(hovermode="x unified" if max((len(p.t_s) for p in tl.pools), default=0) < 3000 else "closest",
                     margin={"l": 72, "r": 24, "t": 24, "b": 48})
    layout["xaxis"] = base_axis(TIME_AXIS_TITLE, anchor=f"y{n}", range=[tl.t_min_s, tl.t_max_s])
    traces: list[dict[str, Any]] = []
    annotations = []
    notes: list[str] = []
    for i, tier in enumerate(rows):
        yname = "y" if i == 0 else f"y{i + 1}"
        layout_key = "yaxis" if i == 0 else f"yaxis{i + 1}"
        if tier == "eviction rate":
            for t in as_rate:
                m = marks[t]
                # Every bin, zeros included, so the line drops where evictions pause; merged to at
                # most RATE_POINTS bins, since a thousand-point rate is noise at any screen width.
                per = -(-tl.num_bins // RATE_POINTS)
                width_s = tl.bin_s * per
                n_rate = -(-tl.num_bins // per)
                t_s = (np.arange(n_rate) + 0.5) * width_s
                rate = np.zeros(n_rate)
                idx = np.clip(np.rint(m.t_s / tl.bin_s - 0.5).astype(int) // per, 0, n_rate - 1)
                np.add.at(rate, idx, m.tokens / width_s)
                traces.append({
                    "type": "scatter", "mode": "lines", "name": f"{t} evicted tokens/s", "x": t_s, "y": rate,
                    "xaxis": "x", "yaxis": yname,
                    "line": {"color": EVICTION_COLOURS.get(t, "#b71c1c"), "width": 1.2, "shape": "hv"},
                    "hovertemplate": "%{y:,.0f} tokens/s<extra>" + t + " evictions</extra>",
                })
            layout[layout_key] = base_axis("tokens/s", domain=domains[i], rangemode="tozero")
            title = f"eviction rate (tokens/s over {width_s:.3g} s bins)"
            notes.append(", ".join(f"{t} evictions in {tl.eviction_bins_share(t):.0%}" for t in as_rate)
                         + f" of the {tl.bin_s:.3g} s bins: too dense for ticks, drawn as a rate")
        elif tier == "bandwidth":
            traces.append({
                "type": "scatter", "mode": "lines", "name": "load-back bandwidth", "x": tl.bw_t_s,
                "y": tl.bw_bytes_per_s / 1e9, "xaxis": "x", "yaxis": yname,
                "line": {"color": TIER_COLOURS["host"], "width": 1.2, "shape": "hv"},
                "fill": "tozeroy", "fillcolor": "rgba(249,168,37,0.25)",
                "hovertemplate": "%{y:.2f} GB/s<extra>load-back</extra>",
            })
            peak = data.transfers.link_bytes_per_s
            busiest = float(tl.bw_bytes_per_s.max()) if len(tl.bw_bytes_per_s) else 0.0
            # Averaged over a bin, load-back traffic is often a sliver of the peak; drawing the peak
            # then flattens the curve, so an out-of-scale peak is named instead of drawn.
            peak_on_scale = bool(peak) and busiest >= 0.2 * peak
            if peak and peak_on_scale:
                traces.append({
                    "type": "scatter", "mode": "lines", "name": "link peak", "x": [tl.t_min_s, tl.t_max_s],
                    "y": [peak / 1e9, peak / 1e9], "xaxis": "x", "yaxis": yname,
                    "line": {"color": "#b71c1c", "width": 1, "dash": "dot"},
                    "hovertemplate": f"link peak {fmt_bandwidth(peak)}<extra></extra>",
                })
            layout[layout_key] = base_axis("GB/s", domain=domains[i], rangemode="tozero")
            title = f"load-back bandwidth (average over {tl.bin_s:.3g} s bins)"
            if busiest == 0:
                title += " — no load-backs in this run"
            elif peak and not peak_on_scale:
                # In the note below the figure: a panel title this long runs off a narrow window.
                notes.append(f"load-back link peak {fmt_bandwidth(peak)} is off scale; the busiest bin "
                             f"used {busiest / peak:.1%} of it")
        else:
            pool = next(p for p in tl.pools if p.tier == tier)
            colour = POOL_COLOURS.get(tier, INK)
            kind = "scattergl" if len(pool.t_s) > 3000 else "scatter"
            traces.append({
                "type": kind, "mode": "lines", "name": f"{tier} used", "x": pool.t_s, "y": pool.used_tokens,
                "xaxis": "x", "yaxis": yname, "line": {"color": colour, "width": 1.3,
                                                       "shape": "hv" if not pool.binned else "linear"},
                "hovertemplate": "%{y:,.0f} tokens used<extra>" + tier + "</extra>",
            })
            traces.append({
                "type": kind, "mode": "lines", "name": f"{tier} locked", "x": pool.t_s, "y": pool.locked_tokens,
                "xaxis": "x", "yaxis": yname, "line": {"color": "#455a64", "width": 1, "dash": "dot"},
                "hovertemplate": "%{y:,.0f} tokens locked<extra>" + tier + "</extra>",
            })
            if pool.capacity_tokens:
                traces.append({
                    "type": "scatter", "mode": "lines", "name": f"{tier} capacity", "showlegend": False,
                    "x": [tl.t_min_s, tl.t_max_s], "y": [pool.capacity_tokens] * 2, "xaxis": "x",
                    "yaxis": yname, "line": {"color": "#90a4ae", "width": 1, "dash": "dash"},
                    "hovertemplate": f"capacity {pool.capacity_tokens:,} tokens<extra>{tier}</extra>",
                })
            m = marks.get(tier) if tier not in as_rate else None
            top = max(pool.capacity_tokens, float(pool.used_tokens.max()) if len(pool.used_tokens) else 0.0)
            if m is not None and len(m.t_s):
                # A rug of ticks just above the pool, darker for more evicted tokens: on a thrashing
                # run evictions happen in every bin, and markers on the line would hide it.
                traces.append({
                    "type": "scatter", "mode": "markers", "name": f"{tier} evictions", "x": m.t_s,
                    "y": np.full(len(m.t_s), top * 1.08), "xaxis": "x", "yaxis": yname,
                    "customdata": np.stack([m.count, m.tokens, m.pool_used_tokens], axis=1),
                    "marker": {"symbol": "line-ns-open", "size": 10, "line": {"width": 1.5},
                               "color": m.tokens, "cmin": 0, "cmax": float(m.tokens.max()),
                               "colorscale": [[0, "#ffcdd2"], [1, "#b71c1c"]]},
                    "hovertemplate": "%{customdata[0]:,.0f} evictions, %{customdata[1]:,.0f} tokens"
                                     "<br>pool at %{customdata[2]:,.0f} tokens<extra>" + tier + " evictions</extra>",
                })
            layout[layout_key] = base_axis("tokens", domain=domains[i], range=[0, top * 1.15 or 1])
            title = f"{tier} pool" + (" (max per time bin)" if pool.binned else "")
        annotations.append({"text": f"<b>{title}</b>", "xref": "paper", "yref": "paper", "x": 0,
                            "y": domains[i][1], "xanchor": "left", "yanchor": "bottom", "showarrow": False,
                            "font": {"size": 11, "color": MUTED}})
    layout["annotations"] = annotations
    layout["legend"] = {**layout["legend"], "yanchor": "top", "y": -0.12}
    binned = any(p.binned for p in tl.pools)
    return FigureSpec(
        key="timeline", section="time", title="Pools, evictions and load-backs over virtual time",
        how_to_read="When a pool runs at capacity (dashed line) it evicts (red ticks above it, darker = more "
                    "tokens; where evictions fill most of the run, an eviction-rate lane in tokens/s instead); "
                    "demoted prefixes come back later as load-backs (amber, bottom); locked tokens (dotted) "
                    "cannot be evicted.",
        figure={"data": traces, "layout": layout}, height_px=200 * n + 80,
        note=" · ".join(([f"binned into {tl.bin_s:.3g} s time bins"] if binned else []) + notes))


# --- 3. per request ---------------------------------------------------------------------------

# The scatter's left panel: requests with no host share, one jittered strip a class (a device hit
# and a miss both sit at x = 0, where one class hid the other); the right panel: the rest, by share.
STRIP_CLASSES = ("device_hit", "tiered_hit", "miss")
STRIP_JITTER = 0.32  # half the width of a strip, in category units
STRIP_DOMAIN = (0.0, 0.2)
SHARE_DOMAIN = (0.25, 1.0)


def _strip_x(index: int, n: int, key: str) -> np.ndarray:
    """Deterministic jitter (the same report twice is the same file): n points around `index`."""
    rng = np.random.default_rng(abs(hash_text(key)) % (2**32))
    return index + rng.uniform(-STRIP_JITTER, STRIP_JITTER, n)


def hash_text(text: str) -> int:
    import zlib

    return zlib.crc32(text.encode("utf-8"))


def scatter_figure(data: ReportData) -> FigureSpec:
    pts: RequestPoints = data.points
    share = pts.host_share * 100
    unit = ttft_unit(data)
    ttft = unit.of(pts.ttft_ns)
    traces = []
    at_zero = share <= 0
    strips = [c for c in STRIP_CLASSES if ((pts.hit_class == c) & at_zero).any()]
    for cls in CLASSES:
        m_cls = pts.hit_class == cls
        if not m_cls.any():
            continue
        for panel, m in (("strip", m_cls & at_zero), ("share", m_cls & ~at_zero)):
            if not m.any():
                continue
            # Plotly renders hover text as (a subset of) HTML, so ids are escaped like any page text.
            ids = np.array([html.escape(str(r), quote=False) for r in pts.req_id[m]], dtype=object)
            custom = np.stack([ids, pts.cause[m],
                               np.round(unit.of(pts.excess_ns[m]), 3).astype(object),
                               pts.input_tokens[m].astype(np.int64).astype(object),
                               np.round(share[m], 3).astype(object)], axis=1)
            x = _strip_x(strips.index(cls), int(m.sum()), cls) if panel == "strip" else share[m]
            traces.append({
                "type": "scattergl", "mode": "markers", "name": CLASS_LABELS[cls], "x": x, "y": ttft[m],
                "xaxis": "x" if panel == "strip" else "x2", "legendgroup": cls,
                "showlegend": not any(t.get("legendgroup") == cls for t in traces),
                "customdata": custom.tolist(),
                "marker": {"color": CLASS_COLOURS[cls], "size": 5, "opacity": 0.6, "line": {"width": 0}},
                "hovertemplate": "<b>req %{customdata[0]}</b> · " + CLASS_LABELS[cls]
                                 + f"<br>TTFT %{{y:,.2f}} {unit.label} (excess %{{customdata[2]:,.2f}} {unit.label})"
                                 "<br>host share %{customdata[4]:.1f} % of %{customdata[3]:,} tokens"
                                 "<br>verdict: %{customdata[1]}<extra></extra>",
            })
    shapes = []
    ref = data.headline.ttft_for("device_hit")
    if ref is not None and ref.p99_ns > 0:
        shapes.append({"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y",
                       "y0": ref.p99_ns / unit.ns, "y1": ref.p99_ns / unit.ns,
                       "line": {"color": CLASS_COLOURS["device_hit"], "width": 1, "dash": "dot"}})
    annotations = []
    if shapes:
        annotations.append({"text": f"device-hit p99 {fmt_ms(ref.p99_ns)}", "xref": "paper", "x": 1,
                            "xanchor": "right", "yref": "y", "y": np.log10(ref.p99_ns / unit.ns),
                            "yanchor": "bottom", "showarrow": False,
                            "font": {"size": 10, "color": CLASS_COLOURS["device_hit"]}})
    strip_axis = base_axis("no host share", domain=list(STRIP_DOMAIN), range=[-0.5, max(len(strips), 1) - 0.5],
                           tickvals=list(range(len(strips))), ticktext=[CLASS_LABELS[c] for c in strips],
                           showgrid=False, fixedrange=True)
    share_axis = base_axis("host-hit share (% of input tokens loaded back from host or storage)",
                           domain=list(SHARE_DOMAIN), range=[0, 102], ticksuffix=" %")
    layout = base_layout(xaxis=strip_axis, xaxis2=share_axis,
                         yaxis=log_time_axis("TTFT (log scale)", pts.ttft_ns, unit), shapes=shapes,
                         annotations=annotations, hovermode="closest")
    note = pts.sampling_note
    return FigureSpec(
        key="ttft-vs-host-share", section="requests", title="TTFT against host-hit share, per request",
        how_to_read="Left: the requests that loaded nothing back (host share 0), one strip a class, spread "
                    "sideways so neither class hides the other. Right: the rest, by the share of their input "
                    "loaded back from host or storage; points high up were slow. A point on the right above the "
                    "dotted device-hit p99 line is a “hit but slow” request — hover for its id and verdict.",
        figure={"data": traces, "layout": layout}, note=note, height_px=460)


# --- 4. distributions -------------------------------------------------------------------------

def loadback_latency_figure(data: ReportData) -> FigureSpec:
    tr: Transfers = data.transfers
    spec = dict(key="loadback-latency", section="distributions", title="Load-back latency",
                how_to_read="How long each load-back held the host→device link; a long right tail means "
                            "large or fragmented prefixes, and “waited” shows time queued behind other "
                            "load-backs.", wide=False)
    dur_ms = _ms(tr.duration_ns)
    if not (dur_ms > 0).any():
        return FigureSpec(figure={"data": [], "layout": base_layout()}, empty=True, empty_text=NO_LOADBACKS, **spec)
    series = [("on the link", dur_ms, TIER_COLOURS["host"])]
    queued_ms = _ms(tr.queued_ns)
    if (queued_ms > 0).any():
        series.append(("waited", queued_ms, "#5c6bc0"))
    all_pos = np.concatenate([s[1][s[1] > 0] for s in series])
    lo, hi = np.log10(all_pos.min()), np.log10(all_pos.max())
    if hi - lo < 1e-9:
        lo, hi = lo - 0.5, hi + 0.5
    traces = []
    for name, values, colour in series:
        v = np.log10(values[values > 0])
        counts, edges = np.histogram(v, bins=HIST_BINS, range=(lo, hi))
        centres = (edges[:-1] + edges[1:]) / 2
        traces.append({"type": "bar", "name": name, "x": centres, "y": counts.astype(float),
                       "width": float(edges[1] - edges[0]), "customdata": 10.0 ** centres,
                       "marker": {"color": colour, "opacity": 0.8},
                       "hovertemplate": "~%{customdata:.3g} ms: %{y:,} load-backs<extra>" + name + "</extra>"})
    vals, ticktext = log_ticks(10.0 ** lo * 1e6, 10.0 ** hi * 1e6)
    tickvals = [float(np.log10(v / 1e6)) for v in vals]
    layout = base_layout(barmode="overlay", bargap=0,
                     xaxis=base_axis("latency (log scale)", tickvals=tickvals, ticktext=ticktext),
                     yaxis=base_axis("load-backs"))
    # summary's numbers (one quantile definition): the latency of a load-back is its link time.
    lb = data.summary.load_back
    note = f"{len(dur_ms):,} load-backs · {fmt_ms(lb.link_busy_ns)} on the link in all"
    if tr.p50_ns is not None:
        note += f" · p50 {fmt_ms(tr.p50_ns)} · p99 {fmt_ms(tr.p99_ns)}"
    return FigureSpec(figure={"data": traces, "layout": layout}, note=note, **spec)


def loadback_bandwidth_figure(data: ReportData) -> FigureSpec:
    tr: Transfers = data.transfers
    spec = dict(key="loadback-bandwidth", section="distributions", title="Achieved load-back bandwidth",
                how_to_read="Bytes per second each load-back achieved against the link's peak (red line): "
                            "mass far left of the line means small transfers dominated by fixed overhead.",
                wide=False)
    bw = tr.achieved_bytes_per_s / 1e9
    if not len(bw):
        return FigureSpec(figure={"data": [], "layout": base_layout()}, empty=True, empty_text=NO_LOADBACKS, **spec)
    peak = tr.link_bytes_per_s / 1e9 if tr.link_bytes_per_s else None
    top = max(float(bw.max()), peak or 0.0) * 1.05 or 1.0
    counts, edges = np.histogram(bw, bins=HIST_BINS, range=(0, top))
    traces = [{"type": "bar", "name": "load-backs", "x": (edges[:-1] + edges[1:]) / 2, "y": counts.astype(float),
               "width": float(edges[1] - edges[0]), "marker": {"color": TIER_COLOURS["host"], "opacity": 0.85},
               "hovertemplate": "~%{x:.2f} GB/s: %{y:,} load-backs<extra></extra>", "showlegend": False}]
    shapes, annotations = [], []
    if peak:
        shapes.append({"type": "line", "x0": peak, "x1": peak, "xref": "x", "yref": "paper", "y0": 0, "y1": 1,
                       "line": {"color": "#b71c1c", "width": 1.5, "dash": "dot"}})
        annotations.append({"text": f"link peak {peak:.3g} GB/s", "x": peak, "xref": "x", "y": 1,
                            "yref": "paper", "xanchor": "right", "yanchor": "top", "showarrow": False,
                            "font": {"size": 10, "color": "#b71c1c"}})
    layout = base_layout(bargap=0, xaxis=base_axis("achieved GB/s", range=[0, top]), yaxis=base_axis("load-backs"),
                     shapes=shapes, annotations=annotations)
    med = (tr.bw_p50_bytes_per_s or 0.0) / 1e9
    note = f"median {med:.3g} GB/s" + (f" = {med / peak:.0%} of peak" if peak else " (link peak not recorded)")
    return FigureSpec(figure={"data": traces, "layout": layout}, note=note, **spec)


def ttft_by_class_figure(data: ReportData) -> FigureSpec:
    stats = [t for t in data.headline.ttft if t.num_requests]
    unit = ttft_unit(data)
    traces = []
    for t in stats:
        # Precomputed box: whiskers at p1 / p99 so a handful of outliers can't stretch them.
        traces.append({
            "type": "box", "name": CLASS_LABELS[t.hit_class],
            # A word a line: in the half-width panel "all requests" ran into "device hit".
            "x": [f"{CLASS_LABELS[t.hit_class].replace(' ', '<br>')}<br>{t.num_requests:,}"],
            "q1": [t.p25_ns / unit.ns], "median": [t.p50_ns / unit.ns], "q3": [t.p75_ns / unit.ns],
            "lowerfence": [max(t.p01_ns, 1.0) / unit.ns], "upperfence": [t.p99_ns / unit.ns],
            "mean": [t.mean_ns / unit.ns],
            "marker": {"color": CLASS_COLOURS[t.hit_class]}, "line": {"color": CLASS_COLOURS[t.hit_class]},
            "fillcolor": CLASS_COLOURS[t.hit_class] + "40", "showlegend": False,
            "hoverinfo": "y+name",
        })
    box_ns = [v for t in stats for v in (max(t.p01_ns, 1.0), t.p99_ns)]
    layout = base_layout(yaxis=log_time_axis("TTFT (log scale)", box_ns, unit), xaxis=base_axis("", tickangle=0, automargin=True))
    return FigureSpec(
        key="ttft-by-class", section="distributions", title="TTFT by class",
        how_to_read="Box = p25–p75 with the median line and the mean dashed; whiskers reach p1 and p99. "
                    "A tiered-hit box above the device-hit box is the cost of loading back.",
        figure={"data": traces, "layout": layout}, wide=False, empty=not traces)


# --- 5. TTFT decomposition --------------------------------------------------------------------

def decomposition_time_figure(data: ReportData) -> FigureSpec:
    d = data.decomposition
    unit = ttft_unit(data)
    traces = []
    for c in COMPONENTS:
        traces.append({"type": "bar", "name": COMPONENT_LABELS[c], "x": d.bin_t_s, "y": unit.of(d.bin_mean_ns[c]),
                       "customdata": d.bin_count, "marker": {"color": COMPONENT_COLOURS[c]},
                       "hovertemplate": f"{COMPONENT_LABELS[c]} %{{y:,.2f}} {unit.label} "
                                        "(mean of %{customdata:,} requests)<extra></extra>"})
    layout = base_layout(barmode="stack", bargap=0.08, xaxis=base_axis("arrival time since the first arrival (s)"),
                     yaxis=base_axis(f"mean TTFT ({unit.label})"), hovermode="x")
    shares = " · ".join(f"{COMPONENT_LABELS[c]} {d.total_share[c]:.0%}" for c in COMPONENTS
                        if d.total_share.get(c, 0) >= 0.005)
    return FigureSpec(
        key="decomposition-time", section="decomposition", title="Where TTFT went, across the run",
        how_to_read="Each bar is the mean TTFT of the requests arriving in that slice of time, split into "
                    "its parts; amber and red growing over time mean the cache, not the load, is costing you.",
        figure={"data": traces, "layout": layout}, note=f"share of all TTFT: {shares}" if shares else "",
        empty=not len(d.bin_t_s))


def decomposition_class_figure(data: ReportData) -> FigureSpec:
    d = data.decomposition
    classes = [c for c in CLASSES if c in d.by_class][::-1]
    labels = [f"{CLASS_LABELS[c]} ({d.class_count.get(c, 0):,})" for c in classes]
    unit = ttft_unit(data)
    traces = []
    for comp in COMPONENTS:
        traces.append({"type": "bar", "orientation": "h", "name": COMPONENT_LABELS[comp], "y": labels,
                       "x": [d.by_class[c][comp] / unit.ns for c in classes],
                       "marker": {"color": COMPONENT_COLOURS[comp]},
                       "hovertemplate": f"%{{y}}<br>{COMPONENT_LABELS[comp]} %{{x:,.2f}} {unit.label}<extra></extra>"})
    layout = base_layout(barmode="stack", bargap=0.35, xaxis=base_axis(f"mean TTFT ({unit.label})"),
                     yaxis=base_axis("", automargin=True, gridcolor="rgba(0,0,0,0)"),
                     margin={"l": 24, "r": 24, "t": 8, "b": 48})
    return FigureSpec(
        key="decomposition-class", section="decomposition", title="TTFT decomposition by class",
        how_to_read="Mean TTFT per request of each class, split into its parts: a tiered hit should be faster "
                    "than a miss; if its amber (exposed load-back) bar eats the saving, load-back is the problem.",
        figure={"data": traces, "layout": layout}, height_px=60 + 50 * len(classes) + 60, empty=not classes)


DECODE_COLOUR = "#455a64"  # decoding requests and the GPU time spent decoding


def _rows(n: int, gap: float = 0.07) -> list[list[float]]:
    """y domains of n stacked panels sharing one x axis, top first."""
    h = (1 - gap * (n - 1)) / n
    return [[max(1 - (i + 1) * h - i * gap, 0.0), min(1 - i * h - i * gap, 1.0)] for i in range(n)]


def _panel_title(text: str, domain: list[float]) -> dict[str, Any]:
    return {"text": f"<b>{html.escape(text, quote=False)}</b>", "xref": "paper", "yref": "paper", "x": 0,
            "y": domain[1], "xanchor": "left", "yanchor": "bottom", "showarrow": False,
            "font": {"size": 11, "color": MUTED}}


def load_figure(data: ReportData) -> FigureSpec:
    ld: LoadSeries = data.load
    domains = _rows(3)
    x = ld.t_s
    traces: list[dict[str, Any]] = []

    def line(name, y, yaxis, colour, *, fill=None, stack=None, fmt=",.1f", suffix="", width=1.4):
        t = {"type": "scatter", "mode": "lines", "name": name, "x": x, "y": y, "xaxis": "x", "yaxis": yaxis,
             "line": {"color": colour, "width": width, "shape": "hv"},
             "hovertemplate": f"%{{y:{fmt}}}{suffix}<extra>{name}</extra>"}
        if fill:
            t.update(fill=fill, fillcolor=colour + "55")
        if stack:
            t.update(stackgroup=stack, line={"color": colour, "width": 0.5, "shape": "hv"}, fillcolor=colour + "cc")
        return t

    traces.append(line("waiting (no batch yet)", ld.waiting, "y", COMPONENT_COLOURS["queue_ns"], fill="tozeroy"))
    traces.append(line("prefilling", ld.prefilling, "y", TIER_COLOURS["host"]))
    traces.append(line("decoding", ld.decoding, "y", DECODE_COLOUR, width=1))
    traces.append(line("queued prefill tokens", ld.waiting_tokens, "y2", COMPONENT_COLOURS["queue_ns"],
                       fill="tozeroy", fmt=",.0f", suffix=" tokens"))
    gpu = [("new tokens", ld.busy_new, COMPONENT_COLOURS["compute_ns"])]
    if ld.busy_recompute is not None:
        gpu.append(("recompute (was cached)", ld.busy_recompute, COMPONENT_COLOURS["recompute_ns"]))
    gpu += [("load-back stall", ld.busy_loadback, COMPONENT_COLOURS["loadback_exposed_ns"]),
            ("other blocking", ld.busy_other, "#37474f")]
    for name, y, colour in gpu:
        if name == "other blocking" and not (y > 0).any():
            continue
        traces.append(line(f"GPU: {name}", y * 100, "y3", colour, stack="gpu", fmt=".1f", suffix=" %"))
    if ld.busy_decode is not None:
        # A line over the prefill stack, not a layer of it: the cost model times decode steps
        # beside prefill batches, so the two shares overlap rather than add up.
        dec = line("GPU: decoding (any request)", ld.busy_decode * 100, "y3", DECODE_COLOUR, fmt=".1f",
                   suffix=" %", width=1.6)
        dec["line"]["dash"] = "dot"
        traces.append(dec)
    layout = base_layout(hovermode="x unified", margin={"l": 72, "r": 24, "t": 24, "b": 48})
    layout["xaxis"] = base_axis(TIME_AXIS_TITLE, anchor="y3", range=[0, float(x[-1] + ld.bin_s / 2) if len(x) else 1])
    layout["yaxis"] = base_axis("requests", domain=domains[0], rangemode="tozero")
    layout["yaxis2"] = base_axis("tokens", domain=domains[1], rangemode="tozero")
    layout["yaxis3"] = base_axis("share of time", domain=domains[2], range=[0, 100], ticksuffix=" %")
    split = "" if ld.busy_recompute is not None else " (this run did not record the recompute split)"
    layout["annotations"] = [
        _panel_title("requests waiting, prefilling and decoding (time-weighted mean per bin)", domains[0]),
        _panel_title("prefill queue depth: input tokens of the waiting requests", domains[1]),
        _panel_title(f"GPU busy in prefill {fmt_pct(ld.prefill_busy_share)}"
                     + (f", decoding {fmt_pct(ld.decode_busy_share)}" if ld.decode_busy_share is not None else "")
                     + f" of the run's {fmt_ms(data.headline.span_ns)}{split}", domains[2]),
    ]
    layout["legend"] = {**layout["legend"], "yanchor": "top", "y": -0.12}
    return FigureSpec(
        key="load", section="time", title="Load: waiting requests, queue depth and GPU time",
        how_to_read="When the GPU lane (bottom) sits near 100 % and the waiting count and queued tokens climb, "
                    "requests queue because prefill is saturated: that is queueing, not the cache. Red in the "
                    "GPU lane is time spent recomputing tokens the cache once held; the dotted line is the time "
                    "the GPU was decoding (at least one request past its first token).",
        figure={"data": traces, "layout": layout}, height_px=620,
        note=f"{len(x)} bins of {ld.bin_s:.3g} s; the cost model times decode steps beside prefill batches "
             f"(neither delays the other), so the decode line overlaps the prefill stack instead of adding to it",
        empty=not data.load.num_batches and not (ld.waiting > 0).any())


def reuse_time_figure(data: ReportData) -> FigureSpec:
    d = data.decomposition
    total = sum(d.bin_tokens[p] for p in TIER_PARTS)
    total = np.where(total > 0, total, 1.0)
    traces = []
    for part in TIER_PARTS:
        traces.append({"type": "scatter", "mode": "lines", "name": TIER_LABELS[part], "x": d.bin_t_s,
                       "y": d.bin_tokens[part] / total * 100, "customdata": d.bin_tokens[part],
                       "stackgroup": "tokens", "line": {"width": 0.5, "color": TIER_COLOURS[part], "shape": "hv"},
                       "fillcolor": TIER_COLOURS[part],
                       "hovertemplate": "%{y:.1f} % (%{customdata:,.0f} tokens)<extra>" + TIER_LABELS[part]
                                        + "</extra>"})
    layout = base_layout(hovermode="x unified", xaxis=base_axis("arrival time since the first arrival (s)"),
                     yaxis=base_axis("share of input tokens", range=[0, 100], ticksuffix=" %"))
    layout["legend"] = {**layout["legend"], "yanchor": "top", "y": -0.22}
    return FigureSpec(
        key="reuse-over-time", section="time", title="Token-weighted reuse by tier, over time",
        how_to_read="Where the input tokens of the requests arriving in each slice came from: green served "
                    "from the GPU, amber/purple loaded back, red recomputed after the cache lost them.",
        figure={"data": traces, "layout": layout}, wide=False, height_px=400,
        note=f"{len(d.bin_t_s)} arrival bins of {d.bin_s:.3g} s", empty=not len(d.bin_t_s))


def ttft_time_figure(data: ReportData) -> FigureSpec:
    d = data.decomposition
    unit = ttft_unit(data)
    traces = []
    for name, ns, colour, dash in (("p50", d.bin_p50_ns, "#37474f", "solid"), ("p99", d.bin_p99_ns, "#c62828", "dot")):
        traces.append({"type": "scatter", "mode": "lines+markers", "name": f"TTFT {name}", "x": d.bin_t_s,
                       "y": unit.of(ns), "customdata": d.bin_count,
                       "line": {"color": colour, "width": 1.5, "dash": dash}, "marker": {"size": 3},
                       "hovertemplate": f"{name} %{{y:,.3g}} {unit.label} (of %{{customdata:,}} requests)"
                                        f"<extra></extra>"})
    layout = base_layout(hovermode="x unified", xaxis=base_axis("arrival time since the first arrival (s)"),
                     yaxis=log_time_axis("TTFT (log scale)", np.concatenate([d.bin_p50_ns, d.bin_p99_ns]), unit))
    layout["legend"] = {**layout["legend"], "yanchor": "top", "y": -0.22}
    return FigureSpec(
        key="ttft-over-time", section="time", title="TTFT p50 and p99, over time",
        how_to_read="TTFT quantiles of the requests arriving in each slice (nearest rank, as in `summary`); "
                    "a climbing p50 with a flat reuse mix is load, a p99 that jumps with red in the reuse mix is "
                    "the cache.",
        figure={"data": traces, "layout": layout}, wide=False, height_px=400, empty=not len(d.bin_t_s))


FIGURE_BUILDERS = (
    tier_split_figure, load_figure, timeline_figure, reuse_time_figure, ttft_time_figure, scatter_figure,
    loadback_latency_figure, loadback_bandwidth_figure, ttft_by_class_figure, decomposition_time_figure,
    decomposition_class_figure,
)


def build_figures(data: ReportData, progress=None) -> list[FigureSpec]:
    """Every figure of a run's report, in order; `progress()` is called after each (the report's
    progress display counts them)."""
    figures = []
    for build in FIGURE_BUILDERS:
        figures.append(build(data))
        if progress is not None:
            progress()
    return figures
