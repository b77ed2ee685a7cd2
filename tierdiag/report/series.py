"""The report's series: everything the HTML report draws, from one run in the store (DuckDB
only, no torch). The questions it asks of the run are diagnose/read/series.py's; the diagnosis it
shows beside them (the run's, the slowest requests explained) is diagnose's: diagnosis.py,
slow_groups.py; `load_report_data` gathers both.

Aggregation happens in SQL (percentiles, time bins, group-bys) so a run of a million requests
costs the report no more memory than a small one; only the per-request scatter and the per-
transfer distributions fetch columns, and the scatter is sampled past `MAX_SCATTER_POINTS`.
All results are frozen dataclasses of plain numbers and numpy arrays; `figures.py` and
`html.py` only turn them into Plotly specs and HTML.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np

from tierdiag.diagnose.run.diagnosis import RunDiagnosis, backed
from tierdiag.diagnose.run.facts import RunFacts
from tierdiag.diagnose.read import series as read
from tierdiag.diagnose.read.kind import view_of
from tierdiag.diagnose.read.query import link_peak_bytes_per_s
from tierdiag.diagnose.request.slow_groups import SLOW_POOL, SlowGroup
from tierdiag.diagnose.request.slow_groups import slow_groups as load_slow_groups
from tierdiag.diagnose.read.queries import run_span_ns
from tierdiag.diagnose.run.summary import RunSummary, run_summary
from tierdiag.store.reader import RunInfo

# Past this many finished requests the per-request scatter keeps the slowest ones plus an
# even, deterministic sample of the rest (scattergl stays fluid well past this).
MAX_SCATTER_POINTS = 20_000
SLOWEST_ALWAYS_KEPT = 2_000
# Occupancy / bandwidth lines: raw samples up to this many per tier, else max per time bin.
MAX_LINE_POINTS = 4_000
TIME_BINS = 1_000
DECOMP_BINS = 60
LOAD_BINS = 300  # the load timeline's time-weighted bins

CLASSES = ("device_hit", "tiered_hit", "miss")
# TTFT decomposition columns, in the order they are stacked (sum == ttft_ns per request).
COMPONENTS = ("queue_ns", "storage_wait_ns", "loadback_exposed_ns", "recompute_ns", "compute_ns")

@dataclass(frozen=True)
class ClassTTFT:
    """TTFT quantiles of one class for the box plot (nearest rank, see diagnose/read/quantile.py).

    p50 and p99 are `summary`'s (`ClassStats`), not recomputed; p01/p25/p75 only draw the box."""

    hit_class: str  # device_hit | tiered_hit | miss | all
    num_requests: int
    p01_ns: float
    p25_ns: float
    p50_ns: float
    p75_ns: float
    p99_ns: float
    mean_ns: float


@dataclass(frozen=True)
class Headline:
    """The report's headline: `summary`'s RunSummary (one source for every headline number)
    plus the per-class token split and box quantiles that only the report draws."""

    summary: RunSummary
    ttft: tuple[ClassTTFT, ...]  # "all" first, then present classes in CLASSES order
    # "all" / class -> tokens by where they came from: device, host, storage, new, recomputed
    tier_split: dict[str, dict[str, int]]
    t0_ns: int  # the run's first arrival: every time axis of the report starts here

    @property
    def num_requests(self) -> int:
        return self.summary.num_requests

    @property
    def span_ns(self) -> int:
        return self.summary.span_ns

    @property
    def num_finished(self) -> int:
        return self.summary.num_finished

    @property
    def num_rejected(self) -> int:
        return self.summary.num_rejected

    @property
    def num_evictions(self) -> int:
        return sum(e.num_events for e in self.summary.evictions)

    def ttft_for(self, hit_class: str) -> ClassTTFT | None:
        return next((c for c in self.ttft if c.hit_class == hit_class), None)


