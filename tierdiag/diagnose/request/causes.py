"""The primary-cause rule: why a request's TTFT exceeded its ideal, in one word.

The engine splits every finished request's TTFT exactly (docs/contract.md §5, the `requests` columns)::

    ttft = queue + storage_wait + loadback_exposed + recompute + compute

and records `ideal_ttft_ns`: the prefill of only its genuinely new tokens with every reused or
once-cached token device-resident and no queueing. The *excess* is `ttft - ideal`. Each cause
owns one part of it::

    queueing       queue_ns              waiting, and sharing a batch with other requests' work
    load_back      loadback_exposed_ns   load-back time not hidden behind prefill compute
    storage_fetch  storage_wait_ns       held back waiting for a storage prefetch
    routing        recompute_ns x r / R  recomputing once-cached tokens another data-parallel rank
                                         held at arrival (r of its R recomputed tokens, below)
    recompute      recompute_ns - that   computing the other tokens that had been cached once
    compute        compute_ns - ideal    its own new-token compute beyond the ideal (chunking)

Routing (data-parallel runs, schema v4): the router sent the request to rank `dp_rank` while
rank `best_rank` held more of its prefix on device + host at arrival. The tokens routing lost::

    r = min(recomputed_tokens,
            max(best_rank_device + best_rank_host
                - (arrival_device + arrival_host + storage_match), 0))   when best_rank != dp_rank
    r = 0                                                                 otherwise (one rank, or NULLs)

(what its own rank held, and what it could fetch from the storage tier all ranks share, is not
routing's loss). Bounded by recomputed_tokens: the engine's "once cached" is per rank, so tokens
only another rank had cached are new to this one, inside its ideal, and not part of any excess. Routing owns r / R of the recompute part, split by token count as the engine
splits a chunk's compute (integer division); the verdict's sentence prices those tokens by their
position in the context instead (routing_loss.py), as recompute's sentence re-prices recompute.
Routing comes before recompute in the tie order: where the prefix was on another rank, the
router's choice, not the cache's size, is what lost it.

Rule (the same in Python and SQL, integer arithmetic only, so the two never disagree):

* not finished (rejected) -> NULL / None: it has no TTFT;
* `excess * 100 <= ideal * NONE_TOLERANCE_PCT` -> ``none``: TTFT within 20 % of its ideal is
  not slow for any reason worth naming. The tolerance is relative, not in ms, because virtual
  times scale with the model preset (a tiny test model prefills in microseconds);
* otherwise the cause owning the largest part; ties go to the earlier cause in `CAUSES`.

A full miss with nothing else in the way is therefore ``none``: its TTFT *is* its ideal (all
its tokens were new); `explain` says so in words. ``compute`` names the rarer case where the
request's own new-token compute came out slower than its ideal.

`slow` and the HTML report classify a whole run in one query with `cause_sql()`; `explain`
calls `primary_cause()` on one row.

What each cause is, in words and columns, is registered here once (`CAUSE_INFO`): the TTFT part
it owns (a `requests` column), and what it means (the report's verdict card, the run
diagnosis). Views look a cause up there rather than branching on its name.
"""

from __future__ import annotations

from dataclasses import dataclass
from tierdiag.diagnose.read.requests import RequestRow, RowLike

from tierdiag.config.names import Cause, values

NONE_TOLERANCE_PCT = 20

# Order matters: it breaks ties and fixes the order of columns and rows everywhere.
CAUSES: tuple[str, ...] = values(Cause)  # config/names.py


def routing_tokens_sql(alias: str = "") -> str:
    """SQL for a `requests` row's routing-lost tokens, `r` of the module doc (0 where any input is NULL)."""
    p = f"{alias}." if alias else ""
    gap = (f"coalesce({p}best_rank_device_tokens, 0) + coalesce({p}best_rank_host_tokens, 0) "
           f"- coalesce({p}arrival_device_tokens, 0) - coalesce({p}arrival_host_tokens, 0) "
           f"- coalesce({p}storage_match_tokens, 0)")
    return (f"(CASE WHEN {p}dp_rank IS NOT NULL AND {p}best_rank IS NOT NULL AND {p}best_rank <> {p}dp_rank "
            f"THEN least(coalesce({p}recomputed_tokens, 0), greatest({gap}, 0)) ELSE 0 END)")


def routing_ns_sql(alias: str = "") -> str:
    """SQL for routing's part of a row's recompute_ns: recompute_ns x r // R (integer, as in Python)."""
    p = f"{alias}." if alias else ""
    return (f"(CASE WHEN coalesce({p}recomputed_tokens, 0) > 0 THEN "
            f"(coalesce({p}recompute_ns, 0)::HUGEINT * {routing_tokens_sql(alias)}) "
            f"// {p}recomputed_tokens ELSE 0 END)")


