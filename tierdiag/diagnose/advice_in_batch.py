"""Advice for in-batch sharing (issue 40): requests that arrive together and share a prefix are
admitted into one prefill batch and each computes the prefix (SGLang's fcfs: the prefix enters
the tree only when the batch ends; engine/miss.py's `shared_in_batch`). What SGLang offers:

  schedule_policy lpm      SchedulePolicy's in-batch prefix caching: a waiting request with at most
                           IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD (32) tokens cached that shares at
                           least IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD (32) tokens with a
                           request ahead of it goes last, so where the batch budget ends before it,
                           it waits for the next batch and matches the prefix the first one inserted
                           (engine/queue_policy.py)
  a smaller max_prefill_tokens
                           fewer requests a batch: the later ones of a fan-out run in the next batch,
                           after the first inserted the shared prefix

Each is one replay item; advise shows it as advice only when its replay confirmed it (TTFT p50).
Registered in advice.py's RULES.
"""

from __future__ import annotations

from tierdiag.diagnose import claims as C
from tierdiag.diagnose.advice_types import Advice
from tierdiag.diagnose.runcontext import RunContext

# Named (and advised) where the shared tokens are at least this share of the run's input.
IN_BATCH_ADVICE_SHARE = 0.05


def _pow2_at_most(n: int) -> int:
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


def in_batch(ctx: RunContext) -> list[Advice]:
    lo = ctx.losses
    n = getattr(lo, "in_batch_tokens", 0)
    if not n or not lo.input_tokens or n < IN_BATCH_ADVICE_SHARE * lo.input_tokens:
        return []
    page = int(ctx.config.get("page_size") or 64)
    budget = int(ctx.config.get("max_prefill_tokens") or 16384)
    policy = ctx.config.get("schedule_policy") or "fcfs"
    evidence = {"in_batch_tokens": n, "input_tokens": lo.input_tokens, "max_prefill_tokens": budget,
                "schedule_policy": policy}
    items = []
    if policy != "lpm":
        items.append(Advice(
            "in_batch", "schedule_policy", "lpm", {"schedule_policy": "lpm"},
            C.advice_in_batch_claim(tokens=n, input_tokens=lo.input_tokens, policy=policy, budget=budget,
                                    change="lpm").text, evidence,
            prediction="predicted: a request sharing a prefix with one ahead of it goes last in the batch; where the "
                       "budget ends before it, it matches the prefix in the next batch"))
    smaller = max(page, _pow2_at_most(budget // 4))
    if smaller < budget:
        items.append(Advice(
            "in_batch", "max_prefill_tokens", smaller, {"max_prefill_tokens": smaller},
            C.advice_in_batch_claim(tokens=n, input_tokens=lo.input_tokens, policy=policy, budget=budget,
                                    change="budget", smaller=smaller).text, evidence,
            prediction=f"predicted: batches of at most {smaller:,} tokens split a fan-out, so its later requests "
                       f"match the prefix the first inserted"))
    return items


IN_BATCH_RULES = (in_batch,)