@dataclass(frozen=True)
class PoolSeries:
    tier: str
    t_s: np.ndarray  # virtual seconds (bin centre when binned)
    used_tokens: np.ndarray
    locked_tokens: np.ndarray
    capacity_tokens: int
    binned: bool  # True: each point is the max over a time bin


@dataclass(frozen=True)
class EvictionMarks:
    tier: str
    t_s: np.ndarray  # bin centres
    count: np.ndarray
    tokens: np.ndarray
    pool_used_tokens: np.ndarray  # max pool occupancy at those evictions (marker height)


@dataclass(frozen=True)
class Timeline:
    pools: tuple[PoolSeries, ...]
    evictions: tuple[EvictionMarks, ...]
    bin_s: float  # time bin width used for evictions and bandwidth
    bw_t_s: np.ndarray
    bw_bytes_per_s: np.ndarray  # load-back bytes started in the bin / bin width
    t_min_s: float  # 0: the first arrival
    t_max_s: float
    num_bins: int = TIME_BINS

    def eviction_bins_share(self, tier: str) -> float:
        """Share of the time bins with at least one eviction of `tier`: past about a third, ticks
        merge into one solid strip and the figure draws the eviction rate instead."""
        m = next((m for m in self.evictions if m.tier == tier), None)
        return len(m.t_s) / self.num_bins if m is not None and self.num_bins else 0.0


@dataclass(frozen=True)
class RequestPoints:
    """Per-request arrays for the scatter (sampled when the run is large)."""

    req_id: np.ndarray  # str
    hit_class: np.ndarray  # str
    ttft_ns: np.ndarray
    excess_ns: np.ndarray
    input_tokens: np.ndarray
    device_tokens: np.ndarray
    host_tokens: np.ndarray
    storage_tokens: np.ndarray
    computed_tokens: np.ndarray
    cause: np.ndarray  # primary cause per request (diagnose.request.causes rule)
    total: int  # finished requests in the run
    sampled: bool
    slowest_kept: int = 0  # when sampled: how many of the points are the slowest, kept whatever the sample

    @property
    def sampling_note(self) -> str:
        """What the scatter shows of the run, in the report's words ("" when every request is drawn)."""
        if not self.sampled:
            return ""
        shown = len(self.req_id)
        rest = shown - self.slowest_kept
        return (f"sampled: {shown:,} of {self.total:,} requests shown — the {self.slowest_kept:,} slowest by excess "
                f"TTFT all kept, the other {rest:,} sampled uniformly from the remaining "
                f"{self.total - self.slowest_kept:,} by a hash of the request id (the same run draws the same sample)")

    @property
    def host_share(self) -> np.ndarray:
        """Share of input tokens loaded back from host (storage hits included)."""
        return (self.host_tokens + self.storage_tokens) / np.maximum(self.input_tokens, 1)


@dataclass(frozen=True)
class Transfers:
    """Load-back transfers (one entry per transfer on the host->device link)."""

    duration_ns: np.ndarray  # link time: t_end - t_start
    queued_ns: np.ndarray
    bytes: np.ndarray
    link_bytes_per_s: float | None  # modelled peak of the link, when the run recorded it
    p50_ns: float | None = None  # link time quantiles (nearest rank, like every view)
    p99_ns: float | None = None
    bw_p50_bytes_per_s: float | None = None  # median achieved bandwidth

    @property
    def achieved_bytes_per_s(self) -> np.ndarray:
        ok = self.duration_ns > 0
        return self.bytes[ok] / (self.duration_ns[ok] / 1e9)


@dataclass(frozen=True)
class Decomposition:
    """Mean TTFT per component, over arrival-time bins and per class (ns)."""

    bin_t_s: np.ndarray  # arrival bin centres, s since the first arrival
    bin_s: float
    bin_count: np.ndarray
    bin_mean_ns: dict[str, np.ndarray]  # component -> mean per request in the bin
    bin_tokens: dict[str, np.ndarray]  # TIER_PARTS -> input tokens of the bin's requests by source
    bin_p50_ns: np.ndarray  # TTFT quantiles of the bin's requests (nearest rank)
    bin_p99_ns: np.ndarray
    by_class: dict[str, dict[str, float]]  # class -> component -> mean ns
    class_count: dict[str, int]
    total_share: dict[str, float]  # component -> share of the run's summed TTFT


