"""The report's series: everything the HTML report draws, read from one run in the store
(DuckDB only, no torch). The diagnosis it shows beside them (the run's, the slowest requests
explained) is diagnose's: diagnosis.py, slow_groups.py; `load_report_data` gathers both.

(Some 600 lines, on purpose: one loader per figure of the page, each a dataclass and its SQL,
sharing the time-binning helpers; split, each file would import the others' bins.)

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

from tierdiag.diagnose.causes import CAUSE_MEANING, cause_sql, excess_sql  # noqa: F401 - the page's words
from tierdiag.diagnose.diagnosis import RunDiagnosis, backed
from tierdiag.diagnose.facts import RunFacts
from tierdiag.diagnose.read.kind import view_of
from tierdiag.diagnose.quantile import quantile_sql
from tierdiag.diagnose.query import link_peak_bytes_per_s
from tierdiag.diagnose.slow_groups import BURST_GAP_SHARE, SLOW_POOL, SlowGroup  # noqa: F401
from tierdiag.diagnose.slow_groups import slow_groups as load_slow_groups
from tierdiag.diagnose.sql import FINISHED_SQL
from tierdiag.diagnose.read.queries import run_span_ns
from tierdiag.diagnose.summary import RunSummary, run_summary
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

# The same rows `summary` counts as finished (diagnose/sql.py: one definition every view uses).
_FINISHED = "run_id = $run AND " + FINISHED_SQL
_DECOMPOSED = _FINISHED + " AND compute_ns IS NOT NULL"


@dataclass(frozen=True)
class ClassTTFT:
    """TTFT quantiles of one class for the box plot (nearest rank, see diagnose/quantile.py).

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
    cause: np.ndarray  # primary cause per request (diagnose.causes rule)
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


def _params(run: RunInfo) -> dict[str, Any]:
    return {"run": run.run_id}


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
                     "new": t.computed_tokens - t.recomputed_tokens, "recomputed": t.recomputed_tokens}}
    rows = con.execute(
        f"""
        SELECT hit_class, sum(device_hit_tokens), sum(host_hit_tokens), sum(storage_hit_tokens),
               sum(computed_tokens - coalesce(recomputed_tokens, 0)), sum(coalesce(recomputed_tokens, 0))
        FROM requests WHERE {_FINISHED} GROUP BY hit_class
        """, _params(run)).fetchall()
    found.update({r[0]: dict(zip(TIER_PARTS, (_num(v) for v in r[1:]))) for r in rows})
    return {c: found[c] for c in ("all",) + CLASSES if c in found}


def load_ttft_by_class(con: duckdb.DuckDBPyConnection, run: RunInfo,
                       summary: RunSummary) -> tuple[ClassTTFT, ...]:
    q = ", ".join(quantile_sql("ttft_ns", x) for x in (0.01, 0.25, 0.75))
    rows = con.execute(
        f"""
        SELECT coalesce(hit_class, 'all') AS cls, {q}
        FROM requests WHERE {_FINISHED}
        GROUP BY GROUPING SETS ((hit_class), ())
        """, _params(run)).fetchall()
    box = {r[0]: r[1:] for r in rows}
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
    (hi,) = con.execute(
        """
        SELECT max(t) FROM (
            SELECT t_ns AS t FROM pool_samples WHERE run_id = $run
            UNION ALL SELECT arrival_ns FROM requests WHERE run_id = $run
            UNION ALL SELECT finish_ns FROM requests WHERE run_id = $run
            UNION ALL SELECT t_end_ns FROM transfers WHERE run_id = $run AND kind = 'load_back')
        """, _params(run)).fetchone()
    return t0_ns, max(int(hi or 0), t0_ns + 1)


