"""none: no rule fired, the cache was fine; the one item says so with the numbers that show it
(the recompute share, and the load-backs against recomputing the same tokens). Not in the
registry's list: propose() falls back to it (registry.FALLBACK)."""

from __future__ import annotations

from tierdiag.diagnose.advice.base import Evidence, Rule
from tierdiag.diagnose.advice.types import Advice
from tierdiag.diagnose.request.claims import Claim
from tierdiag.units import fmt_ms, fmt_pct


class Nothing(Rule):
    kinds = ("none",)
    options: dict[str, str] = {}
    target = None  # nothing to replay

    def trigger(self, ev: Evidence) -> list[Advice]:
        ctx = ev.ctx
        lo, tr = ctx.losses, ctx.transfers
        text = self.sentence(recomputed_share=lo.recomputed_share, num_finished=ctx.num_finished,
                             num_loadbacks=tr.num_loadbacks, loadback_ns=tr.loadback_ns,
                             link_peak_share=tr.link_peak_share,
                             recompute_instead_extra_ns=tr.recompute_instead_extra_ns).text
        return [Advice("none", None, None, {}, text,
                       {"recomputed_share": lo.recomputed_share, "link_peak_share": tr.link_peak_share},
                       prediction=self.prediction())]

    def sentence(self, *, recomputed_share: float | None, num_finished: int, num_loadbacks: int, loadback_ns: int,
                 link_peak_share: float | None, recompute_instead_extra_ns: int) -> Claim:
        if recomputed_share is None:  # no finished request, or a server that does not report recompute
            text = ("nothing to change in the cache that the run's numbers show: how many input tokens were "
                    "recomputed is not known" + ("" if num_finished else " (no request finished)"))
        else:
            text = (f"nothing to change in the cache: {fmt_pct(recomputed_share)} of input tokens were "
                    f"recomputed once-cached tokens")
        if num_loadbacks and loadback_ns:
            text += (f"; load-backs ran at {fmt_pct(link_peak_share)} of link peak and took {fmt_ms(loadback_ns)} "
                     f"where recomputing the same tokens would have cost {fmt_ms(recompute_instead_extra_ns)}")
            if recompute_instead_extra_ns > loadback_ns:
                text += f" ({recompute_instead_extra_ns / loadback_ns:,.1f}× more)"
        return Claim("none", text)

    def prediction(self) -> None:
        return None  # nothing changes
