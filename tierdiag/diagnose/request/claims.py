"""The sentences of a verdict, each from one small function over typed evidence.

Every claim `explain` prints about a request is built here from that request's own numbers
(its `requests` row, its TTFT parts, its queue attribution, its context) or from the run's
(`RunContext`), and from nothing else: no sentence keys on the hit class alone. A claim is a
`Claim(name, text)`; the verdict is its claims in order, so a test can take a verdict apart
and check each claim against the rows (tests/diagnose/test_claims.py).
The run's own sentences (capacity, queue, losses, routing) are run_claims.py's.

Vocabulary the checks rely on (keep them in step):
  "a full device hit"          every reused token was on device and nothing was recomputed
  "no longer in any tier"      recomputed tokens neither skipped, nor matched in storage, nor read
                               by its prefetch and lost (miss_prefetch_lost_tokens), nor routed
  "read from storage by its prefetch"  miss_prefetch_lost_tokens (engine/miss.py prefetch_lost)
  "matched in storage"         the storage match the request did not use, with its reason
  "the cache's doing"          recompute took >= RECOMPUTE_QUEUE_SHARE of its wait on a GPU
                               at least BUSY_SHARE busy
"""

from __future__ import annotations

from dataclasses import dataclass

from tierdiag.config.names import Cause
from tierdiag.diagnose.request.causes import recompute_cost_ns, routing_tokens  # recompute_cost_ns: re-exported (views)
from tierdiag.diagnose.request.context import CONTEXT_LOOKBACK_NS, QueueAttribution, RequestContext, WaitPart
from tierdiag.diagnose.dp.routing_loss import routing_cost_ns
from tierdiag.diagnose.run.story import BUSY_SHARE, CAP_SHARE, RECOMPUTE_QUEUE_SHARE  # noqa: F401 - the rule's, re-exported
from tierdiag.units import NS_PER_S, fmt_bandwidth, fmt_bytes, fmt_ms, fmt_pct, fmt_tokens, share
from tierdiag.diagnose.read.requests import RequestRow, RowLike

# The queue is called the cache's doing when recomputing once-cached tokens took at least
# RECOMPUTE_QUEUE_SHARE of a request's wait (other requests' recompute), on a prefill GPU at least
# BUSY_SHARE busy: queueing grows steeply with load, so that share of the work is what made the
# wait. Defined once in story.py (imported above), which applies the same rule to every request.
# A load-back at or above this share of the link's peak is as fast as the link goes.
NEAR_PEAK_SHARE = 0.8
# Run-level: a removal reason is named when it holds at least this share of the removed tokens.
NAMED_REASON_SHARE = 0.3

SKIP_WHY = {
    "below_threshold": "below the {threshold}-token load-back threshold",
    "device_full": "device memory could not be freed to load it back",
}
STORAGE_WHY = {
    "prefetch_incomplete": "its prefetch had not completed when the request was scheduled",
    "below_threshold": "the match was shorter than the prefetch threshold",
    "host_full": "host memory had no room to prefetch it into",
    "rate_limited": "prefetches in flight already held the host room allowed for them",
    "not_backed_up": "the last device node on its path had no host copy, so no prefetch started",
}


@dataclass(frozen=True)
class Claim:
    name: str
    text: str

    def to_json(self) -> dict:
        return {"name": self.name, "text": self.text}


def _pct_of(part: int, whole: int) -> str:
    return fmt_pct(share(part, whole))


# --------------------------------------------------------------------------- tokens


# "A full device hit" also needs the new tokens to be a small part of the input: a request that
# computed 37 % of its input was no full hit, though every token it reused was on device (issue 40).
FULL_HIT_NEW_SHARE = 0.05


def is_full_device_hit(device: int, host: int, storage: int, recomputed: int, new: int | None = None) -> bool:
    """Every reused token on device, nothing recomputed, and (given `new`) at most
    FULL_HIT_NEW_SHARE of the input new."""
    if not (device > 0 and host == 0 and storage == 0 and recomputed == 0):
        return False
    return new is None or new <= FULL_HIT_NEW_SHARE * (device + new)