def load_timeline(con: duckdb.DuckDBPyConnection, run: RunInfo, t0_ns: int | None = None) -> Timeline:
    """Pools, evictions and load-back bandwidth; times in seconds since the first arrival."""
    lo, hi = _time_range(con, run, run_start_ns(con, run) if t0_ns is None else t0_ns)
    width_ns = max((hi - lo) / TIME_BINS, 1.0)
    # $lo/$w bin any time column into TIME_BINS buckets; the last bucket is closed on the right.
    p = {"run": run.run_id, "lo": lo, "w": width_ns, "last": TIME_BINS - 1}
    bin_of = "least(CAST(floor((t_ns - $lo) / $w) AS BIGINT), $last)"

    pools = []
    tiers = [r[0] for r in con.execute(
        "SELECT DISTINCT tier FROM pool_samples WHERE run_id = $run ORDER BY tier = 'host', tier",
        {"run": run.run_id}).fetchall()]
    for tier in tiers:
        tp = {**p, "tier": tier}
        (count, cap), = con.execute(
            "SELECT count(*), max(capacity_tokens) FROM pool_samples WHERE run_id = $run AND tier = $tier",
            {"run": run.run_id, "tier": tier}).fetchall()
        binned = count > MAX_LINE_POINTS
        if binned:
            cols = con.execute(
                f"SELECT $lo + ({bin_of} + 0.5) * $w AS t, max(used_tokens) AS used, max(locked_tokens) AS locked "
                f"FROM pool_samples WHERE run_id = $run AND tier = $tier GROUP BY {bin_of} ORDER BY 1",
                tp).fetchnumpy()
        else:
            cols = con.execute(
                "SELECT t_ns AS t, used_tokens AS used, coalesce(locked_tokens, 0) AS locked "
                "FROM pool_samples WHERE run_id = $run AND tier = $tier ORDER BY t_ns",
                {"run": run.run_id, "tier": tier}).fetchnumpy()
        pools.append(PoolSeries(tier=tier, t_s=(np.asarray(cols["t"], dtype=float) - lo) / 1e9,
                                used_tokens=np.asarray(cols["used"], dtype=float),
                                locked_tokens=np.asarray(cols["locked"], dtype=float),
                                capacity_tokens=_num(cap), binned=binned))

    marks = []
    ev = con.execute(
        f"SELECT tier, $lo + ({bin_of} + 0.5) * $w AS t, count(*) AS n, sum(tokens) AS tok, "
        f"max(pool_used_tokens) AS used FROM evictions WHERE run_id = $run GROUP BY ALL ORDER BY 1, 2",
        p).fetchnumpy()
    for tier in dict.fromkeys(ev["tier"].tolist()):
        m = ev["tier"] == tier
        marks.append(EvictionMarks(tier=str(tier), t_s=(np.asarray(ev["t"][m], dtype=float) - lo) / 1e9,
                                   count=np.asarray(ev["n"][m], dtype=float),
                                   tokens=np.asarray(ev["tok"][m], dtype=float),
                                   pool_used_tokens=np.asarray(ev["used"][m], dtype=float)))

    # A load-back counts in the bin where its midpoint falls: transfers last far less than a bin
    # on any run long enough for binning to matter, so splitting them across bins changes nothing.
    bw = con.execute(
        f"""
        WITH lb AS (SELECT (t_start_ns + t_end_ns) // 2 AS t_ns, bytes FROM transfers
                    WHERE run_id = $run AND kind = 'load_back')
        SELECT b, coalesce(total, 0) AS total FROM range(0, $last + 1) r(b)
        LEFT JOIN (SELECT {bin_of} AS bin, sum(bytes) AS total FROM lb GROUP BY ALL) ON bin = b
        ORDER BY b
        """, p).fetchnumpy()
    bw_t_s = (np.asarray(bw["b"], dtype=float) + 0.5) * width_ns / 1e9
    bw_rate = np.asarray(bw["total"], dtype=float) / (width_ns / 1e9)
    return Timeline(pools=tuple(pools), evictions=tuple(marks), bin_s=width_ns / 1e9, bw_t_s=bw_t_s,
                    bw_bytes_per_s=bw_rate, t_min_s=0.0, t_max_s=(hi - lo) / 1e9, num_bins=TIME_BINS)


_POINT_COLS = (f"req_id, hit_class, ttft_ns, {excess_sql()} AS excess_ns, input_tokens, "
               f"device_hit_tokens, host_hit_tokens, storage_hit_tokens, computed_tokens, {cause_sql()} AS cause")