# cause -> SQL expression (over a `requests` row) of the part of the excess it owns.
_PART_SQL: dict[str, str] = {
    Cause.QUEUEING: "coalesce({p}queue_ns, 0)",
    Cause.LOAD_BACK: "coalesce({p}loadback_exposed_ns, 0)",
    Cause.STORAGE_FETCH: "coalesce({p}storage_wait_ns, 0)",
    Cause.ROUTING: "{routing}",
    Cause.RECOMPUTE: "(coalesce({p}recompute_ns, 0) - {routing})",
    Cause.COMPUTE: "greatest(coalesce({p}compute_ns, 0) - coalesce({p}ideal_ttft_ns, 0), 0)",
}


@dataclass(frozen=True)
class CauseInfo:
    """One cause: the TTFT part it owns and what that means, in words."""

    name: str
    part_column: str | None  # the `requests` column of its part of TTFT (None: "none" owns no part;
    #                          routing and recompute split recompute_ns, module doc)
    meaning: str  # what the time went to: "... went to {meaning}"


CAUSE_INFO: dict[str, CauseInfo] = {c.name: c for c in (
    CauseInfo(Cause.NONE, None, "nothing beyond the ideal (within the tolerance of it)"),
    CauseInfo(Cause.QUEUEING, "queue_ns", "waiting for the GPU, or sharing a prefill batch with other requests' work"),
    CauseInfo(Cause.LOAD_BACK, "loadback_exposed_ns",
              "loading prefixes back from host memory, not hidden behind prefill compute"),
    CauseInfo(Cause.STORAGE_FETCH, "storage_wait_ns", "waiting for storage prefetches before prefill could start"),
    CauseInfo(Cause.ROUTING, "recompute_ns",
              "recomputing prefixes another data-parallel rank held when they arrived (the router sent "
              "them elsewhere)"),
    CauseInfo(Cause.RECOMPUTE, "recompute_ns",
              "prefilling tokens the cache had held once (evicted, or a load-back skipped)"),
    CauseInfo(Cause.COMPUTE, "compute_ns", "their own new-token compute beyond the ideal (chunked prefill)"),
)}
assert tuple(CAUSE_INFO) == CAUSES

# cause -> what its time went to (the report's verdict card), for the causes that own a part.
CAUSE_MEANING: dict[str, str] = {c.name: c.meaning for c in CAUSE_INFO.values() if c.part_column}


@dataclass(frozen=True)
class TtftParts:
    """One request's TTFT decomposition, ns of virtual time."""

    ttft_ns: int
    ideal_ttft_ns: int
    queue_ns: int
    storage_wait_ns: int
    loadback_exposed_ns: int
    recompute_ns: int
    compute_ns: int
    recomputed_tokens: int = 0
    routing_tokens: int = 0  # of recomputed_tokens: those routing lost (module doc)

    @property
    def excess_ns(self) -> int:
        return self.ttft_ns - self.ideal_ttft_ns

    @property
    def routing_ns(self) -> int:
        """Routing's part of recompute_ns: recompute_ns x routing / recomputed tokens."""
        if self.recomputed_tokens <= 0:
            return 0
        return self.recompute_ns * self.routing_tokens // self.recomputed_tokens

    def part_ns(self, cause: str) -> int:
        """The TTFT part `cause` owns (0 for "none"; compute: all its compute, not only the excess)."""
        if cause == Cause.COMPUTE:
            return self.compute_ns
        return 0 if CAUSE_INFO[cause].part_column is None else self.excess_parts_ns()[cause]

    def excess_parts_ns(self) -> dict[str, int]:
        """cause -> the part of the excess it owns (the same numbers `cause_sql` compares)."""
        routing = self.routing_ns
        return {
            Cause.QUEUEING: self.queue_ns,
            Cause.LOAD_BACK: self.loadback_exposed_ns,
            Cause.STORAGE_FETCH: self.storage_wait_ns,
            Cause.ROUTING: routing,
            Cause.RECOMPUTE: self.recompute_ns - routing,
            Cause.COMPUTE: max(self.compute_ns - self.ideal_ttft_ns, 0),
        }

    def primary_cause(self) -> str:
        if self.excess_ns * 100 <= self.ideal_ttft_ns * NONE_TOLERANCE_PCT:
            return Cause.NONE
        parts = self.excess_parts_ns()
        # max() keeps the first of equal values, and dicts keep CAUSES order.
        return max(parts, key=lambda cause: parts[cause])

    @classmethod
    def from_row(cls, row: RowLike) -> "TtftParts | None":
        """From a `requests` row (RequestRow.of); None when it has no TTFT (rejected)."""
        row = RequestRow.of(row)
        if row.ttft_ns is None:
            return None
        fields = {name: int(getattr(row, name) or 0) for name in cls.__dataclass_fields__ if name != "routing_tokens"}
        return cls(**fields, routing_tokens=routing_tokens(row))


