"""The run's sentences: what a run's verdict (`summary`, the report) says about its capacity,
its queue, why its once-cached tokens were lost and what routing cost it, each from one small
function over the run's typed evidence (RunContext, the run story, RoutingLoss); the request's
sentences are claims.py's. Checked against the rows by tests/diagnose/test_run_claims*.py."""

from __future__ import annotations

from tierdiag.config.names import WritePolicy
from tierdiag.diagnose.request.claims import NAMED_REASON_SHARE, Claim, cap_reason
from tierdiag.diagnose.request.context import WaitPart
from tierdiag.diagnose.dp.routing_loss import RoutingLoss
from tierdiag.diagnose.run.runcontext import RunContext
from tierdiag.diagnose.run.story import BUSY_SHARE, CAP_SHARE, RECOMPUTE_QUEUE_SHARE
from tierdiag.units import fmt_ms, fmt_pct, fmt_tokens, share



def held_capacity(config: dict, device: int | None, host: int | None) -> tuple[int, str]:
    """Tokens the pools can keep cached, and how to say it. write_through keeps a host copy of
    everything on device, so the host pool alone bounds it; otherwise host holds what device
    evicted and the two add up."""
    device, host = device or 0, host or 0
    if config.get("write_policy") == WritePolicy.WRITE_THROUGH:
        return host, f"{fmt_tokens(host)} tokens of host (write_through keeps a host copy of the device's)"
    return device + host, f"{fmt_tokens(device + host)} tokens of device + host"


def loss_why(run: RunContext | None) -> str | None:
    """Why the run's once-cached tokens were lost, from the run's removal records; None if none were."""
    if run is None:
        return None
    lo = run.losses
    if not lo.recomputed_tokens:
        return None
    text = (f"run-wide {fmt_tokens(lo.recomputed_tokens)} once-cached tokens ({fmt_pct(lo.recomputed_share)} of input) "
            f"were recomputed")
    parts = []
    if lo.deleted_from_host_tokens:
        cap, pools = held_capacity(run.config, lo.device_capacity_tokens, lo.host_capacity_tokens)
        p = f"{fmt_tokens(lo.deleted_from_host_tokens)} had been deleted from host"
        if lo.removed_reuse_p50_tokens is not None and cap:
            p += (f" with a reuse distance of {fmt_tokens(lo.removed_reuse_p50_tokens)} tokens at the median and "
                  f"{fmt_tokens(lo.removed_reuse_p90_tokens)} at p90 against {pools}")
            if lo.removed_reuse_p50_tokens > cap:
                p += ": pools of this size cannot keep most of them (capacity)"
            elif (lo.removed_reuse_p90_tokens or 0) > cap:
                p += ": pools of this size cannot keep the farthest of them (capacity)"
            else:
                p += ": they would have fit, so pressure pushed them out"
        parts.append(p)
    if lo.dropped_unbacked_tokens:
        parts.append(f"{fmt_tokens(lo.dropped_unbacked_tokens)} were dropped from device without a host copy "
                     f"(write_policy {run.config.get('write_policy', '?')})")
    removed = lo.deleted_from_host_tokens + lo.dropped_unbacked_tokens
    if lo.hot_removed_tokens and removed and lo.hot_removed_tokens >= NAMED_REASON_SHARE * removed:
        parts.append(f"{fmt_tokens(lo.hot_removed_tokens)} came from hot prefixes (hit 3 or more times) that "
                     f"eviction_policy {run.config.get('eviction_policy', '?')} evicted")
    for reason, n in sorted(lo.skipped_tokens.items()):
        parts.append(f"{fmt_tokens(n)} were host hits skipped ({reason})")
    for reason, n in sorted(lo.storage_unused_tokens.items()):
        parts.append(f"{fmt_tokens(n)} were matched in storage but not used ({reason})")
    return text + (": " + "; ".join(parts) if parts else "")



# --------------------------------------------------------------------------- the run's verdict
#
# Every sentence of the run's diagnosis is a Claim built here from named numbers: the requests'
# own verdicts (story.RunStory), the offered load (capacity.Capacity) and the run's evidence.