def load_points(con: duckdb.DuckDBPyConnection, run: RunInfo, *,
                max_points: int | None = None, keep_slowest: int | None = None) -> RequestPoints:
    max_points = MAX_SCATTER_POINTS if max_points is None else max_points
    keep_slowest = SLOWEST_ALWAYS_KEPT if keep_slowest is None else keep_slowest
    p = _params(run)
    total = con.execute(f"SELECT count(*) FROM requests WHERE {_FINISHED}", p).fetchone()[0]
    sampled = total > max_points
    if sampled:
        # The slowest requests (by excess TTFT) are the point of the plot, so they are always
        # kept; the rest is an even sample ordered by a hash of the id (same run, same sample).
        keep_slowest = min(keep_slowest, max_points)
        cols = con.execute(
            f"""
            WITH r AS (SELECT {_POINT_COLS} FROM requests WHERE {_FINISHED}),
                 slow AS (SELECT req_id FROM r ORDER BY excess_ns DESC, req_id LIMIT {keep_slowest})
            SELECT * FROM (SELECT * FROM r WHERE req_id IN (SELECT req_id FROM slow)
                           UNION ALL
                           (SELECT * FROM r WHERE req_id NOT IN (SELECT req_id FROM slow)
                            ORDER BY hash(req_id), req_id LIMIT {max_points - keep_slowest}))
            ORDER BY req_id
            """, p).fetchnumpy()
    else:
        cols = con.execute(f"SELECT {_POINT_COLS} FROM requests WHERE {_FINISHED} ORDER BY seq", p).fetchnumpy()
    f = {k: np.asarray(v, dtype=float) for k, v in cols.items() if k not in ("req_id", "hit_class", "cause")}
    return RequestPoints(
        req_id=np.asarray(cols["req_id"], dtype=object), hit_class=np.asarray(cols["hit_class"], dtype=object),
        ttft_ns=f["ttft_ns"], excess_ns=f["excess_ns"], input_tokens=f["input_tokens"],
        device_tokens=f["device_hit_tokens"], host_tokens=f["host_hit_tokens"],
        storage_tokens=f["storage_hit_tokens"], computed_tokens=f["computed_tokens"],
        cause=np.asarray(cols["cause"], dtype=object), total=int(total), sampled=sampled,
        slowest_kept=keep_slowest if sampled else 0)


def load_transfers(con: duckdb.DuckDBPyConnection, run: RunInfo) -> Transfers:
    cols = con.execute(
        "SELECT t_end_ns - t_start_ns AS dur, coalesce(queued_ns, 0) AS queued, bytes FROM transfers "
        "WHERE run_id = $run AND kind = 'load_back'", _params(run)).fetchnumpy()
    p50, p99, bw50 = con.execute(
        f"SELECT {quantile_sql('t_end_ns - t_start_ns', 0.5)}, {quantile_sql('t_end_ns - t_start_ns', 0.99)}, "
        f"{quantile_sql('bytes * 1e9 / (t_end_ns - t_start_ns)', 0.5)} FROM transfers "
        "WHERE run_id = $run AND kind = 'load_back' AND t_end_ns > t_start_ns", _params(run)).fetchone()
    return Transfers(duration_ns=np.asarray(cols["dur"], dtype=float),
                     queued_ns=np.asarray(cols["queued"], dtype=float),
                     bytes=np.asarray(cols["bytes"], dtype=float),
                     link_bytes_per_s=link_peak_bytes_per_s(run),
                     p50_ns=None if p50 is None else float(p50), p99_ns=None if p99 is None else float(p99),
                     bw_p50_bytes_per_s=None if bw50 is None else float(bw50))


