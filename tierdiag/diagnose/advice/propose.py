"""What to change: every registered rule that fires, from the run's evidence (DESIGN §5).

Each rule (rules/, listed in registry.py) reads the run's `Evidence` and proposes typed `Advice`:
the `--config` TOML key(s) to change, the value, the reason with its numbers, what it costs in
memory, and `verified` once `tierdiag advise` has replayed the trace with it (verify.py).

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
    router            routing lost >= 5 % of input under a prefix-blind router     router cache_aware or session
    router_threshold  cache_aware, and routing still lost >= 5 % of input          its thresholds
    dp                queueing >= 20 % of the excess TTFT, ranks overloaded        dp: the smallest N that suffices
    in_batch          requests of one prefill batch computed a prefix they share   schedule_policy lpm; a smaller
                                                                                   max_prefill_tokens
    (none of these)   the cache was fine                                           "nothing to change in the cache"

A rule fires only when its tokens are known, more than none, and at least MIN_LOSS_SHARE of a
known, non-empty input (base.significant). Hardware limits: a host pool beyond
HOST_POOL_LIMIT_BYTES (a real server's host memory per GPU: 256 GiB of an 8-GPU server's 2 TiB;
each rank's host pool is its own) is never advised; a storage tier is.

Verification (verify.py): `advise` records each candidate run under sweep_id `advise-<baseline
run_id>`; each item gets a `status` (DESIGN §6, types.classify)::

    proposed    not replayed yet
    confirmed   TTFT p50 at least CONFIRM_P50_GAIN better, p99 not more than P99_TOLERANCE worse
                (the share the rule targeted, its Target, is measured and shown, not a criterion)
    refuted     worse: p50 at least CONFIRM_P50_GAIN worse, or p99 more than P99_TOLERANCE worse
    no_effect   neither (the replays are deterministic: this is not noise, the change did not help)

Only `proposed` and `confirmed` items are advice; the others are "tried, not advised", shown
with their numbers. Where two or more are confirmed, `advise` also replays the best of them
together (verify.combination): a `combined` item, confirmed only when it beats the best one alone too.
"""

from __future__ import annotations

import dataclasses

from tierdiag.diagnose.advice import registry
from tierdiag.diagnose.advice.base import HOST_POOL_LIMIT_BYTES, Evidence, limit_words
from tierdiag.diagnose.advice.types import Advice
from tierdiag.diagnose.run.runcontext import RunContext
from tierdiag.diagnose.session.session_pool import SessionPauses


def propose(ctx: RunContext, *, host_limit_bytes: int = HOST_POOL_LIMIT_BYTES,
            sessions: SessionPauses | None = None, curves=None) -> tuple[Advice, ...]:
    """Every registered rule that fires, in the registry's order, each rule's items placed by its
    `place` (the router's first where routing lost most of the reuse; the rate last where the
    requests' queues were the cache's doing, story.py); else the one "nothing to change" item.
    `sessions`: the run's later session turns (session_pool.session_pauses), for the session rule;
    None: it does not fire. `curves`: the run's size curves (size_curves.py), which size the
    capacity rule's host pool and storage tier at their knees; None: sized from the removed
    tokens' reuse distance. Two rules that propose the same change (a host pool for the sessions
    and for capacity) are one replay: the first is kept."""
    ev = Evidence(ctx, sessions=sessions, curves=curves, host_limit_bytes=host_limit_bytes)
    placed: list[tuple[int, Advice]] = []
    for rule in registry.rules():
        found = rule.trigger(ev)
        if not found:
            continue
        where = rule.place(ev)
        placed += [(where, a) for a in found if all(a.changes != b.changes for _, b in placed)]
    items = [a for _, a in sorted(placed, key=lambda p: p[0])]  # stable: the registry's order within a place
    # A host pool is per rank (each scheduler process allocates its own): its cost is paid by every
    # rank, and it is capped by the host memory beside one GPU; both are stated with the item.
    ranks = ctx.config.get("dp")
    ranks = ranks if isinstance(ranks, int) and not isinstance(ranks, bool) and ranks >= 1 else 1
    items = [dataclasses.replace(a, cost_ranks=ranks, host_limit_words=limit_words(host_limit_bytes))
             if a.cost_kind == "host_memory" else a for a in items]
    return tuple(items) if items else tuple(registry.FALLBACK.trigger(ev))
