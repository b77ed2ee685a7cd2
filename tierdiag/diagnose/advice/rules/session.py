"""session: later session turns recomputed or loaded back their prefix after their pause
(closed-loop arrivals); keep sessions alive for the p90 pause: the host pool whose LRU holds every
later turn's context over a pause up to p90 (session_pool.py's stack distances), at most what the
server holds. Open-loop (arrivals trace) pauses are not the sessions' own, so nothing is sized
from them."""

from __future__ import annotations

from tierdiag.config.names import WritePolicy
from tierdiag.diagnose.advice import targets as T
from tierdiag.diagnose.advice.base import Evidence, Rule, gib, limit_words, pow2_at_least, pow2_at_most, significant
from tierdiag.diagnose.advice.types import Advice
from tierdiag.diagnose.request.claims import Claim
from tierdiag.diagnose.run.run_claims import held_capacity
from tierdiag.units import fmt_ms, fmt_pct, fmt_tokens, share


class Session(Rule):
    kinds = ("session",)
    options: dict[str, str] = {}  # host_tokens alone is the capacity rule's kind
    target = T.SESSION_RECOMPUTE_SHARE

    def trigger(self, ev: Evidence) -> list[Advice]:
        ctx, sp, host_limit_bytes = ev.ctx, ev.sessions, ev.host_limit_bytes
        lo = ctx.losses
        device, host = lo.device_capacity_tokens, lo.host_capacity_tokens
        if (sp is None or (ctx.config.get("arrivals") or "closed") != "closed" or device is None or host is None
                or not significant(sp.lost_tokens, sp.input_tokens)):
            return []
        page = int(ctx.config.get("page_size") or 64)
        kv = ctx.kv_bytes_per_token
        # As for capacity: under write_through the host pool alone holds every cached copy (device's
        # included), so it alone must hold the contexts; otherwise device and host add up.
        inclusive = ctx.config.get("write_policy") == WritePolicy.WRITE_THROUGH
        held, pools = held_capacity(ctx.config, device, host)
        want = pow2_at_least(sp.pool_p90_tokens if inclusive else sp.pool_p90_tokens - device, page)
        limit = pow2_at_most(host_limit_bytes // kv) if kv else want
        capped = want > limit
        new = min(want, limit)
        if new <= host:
            return []  # the pools already hold the sessions' contexts for the p90 pause (or the server can't)
        after = new if inclusive else device + new
        kept_before, kept_after = sp.kept_share(held) or 0.0, sp.kept_share(after) or 0.0
        if not significant(int((kept_after - kept_before) * sp.reused_tokens), sp.input_tokens):
            return []  # predicted to keep too little more to be worth the memory
        found = share(sp.device_tokens + sp.host_tokens, sp.reused_tokens)
        size = (f"host pool of {fmt_tokens(new)} tokens" if not capped else
                f"host pool of {fmt_tokens(want)} tokens, beyond the "
                + f"host memory {limit_words(host_limit_bytes)}: {fmt_tokens(new)} tokens, the most it holds")
        return [Advice(
            "session", "host_tokens", new, {"host_tokens": new},
            self.sentence(lost_tokens=sp.lost_tokens, num_turns=sp.num_turns, input_tokens=sp.input_tokens,
                          recomputed_tokens=sp.recomputed_tokens, loaded_tokens=sp.host_tokens + sp.storage_tokens,
                          pause_p90_ns=sp.pause_p90_ms * 1e6, size=size, pool_p90_tokens=sp.pool_p90_tokens,
                          pools=pools).text,
            {"later_turns": sp.num_turns, "later_input_tokens": sp.input_tokens, "later_reused_tokens": sp.reused_tokens,
             "later_recomputed_tokens": sp.recomputed_tokens,
             "later_loaded_tokens": sp.host_tokens + sp.storage_tokens, "pause_p90_ms": sp.pause_p90_ms,
             "pool_p90_tokens": sp.pool_p90_tokens, "device_tokens": device, "host_tokens": host},
            gib(new - host, kv), "host_memory",
            prediction=self.prediction(kept_after=kept_after, kept_before=kept_before, found=found))]

    def sentence(self, *, lost_tokens: int, num_turns: int, input_tokens: int, recomputed_tokens: int,
                 loaded_tokens: int, pause_p90_ns: float, size: str, pool_p90_tokens: int, pools: str) -> Claim:
        return Claim("session", (
            f"{fmt_tokens(lost_tokens)} tokens of the reused prefix of {num_turns:,} later session turns "
            f"({fmt_pct(share(lost_tokens, input_tokens))} of their input) were recomputed "
            f"({fmt_tokens(recomputed_tokens)}) or loaded back ({fmt_tokens(loaded_tokens)}) after their pause; keep "
            f"sessions alive for the p90 pause ({fmt_ms(pause_p90_ns)}): {size} (a turn paused up to p90 had at most "
            f"{fmt_tokens(pool_p90_tokens)} tokens touched, its own context included, between its predecessor's "
            f"answer and its schedule, against {pools})"))

    def prediction(self, *, kept_after: float, kept_before: float, found: float | None) -> str:
        return (f"predicted under LRU: keeps {fmt_pct(kept_after)} of later turns' reused prefix on device or "
                f"host, against {fmt_pct(kept_before)} with the pools now (this run found "
                f"{fmt_pct(found)} there)")
