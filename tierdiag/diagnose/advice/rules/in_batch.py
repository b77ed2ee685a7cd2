"""in_batch (issue 40): requests that arrive together and share a prefix are admitted into one
prefill batch and each computes the prefix (SGLang's fcfs: the prefix enters the tree only when the
batch ends; engine/miss.py's `shared_in_batch`). What SGLang offers, one replay item each:

  schedule_policy lpm      SchedulePolicy's in-batch prefix caching: a waiting request with at most
                           IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD (32) tokens cached that shares at
                           least IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD (32) tokens with a
                           request ahead of it goes last, so where the batch budget ends before it,
                           it waits for the next batch and matches the prefix the first one inserted
                           (engine/queue_policy.py)
  a smaller max_prefill_tokens
                           fewer requests a batch: the later ones of a fan-out run in the next batch,
                           after the first inserted the shared prefix
"""

from __future__ import annotations

from tierdiag.diagnose.advice.base import Evidence, Rule, pow2_at_most
from tierdiag.diagnose.advice.types import Advice
from tierdiag.diagnose.request.claims import Claim
from tierdiag.units import fmt_pct, fmt_tokens, share

# Named (and advised) where the shared tokens are at least this share of the run's input.
IN_BATCH_ADVICE_SHARE = 0.05


class InBatch(Rule):
    kinds = ("in_batch",)
    options = {"schedule_policy": "in_batch", "max_prefill_tokens": "in_batch"}
    # No share of the run is the one the change must lower (the tokens shared within a batch are the
    # miss reason's, not a run share `advise` measures): judged by TTFT alone.
    target = None

    def trigger(self, ev: Evidence) -> list[Advice]:
        ctx = ev.ctx
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
                self.sentence(tokens=n, input_tokens=lo.input_tokens, policy=policy, budget=budget,
                              change="lpm").text, evidence,
                prediction=self.prediction(change="lpm")))
        smaller = max(page, pow2_at_most(budget // 4))
        if smaller < budget:
            items.append(Advice(
                "in_batch", "max_prefill_tokens", smaller, {"max_prefill_tokens": smaller},
                self.sentence(tokens=n, input_tokens=lo.input_tokens, policy=policy, budget=budget,
                              change="budget", smaller=smaller).text, evidence,
                prediction=self.prediction(change="budget", smaller=smaller)))
        return items

    def sentence(self, *, tokens: int, input_tokens: int, policy: str, budget: int, change: str,
                 smaller: int | None = None) -> Claim:
        text = (f"{fmt_tokens(tokens)} tokens ({fmt_pct(share(tokens, input_tokens))} of input) were shared with "
                f"requests in the same prefill batch: under schedule_policy {policy} each request of a batch computes "
                f"the prefix they share, as SGLang does (it enters the cache when the batch ends)")
        if change == "lpm":
            text += ("; lpm's in-batch prefix caching (IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD 32 tokens cached at "
                     "most, IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD 32 tokens shared at least) puts a request "
                     "sharing a prefix with one ahead of it last, so where the batch budget ends before it, it reuses "
                     "the prefix in the next batch")
        else:
            text += (f"; max_prefill_tokens {smaller:,} instead of {budget:,} admits fewer requests a batch, so the "
                     f"later ones of a fan-out reuse the prefix the first inserted")
        return Claim("in_batch", text)

    def prediction(self, *, change: str, smaller: int | None = None) -> str:
        if change == "lpm":
            return ("predicted: a request sharing a prefix with one ahead of it goes last in the batch; where the "
                    "budget ends before it, it matches the prefix in the next batch")
        return (f"predicted: batches of at most {smaller:,} tokens split a fan-out, so its later requests "
                f"match the prefix the first inserted")