def cache_context(tokens, *, short: bool = False) -> str:
    """Where its input came from, in shares of its own input (the headline uses `short`)."""
    n = tokens.input_tokens
    d, h, s, r = tokens.device_tokens, tokens.host_tokens, tokens.storage_tokens, tokens.recomputed_tokens
    new = tokens.new_tokens
    if d + h + s == 0 and r == 0:
        return f"the cache had nothing to offer (all {fmt_tokens(n)} tokens new)"
    # "A full device hit" reads as "all of it came from the GPU", so it is said only when at most
    # FULL_HIT_NEW_SHARE of the input was new (else shares: "its input was 63 % device, 37 % new").
    if is_full_device_hit(d, h, s, r, new):
        return ("the cache was a full device hit" if short else
                f"the cache was a full device hit ({fmt_tokens(d)} of {fmt_tokens(n)} input tokens on device, "
                f"nothing recomputed)")
    parts = [(d, "device"), (h, "host"), (s, "storage")]
    served = [f"{_pct_of(v, n)} {name}" for v, name in parts if v]
    rest = ([f"{_pct_of(r, n)} recomputed"] if r else []) + ([f"{_pct_of(new, n)} new"] if new else [])
    if short:
        return "its input was " + ", ".join(served + rest)
    text = f"of its {fmt_tokens(n)} input tokens "
    text += ("the cache served " + ", ".join(f"{p} ({fmt_tokens(v)})" for p, v in
                                             zip(served, [v for v, _ in parts if v]))) if served else \
        "the cache served none"
    if rest:
        text += "; " + " and ".join(
            ([f"{_pct_of(r, n)} ({fmt_tokens(r)}) were once-cached tokens recomputed"] if r else [])
            + ([f"{_pct_of(new, n)} ({fmt_tokens(new)}) were new"] if new else []))
    return text


# --------------------------------------------------------------------------- the primary cause


def none_claim(tolerance_pct: int) -> Claim:
    return Claim("none", f"That is within {tolerance_pct} % of the ideal, so it was not slow for any reason "
                         f"worth naming.")


def load_back_claim(row: RowLike, loaded: int, reused: int, lb_bytes: int, lb_ns: int,
                    achieved_bytes_per_s: float | None) -> Claim:
    row = RequestRow.of(row)
    exposed, ttft = int(row.loadback_exposed_ns or 0), int(row.ttft_ns or 0)
    return Claim("load_back", (
        f"{fmt_tokens(loaded)} of its {fmt_tokens(reused)} reused tokens were not on the device and had to be "
        f"loaded back ({fmt_bytes(lb_bytes)} in {fmt_ms(lb_ns)}"
        + (f" at {fmt_bandwidth(achieved_bytes_per_s)}" if achieved_bytes_per_s else "")
        + f"); {fmt_ms(exposed)} of that ({_pct_of(exposed, ttft)} of TTFT) was not hidden behind compute."))


def storage_fetch_claim(row: RowLike, storage_bytes: int) -> Claim:
    row = RequestRow.of(row)
    wait, ttft = int(row.storage_wait_ns or 0), int(row.ttft_ns or 0)
    used, matched = int(row.storage_hit_tokens or 0), int(row.storage_match_tokens or 0)
    text = (f"It was held back {fmt_ms(wait)} ({_pct_of(wait, ttft)} of TTFT) while {fmt_tokens(matched)} tokens of "
            f"its prefix, on neither device nor host, were fetched from storage ({fmt_bytes(storage_bytes)})")
    if used != matched:
        text += f"; {fmt_tokens(used)} of them were used"
    return Claim("storage_fetch", text + ".")


def compute_claim(row: RowLike, new_tokens: int, beyond_ideal_ns: int) -> Claim:
    row = RequestRow.of(row)
    chunks = int(row.num_chunks or 0) or 1
    return Claim("compute", (
        f"Its own compute of {fmt_tokens(new_tokens)} new tokens took {fmt_ms(int(row.compute_ns or 0))}, "
        f"{fmt_ms(beyond_ideal_ns)} more than its ideal ({chunks} prefill chunk{'s' if chunks > 1 else ''})."))


