"""`explain`'s four steps for one request, in the troubleshooting order (DESIGN.md §2)::

    1 host_hit_length   where its tokens came from: device / host / storage / computed
    2 prefix_indices    usable prefix vs. the device original; cache_protected_len beside it
    3 load_back         bytes, time, bandwidth vs. peak, exposed / overlapped / queued,
                        load-back rate around it, counterfactuals
    4 eviction          which evictions took its prefix, by whose allocation, pool state then,
                        and whether the device pool was thrashing

The step names and evidence keys are the contract's (DESIGN.md §3) whatever the run; the words
of a finding are the SGLang release's whose rules the run followed (`sglang_rules`): 0.5.23's
request has `prefix_len`, `host_loaded_length`, `best_match_node`, `kv.cache_protected_len`,
0.5.9's `prefix_indices`, `host_hit_length` (`Vocabulary`).

Each step is one function from the request's row (and a few small queries filtered on run_id,
req_id and a time window) to a `Step`: its finding in words and its typed evidence.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from tierdiag.config.names import HitClass, Tier
from tierdiag.diagnose.request import claims as C
from tierdiag.diagnose.run import run_claims as RC
from tierdiag.diagnose.request.explain_result import (
    EvictionEvent,
    EvictionEvidence,
    HostHitEvidence,
    LoadBackEvidence,
    PrefixEvidence,
    Step,
    TransferRow,
)
from tierdiag.diagnose.read.query import link_peak_bytes_per_s
from tierdiag.diagnose.read import request_steps as read_steps
from tierdiag.diagnose.request.tokens import TokenSplit
from tierdiag.diagnose.run.totals import RunTotals
from tierdiag.engine.rules import RULE_SETS, recorded_rules
from tierdiag.store.reader import RunInfo
from tierdiag.units import NS_PER_S, fmt_bandwidth, fmt_bytes, fmt_ms, fmt_pct, fmt_rate, fmt_tokens, share
from tierdiag.diagnose.read.requests import RequestRow, RowLike

# Rates "around the request" are counted over [arrival - WINDOW, first token + WINDOW].
WINDOW_NS = 1 * NS_PER_S
# A load-back below this share of the link's peak is called slow, and then told why.
SLOW_LINK_SHARE = 0.5
# Below this many bytes per contiguous run, per-transfer overhead dominates ("small").
SMALL_RUN_BYTES = 1 << 20
# Fewer pages than this per contiguous run is "fragmented".
FRAGMENTED_PAGES_PER_RUN = 4
# Thrashing: at least this share of the tokens the device pool evicted around this request were
# asked for again, and evictions there ran at least as fast per busy second as over the run.
THRASH_REREFERENCED_SHARE = 0.5


@dataclass(frozen=True)
class Vocabulary:
    """The run's SGLang release and its words for the contract's names (`words`: contract name ->
    the release's field; a release the engine does not know keeps the contract's names)."""

    sglang_rules: str
    words: dict[str, str]

    def __getitem__(self, name: str) -> str:
        return self.words.get(name, name)

    def note(self, *names: str) -> str:
        """The sentence a step ends with: whose words it used."""
        return f"(Fields as SGLang {self.sglang_rules} names them: {', '.join(self[n] for n in names)}.)"


def run_vocabulary(run: RunInfo) -> Vocabulary:
    """The words of the release `run` followed (a run recorded before rule sets: 0.5.9's)."""
    version = recorded_rules(run.config)
    rules = RULE_SETS.get(version)
    if rules is None:
        return Vocabulary(version, {})
    v = rules.vocabulary
    return Vocabulary(version, {
        "prefix_indices": v.prefix,
        # 0.5.23's request carries the length itself; 0.5.9's the indices.
        "prefix_indices_len": v.prefix if v.prefix.endswith("_len") else f"len({v.prefix})",
        "host_hit_length": v.host_hit,
        "last_host_node": v.match_node,
        "cache_protected_len": v.protected,
    })


def plural(count: int, word: str) -> str:
    return f"{count:,} {word}{'' if count == 1 else ('es' if word.endswith(('s', 'ch')) else 's')}"


def is_finished(row: RowLike) -> bool:
    row = RequestRow.of(row)
    return (row.status or "finished") == "finished" and row.ttft_ns is not None



def _scheduled_ns(row: RequestRow) -> int:
    if row.first_token_ns is not None and row.prefill_ns is not None:
        return int(row.first_token_ns) - int(row.prefill_ns)
    return int(row.arrival_ns or 0)


def _window(row: RequestRow, bounds: tuple[int, int]) -> tuple[int, int]:
    """[scheduled - WINDOW, first token + WINDOW], clipped to the run so rates compare fairly.

    Centred on when it was served, not on its arrival: a request that queued for minutes would
    otherwise average the link and the pool over all of that wait.
    """
    start = _scheduled_ns(row)
    end = max(int(row.first_token_ns or start), start)
    return max(start - WINDOW_NS, bounds[0]), max(min(end + WINDOW_NS, bounds[1]), end)


def _window_words(window_ns: int) -> str:
    """The window `_window` gives, as it is: not "±1 s" when its own wait and prefill widen it."""
    return (f"from {WINDOW_NS // NS_PER_S} s before it was scheduled to {WINDOW_NS // NS_PER_S} s after its "
            f"first token, {fmt_ms(window_ns)}")


def _per_s(count: float, span_ns: int) -> float | None:
    return count * NS_PER_S / span_ns if span_ns > 0 else None


# --------------------------------------------------------------------------- step 1


def step_host_hit(row: RowLike, tokens: TokenSplit, run: RunInfo, vocab: Vocabulary | None = None) -> Step:
    row = RequestRow.of(row)
    V = vocab or run_vocabulary(run)
    threshold = run.config.get("load_back_threshold")
    ev = HostHitEvidence(
        hit_class=row.hit_class, input_tokens=tokens.input_tokens,
        device_hit_tokens=tokens.device_tokens, host_hit_length=tokens.host_tokens,
        storage_hit_tokens=tokens.storage_tokens, computed_tokens=tokens.computed_tokens,
        recomputed_tokens=tokens.recomputed_tokens, new_tokens=tokens.new_tokens,
        host_match_tokens=int(row.host_match_tokens or 0),
        storage_match_tokens=int(row.storage_match_tokens or 0),
        loadback_skipped_reason=row.loadback_skipped_reason,
        loadback_skipped_tokens=int(row.loadback_skipped_tokens or 0),
        storage_skipped_reason=row.storage_skipped_reason,
        load_back_threshold_tokens=int(threshold) if threshold is not None else None,
    )
    t = tokens
    cls = ev.hit_class
    if not is_finished(row):
        finding = (f"rejected ({row.reject_reason or 'no reason recorded'}): it was never "
                   f"scheduled, so none of its {fmt_tokens(t.input_tokens)} tokens used the cache.")
        return Step(1, "host_hit_length", finding, ev)
    if cls == HitClass.DEVICE_HIT:
        finding = (f"device hit: {fmt_tokens(t.reused_tokens)} of {fmt_tokens(t.input_tokens)} tokens "
                   f"reused, all device-resident ({V['host_hit_length']} 0); {fmt_tokens(t.computed_tokens)} computed.")
    elif cls == HitClass.TIERED_HIT:
        finding = (f"tiered hit: {fmt_tokens(t.reused_tokens)} of {fmt_tokens(t.input_tokens)} tokens "
                   f"reused: {fmt_tokens(t.device_tokens)} device-resident, {fmt_tokens(t.host_tokens)} "
                   f"loaded back from host ({V['host_hit_length']} {fmt_tokens(t.host_tokens)}), "
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
    if cls in (HitClass.DEVICE_HIT, HitClass.TIERED_HIT):
        finding += " " + V.note("host_hit_length")
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


def step_prefix(row: RowLike, tokens: TokenSplit, vocab: Vocabulary) -> Step:
    row = RequestRow.of(row)
    V = vocab
    pil = int(row.prefix_indices_len or 0)
    device = tokens.device_tokens
    restored = max(pil - device, 0)
    ev = PrefixEvidence(prefix_indices_len=pil, device_original_tokens=device, restored_tokens=restored,
                        restored_share=share(restored, pil), cache_protected_len=int(row.cache_protected_len or 0),
                        extend_input_len=int(row.extend_input_len or 0))
    if pil == 0:
        finding = (f"no usable prefix: {V['prefix_indices_len']} is 0 ({V['cache_protected_len']} "
                   f"{fmt_tokens(ev.cache_protected_len)}); extend_input_len {fmt_tokens(ev.extend_input_len)}.")
    else:
        finding = (f"usable prefix ({V['prefix_indices_len']}) {fmt_tokens(pil)} tokens = {fmt_tokens(device)} "
                   f"device original + {fmt_tokens(restored)} restored by load-back "
                   f"({fmt_pct(ev.restored_share)} restored); {V['cache_protected_len']} "
                   f"{fmt_tokens(ev.cache_protected_len)}; extend_input_len {fmt_tokens(ev.extend_input_len)}.")
        if ev.cache_protected_len != pil:
            finding += f" {V['cache_protected_len']} differs from the usable view."
    finding += " " + V.note("prefix_indices_len", "cache_protected_len")
    return Step(2, "prefix_indices", finding, ev)


# --------------------------------------------------------------------------- step 3


def step_load_back(con: duckdb.DuckDBPyConnection, run: RunInfo, row: RowLike, tokens: TokenSplit,
                    totals: RunTotals, records: list[read_steps.TransferRecord] | None = None) -> Step:
    """`records`: the request's transfers (read_steps.request_transfers over [arrival, finish])
    where the caller has read them (explain: beside the rest, read/request_reads.py); read here
    otherwise."""
    row = RequestRow.of(row)
    bounds = totals.bounds
    lo, hi = _window(row, bounds)
    span_ns = bounds[1] - bounds[0]
    rid = run.run_id
    # A request's load-backs and prefetches start between its arrival and its finish (a
    # prefetch at arrival, a load-back when its batch is formed): bounding the scan by that lets
    # DuckDB skip the row groups of the rest of the run (~50 -> ~10 ms on a million requests).
    # tests/diagnose/test_claims.py checks the bound on the demo run and the Mooncake traces.
    t_lo = int(row.arrival_ns) if row.arrival_ns is not None else None
    t_hi = row.finish_ns
    transfers = tuple(
        TransferRow(transfer_id=int(t.transfer_id or 0), kind=t.kind,
                    t_start_ns=int(t.t_start_ns or 0) - bounds[0], t_end_ns=int(t.t_end_ns or 0) - bounds[0],
                    pages=int(t.pages or 0), runs=int(t.runs or 0),
                    bytes=int(t.bytes or 0), queued_ns=t.queued_ns, wall_ns=t.wall_ns)
        for t in (records if records is not None else read_steps.request_transfers(con, rid, row.req_id, t_lo, t_hi)))
    win_n, win_bytes = read_steps.window_loadbacks(con, rid, lo, hi)
    run_n, run_bytes = totals.loadbacks, totals.loadback_bytes
    window_span = hi - lo

    lb_bytes = int(row.loadback_bytes or 0)
    lb_ns = int(row.loadback_ns or 0)
    pages = int(row.loadback_pages or 0)
    runs = int(row.loadback_runs or 0)
    exposed = int(row.loadback_exposed_ns or 0)
    peak = link_peak_bytes_per_s(run)
    achieved = lb_bytes * NS_PER_S / lb_ns if lb_bytes and lb_ns else None
    peak_share = share(achieved, peak)
    small = bool(lb_bytes) and runs > 0 and lb_bytes / runs < SMALL_RUN_BYTES
    fragmented = runs > 1 and pages / runs < FRAGMENTED_PAGES_PER_RUN
    ev = LoadBackEvidence(
        loaded_tokens=tokens.host_tokens + tokens.storage_tokens, loadback_bytes=lb_bytes,
        loadback_pages=pages, loadback_runs=runs, loadback_ns=lb_ns, achieved_bytes_per_s=achieved,
        link_peak_bytes_per_s=peak, link_peak_share=peak_share, small_transfer=small, fragmented=fragmented,
        exposed_ns=exposed, overlapped_ns=max(lb_ns - exposed, 0), queued_ns=int(row.loadback_queued_ns or 0),
        storage_bytes=int(row.storage_bytes or 0), storage_fetch_ns=int(row.storage_fetch_ns or 0),
        storage_wait_ns=int(row.storage_wait_ns or 0), window_ns=window_span, window_loadbacks=win_n,
        window_loadback_bytes=win_bytes, window_loadbacks_per_s=_per_s(win_n, window_span),
        run_loadbacks_per_s=_per_s(run_n, span_ns), window_loadback_bytes_per_s=_per_s(win_bytes, window_span),
        run_loadback_bytes_per_s=_per_s(run_bytes, span_ns), ttft_ns=row.ttft_ns,
        ttft_if_device_resident_ns=row.ttft_if_device_resident_ns,
        recompute_instead_ns=row.recompute_instead_ns, transfers=transfers,
    )
    return Step(3, "load_back", _load_back_finding(ev, row), ev)


def _load_back_finding(ev: LoadBackEvidence, row: RequestRow) -> str:
    if not is_finished(row):  # never scheduled: no window "before it was scheduled" to speak of (issue 40)
        return "not scheduled, so no load-back."
    rate = (f"Around it ({_window_words(ev.window_ns)}): {plural(ev.window_loadbacks, 'load-back')}, "
            f"{fmt_rate(ev.window_loadbacks_per_s)} vs {fmt_rate(ev.run_loadbacks_per_s)} over the run.")
    if not ev.loaded_tokens and not ev.loadback_bytes:
        if row.loadback_skipped_reason:
            head = (f"no load-back: the {fmt_tokens(int(row.loadback_skipped_tokens or 0))}-token host part "
                    f"was skipped ({row.loadback_skipped_reason}) and recomputed in "
                    f"{fmt_ms(int(row.recompute_ns or 0))}.")
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
    if why and (ev.link_peak_share is None or ev.link_peak_share < SLOW_LINK_SHARE):
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


def step_eviction(con: duckdb.DuckDBPyConnection, run: RunInfo, row: RowLike, tokens: TokenSplit,
                   totals: RunTotals, records: list[read_steps.EvictionRecord] | None = None,
                   run_busy_ns: int | None = None) -> Step:
    """`records`: the request's evictions (read_steps.request_evictions) where the caller has read
    them (explain reads them once for this step and the session step); read here otherwise.
    `run_busy_ns`: the run's prefill-busy time (read_steps.run_prefill_busy_ns) where the caller
    has read it (explain: beside the rest, read/request_reads.py); read here otherwise."""
    row = RequestRow.of(row)
    rid = run.run_id
    bounds = totals.bounds
    rows = records if records is not None else read_steps.request_evictions(con, rid, row.req_id)
    events = tuple(
        EvictionEvent(
            eviction_id=int(e.eviction_id), t_ns=int(e.t_ns or 0) - bounds[0], tier=e.tier, action=e.action,
            node_tokens=int(e.tokens or 0), prefix_tokens=int(e.prefix_tokens or 0),
            cause_req_id=e.cause_req_id, owner_req_id=e.owner_req_id,
            pool_used_tokens=e.pool_used_tokens, pool_capacity_tokens=e.pool_capacity_tokens,
            pool_used_share=share(e.pool_used_tokens, e.pool_capacity_tokens),
            locked_tokens=e.locked_tokens)
        for e in rows)
    accesses = [int(e.node_last_access_ns) for e in rows if e.node_last_access_ns is not None]
    last_access = max(accesses) if accesses else None
    evicted_by = tuple(dict.fromkeys(
        e.cause_req_id for e in events if e.cause_req_id is not None and e.cause_req_id != row.req_id))

    def pool_size(tier: str) -> int | None:
        size = run.config.get(f"{tier}_tokens")
        if size is None:
            size = next((e.pool_capacity_tokens for e in events if e.tier == tier), None)
        return int(size) if size is not None else None

    capacity, host_capacity = pool_size("device"), pool_size("host")
    compared = capacity
    if capacity is not None and host_capacity and any(e.tier != Tier.DEVICE for e in events):
        # What the write policy lets hold a prefix: host alone under write_through (run_claims.held_capacity).
        compared = RC.held_capacity(run.config, capacity, host_capacity)[0]
    reuse_distance = None
    if last_access is not None and row.arrival_ns is not None:
        # Tokens the device pool had to allocate for other requests scheduled between the
        # prefix's last use and this request's scheduling: the LRU stack distance, roughly.
        # Beyond the pool size an LRU pool cannot have kept it; well below it, something else
        # (locks, bursts) pushed it out.
        reuse_distance = read_steps.allocated_between(con, rid, int(last_access), _scheduled_ns(row))

    lo, hi = _window(row, bounds)
    span_ns = bounds[1] - bounds[0]
    dev = read_steps.window_device_evictions(con, rid, lo, hi)
    win_n, win_tokens = dev.evictions, dev.tokens
    # On the window, not the run: the share of the tokens evicted in it that a request came
    # back for, and the eviction rate per ns of prefill-busy time, here and over the run (a
    # rate per wall ns would compare a busy window with a run average diluted by idle hours).
    # request_evictions is read only between the window's eviction ids (issue 41).
    win_reref, win_busy, run_busy = read_steps.window_eviction_load(con, rid, lo, hi, dev.first_id, dev.last_id,
                                                                  run_busy_ns)
    run_n = totals.device_evictions
    window_rate = _per_s(win_n, int(win_busy or 0) or hi - lo)
    run_rate = _per_s(run_n, int(run_busy or 0) or span_ns)
    reref = share(int(win_reref or 0), win_tokens)
    # Thrashing is said of the pool around its schedule, for a request that was scheduled (a
    # rejected one has no window), and is blamed for its prefix's loss only when an eviction of
    # it fell inside that window (not one a minute earlier; issue 40: `thrashing_when_evicted`).
    thrashing = (is_finished(row) and win_n > 0 and reref is not None and reref >= THRASH_REREFERENCED_SHARE
                 and (run_rate is None or (window_rate or 0) >= run_rate))
    when_evicted = thrashing and any(lo <= e.t_ns + bounds[0] <= hi for e in events)

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
        rereferenced_share=reref, thrashing=thrashing, thrashing_when_evicted=when_evicted,
    )
    return Step(4, "eviction", _eviction_finding(ev, row, tokens), ev)


def _eviction_finding(ev: EvictionEvidence, row: RequestRow, tokens: TokenSplit) -> str:
    pool = (f"Device pool around it ({_window_words(ev.window_ns)}): "
            f"{plural(ev.window_device_evictions, 'eviction')}, {fmt_rate(ev.window_device_evictions_per_s)} "
            f"vs {fmt_rate(ev.run_device_evictions_per_s)} over the run, per second of prefill-busy time; "
            f"{fmt_pct(ev.rereferenced_share)} of the tokens it evicted there were asked for again")
    pool += " — thrashing." if ev.thrashing else "."
    if not is_finished(row):  # never scheduled: no window around a schedule (issue 40)
        pool = ""
    if not ev.events:
        if not is_finished(row):
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
        return f"{head} {pool}".rstrip()
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
    text = (f"{plural(ev.num_events, 'eviction event')} {moved} "
            f"({', '.join(actions)}), the first at t = {fmt_ms(first.t_ns)} (since the run's first arrival)")
    if by:
        text += f", forced by the allocations of request{'s' if len(ev.evicted_by) > 1 else ''} {by}"
    if first.pool_capacity_tokens:
        text += (f" ({first.tier} pool {fmt_pct(first.pool_used_share)} full: "
                 f"{fmt_tokens(first.pool_used_tokens)} of {fmt_tokens(first.pool_capacity_tokens)} tokens, "
                 f"{fmt_tokens(first.locked_tokens)} locked)")
    text += "."
    if ev.reuse_distance_tokens is not None and ev.compared_capacity_tokens:
        if not any(e.tier != Tier.DEVICE for e in ev.events):
            pools = f"a {fmt_tokens(ev.device_capacity_tokens)}-token device pool"
        elif ev.compared_capacity_tokens == (ev.device_capacity_tokens or 0) + (ev.host_capacity_tokens or 0):
            pools = f"{fmt_tokens(ev.compared_capacity_tokens)} tokens of device + host pools"
        else:
            pools = (f"a {fmt_tokens(ev.compared_capacity_tokens)}-token host pool (write_through keeps a host copy "
                     f"of the device's: host alone holds a prefix)")
        verdict = ("pools of this size could not have kept it under LRU"
                   if ev.reuse_distance_tokens > ev.compared_capacity_tokens
                   else "it fit, so pressure (locks, bursts) pushed it out")
        text += f" Reuse distance {fmt_tokens(ev.reuse_distance_tokens)} tokens vs {pools}: {verdict}."
    return f"{text} {pool}".rstrip()
