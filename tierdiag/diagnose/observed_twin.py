"""An observed run's replayed twin, and how well the twin reproduces it, request by request.

The twin is a replay of the trace the import wrote (`--trace-out`): the same requests, same ids,
through the reference engine with the server's cache sizes (observed.py's module doc)::

    observed (server)          replayed twin (engine)
    req 7: 2048 dev  512 host  req 7: 2048 dev  448 host   |diff| <= one page per tier -> match
           TTFT 240 ms                TTFT 205 ms          TTFT error -35 ms (-15 %)
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from tierdiag.diagnose.read.kind import view_of
from tierdiag.diagnose.quantile import quantile_sql
from tierdiag.diagnose.query import dataclass_json
from tierdiag.store.reader import RunInfo, list_runs
from tierdiag.units import fmt_ms, fmt_pct, share

# A twin found by request ids (not by the trace's sha256) must share at least this share of the
# observed requests, with the same input length each.
TWIN_MIN_SHARED = 0.9
# Page size when the replayed run does not record one (the engine's default, SGLang's too).
DEFAULT_PAGE_TOKENS = 64


# --------------------------------------------------------------------------- twin


@dataclass(frozen=True)
class Twin:
    run_id: str
    run_name: str
    matched_by: str  # trace_sha256 | request_ids
    num_shared: int  # observed requests also in the twin (same req_id)

    def describe(self) -> str:
        how = ("it replayed the trace this import wrote (same sha256)" if self.matched_by == "trace_sha256"
               else f"it holds {self.num_shared:,} of these requests with the same ids and input lengths")
        return f"replayed twin {self.run_name} ({self.run_id}): {how}"


def find_twin(con: duckdb.DuckDBPyConnection, run: RunInfo) -> Twin | None:
    """The newest complete replay of the same requests, if the database holds one."""
    replays = [r for r in list_runs(con) if view_of(r).engine_parts and r.run_id != run.run_id
               and r.status == "complete"]
    sha = run.config.get("trace_out_sha256")
    for r in reversed(replays):
        if sha and r.trace_sha256 == sha:
            return Twin(r.run_id, r.name, "trace_sha256", _shared(con, run.run_id, r.run_id))
    total = con.execute("SELECT count(*) FROM requests WHERE run_id = ?", [run.run_id]).fetchone()[0]
    for r in reversed(replays):
        n = _shared(con, run.run_id, r.run_id)
        if total and n >= TWIN_MIN_SHARED * total:
            return Twin(r.run_id, r.name, "request_ids", n)
    return None


def ranks_by_trace_out(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """sha256 of an observed run's `--trace-out` -> the data-parallel ranks its export named (config
    `dp_ranks`; the newest import of a trace wins): what a replay of that trace, its twin, takes as
    `--dp` when not told. Imports that named no rank are left out."""
    out: dict[str, int] = {}
    for r in list_runs(con):  # oldest first: a newer import of the same trace overwrites
        sha, n = r.config.get("trace_out_sha256"), r.config.get("dp_ranks")
        if not view_of(r).engine_parts and sha and isinstance(n, int) and not isinstance(n, bool) and n >= 1:
            out[sha] = n
    return out


def _shared(con: duckdb.DuckDBPyConnection, a: str, b: str) -> int:
    return int(con.execute(
        "SELECT count(*) FROM requests o JOIN requests r ON r.run_id = ? AND r.req_id = o.req_id "
        "AND r.input_tokens = o.input_tokens WHERE o.run_id = ?", [b, a]).fetchone()[0])


# --------------------------------------------------------------------------- agreement


@dataclass(frozen=True)
class RequestPair:
    req_id: str
    input_tokens: int | None
    observed_device_tokens: int | None
    observed_host_tokens: int | None
    observed_storage_tokens: int | None
    replayed_device_tokens: int | None
    replayed_host_tokens: int | None
    replayed_storage_tokens: int | None
    split_match: bool | None  # None: the observed split was not reported
    observed_ttft_ns: int | None
    replayed_ttft_ns: int | None
    ttft_error_ns: int | None  # replayed - observed
    ttft_rel_error: float | None  # (replayed - observed) / observed


@dataclass(frozen=True)
class TierTotals:
    device_tokens: int
    host_tokens: int
    storage_tokens: int
    computed_tokens: int


@dataclass(frozen=True)
class Agreement:
    """How well run B (replayed) reproduces run A (observed), request by request (same req_id)."""

    observed_run_id: str
    observed_run_name: str
    replayed_run_id: str
    replayed_run_name: str
    page_tokens: int
    num_observed: int
    num_replayed: int
    num_matched: int  # in both runs
    num_split_known: int  # matched, with a reported split
    num_split_match: int  # |observed - replayed| <= one page for device, host and storage
    split_match_share: float | None
    observed_tokens: TierTotals  # over the matched requests with a known split
    replayed_tokens: TierTotals
    num_ttft_pairs: int  # matched, TTFT on both sides
    ttft_abs_error_p50_ns: float | None
    ttft_abs_error_p90_ns: float | None
    ttft_rel_error_p50: float | None  # of |replayed - observed| / observed
    ttft_rel_error_p90: float | None
    ttft_bias_p50_ns: float | None  # median of replayed - observed (sign: + the engine is slower)
    requests: tuple[RequestPair, ...]  # the largest disagreements first (only when asked)

    def to_json(self) -> dict:
        return dataclass_json(self)

    def finding(self) -> str:
        """One paragraph, every figure from the fields above."""
        parts = [f"{self.num_matched:,} requests in both runs"]
        if self.num_observed - self.num_matched:
            parts.append(f"{self.num_observed - self.num_matched:,} only observed")
        if self.num_replayed - self.num_matched:
            parts.append(f"{self.num_replayed - self.num_matched:,} only replayed")
        text = ", ".join(parts) + "."
        if self.num_split_known:
            text += (f" The tier split matches within one page ({self.page_tokens} tokens per tier) for "
                     f"{self.num_split_match:,} of {self.num_split_known:,} ({fmt_pct(self.split_match_share)}).")
        else:
            text += " The observed run reports no tier split to compare."
        if self.num_ttft_pairs:
            text += (f" TTFT error over {self.num_ttft_pairs:,} requests: median {fmt_ms(self.ttft_abs_error_p50_ns)} "
                     f"({fmt_pct(self.ttft_rel_error_p50)}), p90 {fmt_ms(self.ttft_abs_error_p90_ns)} "
                     f"({fmt_pct(self.ttft_rel_error_p90)}); the replay is "
                     f"{'slower' if (self.ttft_bias_p50_ns or 0) > 0 else 'faster' if (self.ttft_bias_p50_ns or 0) < 0 else 'neither faster nor slower'}"
                     f" by a median {fmt_ms(abs(self.ttft_bias_p50_ns or 0))}.")
        else:
            text += " No request has a TTFT in both runs."
        return text


def page_tokens(*runs: RunInfo) -> int:
    for r in runs:
        value = r.config.get("page_size")
        if value:
            return int(value)
    return DEFAULT_PAGE_TOKENS


_PAIRS = """
    WITH p AS (
        SELECT o.req_id, o.input_tokens,
               o.device_hit_tokens AS od, o.host_hit_tokens AS oh, o.storage_hit_tokens AS os,
               o.computed_tokens AS oc,
               r.device_hit_tokens AS rd, r.host_hit_tokens AS rh, r.storage_hit_tokens AS rs,
               r.computed_tokens AS rc,
               o.ttft_ns AS ot, r.ttft_ns AS rt, o.seq
        FROM requests o JOIN requests r ON r.run_id = $b AND r.req_id = o.req_id
        WHERE o.run_id = $a),
    q AS (
        SELECT *, CASE WHEN od IS NULL OR rd IS NULL THEN NULL
                       ELSE abs(od - rd) <= $page AND abs(coalesce(oh, 0) - coalesce(rh, 0)) <= $page
                            AND abs(coalesce(os, 0) - coalesce(rs, 0)) <= $page END AS split_match,
               CASE WHEN ot IS NOT NULL AND rt IS NOT NULL THEN rt - ot END AS err
        FROM p)