@dataclass(frozen=True)
class LoadSeries:
    """Load over virtual time: time-weighted means per bin, bins from the first arrival."""

    t_s: np.ndarray  # bin centres, s since the first arrival
    bin_s: float
    waiting: np.ndarray  # requests arrived, no prefill batch started yet
    waiting_tokens: np.ndarray  # their input tokens: the prefill queue's depth
    prefilling: np.ndarray  # first batch started, no first token yet
    decoding: np.ndarray  # first token out, not finished
    busy_new: np.ndarray  # share of the bin the GPU spent computing new tokens
    busy_recompute: np.ndarray | None  # ... recomputing once-cached tokens (None: not recorded)
    busy_loadback: np.ndarray  # ... stalled on load-backs the batch could not hide
    busy_other: np.ndarray  # ... other blocking inside batches
    num_batches: int
    prefill_busy_share: float  # over the run's span (first arrival -> last finish)
    # Share of the bin with at least one request decoding: the GPU runs decode steps then. The
    # cost model times decode beside prefill (neither delays the other), so this overlaps the
    # prefill shares rather than adding to them.
    busy_decode: np.ndarray | None = None
    decode_busy_share: float | None = None  # over the run's span

    @property
    def busy_total(self) -> np.ndarray:
        rec = self.busy_recompute if self.busy_recompute is not None else 0.0
        return self.busy_new + rec + self.busy_loadback + self.busy_other


def _num(v: Any) -> int:
    return int(v) if v is not None else 0


def run_start_ns(con: duckdb.DuckDBPyConnection, run: RunInfo) -> int:
    """The run's first arrival: where its span (`summary`'s span_ns) and every time axis start."""
    return run_span_ns(con, run.run_id, "all")[0]


def load_headline(con: duckdb.DuckDBPyConnection, run: RunInfo, ctx=None) -> Headline:
    summary = run_summary(con, run, ctx=ctx)
    return Headline(summary=summary, ttft=load_ttft_by_class(con, run, summary),
                    tier_split=load_tier_split(con, run, summary), t0_ns=run_start_ns(con, run))


TIER_PARTS = ("device", "host", "storage", "new", "recomputed")


def load_tier_split(con: duckdb.DuckDBPyConnection, run: RunInfo,
                    summary: RunSummary) -> dict[str, dict[str, int]]:
    """Token-weighted split of the input, for the whole run ("all", `summary`'s) and per class.

    Computed tokens are split into genuinely new ones and recomputed ones (cached once, then
    evicted or skipped): the second kind is the cache's fault, the first is not.
    """
    t = summary.tokens
    found = {"all": {"device": t.device_tokens, "host": t.host_tokens, "storage": t.storage_tokens,
                     "new": t.new_tokens, "recomputed": t.recomputed_tokens}}
    found.update({r.hit_class: dict(zip(TIER_PARTS, (_num(v) for v in r[1:])))
                  for r in read.tokens_by_class(con, run.run_id)})
    return {c: found[c] for c in ("all",) + CLASSES if c in found}


def load_ttft_by_class(con: duckdb.DuckDBPyConnection, run: RunInfo,
                       summary: RunSummary) -> tuple[ClassTTFT, ...]:
    box = read.ttft_quantiles_by_class(con, run.run_id, (0.01, 0.25, 0.75))
    out = []
    for c in summary.classes:
        if c.hit_class not in box or c.ttft_p50_ns is None:
            continue
        p01, p25, p75 = (float(v) for v in box[c.hit_class])
        out.append(ClassTTFT(c.hit_class, c.num_requests, p01, p25, float(c.ttft_p50_ns), p75,
                             float(c.ttft_p99_ns), float(c.ttft_mean_ns or 0.0)))
    order = ("all",) + CLASSES
    return tuple(sorted(out, key=lambda t: order.index(t.hit_class) if t.hit_class in order else len(order)))