def routing_tokens(row: RowLike) -> int:
    """A `requests` row's routing-lost tokens (`routing_tokens_sql`, in Python)."""
    row = RequestRow.of(row)
    rank, best = row.dp_rank, row.best_rank
    if rank is None or best is None or best == rank:
        return 0
    gap = sum(int(getattr(row, k) or 0) for k in ("best_rank_device_tokens", "best_rank_host_tokens")) - sum(
        int(getattr(row, k) or 0) for k in ("arrival_device_tokens", "arrival_host_tokens", "storage_match_tokens"))
    return min(int(row.recomputed_tokens or 0), max(gap, 0))


def primary_cause(row: RowLike) -> str | None:
    """The primary cause of one `requests` row (RequestRow.of: a RequestRow or a dict of its columns); None if it has no TTFT."""
    row = RequestRow.of(row)
    parts = TtftParts.from_row(row)
    if parts is None or (row.status or "finished") != "finished":
        return None
    return parts.primary_cause()


def recompute_cost_ns(row: RowLike) -> int:
    """What recomputing its once-cached tokens really cost.

    The engine splits each prefill chunk's compute between the recomputed and the new tokens
    by token count, but a token's cost grows with its position in the context (attention over
    all before it), and the new tokens come last::

        context   [ device | recomputed ........ | new ... ]
        cost/tok    -        lower                 highest

    Its ideal prices the new tokens at their real positions (everything before them resident),
    so they cost at least that: the new part is max(compute, ideal) (never more than all of
    it), and recompute is the rest. A counterfactual without the recompute is then never below
    the ideal."""
    row = RequestRow.of(row)
    rec, comp = int(row.recompute_ns or 0), int(row.compute_ns or 0)
    new = max(comp, min(int(row.ideal_ttft_ns or 0), comp + rec))
    return comp + rec - new


def excess_sql(alias: str = "") -> str:
    """SQL for `ttft_ns - ideal_ttft_ns` (NULL for rejected rows)."""
    p = f"{alias}." if alias else ""
    return f"({p}ttft_ns - coalesce({p}ideal_ttft_ns, 0))"


def cause_sql(alias: str = "") -> str:
    """A SQL CASE expression giving the primary cause of a `requests` row (see the module doc).

    `alias` is the table alias to qualify columns with (``"r"`` -> ``r.queue_ns``).
    """
    p = f"{alias}." if alias else ""
    routing = routing_ns_sql(alias)
    parts = {cause: sql.format(p=p, routing=routing) for cause, sql in _PART_SQL.items()}
    biggest = "greatest(" + ", ".join(parts.values()) + ")"
    pick = " ".join(f"WHEN {sql} = {biggest} THEN '{cause}'" for cause, sql in parts.items())
    return (
        f"(CASE WHEN {p}ttft_ns IS NULL OR coalesce({p}status, 'finished') <> 'finished' THEN NULL "
        f"WHEN {excess_sql(alias)} * 100 <= coalesce({p}ideal_ttft_ns, 0) * {NONE_TOLERANCE_PCT} "
        f"THEN 'none' {pick} END)"
    )


def check_cause(name: str | None) -> str | None:
    """Validate a user-given cause name (the CLI's --cause)."""
    if name is None or name in CAUSES:
        return name
    from tierdiag.errors import unknown_name

    raise unknown_name("cause", name, CAUSES)


# An imported (observed) run: a server-reported part of TTFT at least this share of it is named
# the primary cause; below, the unsplit rest (prefill with any load-back) could hold the cause,
# which the server does not say (observed_explain.ObservedParts.cause, in Python).
MAJORITY_SHARE = 0.5


def server_cause_sql() -> str:
    """SQL: an observed `requests` row's server-reported cause (queueing | storage_fetch | NULL)."""
    return (f"CASE WHEN ttft_ns > 0 AND queue_ns >= {MAJORITY_SHARE} * ttft_ns THEN 'queueing' "
            f"WHEN ttft_ns > 0 AND storage_wait_ns >= {MAJORITY_SHARE} * ttft_ns THEN 'storage_fetch' END")
