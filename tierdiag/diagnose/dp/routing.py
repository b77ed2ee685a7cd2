"""`explain`'s routing step, for a request of a data-parallel run (`replay --dp N`): which rank
served it, why the router chose that rank, and where the request's prefix actually was, on
every rank, when it arrived.

The router never sees a rank's tree (engine/routing/base.py): it decides from its own
approximate state and what it has in flight. The engine also records, per rank, what a match
on that rank's own tree would have found at the arrival (device tokens, host-only tokens; a
match with no side effect, before routing): the `requests` row's v4 columns (docs/contract.md
§5). This step sets the two side by side: "3 other ranks held up to 40,960 tokens of this
prefix on device; the router sent it to rank 2, which held none".

Every sentence is a `Claim` built from named numbers of the row (tests/diagnose/test_rank_views*.py
checks each against the rows); the step's finding is its claims in order. A request of a
one-rank run has no routing step (None).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tierdiag.diagnose.request.claims import Claim
from tierdiag.diagnose.request.explain_result import Step
from tierdiag.diagnose.dp.ranks import deployment
from tierdiag.units import fmt_tokens
from tierdiag.diagnose.read.requests import RequestRow, RowLike

LISTED_RANKS = 8  # ranks named in a sentence (all of them are in the evidence)


@dataclass(frozen=True)
class RankAtArrival:
    """One rank's share of the request's prefix at its arrival (ranks_json)."""

    rank: int
    device_tokens: int
    host_tokens: int  # on host only (not also on device)
    in_flight: int | None  # requests the router had sent it and not seen finish
    score: float | None  # the router's number for it (route_score_name)


@dataclass(frozen=True)
class RoutingEvidence:
    router: str
    dp: int
    dp_rank: int | None  # the rank that served it
    route_branch: str | None
    route_reason: str | None
    route_score: float | None
    route_score_name: str | None
    arrival_device_tokens: int  # on its own rank, at arrival
    arrival_host_tokens: int
    best_rank: int | None  # most device + host at arrival (ties: its own rank, else the lowest)
    best_rank_device_tokens: int
    best_rank_host_tokens: int
    best_rank_extra_tokens: int  # best rank's device + host beyond its own rank's (0: its own was best)
    other_ranks_on_device: int  # other ranks holding any of its prefix on device
    other_ranks_max_device_tokens: int  # the most any of them held on device
    ranks: tuple[RankAtArrival, ...]  # every rank, index order ([] where ranks_json is absent)


def _int(v) -> int:
    return int(v or 0)


def _ranks(text) -> tuple[RankAtArrival, ...]:
    """ranks_json as records; () where there is none or it is not a list of rank objects (a
    hand-edited store: the step then says only what the columns say)."""
    if not text:
        return ()
    try:
        items = json.loads(text)
        return tuple(RankAtArrival(rank=int(x["rank"]), device_tokens=_int(x.get("device_tokens")),
                                   host_tokens=_int(x.get("host_tokens")),
                                   in_flight=None if x.get("in_flight") is None else int(x["in_flight"]),
                                   score=None if x.get("score") is None else float(x["score"]))
                     for x in items)
    except (ValueError, TypeError, KeyError, AttributeError):
        return ()


def routing_evidence(run, row: RowLike) -> RoutingEvidence | None:
    """The routing evidence of one request row; None for a run of one rank."""
    row = RequestRow.of(row)
    dep = deployment(run)
    if dep is None:
        return None
    ranks = tuple(sorted(_ranks(row.ranks_json), key=lambda r: r.rank))
    own = row.dp_rank
    own_d, own_h = _int(row.arrival_device_tokens), _int(row.arrival_host_tokens)
    best = row.best_rank
    best_d, best_h = _int(row.best_rank_device_tokens), _int(row.best_rank_host_tokens)
    others = [r for r in ranks if r.rank != own]
    return RoutingEvidence(
        router=dep.router, dp=dep.dp, dp_rank=own, route_branch=row.route_branch,
        route_reason=row.route_reason, route_score=row.route_score,
        route_score_name=row.route_score_name, arrival_device_tokens=own_d, arrival_host_tokens=own_h,
        best_rank=best, best_rank_device_tokens=best_d, best_rank_host_tokens=best_h,
        best_rank_extra_tokens=max(best_d + best_h - own_d - own_h, 0) if best is not None and best != own else 0,
        other_ranks_on_device=sum(1 for r in others if r.device_tokens > 0),
        other_ranks_max_device_tokens=max((r.device_tokens for r in others), default=0), ranks=ranks)


# --- the claims ----------------------------------------------------------------------------------

def _rank(k) -> str:
    return "an unrecorded rank" if k is None else f"rank {k}"


def _held(device: int, host: int) -> str:
    """A rank's part of the prefix: "none of its prefix", "8,192 tokens of its prefix on device",
    "8,192 tokens of its prefix on device and 512 on host", "512 tokens of its prefix on host"."""
    if not device and not host:
        return "none of its prefix"
    first, rest = [(n, where) for n, where in ((device, "device"), (host, "host")) if n], ""
    if len(first) == 2:
        rest = f" and {fmt_tokens(host)} on host"
    n, where = first[0]
    return f"{fmt_tokens(n)} tokens of its prefix on {where}{rest}"


def routed_claim(ev: RoutingEvidence) -> Claim:
    text = f"The {ev.router} router sent it to {_rank(ev.dp_rank)} of {ev.dp}"
    if ev.route_branch:
        text += f" by its {ev.route_branch} rule"
    if ev.route_reason:
        text += f" (\"{ev.route_reason}\")"
    if ev.route_score is not None:
        text += f"; the deciding number, {ev.route_score_name or 'score'}, was {ev.route_score:,.4g}"
    return Claim("routed", text + ".")


def at_arrival_claim(ev: RoutingEvidence) -> Claim:
    return Claim("at_arrival", f"At its arrival {_rank(ev.dp_rank)} held "
                               f"{_held(ev.arrival_device_tokens, ev.arrival_host_tokens)}.")


def elsewhere_claim(ev: RoutingEvidence) -> Claim:
    """The other ranks' device copies of the prefix, against its own rank's."""
    holders = sorted((r for r in ev.ranks if r.rank != ev.dp_rank and r.device_tokens > 0),
                     key=lambda r: (-r.device_tokens, r.rank))
    if not ev.ranks:
        return Claim("elsewhere", "Where its prefix was on the other ranks was not recorded.")
    if not holders:
        return Claim("elsewhere", f"No other rank of the {ev.dp} held any of it on device.")
    n = len(holders)
    if n == 1:
        head = f"Rank {holders[0].rank} held {fmt_tokens(holders[0].device_tokens)} tokens of this prefix on device"
    else:
        listed = ", ".join(f"rank {r.rank} {fmt_tokens(r.device_tokens)}" for r in holders[:LISTED_RANKS])
        more = f" and {n - LISTED_RANKS} more" if n > LISTED_RANKS else ""
        head = (f"{n} other ranks held up to {fmt_tokens(ev.other_ranks_max_device_tokens)} tokens of this prefix "
                f"on device ({listed}{more})")
    if ev.other_ranks_max_device_tokens <= ev.arrival_device_tokens:
        return Claim("elsewhere", f"{head}, none more than {_rank(ev.dp_rank)}.")
    return Claim("elsewhere", f"{head}; the router sent it to {_rank(ev.dp_rank)}, which held " + (
        f"{fmt_tokens(ev.arrival_device_tokens)} on device." if ev.arrival_device_tokens else "none on device."))


def best_rank_claim(ev: RoutingEvidence) -> Claim | None:
    """Named only when another rank held more of it (device + host) than its own."""
    if ev.best_rank is None or ev.best_rank == ev.dp_rank:
        return None
    return Claim("best_rank", (
        f"Device and host together, rank {ev.best_rank} held the most ({fmt_tokens(ev.best_rank_device_tokens)} + "
        f"{fmt_tokens(ev.best_rank_host_tokens)} tokens): {fmt_tokens(ev.best_rank_extra_tokens)} more than "
        f"{_rank(ev.dp_rank)}."))


def routing_claims(ev: RoutingEvidence) -> tuple[Claim, ...]:
    best = best_rank_claim(ev)
    return (routed_claim(ev), at_arrival_claim(ev), elsewhere_claim(ev)) + ((best,) if best else ())


def routing_step(run, row: RowLike, number: int) -> Step | None:
    """The routing step for a request of a data-parallel run; None for one of one rank."""
    row = RequestRow.of(row)
    ev = routing_evidence(run, row)
    if ev is None:
        return None
    claims = routing_claims(ev)
    return Step(step=number, name="routing", finding=" ".join(c.text for c in claims), evidence=ev,
                claims=claims)