def load_decomposition(con: duckdb.DuckDBPyConnection, run: RunInfo, t0_ns: int | None = None) -> Decomposition:
    """TTFT parts, token sources and TTFT quantiles per arrival-time bin (bins from the first arrival)."""
    p = _params(run)
    _FINISHED = _DECOMPOSED  # noqa: N806 (observed runs have no split of TTFT: left out, not drawn as 0)
    means = ", ".join(f"avg({c}) AS {c}" for c in COMPONENTS)
    lo = run_start_ns(con, run) if t0_ns is None else t0_ns
    (hi,) = con.execute(f"SELECT max(arrival_ns) FROM requests WHERE {_FINISHED}", p).fetchone()
    hi = int(hi or lo)
    width = max((hi - lo) / DECOMP_BINS, 1.0)
    tokens = ", ".join(f"sum({expr}) AS tok_{part}" for part, expr in _TOKEN_EXPR.items())
    binned = con.execute(
        f"SELECT least(CAST(floor((arrival_ns - $lo) / $w) AS BIGINT), {DECOMP_BINS - 1}) AS b, count(*) AS n, "
        f"{means}, {tokens}, {quantile_sql('ttft_ns', 0.5)} AS p50, {quantile_sql('ttft_ns', 0.99)} AS p99 "
        f"FROM requests WHERE {_FINISHED} GROUP BY b ORDER BY b",
        {**p, "lo": lo, "w": width}).fetchnumpy()
    by_class_rows = con.execute(
        f"SELECT hit_class, count(*), {means} FROM requests WHERE {_FINISHED} GROUP BY ALL", p).fetchall()
    by_class = {r[0]: {c: float(v or 0) for c, v in zip(COMPONENTS, r[2:])} for r in by_class_rows}
    sums = con.execute(
        f"SELECT sum(ttft_ns), {', '.join(f'sum({c})' for c in COMPONENTS)} FROM requests WHERE {_FINISHED}",
        p).fetchone()
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


_TOKEN_EXPR = {"device": "device_hit_tokens", "host": "host_hit_tokens", "storage": "storage_hit_tokens",
               "new": "computed_tokens - coalesce(recomputed_tokens, 0)",
               "recomputed": "coalesce(recomputed_tokens, 0)"}


def _has_column(con: duckdb.DuckDBPyConnection, table: str, column: str) -> bool:
    return bool(con.execute(
        "SELECT count(*) FROM information_schema.columns WHERE table_name = ? AND column_name = ?",
        [table, column]).fetchone()[0])


