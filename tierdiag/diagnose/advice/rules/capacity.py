"""capacity: tokens deleted from host whose p90 reuse distance is beyond device + host. Advises
host_tokens at the host size curve's knee (at most the host memory a server has per GPU), else a
storage tier at its curve's knee with prefetch_policy wait_complete (and host room for the
prefetches where the run's host pool leaves none).

`ev.curves`: the run's size curves (size_curves.SizeCurves): the host pool and the storage tier
proposed are their curves' knees (the smallest size finding KNEE_SHARE of what an unbounded one
would), none where the run's size is at the knee already; None (no curves: the trace could not
be read again): sized from the removed tokens' p90 reuse distance, rounded up to a power of two."""

from __future__ import annotations

from tierdiag.config.names import WritePolicy
from tierdiag.diagnose.advice import targets as T
from tierdiag.diagnose.advice.base import (HOST_POOL_LIMIT_BYTES, Evidence, Rule, covered, gib, limit_words,
                                           pow2_at_least, pow2_at_most, significant)
from tierdiag.diagnose.advice.rules.prefetch import DISK_BYTES_PER_S, read_or_recompute
from tierdiag.diagnose.advice.types import Advice
from tierdiag.diagnose.request.claims import BUSY_SHARE, Claim
from tierdiag.diagnose.run.run_claims import held_capacity
from tierdiag.engine.rules import rule_set
from tierdiag.units import fmt_bytes, fmt_pct, fmt_tokens, ns_to_ms, share

# Size pools to keep this share of the re-referenced removed tokens (reuse distance decile).
CAPACITY_DECILE = 9
# SGLang 0.5.9's prefetch room: this share of host beyond device (HiCacheController.prefetch_rate_limited);
# the advice reads the run's own rule set (engine/rules.py `prefetch_room_tokens`).
PREFETCH_ROOM_SHARE = 0.8