def evicted_by_claim(evicted_by: tuple[str, ...], tiers: set[str], thrashing: bool) -> Claim:
    where = ("pushed off the device" if tiers == {"device"} else
             "deleted from host" if "device" not in tiers else "pushed off the device and out of host")
    return Claim("evicted_by", (
        f"The prefix was {where} by request{'s' if len(evicted_by) > 1 else ''} "
        f"{', '.join(evicted_by[:5])}{' and others' if len(evicted_by) > 5 else ''}"
        + (" while the device pool was thrashing." if thrashing else ".")))


# --------------------------------------------------------------------------- queue


def queue_is_the_caches_doing(qa: QueueAttribution | None, ctx: RequestContext | None) -> bool:
    if qa is None or ctx is None or not qa.queue_ns or ctx.prefill_busy_share is None:
        return False
    return (qa.share_of(WaitPart.RECOMPUTE) or 0) >= RECOMPUTE_QUEUE_SHARE and ctx.prefill_busy_share >= BUSY_SHARE


_WAIT_WORDS = {
    WaitPart.RECOMPUTE: "recomputing once-cached tokens of other requests",
    WaitPart.NEW_COMPUTE: "computing other requests' new tokens",
    WaitPart.LOAD_BACK: "on exposed load-backs of other requests",
    WaitPart.WRITE_BACK: "blocked on write-backs at eviction",
    WaitPart.DECODE: "running decode steps of the requests ahead",
    WaitPart.MEMORY_WAIT: "idle, the queue waiting for device memory that decoding requests held",
    WaitPart.STORAGE_WAIT: "idle while requests waited for storage prefetches",
    WaitPart.IDLE: "idle",
}


def queue_claim(row: RowLike, qa: QueueAttribution | None, ctx: RequestContext | None,
                run_why: str | None) -> Claim:
    row = RequestRow.of(row)
    queue, ttft = int(row.queue_ns or 0), int(row.ttft_ns or 0)
    text = f"It waited {fmt_ms(queue)} ({_pct_of(queue, ttft)} of TTFT) in the queue or sharing batches"
    if ctx is not None:
        text += (f"; {fmt_tokens(ctx.queue_depth_at_arrival)} requests were queued ahead of it at arrival and the "
                 f"prefill GPU was {fmt_pct(ctx.prefill_busy_share)} busy from {CONTEXT_LOOKBACK_NS // NS_PER_S} s "
                 f"before its arrival to its first token")
    if qa is None or not queue:
        return Claim("queue", text + ".")
    parts = sorted(((k, v) for k, v in qa.parts_ns.items() if v), key=lambda kv: -kv[1])
    text += ". Meanwhile the GPU spent " + ", ".join(
        f"{fmt_ms(v)} ({_pct_of(v, queue)}) {_WAIT_WORDS[k]}" for k, v in parts) + "."
    rshare = qa.share_of(WaitPart.RECOMPUTE) or 0
    if queue_is_the_caches_doing(qa, ctx):
        text += (f" The queue was the cache's doing: other requests recomputing prefixes the cache had held and lost "
                 f"took {fmt_pct(rshare)} of its wait (at least {fmt_pct(RECOMPUTE_QUEUE_SHARE)} makes it so), on a "
                 f"GPU {fmt_pct(ctx.prefill_busy_share)} busy (at least {fmt_pct(BUSY_SHARE)}; "
                 f"{fmt_pct(ctx.prefill_busy_share * (1 - (ctx.recompute_share_of_prefill or 0)))} busy had it not "
                 f"recomputed them)")
        text += f"; {run_why}." if run_why else "."
    elif ctx is not None and ctx.prefill_busy_share is not None:
        text += " " + wait_not_the_caches_doing(qa, ctx.prefill_busy_share)
    held = cap_held_sentence(ctx, queue)
    return Claim("queue", text + (" " + held if held else ""))


