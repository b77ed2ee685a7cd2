"""rate: the offered prefill exceeded the GPU for a material share of the run (capacity.py): no
cache setting removes that queue. The verifiable change is the rate: the replay's time_scale
spreads the arrivals until the busiest window is offered TARGET_LOAD of the GPU. Where the
requests' queues were the cache's doing (story.py), the cache rules come first and this after."""

from __future__ import annotations

import math

from tierdiag.config.constants import MAX_TIME_SCALE
from tierdiag.config.names import Cause
from tierdiag.diagnose.advice import targets as T
from tierdiag.diagnose.advice.base import Evidence, Rule
from tierdiag.diagnose.advice.types import Advice
from tierdiag.diagnose.run.capacity import MATERIAL_SHARE, TARGET_LOAD
from tierdiag.diagnose.request.claims import Claim
from tierdiag.diagnose.run.run_claims import gpus
from tierdiag.units import fmt_ms, fmt_pct, ns_to_ms


def round_up_2(x: float) -> float:
    """Up to two significant digits (3.41 -> 3.5, 62.3 -> 63): a time_scale a user can type."""
    if x <= 0:
        return x
    e = math.floor(math.log10(x)) - 1
    return round(math.ceil(round(x / 10 ** e, 9)) * 10 ** e, max(-e, 0))


class Rate(Rule):
    kinds = ("rate",)
    options = {"time_scale": "rate"}
    target = T.QUEUE_SHARE

    def trigger(self, ev: Evidence) -> list[Advice]:
        ctx = ev.ctx
        cap = ctx.capacity
        if cap is None or not cap.overloaded:
            return []
        if getattr(ctx.losses, "trace_arrival_spread_ns", None) == 0:
            return []  # every request arrived at once: no time_scale changes anything (issue 40)
        current = float(ctx.config.get("time_scale") or 1.0)
        want = round_up_2(cap.time_scale_for(current))
        if want > MAX_TIME_SCALE or want <= current:
            return []
        return [Advice(
            "rate", "time_scale", want, {"time_scale": want},
            self.sentence(cap=cap, want=want, current=current, material_share=MATERIAL_SHARE).text,
            {"overloaded_share": cap.overloaded_share, "overload_factor": cap.overload_factor,
             "material_load": cap.material_load, "peak_load": cap.peak_load, "window_ms": ns_to_ms(cap.window_ns),
             "time_scale": current},
            prediction=self.prediction())]

    def sentence(self, *, cap, want: float, current: float, material_share: float) -> Claim:
        return Claim("rate", (
            f"offered prefill was {cap.overload_factor:,.1f}× {gpus(cap)} for {fmt_pct(cap.overloaded_share)} of the "
            f"run ({fmt_ms(cap.window_ns)} windows, recompute excluded; {cap.material_load:,.1f}× or more in "
            f"{fmt_pct(material_share)} of them): no cache setting removes that queue; time_scale {want:g} spreads "
            f"the arrivals {want / current:,.2g}× (in production: that much less traffic per GPU, or more GPUs: "
            f"`--dp`, the dp item)"))

    def prediction(self) -> str:
        return (f"predicted: fewer than {fmt_pct(MATERIAL_SHARE)} of the windows offered more than "
                f"{fmt_pct(TARGET_LOAD)} of the GPU, so the queue that capacity made goes")

    def place(self, ev: Evidence) -> int:
        """Last where the requests' queues were the cache's doing (story.py): the cache rules first."""
        top = ev.ctx.story.top if ev.ctx.story is not None else None
        return 1 if top is not None and (top.caches_doing or top.cause == Cause.RECOMPUTE) else 0