def _time_range(con: duckdb.DuckDBPyConnection, run: RunInfo, t0_ns: int) -> tuple[int, int]:
    """[first arrival, last event]: a trace sliced from a longer one starts late, and the idle
    lead-in before its first request is no part of the run (the same span `summary` uses)."""
    hi = read.last_event_ns(con, run.run_id)
    return t0_ns, max(int(hi or 0), t0_ns + 1)


def load_timeline(con: duckdb.DuckDBPyConnection, run: RunInfo, t0_ns: int | None = None) -> Timeline:
    """Pools, evictions and load-back bandwidth; times in seconds since the first arrival."""
    lo, hi = _time_range(con, run, run_start_ns(con, run) if t0_ns is None else t0_ns)
    width_ns = max((hi - lo) / TIME_BINS, 1.0)
    bins = read.TimeBins(lo, width_ns, TIME_BINS)

    pools = []
    for tier in read.pool_tiers(con, run.run_id):
        count, cap = read.pool_sample_count(con, run.run_id, tier)
        binned = count > MAX_LINE_POINTS
        cols = read.pool_samples(con, run.run_id, tier, bins if binned else None)
        pools.append(PoolSeries(tier=tier, t_s=(np.asarray(cols["t"], dtype=float) - lo) / 1e9,
                                used_tokens=np.asarray(cols["used"], dtype=float),
                                locked_tokens=np.asarray(cols["locked"], dtype=float),
                                capacity_tokens=_num(cap), binned=binned))

    marks = []
    ev = read.eviction_bins(con, run.run_id, bins)
    for tier in dict.fromkeys(ev["tier"].tolist()):
        m = ev["tier"] == tier
        marks.append(EvictionMarks(tier=str(tier), t_s=(np.asarray(ev["t"][m], dtype=float) - lo) / 1e9,
                                   count=np.asarray(ev["n"][m], dtype=float),
                                   tokens=np.asarray(ev["tok"][m], dtype=float),
                                   pool_used_tokens=np.asarray(ev["used"][m], dtype=float)))

    # A load-back counts in the bin where its midpoint falls: transfers last far less than a bin
    # on any run long enough for binning to matter, so splitting them across bins changes nothing.
    bw = read.loadback_bytes_bins(con, run.run_id, bins)
    bw_t_s = (np.asarray(bw["b"], dtype=float) + 0.5) * width_ns / 1e9
    bw_rate = np.asarray(bw["total"], dtype=float) / (width_ns / 1e9)
    return Timeline(pools=tuple(pools), evictions=tuple(marks), bin_s=width_ns / 1e9, bw_t_s=bw_t_s,
                    bw_bytes_per_s=bw_rate, t_min_s=0.0, t_max_s=(hi - lo) / 1e9, num_bins=TIME_BINS)


def load_points(con: duckdb.DuckDBPyConnection, run: RunInfo, *,
                max_points: int | None = None, keep_slowest: int | None = None) -> RequestPoints:
    max_points = MAX_SCATTER_POINTS if max_points is None else max_points
    keep_slowest = SLOWEST_ALWAYS_KEPT if keep_slowest is None else keep_slowest
    total = read.finished_count(con, run.run_id)
    sampled = total > max_points
    if sampled:
        # The slowest requests (by excess TTFT) are the point of the plot, so they are always
        # kept; the rest is an even sample ordered by a hash of the id (same run, same sample).
        keep_slowest = min(keep_slowest, max_points)
        cols = read.request_points(con, run.run_id, sample=max_points, keep_slowest=keep_slowest)
    else:
        cols = read.request_points(con, run.run_id)
    f = {k: np.asarray(v, dtype=float) for k, v in cols.items() if k not in ("req_id", "hit_class", "cause")}
    return RequestPoints(
        req_id=np.asarray(cols["req_id"], dtype=object), hit_class=np.asarray(cols["hit_class"], dtype=object),
        ttft_ns=f["ttft_ns"], excess_ns=f["excess_ns"], input_tokens=f["input_tokens"],
        device_tokens=f["device_hit_tokens"], host_tokens=f["host_hit_tokens"],
        storage_tokens=f["storage_hit_tokens"], computed_tokens=f["computed_tokens"],
        cause=np.asarray(cols["cause"], dtype=object), total=int(total), sampled=sampled,
        slowest_kept=keep_slowest if sampled else 0)