def cap_reason(cap: int, given: bool, whose: str = "their") -> str:
    """Who ran while the queue was held: the cap, and where its value came from."""
    return (f"{cap:,} request{'s' if cap != 1 else ''} {'were' if cap != 1 else 'was'} running on {whose} scheduler, "
            f"the max_running_requests cap ({'given' if given else 'derived from the device pool'})")


def cap_held_sentence(ctx: RequestContext | None, queue: int) -> str | None:
    """Where its rank ran max_running_requests requests for at least CAP_SHARE of its wait
    (context.at_cap_ns, running.py): the cap held it, not the GPU."""
    if ctx is None or ctx.max_running is None or not queue or (share(ctx.at_cap_ns, queue) or 0) < CAP_SHARE:
        return None
    return (f"For {fmt_ms(ctx.at_cap_ns)} ({_pct_of(ctx.at_cap_ns, queue)}) of its wait "
            f"{cap_reason(ctx.max_running, ctx.max_running_given, 'its')}: the cap held it, not the GPU.")


def wait_not_the_caches_doing(qa: QueueAttribution, busy: float) -> str:
    """Why its wait was not the cache's doing, naming the threshold that decided, and the largest
    part of the wait as it was (idle for memory is idle, not "computing new tokens"). About the
    wait only: its own recompute is a TTFT part of its own, told apart (issue 40)."""
    rshare = qa.share_of(WaitPart.RECOMPUTE) or 0
    if rshare < RECOMPUTE_QUEUE_SHARE:
        why = (f"other requests' recompute of once-cached tokens took {fmt_pct(rshare)} of it, below the "
               f"{fmt_pct(RECOMPUTE_QUEUE_SHARE)} at which a queue is the cache's doing")
    else:
        why = (f"the prefill GPU was {fmt_pct(busy)} busy around it, below the {fmt_pct(BUSY_SHARE)} at which a queue "
               f"is the cache's doing")
    top = qa.largest()
    return (f"Its wait (not its own TTFT parts) was not the cache's doing: {why}; the largest part of the wait "
            f"({_pct_of(qa.parts_ns[top], qa.queue_ns)}) the GPU was {_WAIT_WORDS[top]}.")


# --------------------------------------------------------------------------- recompute


def recomputed_split(row: RowLike) -> tuple[int, int, int, int, int]:
    """Its recomputed tokens as (skipped host hit, read by its own prefetch and evicted from host
    before it was scheduled, storage match not used, held by another rank at its arrival
    (routing), gone from every tier), in engine/miss.py's order (the prefetch's loss is its
    `miss_prefetch_lost_tokens`: NULL, so 0, in a run recorded before it)."""
    row = RequestRow.of(row)
    recomputed = int(row.recomputed_tokens or 0)
    skipped = min(int(row.loadback_skipped_tokens or 0), recomputed) if row.loadback_skipped_reason else 0
    lost_read = min(max(int(row.miss_prefetch_lost_tokens or 0), 0), recomputed - skipped)
    unused = 0
    if row.storage_skipped_reason:
        unused = min(max(int(row.storage_match_tokens or 0) - int(row.storage_hit_tokens or 0) - lost_read, 0),
                     recomputed - skipped - lost_read)
    routed = min(routing_tokens(row), recomputed - skipped - lost_read - unused)
    return skipped, lost_read, unused, routed, recomputed - skipped - lost_read - unused - routed


