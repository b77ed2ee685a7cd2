"""`explain`: the troubleshooting order (DESIGN.md §2) for one request, as a typed result.

Every request gets the same four steps, in this order, then the verdict::

    1 host_hit_length   where its tokens came from: device / host / storage / computed
    2 prefix_indices    usable prefix vs. the device original; cache_protected_len beside it
    3 load_back         bytes, time, bandwidth vs. peak, exposed / overlapped / queued,
                        load-back rate around it, counterfactuals
    4 eviction          which evictions took its prefix, by whose allocation, pool state then,
                        and whether the device pool was thrashing
    verdict             primary cause of the excess TTFT (causes.py) + a plain-language answer

Reads the run store only, a handful of small queries filtered on run_id (+ req_id), so it
answers in milliseconds on a 12k-request run.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from tierdiag.diagnose import claims as C
from tierdiag.diagnose.causes import NONE_TOLERANCE_PCT, TtftParts
from tierdiag.diagnose.context import (
    QueueAttribution,
    RequestContext,
    RunContext,
    compute_run_context,
    queue_attribution,
    request_context,
)
from tierdiag.diagnose.query import dataclass_json, fetch_dicts, fetch_one, link_peak_bytes_per_s
from tierdiag.units import (
    NS_PER_S,
    fmt_bandwidth,
    fmt_bytes,
    fmt_ms,
    fmt_pct,
    fmt_rate,
    fmt_tokens,
    ns_to_ms,
    share,
)
from tierdiag.errors import NotFoundError
from tierdiag.store.reader import RunInfo

# Rates "around the request" are counted over [arrival - WINDOW, first token + WINDOW].
WINDOW_NS = 1 * NS_PER_S
# A load-back below this share of the link's peak is called slow, and then told why.
SLOW_LINK_SHARE = 0.5
# Below this many bytes per contiguous run, per-transfer overhead dominates ("small").
SMALL_RUN_BYTES = 1 << 20
# Fewer pages than this per contiguous run is "fragmented".
FRAGMENTED_PAGES_PER_RUN = 4
# Thrashing: at least this share of the tokens the device pool evicted were asked for again,
# and evictions around this request ran at least as fast as over the whole run.
THRASH_REREFERENCED_SHARE = 0.5


# --------------------------------------------------------------------------- typed result


@dataclass(frozen=True)
class TokenSplit:
    input_tokens: int
    device_tokens: int
    host_tokens: int
    storage_tokens: int
    computed_tokens: int
    recomputed_tokens: int

    @property
    def new_tokens(self) -> int:
        return self.computed_tokens - self.recomputed_tokens

    @property
    def reused_tokens(self) -> int:
        return self.device_tokens + self.host_tokens + self.storage_tokens

    def label(self) -> str:
        """What the request mostly was, from its own token shares: its hit class says only which
        tiers it touched (a `device_hit` can be 3 % device and 96 % recomputed), so the verdict
        names it by its largest part instead."""
        n = self.input_tokens
        if n <= 0:
            return "no input tokens"
        if self.reused_tokens == 0 and self.recomputed_tokens == 0:
            return "a miss: all new tokens"
        parts = ((self.device_tokens, "on the device"), (self.host_tokens, "loaded back from host"),
                 (self.storage_tokens, "fetched from storage"), (self.recomputed_tokens, "recomputed"),
                 (self.new_tokens, "new"))
        tokens, words = max(parts, key=lambda p: p[0])  # a tie goes to the earlier (cheaper) part
        if tokens == n:
            return f"all {words}"
        how = "mostly" if tokens * 2 > n else "largest part"
        return f"{how} {words}: {fmt_pct(tokens / n)} of its input"

    def to_json(self) -> dict:
        return {"input": self.input_tokens, "device": self.device_tokens, "host": self.host_tokens,
                "storage": self.storage_tokens, "computed": self.computed_tokens,
                "recomputed": self.recomputed_tokens, "new": self.new_tokens}


@dataclass(frozen=True)
class HostHitEvidence:
    hit_class: str | None
    input_tokens: int
    device_hit_tokens: int
    host_hit_length: int  # host tokens loaded back and used (SGLang's name)
    storage_hit_tokens: int
    computed_tokens: int
    recomputed_tokens: int
    new_tokens: int
    host_match_tokens: int
    storage_match_tokens: int
    loadback_skipped_reason: str | None
    loadback_skipped_tokens: int
    storage_skipped_reason: str | None
    load_back_threshold_tokens: int | None


@dataclass(frozen=True)
class PrefixEvidence:
    prefix_indices_len: int
    device_original_tokens: int
    restored_tokens: int
    restored_share: float | None
    cache_protected_len: int
    extend_input_len: int


@dataclass(frozen=True)
class TransferRow:
    """Times (t_start_ns, t_end_ns) since the run's first arrival, as every view's clock."""

    transfer_id: int
    kind: str
    t_start_ns: int
    t_end_ns: int
    pages: int
    runs: int
    bytes: int
    queued_ns: int | None
    wall_ns: int | None


@dataclass(frozen=True)
class LoadBackEvidence:
    loaded_tokens: int
    loadback_bytes: int
    loadback_pages: int
    loadback_runs: int
    loadback_ns: int
    achieved_bytes_per_s: float | None
    link_peak_bytes_per_s: float | None
    link_peak_share: float | None
    small_transfer: bool
    fragmented: bool
    exposed_ns: int
    overlapped_ns: int
    queued_ns: int
    storage_bytes: int
    storage_fetch_ns: int
    storage_wait_ns: int
    window_ns: int
    window_loadbacks: int
    window_loadback_bytes: int
    window_loadbacks_per_s: float | None
    run_loadbacks_per_s: float | None
    window_loadback_bytes_per_s: float | None
    run_loadback_bytes_per_s: float | None
    ttft_ns: int | None
    ttft_if_device_resident_ns: int | None
    recompute_instead_ns: int | None
    transfers: tuple[TransferRow, ...]


@dataclass(frozen=True)
class EvictionEvent:
    eviction_id: int
    t_ns: int  # since the run's first arrival
    tier: str
    action: str
    node_tokens: int
    prefix_tokens: int  # of this request's prefix
    cause_req_id: str | None
    owner_req_id: str | None
    pool_used_tokens: int | None
    pool_capacity_tokens: int | None
    pool_used_share: float | None
    locked_tokens: int | None


@dataclass(frozen=True)
class EvictionEvidence:
    num_events: int
    device_evicted_tokens: int  # of its prefix, pushed off the device (demoted + dropped)
    demoted_tokens: int
    dropped_tokens: int
    host_deleted_tokens: int
    evicted_by: tuple[str, ...]
    events: tuple[EvictionEvent, ...]
    device_capacity_tokens: int | None
    host_capacity_tokens: int | None
    # Compared with the pools the prefix fell out of: device, plus host when host deleted it.
    compared_capacity_tokens: int | None
    reuse_distance_tokens: int | None
    reuse_distance_share: float | None  # reuse distance / compared capacity
    window_ns: int
    window_device_evictions: int
    window_device_evicted_tokens: int
    window_device_evictions_per_s: float | None
    run_device_evictions_per_s: float | None
    rereferenced_share: float | None
    thrashing: bool


@dataclass(frozen=True)
class Step:
    step: int
    name: str
    finding: str
    evidence: HostHitEvidence | PrefixEvidence | LoadBackEvidence | EvictionEvidence

    def to_json(self) -> dict:
        return {"step": self.step, "name": self.name, "finding": self.finding,
                "evidence": dataclass_json(self.evidence)}


@dataclass(frozen=True)
class Decomposition:
    """TTFT = queue + storage_wait + loadback_exposed + recompute + compute (ns)."""

    ttft_ns: int
    ideal_ttft_ns: int
    excess_ns: int
    queue_ns: int
    storage_wait_ns: int
    loadback_exposed_ns: int
    recompute_ns: int
    compute_ns: int

    def shares_of_ttft(self) -> dict[str, float | None]:
        return {
            "queueing": share(self.queue_ns, self.ttft_ns),
            "storage_fetch": share(self.storage_wait_ns, self.ttft_ns),
            "load_back": share(self.loadback_exposed_ns, self.ttft_ns),
            "recompute": share(self.recompute_ns, self.ttft_ns),
            "compute": share(self.compute_ns, self.ttft_ns),
        }

    def to_json(self) -> dict:
        d = dataclass_json(self)
        d["share_of_ttft"] = self.shares_of_ttft()
        return d


@dataclass(frozen=True)
class Explanation:
    run_id: str
    run_name: str
    req_id: str
    seq: int | None
    status: str
    reject_reason: str | None
    hit_class: str | None
    arrival_ns: int | None  # since the run's first arrival (run_start_ns), like every time below
    ttft_ns: int | None
    tokens: TokenSplit
    steps: tuple[Step, ...]
    primary_cause: str | None
    headline: str
    verdict: str
    decomposition: Decomposition | None
    ttft_if_device_resident_ns: int | None
    recompute_instead_ns: int | None
    evicted_by: tuple[str, ...]
    ttft_if_never_evicted_ns: int | None = None
    context: RequestContext | None = None
    queue_attribution: QueueAttribution | None = None
    advice: tuple = ()  # advice.Advice items (the run's, verified for this request when measured)
    claims: tuple[C.Claim, ...] = ()  # the verdict's sentences after its first, in order
    # The run's first arrival in the store's virtual time: where the times above count from (a
    # trace sliced from a longer one starts late); add it back to match the store's *_ns columns.
    run_start_ns: int = 0

    def to_json(self) -> dict:
        """DESIGN.md §3 `explain --json`, extended (run_name, status, verdict, decomposition...) and
        §5 (context, queue_attribution_ms, advice)."""
        return {
            "run_id": self.run_id,
            "req_id": self.req_id,
            "class": self.hit_class,
            "ttft_ms": ns_to_ms(self.ttft_ns),
            "tokens": self.tokens.to_json(),
            "steps": [s.to_json() for s in self.steps],
            "primary_cause": self.primary_cause,
            "counterfactual": {
                "ttft_if_device_resident_ms": ns_to_ms(self.ttft_if_device_resident_ns),
                "recompute_instead_ms": ns_to_ms(self.recompute_instead_ns),
                "ttft_if_never_evicted_ms": ns_to_ms(self.ttft_if_never_evicted_ns),
            },
            "evicted_by": list(self.evicted_by),
            "run_name": self.run_name,
            "seq": self.seq,
            "status": self.status,
            "reject_reason": self.reject_reason,
            "arrival_ms": ns_to_ms(self.arrival_ns),
            "run_start_ms": ns_to_ms(self.run_start_ns),
            "headline": self.headline,
            "verdict": self.verdict,
            "decomposition": self.decomposition.to_json() if self.decomposition else None,
            "context": self.context.to_json() if self.context else None,
            "queue_attribution_ms": self.queue_attribution.to_json() if self.queue_attribution else None,
            "advice": [a.to_json() for a in self.advice],
            "claims": [c.to_json() for c in self.claims],
        }


# --------------------------------------------------------------------------- queries


def _int(row: dict, key: str) -> int:
    return int(row.get(key) or 0)


def _plural(count: int, word: str) -> str:
    return f"{count:,} {word}{'' if count == 1 else ('es' if word.endswith(('s', 'ch')) else 's')}"


def _finished(row: dict) -> bool:
    return (row.get("status") or "finished") == "finished" and row.get("ttft_ns") is not None


def _close_ids(con: duckdb.DuckDBPyConnection, run_id: str, req_id: str) -> list[str]:
    import difflib  # only on this error path: keep explain's start-up lean

    ids = [r[0] for r in con.execute("SELECT req_id FROM requests WHERE run_id = ?", [run_id]).fetchall()]
    close = difflib.get_close_matches(req_id, ids, n=3, cutoff=0.6)
    if not close:
        # Ids are often numbers (trace line numbers): a case or whitespace slip still matches.
        wanted = req_id.strip().lower()
        close = [i for i in ids if i.lower() == wanted][:3]
    return close


def _request_row(con: duckdb.DuckDBPyConnection, run: RunInfo, req_id: str) -> dict:
    row = fetch_one(con, "SELECT * FROM requests WHERE run_id = ? AND req_id = ?", [run.run_id, req_id])
    if row is not None:
        return row
    close = _close_ids(con, run.run_id, req_id)
    hint = f"did you mean {', '.join(close)}?" if close else "list requests with `tierdiag slow`"
    raise NotFoundError(f"no request {req_id!r} in run {run.run_id} ({run.name})", hint=hint)


@dataclass(frozen=True)
class RunTotals:
    """The run-wide numbers a request is compared with: the run's bounds (where every view's
    clock starts), its load-backs and its device evictions. Stored with the run at its close
    (diagnose/evidence.py), else computed by `run_totals`."""

    start_ns: int
    end_ns: int
    loadbacks: int
    loadback_bytes: int
    device_evictions: int
    device_evicted_tokens: int
    device_rereferenced_tokens: int  # of those, tokens some request later came back for

    @property
    def bounds(self) -> tuple[int, int]:
        return self.start_ns, self.end_ns


def run_totals(con: duckdb.DuckDBPyConnection, run_id: str) -> RunTotals:
    start, end = run_bounds_ns(con, run_id)
    lb = con.execute("SELECT count(*), coalesce(sum(bytes), 0) FROM transfers WHERE run_id = ? AND kind = 'load_back'",
                     [run_id]).fetchone()
    dev = con.execute(
        "SELECT count(*), coalesce(sum(tokens), 0), "
        "       coalesce(sum(tokens) FILTER (WHERE eviction_id IN "
        "           (SELECT eviction_id FROM request_evictions WHERE run_id = ?)), 0) "
        "FROM evictions WHERE run_id = ? AND tier = 'device'", [run_id, run_id]).fetchone()
    return RunTotals(start_ns=start, end_ns=end, loadbacks=int(lb[0] or 0), loadback_bytes=int(lb[1] or 0),
                     device_evictions=int(dev[0] or 0), device_evicted_tokens=int(dev[1] or 0),
                     device_rereferenced_tokens=int(dev[2] or 0))


def run_bounds(con: duckdb.DuckDBPyConnection, run: RunInfo) -> tuple[int, int]:
    """`run_bounds_ns`, from the evidence stored with the run where it is there."""
    from tierdiag.diagnose.evidence import stored_evidence

    stored = stored_evidence(con, run)
    totals = stored.totals() if stored is not None else None
    return totals.bounds if totals is not None else run_bounds_ns(con, run.run_id)


def run_bounds_ns(con: duckdb.DuckDBPyConnection, run_id: str) -> tuple[int, int]:
    """First arrival and last finish of the run (virtual time): its span, where every view's
    clock starts (`summary`'s span_ms is the difference)."""
    row = con.execute(
        "SELECT min(arrival_ns), max(coalesce(finish_ns, first_token_ns, arrival_ns)) "
        "FROM requests WHERE run_id = ?", [run_id]).fetchone()
    if row is None or row[0] is None:
        return 0, 0
    return int(row[0]), max(int(row[1]), int(row[0]))


# When a request was scheduled (its first prefill batch started): match_prefix, load-back and
# the evictions its allocation forced happen then, not at arrival.
_SCHEDULED_SQL = "coalesce(first_token_ns - prefill_ns, arrival_ns)"


def _scheduled_ns(row: dict) -> int:
    if row.get("first_token_ns") is not None and row.get("prefill_ns") is not None:
        return int(row["first_token_ns"]) - int(row["prefill_ns"])
    return _int(row, "arrival_ns")


def _window(row: dict, bounds: tuple[int, int]) -> tuple[int, int]:
    """[scheduled - WINDOW, first token + WINDOW], clipped to the run so rates compare fairly.

    Centred on when it was served, not on its arrival: a request that queued for minutes would
    otherwise average the link and the pool over all of that wait.
    """
    start = _scheduled_ns(row)
    end = max(int(row.get("first_token_ns") or start), start)
    return max(start - WINDOW_NS, bounds[0]), max(min(end + WINDOW_NS, bounds[1]), end)


def _per_s(count: float, span_ns: int) -> float | None:
    return count * NS_PER_S / span_ns if span_ns > 0 else None


# --------------------------------------------------------------------------- step 1


def _step_host_hit(row: dict, tokens: TokenSplit, run: RunInfo) -> Step:
    threshold = run.config.get("load_back_threshold")
    ev = HostHitEvidence(
        hit_class=row.get("hit_class"), input_tokens=tokens.input_tokens,
        device_hit_tokens=tokens.device_tokens, host_hit_length=tokens.host_tokens,
        storage_hit_tokens=tokens.storage_tokens, computed_tokens=tokens.computed_tokens,
        recomputed_tokens=tokens.recomputed_tokens, new_tokens=tokens.new_tokens,
        host_match_tokens=_int(row, "host_match_tokens"),
        storage_match_tokens=_int(row, "storage_match_tokens"),
        loadback_skipped_reason=row.get("loadback_skipped_reason"),
        loadback_skipped_tokens=_int(row, "loadback_skipped_tokens"),
        storage_skipped_reason=row.get("storage_skipped_reason"),
        load_back_threshold_tokens=int(threshold) if threshold is not None else None,
    )
    t = tokens
    cls = ev.hit_class
    if not _finished(row):
        finding = (f"rejected ({row.get('reject_reason') or 'no reason recorded'}): it was never "
                   f"scheduled, so none of its {fmt_tokens(t.input_tokens)} tokens used the cache.")
        return Step(1, "host_hit_length", finding, ev)
    if cls == "device_hit":
        finding = (f"device hit: {fmt_tokens(t.reused_tokens)} of {fmt_tokens(t.input_tokens)} tokens "
                   f"reused, all device-resident (host_hit_length 0); {fmt_tokens(t.computed_tokens)} computed.")
    elif cls == "tiered_hit":
        finding = (f"tiered hit: {fmt_tokens(t.reused_tokens)} of {fmt_tokens(t.input_tokens)} tokens "
                   f"reused: {fmt_tokens(t.device_tokens)} device-resident, {fmt_tokens(t.host_tokens)} "
                   f"loaded back from host (host_hit_length {fmt_tokens(t.host_tokens)}), "
                   f"{fmt_tokens(t.storage_tokens)} fetched from storage; "
                   f"{fmt_tokens(t.computed_tokens)} computed.")
    else:
        finding = f"miss: nothing was reused; all {fmt_tokens(t.computed_tokens)} tokens were computed."
    skipped = _skip_sentence(ev)
    if skipped:
        finding += " " + skipped
    if t.recomputed_tokens:
        why = C.recompute_reasons(row, ev.load_back_threshold_tokens, 0, bool(run.config.get("storage_tokens")))
        finding += (f" {fmt_tokens(t.recomputed_tokens)} of the computed tokens had been cached before and were "
                    f"recomputed: {'; '.join(why)}.")
    return Step(1, "host_hit_length", finding, ev)


def _skip_sentence(ev: HostHitEvidence) -> str:
    parts = []
    if ev.loadback_skipped_reason:
        why = {
            "below_threshold": (f"shorter than load_back_threshold {fmt_tokens(ev.load_back_threshold_tokens)}"
                                if ev.load_back_threshold_tokens is not None else "below load_back_threshold"),
            "device_full": "device memory could not be freed for it",
        }.get(ev.loadback_skipped_reason, ev.loadback_skipped_reason)
        parts.append(f"Load-back skipped ({ev.loadback_skipped_reason}): a {fmt_tokens(ev.loadback_skipped_tokens)}-token "
                     f"host part was found ({why}), so it was recomputed, not counted as a hit.")
    if ev.storage_skipped_reason:
        parts.append(f"Storage part of {fmt_tokens(ev.storage_match_tokens)} tokens not used "
                     f"({ev.storage_skipped_reason}).")
    return " ".join(parts)


# --------------------------------------------------------------------------- step 2


def _step_prefix(row: dict, tokens: TokenSplit) -> Step:
    pil = _int(row, "prefix_indices_len")
    device = tokens.device_tokens
    restored = max(pil - device, 0)
    ev = PrefixEvidence(prefix_indices_len=pil, device_original_tokens=device, restored_tokens=restored,
                        restored_share=share(restored, pil), cache_protected_len=_int(row, "cache_protected_len"),
                        extend_input_len=_int(row, "extend_input_len"))
    if pil == 0:
        finding = (f"no usable prefix: prefix_indices is empty (cache_protected_len "
                   f"{fmt_tokens(ev.cache_protected_len)}); extend_input_len {fmt_tokens(ev.extend_input_len)}.")
    else:
        finding = (f"usable prefix {fmt_tokens(pil)} tokens = {fmt_tokens(device)} device original + "
                   f"{fmt_tokens(restored)} restored by load-back ({fmt_pct(ev.restored_share)} restored); "
                   f"cache_protected_len {fmt_tokens(ev.cache_protected_len)}; "
                   f"extend_input_len {fmt_tokens(ev.extend_input_len)}.")
        if ev.cache_protected_len != pil:
            finding += " cache_protected_len differs from the usable view."
    return Step(2, "prefix_indices", finding, ev)


# --------------------------------------------------------------------------- step 3


def _step_load_back(con: duckdb.DuckDBPyConnection, run: RunInfo, row: dict, tokens: TokenSplit,
                    totals: RunTotals) -> Step:
    bounds = totals.bounds
    lo, hi = _window(row, bounds)
    span_ns = bounds[1] - bounds[0]
    rid = run.run_id
    # A request's load-backs and prefetches start between its arrival and its finish (a
    # prefetch at arrival, a load-back when its batch is formed): bounding the scan by that lets
    # DuckDB skip the row groups of the rest of the run (~50 -> ~10 ms on a million requests).
    # tests/diagnose/test_claims.py checks the bound on the demo run and the Mooncake traces.
    t_lo = int(row["arrival_ns"]) if row.get("arrival_ns") is not None else None
    t_hi = row.get("finish_ns")
    transfers = tuple(
        TransferRow(transfer_id=int(t["transfer_id"] or 0), kind=t["kind"],
                    t_start_ns=int(t["t_start_ns"] or 0) - bounds[0], t_end_ns=int(t["t_end_ns"] or 0) - bounds[0],
                    pages=int(t["pages"] or 0), runs=int(t["runs"] or 0),
                    bytes=int(t["bytes"] or 0), queued_ns=t["queued_ns"], wall_ns=t["wall_ns"])
        for t in fetch_dicts(
            con,
            "SELECT transfer_id, kind, t_start_ns, t_end_ns, pages, runs, bytes, queued_ns, wall_ns "
            "FROM transfers WHERE run_id = ? AND req_id = ? AND kind IN ('load_back', 'prefetch') "
            "AND (? IS NULL OR t_start_ns >= ?) AND (? IS NULL OR t_start_ns <= ?) "
            "ORDER BY t_start_ns, transfer_id", [rid, row["req_id"], t_lo, t_lo, t_hi, t_hi]))
    stats = con.execute(
        "SELECT count(*), coalesce(sum(bytes), 0) FROM transfers "
        "WHERE run_id = ? AND kind = 'load_back' AND t_end_ns >= ? AND t_start_ns <= ?", [rid, lo, hi]).fetchone()
    win_n, win_bytes = (int(x or 0) for x in stats)
    run_n, run_bytes = totals.loadbacks, totals.loadback_bytes
    window_span = hi - lo

    lb_bytes = _int(row, "loadback_bytes")
    lb_ns = _int(row, "loadback_ns")
    pages = _int(row, "loadback_pages")
    runs = _int(row, "loadback_runs")
    exposed = _int(row, "loadback_exposed_ns")
    peak = link_peak_bytes_per_s(run)
    achieved = lb_bytes * NS_PER_S / lb_ns if lb_bytes and lb_ns else None
    peak_share = share(achieved, peak)
    small = bool(lb_bytes) and runs > 0 and lb_bytes / runs < SMALL_RUN_BYTES
    fragmented = runs > 1 and pages / runs < FRAGMENTED_PAGES_PER_RUN
    ev = LoadBackEvidence(
        loaded_tokens=tokens.host_tokens + tokens.storage_tokens, loadback_bytes=lb_bytes,
        loadback_pages=pages, loadback_runs=runs, loadback_ns=lb_ns, achieved_bytes_per_s=achieved,
        link_peak_bytes_per_s=peak, link_peak_share=peak_share, small_transfer=small, fragmented=fragmented,
        exposed_ns=exposed, overlapped_ns=max(lb_ns - exposed, 0), queued_ns=_int(row, "loadback_queued_ns"),
        storage_bytes=_int(row, "storage_bytes"), storage_fetch_ns=_int(row, "storage_fetch_ns"),
        storage_wait_ns=_int(row, "storage_wait_ns"), window_ns=window_span, window_loadbacks=win_n,
        window_loadback_bytes=win_bytes, window_loadbacks_per_s=_per_s(win_n, window_span),
        run_loadbacks_per_s=_per_s(run_n, span_ns), window_loadback_bytes_per_s=_per_s(win_bytes, window_span),
        run_loadback_bytes_per_s=_per_s(run_bytes, span_ns), ttft_ns=row.get("ttft_ns"),
        ttft_if_device_resident_ns=row.get("ttft_if_device_resident_ns"),
        recompute_instead_ns=row.get("recompute_instead_ns"), transfers=transfers,
    )
    return Step(3, "load_back", _load_back_finding(ev, row), ev)


def _load_back_finding(ev: LoadBackEvidence, row: dict) -> str:
    rate = (f"Around it (±{WINDOW_NS // NS_PER_S} s): {_plural(ev.window_loadbacks, 'load-back')}, "
            f"{fmt_rate(ev.window_loadbacks_per_s)} vs {fmt_rate(ev.run_loadbacks_per_s)} over the run.")
    if not ev.loaded_tokens and not ev.loadback_bytes:
        if row.get("loadback_skipped_reason"):
            head = (f"no load-back: the {fmt_tokens(_int(row, 'loadback_skipped_tokens'))}-token host part "
                    f"was skipped ({row['loadback_skipped_reason']}) and recomputed in "
                    f"{fmt_ms(_int(row, 'recompute_ns'))}.")
        else:
            head = "no load-back: nothing it reused was off the device."
        return f"{head} {rate}"
    parts = [f"loaded back {fmt_tokens(ev.loaded_tokens)} tokens ({fmt_bytes(ev.loadback_bytes)}) in "
             f"{fmt_ms(ev.loadback_ns)}"]
    if ev.achieved_bytes_per_s is not None:
        bw = f"at {fmt_bandwidth(ev.achieved_bytes_per_s)}"
        if ev.link_peak_bytes_per_s:
            bw += f" ({fmt_pct(ev.link_peak_share)} of the {fmt_bandwidth(ev.link_peak_bytes_per_s)} link peak)"
        parts.append(bw)
    text = " ".join(parts)
    why = []
    if ev.small_transfer:
        why.append(f"small transfers: {fmt_bytes(ev.loadback_bytes / max(ev.loadback_runs, 1))} per "
                   f"contiguous run, per-transfer overhead dominates")
    if ev.fragmented:
        why.append(f"fragmented: {ev.loadback_runs:,} runs for {ev.loadback_pages:,} pages")
    if why and (ev.link_peak_share is None or ev.link_peak_share < SLOW_LINK_SHARE or ev.fragmented):
        text += " — " + "; ".join(why)
    text += (f". {fmt_ms(ev.exposed_ns)} exposed, {fmt_ms(ev.overlapped_ns)} overlapped with prefill "
             f"compute, {fmt_ms(ev.queued_ns)} queued behind other load-backs.")
    if ev.storage_bytes or ev.storage_wait_ns:
        text += (f" Storage: fetched {fmt_bytes(ev.storage_bytes)} in {fmt_ms(ev.storage_fetch_ns)}, "
                 f"held back {fmt_ms(ev.storage_wait_ns)} waiting for it.")
    text += " " + rate
    if ev.ttft_if_device_resident_ns is not None:
        text += (f" Had the prefix been device-resident: TTFT {fmt_ms(ev.ttft_if_device_resident_ns)} "
                 f"(actual {fmt_ms(ev.ttft_ns)}); recomputing it instead: {fmt_ms(ev.recompute_instead_ns)}.")
    return text


# --------------------------------------------------------------------------- step 4


def _step_eviction(con: duckdb.DuckDBPyConnection, run: RunInfo, row: dict, tokens: TokenSplit,
                   totals: RunTotals) -> Step:
    rid = run.run_id
    bounds = totals.bounds
    rows = fetch_dicts(
        con,
        "SELECT e.eviction_id, e.t_ns, e.tier, e.action, e.tokens, re.tokens AS prefix_tokens, "
        "       e.cause_req_id, e.owner_req_id, e.pool_used_tokens, e.pool_capacity_tokens, "
        "       e.locked_tokens, e.node_last_access_ns "
        "FROM request_evictions re JOIN evictions e "
        "  ON e.run_id = re.run_id AND e.eviction_id = re.eviction_id "
        "WHERE re.run_id = ? AND re.req_id = ? ORDER BY e.t_ns, e.eviction_id", [rid, row["req_id"]])
    events = tuple(
        EvictionEvent(
            eviction_id=int(e["eviction_id"]), t_ns=int(e["t_ns"] or 0) - bounds[0], tier=e["tier"], action=e["action"],
            node_tokens=int(e["tokens"] or 0), prefix_tokens=int(e["prefix_tokens"] or 0),
            cause_req_id=e["cause_req_id"], owner_req_id=e["owner_req_id"],
            pool_used_tokens=e["pool_used_tokens"], pool_capacity_tokens=e["pool_capacity_tokens"],
            pool_used_share=share(e["pool_used_tokens"], e["pool_capacity_tokens"]),
            locked_tokens=e["locked_tokens"])
        for e in rows)
    accesses = [int(e["node_last_access_ns"]) for e in rows if e["node_last_access_ns"] is not None]
    last_access = max(accesses) if accesses else None
    evicted_by = tuple(dict.fromkeys(
        e.cause_req_id for e in events if e.cause_req_id is not None and e.cause_req_id != row["req_id"]))

    def pool_size(tier: str) -> int | None:
        size = run.config.get(f"{tier}_tokens")
        if size is None:
            size = next((e.pool_capacity_tokens for e in events if e.tier == tier), None)
        return int(size) if size is not None else None

    capacity, host_capacity = pool_size("device"), pool_size("host")
    compared = capacity
    if capacity is not None and host_capacity and any(e.tier != "device" for e in events):
        compared = capacity + host_capacity
    reuse_distance = None
    if last_access is not None and row.get("arrival_ns") is not None:
        # Tokens the device pool had to allocate for other requests scheduled between the
        # prefix's last use and this request's scheduling: the LRU stack distance, roughly.
        # Beyond the pool size an LRU pool cannot have kept it; well below it, something else
        # (locks, bursts) pushed it out.
        reuse_distance = int(con.execute(
            "SELECT coalesce(sum(input_tokens - coalesce(device_hit_tokens, 0) + output_tokens), 0) "
            f"FROM requests WHERE run_id = ? AND status = 'finished' AND {_SCHEDULED_SQL} > ? "
            f"AND {_SCHEDULED_SQL} < ?", [rid, int(last_access), _scheduled_ns(row)]).fetchone()[0])

    lo, hi = _window(row, bounds)
    span_ns = bounds[1] - bounds[0]
    dev = con.execute(
        "SELECT count(*), coalesce(sum(tokens), 0) FROM evictions "
        "WHERE run_id = ? AND tier = 'device' AND t_ns BETWEEN ? AND ?", [rid, lo, hi]).fetchone()
    win_n, win_tokens = (int(x or 0) for x in dev)
    run_n, run_tokens, reref_tokens = (totals.device_evictions, totals.device_evicted_tokens,
                                       totals.device_rereferenced_tokens)
    window_rate = _per_s(win_n, hi - lo)
    run_rate = _per_s(run_n, span_ns)
    reref = share(reref_tokens, run_tokens)
    thrashing = (win_n > 0 and reref is not None and reref >= THRASH_REREFERENCED_SHARE
                 and (run_rate is None or (window_rate or 0) >= run_rate))

    by_action = {"demote": 0, "drop": 0, "delete": 0}
    for e in events:
        by_action[e.action] = by_action.get(e.action, 0) + e.prefix_tokens
    ev = EvictionEvidence(
        num_events=len(events), device_evicted_tokens=by_action["demote"] + by_action["drop"],
        demoted_tokens=by_action["demote"], dropped_tokens=by_action["drop"],
        host_deleted_tokens=by_action["delete"],
        evicted_by=evicted_by, events=events,
        device_capacity_tokens=capacity, host_capacity_tokens=host_capacity, compared_capacity_tokens=compared,
        reuse_distance_tokens=reuse_distance, reuse_distance_share=share(reuse_distance, compared),
        window_ns=hi - lo, window_device_evictions=win_n, window_device_evicted_tokens=win_tokens,
        window_device_evictions_per_s=window_rate, run_device_evictions_per_s=run_rate,
        rereferenced_share=reref, thrashing=thrashing,
    )
    return Step(4, "eviction", _eviction_finding(ev, row, tokens), ev)


def _eviction_finding(ev: EvictionEvidence, row: dict, tokens: TokenSplit) -> str:
    pool = (f"Device pool around it (±{WINDOW_NS // NS_PER_S} s): {_plural(ev.window_device_evictions, 'eviction')}, "
            f"{fmt_rate(ev.window_device_evictions_per_s)} vs {fmt_rate(ev.run_device_evictions_per_s)} "
            f"over the run; {fmt_pct(ev.rereferenced_share)} of the tokens it evicted were asked for again")
    pool += " — thrashing." if ev.thrashing else "."
    if not ev.events:
        if not _finished(row):
            head = "not scheduled, so no eviction is involved."
        elif tokens.host_tokens or tokens.storage_tokens:
            head = ("its prefix was off the device but no recorded eviction took it (it reached "
                    "host/storage without being evicted from this request's path).")
        elif tokens.recomputed_tokens:
            head = (f"{fmt_tokens(tokens.recomputed_tokens)} once-cached tokens were recomputed, "
                    f"but no recorded eviction names them.")
        elif tokens.device_tokens:
            head = "its prefix was device-resident: no eviction had taken it."
        else:
            head = "nothing of it had been cached, so nothing was evicted."
        return f"{head} {pool}"
    first = ev.events[0]
    actions = []
    if ev.demoted_tokens:
        actions.append(f"{fmt_tokens(ev.demoted_tokens)} demoted to host")
    if ev.dropped_tokens:
        actions.append(f"{fmt_tokens(ev.dropped_tokens)} dropped from device")
    if ev.host_deleted_tokens:
        actions.append(f"{fmt_tokens(ev.host_deleted_tokens)} deleted from host/storage")
    moved = (f"pushed {fmt_tokens(ev.device_evicted_tokens)} tokens of its prefix off the device"
             if ev.device_evicted_tokens else "touched its prefix")
    by = ", ".join(ev.evicted_by[:8]) + (f" and {len(ev.evicted_by) - 8} more" if len(ev.evicted_by) > 8 else "")
    text = (f"{_plural(ev.num_events, 'eviction event')} {moved} "
            f"({', '.join(actions)}), the first at t = {fmt_ms(first.t_ns)} (since the run's first arrival)")
    if by:
        text += f", forced by the allocations of request{'s' if len(ev.evicted_by) > 1 else ''} {by}"
    if first.pool_capacity_tokens:
        text += (f" ({first.tier} pool {fmt_pct(first.pool_used_share)} full: "
                 f"{fmt_tokens(first.pool_used_tokens)} of {fmt_tokens(first.pool_capacity_tokens)} tokens, "
                 f"{fmt_tokens(first.locked_tokens)} locked)")
    text += "."
    if ev.reuse_distance_tokens is not None and ev.compared_capacity_tokens:
        pools = (f"a {fmt_tokens(ev.device_capacity_tokens)}-token device pool"
                 if ev.compared_capacity_tokens == ev.device_capacity_tokens
                 else f"{fmt_tokens(ev.compared_capacity_tokens)} tokens of device + host pools")
        verdict = ("pools of this size could not have kept it under LRU"
                   if ev.reuse_distance_tokens > ev.compared_capacity_tokens
                   else "it fit, so pressure (locks, bursts) pushed it out")
        text += f" Reuse distance {fmt_tokens(ev.reuse_distance_tokens)} tokens vs {pools}: {verdict}."
    return f"{text} {pool}"


# --------------------------------------------------------------------------- verdict


_CAUSE_PART = {"queueing": "queue_ns", "load_back": "loadback_exposed_ns", "storage_fetch": "storage_wait_ns",
               "recompute": "recompute_ns", "compute": "compute_ns"}


@dataclass(frozen=True)
class VerdictInputs:
    """What the verdict's claims are built from: the row and the typed evidence around it."""

    row: dict
    tokens: TokenSplit
    parts: TtftParts | None
    cause: str | None
    steps: tuple[Step, ...]
    context: RequestContext | None
    attribution: QueueAttribution | None
    run: RunContext | None
    threshold: int | None
    storage_tier: bool


def _claims(v: VerdictInputs) -> tuple[C.Claim, ...]:
    """The verdict after its first sentence: the primary cause's claim, then the claims every
    request with such numbers gets (its wait, its recompute, evictors, counterfactuals, break-even)."""
    row, tokens, parts, cause = v.row, v.tokens, v.parts, v.cause
    lb: LoadBackEvidence = v.steps[2].evidence  # type: ignore[assignment]
    evs: EvictionEvidence = v.steps[3].evidence  # type: ignore[assignment]
    ttft = parts.ttft_ns
    out: list[C.Claim] = []

    cause_claim = {
        "none": lambda: C.none_claim(NONE_TOLERANCE_PCT),
        "load_back": lambda: C.load_back_claim(row, lb.loaded_tokens, tokens.reused_tokens, lb.loadback_bytes,
                                               lb.loadback_ns, lb.achieved_bytes_per_s),
        "storage_fetch": lambda: C.storage_fetch_claim(row, lb.storage_bytes),
        "compute": lambda: C.compute_claim(row, tokens.new_tokens, parts.excess_parts_ns()["compute"]),
    }.get(cause)
    if cause_claim is not None:
        out.append(cause_claim())
    # Its wait, when it is the cause or a sizeable part of TTFT.
    if parts.queue_ns and (cause == "queueing" or share(parts.queue_ns, ttft) >= 0.2):
        out.append(C.queue_claim(row, v.attribution, v.context, C.loss_why(v.run)))
    if tokens.recomputed_tokens:
        out.append(C.recompute_claim(row, v.threshold, evs.host_deleted_tokens, v.storage_tier))
    if evs.evicted_by and (tokens.recomputed_tokens or tokens.host_tokens or tokens.storage_tokens):
        out.append(C.evicted_by_claim(evs.evicted_by, {e.tier for e in evs.events}, evs.thrashing))
    for claim in (C.counterfactual_claim(row), C.break_even_claim(row, lb.link_peak_share, lb.achieved_bytes_per_s)):
        if claim is not None:
            out.append(claim)
    return tuple(out)


def _verdict(v: VerdictInputs) -> tuple[str, str, tuple[C.Claim, ...]]:
    row, tokens, parts, cause = v.row, v.tokens, v.parts, v.cause
    req = row["req_id"]
    if parts is None or cause is None:
        reason = row.get("reject_reason") or "no reason recorded"
        return (f"rejected: {reason}",
                f"Request {req} was rejected ({reason}) and never produced a first token; there is no "
                f"TTFT to explain.", ())
    ttft, ideal, excess = parts.ttft_ns, parts.ideal_ttft_ns, parts.excess_ns
    short = C.cache_context(tokens, short=True)
    base = (f"Request {req} ({tokens.label()}) took {fmt_ms(ttft)} to its first token against an ideal of "
            f"{fmt_ms(ideal)} (excess {fmt_ms(excess)}); {C.cache_context(tokens)}.")
    part_ns = parts.excess_parts_ns()["compute"] if cause == "compute" else (
        getattr(parts, _CAUSE_PART[cause]) if cause != "none" else 0)
    pct = fmt_pct(share(part_ns, ttft))
    lb: LoadBackEvidence = v.steps[2].evidence  # type: ignore[assignment]
    if cause == "none":
        headline = f"none: TTFT within {NONE_TOLERANCE_PCT} % of its ideal; {short}"
    elif cause == "queueing":
        doing = C.queue_is_the_caches_doing(v.attribution, v.context)
        headline = (f"queueing: {pct} of TTFT; " +
                    ("the queue was the cache's doing (recompute of lost prefixes ahead of it)" if doing else short))
    elif cause == "load_back":
        headline = f"load_back: {pct} of TTFT was exposed load-back of {fmt_tokens(lb.loaded_tokens)} tokens"
    elif cause == "storage_fetch":
        headline = (f"storage_fetch: {pct} of TTFT waiting for {fmt_tokens(_int(row, 'storage_match_tokens'))} "
                    f"tokens from storage")
    elif cause == "recompute":
        headline = f"recompute: {pct} of TTFT recomputing {fmt_tokens(tokens.recomputed_tokens)} once-cached tokens"
    else:
        headline = f"compute: {pct} of TTFT was new-token compute beyond its ideal; {short}"
    claims = _claims(v)
    return headline, " ".join([base] + [c.text for c in claims]), claims


def _context_sentence(ctx: RequestContext | None) -> str:
    if ctx is None:
        return ""
    return (f" Prefill GPU from {C.CONTEXT_LOOKBACK_NS // NS_PER_S} s before its arrival to its first token: "
            f"{fmt_pct(ctx.prefill_busy_share)} busy over {_plural(ctx.num_batches, 'batch')}, "
            f"{fmt_pct(ctx.recompute_share_of_prefill)} of its compute recomputing once-cached tokens; "
            f"{fmt_tokens(ctx.queue_depth_at_arrival)} requests queued ahead of it at arrival.")


# --------------------------------------------------------------------------- entry point


def explain_request(con: duckdb.DuckDBPyConnection, run: RunInfo, req_id: str, *,
                    run_ctx: RunContext | None = None, advice: tuple | None = None) -> Explanation:
    """Walk the troubleshooting order for `req_id` in `run`; NotFoundError if it is not there.

    `run_ctx` / `advice`: the run's context and advice when the caller already has them (the
    report explains several requests of one run); computed here otherwise.
    """
    from dataclasses import replace

    from tierdiag.diagnose.advice import propose, verified_advice

    req_id = str(req_id)
    row = _request_row(con, run, req_id)
    tokens = TokenSplit(
        input_tokens=_int(row, "input_tokens"), device_tokens=_int(row, "device_hit_tokens"),
        host_tokens=_int(row, "host_hit_tokens"), storage_tokens=_int(row, "storage_hit_tokens"),
        computed_tokens=_int(row, "computed_tokens"), recomputed_tokens=_int(row, "recomputed_tokens"))
    # The run-wide numbers: stored with the run at its close (evidence.py), else from its rows.
    from tierdiag.diagnose.evidence import stored_evidence

    stored = stored_evidence(con, run)
    totals = stored.totals() if stored is not None else None
    if totals is None:
        totals = run_totals(con, run.run_id)
    if run_ctx is None and stored is not None:
        run_ctx = stored.context(run)
    if run_ctx is None:
        run_ctx = compute_run_context(con, run, attribution=False)
    bounds = totals.bounds
    finished = _finished(row)
    ctx = request_context(con, run.run_id, row, bounds[0]) if finished else None
    attribution = queue_attribution(con, run.run_id, row) if finished else None
    steps = (
        _step_host_hit(row, tokens, run),
        _step_prefix(row, tokens),
        _step_load_back(con, run, row, tokens, totals),
        _step_eviction(con, run, row, tokens, totals),
    )
    # Context in step 3 (the load-back rate around it) and the run's "why" in step 4.
    steps = (steps[0], steps[1], replace(steps[2], finding=steps[2].finding + _context_sentence(ctx)),
             steps[3])
    why = C.loss_why(run_ctx) if tokens.recomputed_tokens or tokens.host_tokens or tokens.storage_tokens else None
    if why:
        steps = steps[:3] + (replace(steps[3], finding=f"{steps[3].finding} For context, {why}."),)
    parts = TtftParts.from_row(row) if finished else None
    cause = parts.primary_cause() if parts is not None else None
    headline, verdict, claims = _verdict(VerdictInputs(
        row=row, tokens=tokens, parts=parts, cause=cause, steps=steps, context=ctx, attribution=attribution,
        run=run_ctx, threshold=run.config.get("load_back_threshold"),
        storage_tier=bool(run.config.get("storage_tokens"))))
    decomposition = None
    if parts is not None:
        decomposition = Decomposition(
            ttft_ns=parts.ttft_ns, ideal_ttft_ns=parts.ideal_ttft_ns, excess_ns=parts.excess_ns,
            queue_ns=parts.queue_ns, storage_wait_ns=parts.storage_wait_ns,
            loadback_exposed_ns=parts.loadback_exposed_ns, recompute_ns=parts.recompute_ns,
            compute_ns=parts.compute_ns)
    if advice is None:
        advice = propose(run_ctx)
    advice = verified_advice(con, run, advice, req_id)
    evicted_by: tuple[str, ...] = steps[3].evidence.evicted_by  # type: ignore[union-attr]
    return Explanation(
        run_id=run.run_id, run_name=run.name, req_id=req_id,
        seq=row.get("seq"), status=row.get("status") or "finished", reject_reason=row.get("reject_reason"),
        hit_class=row.get("hit_class"),
        arrival_ns=int(row["arrival_ns"]) - bounds[0] if row.get("arrival_ns") is not None else None,
        ttft_ns=row.get("ttft_ns"),
        tokens=tokens, steps=steps, primary_cause=cause, headline=headline, verdict=verdict,
        decomposition=decomposition, ttft_if_device_resident_ns=row.get("ttft_if_device_resident_ns"),
        recompute_instead_ns=row.get("recompute_instead_ns"), evicted_by=evicted_by,
        ttft_if_never_evicted_ns=C.never_evicted_ns(row) if finished else None,
        context=replace(ctx, window_start_ns=ctx.window_start_ns - bounds[0]) if ctx is not None else None,
        queue_attribution=attribution, advice=tuple(advice), claims=claims, run_start_ns=bounds[0],
    )
