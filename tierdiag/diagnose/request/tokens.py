"""Where a request's (or a run's) input tokens came from: the one token split.

    input = device + host + storage + computed        computed = recomputed + new

Every view takes it from here: `explain`'s per-request split (`TokenSplit.from_row`), `summary`'s
run total (`TierSplit`, the same six fields plus the skipped load-backs), the verdict's label.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from tierdiag.units import fmt_pct

if TYPE_CHECKING:
    from tierdiag.diagnose.read.requests import RowLike

# requests column of each field (the row a split is read from).
ROW_COLUMNS = {"input_tokens": "input_tokens", "device_tokens": "device_hit_tokens",
               "host_tokens": "host_hit_tokens", "storage_tokens": "storage_hit_tokens",
               "computed_tokens": "computed_tokens", "recomputed_tokens": "recomputed_tokens"}


@dataclass(frozen=True)
class TokenSplit:
    """A request's (or a run's) input tokens by where they came from (module doc)."""

    input_tokens: int
    device_tokens: int
    host_tokens: int
    storage_tokens: int
    computed_tokens: int
    recomputed_tokens: int

    @classmethod
    def from_row(cls, row: RowLike) -> "TokenSplit":
        """From a `requests` row (RequestRow.of: a RequestRow or a dict of its columns); a NULL counts as 0."""
        # Imported here: a replay takes its split from the engine's counts (`of`) and never reads a
        # row, and RequestRow (a slotted class of ~90 fields) was ~5 % of its start-up's
        # instructions (issue 41).
        from tierdiag.diagnose.read.requests import RequestRow

        row = RequestRow.of(row)
        return cls(**{f: int(getattr(row, col) or 0) for f, col in ROW_COLUMNS.items()})

    @classmethod
    def of(cls, holder: object) -> "TokenSplit":
        """From an object holding the six fields under these names (the engine's EngineStats, a
        replay's result, a slow request)."""
        return cls(*(getattr(holder, f.name) for f in fields(cls)))

    @property
    def new_tokens(self) -> int:
        return self.computed_tokens - self.recomputed_tokens

    @property
    def reused_tokens(self) -> int:
        return self.device_tokens + self.host_tokens + self.storage_tokens

    def label(self) -> str:
        """What the request mostly was, from its own token shares: its hit class says only which
        tiers it touched (a `device_hit` can be 3 % device and 96 % recomputed), so the verdict
        names it by its largest part instead."""
        n = self.input_tokens
        if n <= 0:
            return "no input tokens"
        if self.reused_tokens == 0 and self.recomputed_tokens == 0:
            return "a miss: all new tokens"
        parts = ((self.device_tokens, "on the device"), (self.host_tokens, "loaded back from host"),
                 (self.storage_tokens, "fetched from storage"), (self.recomputed_tokens, "recomputed"),
                 (self.new_tokens, "new"))
        tokens, words = max(parts, key=lambda p: p[0])  # a tie goes to the earlier (cheaper) part
        if tokens == n:
            return f"all {words}"
        how = "mostly" if tokens * 2 > n else "largest part"
        return f"{how} {words}: {fmt_pct(tokens / n)} of its input"

    def to_json(self) -> dict:
        return {"input": self.input_tokens, "device": self.device_tokens, "host": self.host_tokens,
                "storage": self.storage_tokens, "computed": self.computed_tokens,
                "recomputed": self.recomputed_tokens, "new": self.new_tokens}