def recompute_reasons(row: RowLike, threshold: int | None, host_deleted_tokens: int, storage_tier: bool) -> list[str]:
    """Why its recomputed tokens were recomputed, one phrase per reason that holds tokens."""
    row = RequestRow.of(row)
    skipped, lost_read, unused, routed, lost = recomputed_split(row)
    why = []
    if skipped:
        reason = row.loadback_skipped_reason
        detail = SKIP_WHY.get(reason, reason).format(threshold=fmt_tokens(threshold) if threshold else "?")
        why.append(f"{fmt_tokens(skipped)} were a host hit whose load-back was skipped ({reason}: {detail})")
    if lost_read:
        why.append(prefetch_lost_phrase(lost_read))
    if unused:
        reason = row.storage_skipped_reason
        why.append(f"{fmt_tokens(unused)} were matched in storage but not used ({reason}: "
                   f"{STORAGE_WHY.get(reason, reason)})")
    if routed:
        why.append(f"{fmt_tokens(routed)} were held by rank {row.best_rank} at its arrival, not by rank "
                   f"{row.dp_rank} that served it")
    if lost:
        where = "no longer in any tier"
        if host_deleted_tokens:
            where += " (deleted from host" + (", and not in storage" if storage_tier else ", no storage tier") + ")"
        elif not storage_tier:
            where += " (no storage tier)"
        why.append(f"{fmt_tokens(lost)} were {where}")
    return why


def prefetch_lost_phrase(tokens: int) -> str:
    """The tokens its own prefetch read into host and host pressure deleted before it was scheduled
    (engine/miss.py prefetch_lost), with what keeps them: SGLang 0.5.23 inserts a finished
    prefetch's pages unprotected (`_handle_prefetch_result` -> `insert_host`) and queries storage
    again only when the device + host match falls below the one at its last query
    (`_prefetch_after_device_hit_loss`), which these pages were past. No prefetch policy protects
    them (the read had finished); host room does, or a shorter wait."""
    return (f"{fmt_tokens(tokens)} were read from storage by its prefetch, then evicted from host before it was "
            f"scheduled (SGLang inserts a finished prefetch unprotected and does not query storage again for it: "
            f"a larger host pool (host_tokens) or a shorter queue keeps them)")


def recompute_claim(row: RowLike, threshold: int | None, host_deleted_tokens: int, storage_tier: bool) -> Claim:
    row = RequestRow.of(row)
    recomputed = int(row.recomputed_tokens or 0)
    why = recompute_reasons(row, threshold, host_deleted_tokens, storage_tier)
    rec_ns, ttft = recompute_cost_ns(row), int(row.ttft_ns or 0)
    return Claim("recompute", f"{fmt_tokens(recomputed)} tokens that had been cached before were computed again: "
                              f"{'; '.join(why)}; that took {fmt_ms(rec_ns)} ({_pct_of(rec_ns, ttft)} of TTFT).")


# --------------------------------------------------------------------------- counterfactuals


def never_evicted_ns(row: RowLike) -> int | None:
    """TTFT had every once-cached or loaded token been device-resident, the same queue ahead."""
    row = RequestRow.of(row)
    if row.ttft_ns is None:
        return None
    return (int(row.ttft_ns or 0) - recompute_cost_ns(row) - int(row.loadback_exposed_ns or 0)
            - int(row.storage_wait_ns or 0))


def fmt_ms_pair(a: int, b: int) -> tuple[str, str]:
    """Two times as text that differ when the times do: where their rounding hides the
    difference, the second says it ("7.5 h (11.95 s less)" rather than "7.5 h instead of 7.5 h")."""
    ta, tb = fmt_ms(a), fmt_ms(b)
    if ta == tb and a != b:
        ta += f" ({fmt_ms(abs(b - a))} {'less' if a < b else 'more'})"
    return ta, tb


def counterfactual_claim(row: RowLike) -> Claim | None:
    row = RequestRow.of(row)
    tiered = int(row.host_hit_tokens or 0) + int(row.storage_hit_tokens or 0)
    recomputed = int(row.recomputed_tokens or 0)
    if not tiered and not recomputed:
        return None
    ttft, never = int(row.ttft_ns or 0), never_evicted_ns(row)
    text = (f"Had its prefix never been evicted ({fmt_tokens(tiered + recomputed)} tokens device-resident instead of "
            f"loaded or recomputed, the same queue ahead), ")
    if never == ttft:
        # Nothing of getting them was exposed (a prefetch that finished while it queued): the
        # counterfactual is its TTFT, and "would have been X instead of X" claims no difference.
        text += (f"TTFT would have been the same {fmt_ms(ttft)}: loading and recomputing them added no time to it "
                 f"(no exposed load-back, no storage wait, no recompute beyond its new tokens' ideal)")
    else:
        would, was = fmt_ms_pair(never, ttft)
        text += f"TTFT would have been {would} instead of {was}"
    if tiered and row.recompute_instead_ns is not None:
        if recomputed and row.ttft_if_device_resident_ns is not None:
            text += (f"; with only its {fmt_tokens(tiered)} loaded tokens device-resident, "
                     f"{fmt_ms(row.ttft_if_device_resident_ns)}")
        text += f"; recomputing those {fmt_tokens(tiered)} tokens instead of loading them, {fmt_ms(row.recompute_instead_ns)}"
    return Claim("counterfactual", text + ".")


