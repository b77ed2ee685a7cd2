"""What to change: option changes from the run's evidence, and the run's root cause (DESIGN §5).

Each rule reads `RunContext` (context.py) and proposes at most one typed `Advice`: the
`--config` TOML key(s) to change, the value, the reason with its numbers, what it costs in
memory, and `verified` once `tierdiag advise` has replayed the trace with it.

    rule              fires when (run-wide)                                        advises
    rate              offered prefill above the GPU for a material share (capacity) time_scale x (p90 load / 0.9)
    prefetch          storage matches recomputed because the prefetch was late     prefetch_policy wait_complete
    write_policy      once-cached tokens dropped from device with no host copy     write_policy write_through
    session           later session turns recomputed / loaded back their prefix    host_tokens for the p90 pause
                      after their pause (closed-loop arrivals)                     (session_pool.py; <= 2 TiB)
    capacity          tokens deleted from host, reuse distance (p90) > device+host host_tokens: the host size
                                                                                   curve's knee (<= 256 GiB a GPU)
                                                                                   else a storage tier (its curve's
                                                                                   knee) + wait_complete
    eviction_policy   hot prefixes (hit >= 3 times) among the removed tokens       eviction_policy lfu
    page_size         load-backs fragmented and far below link peak, exposed       page_size x4
    (none of these)   the cache was fine                                           "nothing to change in the cache"

A rule fires only when its tokens are known, more than none, and at least MIN_LOSS_SHARE of a
known, non-empty input (`_significant`): below that, the cache is not what is worth changing,
and from nothing (a run whose every request was rejected, a server that reports no recompute)
nothing is proposed. Hardware limits: a host pool beyond
HOST_POOL_LIMIT_BYTES (a real server's host memory per GPU: 256 GiB of an 8-GPU server's 2 TiB; each
rank's host pool is its own) is never advised; a storage tier is.

Verification: `advise` records each candidate run under sweep_id `advise-<baseline run_id>`;
`verified_advice` finds those runs, diffs their config against the baseline's, attaches the
measured numbers to the advice item whose changes they are and gives it a `status` (DESIGN §6)::

    proposed    not replayed yet
    confirmed   TTFT p50 at least CONFIRM_P50_GAIN better, p99 not more than P99_TOLERANCE worse
                (the share the rule targeted, TARGETS, is measured and shown, not a criterion)
    refuted     worse: p50 at least CONFIRM_P50_GAIN worse, or p99 more than P99_TOLERANCE worse
    no_effect   neither (the replays are deterministic: this is not noise, the change did not help)

Only `proposed` and `confirmed` items are advice; the others are "tried, not advised", shown
with their numbers. Where two or more are confirmed, `advise` also replays the best of them
together (`combination`): a `combined` item, confirmed only when it beats the best one alone too.
"""

from __future__ import annotations

import dataclasses


from tierdiag.config.constants import DISK_BYTES_PER_S, MAX_TIME_SCALE, RUN_OVERHEAD_NS, SEGMENT_OVERHEAD_NS
from tierdiag.diagnose import claims as C
from tierdiag.diagnose.claims import (
    BUSY_SHARE,
    NAMED_REASON_SHARE,
    NEAR_PEAK_SHARE,
    held_capacity,
)
from tierdiag.diagnose.advice_in_batch import IN_BATCH_RULES  # requests sharing a prefix in one batch
from tierdiag.diagnose.advice_routing import ROUTING_RULES, routing_first  # data-parallel runs: router, thresholds, dp
from tierdiag.diagnose.capacity import MATERIAL_SHARE, TARGET_LOAD
from tierdiag.diagnose.runcontext import RunContext
from tierdiag.diagnose.session_pool import SessionPauses
from tierdiag.engine.rules import rule_set
from tierdiag.diagnose.advice_types import (ADVISED, COMBINE_MAX, CONFIRM_P50_GAIN, P99_TOLERANCE, STATUSES,  # noqa: F401
                                            TARGETS, Advice, Verified, advice_json, advised, classify, fmt_ms_value,
                                            tried_not_advised)
from tierdiag.units import fmt_bytes, fmt_ms, fmt_pct, fmt_tokens, ns_to_ms, share

