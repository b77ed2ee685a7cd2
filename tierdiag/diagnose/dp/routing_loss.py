"""Routing as a cause: once-cached tokens a data-parallel run recomputed on one rank while another
rank held them at arrival (causes.py defines the tokens, `r`, and the part of TTFT they own).

    routing_cost_ns(row, config)     what recomputing its routing-lost tokens cost, priced by position
    routing_loss(con, run)           RoutingLoss: the run's routing losses (RunContext.routing)

Its sentences (the request's, the run's) are claims.py's `routing_claim` and run_claims.py's `run_routing_claim`.

Pricing by position. The engine splits a chunk's compute between recomputed and new tokens by
count; a token's cost grows with its position (attention over all before it). The tokens routing
lost are the first the request computed: its own rank's prefix ends at h = device + host +
storage tokens it used, routing's r tokens follow it, then the rest of its R recomputed tokens,
then the new ones::

    context    [ own rank's prefix | routing's r | other recomputed | new ... ]
    position   0                   h             h + r              h + R

With the cost model's per-token cost a + b x position (a = 2 params, b = 4 layers x hidden FLOPs),
the tokens [x, y) cost W(x, y) = (y - x) + (y^2 - x^2) / (2 K), K = a / b tokens; routing's cost
is the request's re-priced recompute (causes.recompute_cost_ns) x W(h, h + r) / W(h, h + R). The
model is the run's preset (a fitted profile's clock changes a and b alike for one model, so K
stays; an unknown model prices by count).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb

from tierdiag.diagnose.request.causes import recompute_cost_ns, routing_tokens
from tierdiag.diagnose.read import ranks as read
from tierdiag.units import share
from tierdiag.diagnose.read.requests import RequestRow, RowLike
from tierdiag.diagnose.read.run import parse

# A run's routing claim is told when routing's requests carry the largest verdict, or when routing
# lost at least this share of the run's recomputed tokens ("routing dominates lost reuse").
DOMINANT_SHARE = 0.5


def tokens_per_attention(config: dict) -> float | None:
    """K of the module doc: the context length at which a token's attention costs what its
    linear layers do (None: no known model preset, price by count)."""
    from tierdiag.config.presets import MODELS

    m = MODELS.get(str(config.get("model") or ""))
    if m is None:
        return None
    return 2.0 * m.num_params / (4.0 * m.num_layers * m.hidden_size)


def position_weight(x: int, y: int, k: float | None) -> float:
    """W(x, y): the cost of computing tokens at positions [x, y), in units of one token's linear cost."""
    if y <= x:
        return 0.0
    return (y - x) + ((y * y - x * x) / (2.0 * k) if k else 0.0)


def routing_cost_ns(row: RowLike, config: dict) -> int:
    """What recomputing the row's routing-lost tokens cost, priced by their position (module doc)."""
    row = RequestRow.of(row)
    r = routing_tokens(row)
    recomputed = int(row.recomputed_tokens or 0)
    if not r or not recomputed:
        return 0
    h = sum(int(getattr(row, c) or 0) for c in ("device_hit_tokens", "host_hit_tokens", "storage_hit_tokens"))
    k = tokens_per_attention(config)
    whole = position_weight(h, h + recomputed, k)
    return int(recompute_cost_ns(row) * position_weight(h, h + r, k) / whole) if whole else 0


@dataclass(frozen=True)
class RoutingLoss:
    """A data-parallel run's routing losses, over its finished requests (causes.py's `r`)."""

    num_ranks: int  # ranks that served a finished request
    router: str | None  # the run's router (config `router`; None: not recorded)
    routed_requests: int  # requests with routing-lost tokens
    routing_tokens: int
    recomputed_tokens: int
    input_tokens: int
    routing_ns: int  # routing's part of the run's TTFT (summary's time by cause: count split)
    routing_cost_ns: int  # the same tokens priced by position (the claims' number)
    branch_tokens: dict = field(default_factory=dict)  # route_branch -> routing tokens ("?" where NULL)
    session_tokens: int = 0  # of routing_tokens: requests with a session
    # (best rank's share of the input it held, routing tokens) of the requests with routing
    # tokens, best share rounded to 0.01 (the router-threshold advice predicts from it).
    best_share_tokens: tuple = ()
    # The same for the requests the cache_aware router's `cache_miss` rule placed.
    miss_best_share_tokens: tuple = ()

    @property
    def share_of_recomputed(self) -> float | None:
        return share(self.routing_tokens, self.recomputed_tokens)

    @property
    def share_of_input(self) -> float | None:
        return share(self.routing_tokens, self.input_tokens)

    @property
    def dominates_lost_reuse(self) -> bool:
        return bool(self.routing_tokens) and (self.share_of_recomputed or 0.0) >= DOMINANT_SHARE

    def tokens_above(self, threshold: float, *, miss_only: bool = False) -> int:
        """Routing tokens of requests whose best rank held more than `threshold` of their input."""
        pairs = self.miss_best_share_tokens if miss_only else self.best_share_tokens
        return sum(t for s, t in pairs if s > threshold)


def routing_loss(con: duckdb.DuckDBPyConnection, run) -> RoutingLoss | None:
    """None for a run whose requests name no rank (one-rank replays before v4, imports without
    dp_rank) or that had one rank: no router chose anything."""
    rid = run.run_id
    ranks = read.ranks_named(con, rid)
    run = parse(run)
    if run.ranks <= 1 and ranks <= 1:
        return None
    t = read.routing_totals(con, rid)
    branches = read.routing_tokens_by_branch(con, rid)
    cost = sum(routing_cost_ns(row, run.config) for row in read.routed_requests(con, rid))
    return RoutingLoss(
        num_ranks=int(max(ranks, run.ranks)), router=run.config.get("router"),
        routed_requests=t.routed_requests, routing_tokens=t.routing_tokens, recomputed_tokens=t.recomputed_tokens,
        input_tokens=t.input_tokens, routing_ns=t.routing_ns, routing_cost_ns=cost, branch_tokens=branches,
        session_tokens=t.session_routing_tokens, best_share_tokens=read.routing_tokens_by_best_share(con, rid),
        miss_best_share_tokens=read.routing_tokens_by_best_share(con, rid, cache_miss_only=True))
