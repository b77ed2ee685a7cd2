"""Miss reasons, read: why the tokens a run computed were not reused (engine/miss.py writes one
reason a computed token on each finished request's row; DESIGN §7, issue 40).

`summary --json` `miss_reasons` {reason: tokens} over the finished requests (null for a store
written before the columns), the terminal's line under the tier split, explain's step-4 sentence
and the run diagnosis's in-batch and prefetch-lost claims are all built from these sums.
"""

from __future__ import annotations

import duckdb

from tierdiag.store.schema import MISS_COLUMNS, MISS_REASONS
from tierdiag.units import fmt_pct, fmt_tokens, share
from tierdiag.diagnose.read.requests import RequestRow, RowLike
from tierdiag.diagnose.read.run_context import miss_reason_sums

# How each reason reads in a sentence ("N tokens {words}").
WORDS = {
    "never_cached": "never cached before",
    "evicted_before_reuse": "once cached, in no tier at its arrival",
    "lost_while_queued": "lost from every tier while it queued",
    "loadback_skipped": "a host hit whose load-back was skipped",
    "prefetch_declined": "in storage, prefetch not taken",
    "prefetch_revoked": "in storage, prefetch cut short",
    "shared_in_batch": "shared with requests in the same prefill batch",
    "routed_elsewhere": "held by another rank at arrival",
    "beyond_storage": "once cached, in no tier at its arrival (the storage tier did not hold them)",
    "prefetch_lost": "read from storage by its prefetch, then evicted from host before it was scheduled",
}
assert tuple(WORDS) == MISS_REASONS

# The run names in-batch sharing as a cause when it holds at least this share of the input tokens.
IN_BATCH_SHARE = 0.1
# The run names prefetches lost before scheduling when they hold at least this share of the input.
PREFETCH_LOST_SHARE = 0.05


def run_miss_reasons(con: duckdb.DuckDBPyConnection, run_id: str, *, sums: tuple | None = None,
                     summed: bool = False) -> dict[str, int] | None:
    """reason -> tokens over the run's finished requests; None where the rows have no reasons
    (a store written before them, an observed run). `summed`: `sums` is what `miss_reason_sums`
    returns, from the caller (read/run_scan.py's `miss_sums`, issue 41); else queried here."""
    row = sums if summed else miss_reason_sums(con, run_id)
    if not row or not row[0]:
        return None
    return {r: int(v or 0) for r, v in zip(MISS_REASONS, row[1:])}


def request_miss_reasons(row: RowLike) -> dict[str, int] | None:
    """A `requests` row's reasons (None where it has none: rejected, an older store)."""
    row = RequestRow.of(row)
    if getattr(row, MISS_COLUMNS[0]) is None:
        return None
    return {r: int(getattr(row, c) or 0) for r, c in zip(MISS_REASONS, MISS_COLUMNS)}


def miss_sentence(reasons: dict[str, int], computed: int) -> str:
    """"Its N computed tokens, by why they were not reused: ..." (largest first)."""
    parts = sorted(((r, n) for r, n in reasons.items() if n), key=lambda kv: (-kv[1], MISS_REASONS.index(kv[0])))
    if not parts:
        return ""
    return (f"Its {fmt_tokens(computed)} computed tokens, by why they were not reused: "
            + "; ".join(f"{fmt_tokens(n)} {WORDS[r]}" for r, n in parts) + ".")


def _due(n: int, input_tokens: int, at_least: float) -> bool:
    """A run sentence about `n` of its input tokens is due: both counts positive (a negative
    pair's ratio is positive too, and "-1 tokens (100 % of input)" is no claim) and n holds at
    least `at_least` of the input."""
    return n > 0 and input_tokens > 0 and n / input_tokens >= at_least


def in_batch_claim_text(reasons: dict[str, int], input_tokens: int) -> str | None:
    """The run's in-batch sentence where sharing within prefill batches holds IN_BATCH_SHARE of input."""
    n = reasons.get("shared_in_batch", 0)
    if not _due(n, input_tokens, IN_BATCH_SHARE):
        return None
    return (f"{fmt_tokens(n)} tokens ({fmt_pct(share(n, input_tokens))} of input) were shared with requests in the "
            f"same prefill batch: arriving together, each request of the batch computed the shared prefix, as "
            f"SGLang's fcfs does (the prefix enters the cache only when the batch ends), so the cache had no "
            f"chance to reuse them.")


def prefetch_lost_claim_text(reasons: dict[str, int], input_tokens: int) -> str | None:
    """The run's prefetch-lost sentence where tokens read by requests' own prefetches and evicted
    from host before those requests were scheduled hold PREFETCH_LOST_SHARE of input."""
    n = reasons.get("prefetch_lost", 0)
    if not _due(n, input_tokens, PREFETCH_LOST_SHARE):
        return None
    return (f"{fmt_tokens(n)} tokens ({fmt_pct(share(n, input_tokens))} of input) were read from storage by their "
            f"requests' own prefetches, then evicted from host before those requests were scheduled, and computed "
            f"again: SGLang inserts a finished prefetch unprotected and does not query storage again for it, so "
            f"host room (host_tokens) or a shorter queue is what keeps them; no prefetch policy does, the read "
            f"had finished.")