MIN_LOSS_SHARE = 0.05
# A real server's host memory per GPU: an 8-GPU server (DGX H100 / H200: 2 TiB of system memory)
# has 256 GiB beside each GPU, and each data-parallel rank's scheduler allocates its own host pool
# there. `advise --host-memory` replaces it.
SERVER_HOST_BYTES = 2 << 40
SERVER_GPUS = 8
HOST_POOL_LIMIT_BYTES = SERVER_HOST_BYTES // SERVER_GPUS
DEFAULT_LIMIT_WORDS = (f"a GPU has in an {SERVER_GPUS}-GPU server with {SERVER_HOST_BYTES >> 40} TiB of host memory "
                       f"({HOST_POOL_LIMIT_BYTES >> 30} GiB per GPU)")


def limit_words(host_limit_bytes: int) -> str:
    """What caps a host pool, in words: the default's server, or --host-memory's size."""
    return (DEFAULT_LIMIT_WORDS if host_limit_bytes == HOST_POOL_LIMIT_BYTES
            else f"of the {fmt_bytes(host_limit_bytes)} --host-memory gives each GPU")
# SGLang 0.5.9's prefetch room: this share of host beyond device (HiCacheController.prefetch_rate_limited);
# the advice reads the run's own rule set (engine/rules.py `prefetch_room_tokens`).
PREFETCH_ROOM_SHARE = 0.8
# Size pools to keep this share of the re-referenced removed tokens (reuse distance decile).
CAPACITY_DECILE = 9
SLOW_LINK_SHARE = 0.5
FRAGMENTED_PAGES_PER_RUN = 4
SMALL_RUN_BYTES = 1 << 20
SMALL_PAGE_BYTES = 4 << 20  # a 64-token page of an 8B model is 8 MiB
EXPOSED_SHARE_OF_TTFT = 0.05
PAGE_SIZE_FACTOR = 4
# Config keys that differ between runs without being a change of the cache (bookkeeping).
# `profile_source` is what the profile held (advice_verify.same_clock compares its hash apart).
_NOT_CHANGES = frozenset({"storage_dir", "seed", "verify", "data_plane_mib", "profile", "profile_source", "timing"})
GIB = 1 << 30
def _pow2_at_least(n: int, page: int) -> int:
    p = max(page, 1)
    while p < n:
        p *= 2
    return p


def _pow2_at_most(n: int) -> int:
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


def _gib(tokens: int, kv: int | None) -> float | None:
    return None if not kv else tokens * kv / GIB


def _covered(deciles: tuple, capacity: int) -> float | None:
    """Share (to the decile) of re-referenced removed tokens whose reuse distance fits `capacity`."""
    if not deciles:
        return None
    return max((i / 10 for i, d in enumerate(deciles) if d <= capacity), default=0.0)


# --------------------------------------------------------------------------- rules


def _significant(tokens: int | None, input_tokens: int | None) -> bool:
    """A rule's tokens are worth a change: known, more than none, and at least MIN_LOSS_SHARE of
    a known, non-empty input. Unknown (None) stays unknown: no rule fires from it."""
    return bool(tokens) and bool(input_tokens) and tokens >= MIN_LOSS_SHARE * input_tokens


def _prefetch(ctx: RunContext) -> list[Advice]:
    """Predicted under the engine's prefetch rules: wait_complete holds a request until its read
    is done (engine/prefetch.py), so its late tokens are loaded rather than recomputed, each
    costing a storage read (the cost model's DISK_BYTES_PER_S) instead of its recompute. Worth it
    where a read is cheaper than the recompute, or where the prefill GPU was at least BUSY_SHARE
    busy (the wait frees it for others); else not proposed. Ignores: longer holds keeping host
    room for prefetches in flight (more may be rate_limited), and evictions during the wait."""
    lo = ctx.losses
    late = lo.storage_unused_tokens.get("prefetch_incomplete", 0)
    if not _significant(late, lo.input_tokens) or ctx.config.get("prefetch_policy") == "wait_complete":
        return []
    kv = ctx.kv_bytes_per_token
    recompute_per_token_ns = share(ctx.recompute_ns, lo.recomputed_tokens) or 0.0
    disk_per_token_ns = kv * 1e9 / DISK_BYTES_PER_S if kv else None
    cheaper = disk_per_token_ns is not None and disk_per_token_ns < recompute_per_token_ns
    busy = (ctx.prefill_busy_share or 0) >= BUSY_SHARE
    if not (cheaper or busy):
        return []  # predicted to trade each recompute for a slower read, on a GPU with room
    return [Advice(
        "prefetch", "prefetch_policy", "wait_complete", {"prefetch_policy": "wait_complete"},
        C.advice_prefetch_claim(late_tokens=late, input_tokens=lo.input_tokens, policy=ctx.config.get("prefetch_policy"),
                                disk_per_token_ns=disk_per_token_ns, recompute_per_token_ns=recompute_per_token_ns,
                                prefill_busy_share=ctx.prefill_busy_share).text,
        {"prefetch_incomplete_tokens": late, "input_tokens": lo.input_tokens,
         "recompute_per_token_ms": ns_to_ms(recompute_per_token_ns), "disk_per_token_ms": ns_to_ms(disk_per_token_ns),
         "prefill_busy_share": ctx.prefill_busy_share},
        prediction=(f"predicted under the run's prefetch rules (wait_complete holds a request until its read "
                    f"completes): keeps ~{fmt_tokens(late)} of the lost tokens"))]


