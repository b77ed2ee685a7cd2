"""Everything the HTML report shows, read from one run in the store (DuckDB only, no torch).

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

from tierdiag.diagnose.causes import cause_sql, excess_sql
from tierdiag.diagnose.explain import Explanation, explain_request
from tierdiag.diagnose.query import link_peak_bytes_per_s
from tierdiag.diagnose.slow import SlowRequest, slow_requests
from tierdiag.store.reader import RunInfo

# Past this many finished requests the per-request scatter keeps the slowest ones plus an
# even, deterministic sample of the rest (scattergl stays fluid well past this).
MAX_SCATTER_POINTS = 20_000
SLOWEST_ALWAYS_KEPT = 2_000
# Occupancy / bandwidth lines: raw samples up to this many per tier, else max per time bin.
MAX_LINE_POINTS = 4_000
TIME_BINS = 1_000
DECOMP_BINS = 60

CLASSES = ("device_hit", "tiered_hit", "miss")
# TTFT decomposition columns, in the order they are stacked (sum == ttft_ns per request).
COMPONENTS = ("queue_ns", "storage_wait_ns", "loadback_exposed_ns", "recompute_ns", "compute_ns")

_FINISHED = "run_id = $run AND status = 'finished'"
_DECOMPOSED = _FINISHED + " AND compute_ns IS NOT NULL"


@dataclass(frozen=True)
class ClassTTFT:
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
    num_requests: int
    num_finished: int
    num_rejected: int
    input_tokens: int
    device_tokens: int
    host_tokens: int
    storage_tokens: int
    computed_tokens: int
    recomputed_tokens: int
    loadback_bytes: int
    loadback_ns: int  # summed link time of all load-backs
    loadback_exposed_ns: int
    num_loadbacks: int  # requests that loaded something back
    skipped_loadbacks: dict[str, int]  # reason -> requests
    skipped_loadback_tokens: int
    evictions: dict[str, int]  # "device demote" -> count
    evicted_tokens: dict[str, int]  # tier -> tokens
    span_ns: int  # first arrival -> last finish (virtual time)
    ttft: tuple[ClassTTFT, ...]  # "all" first, then present classes in CLASSES order
    # "all" / class -> tokens by where they came from: device, host, storage, new, recomputed
    tier_split: dict[str, dict[str, int]]

    @property
    def num_skipped_loadbacks(self) -> int:
        return sum(self.skipped_loadbacks.values())

    @property
    def num_evictions(self) -> int:
        return sum(self.evictions.values())

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
    t_min_s: float
    t_max_s: float


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

    @property
    def achieved_bytes_per_s(self) -> np.ndarray:
        ok = self.duration_ns > 0
        return self.bytes[ok] / (self.duration_ns[ok] / 1e9)


@dataclass(frozen=True)
class Decomposition:
    """Mean TTFT per component, over arrival-time bins and per class (ns)."""

    bin_t_s: np.ndarray  # arrival bin centres
    bin_count: np.ndarray
    bin_mean_ns: dict[str, np.ndarray]  # component -> mean per request in the bin
    by_class: dict[str, dict[str, float]]  # class -> component -> mean ns
    class_count: dict[str, int]
    total_share: dict[str, float]  # component -> share of the run's summed TTFT


@dataclass(frozen=True)
class SlowCached:
    """One of the slowest cached requests: its `slow` row and its `explain` verdict."""

    request: SlowRequest
    explanation: Explanation


def _params(run: RunInfo) -> dict[str, Any]:
    return {"run": run.run_id}


def _num(v: Any) -> int:
    return int(v) if v is not None else 0


def load_headline(con: duckdb.DuckDBPyConnection, run: RunInfo) -> Headline:
    p = _params(run)
    row = con.execute(
        """
        SELECT count(*),
               count(*) FILTER (WHERE status = 'finished'),
               count(*) FILTER (WHERE status = 'rejected'),
               sum(input_tokens) FILTER (WHERE status = 'finished'),
               sum(device_hit_tokens) FILTER (WHERE status = 'finished'),
               sum(host_hit_tokens) FILTER (WHERE status = 'finished'),
               sum(storage_hit_tokens) FILTER (WHERE status = 'finished'),
               sum(computed_tokens) FILTER (WHERE status = 'finished'),
               sum(recomputed_tokens) FILTER (WHERE status = 'finished'),
               sum(loadback_bytes), sum(loadback_ns), sum(loadback_exposed_ns),
               count(*) FILTER (WHERE loadback_bytes > 0),
               sum(loadback_skipped_tokens),
               min(arrival_ns), max(coalesce(finish_ns, first_token_ns, arrival_ns))
        FROM requests WHERE run_id = $run
        """, p).fetchone()
    (n, nf, nr, inp, dev, host, sto, comp, recomp, lb_bytes, lb_ns, lb_exp, n_lb, skipped_tok,
     t_first, t_last) = row
    skipped = dict(con.execute(
        "SELECT loadback_skipped_reason, count(*) FROM requests "
        "WHERE run_id = $run AND loadback_skipped_reason IS NOT NULL GROUP BY ALL ORDER BY 1", p).fetchall())
    ev_rows = con.execute(
        "SELECT tier, action, count(*), sum(tokens) FROM evictions WHERE run_id = $run "
        "GROUP BY ALL ORDER BY 1, 2", p).fetchall()
    evictions = {f"{tier} {action}": int(c) for tier, action, c, _ in ev_rows}
    evicted_tokens: dict[str, int] = {}
    for tier, _action, _c, tok in ev_rows:
        evicted_tokens[tier] = evicted_tokens.get(tier, 0) + _num(tok)
    return Headline(
        num_requests=_num(n), num_finished=_num(nf), num_rejected=_num(nr), input_tokens=_num(inp),
        device_tokens=_num(dev), host_tokens=_num(host), storage_tokens=_num(sto),
        computed_tokens=_num(comp), recomputed_tokens=_num(recomp), loadback_bytes=_num(lb_bytes),
        loadback_ns=_num(lb_ns), loadback_exposed_ns=_num(lb_exp), num_loadbacks=_num(n_lb),
        skipped_loadbacks={str(k): int(v) for k, v in skipped.items()},
        skipped_loadback_tokens=_num(skipped_tok), evictions=evictions, evicted_tokens=evicted_tokens,
        span_ns=_num(t_last) - _num(t_first) if t_first is not None else 0,
        ttft=load_ttft_by_class(con, run), tier_split=load_tier_split(con, run),
    )


TIER_PARTS = ("device", "host", "storage", "new", "recomputed")


def load_tier_split(con: duckdb.DuckDBPyConnection, run: RunInfo) -> dict[str, dict[str, int]]:
    """Token-weighted split of the input, for the whole run ("all") and per class.

    Computed tokens are split into genuinely new ones and recomputed ones (cached once, then
    evicted or skipped): the second kind is the cache's fault, the first is not.
    """
    rows = con.execute(
        f"""
        SELECT coalesce(hit_class, 'all'), sum(device_hit_tokens), sum(host_hit_tokens),
               sum(storage_hit_tokens), sum(computed_tokens - coalesce(recomputed_tokens, 0)),
               sum(coalesce(recomputed_tokens, 0))
        FROM requests WHERE {_FINISHED}
        GROUP BY GROUPING SETS ((hit_class), ())
        """, _params(run)).fetchall()
    found = {r[0]: dict(zip(TIER_PARTS, (_num(v) for v in r[1:]))) for r in rows}
    return {c: found[c] for c in ("all",) + CLASSES if c in found}


def load_ttft_by_class(con: duckdb.DuckDBPyConnection, run: RunInfo) -> tuple[ClassTTFT, ...]:
    rows = con.execute(
        f"""
        SELECT coalesce(hit_class, 'all') AS cls, count(*),
               quantile_cont(ttft_ns, [0.01, 0.25, 0.5, 0.75, 0.99]), avg(ttft_ns)
        FROM requests WHERE {_FINISHED}
        GROUP BY GROUPING SETS ((hit_class), ())
        """, _params(run)).fetchall()
    # A run without finished requests still has the grand-total row, with no quantiles.
    found = {cls: ClassTTFT(cls, int(c), *(float(x) for x in q), float(mean))
             for cls, c, q, mean in rows if c}
    order = ("all",) + CLASSES
    return tuple(found[c] for c in order if c in found)


def _time_range(con: duckdb.DuckDBPyConnection, run: RunInfo) -> tuple[int, int]:
    lo, hi = con.execute(
        """
        SELECT min(t), max(t) FROM (
            SELECT t_ns AS t FROM pool_samples WHERE run_id = $run
            UNION ALL SELECT arrival_ns FROM requests WHERE run_id = $run
            UNION ALL SELECT finish_ns FROM requests WHERE run_id = $run
            UNION ALL SELECT t_end_ns FROM transfers WHERE run_id = $run AND kind = 'load_back')
        """, _params(run)).fetchone()
    lo = int(lo or 0)
    hi = int(hi or 0)
    return lo, max(hi, lo + 1)


def load_timeline(con: duckdb.DuckDBPyConnection, run: RunInfo) -> Timeline:
    lo, hi = _time_range(con, run)
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
        pools.append(PoolSeries(tier=tier, t_s=np.asarray(cols["t"], dtype=float) / 1e9,
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
        marks.append(EvictionMarks(tier=str(tier), t_s=np.asarray(ev["t"][m], dtype=float) / 1e9,
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
    bw_t_s = (lo + (np.asarray(bw["b"], dtype=float) + 0.5) * width_ns) / 1e9
    bw_rate = np.asarray(bw["total"], dtype=float) / (width_ns / 1e9)
    return Timeline(pools=tuple(pools), evictions=tuple(marks), bin_s=width_ns / 1e9, bw_t_s=bw_t_s,
                    bw_bytes_per_s=bw_rate, t_min_s=lo / 1e9, t_max_s=hi / 1e9)


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
        cause=np.asarray(cols["cause"], dtype=object), total=int(total), sampled=sampled)


def load_transfers(con: duckdb.DuckDBPyConnection, run: RunInfo) -> Transfers:
    cols = con.execute(
        "SELECT t_end_ns - t_start_ns AS dur, coalesce(queued_ns, 0) AS queued, bytes FROM transfers "
        "WHERE run_id = $run AND kind = 'load_back'", _params(run)).fetchnumpy()
    return Transfers(duration_ns=np.asarray(cols["dur"], dtype=float),
                     queued_ns=np.asarray(cols["queued"], dtype=float),
                     bytes=np.asarray(cols["bytes"], dtype=float),
                     link_bytes_per_s=link_peak_bytes_per_s(run))


def load_decomposition(con: duckdb.DuckDBPyConnection, run: RunInfo) -> Decomposition:
    p = _params(run)
    _FINISHED = _DECOMPOSED  # noqa: N806 (observed runs have no split of TTFT: left out, not drawn as 0)
    means = ", ".join(f"avg({c}) AS {c}" for c in COMPONENTS)
    lo, hi = con.execute(f"SELECT min(arrival_ns), max(arrival_ns) FROM requests WHERE {_FINISHED}", p).fetchone()
    lo, hi = int(lo or 0), int(hi or 0)
    width = max((hi - lo) / DECOMP_BINS, 1.0)
    binned = con.execute(
        f"SELECT least(CAST(floor((arrival_ns - $lo) / $w) AS BIGINT), {DECOMP_BINS - 1}) AS b, count(*) AS n, "
        f"{means} FROM requests WHERE {_FINISHED} GROUP BY b ORDER BY b",
        {**p, "lo": lo, "w": width}).fetchnumpy()
    by_class_rows = con.execute(
        f"SELECT hit_class, count(*), {means} FROM requests WHERE {_FINISHED} GROUP BY ALL", p).fetchall()
    by_class = {r[0]: {c: float(v or 0) for c, v in zip(COMPONENTS, r[2:])} for r in by_class_rows}
    sums = con.execute(
        f"SELECT sum(ttft_ns), {', '.join(f'sum({c})' for c in COMPONENTS)} FROM requests WHERE {_FINISHED}",
        p).fetchone()
    total = float(sums[0] or 0)
    return Decomposition(
        bin_t_s=(lo + (np.asarray(binned["b"], dtype=float) + 0.5) * width) / 1e9,
        bin_count=np.asarray(binned["n"], dtype=float),
        bin_mean_ns={c: np.asarray(binned[c], dtype=float) for c in COMPONENTS},
        by_class={c: by_class[c] for c in CLASSES if c in by_class},
        class_count={r[0]: int(r[1]) for r in by_class_rows},
        total_share={c: (float(v or 0) / total if total else 0.0) for c, v in zip(COMPONENTS, sums[1:])},
    )


def load_slowest_cached(con: duckdb.DuckDBPyConnection, run: RunInfo, *, limit: int = 20) -> list[SlowCached]:
    """Cached requests (device or tiered hit) with the largest excess TTFT, each explained.

    The ranking is `slow`'s (one rule for "slow" everywhere), taken per cached class and merged.
    """
    if run.kind == "observed":  # no engine TTFT parts to rank or explain by (diagnose/observed.py)
        return []
    rows = [r for cls in ("device_hit", "tiered_hit") for r in slow_requests(con, run, top=limit, hit_class=cls)]
    rows.sort(key=lambda r: (-r.excess_ns, r.seq if r.seq is not None else -1, r.req_id))
    from tierdiag.diagnose.advice import propose
    from tierdiag.diagnose.context import run_context

    ctx = run_context(con, run, attribution=False) if rows else None  # the run's evidence once, not once per request
    advice = propose(ctx) if ctx is not None else None
    return [SlowCached(r, explain_request(con, run, r.req_id, run_ctx=ctx, advice=advice)) for r in rows[:limit]]


@dataclass(frozen=True)
class ReportData:
    run: RunInfo
    headline: Headline
    timeline: Timeline
    points: RequestPoints
    transfers: Transfers
    decomposition: Decomposition
    slowest: tuple[SlowCached, ...]
    diagnosis: Any = None  # advice.RunDiagnosis: the run's root cause and advice (summary's)


def load_report_data(con: duckdb.DuckDBPyConnection, run: RunInfo, *, slowest: int = 20) -> ReportData:
    return ReportData(run=run, headline=load_headline(con, run), timeline=load_timeline(con, run),
                      points=load_points(con, run), transfers=load_transfers(con, run),
                      decomposition=load_decomposition(con, run),
                      slowest=tuple(load_slowest_cached(con, run, limit=slowest)),
                      diagnosis=_load_diagnosis(con, run))


def _load_diagnosis(con: duckdb.DuckDBPyConnection, run: RunInfo):
    from tierdiag.diagnose.summary import run_summary

    return run_summary(con, run).diagnosis