def _binned_overlaps(con: duckdb.DuckDBPyConnection, intervals_sql: str, p: dict,
                     kinds: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Σ over intervals [t0, t1) of weight x times the interval's overlap with each of the $n
    time bins [$lo + b·$w, $lo + (b+1)·$w), divided by $w, per kind k of interval.

    Without a range join: the overlap integral up to an edge e is Σ_{t0<e} x·(e - t0) -
    Σ_{t1<e} x·(e - t1), so each end point only needs its bin's count and sum, then running
    totals over the bins (O(n) in the intervals, however many bins each one spans). A point a
    rounding error away from an edge lands in the neighbouring bin with a weight of ~0."""
    n, w = p["n"], p["w"]
    rows = con.execute(
        f"""WITH iv AS ({intervals_sql}), ends AS (
                SELECT k, x, t0 - $lo AS t, 1 AS side FROM iv WHERE t1 > t0
                UNION ALL SELECT k, x, t1 - $lo, -1 FROM iv WHERE t1 > t0)
            SELECT k, least(greatest(CAST(floor(t / $w) AS BIGINT), 0), $n) AS b,
                   sum(side * x), sum(side * x * t::DOUBLE)
            FROM ends GROUP BY ALL""", p).fetchall()
    out = {}
    edges = np.arange(n + 1, dtype=float) * w  # e_k - lo
    for kind in kinds:
        wsum = np.zeros(n + 2)
        tsum = np.zeros(n + 2)
        for k, b, xs, ts in rows:
            if k == kind:
                wsum[b + 1] += float(xs or 0.0)
                tsum[b + 1] += float(ts or 0.0)
        # running totals of the ends strictly before edge k: bins 0..k-1
        before_w, before_t = np.cumsum(wsum)[:n + 1], np.cumsum(tsum)[:n + 1]
        integral = before_w * edges - before_t
        out[kind] = np.maximum(np.diff(integral) / w, 0.0)  # never below 0 but by rounding
    return out


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
    p = {"run": run.run_id, "lo": lo, "w": width, "n": n}
    # The three phases of a finished request; first_token_ns - prefill_ns is its first batch's start.
    req = _binned_overlaps(con, f"""
        WITH r AS (SELECT arrival_ns, first_token_ns - prefill_ns AS started, first_token_ns, finish_ns,
                          input_tokens FROM requests WHERE {_FINISHED} AND prefill_ns IS NOT NULL)
        SELECT 'w' AS k, arrival_ns AS t0, started AS t1, input_tokens::DOUBLE AS x FROM r
        UNION ALL SELECT 't', arrival_ns, started, 1.0 FROM r
        UNION ALL SELECT 'p', started, first_token_ns, 1.0 FROM r
        UNION ALL SELECT 'd', first_token_ns, finish_ns, 1.0 FROM r""", p, ("w", "t", "p", "d"))
    # A batch's time: compute (new tokens, and recompute of once-cached ones where the run
    # recorded the split) plus the load-back stall it could not hide, plus other blocking.
    has_recompute = _has_column(con, "batches", "recompute_ns")
    recompute = "coalesce(recompute_ns, 0)" if has_recompute else "0"
    gpu = _binned_overlaps(con, f"""
        WITH iv AS (SELECT t_start_ns AS t0, t_end_ns AS t1, (t_end_ns - t_start_ns)::DOUBLE AS dur,
                           compute_ns - {recompute} AS new_ns, {recompute} AS rec_ns,
                           coalesce(loadback_exposed_ns, 0) AS lb_ns
                    FROM batches WHERE run_id = $run AND t_end_ns > t_start_ns)
        SELECT 'new' AS k, t0, t1, new_ns / dur AS x FROM iv
        UNION ALL SELECT 'rec', t0, t1, rec_ns / dur FROM iv
        UNION ALL SELECT 'lb', t0, t1, lb_ns / dur FROM iv
        UNION ALL SELECT 'other', t0, t1, greatest(dur - new_ns - rec_ns - lb_ns, 0) / dur FROM iv""", p,
        ("new", "rec", "lb", "other"))
    req = {"waiting": req["t"], "waiting_tokens": req["w"], "prefilling": req["p"], "decoding": req["d"],
           "b": np.arange(n)}
    gpu = {k: gpu[k] for k in ("new", "rec", "lb", "other")}
    # Decode: the union of the requests' decode intervals (first token -> finish), as islands of
    # overlapping intervals, each island's overlap with each bin (binned like the rest: no join).
    busy_decode = _binned_overlaps(con, f"""
        WITH d AS (SELECT first_token_ns AS t0, finish_ns AS t1 FROM requests
                   WHERE {_FINISHED} AND finish_ns > first_token_ns),
             m AS (SELECT t0, t1, max(t1) OVER (ORDER BY t0, t1 ROWS BETWEEN UNBOUNDED PRECEDING
                                                 AND 1 PRECEDING) AS reach FROM d),
             g AS (SELECT t0, t1, sum(CASE WHEN reach IS NULL OR t0 > reach THEN 1 ELSE 0 END)
                                  OVER (ORDER BY t0, t1 ROWS UNBOUNDED PRECEDING) AS island FROM m)
        SELECT 'u' AS k, min(t0) AS t0, max(t1) AS t1, 1.0::DOUBLE AS x FROM g GROUP BY island""", p, ("u",))["u"]
    (busy, num_batches) = con.execute(
        "SELECT sum(t_end_ns - t_start_ns), count(*) FROM batches WHERE run_id = $run", _params(run)).fetchone()
    f = lambda d, k: np.asarray(d[k], dtype=float)  # noqa: E731
    return LoadSeries(
        t_s=(np.asarray(req["b"], dtype=float) + 0.5) * width / 1e9, bin_s=width / 1e9,
        waiting=f(req, "waiting"), waiting_tokens=f(req, "waiting_tokens"), prefilling=f(req, "prefilling"),
        decoding=f(req, "decoding"), busy_new=f(gpu, "new"),
        busy_recompute=f(gpu, "rec") if has_recompute else None, busy_loadback=f(gpu, "lb"),
        busy_other=f(gpu, "other"), num_batches=int(num_batches or 0),
        prefill_busy_share=int(busy or 0) / (hi - lo), busy_decode=busy_decode,
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