def break_even_claim(row: RowLike, link_peak_share: float | None, achieved_bytes_per_s: float | None,
                     cause: str | None = None) -> Claim | None:
    """Load-back vs recompute for the tokens it loaded: which was cheaper, by how much. Where
    load-back is the request's primary cause, a fast link is not "nothing to fix": it says why
    both hold (the link is not what to fix; the tokens' being off the device is)."""
    row = RequestRow.of(row)
    tiered = int(row.host_hit_tokens or 0) + int(row.storage_hit_tokens or 0)
    lb_ns = int(row.loadback_ns or 0)
    if not tiered or not lb_ns or row.recompute_instead_ns is None or row.ttft_if_device_resident_ns is None:
        return None
    recompute_cost = int(row.recompute_instead_ns or 0) - int(row.ttft_if_device_resident_ns or 0)
    text = f"Loading back {fmt_tokens(tiered)} tokens took {fmt_ms(lb_ns)} on the link"
    if achieved_bytes_per_s:
        text += f" at {fmt_bandwidth(achieved_bytes_per_s)}"
        if link_peak_share is not None:
            text += f" ({fmt_pct(link_peak_share)} of peak)"
    text += f"; recomputing them would have cost {fmt_ms(recompute_cost)}"
    if recompute_cost > lb_ns:
        text += f": load-back was {recompute_cost / lb_ns:,.1f}× cheaper"
        if link_peak_share is not None and link_peak_share >= NEAR_PEAK_SHARE:
            text += (", and the link ran near its peak: the load-back itself cannot go faster; what would lower "
                     "this request's TTFT is having those tokens on the device (a larger device pool), since "
                     "load-back is its largest part" if cause == Cause.LOAD_BACK else
                     ", and the link ran near its peak: nothing to fix in the load-back")
    elif recompute_cost > 0:
        text += f": recomputing would have been {lb_ns / recompute_cost:,.1f}× cheaper"
    return Claim("break_even", text + ".")


def routing_claim(row: RowLike, config: dict) -> Claim | None:
    """The request's routing sentence: where its prefix was, where the router sent it, what that cost."""
    row = RequestRow.of(row)
    r = routing_tokens(row)
    if not r:
        return None
    rank, best = row.dp_rank, row.best_rank
    bd, bh = int(row.best_rank_device_tokens or 0), int(row.best_rank_host_tokens or 0)
    own = int(row.arrival_device_tokens or 0) + int(row.arrival_host_tokens or 0)
    cost, ttft = routing_cost_ns(row, config), int(row.ttft_ns or 0)
    why = row.route_reason
    text = (f"At its arrival rank {best} held {fmt_tokens(bd + bh)} tokens of its prefix ({fmt_tokens(bd)} on device, "
            f"{fmt_tokens(bh)} on host) against {fmt_tokens(own)} on rank {rank}; the router sent it to rank {rank}"
            + (f" ({why})" if why else "")
            + f", so {fmt_tokens(r)} of its {fmt_tokens(int(row.recomputed_tokens or 0))} "
            f"recomputed tokens were lost to routing; recomputing them took {fmt_ms(cost)} "
            f"({fmt_pct(share(cost, ttft))} of TTFT, priced by their position in the context).")
    return Claim("routing", text)