def load_transfers(con: duckdb.DuckDBPyConnection, run: RunInfo) -> Transfers:
    cols = read.loadback_transfers(con, run.run_id)
    p50, p99, bw50 = read.loadback_quantiles(con, run.run_id)
    return Transfers(duration_ns=np.asarray(cols["dur"], dtype=float),
                     queued_ns=np.asarray(cols["queued"], dtype=float),
                     bytes=np.asarray(cols["bytes"], dtype=float),
                     link_bytes_per_s=link_peak_bytes_per_s(run),
                     p50_ns=None if p50 is None else float(p50), p99_ns=None if p99 is None else float(p99),
                     bw_p50_bytes_per_s=None if bw50 is None else float(bw50))


def load_decomposition(con: duckdb.DuckDBPyConnection, run: RunInfo, t0_ns: int | None = None) -> Decomposition:
    """TTFT parts, token sources and TTFT quantiles per arrival-time bin (bins from the first arrival)."""
    # Observed runs have no split of TTFT: left out, not drawn as 0.
    lo = run_start_ns(con, run) if t0_ns is None else t0_ns
    hi = read.last_decomposed_arrival_ns(con, run.run_id)
    hi = int(hi or lo)
    width = max((hi - lo) / DECOMP_BINS, 1.0)
    binned = read.decomposition_bins(con, run.run_id, COMPONENTS, lo, width, DECOMP_BINS)
    by_class_rows = read.component_means_by_class(con, run.run_id, COMPONENTS)
    by_class = {r[0]: {c: float(v or 0) for c, v in zip(COMPONENTS, r[2:])} for r in by_class_rows}
    sums = read.component_sums(con, run.run_id, COMPONENTS)
    total = float(sums[0] or 0)
    return Decomposition(
        bin_t_s=(np.asarray(binned["b"], dtype=float) + 0.5) * width / 1e9,
        bin_s=width / 1e9,
        bin_count=np.asarray(binned["n"], dtype=float),
        bin_mean_ns={c: np.asarray(binned[c], dtype=float) for c in COMPONENTS},
        bin_tokens={part: np.asarray(binned[f"tok_{part}"], dtype=float) for part in TIER_PARTS},
        bin_p50_ns=np.asarray(binned["p50"], dtype=float), bin_p99_ns=np.asarray(binned["p99"], dtype=float),
        by_class={c: by_class[c] for c in CLASSES if c in by_class},
        class_count={r[0]: int(r[1]) for r in by_class_rows},
        total_share={c: (float(v or 0) / total if total else 0.0) for c, v in zip(COMPONENTS, sums[1:])},
    )


