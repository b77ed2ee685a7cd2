"""The cached prefix's split by tier, as each SGLang release reports it (rules.RuleSet's
`split_cached_prefix`, read once a finished request by RequestRecords.rules_split): plain int
arithmetic, compiled with the engine core (compiled.MODULES). In rules.py, which is not
compiled, each was an interpreted function of up to 9 builtin min/max calls: ~13k instructions
a request's record, with a probe or without (issue 41). Comparisons, not min/max: compiled,
those builtins are generic calls (docs/engine.md). The Python source is its twin."""

from __future__ import annotations

from typing import Any, Final

from mypy_extensions import i64


def _min(a: int, b: int) -> int:
    return a if a <= b else b


def _max(a: int, b: int) -> int:
    return a if a >= b else b


def split_promised(prefix: int, device: int, host_hit: int, host_loaded: int, storage_hit: int,
                   storage_start: int, span: int, span_start: int) -> tuple[int, int, int]:
    """SGLang 0.5.9 (`ScheduleBatch.prepare_for_extend`, cached-token breakdown): host =
    `host_hit_length`, the hit *promised* at match, loaded or not (storage pages counted in it);
    device = len(prefix_indices) - host_hit_length, at least 0. A declined load-back therefore
    counts its recomputed tokens as host (and takes them off the device part)."""
    storage = _min(host_hit, storage_hit)
    return _max(0, prefix - host_hit), host_hit - storage, storage


def split_by_tier(prefix: int, device: int, host_hit: int, host_loaded: int, storage_hit: int,
                  storage_start: int, span: int, span_start: int) -> tuple[int, int, int]:
    """SGLang 0.5.20+ `schedule_batch.split_cached_prefix_by_tier`: host = min(host_hit_length,
    host_loaded_length) capped at the prefix; storage by position, [storage_hit_start, +len) within
    [0, prefix_len); device = prefix - host - storage. The storage span is the one the request's
    prefetch put into the tree (`pop_prefetch_loaded_span` -> `req.storage_hit_length`,
    `storage_hit_start`: `span`, `span_start`), all of it, pages another request's prefill or
    load-back put on device before this admission included (those are storage, not device);
    the part of the host hit it covers is not host.

        prefix  |---- device ----|------ host (materialized) ------|
                       |------ storage (the prefetched span) ------|
    """
    host_total = _min(prefix, _min(host_hit, host_loaded))
    host_start = prefix - host_total
    storage_start, storage_hit = span_start, span
    storage_end = storage_start + storage_hit
    storage = _max(0, _min(prefix, storage_end) - _max(0, storage_start))
    storage_in_host = _max(0, _min(prefix, storage_end) - _max(host_start, storage_start))
    host = host_total - storage_in_host
    return prefix - host - storage, host, storage


# Which of the two a rule set's `split_cached_prefix` is (`split_kind`), read once a Scheduler
# (its `_split_kind`): RequestRecords.rules_split then calls it by name, compiled a native call
# of native ints and a C struct returned; through the rule set's field it was a look-up by name,
# 8 ints boxed, a generic call, the tuple iterated and its ints multiplied generically (~2.6k
# instructions a request, probes or not: issue 41 session 29). SPLIT_OTHER: any other function
# (a rule set made by hand), called through the field as before.
SPLIT_OTHER: Final = 0
SPLIT_BY_TIER: Final = 1
SPLIT_PROMISED: Final = 2


def split_kind(split: Any) -> i64:
    """SPLIT_BY_TIER or SPLIT_PROMISED where `split` is that function (by identity), else SPLIT_OTHER."""
    if split is split_by_tier:
        return SPLIT_BY_TIER
    if split is split_promised:
        return SPLIT_PROMISED
    return SPLIT_OTHER