_RUN_WAIT_WORDS = {WaitPart.RECOMPUTE: "recomputing once-cached tokens", WaitPart.NEW_COMPUTE: "computing new tokens",
                   WaitPart.LOAD_BACK: "on exposed load-backs", WaitPart.WRITE_BACK: "blocked on write-backs",
                   WaitPart.DECODE: "running decode steps",
                   WaitPart.MEMORY_WAIT: "idle waiting for device memory that decoding requests held",
                   WaitPart.IDLE: "idle (no prefill batch and none decoding: held for storage, or nothing to run)"}


def gpus(cap) -> str:
    """What capacity's loads are per: one GPU, or (a data-parallel run) each rank's."""
    n = getattr(cap, "num_ranks", 1)
    return "one GPU" if n <= 1 else f"each of its {n} ranks' GPUs (spread evenly)"


def capacity_claim(cap) -> Claim:
    """Offered prefill above one GPU for a material share of the run: named first."""
    return Claim("capacity", (
        f"Offered prefill was {cap.overload_factor:,.1f}× {gpus(cap)} for {fmt_pct(cap.overloaded_share)} of the run "
        f"(the ideal prefill of the requests arriving in each {fmt_ms(cap.window_ns)} window, recompute "
        f"excluded; {cap.peak_load:,.1f}× at the busiest): no cache setting removes this queue, only a lower "
        f"request rate or more GPUs."))


def verdicts_claim(story) -> Claim:
    """Which verdicts carry the run's excess TTFT, largest first (up to three)."""
    named = [v for v in story.verdicts if v.excess_ns > 0][:3]
    parts = [f"{v.label} {fmt_pct(v.excess_share)} ({v.num_requests:,} request{'s' if v.num_requests != 1 else ''})"
             for v in named]
    return Claim("verdicts", "By the requests' own verdicts, the run's excess TTFT "
                             f"({fmt_ms(story.excess_total_ns)}) is " + ", ".join(parts) + ".")


def queued_wait_claim(story, run_busy_share: float | None) -> Claim:
    """Around the queued requests (their own windows, excess-weighted) and what their wait was."""
    parts = sorted(((k, v) for k, v in story.queued_wait_parts_ns.items() if v > 0), key=lambda kv: -kv[1])
    text = (f"Around the requests that queued, the prefill GPU was {fmt_pct(story.queued_busy_share)} busy "
            f"(each in its own window, weighted by its excess")
    text += f"; {fmt_pct(run_busy_share)} over the run's whole span, idle time included)" if run_busy_share is not None \
        else ")"
    if parts:
        text += "; of their wait it spent " + ", ".join(
            f"{fmt_pct(share(v, story.queued_wait_ns))} {_RUN_WAIT_WORDS[k]}" for k, v in parts)
    return Claim("queued_wait", text + ".")


def cap_held(story, overloaded: bool) -> bool:
    """The max_running_requests cap, not the GPU, held the queue the cache did not make: for at
    least CAP_SHARE of those requests' wait (excess-weighted) their rank ran `max_running` requests,
    and the offered load did not exceed the GPU (then that is named instead)."""
    return (not overloaded and story.max_running is not None and story.other_cap_share is not None
            and story.other_cap_share >= CAP_SHARE)


def running_cap_json(story) -> dict:
    """summary --json's `diagnosis.running_cap` (only where cap_held)."""
    return {"max_running_requests": story.max_running, "given": story.max_running_given,
            "queued_wait_share": story.queued_cap_share, "not_the_caches_doing_wait_share": story.other_cap_share}