def knee_above(curves, tier: str, own: int, page: int) -> tuple[int | None, bool]:
    """(the size to propose for the tier, whether a curve was there): with a curve, its knee plus
    the curves' slack (SizeCurves.proposed_size, size_curves.py), and none where the run's size is
    at or past the knee already."""
    curve = curves.curve(tier) if curves is not None else None
    if curve is None:
        return None, False
    knee = curve.knee_tokens
    if knee is None or -(-knee // page) * page <= own:
        return None, True
    return curves.proposed_size(tier), True


def curve_prediction(curves, tier: str, option: str, value: int, own: int) -> str:
    c = curves.curve(tier)
    where = {"host": "device and host", "storage": "device, host and storage"}[tier]
    return (f"predicted in one pass (size curve, LRU): {where} find "
            f"{fmt_pct(share(c.reused_at(value), curves.input_tokens))} of input at {option} {fmt_tokens(value)}, "
            f"against {fmt_pct(share(c.reused_at(own), curves.input_tokens))} at the run's {fmt_tokens(own)} "
            f"(the run found {fmt_pct(share(c.found_tokens, curves.input_tokens))}); the curve's knee is "
            f"{fmt_tokens(c.knee_tokens)} tokens, plus the median request's prefix ({fmt_tokens(curves.slack_tokens)}) "
            "of slack: the engine evicts a whole tree node at a time")


def host_deleted_why(*, deleted_tokens: int, input_tokens: int, reuse_p50_tokens: int, reuse_p90_tokens: int,
                     pools: str) -> str:
    """The capacity item's grounds: what was deleted from host, and its reuse distance."""
    return (f"{fmt_tokens(deleted_tokens)} once-cached tokens ({fmt_pct(share(deleted_tokens, input_tokens))} of "
            f"input) were deleted from host before they were asked for again; their reuse distance is "
            f"{fmt_tokens(reuse_p50_tokens)} tokens at the median and {fmt_tokens(reuse_p90_tokens)} at p90, "
            f"against {pools}")


class Capacity(Rule):
    kinds = ("capacity", "storage_tier")
    options = {"host_tokens": "capacity", "storage_tokens": "storage_tier"}
    dominant_options = frozenset({"storage_tokens"})  # a storage tier comes with its prefetch policy and host room
    target = T.RECOMPUTE_SHARE

    def trigger(self, ev: Evidence) -> list[Advice]:
        ctx, curves, host_limit_bytes = ev.ctx, ev.curves, ev.host_limit_bytes
        lo = ctx.losses
        device, host = lo.device_capacity_tokens, lo.host_capacity_tokens
        deciles = lo.removed_reuse_deciles_tokens
        if (not significant(lo.deleted_from_host_tokens, lo.input_tokens) or device is None or host is None
                or len(deciles) < 11):
            return []
        page = int(ctx.config.get("page_size") or 64)
        kv = ctx.kv_bytes_per_token
        target = deciles[CAPACITY_DECILE]
        # write_through keeps a host copy of everything on device: the host pool alone bounds what
        # stays cached. Otherwise host holds what device evicted, and the two add up.
        inclusive = ctx.config.get("write_policy") == WritePolicy.WRITE_THROUGH
        held, pools = held_capacity(ctx.config, device, host)
        if target <= held:
            return []  # the pools were big enough under LRU: not a capacity problem
        evidence = {"deleted_from_host_tokens": lo.deleted_from_host_tokens, "reuse_distance_p50_tokens": deciles[5],
                    "reuse_distance_p90_tokens": target, "device_tokens": device, "host_tokens": host}
        why = host_deleted_why(deleted_tokens=lo.deleted_from_host_tokens, input_tokens=lo.input_tokens,
                               reuse_p50_tokens=deciles[5], reuse_p90_tokens=target, pools=pools)
        out: list[Advice] = []
        want = pow2_at_least(target if inclusive else target - device, page)
        knee, curved = knee_above(curves, "host", host, page)
        want = knee if curved else want
        limit = pow2_at_most(host_limit_bytes // kv) if kv else want
        if curved and knee is None:
            return out  # the run's host pool is at its curve's knee already: more finds little
        if want <= limit:
            cover = covered(deciles, want if inclusive else device + want)
            out.append(Advice("capacity", "host_tokens", want, {"host_tokens": want},
                              self.sentence(why=why, host_tokens=want, cover=cover).text,
                              {**evidence, "host_knee_tokens": knee} if curved else evidence,
                              gib(want - host, kv), "host_memory",
                              prediction=self.prediction(
                                  curves=curves if curved else None, host_tokens=want, own_host_tokens=host,
                                  kept_tokens=int((cover or 0) * lo.deleted_from_host_tokens),
                                  deleted_tokens=lo.deleted_from_host_tokens)))
            return out
        cover = covered(deciles, limit if inclusive else device + limit)
        kept = int((cover or 0) * lo.deleted_from_host_tokens)
        # Predicted under LRU: the largest host pool the server holds keeps only the re-references
        # whose reuse distance fits it; below the rule's threshold of input it is not proposed.
        if limit > host * 3 // 2 and significant(kept, lo.input_tokens):
            out.append(Advice("capacity", "host_tokens", limit, {"host_tokens": limit},
                              self.sentence(why=why, host_tokens=limit, cover=cover, kv_bytes=kv,
                                            limit_words=limit_words(host_limit_bytes)).text,
                              evidence, gib(limit - host, kv), "host_memory",
                              prediction=self.prediction(curves=None, host_tokens=limit, own_host_tokens=host,
                                                         kept_tokens=kept, deleted_tokens=lo.deleted_from_host_tokens)))
        storage = self._storage(ev, evidence=evidence, target=target, want=want, limit=limit, page=page)
        return out + storage

    def _storage(self, ev: Evidence, *, evidence: dict, target: int, want: int, limit: int,
                 page: int) -> list[Advice]:
        """The storage tier, where the host pool the p90 reuse distance needs is beyond the server."""
        ctx, curves, host_limit_bytes = ev.ctx, ev.curves, ev.host_limit_bytes
        lo = ctx.losses
        device, host = lo.device_capacity_tokens, lo.host_capacity_tokens
        kv = ctx.kv_bytes_per_token
        storage = int(ctx.config.get("storage_tokens") or 0)
        want_storage = pow2_at_least(target, page)
        storage_knee, storage_curved = knee_above(curves, "storage", storage, page)
        if storage_curved:
            if storage_knee is None:
                return []  # the run's storage tier is at its curve's knee already
            want_storage = storage_knee
        # A storage tier pays when fetching a token from disk is cheaper than recomputing it, or
        # when the prefill GPU is saturated (the fetch runs beside it and frees it for others).
        recompute_per_token_ns = share(ctx.recompute_ns, lo.recomputed_tokens) or 0.0
        disk_per_token_ns = kv * 1e9 / DISK_BYTES_PER_S if kv else None
        pays = (disk_per_token_ns is not None and disk_per_token_ns < recompute_per_token_ns) or \
            (ctx.prefill_busy_share or 0) >= BUSY_SHARE
        evidence = {**evidence, "recompute_per_token_ms": ns_to_ms(recompute_per_token_ns),
                    "disk_per_token_ms": ns_to_ms(disk_per_token_ns), "prefill_busy_share": ctx.prefill_busy_share}
        # Prefetches from storage land in host memory: SGLang 0.5.9 admits one while those in flight
        # hold under 0.8 x (host - device) tokens, so with host == device a storage tier never
        # prefetches (0.5.23: under 0.5 x host). Then the host pool grows to HiCache's default, 2 x device,
        # within what the server holds; a server without that room gets no storage advice.
        rules = rule_set(ctx.config.get("sglang_rules") or "0.5.9")  # runs from before rule sets followed 0.5.9
        room = rules.prefetch_room_tokens(host, device)
        host_for_room = host
        if room <= 0:
            host_for_room = min(pow2_at_least(2 * device, page), limit) if kv else 2 * device
            if host_for_room <= device:
                return []
        # Predicted under the run's own prefetch rules: a request's lost prefix comes back from
        # storage only if its prefetch starts (match >= prefetch_threshold) and is admitted (what
        # prefetches hold in flight stays under the release's room, rules.prefetch_room_tokens: 0.8 x
        # (host - device) in 0.5.9, 0.5 x host in 0.5.23; a prefix larger than that room alone is
        # rate_limited, every time). Grow the host room for the p90 request where the server has the
        # memory; not proposed where the prefetches that would be admitted keep less than the rule's
        # threshold of input.
        sizes = lo.lost_request_deciles_tokens
        threshold = int(ctx.config.get("prefetch_threshold") or 0)
        beyond_device = rules.prefetch_capacity_of_host_minus_device
        if sizes and kv:
            needed = pow2_at_least((device if beyond_device else 0)
                                   + int(sizes[9] / rules.prefetch_capacity_share) + 1, page)
            if needed > host_for_room and needed <= limit:
                host_for_room = needed
        room_for = rules.prefetch_room_tokens(host_for_room, device)
        admitted = (max((covered(sizes, room_for) or 0) - (covered(sizes, threshold - 1) or 0), 0.0)
                    if sizes else 1.0)
        kept_storage = int(admitted * (lo.lost_tokens or lo.deleted_from_host_tokens))
        if not (want_storage > storage and pays and significant(kept_storage, lo.input_tokens)):
            return []
        changes = {"storage_tokens": want_storage, "prefetch_policy": "wait_complete"}
        room_note = ""
        if host_for_room != host:
            changes["host_tokens"] = host_for_room
            extra = f" (+{fmt_bytes((host_for_room - host) * kv)})" if kv else ""
            room_note = (f"; and host_tokens {fmt_tokens(host_for_room)}{extra}, since prefetches may hold only "
                         f"{fmt_pct(rules.prefetch_capacity_share)} of the host pool"
                         + (" beyond device" if beyond_device else "") + f": with {fmt_tokens(host)} "
                         f"tokens of host beside {fmt_tokens(device)} of device none would be admitted "
                         f"(rate_limited), with {fmt_tokens(host_for_room)} up to "
                         f"{fmt_tokens(rules.prefetch_room_tokens(host_for_room, device))} tokens at a time")
        beyond = (f"beyond the {fmt_bytes(host_limit_bytes)} a server holds for KV"
                  if host_limit_bytes != HOST_POOL_LIMIT_BYTES
                  else f"beyond the {fmt_bytes(HOST_POOL_LIMIT_BYTES)} of host memory per GPU of a real server")
        curve_words = (curve_prediction(curves, "storage", "storage_tokens", want_storage, storage)
                       if storage_curved else None)
        return [Advice("storage_tier", "storage_tokens", want_storage, changes,
                       self.storage_sentence(
                           deleted_tokens=lo.deleted_from_host_tokens, reuse_p90_tokens=target,
                           want_host_bytes=want * kv, beyond=beyond, storage_tokens=want_storage,
                           disk_per_token_ns=disk_per_token_ns, recompute_per_token_ns=recompute_per_token_ns,
                           prefill_busy_share=ctx.prefill_busy_share, room_note=room_note).text,
                       {**evidence, "prefetch_room_tokens": room, "prefetch_room_after_tokens": room_for},
                       gib(want_storage - storage, kv), "disk",
                       prediction=self.storage_prediction(
                           rules=rules, beyond_device=beyond_device, room_tokens=room_for, threshold=threshold,
                           kept_tokens=kept_storage, curve_words=curve_words))]

    def sentence(self, *, why: str, host_tokens: int, cover: float | None, kv_bytes: int | None = None,
                 limit_words: str | None = None) -> Claim:
        """A host pool of `host_tokens` keeps `cover` of the re-referenced deleted tokens; where it is
        the most the server holds (`limit_words`), says so with its size."""
        if limit_words is None:
            return Claim("capacity", f"{why}; a {fmt_tokens(host_tokens)}-token host pool keeps {fmt_pct(cover)} of them")
        return Claim("capacity", (f"{why}; {fmt_tokens(host_tokens)} tokens ({fmt_bytes(host_tokens * (kv_bytes or 0))}, "
                                  f"the most host memory {limit_words}) keep {fmt_pct(cover)} of them"))

    def prediction(self, *, curves, host_tokens: int, own_host_tokens: int, kept_tokens: int,
                   deleted_tokens: int) -> str:
        """The host pool's: its size curve's where there is one, else LRU over the reuse distances."""
        if curves is not None:
            return curve_prediction(curves, "host", "host_tokens", host_tokens, own_host_tokens)
        return f"predicted under LRU: keeps ~{fmt_tokens(kept_tokens)} of the {fmt_tokens(deleted_tokens)} tokens deleted from host"

    def storage_sentence(self, *, deleted_tokens: int, reuse_p90_tokens: int, want_host_bytes: int, beyond: str,
                         storage_tokens: int, disk_per_token_ns: float | None, recompute_per_token_ns: float,
                         prefill_busy_share: float | None, room_note: str) -> Claim:
        why = read_or_recompute(disk_per_token_ns=disk_per_token_ns, recompute_per_token_ns=recompute_per_token_ns,
                                prefill_busy_share=prefill_busy_share, busy_words="the fetch runs beside it")
        return Claim("storage_tier", (
            f"keeping the {fmt_tokens(deleted_tokens)} tokens deleted from host up to their p90 reuse distance "
            f"({fmt_tokens(reuse_p90_tokens)} tokens) takes {fmt_bytes(want_host_bytes)} of host memory, {beyond}; a "
            f"{fmt_tokens(storage_tokens)}-token storage tier keeps them, with prefetch_policy wait_complete so a "
            f"prefetch is used rather than recomputed ({why})" + room_note))

    def storage_prediction(self, *, rules, beyond_device: bool, room_tokens: int, threshold: int, kept_tokens: int,
                           curve_words: str | None) -> str:
        return (f"predicted under the run's prefetch rules (SGLang {rules.version}: admitted "
                f"while in flight < {fmt_pct(rules.prefetch_capacity_share)} of host"
                + (" beyond device" if beyond_device else "") + " = "
                f"{fmt_tokens(room_tokens)} tokens; prefetch_threshold {fmt_tokens(threshold)}): "
                f"keeps ~{fmt_tokens(kept_tokens)} of the lost tokens"
                + (f"; {curve_words}" if curve_words else ""))