def load_load(con: duckdb.DuckDBPyConnection, run: RunInfo, t0_ns: int | None = None) -> LoadSeries:
    """Requests waiting / prefilling / decoding and the GPU's prefill time, per time bin.

    Each request is three intervals (arrival -> first prefill batch -> first token -> finish)
    and each batch one; a bin gets every interval's overlap with it, so the values are exact
    time-weighted means (an interval spanning many bins counts in each), computed in one pass
    per table (`_binned_overlaps`). Decode is modelled per request (its output steps, timed beside
    prefill, not delaying it): the GPU decodes while any request is decoding, so its decode share
    is the union of the decode intervals, shown beside the prefill split rather than stacked on it.
    """
    lo = run_start_ns(con, run) if t0_ns is None else t0_ns
    hi = max(run_span_ns(con, run.run_id, "all")[1] or lo, lo + 1)
    n = LOAD_BINS
    width = (hi - lo) / n
    req = read.request_phases(con, run.run_id, lo, width, n)
    # A batch's time: compute (new tokens, and recompute of once-cached ones where the run
    # recorded the split) plus the load-back stall it could not hide, plus other blocking.
    has_recompute = read.has_column(con, "batches", "recompute_ns")
    gpu = read.batch_busy(con, run.run_id, lo, width, n, recompute_recorded=has_recompute)
    req = {"waiting": req["t"], "waiting_tokens": req["w"], "prefilling": req["p"], "decoding": req["d"],
           "b": np.arange(n)}
    gpu = {k: gpu[k] for k in ("new", "rec", "lb", "other")}
    # Decode: the union of the requests' decode intervals (first token -> finish).
    busy_decode = read.decode_busy(con, run.run_id, lo, width, n)
    busy, num_batches = read.batch_totals(con, run.run_id)
    f = lambda d, k: np.asarray(d[k], dtype=float)  # noqa: E731
    return LoadSeries(
        t_s=(np.asarray(req["b"], dtype=float) + 0.5) * width / 1e9, bin_s=width / 1e9,
        waiting=f(req, "waiting"), waiting_tokens=f(req, "waiting_tokens"), prefilling=f(req, "prefilling"),
        decoding=f(req, "decoding"), busy_new=f(gpu, "new"),
        busy_recompute=f(gpu, "rec") if has_recompute else None, busy_loadback=f(gpu, "lb"),
        busy_other=f(gpu, "other"), num_batches=num_batches,
        prefill_busy_share=busy / (hi - lo), busy_decode=busy_decode,
        decode_busy_share=float(busy_decode.mean()) if len(busy_decode) else None)


@dataclass(frozen=True)
class ReportData:
    run: RunInfo
    headline: Headline
    timeline: Timeline
    load: LoadSeries
    points: RequestPoints
    transfers: Transfers
    decomposition: Decomposition
    slow_groups: tuple[SlowGroup, ...]
    slow_pool: int  # at most this many of the slowest cached requests were grouped
    slow_considered: int  # how many were (fewer when few exceed their ideal)
    verdict: RunDiagnosis  # summary's diagnosis, backed by the run's numbers

    @property
    def summary(self) -> RunSummary:
        return self.headline.summary


def load_report_data(con: duckdb.DuckDBPyConnection, run: RunInfo, *, slow_pool: int = SLOW_POOL) -> ReportData:
    from dataclasses import replace

    # The run's evidence once: summary's diagnosis and the explained slow requests share it
    # (explain takes it without the queue attribution, as it computes it itself).
    ctx = RunFacts(con, run).context() if view_of(run).engine_parts else None
    headline = load_headline(con, run, ctx)
    t0 = headline.t0_ns
    load = load_load(con, run, t0)
    groups, considered = load_slow_groups(con, run, t0, headline.span_ns, pool=slow_pool,
                                          ctx=replace(ctx, queue_attribution=None) if ctx is not None else None)
    busiest = None
    if len(load.waiting):
        i = int(np.argmax(load.waiting))
        busiest = (float(load.t_s[i]), float(load.waiting[i]), float(load.waiting_tokens[i]))
    return ReportData(run=run, headline=headline, timeline=load_timeline(con, run, t0),
                      load=load, points=load_points(con, run),
                      verdict=backed(headline.summary, load.prefill_busy_share, busiest),
                      transfers=load_transfers(con, run), decomposition=load_decomposition(con, run, t0),
                      slow_groups=groups, slow_pool=slow_pool, slow_considered=considered)
