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

from tierdiag.diagnose.read import observed as read_obs
from tierdiag.diagnose.read.kind import view_of
from tierdiag.diagnose.read.query import dataclass_json
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
            return Twin(r.run_id, r.name, "trace_sha256", read_obs.shared_requests(con, run.run_id, r.run_id))
    total = read_obs.request_count(con, run.run_id)
    for r in reversed(replays):
        n = read_obs.shared_requests(con, run.run_id, r.run_id)
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


def agreement(con: duckdb.DuckDBPyConnection, observed: RunInfo, replayed: RunInfo, *,
              top: int | None = None) -> Agreement:
    """Per-request agreement of `replayed` with `observed`; `top` pairs listed, worst first."""
    page = page_tokens(replayed, observed)
    agg = read_obs.pair_totals(con, observed.run_id, replayed.run_id, page)
    counts = read_obs.request_counts(con, observed.run_id, replayed.run_id)
    pairs: tuple[RequestPair, ...] = ()
    if top:
        pairs = tuple(RequestPair(
            req_id=r.req_id, input_tokens=r.input_tokens, observed_device_tokens=r.observed_device_tokens,
            observed_host_tokens=r.observed_host_tokens, observed_storage_tokens=r.observed_storage_tokens,
            replayed_device_tokens=r.replayed_device_tokens, replayed_host_tokens=r.replayed_host_tokens,
            replayed_storage_tokens=r.replayed_storage_tokens, split_match=r.split_match,
            observed_ttft_ns=r.observed_ttft_ns, replayed_ttft_ns=r.replayed_ttft_ns, ttft_error_ns=r.ttft_error_ns,
            ttft_rel_error=r.ttft_error_ns / r.observed_ttft_ns
            if r.ttft_error_ns is not None and r.observed_ttft_ns else None)
            for r in read_obs.worst_pairs(con, observed.run_id, replayed.run_id, page, top))
    return Agreement(
        observed_run_id=observed.run_id, observed_run_name=observed.name, replayed_run_id=replayed.run_id,
        replayed_run_name=replayed.name, page_tokens=page, num_observed=int(counts.get(observed.run_id, 0)),
        num_replayed=int(counts.get(replayed.run_id, 0)), num_matched=agg.matched,
        num_split_known=agg.split_known, num_split_match=agg.split_match,
        split_match_share=share(agg.split_match, agg.split_known),
        observed_tokens=TierTotals(agg.observed_device_tokens, agg.observed_host_tokens, agg.observed_storage_tokens,
                                   agg.observed_computed_tokens),
        replayed_tokens=TierTotals(agg.replayed_device_tokens, agg.replayed_host_tokens, agg.replayed_storage_tokens,
                                   agg.replayed_computed_tokens),
        num_ttft_pairs=agg.ttft_pairs, ttft_abs_error_p50_ns=agg.ttft_abs_error_p50_ns,
        ttft_abs_error_p90_ns=agg.ttft_abs_error_p90_ns, ttft_rel_error_p50=agg.ttft_rel_error_p50,
        ttft_rel_error_p90=agg.ttft_rel_error_p90, ttft_bias_p50_ns=agg.ttft_bias_p50_ns, requests=pairs)