"""


def _named(con: duckdb.DuckDBPyConnection, sql: str, params: dict) -> list[dict]:
    """Rows as dicts, with DuckDB's named parameters ($name) — fetch_dicts takes positional ones."""
    cur = con.execute(sql, params)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


def agreement(con: duckdb.DuckDBPyConnection, observed: RunInfo, replayed: RunInfo, *,
              top: int | None = None) -> Agreement:
    """Per-request agreement of `replayed` with `observed`; `top` pairs listed, worst first."""
    page = page_tokens(replayed, observed)
    params = {"a": observed.run_id, "b": replayed.run_id, "page": page}
    # Percentiles by nearest rank (quantile.py), as every view: each is one request's error.
    agg = _named(con, _PAIRS + f"""
        SELECT count(*) AS matched,
               count(split_match) AS split_known, count(*) FILTER (WHERE split_match) AS split_match,
               coalesce(sum(od) FILTER (WHERE split_match IS NOT NULL), 0) AS od,
               coalesce(sum(oh) FILTER (WHERE split_match IS NOT NULL), 0) AS oh,
               coalesce(sum(os) FILTER (WHERE split_match IS NOT NULL), 0) AS os,
               coalesce(sum(oc) FILTER (WHERE split_match IS NOT NULL), 0) AS oc,
               coalesce(sum(rd) FILTER (WHERE split_match IS NOT NULL), 0) AS rd,
               coalesce(sum(rh) FILTER (WHERE split_match IS NOT NULL), 0) AS rh,
               coalesce(sum(rs) FILTER (WHERE split_match IS NOT NULL), 0) AS rs,
               coalesce(sum(rc) FILTER (WHERE split_match IS NOT NULL), 0) AS rc,
               count(err) AS ttft_pairs,
               {quantile_sql("abs(err)", 0.5)} AS abs50, {quantile_sql("abs(err)", 0.9)} AS abs90,
               {quantile_sql("abs(err) / ot", 0.5)} FILTER (WHERE ot > 0) AS rel50,
               {quantile_sql("abs(err) / ot", 0.9)} FILTER (WHERE ot > 0) AS rel90,
               {quantile_sql("err", 0.5)} AS bias50
        FROM q""", params)[0]
    counts = dict(con.execute("SELECT run_id, count(*) FROM requests WHERE run_id IN (?, ?) GROUP BY run_id",
                              [observed.run_id, replayed.run_id]).fetchall())
    pairs: tuple[RequestPair, ...] = ()
    if top:
        rows = _named(con, _PAIRS + """
            SELECT * FROM q
            ORDER BY split_match NULLS LAST, abs(err) DESC NULLS LAST, seq, req_id LIMIT $top""",
                           {**params, "top": int(top)})
        pairs = tuple(RequestPair(
            req_id=r["req_id"], input_tokens=r["input_tokens"], observed_device_tokens=r["od"],
            observed_host_tokens=r["oh"], observed_storage_tokens=r["os"], replayed_device_tokens=r["rd"],
            replayed_host_tokens=r["rh"], replayed_storage_tokens=r["rs"], split_match=r["split_match"],
            observed_ttft_ns=r["ot"], replayed_ttft_ns=r["rt"], ttft_error_ns=r["err"],
            ttft_rel_error=r["err"] / r["ot"] if r["err"] is not None and r["ot"] else None) for r in rows)
    i = lambda k: int(agg.get(k) or 0)  # noqa: E731
    return Agreement(
        observed_run_id=observed.run_id, observed_run_name=observed.name, replayed_run_id=replayed.run_id,
        replayed_run_name=replayed.name, page_tokens=page, num_observed=int(counts.get(observed.run_id, 0)),
        num_replayed=int(counts.get(replayed.run_id, 0)), num_matched=i("matched"),
        num_split_known=i("split_known"), num_split_match=i("split_match"),
        split_match_share=share(i("split_match"), i("split_known")),
        observed_tokens=TierTotals(i("od"), i("oh"), i("os"), i("oc")),
        replayed_tokens=TierTotals(i("rd"), i("rh"), i("rs"), i("rc")),
        num_ttft_pairs=i("ttft_pairs"), ttft_abs_error_p50_ns=agg.get("abs50"),
        ttft_abs_error_p90_ns=agg.get("abs90"), ttft_rel_error_p50=agg.get("rel50"),
        ttft_rel_error_p90=agg.get("rel90"), ttft_bias_p50_ns=agg.get("bias50"), requests=pairs)


