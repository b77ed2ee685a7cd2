"""The primary-cause rule: why a request's TTFT exceeded its ideal, in one word.

The engine splits every finished request's TTFT exactly (COLUMNS.md)::

    ttft = queue + storage_wait + loadback_exposed + recompute + compute

and records `ideal_ttft_ns`: the prefill of only its genuinely new tokens with every reused or
once-cached token device-resident and no queueing. The *excess* is `ttft - ideal`. Each cause
owns one part of it::

    queueing       queue_ns              waiting, and sharing a batch with other requests' work
    load_back      loadback_exposed_ns   load-back time not hidden behind prefill compute
    storage_fetch  storage_wait_ns       held back waiting for a storage prefetch
    recompute      recompute_ns          computing tokens that had been cached once
    compute        compute_ns - ideal    its own new-token compute beyond the ideal (chunking)

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

NONE_TOLERANCE_PCT = 20

# Order matters: it breaks ties and fixes the order of columns and rows everywhere.
CAUSES: tuple[str, ...] = ("none", "queueing", "load_back", "storage_fetch", "recompute", "compute")

# cause -> SQL expression (over a `requests` row) of the part of the excess it owns.
_PART_SQL: dict[str, str] = {
    "queueing": "coalesce({p}queue_ns, 0)",
    "load_back": "coalesce({p}loadback_exposed_ns, 0)",
    "storage_fetch": "coalesce({p}storage_wait_ns, 0)",
    "recompute": "coalesce({p}recompute_ns, 0)",
    "compute": "greatest(coalesce({p}compute_ns, 0) - coalesce({p}ideal_ttft_ns, 0), 0)",
}


@dataclass(frozen=True)
class CauseInfo:
    """One cause: the TTFT part it owns and what that means, in words."""

    name: str
    part_column: str | None  # the `requests` column of its part of TTFT (None: "none" owns no part)
    meaning: str  # what the time went to: "... went to {meaning}"


CAUSE_INFO: dict[str, CauseInfo] = {c.name: c for c in (
    CauseInfo("none", None, "nothing beyond the ideal (within the tolerance of it)"),
    CauseInfo("queueing", "queue_ns", "waiting for the GPU, or sharing a prefill batch with other requests' work"),
    CauseInfo("load_back", "loadback_exposed_ns",
              "loading prefixes back from host memory, not hidden behind prefill compute"),
    CauseInfo("storage_fetch", "storage_wait_ns", "waiting for storage prefetches before prefill could start"),
    CauseInfo("recompute", "recompute_ns",
              "prefilling tokens the cache had held once (evicted, or a load-back skipped)"),
    CauseInfo("compute", "compute_ns", "their own new-token compute beyond the ideal (chunked prefill)"),
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

    @property
    def excess_ns(self) -> int:
        return self.ttft_ns - self.ideal_ttft_ns

    def part_ns(self, cause: str) -> int:
        """The TTFT part `cause` owns (0 for "none")."""
        column = CAUSE_INFO[cause].part_column
        return getattr(self, column) if column else 0

    def excess_parts_ns(self) -> dict[str, int]:
        """cause -> the part of the excess it owns (the same numbers `cause_sql` compares)."""
        return {
            "queueing": self.queue_ns,
            "load_back": self.loadback_exposed_ns,
            "storage_fetch": self.storage_wait_ns,
            "recompute": self.recompute_ns,
            "compute": max(self.compute_ns - self.ideal_ttft_ns, 0),
        }

    def primary_cause(self) -> str:
        if self.excess_ns * 100 <= self.ideal_ttft_ns * NONE_TOLERANCE_PCT:
            return "none"
        parts = self.excess_parts_ns()
        # max() keeps the first of equal values, and dicts keep CAUSES order.
        return max(parts, key=lambda cause: parts[cause])

    @classmethod
    def from_row(cls, row: dict) -> "TtftParts | None":
        """From a `requests` row (dict); None when it has no TTFT (rejected)."""
        if row.get("ttft_ns") is None:
            return None
        return cls(**{name: int(row.get(name) or 0) for name in cls.__dataclass_fields__})


def primary_cause(row: dict) -> str | None:
    """The primary cause of one `requests` row (a dict of its columns); None if it has no TTFT."""
    parts = TtftParts.from_row(row)
    if parts is None or (row.get("status") or "finished") != "finished":
        return None
    return parts.primary_cause()


def excess_sql(alias: str = "") -> str:
    """SQL for `ttft_ns - ideal_ttft_ns` (NULL for rejected rows)."""
    p = f"{alias}." if alias else ""
    return f"({p}ttft_ns - coalesce({p}ideal_ttft_ns, 0))"


def cause_sql(alias: str = "") -> str:
    """A SQL CASE expression giving the primary cause of a `requests` row (see the module doc).

    `alias` is the table alias to qualify columns with (``"r"`` -> ``r.queue_ns``).
    """
    p = f"{alias}." if alias else ""
    parts = {cause: sql.format(p=p) for cause, sql in _PART_SQL.items()}
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