def queue_cause_claim(story, overloaded: bool, why: str | None) -> Claim:
    """Whose doing the queue was, as the queued requests' own attributions say, by excess."""
    doing = story.caches_doing_share or 0.0
    if doing >= 0.5:
        text = (f"The queue was the cache's doing: for {fmt_pct(doing)} of the excess the queued requests carry, "
                f"other requests' recompute of once-cached tokens took at least {fmt_pct(RECOMPUTE_QUEUE_SHARE)} of "
                f"each one's wait, on a GPU at least {fmt_pct(BUSY_SHARE)} busy around it")
        if overloaded:
            text += " (both hold: the offered load alone exceeded the GPU, and recompute added to it)"
        return Claim("queue_cause", text + (f"; {why}." if why else "."))
    # The reason is the not-the-cache's-doing requests' own: the others' recompute would raise it.
    busy = story.other_busy_share if story.other_busy_share is not None else (story.queued_busy_share or 0.0)
    rec = story.other_recompute_share if story.other_recompute_share is not None else \
        (story.wait_share("recompute") or 0.0)
    if cap_held(story, overloaded):
        reason = (f"for {fmt_pct(story.other_cap_share)} of their wait (each its own, weighted by its excess) "
                  f"{cap_reason(story.max_running, story.max_running_given)}: the cap held the queue, not the GPU "
                  f"({fmt_pct(busy)} busy around them)")
    elif overloaded:
        reason = (f"the GPU was offered more prefill than it can do ({fmt_pct(busy)} busy around them; recompute "
                  f"{fmt_pct(rec)} of their wait)")
    elif busy < BUSY_SHARE:
        reason = f"the GPU was {fmt_pct(busy)} busy around them, below {fmt_pct(BUSY_SHARE)}"
        parts = story.other_wait_parts_ns or {}
        if parts and story.other_wait_ns:
            # What their wait was, as it was (a zero-reuse queue is other requests' prefill, not memory).
            top = max(parts, key=lambda k: parts[k])
            reason += (f"; the largest part of their wait ({fmt_pct(share(parts[top], story.other_wait_ns))}) the GPU "
                       f"was {_RUN_WAIT_WORDS[top]}")
    elif rec < RECOMPUTE_QUEUE_SHARE:
        reason = f"recompute took {fmt_pct(rec)} of their wait, below {fmt_pct(RECOMPUTE_QUEUE_SHARE)}"
    else:
        reason = "the requests carrying most of it waited behind other work"
    return Claim("queue_cause", f"The queue was not the cache's doing for {fmt_pct(1 - doing)} of the excess the "
                                f"queued requests carry: {reason}.")


def evicted_while_waiting_claim(story) -> Claim | None:
    """Requests whose prefix left every tier after they arrived, while they waited, and was
    recomputed (read/waiting.py; a demotion to host is not counted: it loads back)."""
    n = story.evicted_while_waiting_requests
    if not n:
        return None
    tokens = story.evicted_while_waiting_tokens
    return Claim("evicted_while_waiting", (
        f"{n:,} request{'s' if n != 1 else ''} lost {'their' if n != 1 else 'its'} prefix after arriving, while "
        f"waiting to be scheduled ({fmt_pct(share(story.evicted_while_waiting_excess_ns, story.excess_total_ns))} "
        f"of the excess TTFT): {fmt_tokens(tokens) + ' tokens of it, ' if tokens else 'it, '}on device or host at "
        f"arrival, were in no tier when {'they were' if n != 1 else 'it was'} scheduled and were recomputed, so the "
        f"queue, not only the pool size, cost the recompute."))


# --------------------------------------------------------------------------- routing (routing_loss.py)


def run_routing_claim(ev: RoutingLoss) -> Claim:
    """The run's routing sentence, from its RoutingLoss."""
    named = [(b, n) for b, n in ev.branch_tokens.items() if n][:3]
    text = (f"Routing lost {fmt_tokens(ev.routing_tokens)} once-cached tokens ({fmt_pct(ev.share_of_recomputed)} of "
            f"the {fmt_tokens(ev.recomputed_tokens)} recomputed, {fmt_pct(ev.share_of_input)} of input) in "
            f"{ev.routed_requests:,} request{'s' if ev.routed_requests != 1 else ''} across {ev.num_ranks} ranks: "
            f"at their arrival another rank held the prefix on device or host and the router "
            f"({ev.router or 'not recorded'}) sent them elsewhere; recomputing those tokens took "
            f"{fmt_ms(ev.routing_cost_ns)} (priced by their position in the context)")
    if named:
        text += "; by the router's rule: " + ", ".join(
            f"{b} {fmt_pct(share(n, ev.routing_tokens))}" for b, n in named)
    return Claim("routing", text + ".")