def _write_policy(ctx: RunContext) -> list[Advice]:
    lo = ctx.losses
    policy = ctx.config.get("write_policy")
    if not _significant(lo.dropped_unbacked_tokens, lo.input_tokens) or policy == "write_through":
        return []
    return [Advice(
        "write_policy", "write_policy", "write_through", {"write_policy": "write_through"},
        C.advice_write_policy_claim(dropped_tokens=lo.dropped_unbacked_tokens, policy=policy).text,
        {"dropped_unbacked_tokens": lo.dropped_unbacked_tokens, "input_tokens": lo.input_tokens})]


def _sessions(ctx: RunContext, sessions: SessionPauses | None,
              host_limit_bytes: int = HOST_POOL_LIMIT_BYTES) -> list[Advice]:
    """Keep sessions alive for the p90 pause: the host pool whose LRU holds every later turn's
    context over a pause up to p90 (session_pool.py's stack distances), for a closed-loop run
    whose later turns recomputed or loaded back a material share of their input. Open-loop
    (arrivals trace) pauses are not the sessions' own, so nothing is sized from them."""
    sp, lo = sessions, ctx.losses
    device, host = lo.device_capacity_tokens, lo.host_capacity_tokens
    if (sp is None or (ctx.config.get("arrivals") or "closed") != "closed" or device is None or host is None
            or not _significant(sp.lost_tokens, sp.input_tokens)):
        return []
    page = int(ctx.config.get("page_size") or 64)
    kv = ctx.kv_bytes_per_token
    # As for capacity: under write_through the host pool alone holds every cached copy (device's
    # included), so it alone must hold the contexts; otherwise device and host add up.
    inclusive = ctx.config.get("write_policy") == "write_through"
    held, pools = held_capacity(ctx.config, device, host)
    want = _pow2_at_least(sp.pool_p90_tokens if inclusive else sp.pool_p90_tokens - device, page)
    limit = _pow2_at_most(host_limit_bytes // kv) if kv else want
    capped = want > limit
    new = min(want, limit)
    if new <= host:
        return []  # the pools already hold the sessions' contexts for the p90 pause (or the server can't)
    after = new if inclusive else device + new
    kept_before, kept_after = sp.kept_share(held) or 0.0, sp.kept_share(after) or 0.0
    if not _significant(int((kept_after - kept_before) * sp.reused_tokens), sp.input_tokens):
        return []  # predicted to keep too little more to be worth the memory
    found = share(sp.device_tokens + sp.host_tokens, sp.reused_tokens)
    size = (f"host pool of {fmt_tokens(new)} tokens" if not capped else
            f"host pool of {fmt_tokens(want)} tokens, beyond the "
            + f"host memory {limit_words(host_limit_bytes)}: {fmt_tokens(new)} tokens, the most it holds")
    return [Advice(
        "session", "host_tokens", new, {"host_tokens": new},
        C.advice_session_claim(lost_tokens=sp.lost_tokens, num_turns=sp.num_turns, input_tokens=sp.input_tokens,
                               recomputed_tokens=sp.recomputed_tokens, loaded_tokens=sp.host_tokens + sp.storage_tokens,
                               pause_p90_ns=sp.pause_p90_ms * 1e6, size=size, pool_p90_tokens=sp.pool_p90_tokens,
                               pools=pools).text,
        {"later_turns": sp.num_turns, "later_input_tokens": sp.input_tokens, "later_reused_tokens": sp.reused_tokens,
         "later_recomputed_tokens": sp.recomputed_tokens,
         "later_loaded_tokens": sp.host_tokens + sp.storage_tokens, "pause_p90_ms": sp.pause_p90_ms,
         "pool_p90_tokens": sp.pool_p90_tokens, "device_tokens": device, "host_tokens": host},
        _gib(new - host, kv), "host_memory",
        prediction=(f"predicted under LRU: keeps {fmt_pct(kept_after)} of later turns' reused prefix on device or "
                    f"host, against {fmt_pct(kept_before)} with the pools now (this run found "
                    f"{fmt_pct(found)} there)"))]


def _knee_above(curves, tier: str, own: int, page: int) -> tuple[int | None, bool]:
    """(the size to propose for the tier, whether a curve was there): with a curve, its knee plus
    the curves' slack (SizeCurves.proposed_size, size_curves.py), and none where the run's size is
    at or past the knee already."""
    curve = curves.curve(tier) if curves is not None else None
    if curve is None:
        return None, False
    knee = curve.knee_tokens
    if knee is None or -(-knee // page) * page <= own:
        return None, True
    return curves.proposed_size(tier), True


def _curve_prediction(curves, tier: str, option: str, value: int, own: int) -> str:
    c = curves.curve(tier)
    where = {"host": "device and host", "storage": "device, host and storage"}[tier]
    return (f"predicted in one pass (size curve, LRU): {where} find "
            f"{fmt_pct(share(c.reused_at(value), curves.input_tokens))} of input at {option} {fmt_tokens(value)}, "
            f"against {fmt_pct(share(c.reused_at(own), curves.input_tokens))} at the run's {fmt_tokens(own)} "
            f"(the run found {fmt_pct(share(c.found_tokens, curves.input_tokens))}); the curve's knee is "
            f"{fmt_tokens(c.knee_tokens)} tokens, plus the median request's prefix ({fmt_tokens(curves.slack_tokens)}) "
            "of slack: the engine evicts a whole tree node at a time")


def _capacity(ctx: RunContext, host_limit_bytes: int = HOST_POOL_LIMIT_BYTES, curves=None) -> list[Advice]:
    """`curves`: the run's size curves (size_curves.SizeCurves): the host pool and the storage
    tier proposed are their curves' knees (the smallest size finding KNEE_SHARE of what an
    unbounded one would), none where the run's size is at the knee already; None (no curves: the
    trace could not be read again): sized from the removed tokens' p90 reuse distance, rounded up
    to a power of two."""
    lo = ctx.losses
    device, host = lo.device_capacity_tokens, lo.host_capacity_tokens
    deciles = lo.removed_reuse_deciles_tokens
    if (not _significant(lo.deleted_from_host_tokens, lo.input_tokens) or device is None or host is None
            or len(deciles) < 11):
        return []
    page = int(ctx.config.get("page_size") or 64)
    kv = ctx.kv_bytes_per_token
    target = deciles[CAPACITY_DECILE]
    # write_through keeps a host copy of everything on device: the host pool alone bounds what
    # stays cached. Otherwise host holds what device evicted, and the two add up.
    inclusive = ctx.config.get("write_policy") == "write_through"
    held, pools = held_capacity(ctx.config, device, host)
    if target <= held:
        return []  # the pools were big enough under LRU: not a capacity problem
    evidence = {"deleted_from_host_tokens": lo.deleted_from_host_tokens, "reuse_distance_p50_tokens": deciles[5],
                "reuse_distance_p90_tokens": target, "device_tokens": device, "host_tokens": host}
    why = C.host_deleted_why(deleted_tokens=lo.deleted_from_host_tokens, input_tokens=lo.input_tokens,
                             reuse_p50_tokens=deciles[5], reuse_p90_tokens=target, pools=pools)
    out: list[Advice] = []
    want = _pow2_at_least(target if inclusive else target - device, page)
    knee, curved = _knee_above(curves, "host", host, page)
    want = knee if curved else want
    limit = _pow2_at_most(host_limit_bytes // kv) if kv else want
    if curved and knee is None:
        return out  # the run's host pool is at its curve's knee already: more finds little
    if want <= limit:
        cover = _covered(deciles, want if inclusive else device + want)
        out.append(Advice("capacity", "host_tokens", want, {"host_tokens": want},
                          C.advice_capacity_claim(why=why, host_tokens=want, cover=cover).text,
                          {**evidence, "host_knee_tokens": knee} if curved else evidence,
                          _gib(want - host, kv), "host_memory",
                          prediction=_curve_prediction(curves, "host", "host_tokens", want, host) if curved else
                          f"predicted under LRU: keeps ~{fmt_tokens(int((cover or 0) * lo.deleted_from_host_tokens))} "
                          f"of the {fmt_tokens(lo.deleted_from_host_tokens)} tokens deleted from host"))
        return out
    cover = _covered(deciles, limit if inclusive else device + limit)
    kept = int((cover or 0) * lo.deleted_from_host_tokens)
    # Predicted under LRU: the largest host pool the server holds keeps only the re-references
    # whose reuse distance fits it; below the rule's threshold of input it is not proposed.
    if limit > host * 3 // 2 and _significant(kept, lo.input_tokens):
        out.append(Advice("capacity", "host_tokens", limit, {"host_tokens": limit},
                          C.advice_capacity_claim(
                              why=why, host_tokens=limit, cover=cover, kv_bytes=kv,
                              limit_words=limit_words(host_limit_bytes)).text,
                          evidence, _gib(limit - host, kv), "host_memory",
                          prediction=f"predicted under LRU: keeps ~{fmt_tokens(kept)} of the "
                                     f"{fmt_tokens(lo.deleted_from_host_tokens)} tokens deleted from host"))
    storage = int(ctx.config.get("storage_tokens") or 0)
    want_storage = _pow2_at_least(target, page)
    storage_knee, storage_curved = _knee_above(curves, "storage", storage, page)
    if storage_curved:
        if storage_knee is None:
            return out  # the run's storage tier is at its curve's knee already
        want_storage = storage_knee
    # A storage tier pays when fetching a token from disk is cheaper than recomputing it, or
    # when the prefill GPU is saturated (the fetch runs beside it and frees it for others).
    recompute_per_token_ns = share(ctx.recompute_ns, lo.recomputed_tokens) or 0.0
    disk_per_token_ns = kv * 1e9 / DISK_BYTES_PER_S if kv else None
    pays = (disk_per_token_ns is not None and disk_per_token_ns < recompute_per_token_ns) or \
        (ctx.prefill_busy_share or 0) >= BUSY_SHARE
    evidence = {**evidence, "recompute_per_token_ms": ns_to_ms(recompute_per_token_ns),
                "disk_per_token_ms": ns_to_ms(disk_per_token_ns), "prefill_busy_share": ctx.prefill_busy_share}
    # Prefetches from storage land in host memory: SGLang 0.5.9 admits one while those in flight
    # hold under 0.8 x (host - device) tokens, so with host == device a storage tier never
    # prefetches (0.5.23: under 0.5 x host). Then the host pool grows to HiCache's default, 2 x device,
    # within what the server holds; a server without that room gets no storage advice.
    rules = rule_set(ctx.config.get("sglang_rules") or "0.5.9")  # runs from before rule sets followed 0.5.9
    room = rules.prefetch_room_tokens(host, device)
    host_for_room = host
    if room <= 0:
        host_for_room = min(_pow2_at_least(2 * device, page), limit) if kv else 2 * device
        if host_for_room <= device:
            return out
    # Predicted under the run's own prefetch rules: a request's lost prefix comes back from
    # storage only if its prefetch starts (match >= prefetch_threshold) and is admitted (what
    # prefetches hold in flight stays under the release's room, rules.prefetch_room_tokens: 0.8 x
    # (host - device) in 0.5.9, 0.5 x host in 0.5.23; a prefix larger than that room alone is
    # rate_limited, every time). Grow the host room for the p90 request where the server has the
    # memory; not proposed where the prefetches that would be admitted keep less than the rule's
    # threshold of input.
    sizes = lo.lost_request_deciles_tokens
    threshold = int(ctx.config.get("prefetch_threshold") or 0)
    beyond_device = rules.prefetch_capacity_of_host_minus_device
    if sizes and kv:
        needed = _pow2_at_least((device if beyond_device else 0)
                                + int(sizes[9] / rules.prefetch_capacity_share) + 1, page)
        if needed > host_for_room and needed <= limit:
            host_for_room = needed
    room_for = rules.prefetch_room_tokens(host_for_room, device)
    admitted = (max((_covered(sizes, room_for) or 0) - (_covered(sizes, threshold - 1) or 0), 0.0)
                if sizes else 1.0)
    kept_storage = int(admitted * (lo.lost_tokens or lo.deleted_from_host_tokens))
    if want_storage > storage and pays and _significant(kept_storage, lo.input_tokens):
        changes = {"storage_tokens": want_storage, "prefetch_policy": "wait_complete"}
        room_note = ""
        if host_for_room != host:
            changes["host_tokens"] = host_for_room
            extra = f" (+{fmt_bytes((host_for_room - host) * kv)})" if kv else ""
            room_note = (f"; and host_tokens {fmt_tokens(host_for_room)}{extra}, since prefetches may hold only "
                         f"{fmt_pct(rules.prefetch_capacity_share)} of the host pool"
                         + (" beyond device" if beyond_device else "") + f": with {fmt_tokens(host)} "
                         f"tokens of host beside {fmt_tokens(device)} of device none would be admitted "
                         f"(rate_limited), with {fmt_tokens(host_for_room)} up to "
                         f"{fmt_tokens(rules.prefetch_room_tokens(host_for_room, device))} tokens at a time")
        beyond = (f"beyond the {fmt_bytes(host_limit_bytes)} a server holds for KV" if host_limit_bytes != HOST_POOL_LIMIT_BYTES
                  else f"beyond the {fmt_bytes(HOST_POOL_LIMIT_BYTES)} of host memory per GPU of a real server")
        out.append(Advice("storage_tier", "storage_tokens", want_storage, changes,
                          C.advice_storage_claim(
                              deleted_tokens=lo.deleted_from_host_tokens, reuse_p90_tokens=target,
                              want_host_bytes=want * kv, beyond=beyond, storage_tokens=want_storage,
                              disk_per_token_ns=disk_per_token_ns, recompute_per_token_ns=recompute_per_token_ns,
                              prefill_busy_share=ctx.prefill_busy_share, room_note=room_note).text,
                          {**evidence, "prefetch_room_tokens": room, "prefetch_room_after_tokens": room_for},
                          _gib(want_storage - storage, kv), "disk",
                          prediction=(f"predicted under the run's prefetch rules (SGLang {rules.version}: admitted "
                                      f"while in flight < {fmt_pct(rules.prefetch_capacity_share)} of host"
                                      + (" beyond device" if beyond_device else "") + " = "
                                      f"{fmt_tokens(room_for)} tokens; prefetch_threshold {fmt_tokens(threshold)}): "
                                      f"keeps ~{fmt_tokens(kept_storage)} of the lost tokens"
                                      + (f"; {_curve_prediction(curves, 'storage', 'storage_tokens', want_storage, storage)}"
                                         if storage_curved else ""))))
    return out


def _eviction_policy(ctx: RunContext) -> list[Advice]:
    """Predicted by a policy simulation over the run's own re-references: LFU (SGLang's
    LFUStrategy: fewest hits first, then least recent) evicts once-hit content before a hot page,
    so a hot re-reference is kept when the hot volume live beside it (every hot re-reference
    whose interval from last use to re-reference overlaps its own, itself included:
    LossEvidence.hot_competing_deciles_tokens) fits the pools (held_capacity). Not proposed when
    the hot tokens so kept are below MIN_LOSS_SHARE of input. Ignores what the rows do not
    record: hits on content never removed (it competes too), pages locked by running requests,
    and what LFU loses, once-hit prefixes asked for again soon that LRU kept (a replay measures
    that: `advise`)."""
    lo = ctx.losses
    removed = lo.deleted_from_host_tokens + lo.dropped_unbacked_tokens
    policy = ctx.config.get("eviction_policy")
    if (policy == "lfu" or not removed or lo.hot_removed_tokens < NAMED_REASON_SHARE * removed
            or not _significant(lo.hot_removed_tokens, lo.input_tokens)):
        return []
    held, pools = held_capacity(ctx.config, lo.device_capacity_tokens, lo.host_capacity_tokens)
    cover = _covered(lo.hot_competing_deciles_tokens, held)
    if cover is None:
        return []  # no re-reference to simulate (evidence from before the prediction): nothing predicted
    kept = int(cover * lo.hot_removed_tokens)
    if not _significant(kept, lo.input_tokens):
        return []  # the hot prefixes alone outgrow the pools: lfu would evict them all the same
    return [Advice(
        "eviction_policy", "eviction_policy", "lfu", {"eviction_policy": "lfu"},
        C.advice_eviction_claim(hot_tokens=lo.hot_removed_tokens, removed_tokens=removed, policy=policy).text,
        {"hot_removed_tokens": lo.hot_removed_tokens, "removed_tokens": removed,
         "hot_competing_p90_tokens": lo.hot_competing_deciles_tokens[9], "held_tokens": held},
        prediction=(f"predicted under lfu (once-hit content evicted first): keeps ~{fmt_tokens(kept)} of the "
                    f"{fmt_tokens(lo.hot_removed_tokens)} hot tokens lost, those whose live hot prefixes "
                    f"fit {pools}"))]


def _page_size(ctx: RunContext) -> list[Advice]:
    tr = ctx.transfers
    page = int(ctx.config.get("page_size") or 64)
    block = int(ctx.config.get("block_size") or page)
    if (not tr.num_loadbacks or tr.link_peak_share is None or tr.link_peak_share >= SLOW_LINK_SHARE
            or tr.loadback_exposed_ns < EXPOSED_SHARE_OF_TTFT * tr.tiered_ttft_ns):
        return []
    fragmented = ((tr.pages_per_run or 0) < FRAGMENTED_PAGES_PER_RUN or (tr.bytes_per_run or 0) < SMALL_RUN_BYTES
                  or (tr.bytes_per_page or 0) < SMALL_PAGE_BYTES)
    new = min(page * PAGE_SIZE_FACTOR, block)
    if not fragmented or new <= page:
        return []
    after = _loadback_after_pages(tr, new / page)
    if after is None:
        return []  # the copies' parts are not known (an import): nothing predicted
    exposed_after = int(tr.loadback_exposed_ns * after / tr.loadback_busy_ns)
    if tr.loadback_exposed_ns - exposed_after < EXPOSED_SHARE_OF_TTFT * tr.tiered_ttft_ns:
        return []  # larger pages would save too little of the load-backs' TTFT to be worth it
    return [Advice(
        "page_size", "page_size", new, {"page_size": new},
        C.advice_page_size_claim(link_peak_share=tr.link_peak_share, bytes_per_page=tr.bytes_per_page,
                                 pages_per_run=tr.pages_per_run, bytes_per_run=tr.bytes_per_run,
                                 exposed_ns=tr.loadback_exposed_ns, tiered_ttft_ns=tr.tiered_ttft_ns).text,
        {"link_peak_share": tr.link_peak_share, "pages_per_run": tr.pages_per_run,
         "bytes_per_run": tr.bytes_per_run, "bytes_per_page": tr.bytes_per_page, "loadback_exposed_ms": ns_to_ms(tr.loadback_exposed_ns),
         "loadback_busy_ms": ns_to_ms(tr.loadback_busy_ns), "loadback_busy_after_ms": ns_to_ms(after)},
        prediction=(f"predicted with the engine's copy costs ({SEGMENT_OVERHEAD_NS} ns a page and {RUN_OVERHEAD_NS} ns a "
                    f"contiguous run, a layer, beside the bytes over the link): load-backs take ~{fmt_ms(after)} "
                    f"instead of {fmt_ms(tr.loadback_busy_ns)}, exposed load-back ~{fmt_ms(exposed_after)} instead "
                    f"of {fmt_ms(tr.loadback_exposed_ns)}"))]


def _loadback_after_pages(tr, factor: float) -> int | None:
    """The run's load-back link time with pages `factor` times larger, by the cost model's copy
    time (engine/costmodel.py copy_ns): per transfer overhead + bytes / link + layers x
    (SEGMENT_OVERHEAD_NS x pages + RUN_OVERHEAD_NS x runs). The bytes-over-link part is the
    run's busy time x its link peak share; the per-layer part is what remains beside the
    transfers' fixed overhead, split between pages and runs by their weights. Pages shrink by
    `factor`; runs stay, at most one a page. Ignores: partial pages at a prefix's end (larger
    pages match whole pages only), and measured (`--timing wall`) copies."""
    if (not tr.num_loadbacks or not tr.loadback_busy_ns or tr.link_peak_share is None or not tr.bytes_per_page
            or not tr.bytes_per_run or tr.transfer_overhead_ns is None):
        return None
    pages, runs = tr.loadback_bytes / tr.bytes_per_page, tr.loadback_bytes / tr.bytes_per_run
    wire = tr.loadback_busy_ns * min(tr.link_peak_share, 1.0)
    per_layer = max(tr.loadback_busy_ns - wire - tr.num_loadbacks * tr.transfer_overhead_ns, 0.0)
    weight = SEGMENT_OVERHEAD_NS * pages + RUN_OVERHEAD_NS * runs
    pages_after = pages / factor
    runs_after = min(runs, pages_after)
    scaled = per_layer * (SEGMENT_OVERHEAD_NS * pages_after + RUN_OVERHEAD_NS * runs_after) / weight
    return int(tr.loadback_busy_ns - per_layer + scaled)


def _rate(ctx: RunContext) -> list[Advice]:
    """The offered prefill exceeded the GPU for a material share of the run (capacity.py): no
    cache setting removes that queue. The verifiable change is the rate: the replay's
    time_scale spreads the arrivals until the busiest window is offered TARGET_LOAD of the GPU."""
    cap = ctx.capacity
    if cap is None or not cap.overloaded:
        return []
    if getattr(ctx.losses, "trace_arrival_spread_ns", None) == 0:
        return []  # every request arrived at once: no time_scale changes anything (issue 40)
    current = float(ctx.config.get("time_scale") or 1.0)
    want = _round_up_2(cap.time_scale_for(current))
    if want > MAX_TIME_SCALE or want <= current:
        return []
    return [Advice(
        "rate", "time_scale", want, {"time_scale": want},
        C.advice_rate_claim(cap, want=want, current=current, material_share=MATERIAL_SHARE).text,
        {"overloaded_share": cap.overloaded_share, "overload_factor": cap.overload_factor,
         "material_load": cap.material_load, "peak_load": cap.peak_load, "window_ms": ns_to_ms(cap.window_ns),
         "time_scale": current},
        prediction=(f"predicted: fewer than {fmt_pct(MATERIAL_SHARE)} of the windows offered more than "
                    f"{fmt_pct(TARGET_LOAD)} of the GPU, so the queue that capacity made goes"))]


def _round_up_2(x: float) -> float:
    """Up to two significant digits (3.41 -> 3.5, 62.3 -> 63): a time_scale a user can type."""
    import math

    if x <= 0:
        return x
    e = math.floor(math.log10(x)) - 1
    return round(math.ceil(round(x / 10 ** e, 9)) * 10 ** e, max(-e, 0))


RULES = (_rate, _prefetch, _write_policy, _sessions, _capacity, _eviction_policy, _page_size) + ROUTING_RULES \
    + IN_BATCH_RULES


def _nothing(ctx: RunContext) -> Advice:
    lo, tr = ctx.losses, ctx.transfers
    text = C.advice_none_claim(recomputed_share=lo.recomputed_share, num_finished=ctx.num_finished,
                               num_loadbacks=tr.num_loadbacks, loadback_ns=tr.loadback_ns,
                               link_peak_share=tr.link_peak_share,
                               recompute_instead_extra_ns=tr.recompute_instead_extra_ns).text
    return Advice("none", None, None, {}, text,
                  {"recomputed_share": lo.recomputed_share, "link_peak_share": tr.link_peak_share})


def propose(ctx: RunContext, *, host_limit_bytes: int = HOST_POOL_LIMIT_BYTES,
            sessions: SessionPauses | None = None, curves=None) -> tuple[Advice, ...]:
    """Every rule that fires, biggest loss first; else the one "nothing to change" item. The
    rate leads only where the requests' queues were not the cache's doing (story.py): where
    they were, the cache rules come first and the rate after them. `sessions`: the run's later
    session turns (session_pool.session_pauses), for the session rule; None: it does not fire.
    `curves`: the run's size curves (size_curves.py), which size the capacity rule's host pool and
    storage tier at their knees; None: sized from the removed tokens' reuse distance.
    Two rules that propose the same change (a host pool for the sessions and for capacity) are
    one replay: the first is kept."""
    items: list[Advice] = []
    for rule in RULES:
        found = (rule(ctx, host_limit_bytes, curves) if rule is _capacity else
                 rule(ctx, sessions, host_limit_bytes) if rule is _sessions else rule(ctx))
        items += [a for a in found if all(a.changes != b.changes for b in items)]
    top = ctx.story.top if ctx.story is not None else None
    if top is not None and (top.caches_doing or top.cause == "recompute"):
        items = [a for a in items if a.kind != "rate"] + [a for a in items if a.kind == "rate"]
    items = routing_first(ctx, items)
    # A host pool is per rank (each scheduler process allocates its own): its cost is paid by every
    # rank, and it is capped by the host memory beside one GPU; both are stated with the item.
    ranks = ctx.config.get("dp")
    ranks = ranks if isinstance(ranks, int) and not isinstance(ranks, bool) and ranks >= 1 else 1
    items = [dataclasses.replace(a, cost_ranks=ranks, host_limit_words=limit_words(host_limit_bytes))
             if a.cost_kind == "host_memory" else a for a in items]
    return tuple(items) if items else (_nothing(ctx),)


__all__ = ["Advice", "Verified", "propose", "classify", "advised", "tried_not_advised", "advice_json", "STATUSES",
           "NEAR_PEAK_SHARE", "fmt_ms_value"]  # what advise replayed, measured: advice_verify.py
