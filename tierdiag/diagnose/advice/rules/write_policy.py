"""write_policy: once-cached tokens dropped from device with no host copy, and asked for again;
advises write_policy write_through, which backs every new prefix up to host so eviction demotes
it instead of dropping it. Not predicted: how many of the dropped tokens a host copy keeps
depends on the host pool's own evictions (a replay measures it: `advise`)."""

from __future__ import annotations

from tierdiag.config import names
from tierdiag.diagnose.advice import targets as T
from tierdiag.diagnose.advice.base import Evidence, Rule, significant
from tierdiag.diagnose.advice.types import Advice
from tierdiag.diagnose.request.claims import Claim
from tierdiag.units import fmt_tokens


class WritePolicy(Rule):
    kinds = ("write_policy",)
    options = {"write_policy": "write_policy"}
    target = T.RECOMPUTE_SHARE

    def trigger(self, ev: Evidence) -> list[Advice]:
        lo = ev.ctx.losses
        policy = ev.ctx.config.get("write_policy")
        if not significant(lo.dropped_unbacked_tokens, lo.input_tokens) or policy == names.WritePolicy.WRITE_THROUGH:
            return []
        return [Advice(
            "write_policy", "write_policy", "write_through", {"write_policy": "write_through"},
            self.sentence(dropped_tokens=lo.dropped_unbacked_tokens, policy=policy).text,
            {"dropped_unbacked_tokens": lo.dropped_unbacked_tokens, "input_tokens": lo.input_tokens},
            prediction=self.prediction())]

    def sentence(self, *, dropped_tokens: int, policy) -> Claim:
        return Claim("write_policy", (
            f"{fmt_tokens(dropped_tokens)} once-cached tokens that were asked for again had been dropped from device "
            f"without a host copy (write_policy {policy}); write_through backs every new prefix up to host, so "
            f"eviction demotes it instead"))

    def prediction(self) -> None:
        return None  # module doc: the host pool's own evictions decide it
