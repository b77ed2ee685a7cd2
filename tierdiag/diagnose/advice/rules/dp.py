"""dp (the number of data-parallel ranks): queueing >= QUEUE_EXCESS_SHARE of the excess TTFT, and
the offered prefill above TARGET_LOAD of the ranks in a material share of the run (capacity.py).
Advises the smallest N whose ranks are each offered at most TARGET_LOAD there.

Predicted: the windows' load at the material quantile (capacity.material_load, per rank) x dp / N,
the arrivals spread evenly over the N ranks, is at most TARGET_LOAD: the queue capacity made goes,
and with it queueing's share of the excess falls below QUEUE_EXCESS_SHARE (advise measures it:
the `queue_excess_share` target)."""

from __future__ import annotations

import math

from tierdiag.diagnose.advice import targets as T
from tierdiag.diagnose.advice.base import Evidence, Rule
from tierdiag.diagnose.advice.types import Advice
from tierdiag.diagnose.run.capacity import MATERIAL_SHARE, TARGET_LOAD
from tierdiag.diagnose.request.claims import Claim
from tierdiag.units import fmt_ms, fmt_pct, share

# The rule fires when queueing is at least this share of the run's excess TTFT, and predicts the
# N under which it falls below it.
QUEUE_EXCESS_SHARE = 0.2
MAX_DP = 64


class Dp(Rule):
    kinds = ("dp",)
    options = {"dp": "dp"}
    target = T.QUEUE_EXCESS_SHARE

    def trigger(self, ev: Evidence) -> list[Advice]:
        ctx = ev.ctx
        cap = ctx.capacity
        queued = share(ctx.queue_total_ns, ctx.excess_total_ns)
        if cap is None or queued is None or queued < QUEUE_EXCESS_SHARE or ctx.excess_total_ns <= 0:
            return []
        dp = cap.num_ranks
        per_rank = cap.material_load  # capacity's loads are per rank already
        if per_rank <= TARGET_LOAD:
            return []  # the ranks were not offered more than they can do: more of them is not the fix
        offered = per_rank * dp  # in GPUs' worth
        n = max(math.ceil(offered / TARGET_LOAD - 1e-9), dp + 1)
        if n > MAX_DP:
            return []
        return [Advice(
            "dp", "dp", n, {"dp": n}, self.sentence(cap=cap, queue_excess_share=queued, dp=dp, n=n).text,
            {"queue_excess_share": queued, "material_load": cap.material_load, "dp": dp,
             "per_rank_load": per_rank, "window_ms": cap.window_ns / 1e6},
            prediction=self.prediction(n=n))]

    def sentence(self, *, cap, queue_excess_share: float, dp: int, n: int) -> Claim:
        offered = cap.material_load * dp
        return Claim("dp", (
            f"queueing is {fmt_pct(queue_excess_share)} of the run's excess TTFT, and the offered prefill was "
            f"{cap.material_load:,.1f}× {'one GPU' if dp <= 1 else f'each of its {dp} ranks'} or more in the busiest "
            f"{fmt_pct(MATERIAL_SHARE)} of the {fmt_ms(cap.window_ns)} windows (recompute excluded): "
            f"it takes more ranks (or less traffic) to shorten that queue; {n} ranks are each offered "
            f"{offered / n:,.2f}× there"))

    def prediction(self, *, n: int) -> str:
        return (f"predicted: with the arrivals spread evenly over {n} ranks, fewer than {fmt_pct(MATERIAL_SHARE)} "
                f"of the windows offer a rank more than {fmt_pct(TARGET_LOAD)} of a GPU, so queueing falls "
                f"below {fmt_pct(QUEUE_EXCESS_SHARE)} of the excess TTFT")
