"""The system around every request: the run-level evidence `summary`'s diagnosis, `explain`'s
"why" and the advice rules stand on (DESIGN §5). One `RunContext` per run, from its rows:

* the run's prefill busy share and recompute share of prefill compute (`batches`);
* the queue attribution of context.py summed over every finished request (`_run_attribution`);
* `LossEvidence`: why once-cached tokens were recomputed (skipped, unused storage matches,
  removed from every tier, their reuse distance against the pools);
* `TransferEvidence`: the load-backs against the link's peak and against recomputing them;
* `RunStory` (story.py): the requests' own verdicts, weighted by their excess TTFT;
* `Capacity` (capacity.py): the offered prefill against the GPU over sliding windows;
* `RoutingLoss` (routing_loss.py): a data-parallel run's once-cached tokens lost to routing.

Stored with the run at its close (evidence.py) and read through facts.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import duckdb

from tierdiag.diagnose.run.capacity import Capacity, run_capacity
from tierdiag.diagnose.run.context_rows import ContextRows
from tierdiag.diagnose.run.eviction_rows import EvictionResults
from tierdiag.diagnose.request.context import ATTRIBUTION_KEYS, WaitPart, round_exact
from tierdiag.diagnose.read.query import dataclass_json, link_peak_bytes_per_s
from tierdiag.diagnose.dp.routing_loss import RoutingLoss, routing_loss
from tierdiag.diagnose.run.story import RunStory, run_story, sorted_unique
from tierdiag.diagnose.run.miss_reasons import run_miss_reasons
from tierdiag.units import NS_PER_S, ns_to_ms, share
from tierdiag.diagnose.read import run_context as read_ctx
from tierdiag.diagnose.read.run_scan import RunScan
from tierdiag.diagnose.read.run import parse


# A removed node whose pages had been hit at least this often is "hot".
HOT_HIT_COUNT = 3


@dataclass(frozen=True)
class LossEvidence:
    """Why once-cached tokens were recomputed, over the whole run (tokens)."""

    input_tokens: int
    recomputed_tokens: int | None  # None: not known (no finished request; a server that does not report it)
    recomputed_share: float | None
    skipped_tokens: dict  # host load-back skipped: reason -> tokens
    storage_unused_tokens: dict  # storage match not used: reason -> tokens (prefetch_incomplete, ...)
    lost_tokens: int | None  # recomputed, neither skipped nor matched in storage: gone from every tier
    # Re-references of pages that a removal (host delete / device drop) had taken:
    deleted_from_host_tokens: int
    dropped_unbacked_tokens: int  # dropped from device with no host copy (never backed up)
    hot_removed_tokens: int  # of both, from nodes hit >= HOT_HIT_COUNT times
    removed_reuse_p50_tokens: int | None  # token-weighted reuse distance of those re-references
    removed_reuse_p90_tokens: int | None
    removed_reuse_deciles_tokens: tuple  # p0, p10, ..., p100 (token-weighted)
    device_capacity_tokens: int | None
    host_capacity_tokens: int | None
    storage_capacity_tokens: int | None
    # Token-weighted deciles (p0, p10, ..., p100) of a request's lost tokens (recomputed, neither
    # skipped nor matched in storage): how large a prefix a storage prefetch would have to bring
    # back at once (the prefetch admission rule limits that; advice/rules/capacity.py predicts with it).
    lost_request_deciles_tokens: tuple = ()
    # For the eviction-policy prediction (advice/rules/eviction_policy.py): token-weighted deciles (p0 ... p100) over the
    # hot re-references (hot_removed_tokens) of the hot volume competing with each: the tokens of
    # every hot re-reference whose interval (last use -> re-reference) overlaps its own, its own
    # included. LFU evicts once-hit content first, so a hot page stays while that volume fits.
    hot_competing_deciles_tokens: tuple = ()
    # Computed tokens another request of the same prefill batch computed too (miss reason
    # shared_in_batch, engine/miss.py; 0 where the rows have no reasons).
    in_batch_tokens: int = 0
    # The trace's own arrivals (x time_scale): max - min over the run's requests. 0: every request
    # arrived at once, and no time_scale can change when anything arrives (advice/rules/rate.py).
    trace_arrival_spread_ns: int | None = None


@dataclass(frozen=True)
class TransferEvidence:
    num_loadbacks: int
    loadback_bytes: int
    loadback_busy_ns: int
    link_peak_share: float | None
    pages_per_run: float | None
    bytes_per_run: float | None
    bytes_per_page: float | None
    loadback_ns: int  # summed over tiered hits
    recompute_instead_extra_ns: int  # what recomputing their loaded tokens would have added
    loadback_exposed_ns: int
    ttft_total_ns: int
    tiered_ttft_ns: int  # summed TTFT of the requests that loaded something back
    # The engine's fixed cost per copy launch (data_plane_json; None for an import): the part of a
    # load-back's time a page size does not change (advice/rules/page_size.py's prediction).
    transfer_overhead_ns: int | None = None


@dataclass(frozen=True)
class RunContext:
    run_id: str
    span_ns: int
    num_finished: int
    prefill_busy_share: float | None
    prefill_compute_ns: int
    recompute_ns: int
    recompute_share_of_prefill: float | None
    ttft_total_ns: int
    queue_total_ns: int
    queue_share_of_ttft: float | None
    excess_total_ns: int
    queue_attribution: dict | None  # ATTRIBUTION_KEYS -> run total ns (gaps all as idle: memory_wait and
    #                                  storage_wait stay 0 here; a request's own attribution splits them)
    losses: LossEvidence
    transfers: TransferEvidence
    config: dict
    kv_bytes_per_token: int | None
    ttft_p50_ns: int | None
    ttft_p99_ns: int | None
    # The run told by its requests' own verdicts (story.py) and its offered prefill against the
    # GPU (capacity.py); None where not computed (attribution=False) or not computable.
    story: RunStory | None = None
    capacity: Capacity | None = None
    # A data-parallel run's routing losses (routing_loss.py); None with one rank.
    routing: RoutingLoss | None = None
    # The run's batches' durations summed (`prefill_busy_share`'s numerator, exactly): explain's
    # run-wide eviction rate per busy ns (read/request_steps.py `run_prefill_busy_ns`, the same sum),
    # which it read with a scan of every batch per request (~25 ms of CPU on a 1M-request run,
    # issue 41). Not part of the JSON view (it says the share).
    prefill_busy_ns: int | None = None

    def to_json(self) -> dict:
        d = dataclass_json(self)
        del d["prefill_busy_ns"]
        d["queue_attribution_ms"] = ({k: ns_to_ms(v) for k, v in self.queue_attribution.items()}
                                     if self.queue_attribution else None)
        del d["queue_attribution"]
        return d


def _i(v) -> int:
    return int(v or 0)


def window_sums(s, e, d, values, cum, t):
    """Σ over instants `t` of F(t), each of the rows of `values` (batches `s`, `e`, durations `d`,
    `cum` the prefix sums of `values` × full share): `_run_attribution`'s integral. A row at a time
    (issue 41: the (rows, instants) matrices held ~200 MB at 1M requests), each row summed in
    order, one element after another, as the matrix `cum[:, kk] + values[:, kk] * part` was
    (F-ordered by its fancy index: numpy reduced its rows element by element; a row's own `sum()`
    is pairwise and gives other last digits of these ~1e18 ns totals before their difference)."""
    import numpy as np

    k = np.searchsorted(s, t, side="right") - 1  # the last batch starting at or before t
    kk = np.maximum(k, 0)
    part = np.clip(np.minimum(t, e[kk]) - s[kk], 0, None) / d[kk]
    before = k < 0
    del k
    sums = np.zeros(values.shape[0])
    for row in range(values.shape[0]):
        out = cum[row, kk] + values[row, kk] * part
        out[before] = 0.0
        if len(out):
            sums[row] = np.cumsum(out)[-1]
    return sums


def _run_attribution(con: duckdb.DuckDBPyConnection, rid: str, rec: str, queue_total: int,
                     scan: RunScan | None = None,
                     batches: Callable[[str], read_ctx.BatchArrays] | None = None,
                     windows: read_ctx.WaitWindows | None = None) -> dict | None:
    """Σ over requests of their queue attribution; the remainder of the queue (GPU idle while
    they waited) as `idle`.

    Each request's share of a batch is the fraction of the batch inside its wait window
    [arrival + storage wait, first token]. Batches run one after another on the one GPU, so
    instead of joining every request with every batch it overlaps (tens of millions of pairs
    when the queue is deep) each batch kind's time is integrated once along the clock:
    F(t) = Σ_batches value × (part of the batch before t) / duration, and a window gets
    F(first token) − F(start): the same sums as the interval join, in O((R + B) log B)."""
    import numpy as np

    b = read_ctx.batch_arrays(con, rid, rec) if batches is None else batches(rec)
    r = read_ctx.wait_windows(con, rid) if windows is None else windows
    if not len(b.start_ns) or not len(r.start_ns):
        return None
    # Issue 41 (a 1M-request close held ~520 MB here): the batches' columns dropped once stacked,
    # no copies of them for a run of one rank, and F a row at a time (not (4, requests) matrices).
    s_all, e_all = (np.asarray(c, dtype=np.int64) for c in (b.start_ns, b.end_ns))
    c, rc, x = (np.asarray(v, dtype=np.float64) for v in (b.compute_ns, b.recompute_ns, b.loadback_exposed_ns))
    b_rank = np.asarray(b.dp_rank, dtype=np.int64)
    del b
    d_all = np.maximum(e_all - s_all, 1).astype(np.float64)
    values_all = np.stack([rc, c - rc, x, np.maximum(d_all - c - x, 0.0)])  # recompute, new, load-back, other
    del c, rc, x
    w0_all, ft_all, r_rank = (np.asarray(v, dtype=np.int64) for v in (r.start_ns, r.first_token_ns, r.dp_rank))
    del r
    tot = np.zeros(4)
    # A data-parallel run: each request's window over its own rank's batches (one rank: all of them).
    for rank in sorted_unique(r_rank):
        theirs = b_rank == rank
        if not theirs.any():
            continue
        if theirs.all():
            s, e, d, values = s_all, e_all, d_all, values_all
        else:
            s, e, d, values = s_all[theirs], e_all[theirs], d_all[theirs], values_all[:, theirs]
        full = (e - s) / d  # 1, or 0 for a batch of no duration (its join overlap is 0 too)
        cum = np.concatenate([np.zeros((4, 1)), np.cumsum(values * full, axis=1)], axis=1)
        del full
        mine = r_rank == rank
        w0, ft = w0_all[mine], ft_all[mine]
        keep = ft > w0  # an empty window overlaps no batch
        tot += window_sums(s, e, d, values, cum, ft[keep]) - window_sums(s, e, d, values, cum, w0[keep])
        del cum, mine, w0, ft, keep
    own = read_ctx.own_parts(con, rid) if scan is None else scan.own
    raw = dict.fromkeys(ATTRIBUTION_KEYS, 0.0)
    raw[WaitPart.RECOMPUTE] = float(tot[0]) - _i(own.recompute_ns)
    raw[WaitPart.NEW_COMPUTE] = float(tot[1]) - _i(own.compute_ns)
    raw[WaitPart.LOAD_BACK] = float(tot[2]) - _i(own.loadback_exposed_ns)
    raw[WaitPart.WRITE_BACK] = float(tot[3])
    idle = queue_total - sum(max(v, 0.0) for v in raw.values())
    raw[WaitPart.DECODE] = float(min(_i(own.decode_wait_ns), max(idle, 0)))  # decode steps, out of the gaps
    raw[WaitPart.IDLE] = idle - raw[WaitPart.DECODE]
    return round_exact(raw, queue_total)


def _losses(con: duckdb.DuckDBPyConnection, rid: str, config: dict,
            miss_reasons: Callable[[], dict[str, int] | None] | None = None, scan: RunScan | None = None,
            rows: ContextRows | None = None, removed: read_ctx.RemovedRereferences | None = None) -> LossEvidence:
    t = read_ctx.finished_token_totals(con, rid) if scan is None else scan.tokens
    skipped = {r: _i(n) for r, n in (read_ctx.loadback_skipped_by_reason(con, rid) if rows is None else rows.skipped)}
    unused = {r: _i(n) for r, n in (read_ctx.storage_unused_by_reason(con, rid) if rows is None else rows.unused)}
    # Reuse distance of each re-reference of removed pages: tokens the device pool allocated
    # for requests scheduled between the pages' last use and the request that came back for
    # them (the LRU stack distance, roughly; explain's step 4 uses the same measure).
    # Only what the request then recomputed is lost: pages that came back from storage were not.
    # A request's removal tokens are scaled down to its recomputed tokens where they exceed them.
    # The lookups into the running allocation total and the token-weighted deciles run in
    # numpy over two fetched columns sets: a million-request run has a million allocations and
    # as many re-references (Python loops took seconds), and DuckDB's ASOF joins took ~0.3 s
    # each even on the conversation trace's 12k requests (one thread).
    import numpy as np

    alloc = read_ctx.allocations(con, rid) if rows is None else rows.allocations
    raw = read_ctx.removed_rereferences(con, rid) if removed is None else removed
    deciles: list[int] = []
    deleted = dropped = hot = 0
    hot_competing: list[int] = []
    if len(raw.tokens):
        sched = np.asarray(alloc.sched_ns, dtype=np.int64)
        cum = np.concatenate([[0], np.asarray(alloc.cum_tokens, dtype=np.int64)])
        t0, t1 = np.asarray(raw.t0_ns, dtype=np.int64), np.asarray(raw.t1_ns, dtype=np.int64)
        cum0 = cum[np.searchsorted(sched, t0, side="right")]  # allocated up to the pages' last use
        cum1 = cum[np.searchsorted(sched, t1, side="left")]  # ... and before the request came back
        dist = np.where(np.asarray(raw.no_t0, dtype=bool), 0, np.maximum(cum1 - cum0, 0))
        tok = np.rint(np.asarray(raw.tokens, dtype=np.float64)).astype(np.int64)  # half to even
        order = np.argsort(dist, kind="stable")
        dist_sorted, acc = dist[order], np.cumsum(tok[order])
        total = float(tok.sum())
        # Token-weighted quantiles: decile k is the distance where the running token total first
        # reaches k/10 of all (the first distance for k = 0; the largest where it never does).
        for k in range(11):
            reached = np.flatnonzero(acc.astype(np.float64) >= (k * 0.1) * total)
            deciles.append(int(dist_sorted[reached[0]] if reached.size else dist_sorted[-1]))
        deleted = int(tok[np.asarray(raw.deleted, dtype=bool)].sum())
        dropped = int(tok[np.asarray(raw.dropped, dtype=bool)].sum())
        is_hot = np.asarray(raw.hits, dtype=np.int64) >= HOT_HIT_COUNT
        hot = int(tok[is_hot].sum())
        hot_competing = _hot_competing_deciles(t0[is_hot], t1[is_hot], tok[is_hot])
    p50 = deciles[5] if deciles else None
    p90 = deciles[9] if deciles else None
    recomputed = None if t.recomputed_tokens is None else int(t.recomputed_tokens)  # NULL: no finished row says (unknown, not 0)
    lost = None if recomputed is None else max(recomputed - sum(skipped.values()) - sum(unused.values()), 0)

    def cap(key: str) -> int | None:
        v = config.get(key)
        return int(v) if v is not None else None

    lost_sizes = read_ctx.lost_request_sizes(con, rid) if rows is None else rows.lost_sizes
    lost_deciles: list[int] = []
    sizes = np.sort(np.asarray(lost_sizes, dtype=np.int64))
    sizes = sizes[sizes > 0]
    if sizes.size:
        acc = np.cumsum(sizes).astype(np.float64)
        for k in range(11):
            reached = np.flatnonzero(acc >= (k * 0.1) * acc[-1])
            lost_deciles.append(int(sizes[reached[0]] if reached.size else sizes[-1]))
    return LossEvidence(
        input_tokens=_i(t.input_tokens), recomputed_tokens=recomputed, recomputed_share=share(recomputed, _i(t.input_tokens)),
        skipped_tokens=skipped, storage_unused_tokens=unused, lost_tokens=lost,
        deleted_from_host_tokens=deleted, dropped_unbacked_tokens=dropped, hot_removed_tokens=hot,
        removed_reuse_p50_tokens=p50, removed_reuse_p90_tokens=p90, removed_reuse_deciles_tokens=tuple(deciles),
        device_capacity_tokens=cap("device_tokens"), host_capacity_tokens=cap("host_tokens"),
        storage_capacity_tokens=cap("storage_tokens"), lost_request_deciles_tokens=tuple(lost_deciles),
        hot_competing_deciles_tokens=tuple(hot_competing), in_batch_tokens=_in_batch_tokens(con, rid, miss_reasons),
        trace_arrival_spread_ns=read_ctx.trace_arrival_spread_ns(con, rid) if scan is None else scan.arrival_spread_ns)


def _in_batch_tokens(con: duckdb.DuckDBPyConnection, rid: str,
                     miss_reasons: Callable[[], dict[str, int] | None] | None = None) -> int:
    reasons = run_miss_reasons(con, rid) if miss_reasons is None else miss_reasons()
    return reasons["shared_in_batch"] if reasons else 0


def _weighted_deciles(values, weights) -> list[int]:
    """p0, p10, ..., p100 of `values` weighted by `weights`: the first value (ascending) where the
    running weight reaches k/10 of all (the largest where it never does)."""
    import numpy as np

    order = np.argsort(values, kind="stable")
    v, acc = np.asarray(values)[order], np.cumsum(np.asarray(weights)[order]).astype(np.float64)
    out = []
    for k in range(11):
        reached = np.flatnonzero(acc >= (k * 0.1) * acc[-1])
        out.append(int(v[reached[0]] if reached.size else v[-1]))
    return out


def _hot_competing_deciles(t0, t1, tok) -> list[int]:
    """Per hot re-reference (pages last used at t0, asked for again at t1, `tok` tokens): the hot
    tokens whose own interval overlaps [t0, t1] (t0' < t1 and t1' > t0), its own included, as
    token-weighted deciles. Two sorted prefix sums: O(n log n) for a million re-references."""
    import numpy as np

    if not len(tok):
        return []
    by0, by1 = np.argsort(t0, kind="stable"), np.argsort(t1, kind="stable")
    s0, s1 = t0[by0], t1[by1]
    c0 = np.concatenate([[0], np.cumsum(tok[by0])])
    c1 = np.concatenate([[0], np.cumsum(tok[by1])])
    started = c0[np.searchsorted(s0, t1, side="left")]  # t0' < t1
    ended = c1[np.searchsorted(s1, t0, side="right")]  # t1' <= t0: over before this one began
    competing = np.maximum(started - ended, tok)
    return _weighted_deciles(competing, tok)


def _transfers(con: duckdb.DuckDBPyConnection, rid: str, peak: float | None,
               overhead_ns: int | None = None, scan: RunScan | None = None) -> TransferEvidence:
    tr = read_ctx.loadback_transfers(con, rid) if scan is None else scan.loadback_transfers
    rq = read_ctx.loadback_requests(con, rid) if scan is None else scan.loadback
    n, nbytes, busy, pages, runs = (_i(x) for x in tr)
    achieved = nbytes * NS_PER_S / busy if nbytes and busy else None
    return TransferEvidence(
        num_loadbacks=n, loadback_bytes=nbytes, loadback_busy_ns=busy, link_peak_share=share(achieved, peak),
        pages_per_run=share(pages, runs), bytes_per_run=share(nbytes, runs), bytes_per_page=share(nbytes, pages),
        loadback_ns=_i(rq.tiered_loadback_ns), recompute_instead_extra_ns=_i(rq.tiered_recompute_instead_extra_ns),
        loadback_exposed_ns=_i(rq.loadback_exposed_ns), ttft_total_ns=_i(rq.ttft_ns), tiered_ttft_ns=_i(rq.tiered_ttft_ns),
        transfer_overhead_ns=overhead_ns)


def _overhead_ns(run) -> int | None:
    v = run.data_plane.get("transfer_overhead_ns") if isinstance(run.data_plane, dict) else None
    return int(v) if v is not None else None


def run_ranks(con: duckdb.DuckDBPyConnection, run, named: int | None = None) -> int:
    """The run's data-parallel ranks: its config's `dp`, or the ranks its requests name
    (`named`, else queried), whichever is more."""
    return max(read_ctx.named_ranks(con, run.run_id) if named is None else named, parse(run).ranks)


def compute_run_context(con: duckdb.DuckDBPyConnection, run, *, attribution: bool = True,
                        story: Callable[[], RunStory | None] | None = None,
                        miss_reasons: Callable[[], dict[str, int] | None] | None = None,
                        scan: Callable[[], RunScan] | None = None,
                        batches: Callable[[str], read_ctx.BatchArrays] | None = None,
                        rows: Callable[[], ContextRows | None] | None = None,
                        evictions: Callable[[], EvictionResults | None] | None = None) -> RunContext:
    """The run-level evidence `summary`'s diagnosis and `explain`'s "why" stand on, from the run's
    rows (what evidence.py stores at the run's close; readers take it through facts.py).

    `attribution=False`: the caller does not need the run's queue attribution (it costs a pass
    over every request and batch), so it is left out.

    `story`: what `run_story(con, run.run_id, batch_recompute_sql(con))` returns, computed by the
    caller meanwhile (evidence.py: on a cursor of its own, beside the rest of this: the story is
    the largest part, ~45 %, issue 41); called only where the story is wanted (what it raises
    is raised here). None: computed here.

    `miss_reasons`: what `run_miss_reasons(con, run.run_id)` returns (the in-batch tokens are
    its `shared_in_batch`), from the caller, which stores it as a section of its own (evidence.py:
    one query for both, issue 41, session 23); what it raises is raised here. None: queried here.

    `scan`: what `run_scan(con, run.run_id)` returns (read/run_scan.py: the run-wide sums of
    this, the summary's and the totals' in one query, issue 41 session 26), from the caller;
    what it raises is raised here. None: each sum queried here. `batches`: given the batch
    recompute column, the run's `read_ctx.batch_arrays` from the caller (the story's too,
    evidence.py); None: queried here. `rows`: the run's wait windows, allocations, lost sizes,
    skipped and unused sums and ideal arrivals folded while it was recorded (context_rows.py),
    from the caller; None, or its None: queried. `evictions`: the eviction queries' results
    folded while it was recorded (eviction_rows.py: here its removals' re-references), from the
    caller; None, or its None (or its part's): queried."""
    rid = run.run_id
    s = scan() if scan is not None else None
    folded = rows() if rows is not None else None
    folded_evictions = evictions() if evictions is not None else None
    t = read_ctx.finished_totals(con, rid) if s is None else s.finished
    span = max(_i(t.end_ns) - _i(t.start_ns), 0)
    rec = read_ctx.batch_recompute_sql(con)
    b = read_ctx.batch_totals(con, rid, rec)
    busy, compute, recompute = _i(b.busy_ns), _i(b.compute_ns), _i(b.recompute_ns)
    ranks = run_ranks(con, run, None if s is None else s.named_ranks)  # a data-parallel run's GPUs: its busy share is of all their time
    queue_total = _i(t.queue_ns)
    attribution = (_run_attribution(con, rid, rec, queue_total, s, batches, None if folded is None else folded.wait_windows)
                   if attribution and rec and busy else None)
    kv = run.data_plane.get("kv_bytes_per_token") if isinstance(run.data_plane, dict) else None
    return RunContext(
        run_id=rid, span_ns=span, num_finished=_i(t.finished),
        prefill_busy_share=share(busy, span * ranks) if busy else None, prefill_compute_ns=compute,
        recompute_ns=recompute if rec else 0,
        recompute_share_of_prefill=share(recompute, compute) if rec else None,
        ttft_total_ns=_i(t.ttft_ns), queue_total_ns=queue_total, queue_share_of_ttft=share(queue_total, _i(t.ttft_ns)),
        excess_total_ns=_i(t.excess_ns), queue_attribution=attribution,
        losses=_losses(con, rid, run.config, miss_reasons, s, folded,
                       None if folded_evictions is None else folded_evictions.removed),
        transfers=_transfers(con, rid, link_peak_bytes_per_s(run), _overhead_ns(run), s),
        config=dict(run.config), kv_bytes_per_token=int(kv) if kv else None,
        ttft_p50_ns=t.ttft_p50_ns, ttft_p99_ns=t.ttft_p99_ns,
        story=(run_story(con, rid, rec) if story is None else story()) if attribution and busy else None,
        capacity=run_capacity(con, rid, ranks, None if folded is None else folded.ideal),
        routing=routing_loss(con, run), prefill_busy_ns=busy)
